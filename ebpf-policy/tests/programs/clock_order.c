/* Rejects a call whose now_ns is earlier than the last one it saw: the engine must hand a
 * program a clock that never goes backwards. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

__u64 last_now; /* .bss */

PHOS_ENTRY(clock_order) {
    if (call->now_ns < last_now)
        return PHOS_REJECT(PHOS_cudaErrorNotPermitted);
    last_now = call->now_ns;
    return PHOS_ADMIT;
}
