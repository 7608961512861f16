/* Rejects calls that copy more than `limit` bytes to the device, with error `code`. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, limit, 1024);
PHOS_PARAM(__u32, code, PHOS_cudaErrorMemoryAllocation);

PHOS_ENTRY(params) {
    if (call->amount[PHOS_RC_bytes_to_device] > limit)
        return PHOS_REJECT(code);
    return PHOS_ADMIT;
}
