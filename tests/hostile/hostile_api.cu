// Calls with extents and values no device could honour: each must fail with the error CUDA
// gives, never abort the program; the program then carries on. Prints one line per call.
#include <cstdint>

#include "check.h"

int main() {
    char *d;
    size_t pitch;
    CHECK(cudaMallocPitch(&d, &pitch, 256, 64));
    char host[256 * 64] = {0};
    const size_t huge = size_t(1) << 33;
    auto say = [](const char *what, cudaError_t e) { std::printf("%s: %s\n", what, cudaGetErrorName(e)); };
    say("2d h2d 8 GiB rows", cudaMemcpy2D(d, huge, host, huge, huge, 1, cudaMemcpyHostToDevice));
    say("2d d2h 8 GiB rows", cudaMemcpy2D(host, huge, d, huge, huge, 1, cudaMemcpyDeviceToHost));
    say("2d h2d rows x height overflow",
        cudaMemcpy2D(d, SIZE_MAX / 2, host, SIZE_MAX / 2, 1 << 20, SIZE_MAX / 4, cudaMemcpyHostToDevice));
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(host, huge, huge, 1 << 20);
    p.dstPtr = make_cudaPitchedPtr(d, pitch, 256, 64);
    p.extent = make_cudaExtent(256, 1 << 20, 1 << 20);
    p.kind = cudaMemcpyHostToDevice;
    say("3d h2d huge extent", cudaMemcpy3D(&p));
    p.srcPos = make_cudaPos(SIZE_MAX - 8, SIZE_MAX / 2, 0);
    say("3d h2d position overflow", cudaMemcpy3D(&p));
    size_t v = 0;
    say("stack 2^40", cudaDeviceSetLimit(cudaLimitStackSize, size_t(1) << 40));
    say("printf fifo 2^40", cudaDeviceSetLimit(cudaLimitPrintfFifoSize, size_t(1) << 40));
    say("malloc heap 2^40", cudaDeviceSetLimit(cudaLimitMallocHeapSize, size_t(1) << 40));
    say("l2 fetch 4096", cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, 4096));
    CHECK(cudaDeviceGetLimit(&v, cudaLimitStackSize));
    std::printf("stack now: %zu\n", v);
    // Still working.
    CHECK(cudaMemcpy2D(d, pitch, host, 256, 256, 64, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 8192));
    CHECK(cudaDeviceGetLimit(&v, cudaLimitStackSize));
    std::printf("stack then: %zu\n", v);
    std::printf("PASS\n");
    return 0;
}
