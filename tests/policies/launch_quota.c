/* Refuses a tenant's kernel launches past `max_launches` in all: a policy that rejects
 * calls the guest sends without waiting, for tests. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_PARAM(__u64, max_launches, 10);

PHOS_ENTRY(launch_quota) {
    if (call->amount[PHOS_RC_kernel_launches] > 0 && call->used[PHOS_RC_kernel_launches] >= max_launches)
        return PHOS_REJECT(PHOS_cudaErrorNotPermitted);
    return PHOS_ADMIT;
}
