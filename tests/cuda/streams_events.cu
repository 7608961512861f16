// Several streams with async copies, memsets and kernels; events for ordering and timing.
#include "check.h"
#include <vector>

__global__ void scale(float *data, int n, float factor) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = data[i] * factor + 1.0f;
}

int main() {
    const int streams = 4;
    const int n = 1 << 18;
    float *host;
    CHECK(cudaMallocHost(&host, streams * n * sizeof(float)));
    for (int i = 0; i < streams * n; i++) host[i] = (float)(i % 1024);
    cudaStream_t s[streams];
    cudaEvent_t done[streams];
    float *dev[streams];
    for (int k = 0; k < streams; k++) {
        CHECK(k % 2 ? cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking) : cudaStreamCreate(&s[k]));
        CHECK(cudaEventCreateWithFlags(&done[k], k == 0 ? cudaEventDefault : cudaEventDisableTiming));
        CHECK(cudaMalloc(&dev[k], n * sizeof(float)));
    }
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, 0));
    for (int k = 0; k < streams; k++) {
        CHECK(cudaMemsetAsync(dev[k], 0, n * sizeof(float), s[k]));
        CHECK(cudaMemcpyAsync(dev[k], host + k * n, n * sizeof(float), cudaMemcpyHostToDevice, s[k]));
        scale<<<(n + 255) / 256, 256, 0, s[k]>>>(dev[k], n, (float)(k + 1));
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(host + k * n, dev[k], n * sizeof(float), cudaMemcpyDeviceToHost, s[k]));
        CHECK(cudaEventRecord(done[k], s[k]));
    }
    for (int k = 0; k < streams; k++) CHECK(cudaEventSynchronize(done[k]));
    CHECK(cudaEventRecord(stop, 0));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventQuery(stop));
    for (int k = 0; k < streams; k++) CHECK(cudaStreamQuery(s[k]));
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    EXPECT(ms >= 0);
    // Timing needs both events to time: a disable-timing event cannot be measured.
    cudaError_t e = cudaEventElapsedTime(&ms, start, done[1]);
    std::printf("elapsed with a no-timing event: %s\n", cudaGetErrorName(e));
    EXPECT(e != cudaSuccess);
    cudaGetLastError();
    double sum = 0;
    for (int k = 0; k < streams; k++)
        for (int i = 0; i < n; i++) {
            float want = (float)((k * n + i) % 1024) * (k + 1) + 1.0f;
            EXPECT(host[k * n + i] == want);
            sum += host[k * n + i];
        }
    std::printf("streams_events streams=%d sum=%.1f\n", streams, sum);
    for (int k = 0; k < streams; k++) {
        CHECK(cudaStreamSynchronize(s[k]));
        CHECK(cudaStreamDestroy(s[k]));
        CHECK(cudaEventDestroy(done[k]));
        CHECK(cudaFree(dev[k]));
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaFreeHost(host));
    std::printf("PASS\n");
    return 0;
}
