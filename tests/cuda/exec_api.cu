// Execution control: kernel attributes, dynamic shared memory opt-in, cache/carveout hints, occupancy queries, cudaLaunchKernel, cooperative launch and launch-configuration errors.
#include "check.h"
#include <vector>

__global__ void __launch_bounds__(256) bounded(float *out) {
    __shared__ float tile[256];
    tile[threadIdx.x] = (float)(blockIdx.x * 256 + threadIdx.x);
    __syncthreads();
    out[blockIdx.x * 256 + threadIdx.x] = tile[255 - threadIdx.x];
}

// Reverses a block-sized chunk of `per_thread * blockDim.x` ints through dynamic shared memory.
template <int Tag>
__global__ void reverse_dyn(int *out, int per_thread) {
    extern __shared__ int buf[];
    int nt = blockDim.x, total = per_thread * nt;
    for (int k = 0; k < per_thread; k++) buf[k * nt + threadIdx.x] = blockIdx.x * 100000 + k * nt + threadIdx.x;
    __syncthreads();
    for (int k = 0; k < per_thread; k++) {
        int j = k * nt + threadIdx.x;
        out[blockIdx.x * total + j] = buf[total - 1 - j];
    }
}

__global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void coop_write(int *out, int base) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = base + blockIdx.x * 1000 + threadIdx.x;
}

static int host_function(int x) { return x + 1; }

