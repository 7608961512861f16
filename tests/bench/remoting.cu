// Micro-benchmarks of what remoting adds to a CUDA program: the round trip of a synchronous
// call, kernel launch throughput, and host<->device copy bandwidth. Prints `metric value unit`
// lines; tests/scripts/gpu-bench.sh runs it natively and through Phos and compares.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

__global__ void empty() {}

using Clock = std::chrono::steady_clock;

static double us_since(Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

int main() {
    CHECK(cudaFree(0));
    // Synchronous round trip: cudaStreamQuery on an idle stream does no device work.
    const int calls = 20000;
    std::vector<double> lat(calls);
    for (int i = 0; i < 1000; i++) CHECK(cudaStreamQuery(0));
    for (int i = 0; i < calls; i++) {
        auto t = Clock::now();
        CHECK(cudaStreamQuery(0));
        lat[i] = us_since(t);
    }
    std::sort(lat.begin(), lat.end());
    std::printf("sync_call_p50 %.2f us\n", lat[calls / 2]);
    std::printf("sync_call_p99 %.2f us\n", lat[calls * 99 / 100]);

    // Launch throughput: empty kernels back to back, then one synchronisation.
    const int launches = 20000;
    for (int i = 0; i < 100; i++) empty<<<1, 1>>>();
    CHECK(cudaDeviceSynchronize());
    auto t = Clock::now();
    for (int i = 0; i < launches; i++) empty<<<1, 32>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::printf("launches_per_s %.0f 1/s\n", launches / (us_since(t) * 1e-6));

    // Pageable copies of 64 MiB.
    const size_t bytes = 64 << 20;
    std::vector<char> host(bytes, 1);
    char *dev;
    CHECK(cudaMalloc(&dev, bytes));
    for (int dir = 0; dir < 2; dir++) {
        CHECK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
        const int reps = 10;
        t = Clock::now();
        for (int r = 0; r < reps; r++) {
            if (dir == 0) CHECK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
            else CHECK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost));
        }
        double gbs = reps * (double)bytes / (us_since(t) * 1e-6) / 1e9;
        std::printf("%s_64MiB_pageable %.2f GB/s\n", dir == 0 ? "h2d" : "d2h", gbs);
    }
    CHECK(cudaFree(dev));
    return 0;
}
