// The runtime and the driver API in one program (linked with -lcuda): the driver answers as
// NVIDIA's does before and after cuInit, agrees with the runtime about the device, knows its
// error names, synchronises a stream the runtime created and launches a kernel of the runtime's.
// Under Phos both APIs are one guest library and one session. Prints only what does not depend
// on the GPU model.
#include <cstring>
#include <cuda.h>
#include "driver_check.h"

__global__ void fill(int *out, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = base + i;
}

int main() {
    // The driver before anything initialised it: versions work, devices do not.
    CUdevice dev = -1;
    std::printf("cuDeviceGet before cuInit: %s\n", name_of(cuDeviceGet(&dev, 0)));
    int driver = 0, runtime = 0;
    CU(cuDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    std::printf("runtime version: %d\n", runtime);
    std::printf("driver at least the runtime: %s\n", driver >= runtime ? "yes" : "no");
    std::printf("cuInit(1): %s\n", name_of(cuInit(1)));
    CU(cuInit(0));

    int count = 0, runtime_count = 0;
    CU(cuDeviceGetCount(&count));
    CHECK(cudaGetDeviceCount(&runtime_count));
    std::printf("device counts agree: %s\n", count == runtime_count && count >= 1 ? "yes" : "no");
    CU(cuDeviceGet(&dev, 0));
    CUdevice none = -1;
    std::printf("cuDeviceGet past the last: %s\n", name_of(cuDeviceGet(&none, count)));

    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    char name[256];
    CU(cuDeviceGetName(name, sizeof name, dev));
    std::printf("names agree: %s\n", std::strcmp(name, p.name) == 0 ? "yes" : "no");
    char cut[5];
    std::memset(cut, 'x', sizeof cut);
    CU(cuDeviceGetName(cut, sizeof cut, dev));
    std::printf("a short buffer gets the start: %s\n",
                std::strncmp(cut, p.name, 4) == 0 && cut[4] == '\0' ? "yes" : "no");
    size_t total = 0;
    CU(cuDeviceTotalMem(&total, dev));
    std::printf("total memory agrees: %s\n", total == p.totalGlobalMem ? "yes" : "no");
    int major = 0, warp = 0;
    CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CU(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev));
    std::printf("compute capability agrees: %s\n", major == p.major ? "yes" : "no");
    std::printf("warp size: %d\n", warp);

    const char *s = nullptr;
    CU(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
    std::printf("CUDA_ERROR_INVALID_VALUE: %s\n", s);
    CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
    std::printf("error 2: %s\n", s);
    s = "unchanged";
    CUresult r = cuGetErrorName((CUresult)12345, &s);
    std::printf("an unknown code: %s, name %s\n", name_of(r), s ? s : "NULL");

    // A stream of the runtime is a CUstream of the driver.
    const int n = 1000;
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int *d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    fill<<<(n + 255) / 256, 256, 0, stream>>>(d, n, 7);
    CHECK_LAUNCH();
    CU(cuStreamSynchronize((CUstream)stream));
    int h[n];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && h[i] == 7 + i;
    std::printf("a runtime stream synchronised by the driver: %s\n", ok ? "ok" : "WRONG");

    // A runtime function handle is a CUfunction of the driver: launched, queried and
    // configured through the driver API, with either parameter form.
    cudaFunction_t f = nullptr;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)fill));
    int elements = n, base = 40;
    void *args[] = {&d, &elements, &base};
    CU(cuLaunchKernel((CUfunction)f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, (CUstream)stream, args, nullptr));
    CU(cuStreamSynchronize((CUstream)stream));
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    ok = true;
    for (int i = 0; i < n; i++) ok = ok && h[i] == 40 + i;
    struct { int *out; int n; int base; } packed = {d, n, 3};
    size_t packed_size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                     CU_LAUNCH_PARAM_END};
    CU(cuLaunchKernel((CUfunction)f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, 0, nullptr, extra));
    CU(cuCtxSynchronize());
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) ok = ok && h[i] == 3 + i;
    int max_threads = 0;
    CU(cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, (CUfunction)f));
    CU(cuFuncSetCacheConfig((CUfunction)f, CU_FUNC_CACHE_PREFER_L1));
    int blocks = 0;
    CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (CUfunction)f, 128, 0));
    std::printf("a runtime kernel launched by the driver: %s, attributes %s, occupancy %s\n", ok ? "ok" : "WRONG",
                max_threads >= 128 ? "ok" : "WRONG", blocks > 0 ? "ok" : "WRONG");
    CU(cuStreamSynchronize(0));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(stream));
    std::printf("done\n");
    return 0;
}
