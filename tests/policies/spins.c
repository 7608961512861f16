/* A policy that never finishes: the router must stop it at its instruction budget, unload
 * it and carry on. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_ENTRY(spins) {
    volatile __u64 n = call->now_ns;
    while (n != 0)
        n = n + 1;
    return PHOS_ADMIT;
}
