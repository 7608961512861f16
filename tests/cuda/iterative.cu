// A long-running iterative computation (usage: iterative [ITERATIONS] [PAUSE_MS]
// [pinned|registered|settings]): state in device memory, a __device__ counter, a stream and an event,
// updated step after step and summarised every 10 steps. With `pinned`, the summaries are
// copied into page-locked memory and the kernel also counts its steps in mapped host memory;
// with `registered` the same memory is malloc'd and registered with cudaHostRegister (the
// counter on a page shared with other heap data); with `settings` the program first sets a
// device limit and the kernel's attributes, and its launches need them (64 KiB of dynamic
// shared memory, over the 48 KiB default), so a restore must bring them back. The checkpoint and migration tests stop,
// restore and move it in the middle; its output must not change.
#include "check.h"
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

__device__ unsigned long long steps_done = 0;

__global__ void step(unsigned *x, const unsigned *salt, int n, unsigned iteration, unsigned long long *mapped) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned v = x[i] ^ (salt[i % 1024] + iteration);
        v = v * 2654435761u + (v >> 13);
        x[i] = v;
    }
    if (i == 0) {
        steps_done += 1;
        if (mapped) *mapped += 1;
    }
}

int main(int argc, char **argv) {
    const int iterations = argc > 1 ? std::atoi(argv[1]) : 40;
    const int pause_ms = argc > 2 ? std::atoi(argv[2]) : 0;
    const bool pinned = argc > 3 && std::string(argv[3]) == "pinned";
    const bool registered = argc > 3 && std::string(argv[3]) == "registered";
    const bool settings = argc > 3 && std::string(argv[3]) == "settings";
    const size_t dynamic_shared = settings ? 64 << 10 : 0;
    if (settings) {
        CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 48 << 20));
        CHECK(cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic_shared));
        CHECK(cudaFuncSetAttribute(step, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    }
    const int n = 1 << 18;
    std::vector<unsigned> pageable(n), salt(1024);
    unsigned *host = pageable.data();
    unsigned long long *mapped = nullptr;
    if (pinned) {
        CHECK(cudaMallocHost(&host, n * sizeof(unsigned)));
        CHECK(cudaHostAlloc(&mapped, sizeof(*mapped), cudaHostAllocMapped));
        *mapped = 0;
    }
    unsigned long long *counter = nullptr;
    if (registered) {
        CHECK(cudaHostRegister(host, n * sizeof(unsigned), cudaHostRegisterDefault));
        counter = (unsigned long long *)std::malloc(sizeof(*counter));
        *counter = 0;
        CHECK(cudaHostRegister(counter, sizeof(*counter), cudaHostRegisterMapped));
        CHECK(cudaHostGetDevicePointer((void **)&mapped, counter, 0));
    }
    for (int i = 0; i < n; i++) host[i] = i * 7u;
    for (int i = 0; i < 1024; i++) salt[i] = i * 40503u;
    unsigned *x, *dsalt;
    CHECK(cudaMalloc(&x, n * sizeof(unsigned)));
    CHECK(cudaMalloc(&dsalt, 1024 * sizeof(unsigned)));
    CHECK(cudaMemcpy(x, host, n * sizeof(unsigned), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dsalt, salt.data(), 1024 * sizeof(unsigned), cudaMemcpyHostToDevice));
    cudaStream_t s;
    cudaEvent_t done;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&done));
    for (int it = 1; it <= iterations; it++) {
        step<<<(n + 255) / 256, 256, dynamic_shared, s>>>(x, dsalt, n, it, mapped);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(done, s));
        CHECK(cudaEventSynchronize(done));
        if (it % 10 == 0) {
            CHECK(cudaMemcpyAsync(host, x, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            unsigned long long sum = 0;
            for (int i = 0; i < n; i++) sum += host[i] ^ (unsigned long long)i;
            std::printf("iteration %d checksum %016llx\n", it, sum);
            std::fflush(stdout);
        }
        if (pause_ms) usleep(pause_ms * 1000);
    }
    unsigned long long steps = 0;
    CHECK(cudaMemcpyFromSymbol(&steps, steps_done, sizeof(steps)));
    std::printf("steps counted on the device: %llu\n", steps);
    EXPECT(steps == (unsigned long long)iterations);
    if (pinned) {
        std::printf("steps counted in mapped memory: %llu\n", *mapped);
        EXPECT(*mapped == (unsigned long long)iterations);
        CHECK(cudaFreeHost(host));
        CHECK(cudaFreeHost(mapped));
    }
    if (registered) {
        std::printf("steps counted in registered memory: %llu\n", *counter);
        EXPECT(*counter == (unsigned long long)iterations);
        CHECK(cudaHostUnregister(host));
        CHECK(cudaHostUnregister(counter));
        std::free(counter);
    }
    if (settings) {
        size_t heap = 0;
        CHECK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
        cudaFuncAttributes attrs;
        CHECK(cudaFuncGetAttributes(&attrs, step));
        std::printf("heap limit %zu MiB, dynamic shared memory allowed %d KiB\n", heap >> 20,
                    attrs.maxDynamicSharedSizeBytes >> 10);
        EXPECT(heap == (size_t)48 << 20 && attrs.maxDynamicSharedSizeBytes == (int)dynamic_shared);
    }
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(x));
    CHECK(cudaFree(dsalt));
    std::printf("PASS\n");
    return 0;
}
