/* Device-memory quotas as a policy: an allocation that would take a tenant past its quota,
 * or all tenants together past `device_limit`, fails with cudaErrorMemoryAllocation, as on
 * a GPU that is full. The tenant's quota is the one the router configuration gives it, or
 * `default_quota` where it has none. (The router enforces configured quotas itself too;
 * this policy adds the default and the device-wide limit, and is a template for quota
 * rules of one's own.)
 *
 *   phosctl policy load builtin:memory_quota --set default_quota=4GiB --set device_limit=60GiB
 */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, default_quota, 0); /* bytes; 0: none */
PHOS_PARAM(__u64, device_limit, 0);  /* bytes over all tenants; 0: none */

#define MAX_TENANTS 64

/* What each tenant held at its last call. */
PHOS_MAP(held_by_tenant, BPF_MAP_TYPE_ARRAY, __u32, __u64, MAX_TENANTS);

PHOS_ENTRY(memory_quota) {
    __u64 held = call->used[PHOS_RC_device_memory];
    __u32 me = call->tenant < MAX_TENANTS ? call->tenant : MAX_TENANTS - 1;
    __u64 *slot = bpf_map_lookup_elem(&held_by_tenant, &me);
    if (slot)
        *slot = held;

    __u64 want = call->amount[PHOS_RC_device_memory];
    if (want == 0)
        return PHOS_ADMIT;
    __u64 quota = call->quota[PHOS_RC_device_memory];
    if (quota == 0)
        quota = default_quota;
    if (quota && held + want > quota)
        return PHOS_REJECT(PHOS_cudaErrorMemoryAllocation);

    if (device_limit) {
        __u64 total = 0;
        for (__u32 t = 0; t < MAX_TENANTS; t++) {
            __u64 *h = bpf_map_lookup_elem(&held_by_tenant, &t);
            if (h)
                total += *h;
        }
        if (total + want > device_limit)
            return PHOS_REJECT(PHOS_cudaErrorMemoryAllocation);
    }
    return PHOS_ADMIT;
}
