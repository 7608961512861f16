/* A token bucket per tenant: `burst` calls pass at once, then `rate_per_s` per second;
 * a call that finds the bucket empty is delayed until the next token. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, burst, 3);
PHOS_PARAM(__u64, rate_per_s, 10);

struct bucket {
    __u64 tokens;
    __u64 last_ns;
};

PHOS_MAP(buckets, BPF_MAP_TYPE_HASH, __u64, struct bucket, 16);

/* Out of line on purpose: exercises bpf-to-bpf calls. */
static __attribute__((noinline)) __u64 refill(struct bucket *b, __u64 now) {
    __u64 elapsed = now - b->last_ns;
    __u64 add = elapsed * rate_per_s / 1000000000ULL;
    if (add > 0) {
        b->tokens += add;
        if (b->tokens > burst)
            b->tokens = burst;
        b->last_ns += add * 1000000000ULL / rate_per_s;
    }
    return b->tokens;
}

PHOS_ENTRY(token_bucket) {
    __u64 tenant = call->tenant;
    struct bucket *b = bpf_map_lookup_elem(&buckets, &tenant);
    if (!b) {
        struct bucket fresh = {.tokens = burst, .last_ns = call->now_ns};
        if (bpf_map_update_elem(&buckets, &tenant, &fresh, BPF_NOEXIST))
            return PHOS_REJECT(PHOS_cudaErrorNotPermitted);
        b = bpf_map_lookup_elem(&buckets, &tenant);
        if (!b)
            return PHOS_REJECT(PHOS_cudaErrorNotPermitted);
    }
    if (refill(b, call->now_ns) == 0)
        return PHOS_DELAY(1000000000ULL / rate_per_s);
    b->tokens -= 1;
    return PHOS_ADMIT;
}
