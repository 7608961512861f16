/* Logs every call (string literals in .rodata.str1.1 and on the stack) and admits it. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

static const char *kind(__u64 function) {
    return function == PHOS_FN_cudaMalloc ? "malloc" : "other";
}

PHOS_ENTRY(log_calls) {
    phos_log("tenant %llu calls %s (%lld)\n", call->tenant, kind(call->function), (__s64)call->function - 20);
    phos_log("%%x=%x %5d|%-3u|", 255, -7, 1);
    return PHOS_ADMIT;
}
