// Page-locked and mapped host memory: kernels reading and writing it through
// cudaHostGetDevicePointer and through the host pointer itself (unified addressing), async
// copies that read pinned memory when the stream reaches them, captured copies of pinned
// memory that read it when the graph runs, pointer attributes, and misuse.
#include "check.h"
#include <cstdint>
#include <cstring>

__global__ void scale(const float *in, float *out, float k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * k;
}

__global__ void fill(unsigned *p, unsigned v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + (unsigned)i;
}

__global__ void add_one(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

static unsigned long long checksum(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int main() {
    const int n = 1 << 16;

    // --- Mapped memory: a kernel reads and writes host memory through its device pointer.
    float *hin, *hout;
    CHECK(cudaHostAlloc((void **)&hin, n * sizeof(float), cudaHostAllocMapped));
    CHECK(cudaHostAlloc((void **)&hout, n * sizeof(float), cudaHostAllocMapped | cudaHostAllocWriteCombined));
    for (int i = 0; i < n; i++) hin[i] = (float)i * 0.5f;
    float *din, *dout;
    CHECK(cudaHostGetDevicePointer((void **)&din, hin, 0));
    CHECK(cudaHostGetDevicePointer((void **)&dout, hout, 0));
    std::printf("device pointer is the host pointer: %s\n", din == hin && dout == hout ? "yes" : "no");
    scale<<<n / 256, 256>>>(din, dout, 3.0f, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++) EXPECT(hout[i] == (float)i * 1.5f);
    std::printf("mapped kernel ok, checksum=%016llx\n", checksum(hout, n * sizeof(float)));

    // An offset into mapped memory has the matching device address.
    float *dmid;
    CHECK(cudaHostGetDevicePointer((void **)&dmid, hin + 1000, 0));
    EXPECT(dmid == din + 1000);

    // --- cudaMallocHost memory used by a kernel through the host pointer itself.
    unsigned *hp;
    CHECK(cudaMallocHost((void **)&hp, n * sizeof(unsigned)));
    fill<<<n / 256, 256>>>(hp, 7u, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    unsigned bad = 0;
    for (int i = 0; i < n; i++) bad += hp[i] != 7u + (unsigned)i;
    std::printf("kernel through the host pointer: %u wrong\n", bad);

    // --- Pointer attributes of mapped memory.
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, hin + 5));
    EXPECT(a.type == cudaMemoryTypeHost);
    EXPECT(a.hostPointer == (void *)(hin + 5) && a.devicePointer == (void *)(din + 5));
    std::printf("attributes: type=%d\n", (int)a.type);
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, hin));
    EXPECT(flags & cudaHostAllocMapped);
    std::printf("mapped flag kept\n");

    // --- Async copies of pinned memory on a stream, small and large, in stream order.
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t big = 24u << 20;
    unsigned char *src, *dst, *dev;
    CHECK(cudaMallocHost((void **)&src, big));
    CHECK(cudaMallocHost((void **)&dst, big));
    CHECK(cudaMalloc((void **)&dev, big));
    for (size_t i = 0; i < big; i++) src[i] = (unsigned char)((i * 2654435761u) >> 11);
    CHECK(cudaMemcpyAsync(dev, src, big, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemsetAsync(dev + 4096, 0xab, 100, s));
    CHECK(cudaMemcpyAsync(dst, dev, big, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 4096; i < 4196; i++) EXPECT(dst[i] == 0xab);
    std::memset(dst + 4096, 0, 100);
    std::memset(src + 4096, 0, 100);
    EXPECT(std::memcmp(src, dst, big) == 0);
    std::printf("24 MiB pinned round trip checksum=%016llx\n", checksum(dst, big));
    int *one;
    CHECK(cudaMallocHost((void **)&one, sizeof(int)));
    *one = 41;
    int *done;
    CHECK(cudaMalloc((void **)&done, sizeof(int)));
    CHECK(cudaMemcpy(done, one, sizeof(int), cudaMemcpyHostToDevice));
    add_one<<<1, 1, 0, s>>>(done, 1);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(one, done, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    std::printf("4-byte pinned copies: %d\n", *one);
    // Default-kind copies of pinned memory.
    CHECK(cudaMemcpy(dev, src, 1 << 20, cudaMemcpyDefault));
    CHECK(cudaMemcpy(dst, dev, 1 << 20, cudaMemcpyDefault));
    EXPECT(std::memcmp(src, dst, 1 << 20) == 0);
    std::printf("default-kind pinned copies ok\n");

    // --- Captured copies of pinned memory read it when the graph runs.
    int *gin, *gout, *gdev;
    const int gn = 4096;
    CHECK(cudaMallocHost((void **)&gin, gn * sizeof(int)));
    CHECK(cudaMallocHost((void **)&gout, gn * sizeof(int)));
    CHECK(cudaMalloc((void **)&gdev, gn * sizeof(int)));
    for (int i = 0; i < gn; i++) gin[i] = i;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(gdev, gin, gn * sizeof(int), cudaMemcpyHostToDevice, s));
    add_one<<<gn / 256, 256, 0, s>>>(gdev, gn);
    CHECK(cudaMemcpyAsync(gout, gdev, gn * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < gn; i++) gin[i] = i * (round + 2);
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        bad = 0;
        for (int i = 0; i < gn; i++) bad += gout[i] != i * (round + 2) + 1;
        std::printf("graph round %d: %u wrong\n", round, bad);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // --- Misuse.
    void *dp = nullptr;
    int *plain = (int *)std::malloc(4096);
    std::printf("device pointer with flags: %s\n", cudaGetErrorName(cudaHostGetDevicePointer(&dp, hin, 1)));
    std::printf("device pointer of malloc memory: %s\n", cudaGetErrorName(cudaHostGetDevicePointer(&dp, plain, 0)));
    std::printf("free of malloc memory: %s\n", cudaGetErrorName(cudaFreeHost(plain)));
    std::printf("host alloc with bad flags: %s\n", cudaGetErrorName(cudaHostAlloc(&dp, 4096, 0x80)));
    std::printf("copy past a device allocation: %s\n",
                cudaGetErrorName(cudaMemcpyAsync(done, src, 4096, cudaMemcpyHostToDevice, s)));
    cudaGetLastError();
    CHECK(cudaFreeHost(one));
    std::printf("second free: %s\n", cudaGetErrorName(cudaFreeHost(one)));
    cudaGetLastError();
    std::free(plain);

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(hin));
    CHECK(cudaFreeHost(hout));
    CHECK(cudaFreeHost(hp));
    CHECK(cudaFreeHost(src));
    CHECK(cudaFreeHost(dst));
    CHECK(cudaFreeHost(gin));
    CHECK(cudaFreeHost(gout));
    CHECK(cudaFree(dev));
    CHECK(cudaFree(done));
    CHECK(cudaFree(gdev));
    std::printf("done\n");
    return 0;
}
