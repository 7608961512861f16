// Large copies that are refused must fail at once with the right error, never after a
// stall: a copy to or from a bad device pointer (one that goes through the staging region),
// and the common "a kernel faulted, copy the result back"; with the argument `big`, copies of
// 24 and 32 MiB between good pointers (which the tests have a router's policy refuse). Each
// case prints its error and how long the call took, for tests/e2e/failfast.rs to check.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"

__global__ void wild_store(int *p, long long offset) {
    if (threadIdx.x == 0 && blockIdx.x == 0) p[offset] = 42;
}

static double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// One timed cudaMemcpy: prints "<what>: <error> <ms> ms".
static void timed(const char *what, void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    auto t = std::chrono::steady_clock::now();
    cudaError_t e = cudaMemcpy(dst, src, n, kind);
    std::printf("%s: %s %.0f ms\n", what, cudaGetErrorName(e), ms_since(t));
}

int main(int argc, char **argv) {
    const size_t mib = 1 << 20;
    std::vector<char> host(32 * mib, 7);
    char *d;
    if (argc > 1 && std::string(argv[1]) == "big") {
        CHECK(cudaMalloc(&d, 32 * mib));
        timed("h2d 24 MiB", d, host.data(), 24 * mib, cudaMemcpyHostToDevice);
        timed("d2h 32 MiB", host.data(), d, 32 * mib, cudaMemcpyDeviceToHost);
        CHECK(cudaMemcpy(d, host.data(), 4 * mib, cudaMemcpyHostToDevice));
        std::vector<char> back(4 * mib, 0);
        CHECK(cudaMemcpy(back.data(), d, 4 * mib, cudaMemcpyDeviceToHost));
        std::printf("round trip: %s\n", back == std::vector<char>(4 * mib, 7) ? "same" : "DIFFERENT");
        return 0;
    }
    CHECK(cudaMalloc(&d, 4 * mib));
    char *outside = d + 512 * mib;  // in the session's range, in no allocation
    // Device to host: the guest waits for the server to fill the first chunk.
    timed("d2h outside", host.data(), outside, mib, cudaMemcpyDeviceToHost);
    // Host to device past two chunks: the guest waits for the server to drain them.
    timed("h2d outside", outside, host.data(), 24 * mib, cudaMemcpyHostToDevice);
    // Running past the allocation's end.
    timed("d2h past the end", host.data(), d + 2 * mib, 4 * mib, cudaMemcpyDeviceToHost);
    // The session is fine: a good round trip.
    CHECK(cudaMemcpy(d, host.data(), 4 * mib, cudaMemcpyHostToDevice));
    std::vector<char> back(4 * mib, 0);
    CHECK(cudaMemcpy(back.data(), d, 4 * mib, cudaMemcpyDeviceToHost));
    std::printf("round trip: %s\n", back == std::vector<char>(4 * mib, 7) ? "same" : "DIFFERENT");
    // A kernel faults; the program copies its result back (the error is sticky from here).
    wild_store<<<1, 32>>>((int *)d, 1ll << 36);
    timed("d2h after a fault", back.data(), d, 4 * mib, cudaMemcpyDeviceToHost);
    timed("h2d after a fault", d, host.data(), 4 * mib, cudaMemcpyHostToDevice);
    return 0;
}
