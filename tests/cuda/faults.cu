// A kernel that writes far outside any allocation: the launch itself succeeds, the fault
// surfaces at the next synchronisation as cudaErrorIllegalAddress, and from then on the
// context is unusable (a sticky error) for every call.
#include "check.h"

__global__ void wild_store(int *p, long long offset) {
    if (threadIdx.x == 0 && blockIdx.x == 0) p[offset] = 42;
}

int main() {
    int *d;
    CHECK(cudaMalloc(&d, 1024));
    wild_store<<<1, 32>>>(d, 1ll << 36);
    std::printf("launch: %s\n", cudaGetErrorName(cudaGetLastError()));
    cudaError_t e = cudaDeviceSynchronize();
    std::printf("synchronize: %s\n", cudaGetErrorName(e));
    std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("last error again: %s\n", cudaGetErrorName(cudaGetLastError()));
    int *other = nullptr;
    std::printf("cudaMalloc after the fault: %s\n", cudaGetErrorName(cudaMalloc(&other, 16)));
    int h = 0;
    std::printf("cudaMemcpy after the fault: %s\n", cudaGetErrorName(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost)));
    std::printf("string: %s\n", cudaGetErrorString(e));
    return e == cudaErrorIllegalAddress ? 0 : 1;
}
