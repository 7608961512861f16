/* Weighted fair share of device time between tenants.
 *
 * Each tenant has a virtual time: the device time its kernels have been measured to use,
 * divided by its share. Its lead is how far its virtual time is past that of the slowest
 * other active tenant, counting the work that tenant has queued (a tenant whose 10 ms
 * kernel is running is not 10 ms behind: it is charged in one step when the kernel ends).
 * A tenant's own queued work is not counted until it has run: its queue is what keeps
 * the GPU busy while the others' is empty.
 *
 * On a time-sliced GPU the only way to give one tenant's time to another is to let the
 * first one's queue run empty: a launch held back changes nothing until the tenant's
 * queued kernels have run. So a launch of a tenant that leads
 *   - by at most `brake_ns` (off by default: no limit) goes at once;
 *   - by more (the brake) goes once the tenant has no kernel queued or running, and its
 *     queue has been empty for (lead - brake_ns) / hold_div: the tenant keeps one kernel
 *     on the device at a time, and between two of them the others have the GPU to
 *     themselves for a while that grows with the lead. This takes a little from the
 *     tenant at every kernel instead of stopping it until its whole queue has drained,
 *     which on a GPU took whole long kernels at a time and over-corrected. (A launch
 *     another thread of the guest may be waiting for is not braked: the kernels the brake
 *     would wait for may be queued behind that thread's wait.)
 *   - by more than `slack_ns` (the stop, which the brake should seldom let it reach) waits
 *     until the others catch up.
 * A tenant idle for `idle_ns` rejoins level with the slowest active tenant, so idling
 * does not bank credit. Only launches are held back: copies and queries pass, so a tenant
 * waiting for the GPU is not also cut off from its memory. docs/policies.md and
 * docs/perf.md have more.
 *
 *   phosctl policy load builtin:fair_share --set brake_ns=1ms --set hold_div=4
 */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, slack_ns, 30000000);
/* The brake is off unless set: on an H100 with one tenant of 0.1 ms kernels and one of
 * 10 ms (docs/perf.md), braking at 2 ms starved the short one (its kernels went one at a
 * time, each waiting for the last to be reported), 39% unfairness against 2.4-2.8% with
 * the stop alone. */
PHOS_PARAM(__u64, brake_ns, ~0ULL);
PHOS_PARAM(__u64, hold_div, 8);
PHOS_PARAM(__u64, idle_ns, 200000000);
/* A lead that grows more slowly than this share of wall time (parts per million) is
 * forgiven as it grows: the books' own error is then never acted on, and only a tenant
 * that takes clearly more than its share is stopped. On an H100 time-slicing a tenant of
 * 10 ms kernels against one of 0.1 ms, events charged the first 1.2 times its solo time
 * and the router's contention accounting left about 8% of that: equalising such books
 * gave the short tenant 54% (8.4% unfairness), forgiving 6% gave 51% (2.2%), docs/perf.md.
 * 0: every nanosecond of lead counts. */
PHOS_PARAM(__u64, tolerance_ppm, 60000);
PHOS_PARAM(__u64, poll_ns, 100000);

#define MAX_TENANTS 64
/* Virtual time is device time * VT_UNIT / share. */
#define VT_UNIT 1024ULL

struct tenant_clock {
    __u64 vtime;
    /* Virtual time of the tenant's kernels queued or running (the router's estimate), as
     * of its last call, including the launch that call was admitted for. */
    __u64 queued_vt;
    __u64 seen_device_ns;
    __u64 last_call_ns;
};

PHOS_MAP(clocks, BPF_MAP_TYPE_ARRAY, __u32, struct tenant_clock, MAX_TENANTS);

