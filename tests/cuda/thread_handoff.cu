// Work handed from one host thread to another on the same stream: what a thread enqueued
// before it handed off (a launch, cudaMemsetAsync, cudaMemcpyAsync between device buffers)
// comes before what the next thread enqueues after taking over, both ways: a write is seen
// by the other thread's read, and a read does not see the other thread's later write.
// (Autograd's backward pass in PyTorch runs on a device thread of its own exactly so.)
#include "check.h"
#include <condition_variable>
#include <mutex>
#include <thread>

// Many elements, so each kernel takes a while, and small kernels between a step's first and
// last operation, so that the previous thread's last operation is still queued when the
// next thread enqueues its first.
constexpr int N = 1 << 16;
constexpr int STEPS = 96;
constexpr int AHEAD = 16;

__global__ void fill(int *data, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = v;
}

// Counts the elements that differ from `want` into `*bad`.
__global__ void check(const int *data, int n, int want, unsigned *bad) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && data[i] != want) atomicAdd(bad, 1u);
}

__global__ void spin(unsigned *scratch) { scratch[threadIdx.x] = scratch[threadIdx.x] * 5u + 1u; }

// How step `k` writes the buffer: 0 a kernel, 1 cudaMemsetAsync, 2 a kernel into another
// buffer and cudaMemcpyAsync from there.
static int kind(int k) { return (k + k / 6) % 3; }

// What step `k` writes.
static int written(int k) {
    switch (kind(k)) {
    case 0: return 1000 + k;
    case 1: return (int)((1u + k % 250) * 0x01010101u);
    default: return 2000 + k;
    }
}

// Steps whose read comes first (then the write, last): the read follows the other thread's
// last write. The others write first and read last: the write follows the other thread's
// last read (or write), and the read checks it.
static bool reads_first(int k) { return k % 6 < 3; }

// The value step `k` reads.
static int expected(int k) {
    if (!reads_first(k)) return written(k);
    return k == 0 ? 0 : written(k - 1);
}

static const char *const KINDS[3] = {"kernel", "cudaMemsetAsync", "cudaMemcpyAsync device to device"};

int main() {
    int *buf, *src[2];
    unsigned *bad, *scratch;
    CHECK(cudaMalloc(&buf, N * sizeof(int)));
    CHECK(cudaMalloc(&src[0], N * sizeof(int)));
    CHECK(cudaMalloc(&src[1], N * sizeof(int)));
    CHECK(cudaMalloc(&bad, (STEPS + 1) * sizeof(unsigned)));
    CHECK(cudaMemset(bad, 0, (STEPS + 1) * sizeof(unsigned)));
    CHECK(cudaMemset(buf, 0, N * sizeof(int)));
    CHECK(cudaMalloc(&scratch, 2 * 256 * sizeof(unsigned)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    const int blocks = (N + 255) / 256;

    // Steps alternate between two threads, each handing the stream to the other through a
    // mutex and a condition variable. A step reads (checks the whole buffer on the stream)
    // and writes it, in one order or the other (see `reads_first`).
    std::mutex m;
    std::condition_variable cv;
    int turn = 0;
    auto run = [&](int me) {
        for (int k = me; k < STEPS; k += 2) {
            {
                std::unique_lock<std::mutex> lock(m);
                cv.wait(lock, [&] { return turn == k; });
            }
            auto read = [&] {
                check<<<blocks, 256, 0, s>>>(buf, N, expected(k), bad + k);
                CHECK_LAUNCH();
            };
            auto write = [&] {
                const int v = written(k);
                switch (kind(k)) {
                case 0:
                    fill<<<blocks, 256, 0, s>>>(buf, N, v);
                    CHECK_LAUNCH();
                    break;
                case 1: CHECK(cudaMemsetAsync(buf, 1 + k % 250, N * sizeof(int), s)); break;
                default:
                    fill<<<blocks, 256, 0, s>>>(src[me], N, v);
                    CHECK_LAUNCH();
                    CHECK(cudaMemcpyAsync(buf, src[me], N * sizeof(int), cudaMemcpyDeviceToDevice, s));
                    break;
                }
            };
            if (reads_first(k)) read(); else write();
            for (int i = 0; i < AHEAD; i++) spin<<<1, 256, 0, s>>>(scratch + 256 * me);
            if (reads_first(k)) write(); else read();
            {
                std::lock_guard<std::mutex> lock(m);
                turn = k + 1;
            }
            cv.notify_all();
        }
    };
    std::thread a(run, 0), b(run, 1);
    a.join();
    b.join();
    // The last step's write, checked after the join.
    check<<<blocks, 256, 0, s>>>(buf, N, written(STEPS - 1), bad + STEPS);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));

    unsigned h[STEPS + 1];
    CHECK(cudaMemcpy(h, bad, sizeof h, cudaMemcpyDeviceToHost));
    // Each read, by the kind of the write it should see.
    unsigned wrong[3] = {0, 0, 0}, reads[3] = {0, 0, 0};
    for (int k = 0; k <= STEPS; k++) {
        const int by = k == STEPS ? STEPS - 1 : reads_first(k) ? k - 1 : k;
        if (by < 0) {
            EXPECT(h[k] == 0);
            continue;
        }
        reads[kind(by)]++;
        if (h[k] != 0) wrong[kind(by)]++;
    }
    for (int i = 0; i < 3; i++)
        std::printf("written by %s: %u reads, %u saw another value\n", KINDS[i], reads[i], wrong[i]);
    int last = 0;
    CHECK(cudaMemcpy(&last, buf + N - 1, sizeof last, cudaMemcpyDeviceToHost));
    EXPECT(last == written(STEPS - 1));

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(scratch));
    CHECK(cudaFree(bad));
    CHECK(cudaFree(src[0]));
    CHECK(cudaFree(src[1]));
    CHECK(cudaFree(buf));
    for (int i = 0; i < 3; i++) EXPECT(wrong[i] == 0);
    std::printf("PASS\n");
    return 0;
}
