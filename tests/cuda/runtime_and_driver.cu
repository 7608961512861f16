// The runtime and the driver API in one program (linked with -lcuda): the driver answers as
// NVIDIA's does before and after cuInit, agrees with the runtime about the device, knows its
// error names, and synchronises a stream the runtime created. Under Phos both APIs are one
// guest library and one session. Prints only what does not depend on the GPU model.
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
    CU(cuStreamSynchronize(0));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(stream));
    std::printf("done\n");
    return 0;
}
