// Heavy traffic on several host threads and streams (usage: stream_traffic [ROUNDS]): each
// thread owns a buffer and, round after round, adds 1 to all of it with a kernel and copies
// it back. Whenever the session is between calls, every buffer holds one value throughout:
// a checkpoint taken during the traffic must show exactly that.
#include "check.h"
#include <cstdlib>
#include <thread>
#include <vector>

__global__ void add_one(unsigned *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

static void worker(int id, int rounds, unsigned *result) {
    const int n = 1 << 16;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned *x;
    CHECK(cudaMalloc(&x, n * sizeof(unsigned)));
    CHECK(cudaMemsetAsync(x, 0, n * sizeof(unsigned), s));
    std::vector<unsigned> h(n);
    for (int r = 0; r < rounds; r++) {
        add_one<<<n / 256, 256, 0, s>>>(x, n);
        CHECK_LAUNCH();
        if (r % 8 == 7) {
            CHECK(cudaMemcpyAsync(h.data(), x, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            for (int i = 0; i < n; i++) {
                if (h[i] != (unsigned)(r + 1)) {
                    // Says which way it is off: a launch lost (less) or run twice (more).
                    std::printf("FAILED: thread %d, round %d: x[%d] = %u, expected %u\n", id, r, i, h[i], r + 1);
                    std::exit(1);
                }
            }
        }
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(h.data(), x, sizeof(unsigned), cudaMemcpyDeviceToHost));
    *result = h[0];
    CHECK(cudaFree(x));
    CHECK(cudaStreamDestroy(s));
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 64;
    const int threads = 4;
    std::vector<std::thread> pool;
    std::vector<unsigned> results(threads);
    for (int t = 0; t < threads; t++) pool.emplace_back(worker, t, rounds, &results[t]);
    for (auto &t : pool) t.join();
    for (int t = 0; t < threads; t++) std::printf("thread %d: %u rounds\n", t, results[t]);
    std::printf("PASS\n");
    return 0;
}
