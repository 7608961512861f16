// Device numbers as a program sees them (usage: device_numbers DEVICE [ITERATIONS] [PAUSE_MS]):
// it counts the devices, makes DEVICE current, checks that the runtime says so (cudaGetDevice,
// a pointer's attributes, a stream's and an event's work on it), refuses a device past the
// count, and then computes on DEVICE step after step, checking at every summary that its
// device is still DEVICE and its memory still on it. Needs DEVICE + 1 devices. The checkpoint
// and migration tests restore and move its session onto another device of the machine in
// the middle; its output must not change.
#include "check.h"
#include <cstdlib>
#include <unistd.h>
#include <vector>

__global__ void step(unsigned *x, int n, unsigned iteration) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (x[i] ^ iteration) * 2654435761u + (x[i] >> 11);
}

// The device the calling thread has current, and that `p` is memory of it.
static void check_on(int want, const void *p) {
    int current = -1;
    CHECK(cudaGetDevice(&current));
    EXPECT(current == want);
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, p));
    EXPECT(a.type == cudaMemoryTypeDevice);
    EXPECT(a.device == want);
}

int main(int argc, char **argv) {
    const int device = argc > 1 ? std::atoi(argv[1]) : 0;
    const int iterations = argc > 2 ? std::atoi(argv[2]) : 30;
    const int pause_ms = argc > 3 ? std::atoi(argv[3]) : 0;
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count > device);
    std::printf("at least %d devices\n", device + 1);
    // A device past the count is refused and changes nothing.
    EXPECT(cudaSetDevice(count) == cudaErrorInvalidDevice);
    // The runtime remembers it as the last error, once.
    EXPECT(cudaGetLastError() == cudaErrorInvalidDevice);
    EXPECT(cudaGetLastError() == cudaSuccess);
    int current = -1;
    CHECK(cudaGetDevice(&current));
    EXPECT(current == 0);
    CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, device));
    EXPECT(prop.major >= 1 && prop.totalGlobalMem > 0);
    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    EXPECT(free_bytes <= total_bytes && total_bytes > 0);
    const int n = 1 << 16;
    std::vector<unsigned> host(n);
    for (int i = 0; i < n; i++) host[i] = i * 2246822519u;
    unsigned *x;
    CHECK(cudaMalloc(&x, n * sizeof(unsigned)));
    check_on(device, x);
    CHECK(cudaMemcpy(x, host.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
    cudaStream_t s;
    cudaEvent_t done;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&done));
    std::printf("device %d current\n", device);
    std::fflush(stdout);
    for (int it = 1; it <= iterations; it++) {
        step<<<(n + 255) / 256, 256, 0, s>>>(x, n, it);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(done, s));
        CHECK(cudaEventSynchronize(done));
        if (it % 10 == 0) {
            check_on(device, x);
            CHECK(cudaMemcpyAsync(host.data(), x, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            unsigned long long sum = 0;
            for (int i = 0; i < n; i++) sum += host[i] ^ (unsigned long long)i;
            std::printf("iteration %d on device %d checksum %016llx\n", it, device, sum);
            std::fflush(stdout);
        }
        if (pause_ms) usleep(pause_ms * 1000);
    }
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(x));
    CHECK(cudaGetDeviceCount(&current));
    EXPECT(current == count);
    std::printf("PASS\n");
    return 0;
}
