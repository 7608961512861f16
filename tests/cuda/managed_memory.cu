// Managed memory the way tutorials use it: cudaMallocManaged buffers the host initialises,
// kernels compute on and the host reads after cudaDeviceSynchronize; several kernels with
// host updates between them; copies and memsets between managed and device memory;
// prefetches, advice and stream attachment; pointer and range attributes; __managed__
// variables; misuse. Correct on any device, with or without concurrent managed access.
#include "check.h"
#include <cstdint>
#include <vector>

__managed__ int counter = 5;
__managed__ float table[256];

__global__ void add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

__global__ void step(int *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 3 + 1;
}

__global__ void bump_counter(int times) {
    for (int i = 0; i < times; i++) atomicAdd(&counter, 1);
}

__global__ void fill_table(float k) {
    int i = threadIdx.x;
    table[i] = table[i] * k + (float)counter;
}

static unsigned long long checksum(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

// cudaMemPrefetchAsync and cudaMemAdvise take a cudaMemLocation from CUDA 13 on.
static cudaError_t prefetch_to(const void *p, size_t n, int device, cudaStream_t s) {
#if CUDART_VERSION >= 13000
    cudaMemLocation loc = {};
    loc.type = device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    loc.id = device == cudaCpuDeviceId ? 0 : device;
    return cudaMemPrefetchAsync(p, n, loc, 0, s);
#else
    return cudaMemPrefetchAsync(p, n, device, s);
#endif
}

static cudaError_t advise(const void *p, size_t n, cudaMemoryAdvise a, int device) {
#if CUDART_VERSION >= 13000
    cudaMemLocation loc = {};
    loc.type = device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    loc.id = device == cudaCpuDeviceId ? 0 : device;
    return cudaMemAdvise(p, n, a, loc);
#else
    return cudaMemAdvise(p, n, a, device);
#endif
}

int main() {
    int managed = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
    std::printf("managed memory supported: %d\n", managed);

    // --- The tutorial: host init, kernel, synchronise, host reads.
    const int n = 1 << 16;
    float *a, *b, *c;
    CHECK(cudaMallocManaged(&a, n * sizeof(float)));
    CHECK(cudaMallocManaged(&b, n * sizeof(float)));
    CHECK(cudaMallocManaged(&c, n * sizeof(float), cudaMemAttachGlobal));
    for (int i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = 2.0f * (float)i;
    }
    add<<<n / 256, 256>>>(a, b, c, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++) EXPECT(c[i] == 3.0f * (float)i);
    std::printf("add ok, checksum=%016llx\n", checksum(c, n * sizeof(float)));

    // --- Several kernels, the host changing the data between them.
    int *x;
    const int m = 1000;
    CHECK(cudaMallocManaged(&x, m * sizeof(int)));
    for (int i = 0; i < m; i++) x[i] = i;
    for (int round = 0; round < 3; round++) {
        step<<<(m + 127) / 128, 128>>>(x, m);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < m; i++) x[i] -= round;
    }
    long long sum = 0;
    for (int i = 0; i < m; i++) sum += x[i];
    std::printf("three rounds: x[0]=%d x[999]=%d sum=%lld\n", x[0], x[999], sum);

    // --- Copies and memsets between managed and device memory.
    float *d;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMemcpy(d, c, n * sizeof(float), cudaMemcpyDefault));
    CHECK(cudaMemset(c, 0, n * sizeof(float)));
    CHECK(cudaDeviceSynchronize());
    EXPECT(c[12345] == 0.0f);
    CHECK(cudaMemcpy(a, d, n * sizeof(float), cudaMemcpyDeviceToDevice));
    for (int i = 0; i < n; i++) EXPECT(a[i] == 3.0f * (float)i);
    std::vector<float> host(n);
    CHECK(cudaMemcpy(host.data(), a, n * sizeof(float), cudaMemcpyDefault));
    EXPECT(host[n - 1] == 3.0f * (float)(n - 1));
    CHECK(cudaMemcpy(b, host.data(), 1024 * sizeof(float), cudaMemcpyHostToDevice));
    EXPECT(b[1023] == 3.0f * 1023.0f);
    std::printf("copies ok\n");

    // --- Prefetch, advice and stream attachment, then work on a stream.
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(advise(a, n * sizeof(float), cudaMemAdviseSetReadMostly, 0));
    CHECK(advise(b, n * sizeof(float), cudaMemAdviseSetPreferredLocation, 0));
    CHECK(advise(b, n * sizeof(float), cudaMemAdviseSetAccessedBy, 0));
    CHECK(prefetch_to(a, n * sizeof(float), 0, s));
    CHECK(prefetch_to(b, n * sizeof(float), 0, s));
    CHECK(cudaStreamAttachMemAsync(s, c, 0, cudaMemAttachSingle));
    add<<<n / 256, 256, 0, s>>>(a, b, c, n);
    CHECK_LAUNCH();
    CHECK(prefetch_to(c, n * sizeof(float), cudaCpuDeviceId, s));
    CHECK(cudaStreamSynchronize(s));
    int read_mostly = -1, preferred = -9;
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof(int), cudaMemRangeAttributeReadMostly, a, n * sizeof(float)));
    CHECK(cudaMemRangeGetAttribute(&preferred, sizeof(int), cudaMemRangeAttributePreferredLocation, b, n * sizeof(float)));
    std::printf("read mostly: %d, preferred location: %d\n", read_mostly, preferred);
    for (int i = 0; i < 1024; i++) EXPECT(c[i] == 6.0f * (float)i);
    for (int i = 1024; i < n; i++) EXPECT(c[i] == 3.0f * (float)i + 2.0f * (float)i);
    CHECK(cudaStreamAttachMemAsync(s, c, 0, cudaMemAttachGlobal));
    CHECK(advise(a, n * sizeof(float), cudaMemAdviseUnsetReadMostly, 0));
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof(int), cudaMemRangeAttributeReadMostly, a, n * sizeof(float)));
    std::printf("stream work ok, read mostly after unset: %d\n", read_mostly);

    // --- Pointer attributes.
    cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, c + 100));
    std::printf("pointer type managed: %s, same address on both sides: %s\n",
                attr.type == cudaMemoryTypeManaged ? "yes" : "no",
                attr.devicePointer == (void *)(c + 100) && attr.hostPointer == (void *)(c + 100) ? "yes" : "no");

    // --- __managed__ variables: initial value, host writes, kernels, host reads.
    std::printf("counter starts at %d\n", counter);
    counter = 100;
    bump_counter<<<4, 32>>>(10);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::printf("counter after 1280 increments: %d\n", counter);
    for (int i = 0; i < 256; i++) table[i] = (float)i;
    counter = 7;
    fill_table<<<1, 256>>>(2.0f);
    CHECK_LAUNCH();
    fill_table<<<1, 256>>>(0.5f);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 256; i++) EXPECT(table[i] == ((float)i * 2.0f + 7.0f) * 0.5f + 7.0f);
    std::printf("table ok, table[255]=%.1f checksum=%016llx\n", table[255], checksum(table, sizeof(table)));

    // --- Misuse.
    float *bad = nullptr;
    std::printf("size 0: %s\n", cudaGetErrorName(cudaMallocManaged(&bad, 0)));
    std::printf("flags 0: %s\n", cudaGetErrorName(cudaMallocManaged(&bad, 64, 0)));
    cudaGetLastError();

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFree(x));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    std::printf("done\n");
    return 0;
}
