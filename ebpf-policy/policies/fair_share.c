/* Weighted fair share of device time between tenants.
 *
 * Each tenant has a virtual time: the device time its kernels have been measured to use,
 * divided by its share. A kernel launch of a tenant more than `slack_ns` of virtual time
 * ahead of the slowest other active tenant (counting that tenant's queued work) waits
 * until that tenant catches up. Work still
 * queued is not counted until it has run: a tenant's queue is what keeps the GPU busy
 * while the others' is empty, and charging it in advance would hold back a tenant of long
 * kernels so often that its queue runs dry. `slack_ns` should therefore be a few times
 * the longest kernel any tenant runs (virtual time moves one kernel at a time, and each
 * delay risks an empty queue); docs/perf.md has measurements.
 * A tenant idle for `idle_ns` rejoins level with the slowest active tenant, so idling
 * does not bank credit. Only launches are held back: copies and queries pass, so a tenant
 * waiting for the GPU is not also cut off from its memory.
 *
 *   phosctl policy load builtin:fair_share --set slack_ns=50ms
 */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, slack_ns, 30000000);
PHOS_PARAM(__u64, idle_ns, 200000000);
PHOS_PARAM(__u64, poll_ns, 100000);

#define MAX_TENANTS 64
/* Virtual time is device time * VT_UNIT / share. */
#define VT_UNIT 1024ULL

struct tenant_clock {
    __u64 vtime;
    /* Virtual time of the tenant's kernels queued or running (the router's estimate), as
     * of its last call. */
    __u64 queued_vt;
    __u64 seen_device_ns;
    __u64 last_call_ns;
};

PHOS_MAP(clocks, BPF_MAP_TYPE_ARRAY, __u32, struct tenant_clock, MAX_TENANTS);

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

    /* The slowest other active tenant, counting the work it has queued: a tenant whose
     * 10 ms kernel is running is not 10 ms behind, it is charged in one step when the
     * kernel ends. Comparing against measured time alone would hold back a tenant of short
     * kernels (whose queue is short and runs dry at once) just before each such step. */
    __u64 slowest = ~0ULL;
    for (__u32 t = 0; t < MAX_TENANTS; t++) {
        if (t == me)
            continue;
        struct tenant_clock *c = bpf_map_lookup_elem(&clocks, &t);
        if (!c || c->last_call_ns == 0 || now - c->last_call_ns > idle_ns)
            continue;
        if (c->vtime + c->queued_vt < slowest)
            slowest = c->vtime + c->queued_vt;
    }

    if (mine->last_call_ns == 0 || now - mine->last_call_ns > idle_ns) {
        /* (Re)joining: start level with the slowest, never behind where it was. */
        if (slowest != ~0ULL && slowest > mine->vtime)
            mine->vtime = slowest;
    } else if (used > mine->seen_device_ns) {
        mine->vtime += (used - mine->seen_device_ns) * VT_UNIT / share;
    }
    mine->seen_device_ns = used;
    mine->queued_vt = call->pending[PHOS_RC_device_time] * VT_UNIT / share;
    mine->last_call_ns = now;

    if (call->amount[PHOS_RC_kernel_launches] == 0 || slowest == ~0ULL)
        return PHOS_ADMIT;
    if (mine->vtime > slowest + slack_ns * VT_UNIT / share)
        return PHOS_DELAY(poll_ns);
    return PHOS_ADMIT;
}
