/* The Collatz walk from the tenant number: never ends for tenant 0. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_ENTRY(forever) {
    __u64 x = call->tenant;
    __u64 steps = 0;
    while (x != 1) {
        x = (x & 1) ? 3 * x + 1 : x / 2;
        steps++;
    }
    return PHOS_DELAY(steps);
}
