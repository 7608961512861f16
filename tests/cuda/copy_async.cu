// Copies that return before their work is done, as CUDA documents them: synchronous
// host-to-device copies of pageable memory (which return once the bytes have left the
// caller's buffer), async ones, and device-to-device async copies, checked for their results
// and their order with kernels, events, other streams, other threads and host functions;
// and copies of freed memory, which fail at the call. Usage: copy_async [ROUNDS] (default 20;
// the output does not depend on it).
#include "check.h"
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

__global__ void add_bytes(unsigned char *data, int n, unsigned char v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = (unsigned char)(data[i] + v);
}

__global__ void fill(int *data, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = v;
}

__global__ void add(int *data, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += v;
}

__global__ void spin(unsigned *scratch) { scratch[threadIdx.x] = scratch[threadIdx.x] * 5u + 1u; }

static int blocks(int n) { return (n + 255) / 256; }

static unsigned char pattern(int round, int piece, size_t i) {
    return (unsigned char)(round * 31 + piece * 7 + i * 13 + 1);
}

// Synchronous pageable copies of several sizes into a device buffer, each round's pieces
// after the last and overlapping its last 3 bytes, the source overwritten as soon as a copy
// returns; a kernel on a blocking stream adds 1 to each round's bytes (after the round's
// copies, before the next round's). Then async copies of 4 KiB from one reused buffer.
static void pageable_copies(int rounds) {
    const size_t pieces[] = {4, 100, 4096, 65536, 3};
    size_t per_round = 0;
    for (size_t p : pieces) per_round += p;
    const size_t total = rounds * per_round + 16;
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, total));
    CHECK(cudaMemset(dev, 0, total));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    std::vector<unsigned char> want(total, 0), host(65536), got(total);
    size_t at = 0;
    for (int r = 0; r < rounds; r++) {
        const size_t start = at;
        for (int p = 0; p < 5; p++) {
            for (size_t i = 0; i < pieces[p]; i++) host[i] = want[at + i] = pattern(r, p, i);
            CHECK(cudaMemcpy(dev + at, host.data(), pieces[p], cudaMemcpyHostToDevice));
            std::memset(host.data(), 0xee, pieces[p]);
            at += pieces[p];
        }
        const int n = (int)(at - start);
        add_bytes<<<blocks(n), 256, 0, s>>>(dev + start, n, 1);
        CHECK_LAUNCH();
        for (size_t i = start; i < at; i++) want[i] = (unsigned char)(want[i] + 1);
        at -= 3;
    }
    CHECK(cudaMemcpy(got.data(), dev, total, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < total; i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
    if (bad) std::printf("pageable copies: WRONG (%zu bytes, first at %zu)\n", bad, first);
    else std::printf("pageable copies: ok\n");

    // Async ones on the stream, each into its own 4 KiB, then a kernel over all of them.
    const int words = 1024;
    int *dev2;
    CHECK(cudaMalloc(&dev2, (size_t)rounds * words * sizeof(int)));
    std::vector<int> src(words), back((size_t)rounds * words);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < words; i++) src[i] = r * 100000 + i;
        CHECK(cudaMemcpyAsync(dev2 + (size_t)r * words, src.data(), words * sizeof(int), cudaMemcpyHostToDevice, s));
        std::memset(src.data(), 0xee, words * sizeof(int));
    }
    add<<<blocks(rounds * words), 256, 0, s>>>(dev2, rounds * words, 7);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(back.data(), dev2, back.size() * sizeof(int), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < words; i++) bad += back[(size_t)r * words + i] != r * 100000 + i + 7;
    std::printf("pageable async copies: %s\n", bad ? "WRONG" : "ok");
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dev));
    CHECK(cudaFree(dev2));
}

