// Synchronous host-to-device copies of pageable memory in a process whose kernels write
// page-locked memory. CUDA's copy synchronises the legacy stream before it returns, so the
// host reads what the legacy stream's kernels before it wrote to page-locked memory (and a
// synchronous device-to-host copy returns once done, after the blocking streams' kernels
// before it too): checked after each such copy, with a slow kernel before the writer so
// that a copy returning early would read the old value. Copies after a cudaDeviceSynchronize,
// or after a synchronous device-to-host copy that followed the legacy stream's kernels, follow
// no unfinished kernel; and two threads, one launching while the other synchronises and
// copies. Usage: copy_settled [ROUNDS] (default 10; the output does not depend on it).
#include "check.h"
#include <atomic>
#include <cstdlib>
#include <thread>
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
static const int EARLY = 4;

static unsigned read(const unsigned *p) { return *(const volatile unsigned *)p; }

int main(int argc, char **argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
    if (rounds < 1) rounds = 1;
    unsigned *pinned, *scratch;
    CHECK(cudaMallocHost((void **)&pinned, 64 * sizeof(unsigned)));
    for (int i = 0; i < 64; i++) pinned[i] = 0;
    CHECK(cudaMalloc(&scratch, 4 * 64 * sizeof(unsigned)));
    CHECK(cudaMemset(scratch, 0, 4 * 64 * sizeof(unsigned)));
    unsigned char *dev;
    const size_t piece = 4096;
    CHECK(cudaMalloc(&dev, piece * (EARLY + 1)));
    std::vector<unsigned char> src(piece, 7), back(piece);
    cudaStream_t blocking;
    CHECK(cudaStreamCreate(&blocking));

    // A kernel on the legacy stream writes page-locked memory; the copy after it returns once
    // it has finished. After a device synchronisation, copies follow no unfinished kernel.
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        write_late<<<1, 64>>>(&pinned[0], r + 1, scratch, ITERS);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(dev, src.data(), piece, cudaMemcpyHostToDevice));
        bad += read(&pinned[0]) != (unsigned)(r + 1);
        CHECK(cudaDeviceSynchronize());
        for (int k = 1; k <= EARLY; k++) CHECK(cudaMemcpy(dev + k * piece, src.data(), piece, cudaMemcpyHostToDevice));
    }
    std::printf("legacy stream, then a device synchronisation: %s\n", bad ? "WRONG" : "ok");

    // The same, settled by a synchronous device-to-host copy, which waits for the legacy
    // stream's kernels before it.
    bad = 0;
    for (int r = 0; r < rounds; r++) {
        write_late<<<1, 64>>>(&pinned[1], r + 1, scratch + 64, ITERS);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(back.data(), dev, piece, cudaMemcpyDeviceToHost));
        bad += read(&pinned[1]) != (unsigned)(r + 1);
        for (int k = 1; k <= EARLY; k++) CHECK(cudaMemcpy(dev + k * piece, src.data(), piece, cudaMemcpyHostToDevice));
        bad += back[0] != 7;
    }
    std::printf("legacy stream, then a device-to-host copy: %s\n", bad ? "WRONG" : "ok");

    // A kernel on a blocking stream: a synchronous device-to-host copy, on the legacy stream,
    // runs after it, so the host reads its write after the copy. The host-to-device copies
    // after it wait (for Phos that copy settles the legacy stream's kernels only), until a
    // device synchronisation.
    bad = 0;
    for (int r = 0; r < rounds; r++) {
        write_late<<<1, 64, 0, blocking>>>(&pinned[2], r + 1, scratch + 128, ITERS);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(back.data(), dev, piece, cudaMemcpyDeviceToHost));
        bad += read(&pinned[2]) != (unsigned)(r + 1);
        CHECK(cudaMemcpy(dev + piece, src.data(), piece, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dev + 2 * piece, src.data(), piece, cudaMemcpyHostToDevice));
        CHECK(cudaDeviceSynchronize());
        for (int k = 1; k <= EARLY; k++) CHECK(cudaMemcpy(dev + k * piece, src.data(), piece, cudaMemcpyHostToDevice));
    }
    std::printf("blocking stream: %s\n", bad ? "WRONG" : "ok");

    // Two threads: one launches writers on the legacy stream while the other synchronises the
    // device and copies (a writer while the other's last synchronisation is on its way), and a
    // slow one once the other is done; then a copy of this thread returns once it has finished.
    bad = 0;
    for (int r = 0; r < rounds; r++) {
        const int writes = 8;
        std::atomic<int> launched{0}, last_sync{0}, copied{0}, checked{0};
        std::thread launcher([&] {
            for (int i = 0; i < writes; i++) {
                write_late<<<1, 64>>>(&pinned[3], r * (writes + 2) + i + 1, scratch + 192, ITERS / 4);
                CHECK_LAUNCH();
                launched.store(i + 1);
            }
            while (!last_sync.load()) std::this_thread::yield();
            write_late<<<1, 64>>>(&pinned[3], (r + 1) * (writes + 2) - 1, scratch + 192, ITERS / 4);
            CHECK_LAUNCH();
            while (!copied.load()) std::this_thread::yield();
            write_late<<<1, 64>>>(&pinned[3], (r + 1) * (writes + 2), scratch + 192, ITERS * 4);
            CHECK_LAUNCH();
            launched.store(writes + 1);
            // Alive until the check (a thread's end may wait for its work).
            while (!checked.load()) std::this_thread::yield();
        });
        std::thread copier([&] {
            for (int i = 0; i < writes; i++) {
                while (launched.load() < i + 1) std::this_thread::yield();
                if (i == writes - 1) last_sync.store(1);
                CHECK(cudaDeviceSynchronize());
                CHECK(cudaMemcpy(dev + 3 * piece, src.data(), piece, cudaMemcpyHostToDevice));
            }
            copied.store(1);
        });
        copier.join();
        while (launched.load() <= writes) std::this_thread::yield();
        CHECK(cudaMemcpy(dev + 4 * piece, src.data(), piece, cudaMemcpyHostToDevice));
        bad += read(&pinned[3]) != (unsigned)((r + 1) * (writes + 2));
        checked.store(1);
        launcher.join();
    }
    std::printf("two threads: %s\n", bad ? "WRONG" : "ok");

    // Everything copied arrived.
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned char> all(piece * (EARLY + 1));
    CHECK(cudaMemcpy(all.data(), dev, all.size(), cudaMemcpyDeviceToHost));
    bad = 0;
    for (unsigned char b : all) bad += b != 7;
    std::printf("copied bytes: %s\n", bad ? "WRONG" : "ok");
    CHECK(cudaStreamDestroy(blocking));
    CHECK(cudaFree(dev));
    CHECK(cudaFree(scratch));
    CHECK(cudaFreeHost(pinned));
    std::printf("done\n");
    return 0;
}
