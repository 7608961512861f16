/* Counts calls per function (modulo 8) in an ARRAY map with atomic adds, plus totals in
 * globals (.bss and .data). Admits everything. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

struct counter {
    __u64 calls;
    __u64 last_tenant;
};

PHOS_MAP(per_function, BPF_MAP_TYPE_ARRAY, __u32, struct counter, 8);

__u64 total_calls; /* .bss */
__u64 step = 1;    /* .data, settable at load like a parameter */

PHOS_ENTRY(array_count) {
    __u32 slot = call->function % 8;
    struct counter *c = bpf_map_lookup_elem(&per_function, &slot);
    if (!c)
        return PHOS_REJECT(PHOS_cudaErrorNotPermitted);
    __sync_fetch_and_add(&c->calls, 1);
    c->last_tenant = call->tenant;
    total_calls += step;
    return PHOS_ADMIT;
}
