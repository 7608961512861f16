/* Token-bucket rate limits per tenant: kernel launches per second and bytes copied between
 * host and device per second. A call that finds its tenant's bucket short is delayed until
 * the bucket has refilled enough; a call larger than the whole bucket goes once the bucket
 * is full, and leaves it in debt.
 *
 *   phosctl policy load builtin:rate_limit --set launches_per_s=5000 --set bytes_per_s=2GiB
 */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, launches_per_s, 0); /* 0: unlimited */
PHOS_PARAM(__u64, launch_burst, 64);
PHOS_PARAM(__u64, bytes_per_s, 0); /* 0: unlimited */
PHOS_PARAM(__u64, bytes_burst, 64 << 20);

/* Tokens are kept in millionths, so refills at microsecond resolution stay exact. */
#define SCALE 1000000ULL
/* Refills are computed over at most this long (a full bucket stays full anyway). */
#define MAX_REFILL_US 10000000ULL

struct bucket {
    __s64 tokens;
    __u64 last_ns;
};

struct buckets {
    struct bucket launches;
    struct bucket bytes;
};

PHOS_MAP(tenant_buckets, BPF_MAP_TYPE_HASH, __u64, struct buckets, 4096);

/* Refill `b` up to `burst` at `rate` per second; 0 when `need` can be taken now, else how
 * long to wait (ns). Takes the tokens when it answers 0. */
static __always_inline __u64 take(struct bucket *b, __u64 need, __u64 rate, __u64 burst, __u64 now) {
    /* Saturating: the router never turns now_ns back, but a policy run directly may. */
    __u64 elapsed_us = now > b->last_ns ? (now - b->last_ns) / 1000 : 0;
    if (elapsed_us > MAX_REFILL_US)
        elapsed_us = MAX_REFILL_US;
    __s64 cap = (__s64)(burst * SCALE);
    __s64 tokens = b->tokens + (__s64)(elapsed_us * rate);
    if (tokens > cap)
        tokens = cap;
    b->tokens = tokens;
    b->last_ns += elapsed_us * 1000;
    __s64 want = (__s64)(need * SCALE);
    /* A call larger than the bucket goes when the bucket is full. */
    if (want > cap)
        want = cap;
    if (tokens >= want) {
        b->tokens = tokens - (__s64)(need * SCALE);
        return 0;
    }
    return ((__u64)(want - tokens) / rate + 1) * 1000;
}

PHOS_ENTRY(rate_limit) {
    __u64 launches = call->amount[PHOS_RC_kernel_launches];
    __u64 bytes = call->amount[PHOS_RC_bytes_to_device] + call->amount[PHOS_RC_bytes_from_device];
    if ((launches == 0 || launches_per_s == 0) && (bytes == 0 || bytes_per_s == 0))
        return PHOS_ADMIT;

    __u64 tenant = call->tenant;
    struct buckets *b = bpf_map_lookup_elem(&tenant_buckets, &tenant);
    if (!b) {
        struct buckets fresh = {
            .launches = {.tokens = (__s64)(launch_burst * SCALE), .last_ns = call->now_ns},
            .bytes = {.tokens = (__s64)(bytes_burst * SCALE), .last_ns = call->now_ns},
        };
        bpf_map_update_elem(&tenant_buckets, &tenant, &fresh, BPF_NOEXIST);
        b = bpf_map_lookup_elem(&tenant_buckets, &tenant);
        if (!b)
            return PHOS_ADMIT;
    }
    /* Check both before taking from either, so a delayed call is not charged twice. */
    struct buckets trial = *b;
    __u64 wait = 0;
    if (launches && launches_per_s)
        wait = take(&trial.launches, launches, launches_per_s, launch_burst, call->now_ns);
    if (wait == 0 && bytes && bytes_per_s)
        wait = take(&trial.bytes, bytes, bytes_per_s, bytes_burst, call->now_ns);
    if (wait)
        return PHOS_DELAY(wait);
    *b = trial;
    return PHOS_ADMIT;
}
