/* Sums amount[0..share) with a loop whose trip count comes from the context, and delays
 * by that many nanoseconds. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_ENTRY(loop) {
    __u64 n = call->share;
    if (n > PHOS_RC_COUNT)
        n = PHOS_RC_COUNT;
    __u64 total = 0;
#pragma nounroll
    for (__u64 i = 0; i < n; i++)
        total += call->amount[i];
    return total ? PHOS_DELAY(total) : PHOS_ADMIT;
}
