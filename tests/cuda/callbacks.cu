// Host functions (cudaLaunchHostFunc) and stream callbacks (cudaStreamAddCallback): each runs
// after the work submitted before it and before the work submitted after it, in stream order.
#include "check.h"
#include <atomic>
#include <mutex>
#include <vector>

__global__ void fill(int *out, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value + i;
}

struct Round {
    const int *host;
    int n;
    int expect;
    int stream;
    int id;
};

static std::mutex log_lock;
static std::vector<std::pair<int, int>> seen;  // (stream, round) in the order callbacks ran
static std::atomic<int> good{0};
static std::atomic<int> ran{0};

static void CUDART_CB check_round(void *p) {
    const Round *r = (const Round *)p;
    bool ok = true;
    for (int i = 0; i < r->n; i++) ok = ok && r->host[i] == r->expect + i;
    if (ok) good.fetch_add(1);
    ran.fetch_add(1);
    std::lock_guard<std::mutex> g(log_lock);
    seen.push_back({r->stream, r->id});
}

struct Status {
    cudaStream_t stream;
    cudaError_t status;
    int calls;
};

static void CUDART_CB record_status(cudaStream_t stream, cudaError_t status, void *p) {
    Status *s = (Status *)p;
    s->stream = stream;
    s->status = status;
    s->calls++;
}

static void CUDART_CB count(void *p) { ((std::atomic<int> *)p)->fetch_add(1); }

int main() {
    const int n = 4096, rounds = 4, streams = 2;
    int *dev[streams], *host[streams];
    cudaStream_t s[streams];
    std::vector<Round> info(streams * rounds);
    for (int k = 0; k < streams; k++) {
        CHECK(cudaStreamCreate(&s[k]));
        CHECK(cudaMalloc(&dev[k], n * sizeof(int)));
        CHECK(cudaMallocHost(&host[k], n * sizeof(int)));
    }
    // Each round overwrites the same host buffer: a callback sees its own round's data only if
    // the next round's copy waits for it.
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < streams; k++) {
            Round &x = info[k * rounds + r];
            x = Round{host[k], n, 1000 * (r + 1) + 100 * k, k, r};
            fill<<<(n + 255) / 256, 256, 0, s[k]>>>(dev[k], n, x.expect);
            CHECK_LAUNCH();
            CHECK(cudaMemcpyAsync(host[k], dev[k], n * sizeof(int), cudaMemcpyDeviceToHost, s[k]));
            CHECK(cudaLaunchHostFunc(s[k], check_round, &x));
        }
    }
    for (int k = 0; k < streams; k++) CHECK(cudaStreamSynchronize(s[k]));
    printf("host functions run: %d, saw their round's data: %d\n", ran.load(), good.load());
    bool ordered = true;
    int last[streams] = {-1, -1};
    for (auto &e : seen) {
        ordered = ordered && e.second == last[e.first] + 1;
        last[e.first] = e.second;
    }
    printf("in stream order: %s\n", ordered ? "yes" : "no");

    // A stream callback gets the stream and the status of the work before it.
    Status st = {nullptr, cudaErrorUnknown, 0};
    fill<<<1, 32, 0, s[0]>>>(dev[0], 32, 7);
    CHECK(cudaStreamAddCallback(s[0], record_status, &st, 0));
    CHECK(cudaStreamSynchronize(s[0]));
    printf("callback: calls=%d status=%s stream %s\n", st.calls, cudaGetErrorName(st.status),
           st.stream == s[0] ? "matches" : "differs");

    // On the legacy stream, and waited for by an event and by cudaDeviceSynchronize.
    std::atomic<int> counter{0};
    cudaEvent_t after;
    CHECK(cudaEventCreate(&after));
    CHECK(cudaLaunchHostFunc(0, count, &counter));
    CHECK(cudaEventRecord(after, 0));
    CHECK(cudaEventSynchronize(after));
    printf("after the event: %d\n", counter.load());
    for (int i = 0; i < 10; i++) CHECK(cudaLaunchHostFunc(s[i % streams], count, &counter));
    CHECK(cudaDeviceSynchronize());
    printf("after cudaDeviceSynchronize: %d\n", counter.load());

    // Work after a host function waits for it: the copy back sees what the kernel after the
    // host function wrote.
    CHECK(cudaLaunchHostFunc(s[1], count, &counter));
    fill<<<(n + 255) / 256, 256, 0, s[1]>>>(dev[1], n, 5);
    CHECK(cudaMemcpyAsync(host[1], dev[1], n * sizeof(int), cudaMemcpyDeviceToHost, s[1]));
    CHECK(cudaStreamSynchronize(s[1]));
    printf("after host function: counter=%d host[10]=%d\n", counter.load(), host[1][10]);

    // Misuse.
    printf("callback with flags 1: %s\n", cudaGetErrorName(cudaStreamAddCallback(s[0], record_status, &st, 1)));
    cudaGetLastError();
    printf("null host function: %s\n", cudaGetErrorName(cudaLaunchHostFunc(s[0], nullptr, nullptr)));
    cudaGetLastError();

    for (int k = 0; k < streams; k++) {
        CHECK(cudaStreamDestroy(s[k]));
        CHECK(cudaFree(dev[k]));
        CHECK(cudaFreeHost(host[k]));
    }
    CHECK(cudaEventDestroy(after));
    printf("done\n");
    return 0;
}