int main() {
    // Static attributes of a kernel with launch bounds and 1 KiB of static shared memory.
    cudaFuncAttributes attr;
    CHECK(cudaFuncGetAttributes(&attr, bounded));
    EXPECT(attr.maxThreadsPerBlock > 0 && attr.maxThreadsPerBlock <= 256);
    EXPECT(attr.sharedSizeBytes == 1024);
    EXPECT(attr.binaryVersion > 0 || attr.ptxVersion > 0);
    std::printf("attributes ok (static shared %zu)\n", attr.sharedSizeBytes);
    std::printf("attributes of a host function: %s\n",
                cudaGetErrorName(cudaFuncGetAttributes(&attr, (const void *)host_function)));
    cudaGetLastError();
    float *dout;
    const int blocks = 4;
    CHECK(cudaMalloc(&dout, blocks * 256 * sizeof(float)));
    bounded<<<blocks, 256>>>(dout);
    CHECK_LAUNCH();
    std::vector<float> hf(blocks * 256);
    CHECK(cudaMemcpy(hf.data(), dout, hf.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < 256; t++) EXPECT(hf[b * 256 + t] == (float)(b * 256 + 255 - t));
    std::printf("bounded kernel ok\n");

    // Dynamic shared memory above the default 48 KiB needs an opt-in per kernel.
    const int smem = 64 * 1024, threads = 256, per_thread = smem / (int)sizeof(int) / threads, dblocks = 2;
    const int total = dblocks * threads * per_thread;
    int *dint;
    CHECK(cudaMalloc(&dint, total * sizeof(int)));
    reverse_dyn<1><<<dblocks, threads, smem>>>(dint, per_thread);
    std::printf("64 KiB dynamic shared without opt-in: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaFuncSetAttribute(reverse_dyn<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncGetAttributes(&attr, reverse_dyn<0>));
    std::printf("max dynamic shared after opt-in: %d\n", attr.maxDynamicSharedSizeBytes);
    EXPECT(attr.maxDynamicSharedSizeBytes == smem);
    reverse_dyn<0><<<dblocks, threads, smem>>>(dint, per_thread);
    CHECK_LAUNCH();
    std::vector<int> hi(total);
    CHECK(cudaMemcpy(hi.data(), dint, total * sizeof(int), cudaMemcpyDeviceToHost));
    const int chunk = threads * per_thread;
    for (int b = 0; b < dblocks; b++)
        for (int j = 0; j < chunk; j++) EXPECT(hi[b * chunk + j] == b * 100000 + chunk - 1 - j);
    std::printf("64 KiB dynamic shared ok\n");

    // Hints: carveout and cache preference (effects are not observable, only success).
    CHECK(cudaFuncSetAttribute(bounded, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    CHECK(cudaFuncSetCacheConfig(bounded, cudaFuncCachePreferL1));
    bounded<<<blocks, 256>>>(dout);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::printf("hints ok\n");

    // Occupancy.
    int nb = 0, nbf = 0, nbo = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, bounded, 128, 0));
    EXPECT(nb >= 1);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&nbf, bounded, 128, 0, cudaOccupancyDefault));
    EXPECT(nbf == nb);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&nbo, bounded, 128, 0,
                                                                 cudaOccupancyDisableCachingOverride));
    EXPECT(nbo >= 1);
    std::printf("occupancy ok\n");
    size_t avail = 0;
    CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&avail, bounded, 1, 128));
    EXPECT(avail > 0);
    std::printf("available dynamic shared ok\n");
    int min_grid = 0, block_size = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block_size, saxpy, 0, 0));
    EXPECT(min_grid > 0 && block_size > 0 && block_size <= 1024);
    std::printf("potential block size ok\n");

    // saxpy with that block size, then through cudaLaunchKernel with an argument array.
    const int n = 100000;
    std::vector<float> hx(n), hy(n);
    for (int i = 0; i < n; i++) {
        hx[i] = (float)(i % 100);
        hy[i] = (float)(i % 7);
    }
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, n * sizeof(float)));
    CHECK(cudaMalloc(&dy, n * sizeof(float)));
    CHECK(cudaMemcpy(dx, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, hy.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    saxpy<<<(n + block_size - 1) / block_size, block_size>>>(2.0f, dx, dy, n);
    CHECK_LAUNCH();
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    float a = 0.5f;
    int count = n;
    void *args[] = {&a, &dx, &dy, &count};
    CHECK(cudaLaunchKernel((const void *)saxpy, dim3((n + 255) / 256), dim3(256), args, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(hy.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) {
        EXPECT(hy[i] == 2.5f * (float)(i % 100) + (float)(i % 7));
        sum += hy[i];
    }
    std::printf("saxpy twice ok sum=%.1f\n", sum);

    // A cooperative launch (no grid-wide sync in the kernel).
    int coop = 0;
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    std::printf("cooperative launch supported: %d\n", coop);
    int *dc;
    CHECK(cudaMalloc(&dc, 2 * 64 * sizeof(int)));
    int base = 7;
    void *cargs[] = {&dc, &base};
    CHECK(cudaLaunchCooperativeKernel((const void *)coop_write, dim3(2), dim3(64), cargs, 0, s));
    std::vector<int> hc(2 * 64);
    CHECK(cudaMemcpyAsync(hc.data(), dc, hc.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 64; t++) EXPECT(hc[b * 64 + t] == 7 + b * 1000 + t);
    std::printf("cooperative launch ok\n");

    // A block larger than the device allows.
    cudaError_t e = cudaLaunchKernel((const void *)saxpy, dim3(1), dim3(2048), args, 0, s);
    std::printf("cudaLaunchKernel with 2048 threads: %s\n", cudaGetErrorName(e));
    std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("last error again: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaStreamSynchronize(s));

    // More threads than the kernel's launch bounds; a cooperative grid that cannot be
    // resident all at once.
    bounded<<<1, 512, 0, s>>>(dx);
    std::printf("bounded kernel with 512 threads: %s\n", cudaGetErrorName(cudaGetLastError()));
    e = cudaLaunchCooperativeKernel((const void *)coop_write, dim3(1 << 20), dim3(64), cargs, 0, s);
    std::printf("cooperative grid too large: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaStreamSynchronize(s));

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dc));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dint));
    CHECK(cudaFree(dout));
    std::printf("done\n");
    return 0;
}
