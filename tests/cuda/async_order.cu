// Launches return before they run: their order within a stream, across host threads, and
// the errors a launch itself reports must still be CUDA's.
#include "check.h"
#include <atomic>
#include <thread>

__global__ void step(unsigned *x, unsigned k) { *x = *x * 3u + k; }
__global__ void add_one(unsigned *x) { atomicAdd(x, 1u); }
__global__ void fill(int *data, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = v;
}

int main() {
    unsigned *x;
    CHECK(cudaMalloc(&x, sizeof(unsigned)));

    // 1. Order within a stream: a non-commutative chain, longer than any launch queue.
    CHECK(cudaMemset(x, 0, sizeof(unsigned)));
    unsigned want = 0;
    for (unsigned k = 0; k < 3000; k++) {
        step<<<1, 1>>>(x, k);
        want = want * 3u + k;
    }
    CHECK_LAUNCH();
    unsigned got = 0;
    CHECK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == want);
    std::printf("chain of 3000 launches: %u\n", got);

    // 2. Across threads: one thread enqueues, another synchronises the stream afterwards
    // and must find all of it done.
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int round = 1; round <= 3; round++) {
        CHECK(cudaMemset(x, 0, sizeof(unsigned)));
        std::atomic<bool> enqueued{false};
        const unsigned n = 400 * round;
        std::thread producer([&] {
            for (unsigned i = 0; i < n; i++) add_one<<<1, 32, 0, s>>>(x);
            CHECK_LAUNCH();
            enqueued.store(true);
            // Keep this thread alive (its channel open) while the other synchronises.
            while (enqueued.load()) std::this_thread::yield();
        });
        while (!enqueued.load()) std::this_thread::yield();
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
        enqueued.store(false);
        producer.join();
        EXPECT(got == 32 * n);
        std::printf("round %d: %u increments seen after the other thread's launches\n", round, got);
    }

    // 3. A thread that enqueued work and ended: its launches still count.
    CHECK(cudaMemset(x, 0, sizeof(unsigned)));
    std::thread([&] {
        for (int i = 0; i < 100; i++) add_one<<<2, 64, 0, s>>>(x);
    }).join();
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == 100 * 128);
    std::printf("after an ended thread: %u\n", got);

    // 4. Errors a launch reports itself, even for a kernel launched fine before.
    int *d;
    CHECK(cudaMalloc(&d, 1024 * sizeof(int)));
    fill<<<4, 256>>>(d, 1024, 7);
    CHECK_LAUNCH();
    fill<<<4, 256>>>(d, 1024, 8);
    CHECK_LAUNCH();
    fill<<<1, 2048>>>(d, 1024, 9);
    std::printf("block of 2048 threads: %s\n", cudaGetErrorName(cudaGetLastError()));
    fill<<<dim3(1, 70000), 256>>>(d, 1024, 9);
    std::printf("grid.y of 70000: %s\n", cudaGetErrorName(cudaGetLastError()));
    fill<<<4, 256, 1 << 20>>>(d, 1024, 9);
    std::printf("1 MiB of dynamic shared memory: %s\n", cudaGetErrorName(cudaGetLastError()));
    fill<<<4, 256>>>(d, 1024, 10);
    CHECK_LAUNCH();
    int h[1024];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 1024; i++) EXPECT(h[i] == 10);
    std::printf("last good launch: %d\n", h[1023]);

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFree(x));
    std::printf("PASS\n");
    return 0;
}
