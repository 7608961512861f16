/* Refuses every copy of more than `max_bytes` between the host and the device: a policy
 * that refuses the large copies that move through the staging region, for tests. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, max_bytes, 16 << 20);

PHOS_ENTRY(copy_quota) {
    if (call->amount[PHOS_RC_bytes_to_device] + call->amount[PHOS_RC_bytes_from_device] > max_bytes)
        return PHOS_REJECT(PHOS_cudaErrorNotPermitted);
    return PHOS_ADMIT;
}
