/* A program, but not in a tracepoint/phos/ section: not a policy. */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

SEC("tracepoint/sched/sched_switch") int other(void *ctx) {
    return 0;
}
