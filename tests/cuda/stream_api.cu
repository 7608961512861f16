// Stream and event API: priorities, flags, cross-stream waits (also on the legacy and per-thread streams), queries, timing errors and per-thread streams from several host threads.
#include "check.h"
#include <thread>
#include <vector>

__global__ void fill(int *p, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = base + i;
}

static bool all_filled(const std::vector<int> &h, int base) {
    for (size_t i = 0; i < h.size(); i++)
        if (h[i] != base + (int)i) return false;
    return true;
}

static void worker(int id, int *ok) {
    const int n = 8192;
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    std::vector<int> h(n, -1);
    fill<<<n / 256, 256, 0, cudaStreamPerThread>>>(d, n, (id + 1) * 100000);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, cudaStreamPerThread));
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    CHECK(cudaStreamQuery(cudaStreamPerThread));
    *ok = all_filled(h, (id + 1) * 100000) ? 1 : 0;
    CHECK(cudaFree(d));
}

int main() {
    // Priorities: created with the ends of the range, read back; out-of-range values clamp.
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT(greatest <= least);
    cudaStream_t a, b, lo, clamped;
    CHECK(cudaStreamCreateWithPriority(&a, cudaStreamNonBlocking, greatest));
    CHECK(cudaStreamCreateWithPriority(&lo, cudaStreamDefault, least));
    int prio = 1;
    CHECK(cudaStreamGetPriority(a, &prio));
    EXPECT(prio == greatest);
    CHECK(cudaStreamGetPriority(lo, &prio));
    EXPECT(prio == least);
    std::printf("priority round trip ok\n");
    CHECK(cudaStreamCreateWithPriority(&clamped, cudaStreamNonBlocking, greatest - 100));
    CHECK(cudaStreamGetPriority(clamped, &prio));
    EXPECT(prio == greatest);
    CHECK(cudaStreamDestroy(clamped));
    CHECK(cudaStreamCreateWithPriority(&clamped, cudaStreamDefault, least + 100));
    CHECK(cudaStreamGetPriority(clamped, &prio));
    EXPECT(prio == least);
    CHECK(cudaStreamDestroy(clamped));
    std::printf("priority clamp ok\n");

    // Flags.
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    unsigned int fa = 9, fb = 9, flo = 9;
    CHECK(cudaStreamGetFlags(a, &fa));
    CHECK(cudaStreamGetFlags(b, &fb));
    CHECK(cudaStreamGetFlags(lo, &flo));
    std::printf("stream flags: a=%u b=%u lo=%u\n", fa, fb, flo);
    EXPECT(fa == cudaStreamNonBlocking && fb == cudaStreamNonBlocking && flo == cudaStreamDefault);
    cudaStream_t bad;
    std::printf("stream with bad flags: %s\n", cudaGetErrorName(cudaStreamCreateWithFlags(&bad, 0x80)));
    cudaGetLastError();
    std::printf("priority stream with bad flags: %s\n",
                cudaGetErrorName(cudaStreamCreateWithPriority(&bad, 0x80, least)));
    cudaGetLastError();

    const int n = 16384;
    const size_t bytes = n * sizeof(int);
    int *da, *db;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    int *pinned;
    CHECK(cudaMallocHost(&pinned, bytes));
    std::vector<int> h(n);
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

    // Stream b waits for a kernel on stream a, then copies its result.
    fill<<<n / 256, 256, 0, a>>>(da, n, 1000);
    CHECK_LAUNCH();
    CHECK(cudaEventRecordWithFlags(ev, a, cudaEventRecordDefault));
    CHECK(cudaStreamWaitEvent(b, ev, 0));
    CHECK(cudaMemcpyAsync(pinned, da, bytes, cudaMemcpyDeviceToHost, b));
    CHECK(cudaStreamSynchronize(b));
    h.assign(pinned, pinned + n);
    EXPECT(all_filled(h, 1000));
    std::printf("wait a->b ok\n");

    // The legacy default stream (0) waits for stream a (non-blocking, so no implicit sync).
    fill<<<n / 256, 256, 0, a>>>(da, n, 2000);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(ev, a));
    CHECK(cudaStreamWaitEvent(0, ev, 0));
    CHECK(cudaMemcpyAsync(pinned, da, bytes, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    h.assign(pinned, pinned + n);
    EXPECT(all_filled(h, 2000));
    std::printf("wait a->legacy ok\n");

    // The per-thread stream waits for stream a.
    fill<<<n / 256, 256, 0, a>>>(da, n, 3000);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(ev, a));
    CHECK(cudaStreamWaitEvent(cudaStreamPerThread, ev, 0));
    CHECK(cudaMemcpyAsync(pinned, da, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    h.assign(pinned, pinned + n);
    EXPECT(all_filled(h, 3000));
    std::printf("wait a->per-thread ok\n");

    // Work named explicitly on cudaStreamPerThread and cudaStreamLegacy.
    fill<<<n / 256, 256, 0, cudaStreamPerThread>>>(db, n, 4000);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, db, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    h.assign(pinned, pinned + n);
    EXPECT(all_filled(h, 4000));
    std::printf("per-thread stream ok\n");
    fill<<<n / 256, 256, 0, cudaStreamLegacy>>>(db, n, 5000);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, db, bytes, cudaMemcpyDeviceToHost, cudaStreamLegacy));
    CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    h.assign(pinned, pinned + n);
    EXPECT(all_filled(h, 5000));
    std::printf("legacy stream ok\n");

    // Queries after synchronization.
    CHECK(cudaStreamSynchronize(a));
    CHECK(cudaStreamSynchronize(lo));
    std::printf("query a: %s\n", cudaGetErrorName(cudaStreamQuery(a)));
    std::printf("query b: %s\n", cudaGetErrorName(cudaStreamQuery(b)));
    std::printf("query lo: %s\n", cudaGetErrorName(cudaStreamQuery(lo)));
    std::printf("query per-thread: %s\n", cudaGetErrorName(cudaStreamQuery(cudaStreamPerThread)));
    std::printf("query legacy: %s\n", cudaGetErrorName(cudaStreamQuery(cudaStreamLegacy)));
    std::printf("query recorded event: %s\n", cudaGetErrorName(cudaEventQuery(ev)));
    cudaEvent_t fresh;
    CHECK(cudaEventCreate(&fresh));
    std::printf("query never-recorded event: %s\n", cudaGetErrorName(cudaEventQuery(fresh)));

    // Timing: both events must time.
    cudaEvent_t nt0, nt1, t0, t1;
    CHECK(cudaEventCreateWithFlags(&nt0, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&nt1, cudaEventDisableTiming | cudaEventBlockingSync));
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreateWithFlags(&t1, cudaEventDefault));
    CHECK(cudaEventRecord(nt0, b));
    CHECK(cudaEventRecord(t0, b));
    fill<<<n / 256, 256, 0, b>>>(db, n, 6000);
    CHECK_LAUNCH();
    CHECK(cudaEventRecordWithFlags(t1, b, cudaEventRecordDefault));
    CHECK(cudaEventRecord(nt1, b));
    CHECK(cudaEventSynchronize(nt1));
    CHECK(cudaEventSynchronize(t1));
    float ms = -1.0f;
    std::printf("elapsed between no-timing events: %s\n", cudaGetErrorName(cudaEventElapsedTime(&ms, nt0, nt1)));
    cudaGetLastError();
    ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    EXPECT(ms >= 0.0f);
    std::printf("elapsed ok\n");
    cudaEvent_t badev;
    std::printf("event with bad flags: %s\n", cudaGetErrorName(cudaEventCreateWithFlags(&badev, 0x100)));
    cudaGetLastError();

    // Host threads, each on its own per-thread default stream.
    const int threads = 4;
    int ok[threads] = {0, 0, 0, 0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++) pool.emplace_back(worker, t, &ok[t]);
    for (auto &t : pool) t.join();
    for (int t = 0; t < threads; t++) std::printf("thread %d: %s\n", t, ok[t] ? "ok" : "WRONG");
    for (int t = 0; t < threads; t++) EXPECT(ok[t]);

    CHECK(cudaDeviceSynchronize());
    for (cudaEvent_t e : {ev, fresh, nt0, nt1, t0, t1}) CHECK(cudaEventDestroy(e));
    for (cudaStream_t s : {a, b, lo}) CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    std::printf("done\n");
    return 0;
}