// Device-to-device async copies handed from stream to stream with events: a -> b on s1,
// b -> c on s2 (cudaMemcpyDefault), c -> d[round] on s3, with a kernel on each stream, every
// stream waiting for the next one's read before it writes again; then synchronous ones.
static void copy_chains(int rounds) {
    const int n = 4096;
    const size_t bytes = n * sizeof(int);
    int *a, *b, *c, *d;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMalloc(&c, bytes));
    CHECK(cudaMalloc(&d, bytes * rounds));
    cudaStream_t s1, s2, s3;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
    cudaEvent_t b_ready, c_ready, b_read, c_read;
    for (cudaEvent_t *e : {&b_ready, &c_ready, &b_read, &c_read})
        CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    for (int r = 0; r < rounds; r++) {
        if (r > 0) CHECK(cudaStreamWaitEvent(s1, b_read, 0));
        fill<<<blocks(n), 256, 0, s1>>>(a, n, r * 10);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s1));
        add<<<blocks(n), 256, 0, s1>>>(b, n, 1);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(b_ready, s1));

        CHECK(cudaStreamWaitEvent(s2, b_ready, 0));
        if (r > 0) CHECK(cudaStreamWaitEvent(s2, c_read, 0));
        CHECK(cudaMemcpyAsync(c, b, bytes, cudaMemcpyDefault, s2));
        CHECK(cudaEventRecord(b_read, s2));
        add<<<blocks(n), 256, 0, s2>>>(c, n, 2);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(c_ready, s2));

        CHECK(cudaStreamWaitEvent(s3, c_ready, 0));
        CHECK(cudaMemcpyAsync(d + (size_t)r * n, c, bytes, cudaMemcpyDeviceToDevice, s3));
        CHECK(cudaEventRecord(c_read, s3));
    }
    CHECK(cudaStreamSynchronize(s3));
    // Synchronous device-to-device copies of each round's result, in reverse order, checked
    // by the device-to-host copy after them.
    int *e;
    CHECK(cudaMalloc(&e, bytes * rounds));
    for (int r = 0; r < rounds; r++)
        CHECK(cudaMemcpy(e + (size_t)(rounds - 1 - r) * n, d + (size_t)r * n, bytes, cudaMemcpyDeviceToDevice));
    std::vector<int> got((size_t)n * rounds);
    CHECK(cudaMemcpy(got.data(), e, got.size() * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(e));
    size_t bad = 0;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) bad += got[(size_t)(rounds - 1 - r) * n + i] != r * 10 + 3;
    std::printf("copy chains: %s\n", bad ? "WRONG" : "ok");
    for (cudaEvent_t e : {b_ready, c_ready, b_read, c_read}) CHECK(cudaEventDestroy(e));
    for (cudaStream_t s : {s1, s2, s3}) CHECK(cudaStreamDestroy(s));
    for (int *p : {a, b, c, d}) CHECK(cudaFree(p));
}

