// Shared helpers for the Phos CUDA test programs: every API call is checked, and a failure
// prints where and why and exits non-zero.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) {                                                           \
            std::printf("FAILED: %s -> %s (%s) at %s:%d\n", #call, cudaGetErrorName(err_),   \
                        cudaGetErrorString(err_), __FILE__, __LINE__);                       \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

#define CHECK_LAUNCH()                                                                       \
    do {                                                                                     \
        CHECK(cudaGetLastError());                                                           \
    } while (0)

#define EXPECT(cond)                                                                         \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            std::printf("FAILED: expected %s at %s:%d\n", #cond, __FILE__, __LINE__);        \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)
