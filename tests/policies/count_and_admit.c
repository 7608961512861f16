/* Counts every call per tenant in a map and admits it: a policy with state, for hot-swap
 * tests. `mark` tells versions apart. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, mark, 1);

PHOS_MAP(calls, BPF_MAP_TYPE_HASH, __u64, __u64, 1024);

PHOS_ENTRY(count_and_admit) {
    __u64 tenant = call->tenant;
    __u64 *n = bpf_map_lookup_elem(&calls, &tenant);
    if (n) {
        *n += mark;
    } else {
        __u64 one = mark;
        bpf_map_update_elem(&calls, &tenant, &one, BPF_ANY);
    }
    return PHOS_ADMIT;
}
