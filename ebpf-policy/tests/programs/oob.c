/* Reads past the end of the context: must fault. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_ENTRY(oob) {
    const volatile __u64 *words = (const volatile __u64 *)call;
    return words[sizeof(struct phos_call) / 8 + 4];
}
