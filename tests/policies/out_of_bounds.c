/* A policy with a bug: it reads past the end of its context. The router must unload it and
 * carry on. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_ENTRY(out_of_bounds) {
    const __u64 *words = (const __u64 *)call;
    /* The context is far smaller than 4096 words. */
    volatile __u64 index = 4000;
    /* The verdict depends on the load, so the compiler must keep it. */
    return words[index] == 12345 ? PHOS_REJECT(PHOS_cudaErrorNotPermitted) : PHOS_ADMIT;
}
