// A checkpoint/restore workload (usage: cr_workload GIB): fills GIB GiB of device memory
// with a pattern, prints "ready", waits for a line on stdin (checkpoint and restore happen
// meanwhile), then checks every byte on the device and prints "verified ok" or the number of
// wrong words.
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

__device__ unsigned long long wrong = 0;

__device__ unsigned pattern(unsigned long long i, unsigned chunk) {
    unsigned long long v = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((unsigned long long)chunk << 40);
    return (unsigned)(v >> 29);
}

__global__ void fill(unsigned *p, unsigned long long n, unsigned chunk) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = pattern(i, chunk);
}

__global__ void check(const unsigned *p, unsigned long long n, unsigned chunk) {
    unsigned long long bad = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        bad += p[i] != pattern(i, chunk);
    if (bad) atomicAdd(&wrong, bad);
}

int main(int argc, char **argv) {
    int gib = argc > 1 ? std::atoi(argv[1]) : 1;
    const unsigned long long words = (1ull << 30) / 4;
    std::vector<unsigned *> chunks(gib);
    for (int c = 0; c < gib; c++) {
        CHECK(cudaMalloc(&chunks[c], 1ull << 30));
        fill<<<1024, 256>>>(chunks[c], words, c);
    }
    CHECK(cudaDeviceSynchronize());
    std::printf("ready %d\n", gib);
    std::fflush(stdout);
    char line[64];
    if (!std::fgets(line, sizeof line, stdin)) return 2;
    for (int c = 0; c < gib; c++) check<<<1024, 256>>>(chunks[c], words, c);
    unsigned long long bad = 0;
    CHECK(cudaMemcpyFromSymbol(&bad, wrong, sizeof bad));
    if (bad) std::printf("%llu wrong words\n", bad);
    else std::printf("verified ok\n");
    for (int c = 0; c < gib; c++) CHECK(cudaFree(chunks[c]));
    return bad ? 1 : 0;
}
