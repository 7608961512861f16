/* Two entry points: not a valid policy. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

PHOS_ENTRY(first) {
    return PHOS_ADMIT;
}

PHOS_ENTRY(second) {
    return PHOS_ADMIT;
}
