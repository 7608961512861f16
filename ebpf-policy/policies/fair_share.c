/* Weighted fair share of device time between tenants.
 *
 * Each tenant has a virtual time: the device time its kernels have been measured to use,
 * divided by its share. A tenant idle for `idle_ns` rejoins level with the slowest active
 * tenant, so idling does not bank credit. Only launches are held back: copies and queries
 * pass, so a tenant waiting for the GPU is not also cut off from its memory.
 *
 * Turns (the default: `quantum_ns` > 0). Tenants' kernels take the GPU in turns, never
 * side by side:
 *   - a launch waits while other tenants have kernels queued or running;
 *   - the device free of the others' work, a launch goes, unless a tenant waiting for the
 *     device is behind this one (counting this one's queued kernels) by more than
 *     `quantum_ns` of device time: then this tenant stops launching, its queue drains, and
 *     the slowest tenant waiting has the device next.
 * Why: when two contexts time-slice a GPU, events around a kernel span the other's slices
 * too, and books kept from them are off by as much as the unfairness to correct (an H100
 * charged a tenant of 10 ms kernels 1.2 times its solo time beside one of 0.1 ms kernels,
 * docs/perf.md); a kernel that has the GPU to itself is measured at what it takes. The
 * price: at each turn the GPU idles for the report of the last kernel and the next
 * tenant's launch (about 0.1 ms), and a tenant waits through the others' turns (no kernel
 * is preempted). A tenant may bank at most `bank_ns` of device time it did not use while
 * active (launching nothing, or little). One whose launches have found the others' work on
 * the device for `max_wait_ns` (a kernel that runs for seconds, or never ends) stops
 * waiting for it and launches beside it, time-sliced, until the device is free of the
 * others' work again. Turns assume the router's tenants share one GPU: for tenants spread
 * over several, set quantum_ns=0.
 *
 * Time-sliced (`quantum_ns=0`): tenants launch side by side, and a tenant's lead is how
 * far its virtual time is past that of the slowest other active tenant, counting the
 * work that tenant has queued (a tenant whose 10 ms kernel is running is not 10 ms
 * behind: it is charged in one step when the kernel ends). A tenant's own queued work is
 * not counted until it has run: its queue is what keeps the GPU busy while the others' is
 * empty. On a time-sliced GPU the only way to give one tenant's time to another is to let
 * the first one's queue run empty: a launch held back changes nothing until the tenant's
 * queued kernels have run. So a launch of a tenant that leads
 *   - by at most `brake_ns` (off by default: no limit) goes at once;
 *   - by more (the brake) goes once the tenant has no kernel queued or running, and its
 *     queue has been empty for (lead - brake_ns) / hold_div: the tenant keeps one kernel
 *     on the device at a time, and between two of them the others have the GPU to
 *     themselves for a while that grows with the lead. (A launch another thread of the
 *     guest may be waiting for is not braked: the kernels the brake would wait for may be
 *     queued behind that thread's wait.)
 *   - by more than `slack_ns` (the stop) waits until the others catch up.
 * A lead that grows within `tolerance_ppm` of wall time is forgiven as it grows: the
 * books' error under time-slicing is then not acted on.
 *
 * docs/policies.md and docs/perf.md have more.
 *
 *   phosctl policy load builtin:fair_share --set quantum_ns=10ms
 */
#include "phos_policy.h"

PHOS_POLICY("Apache-2.0");

/* Turns: the lead over a waiting tenant past which a tenant stops launching (0: no turns,
 * tenants time-slice the GPU), the longest a tenant waits for the others' work to drain,
 * and the most unused device time a tenant banks. */
PHOS_PARAM(__u64, quantum_ns, 5000000);
PHOS_PARAM(__u64, max_wait_ns, 500000000);
PHOS_PARAM(__u64, bank_ns, 100000000);
/* Time-sliced mode. */
PHOS_PARAM(__u64, slack_ns, 30000000);
/* The brake is off unless set: on an H100 with one tenant of 0.1 ms kernels and one of
 * 10 ms (docs/perf.md), braking at 2 ms starved the short one (its kernels went one at a
 * time, each waiting for the last to be reported), 39% unfairness against 2.4-2.8% with
 * the stop alone. */
