// Synchronous host<->device copies below and around the staging threshold: the time of one
// `cudaMemcpy` (median and 10th percentile of REPS copies, default 2000) of pageable and
// pinned memory at 4 KiB, 64 KiB, 256 KiB and 1 MiB each way, and the round trip of a
// synchronous call that does no device work (`cudaStreamQuery`), the time per copy of a
// loop of 4 KiB and 64 KiB host-to-device copies ended by a synchronisation (`..._loop`), and
// pageable host-to-device copies after kernels (`..._after_sync`, `..._after_kernel`).
// Prints `metric value unit`
// lines. On the `emu` backend a copy is a host memcpy, so through Phos the figures are Phos's
// own overhead; on a GPU compare with the same program run natively.
// Usage: small_copies [REPS [ONLY]]: ONLY, a part of a metric's name (`64KiB_pageable`), keeps
// the copies whose name contains it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            std::printf("FAILED %s: %s\n", #call, cudaGetErrorString(e_));                   \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

using Clock = std::chrono::steady_clock;

static double us_since(Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// A kernel that does next to nothing (it leaves the memory as it was).
__global__ void touch(char *p) { p[0] = p[0]; }

int main(int argc, char **argv) {
    int reps = argc > 1 ? std::atoi(argv[1]) : 2000;
    const char *only = argc > 2 ? argv[2] : nullptr;
    if (reps < 10) reps = 10;
    CHECK(cudaFree(0));
    std::vector<double> lat(reps);
    auto report = [&](const char *name, size_t bytes) {
        std::sort(lat.begin(), lat.end());
        double p50 = lat[reps / 2], p10 = lat[reps / 10];
        std::printf("%s_p50 %.2f us\n", name, p50);
        std::printf("%s_p10 %.2f us\n", name, p10);
        if (bytes) std::printf("%s_rate %.2f GB/s\n", name, bytes / (p50 * 1e3));
    };
    for (int i = 0; i < 100; i++) CHECK(cudaStreamQuery(0));
    for (int i = 0; i < reps; i++) {
        auto t = Clock::now();
        CHECK(cudaStreamQuery(0));
        lat[i] = us_since(t);
    }
    report("sync_call", 0);

    const size_t largest = 1u << 20;
    char *dev, *pinned;
    CHECK(cudaMalloc(&dev, largest));
    CHECK(cudaMallocHost(&pinned, largest));
    std::vector<char> pageable(largest, 1), check(largest);
    std::memset(pinned, 1, largest);
    for (size_t i = 0; i < largest; i++) pageable[i] = (char)(i * 7 + 3);
    const size_t sizes[] = {4u << 10, 64u << 10, 256u << 10, 1u << 20};
    for (int kind = 0; kind < 2; kind++) {
        char *host = kind == 0 ? pageable.data() : pinned;
        for (size_t bytes : sizes) {
            for (int dir = 0; dir < 2; dir++) {
                char name[48];
                std::snprintf(name, sizeof name, "%s_%zuKiB_%s", dir == 0 ? "h2d" : "d2h", bytes >> 10,
                              kind == 0 ? "pageable" : "pinned");
                if (only && !std::strstr(name, only)) continue;
                auto copy = [&] {
                    if (dir == 0) CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
                    else CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
                };
                for (int i = 0; i < 10; i++) copy();
                for (int r = 0; r < reps; r++) {
                    auto t = Clock::now();
                    copy();
                    lat[r] = us_since(t);
                }
                report(name, bytes);
            }
        }
    }
    // A loop of host-to-device copies as a program makes them, then a synchronisation: the
    // time per copy until the device has them all (where a copy returns before its data is on
    // the device, its latency above says little alone).
    for (size_t bytes : {(size_t)4 << 10, (size_t)64 << 10}) {
        for (int kind = 0; kind < 2; kind++) {
            char name[48];
            std::snprintf(name, sizeof name, "h2d_%zuKiB_%s_loop", bytes >> 10, kind == 0 ? "pageable" : "pinned");
            if (only && !std::strstr(name, only)) continue;
            char *host = kind == 0 ? pageable.data() : pinned;
            CHECK(cudaDeviceSynchronize());
            auto t = Clock::now();
            for (int r = 0; r < reps; r++)
                CHECK(cudaMemcpy(dev + (r % 8) * bytes, host, bytes, cudaMemcpyHostToDevice));
            CHECK(cudaDeviceSynchronize());
            std::printf("%s %.2f us\n", name, us_since(t) / reps);
        }
    }
    // Pageable host-to-device copies in a process with page-locked memory whose kernels ran:
    // after a kernel and a device synchronisation (no unfinished kernel can have written the
    // page-locked memory, so the copy need not wait for the stream: `_after_sync`), and each
    // right after a kernel (the copy waits for it, as CUDA's does: `_after_kernel`).
    for (size_t bytes : {(size_t)4 << 10, (size_t)64 << 10}) {
        for (int after_sync = 1; after_sync >= 0; after_sync--) {
            char name[48];
            std::snprintf(name, sizeof name, "h2d_%zuKiB_pageable_after_%s", bytes >> 10,
                          after_sync ? "sync" : "kernel");
            if (only && !std::strstr(name, only)) continue;
            auto copy = [&] { CHECK(cudaMemcpy(dev, pageable.data(), bytes, cudaMemcpyHostToDevice)); };
            touch<<<1, 1>>>(dev);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            for (int i = 0; i < 10; i++) copy();
            for (int r = 0; r < reps; r++) {
                if (!after_sync) {
                    touch<<<1, 1>>>(dev);
                    CHECK(cudaGetLastError());
                }
                auto t = Clock::now();
                copy();
                lat[r] = us_since(t);
            }
            report(name, bytes);
        }
    }
    // The bytes arrive whole: a pageable round trip of the largest size.
    CHECK(cudaMemcpy(dev, pageable.data(), largest, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(check.data(), dev, largest, cudaMemcpyDeviceToHost));
    if (std::memcmp(check.data(), pageable.data(), largest) != 0) {
        std::printf("FAILED: the copied bytes differ\n");
        return 1;
    }
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dev));
    return 0;
}
