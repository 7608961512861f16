// Shared helpers for the Phos CUDA test programs of the driver API (linked with -lcuda): every
// driver call is checked, and a failure prints where and why and exits non-zero.
#pragma once
#include <cuda.h>
#include "check.h"

#define CU(call)                                                                             \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        if (r_ != CUDA_SUCCESS) {                                                            \
            const char *name_ = nullptr;                                                     \
            cuGetErrorName(r_, &name_);                                                      \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, name_ ? name_ : "?", __FILE__, \
                        __LINE__);                                                           \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

// The name of a driver status, for programs that print what a call answered.
static inline const char *name_of(CUresult r) {
    const char *name = nullptr;
    return cuGetErrorName(r, &name) == CUDA_SUCCESS ? name : "(no name)";
}
