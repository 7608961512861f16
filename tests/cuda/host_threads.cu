// Several host threads, each with its own stream and buffers, working at the same time; the
// current device is per thread.
#include "check.h"
#include <thread>
#include <vector>

__global__ void fill(int *data, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = base + i;
}

static void worker(int id, long long *result) {
    const int n = 100000 + id * 1000;
    CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    std::vector<int> h(n);
    for (int round = 0; round < 5; round++) {
        fill<<<(n + 255) / 256, 256, 0, s>>>(d, n, id * 1000000 + round);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) EXPECT(h[i] == id * 1000000 + round + i);
    }
    long long sum = 0;
    for (int v : h) sum += v;
    *result = sum;
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
}

int main() {
    const int threads = 6;
    std::vector<std::thread> pool;
    std::vector<long long> results(threads);
    for (int t = 0; t < threads; t++) pool.emplace_back(worker, t, &results[t]);
    for (auto &t : pool) t.join();
    for (int t = 0; t < threads; t++) std::printf("thread %d sum=%lld\n", t, results[t]);
    int dev = -1;
    CHECK(cudaGetDevice(&dev));
    std::printf("main thread device=%d\n", dev);
    std::printf("PASS\n");
    return 0;
}
