/* Phos policy API: what a policy program sees and may call.
 *
 * A policy is an eBPF program in C, built with
 *     clang -O2 -target bpf -I<phos include dir> -c policy.c -o policy.o
 * (or `phosctl policy build policy.c`). The router runs it before forwarding each call of
 * every guest, with a read-only `struct phos_call` describing the call, and the policy
 * answers PHOS_ADMIT, PHOS_DELAY(ns) or PHOS_REJECT(cuda_error). docs/policies.md is the
 * reference; this header is the whole interface.
 *
 * The helpers are the kernel's own (same ids and signatures), so a policy that passes the
 * router's checks is also a valid tracepoint program for the kernel verifier.
 */
#ifndef PHOS_POLICY_H
#define PHOS_POLICY_H

#include "phos_spec.h"

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed int __s32;
typedef signed long long __s64;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* The call being decided. Every field is read-only. */
struct phos_call {
    /* Reserved, always 0: the kernel's verifier refuses reads of a tracepoint context's
     * first word, so no field a policy reads may live there. */
    __u64 reserved;
    __u64 tenant;         /* tenant number: 0, 1, 2... in order of first appearance */
    __u64 session;        /* session id (one per guest process) */
    __u64 function;       /* PHOS_FN_* */
    __u64 now_ns;         /* CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns(); never goes
                           * backwards from one call of a policy to the next */
    __u64 share;          /* the tenant's weight (router configuration; default 1) */
    __u64 active_tenants; /* tenants that made a call in the last 100 ms (this one included) */
    __u64 active_shares;  /* the sum of their shares */
    /* What this call uses, per resource (PHOS_RC_*), from the spec's cost annotations. A
     * measured resource (device time) is not known before the call: here, an estimate (the
     * tenant's mean per measured call so far; 0 before its first measurement). */
    __u64 amount[PHOS_RC_COUNT];
    /* What the tenant has used, per resource: held now (device memory), in total so far
     * (launches, bytes), or measured so far plus an estimate for calls not yet measured
     * (device time, ns). */
    __u64 used[PHOS_RC_COUNT];
    /* The tenant's quota of each resource (router configuration); 0: none. */
    __u64 quota[PHOS_RC_COUNT];
    /* Of a measured resource's `used`, the estimate for calls admitted and not measured
     * yet (work still queued or running); `used - pending` is what has been measured. */
    __u64 pending[PHOS_RC_COUNT];
    /* Of a measured resource, the tenant's calls admitted and not measured yet: for device
     * time, its kernels queued or running on the device (the servers report each kernel
     * as it ends, within about 100 us). */
    __u64 queued[PHOS_RC_COUNT];
    /* Of a measured resource, when `queued` last fell to 0 (CLOCK_MONOTONIC ns; 0: never):
     * with `queued` 0, the tenant's queue has been empty for `now_ns - drained_ns`. */
    __u64 drained_ns[PHOS_RC_COUNT];
    /* 1 when, while this call was held back, a thread of the guest was waiting for calls
     * its other threads had sent (a barrier before a synchronising call), which may include
     * this one: holding it back holds that thread back too, with whatever the thread has
     * queued behind its wait. A policy that waits for the tenant's own work to finish
     * before letting a launch through must let this one through, or the two may wait for
     * each other. Always 0 the first time a call is asked about. */
    __u64 awaited;
    /* Of a measured resource, the other tenants' calls admitted and not measured yet: for
     * device time, their kernels queued or running (0: the device is free of their work, as
     * far as the servers have reported). */
    __u64 others_queued[PHOS_RC_COUNT];
};

/* Verdicts. A delay asks again after that many nanoseconds (at most 100 ms per wait). */
#define PHOS_ADMIT 0ULL
#define PHOS_DELAY(ns) ((1ULL << 62) | ((__u64)(ns) & ((1ULL << 62) - 1)))
#define PHOS_REJECT(cuda_error) ((2ULL << 62) | (__u32)(cuda_error))

/* CUDA errors a policy typically answers with. */
#define PHOS_cudaErrorMemoryAllocation 2
#define PHOS_cudaErrorLaunchOutOfResources 701
#define PHOS_cudaErrorNotPermitted 800

/* Maps (the kernel's types and semantics). */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_HASH 5
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_EXIST 2

struct phos_map_def {
    __u32 type;
    __u32 key_size;
    __u32 value_size;
    __u32 max_entries;
    __u32 map_flags;
};

#define PHOS_MAP(name, map_type, key_type, value_type, entries)                                    \
    struct phos_map_def SEC("maps") name = {                                                    \
        .type = map_type,                                                                       \
        .key_size = sizeof(key_type),                                                           \
        .value_size = sizeof(value_type),                                                       \
        .max_entries = entries,                                                                 \
    }

/* Helpers, by the kernel's ids. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static long (*bpf_trace_printk)(const char *fmt, __u32 fmt_size, ...) = (void *)6;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;

/* Log a line through the router's log (at `info`, target phos_policy). Up to three
 * arguments; %d %i %u %x %ld %lu %lx %lld %llu %llx %s %%. */
#define phos_log(fmt, ...)                                                                      \
    ({                                                                                          \
        char ____fmt[] = fmt;                                                                   \
        bpf_trace_printk(____fmt, sizeof(____fmt), ##__VA_ARGS__);                              \
    })

/* Operator-settable parameters: `phosctl policy load x.o --set name=value` rewrites them
 * at load. */
#define PHOS_PARAM(type, name, value) volatile const type name = value

/* Every policy says which spec it was built against and its license. */
#define PHOS_POLICY(license)                                                                    \
    char _license[] SEC("license") = license;                                                   \
    __u64 _phos_spec_hash SEC("phos_spec") = PHOS_SPEC_HASH

/* The entry point: `PHOS_ENTRY(name) { ... return PHOS_ADMIT; }`, with `call` the context. */
#define PHOS_ENTRY(name) SEC("tracepoint/phos/" #name) __u64 name(const struct phos_call *call)

#endif