/* The verdict on a launch of a tenant `lead_ns` of its own device time ahead. */
static __always_inline __u64 decide(const struct phos_call *call, __u64 lead_ns) {
    if (lead_ns > slack_ns)
        return PHOS_DELAY(poll_ns);
    if (lead_ns <= brake_ns)
        return PHOS_ADMIT;
    /* The brake: one kernel at a time, the queue left empty for a while in between; but not
     * for a launch another thread of the guest may be waiting for (the tenant's queued
     * kernels may be waiting behind that thread's wait). */
    if (call->awaited)
        return PHOS_ADMIT;
    if (call->queued[PHOS_RC_device_time] > 0)
        return PHOS_DELAY(poll_ns);
    __u64 hold = hold_div ? (lead_ns - brake_ns) / hold_div : 0;
    __u64 drained = call->drained_ns[PHOS_RC_device_time];
    __u64 empty = call->now_ns > drained ? call->now_ns - drained : 0;
    if (empty >= hold)
        return PHOS_ADMIT;
    return PHOS_DELAY(hold - empty);
}

/* How long ago `then` was, seen from `now`: 0 if `then` is later (the router never turns
 * now_ns back, but a policy run directly, as in tests, may see any order). */
static __always_inline __u64 since(__u64 now, __u64 then) {
    return now > then ? now - then : 0;
}

PHOS_ENTRY(fair_share) {
    if (call->tenant >= MAX_TENANTS)
        return PHOS_ADMIT;
    __u32 me = call->tenant;
    struct tenant_clock *mine = bpf_map_lookup_elem(&clocks, &me);
    if (!mine)
        return PHOS_ADMIT;
    __u64 now = call->now_ns;
    __u64 share = call->share ? call->share : 1;
    /* Measured so far: what `used` holds beyond the estimate for queued kernels. */
    __u64 used = call->used[PHOS_RC_device_time] - call->pending[PHOS_RC_device_time];

    /* The slowest other active tenant, counting the work it has queued. Comparing against
     * measured time alone would hold back a tenant of short kernels (whose queue is short
     * and runs dry at once) just before each step of a tenant of long ones. */
    __u64 slowest = ~0ULL;
    for (__u32 t = 0; t < MAX_TENANTS; t++) {
        if (t == me)
            continue;
        struct tenant_clock *c = bpf_map_lookup_elem(&clocks, &t);
        if (!c || c->last_call_ns == 0 || since(now, c->last_call_ns) > idle_ns)
            continue;
        if (c->vtime + c->queued_vt < slowest)
            slowest = c->vtime + c->queued_vt;
    }

    if (mine->last_call_ns == 0 || since(now, mine->last_call_ns) > idle_ns) {
        /* (Re)joining: start level with the slowest, never behind where it was. */
        if (slowest != ~0ULL && slowest > mine->vtime)
            mine->vtime = slowest;
    } else {
        if (used > mine->seen_device_ns)
            mine->vtime += (used - mine->seen_device_ns) * VT_UNIT / share;
        /* Forgive what the lead may have grown by since this tenant's last call. */
        if (tolerance_ppm && slowest != ~0ULL && mine->vtime > slowest) {
            __u64 forgiven = since(now, mine->last_call_ns) * tolerance_ppm / 1000000 * VT_UNIT / share;
            __u64 lead = mine->vtime - slowest;
            mine->vtime -= forgiven < lead ? forgiven : lead;
        }
    }
    mine->seen_device_ns = used;
    mine->queued_vt = call->pending[PHOS_RC_device_time] * VT_UNIT / share;
    if (now > mine->last_call_ns)
        mine->last_call_ns = now;

    if (call->amount[PHOS_RC_kernel_launches] == 0)
        return PHOS_ADMIT;
    __u64 verdict = PHOS_ADMIT;
    if (slowest != ~0ULL && mine->vtime > slowest)
        verdict = decide(call, (mine->vtime - slowest) * share / VT_UNIT);
    if (verdict == PHOS_ADMIT)
        /* Until its next call, the others see this launch's estimated time as queued. */
        mine->queued_vt += call->amount[PHOS_RC_device_time] * VT_UNIT / share;
    return verdict;
}
