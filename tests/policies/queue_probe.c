/* Admits every call and records, per tenant, the launches it sees and the tenant's kernels
 * queued at each: chained after a policy under test, it sees the launches that policy let
 * through. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

struct seen {
    __u64 launches;
    /* Launches while the tenant had kernels queued or running, but for those another thread
     * of the guest may have been waiting for. */
    __u64 with_queue;
    __u64 max_queued;
    /* Launches another thread of the guest may have been waiting for. */
    __u64 awaited;
};

PHOS_MAP(seen, BPF_MAP_TYPE_ARRAY, __u32, struct seen, 64);

PHOS_ENTRY(queue_probe) {
    if (call->amount[PHOS_RC_kernel_launches] == 0 || call->tenant >= 64)
        return PHOS_ADMIT;
    __u32 t = call->tenant;
    struct seen *s = bpf_map_lookup_elem(&seen, &t);
    if (!s)
        return PHOS_ADMIT;
    __u64 queued = call->queued[PHOS_RC_device_time];
    s->launches += 1;
    if (call->awaited)
        s->awaited += 1;
    else if (queued > 0)
        s->with_queue += 1;
    if (queued > s->max_queued)
        s->max_queued = queued;
    return PHOS_ADMIT;
}
