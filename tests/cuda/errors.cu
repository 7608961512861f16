// Error semantics: what misuse returns, what cudaGetLastError/PeekAtLastError report, and the
// names and strings of errors.
#include "check.h"

__global__ void noop(int *p) {
    if (p) *p = 1;
}

int main() {
    // Names and strings.
    int codes[] = {0, 1, 2, 9, 98, 100, 101, 209, 400, 600, 700, 999, 12345};
    for (int c : codes)
        std::printf("%d %s \"%s\"\n", c, cudaGetErrorName((cudaError_t)c), cudaGetErrorString((cudaError_t)c));

    // Last error: set by a failing call, peeked without reset, then reset.
    int *d = nullptr;
    cudaError_t e = cudaMalloc(&d, 1ull << 60);
    std::printf("huge cudaMalloc: %s\n", cudaGetErrorName(e));
    std::printf("peek: %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    std::printf("peek again: %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    std::printf("get: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("get again: %s\n", cudaGetErrorName(cudaGetLastError()));

    // A launch the device cannot run.
    noop<<<1, 4096>>>(nullptr);
    std::printf("launch with 4096 threads per block: %s\n", cudaGetErrorName(cudaGetLastError()));
    noop<<<0, 32>>>(nullptr);
    std::printf("launch with an empty grid: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaMalloc(&d, sizeof(int)));
    noop<<<1, 1>>>(d);
    CHECK_LAUNCH();
    int h = 0;
    CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
    std::printf("good launch wrote %d\n", h);

    // Bad arguments.
    std::printf("memcpy with kind 7: %s\n", cudaGetErrorName(cudaMemcpy(&h, d, sizeof(int), (cudaMemcpyKind)7)));
    std::printf("free of an interior pointer: %s\n", cudaGetErrorName(cudaFree((char *)d + 4)));
    cudaGetLastError();
    std::printf("cudaFree(NULL): %s\n", cudaGetErrorName(cudaFree(nullptr)));
    std::printf("cudaMalloc(NULL, 4): %s\n", cudaGetErrorName(cudaMalloc(nullptr, 4)));
    std::printf("cudaEventCreate(NULL): %s\n", cudaGetErrorName(cudaEventCreate(nullptr)));
    std::printf("cudaStreamCreateWithFlags(bad flags): %s\n",
                cudaGetErrorName(cudaStreamCreateWithFlags(new cudaStream_t, 0x80)));
    std::printf("cudaFreeHost(not pinned): %s\n", cudaGetErrorName(cudaFreeHost(&h)));
    cudaGetLastError();
    CHECK(cudaFree(d));
    // The context is still healthy.
    CHECK(cudaDeviceSynchronize());
    std::printf("PASS\n");
    return 0;
}