PHOS_PARAM(__u64, brake_ns, ~0ULL);
PHOS_PARAM(__u64, hold_div, 8);
/* Events charged a tenant of 10 ms kernels 1.2 times its solo time beside one of 0.1 ms
 * kernels on an H100, and the router's contention accounting left about 8% of that:
 * equalising such books gave the short tenant 54% (8.4% unfairness), forgiving 6% gave
 * 51% (2.2%), docs/perf.md. 0: every nanosecond of lead counts. */
PHOS_PARAM(__u64, tolerance_ppm, 60000);
/* Both modes. */
PHOS_PARAM(__u64, idle_ns, 200000000);
/* How soon a held launch is asked about again. */
PHOS_PARAM(__u64, poll_ns, 50000);

#define MAX_TENANTS 64
/* Virtual time is device time * VT_UNIT / share. */
#define VT_UNIT 1024ULL

struct tenant_clock {
    __u64 vtime;
    /* Virtual time of the tenant's kernels queued or running (the router's estimate), as
     * of its last call, including the launch that call was admitted for. */
    __u64 queued_vt;
    __u64 seen_device_ns;
    __u64 last_call_ns;
    /* Turns: since when its launches have found the others' work on the device (0: they
     * did not). */
    __u64 blocked_ns;
};

PHOS_MAP(clocks, BPF_MAP_TYPE_ARRAY, __u32, struct tenant_clock, MAX_TENANTS);

/* Turns: the slowest tenant that asked to launch lately, kept up to date by the launches
 * of all tenants: each takes the slot if it is slower than its holder, holds it, or the
 * slot has gone stale. (One slot rather than a second look at every tenant: the kernel's
 * verifier gives up on two running minimums over the tenants.) */
struct contender {
    __u64 tenant_plus1; /* 0: none */
    __u64 vtime;        /* with its queued kernels */
    __u64 asked_ns;
};

PHOS_MAP(slowest_launcher, BPF_MAP_TYPE_ARRAY, __u32, struct contender, 1);

/* How long after its last launch (or ask) a tenant still counts as contending for the
 * device: a held launch is asked about again every poll_ns, and a tenant with the device
 * asks at each launch. */
#define WAIT_FRESH_NS 2000000ULL

/* Time-sliced: the verdict on a launch of a tenant `lead_ns` of its own device time ahead. */
static __always_inline __u64 time_sliced(const struct phos_call *call, __u64 lead_ns) {
    if (lead_ns > slack_ns)
        return PHOS_DELAY(poll_ns);
    if (lead_ns <= brake_ns)
        return PHOS_ADMIT;
    /* The brake: one kernel at a time, the queue left empty for a while in between; but not
     * for a launch another thread of the guest may be waiting for (the tenant's queued
     * kernels may be waiting behind that thread's wait). */
    if (call->awaited)
        return PHOS_ADMIT;
    if (call->queued[PHOS_RC_device_time] > 0)
        return PHOS_DELAY(poll_ns);
    __u64 hold = hold_div ? (lead_ns - brake_ns) / hold_div : 0;
    __u64 drained = call->drained_ns[PHOS_RC_device_time];
    __u64 empty = call->now_ns > drained ? call->now_ns - drained : 0;
    if (empty >= hold)
        return PHOS_ADMIT;
    return PHOS_DELAY(hold - empty);
}

/* How long ago `then` was, seen from `now`: 0 if `then` is later (the router never turns
 * now_ns back, but a policy run directly, as in tests, may see any order). */
static __always_inline __u64 since(__u64 now, __u64 then) {
    return now > then ? now - then : 0;
}

/* Turns: the verdict on a launch of a tenant whose virtual time with its queued work is
 * `ahead`, `behind` the virtual time of the slowest other tenant contending for the device
 * (~0: this one is the slowest, or alone). */
static __always_inline __u64 take_turns(const struct phos_call *call, struct tenant_clock *mine, __u64 ahead,
                                        __u64 behind, __u64 share) {
    __u64 now = call->now_ns;
    if (call->others_queued[PHOS_RC_device_time] > 0) {
        if (!mine->blocked_ns)
            mine->blocked_ns = now;
        if (since(now, mine->blocked_ns) < max_wait_ns)
            return PHOS_DELAY(poll_ns);
        return PHOS_ADMIT; /* the others' work does not drain: time-slice beside it */
    }
    mine->blocked_ns = 0;
    if (behind != ~0ULL && behind + quantum_ns * VT_UNIT / share < ahead)
        return PHOS_DELAY(poll_ns);
    return PHOS_ADMIT;
}

