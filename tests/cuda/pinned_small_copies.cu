// Small synchronous host-to-device copies of page-locked memory (allocated and registered).
// CUDA's copy returns once the device has the bytes, so the device holds what the source held
// at the call whatever the host writes there as soon as the copy returned (checked for many
// copies into many offsets, and for sizes around 32 KiB); a copy after a kernel that writes
// its source (mapped page-locked memory, written late) copies what the kernel wrote, since
// the copy starts after the legacy stream's earlier work; and a copy into freed memory fails
// at the call. Usage: pinned_small_copies [ROUNDS] (default 10; the output does not depend
// on it).
#include "check.h"
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

// Slow (a chain of dependent multiplications), then the write.
__global__ void write_late(unsigned *slot, unsigned value, unsigned *scratch, int iters) {
    unsigned x = scratch[threadIdx.x];
    for (int i = 0; i < iters; i++) x = x * 5u + 1u;
    scratch[threadIdx.x] = x;
    __syncthreads();
    if (threadIdx.x == 0) *(volatile unsigned *)slot = value;
}

static const int ITERS = 4000;
static const size_t PIECE = 4096;
static const int SLOTS = 8;

static unsigned char value_of(int r, int k) { return (unsigned char)(r * 31 + k * 7 + 1); }

// Copies of `src` (page-locked, PIECE bytes) into each slot of `dev`, the source overwritten
// as soon as each returns; the device's bytes read back once a round. Returns the rounds
// whose bytes differ.
static int overwritten_after_each_copy(unsigned char *src, unsigned char *dev, int rounds) {
    std::vector<unsigned char> back(PIECE * SLOTS);
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < SLOTS; k++) {
            std::memset(src, value_of(r, k), PIECE);
            CHECK(cudaMemcpy(dev + k * PIECE, src, PIECE, cudaMemcpyHostToDevice));
            std::memset(src, 0xee, PIECE);
        }
        CHECK(cudaMemcpy(back.data(), dev, back.size(), cudaMemcpyDeviceToHost));
        bool same = true;
        for (int k = 0; k < SLOTS; k++)
            for (size_t i = 0; i < PIECE; i++) same = same && back[k * PIECE + i] == value_of(r, k);
        bad += !same;
    }
    return bad;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
    if (rounds < 1) rounds = 1;
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, 2 * 65536 + PIECE * SLOTS));

    // Allocated page-locked memory.
    unsigned char *pinned;
    CHECK(cudaMallocHost((void **)&pinned, 65536 + 64));
    std::printf("allocated, source overwritten after each copy: %s\n",
                overwritten_after_each_copy(pinned, dev, rounds) ? "WRONG" : "ok");

    // Sizes around the small-copy threshold, to an odd device offset, from an odd source one.
    const size_t sizes[] = {1, 100, 4096, 32767, 32768, 32769, 65536};
    std::vector<unsigned char> back(65536);
    int bad = 0;
    for (size_t s : sizes) {
        unsigned char *src = pinned + 5;
        for (size_t i = 0; i < s; i++) src[i] = (unsigned char)(i * 13 + s);
        CHECK(cudaMemcpy(dev + 3, src, s, cudaMemcpyHostToDevice));
        std::memset(src, 0xee, s);
        CHECK(cudaMemcpy(back.data(), dev + 3, s, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < s; i++) bad += back[i] != (unsigned char)(i * 13 + s);
    }
    std::printf("sizes 1 B to 64 KiB: %s\n", bad ? "WRONG" : "ok");

    // A kernel on the legacy stream writes the copy's page-locked source late: the copy after
    // it starts once the kernel has finished, and copies what it wrote. Then, after a device
    // synchronisation, more copies from the same source.
    unsigned *src32, *scratch;
    CHECK(cudaMallocHost((void **)&src32, 64 * sizeof(unsigned)));
    for (int i = 0; i < 64; i++) src32[i] = 0;
    CHECK(cudaMalloc(&scratch, 64 * sizeof(unsigned)));
    CHECK(cudaMemset(scratch, 0, 64 * sizeof(unsigned)));
    bad = 0;
    for (int r = 0; r < rounds; r++) {
        write_late<<<1, 64>>>(&src32[0], r + 1, scratch, ITERS);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(dev, src32, 64 * sizeof(unsigned), cudaMemcpyHostToDevice));
        unsigned got = 0;
        CHECK(cudaMemcpy(&got, dev, sizeof got, cudaMemcpyDeviceToHost));
        bad += got != (unsigned)(r + 1);
        CHECK(cudaDeviceSynchronize());
        for (int k = 1; k <= 4; k++) {
            src32[0] = (unsigned)(r * 10 + k);
            CHECK(cudaMemcpy(dev, src32, 64 * sizeof(unsigned), cudaMemcpyHostToDevice));
            src32[0] = 0;
            CHECK(cudaMemcpy(&got, dev, sizeof got, cudaMemcpyDeviceToHost));
            bad += got != (unsigned)(r * 10 + k);
        }
    }
    std::printf("a kernel writes the source, then a copy: %s\n", bad ? "WRONG" : "ok");

    // Registered memory.
    void *raw = std::malloc(PIECE + 4096);
    unsigned char *registered = (unsigned char *)(((uintptr_t)raw + 4095) & ~(uintptr_t)4095);
    CHECK(cudaHostRegister(registered, PIECE, cudaHostRegisterDefault));
    std::printf("registered, source overwritten after each copy: %s\n",
                overwritten_after_each_copy(registered, dev, rounds) ? "WRONG" : "ok");
    CHECK(cudaHostUnregister(registered));
    std::free(raw);

    // A copy into memory that copies succeeded on before it was freed fails at the call.
    // (A large allocation, whose freeing unmaps its range.)
    unsigned char *gone;
    CHECK(cudaMalloc(&gone, 8 << 20));
    std::memset(pinned, 3, PIECE);
    CHECK(cudaMemcpy(gone, pinned, PIECE, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(gone, pinned, PIECE, cudaMemcpyHostToDevice));
    CHECK(cudaFree(gone));
    cudaError_t e = cudaMemcpy(gone, pinned, PIECE, cudaMemcpyHostToDevice);
    std::printf("copy into freed memory: %s\n", cudaGetErrorName(e));
    std::printf("last error after it: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("last error now: %s\n", cudaGetErrorName(cudaGetLastError()));

    CHECK(cudaFreeHost(src32));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(scratch));
    CHECK(cudaFree(dev));
    std::printf("done\n");
    return 0;
}
