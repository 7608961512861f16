// Device queries: count, properties, attributes and versions, checked for consistency with
// each other (printing only what does not depend on the GPU model).
#include "check.h"

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count >= 1);
    std::printf("devices>=1: yes\n");
    CHECK(cudaSetDevice(0));
    int dev = -1;
    CHECK(cudaGetDevice(&dev));
    EXPECT(dev == 0);
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    int v = 0;
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 0));
    EXPECT(v == p.warpSize);
    std::printf("warpSize=%d\n", p.warpSize);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    EXPECT(v == p.multiProcessorCount);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerBlock, 0));
    EXPECT(v == p.maxThreadsPerBlock);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
    EXPECT(v == p.major);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMinor, 0));
    EXPECT(v == p.minor);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxBlockDimZ, 0));
    EXPECT(v == p.maxThreadsDim[2]);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxGridDimY, 0));
    EXPECT(v == p.maxGridSize[1]);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlock, 0));
    EXPECT((size_t)v == p.sharedMemPerBlock);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrTotalConstantMemory, 0));
    EXPECT((size_t)v == p.totalConstMem);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, 0));
    EXPECT(v == p.l2CacheSize);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerMultiProcessor, 0));
    EXPECT(v == p.maxThreadsPerMultiProcessor);
    std::printf("maxThreadsPerBlock=%d maxThreadsDim=%d,%d,%d\n", p.maxThreadsPerBlock, p.maxThreadsDim[0],
                p.maxThreadsDim[1], p.maxThreadsDim[2]);
    std::printf("name non-empty: %s\n", p.name[0] ? "yes" : "no");
    std::printf("totalGlobalMem>=1GiB: %s\n", p.totalGlobalMem >= (1ull << 30) ? "yes" : "no");
    size_t free_mem = 0, total_mem = 0;
    CHECK(cudaMemGetInfo(&free_mem, &total_mem));
    EXPECT(free_mem <= total_mem && total_mem > 0);
    std::printf("free<=total: yes\n");
    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    EXPECT(driver >= 11000 && runtime >= 11000);
    EXPECT(runtime / 1000 == CUDART_VERSION / 1000);
    std::printf("runtime major matches headers: yes\n");
    // Errors: a device that does not exist, a null output pointer.
    std::printf("cudaSetDevice(count): %s\n", cudaGetErrorName(cudaSetDevice(count)));
    std::printf("cudaGetDeviceProperties(count): %s\n", cudaGetErrorName(cudaGetDeviceProperties(&p, count)));
    std::printf("cudaGetDeviceCount(NULL): %s\n", cudaGetErrorName(cudaGetDeviceCount(nullptr)));
    std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("after reset: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaDeviceSynchronize());
    std::printf("PASS\n");
    return 0;
}