PHOS_ENTRY(fair_share) {
    if (call->tenant >= MAX_TENANTS)
        return PHOS_ADMIT;
    __u32 me = call->tenant;
    struct tenant_clock *mine = bpf_map_lookup_elem(&clocks, &me);
    if (!mine)
        return PHOS_ADMIT;
    __u64 now = call->now_ns;
    __u64 share = call->share ? call->share : 1;
    /* Measured so far: what `used` holds beyond the estimate for queued kernels. */
    __u64 used = call->used[PHOS_RC_device_time] - call->pending[PHOS_RC_device_time];

    /* The slowest other active tenant, counting the work it has queued. Comparing against
     * measured time alone would hold back a tenant of short kernels (whose queue is short
     * and runs dry at once) just before each step of a tenant of long ones. */
    __u64 slowest = ~0ULL;
    for (__u32 t = 0; t < MAX_TENANTS; t++) {
        if (t == me)
            continue;
        struct tenant_clock *c = bpf_map_lookup_elem(&clocks, &t);
        if (!c || c->last_call_ns == 0 || since(now, c->last_call_ns) > idle_ns)
            continue;
        if (c->vtime + c->queued_vt < slowest)
            slowest = c->vtime + c->queued_vt;
    }

    if (mine->last_call_ns == 0 || since(now, mine->last_call_ns) > idle_ns) {
        /* (Re)joining: start level with the slowest, never behind where it was. */
        if (slowest != ~0ULL && slowest > mine->vtime)
            mine->vtime = slowest;
    } else {
        if (used > mine->seen_device_ns)
            mine->vtime += (used - mine->seen_device_ns) * VT_UNIT / share;
        /* Time-sliced: forgive what the lead may have grown by since this tenant's last call. */
        if (!quantum_ns && tolerance_ppm && slowest != ~0ULL && mine->vtime > slowest) {
            __u64 forgiven = since(now, mine->last_call_ns) * tolerance_ppm / 1000000 * VT_UNIT / share;
            __u64 lead = mine->vtime - slowest;
            mine->vtime -= forgiven < lead ? forgiven : lead;
        }
    }
    mine->seen_device_ns = used;
    mine->queued_vt = call->pending[PHOS_RC_device_time] * VT_UNIT / share;
    if (now > mine->last_call_ns)
        mine->last_call_ns = now;

    if (call->amount[PHOS_RC_kernel_launches] == 0)
        return PHOS_ADMIT;
    __u64 launch_vt = call->amount[PHOS_RC_device_time] * VT_UNIT / share;
    __u64 verdict = PHOS_ADMIT;
    if (quantum_ns) {
        /* Unused device time banks up to bank_ns. */
        __u64 bank_vt = bank_ns * VT_UNIT / share;
        if (slowest != ~0ULL && slowest > bank_vt && mine->vtime < slowest - bank_vt)
            mine->vtime = slowest - bank_vt;
        __u32 zero = 0;
        struct contender *slow = bpf_map_lookup_elem(&slowest_launcher, &zero);
        if (!slow)
            return PHOS_ADMIT;
        /* Where this tenant will be once its queued kernels have run. */
        __u64 projected = mine->vtime + mine->queued_vt;
        if (!slow->tenant_plus1 || since(now, slow->asked_ns) > WAIT_FRESH_NS || slow->tenant_plus1 == me + 1 ||
            projected < slow->vtime) {
            slow->tenant_plus1 = me + 1;
            slow->vtime = projected;
            if (now > slow->asked_ns)
                slow->asked_ns = now;
        }
        __u64 behind = slow->tenant_plus1 != me + 1 ? slow->vtime : ~0ULL;
        verdict = take_turns(call, mine, projected, behind, share);
    } else if (slowest != ~0ULL && mine->vtime > slowest) {
        verdict = time_sliced(call, (mine->vtime - slowest) * share / VT_UNIT);
    }
    if (verdict == PHOS_ADMIT)
        /* Until its next call, the others see this launch's estimated time as queued. */
        mine->queued_vt += launch_vt;
    return verdict;
}
