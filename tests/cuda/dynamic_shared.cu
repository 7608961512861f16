// Dynamic shared memory sized at launch: each block reverses its slice through shared memory.
#include "check.h"
#include <algorithm>
#include <vector>

__global__ void reverse_blocks(const int *in, int *out, int n) {
    extern __shared__ int buf[];
    int base = blockIdx.x * blockDim.x;
    int i = base + threadIdx.x;
    if (i < n) buf[threadIdx.x] = in[i];
    __syncthreads();
    int len = min((int)blockDim.x, n - base);
    if ((int)threadIdx.x < len) out[base + threadIdx.x] = buf[len - 1 - threadIdx.x];
}

__global__ void two_arrays(float *out) {
    extern __shared__ char raw[];
    float *a = (float *)raw;
    double *b = (double *)(raw + 512);
    a[threadIdx.x] = threadIdx.x * 1.5f;
    b[threadIdx.x] = threadIdx.x * 0.25;
    __syncthreads();
    out[threadIdx.x] = a[(threadIdx.x + 1) % 64] + (float)b[63 - threadIdx.x];
}

int main() {
    const int n = 10000;
    std::vector<int> in(n), out(n);
    for (int i = 0; i < n; i++) in[i] = i * 3;
    int *din, *dout;
    CHECK(cudaMalloc(&din, n * sizeof(int)));
    CHECK(cudaMalloc(&dout, n * sizeof(int)));
    CHECK(cudaMemcpy(din, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    for (int threads : {64, 256, 1000}) {
        reverse_blocks<<<(n + threads - 1) / threads, threads, threads * sizeof(int)>>>(din, dout, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(out.data(), dout, n * sizeof(int), cudaMemcpyDeviceToHost));
        for (int b = 0; b * threads < n; b++) {
            int len = std::min(threads, n - b * threads);
            for (int t = 0; t < len; t++) EXPECT(out[b * threads + t] == in[b * threads + len - 1 - t]);
        }
        std::printf("reverse with %d threads: out[0]=%d out[%d]=%d\n", threads, out[0], n - 1, out[n - 1]);
    }
    float *dres;
    CHECK(cudaMalloc(&dres, 64 * sizeof(float)));
    two_arrays<<<1, 64, 512 + 64 * sizeof(double)>>>(dres);
    CHECK_LAUNCH();
    float res[64];
    CHECK(cudaMemcpy(res, dres, sizeof(res), cudaMemcpyDeviceToHost));
    std::printf("two arrays: %.2f %.2f %.2f\n", res[0], res[31], res[63]);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(dres));
    std::printf("PASS\n");
    return 0;
}
