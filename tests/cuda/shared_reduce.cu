// Block reduction through shared memory with __syncthreads, then a second pass on the host.
#include "check.h"
#include <vector>

constexpr int BLOCK = 256;

__global__ void block_sum(const int *in, long long *out, int n) {
    __shared__ long long partial[BLOCK];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    partial[threadIdx.x] = i < n ? in[i] : 0;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

int main() {
    const int n = 1000003;
    const int blocks = (n + BLOCK - 1) / BLOCK;
    std::vector<int> in(n);
    long long expected = 0;
    for (int i = 0; i < n; i++) {
        in[i] = (int)(((long long)i * 7919) % 1000) - 500;
        expected += in[i];
    }
    int *din;
    long long *dout;
    CHECK(cudaMalloc(&din, n * sizeof(int)));
    CHECK(cudaMalloc(&dout, blocks * sizeof(long long)));
    CHECK(cudaMemcpy(din, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    block_sum<<<blocks, BLOCK>>>(din, dout, n);
    CHECK_LAUNCH();
    std::vector<long long> partial(blocks);
    CHECK(cudaMemcpy(partial.data(), dout, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
    long long total = 0;
    for (long long p : partial) total += p;
    std::printf("shared_reduce blocks=%d sum=%lld expected=%lld\n", blocks, total, expected);
    EXPECT(total == expected);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    std::printf("PASS\n");
    return 0;
}