// Copies into and out of memory that copies succeeded on before it was freed: each fails
// at the call. (A large allocation, whose freeing unmaps its range.)
static void freed_memory() {
    const size_t bytes = 8 << 20;
    int *gone, *other;
    CHECK(cudaMalloc(&gone, bytes));
    CHECK(cudaMalloc(&other, 4096));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    std::vector<char> host(4096, 3);
    CHECK(cudaMemcpy(gone, host.data(), host.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyAsync(gone, other, 4096, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaMemcpyAsync(other, gone, 4096, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(gone));
    cudaError_t e = cudaMemcpy(gone, host.data(), host.size(), cudaMemcpyHostToDevice);
    std::printf("copy into freed memory: %s\n", cudaGetErrorName(e));
    std::printf("last error after it: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("last error now: %s\n", cudaGetErrorName(cudaGetLastError()));
    e = cudaMemcpyAsync(gone, other, 4096, cudaMemcpyDeviceToDevice, s);
    std::printf("async copy into freed memory: %s\n", cudaGetErrorName(e));
    e = cudaMemcpyAsync(other, gone, 4096, cudaMemcpyDeviceToDevice, s);
    std::printf("async copy out of freed memory: %s\n", cudaGetErrorName(e));
    std::printf("last error after them: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(other));
}

// Two threads take turns on one stream: each step first copies the buffer to the step's
// snapshot (device to device), so it reads what the other thread's step wrote, then writes
// the buffer with a copy from its own source, which a kernel filled; small kernels between
// keep the previous step's work queued when the next thread enqueues.
static void handoff() {
    const int n = 1 << 14, steps = 32, ahead = 8;
    const size_t bytes = n * sizeof(int);
    int *buf, *src[2], *snaps;
    unsigned *scratch;
    CHECK(cudaMalloc(&buf, bytes));
    CHECK(cudaMalloc(&src[0], bytes));
    CHECK(cudaMalloc(&src[1], bytes));
    CHECK(cudaMalloc(&snaps, bytes * steps));
    CHECK(cudaMalloc(&scratch, 2 * 256 * sizeof(unsigned)));
    CHECK(cudaMemset(buf, 0, bytes));
    CHECK(cudaMemset(scratch, 0, 2 * 256 * sizeof(unsigned)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    std::mutex m;
    std::condition_variable cv;
    int turn = 0;
    auto run = [&](int me) {
        for (int k = me; k < steps; k += 2) {
            {
                std::unique_lock<std::mutex> lock(m);
                cv.wait(lock, [&] { return turn == k; });
            }
            CHECK(cudaMemcpyAsync(snaps + (size_t)k * n, buf, bytes, cudaMemcpyDeviceToDevice, s));
            fill<<<blocks(n), 256, 0, s>>>(src[me], n, 1000 + k);
            CHECK_LAUNCH();
            for (int i = 0; i < ahead; i++) spin<<<1, 256, 0, s>>>(scratch + 256 * me);
            CHECK(cudaMemcpyAsync(buf, src[me], bytes, cudaMemcpyDeviceToDevice, s));
            {
                std::lock_guard<std::mutex> lock(m);
                turn = k + 1;
            }
            cv.notify_all();
        }
    };
    std::thread t0(run, 0), t1(run, 1);
    t0.join();
    t1.join();
    CHECK(cudaStreamSynchronize(s));
    std::vector<int> got((size_t)n * steps), last(n);
    CHECK(cudaMemcpy(got.data(), snaps, got.size() * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(last.data(), buf, bytes, cudaMemcpyDeviceToHost));
    int bad_steps = 0;
    for (int k = 0; k < steps; k++) {
        const int want = k == 0 ? 0 : 1000 + k - 1;
        for (int i = 0; i < n; i++)
            if (got[(size_t)k * n + i] != want) {
                bad_steps++;
                break;
            }
    }
    for (int i = 0; i < n; i++)
        if (last[i] != 1000 + steps - 1) {
            bad_steps++;
            break;
        }
    if (bad_steps) std::printf("handoff: WRONG (%d steps)\n", bad_steps);
    else std::printf("handoff: ok\n");
    CHECK(cudaStreamDestroy(s));
    for (int *p : {buf, src[0], src[1], snaps}) CHECK(cudaFree(p));
    CHECK(cudaFree(scratch));
}

static void CUDART_CB set_flag(void *flag) { static_cast<std::atomic<int> *>(flag)->store(1); }

// A host function queued on the legacy stream behind slow kernels has run when a synchronous
// copy after it returns (the copy begins with a stream synchronisation).
static void host_function_before_a_copy() {
    unsigned *scratch, *dev;
    CHECK(cudaMalloc(&scratch, 256 * sizeof(unsigned)));
    CHECK(cudaMalloc(&dev, 4096));
    CHECK(cudaMemset(scratch, 0, 256 * sizeof(unsigned)));
    std::vector<unsigned> host(1024, 5);
    CHECK(cudaMemcpy(dev, host.data(), 4096, cudaMemcpyHostToDevice));
    std::atomic<int> ran{0};
    for (int i = 0; i < 64; i++) spin<<<1, 256>>>(scratch);
    CHECK_LAUNCH();
    CHECK(cudaLaunchHostFunc(0, set_flag, &ran));
    CHECK(cudaMemcpy(dev, host.data(), 4096, cudaMemcpyHostToDevice));
    std::printf("host function before a copy: %s\n", ran.load() ? "ran" : "NOT RUN YET");
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(scratch));
    CHECK(cudaFree(dev));
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 20;
    if (rounds < 1) rounds = 1;
    pageable_copies(rounds);
    copy_chains(rounds);
    freed_memory();
    handoff();
    host_function_before_a_copy();
    std::printf("done\n");
    return 0;
}
