// Device management API: selection, flags, limits, cache/shared-memory config, PCI bus ids, peer access, attributes, versions, last-error behaviour and reset.
#include "check.h"
#include <cstring>

__global__ void iota(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 3 * i + 1;
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count >= 1);
    std::printf("device count ok\n");
    CHECK(cudaSetDevice(0));
    int dev = -1;
    CHECK(cudaGetDevice(&dev));
    EXPECT(dev == 0);
    std::printf("current device: %d\n", dev);
    std::printf("bad device: %s\n", cudaGetErrorName(cudaSetDevice(9999)));
    cudaGetLastError();
    std::printf("negative device: %s\n", cudaGetErrorName(cudaSetDevice(-1)));
    cudaGetLastError();
    CHECK(cudaGetDevice(&dev));
    EXPECT(dev == 0);
    std::printf("device after failed set: %d\n", dev);

    // Device flags: set the scheduling policy, read it back.
    CHECK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
    unsigned int flags = 0;
    CHECK(cudaGetDeviceFlags(&flags));
    EXPECT((flags & cudaDeviceScheduleMask) == cudaDeviceScheduleBlockingSync);
    std::printf("flags ok\n");
    std::printf("bad device flags: %s\n", cudaGetErrorName(cudaSetDeviceFlags(0x10000)));
    cudaGetLastError();
    CHECK(cudaGetDeviceFlags(&flags));
    EXPECT((flags & cudaDeviceScheduleMask) == cudaDeviceScheduleBlockingSync);
    std::printf("flags unchanged after bad set\n");

    // Limits.
    size_t v = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
    CHECK(cudaDeviceGetLimit(&v, cudaLimitStackSize));
    EXPECT(v >= 4096);
    std::printf("stack limit ok\n");
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16u << 20));
    CHECK(cudaDeviceGetLimit(&v, cudaLimitMallocHeapSize));
    EXPECT(v == (16u << 20));
    std::printf("heap limit: %zu MiB\n", v >> 20);
    CHECK(cudaDeviceGetLimit(&v, cudaLimitPrintfFifoSize));
    EXPECT(v > 0);
    std::printf("printf fifo ok\n");
    std::printf("get invalid limit: %s\n", cudaGetErrorName(cudaDeviceGetLimit(&v, (cudaLimit)99)));
    cudaGetLastError();
    std::printf("set invalid limit: %s\n", cudaGetErrorName(cudaDeviceSetLimit((cudaLimit)99, 1)));
    cudaGetLastError();

    // Choosing a device by properties.
    cudaDeviceProp want;
    std::memset(&want, 0, sizeof(want));
    want.major = 7;
    want.minor = 0;
    dev = -1;
    CHECK(cudaChooseDevice(&dev, &want));
    EXPECT(dev == 0);
    std::printf("chosen device: %d\n", dev);

    // Stream priorities: "greatest" is the numerically smallest.
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT(greatest <= least);
    std::printf("priority range ok\n");

    // Cache and shared-memory configuration (values depend on the GPU: not printed).
    cudaFuncCache cache;
    CHECK(cudaDeviceGetCacheConfig(&cache));
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
    CHECK(cudaDeviceGetCacheConfig(&cache));
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferNone));
    std::printf("cache config ok\n");
    cudaSharedMemConfig smem;
    CHECK(cudaDeviceGetSharedMemConfig(&smem));
    CHECK(cudaDeviceSetSharedMemConfig(cudaSharedMemBankSizeFourByte));
    CHECK(cudaDeviceGetSharedMemConfig(&smem));
    std::printf("shared mem config ok\n");

    // PCI bus id round trip.
    char bus[32];
    std::memset(bus, 0, sizeof(bus));
    CHECK(cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), 0));
    EXPECT(std::strlen(bus) > 0 && std::strlen(bus) < sizeof(bus));
    dev = -1;
    CHECK(cudaDeviceGetByPCIBusId(&dev, bus));
    EXPECT(dev == 0);
    std::printf("pci ok\n");
    std::printf("garbage bus id: %s\n", cudaGetErrorName(cudaDeviceGetByPCIBusId(&dev, "not-a-bus-id")));
    cudaGetLastError();

    // Peer access with itself.
    int peer = -1;
    cudaError_t e = cudaDeviceCanAccessPeer(&peer, 0, 0);
    std::printf("can access peer 0->0: %s %d\n", cudaGetErrorName(e), peer);
    cudaGetLastError();
    std::printf("enable peer access 0: %s\n", cudaGetErrorName(cudaDeviceEnablePeerAccess(0, 0)));
    cudaGetLastError();

    // Attributes and versions.
    int attr = 0;
    CHECK(cudaDeviceGetAttribute(&attr, cudaDevAttrMaxThreadsPerBlock, 0));
    EXPECT(attr == 1024);
    std::printf("max threads per block: %d\n", attr);
    std::printf("attribute of bad device: %s\n",
                cudaGetErrorName(cudaDeviceGetAttribute(&attr, cudaDevAttrMaxThreadsPerBlock, count)));
    cudaGetLastError();
    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    EXPECT(driver > 0 && runtime > 0);
    std::printf("versions ok\n");

    // Error names and strings.
    cudaError_t codes[] = {cudaSuccess, cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorInvalidDevice,
                           cudaErrorUnsupportedLimit, cudaErrorInvalidPitchValue};
    for (cudaError_t c : codes) std::printf("%d %s \"%s\"\n", (int)c, cudaGetErrorName(c), cudaGetErrorString(c));

    // Peek leaves the last error in place, Get returns it and clears it.
    std::printf("before failure: %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    e = cudaSetDevice(count);
    std::printf("failing call: %s\n", cudaGetErrorName(e));
    std::printf("peek: %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    std::printf("peek again: %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    std::printf("get: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("get again: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("peek after get: %s\n", cudaGetErrorName(cudaPeekAtLastError()));

    // Some work, synchronize, reset, and the device is usable again.
    const int n = 4096;
    int *d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    iota<<<n / 256, 256>>>(d, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(d));
    CHECK(cudaDeviceReset());
    std::printf("reset ok\n");
    d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    EXPECT(d != nullptr);
    iota<<<n / 256, 256>>>(d, n);
    CHECK_LAUNCH();
    static int h[n];
    CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    long long sum = 0;
    for (int i = 0; i < n; i++) {
        EXPECT(h[i] == 3 * i + 1);
        sum += h[i];
    }
    std::printf("after reset sum=%lld\n", sum);
    CHECK(cudaFree(d));
    CHECK(cudaDeviceSynchronize());
    std::printf("done\n");
    return 0;
}
