// Stream capture status asked from several threads: while one thread captures a stream,
// another sees the capture on that stream and none on the others; once it has ended, none.
// With no capture open every stream answers None, however often it is asked (an argument N
// asks N times; the guest library answers those itself).
#include "check.h"
#include <atomic>
#include <cstdlib>
#include <thread>

__global__ void add(int *data, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += value;
}

static const int n = 4096;
static const int blocks = (n + 255) / 256;

static int status_of(cudaStream_t s) {
    cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing(s, &status));
    return (int)status;
}

static int info_of(cudaStream_t s, unsigned long long *id) {
    cudaStreamCaptureStatus status;
    CHECK(cudaStreamGetCaptureInfo(s, &status, id));
    return (int)status;
}

// `queries` rounds of questions with no capture open: true when every answer is None.
static bool all_none(cudaStream_t s1, cudaStream_t s2, int queries) {
    bool none = true;
    for (int i = 0; i < queries; i++) {
        unsigned long long id = 0;
        none = none && status_of(s1) == 0 && status_of(s2) == 0 && status_of(0) == 0 &&
               status_of(cudaStreamPerThread) == 0 && info_of(s2, &id) == 0;
    }
    return none;
}

int main(int argc, char **argv) {
    const int queries = argc > 1 ? atoi(argv[1]) : 50;
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemset(d, 0, n * sizeof(int)));

    printf("no capture: %s\n", all_none(s1, s2, queries) ? "all None" : "wrong");

    // A capture this thread begins on s1, asked about from another thread while it is open.
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    add<<<blocks, 256, 0, s1>>>(d, n, 1);
    CHECK_LAUNCH();
    int seen_s1 = -1, seen_s2 = -1, info_s1 = -1;
    bool id_set = false;
    std::thread during([&] {
        seen_s1 = status_of(s1);
        seen_s2 = status_of(s2);
        unsigned long long id = 0;
        info_s1 = info_of(s1, &id);
        id_set = id != 0;
    });
    during.join();
    printf("another thread, during the capture: s1 %d, s2 %d, info %d, id %s\n", seen_s1, seen_s2, info_s1,
           id_set ? "set" : "unset");
    printf("this thread, during the capture: s1 %d, s2 %d\n", status_of(s1), status_of(s2));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s1, &g));
    std::thread after([&] {
        seen_s1 = status_of(s1);
        unsigned long long id = 0;
        info_s1 = info_of(s1, &id);
    });
    after.join();
    printf("another thread, after the capture: s1 %d, info %d\n", seen_s1, info_s1);

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    for (int k = 0; k < 3; k++) CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    int *host = new int[n];
    CHECK(cudaMemcpy(host, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && host[i] == 3;
    printf("graph launched 3 times: %s\n", ok ? "ok" : "wrong");

    // A capture another thread begins on s2, asked about from this thread while it is open.
    std::atomic<int> begun(0), asked(0);
    std::thread capturer([&] {
        CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeThreadLocal));
        begun = 1;
        while (asked.load() == 0) std::this_thread::yield();
        add<<<blocks, 256, 0, s2>>>(d, n, 10);
        CHECK_LAUNCH();
        cudaGraph_t other;
        CHECK(cudaStreamEndCapture(s2, &other));
        CHECK(cudaGraphDestroy(other));
    });
    while (begun.load() == 0) std::this_thread::yield();
    int now_s1 = status_of(s1), now_s2 = status_of(s2);
    asked = 1;
    capturer.join();
    printf("this thread, while another captures s2: s1 %d, s2 %d\n", now_s1, now_s2);
    printf("after it ended: s2 %d\n", status_of(s2));

    printf("no capture again: %s\n", all_none(s1, s2, queries) ? "all None" : "wrong");

    // A begin that fails opens nothing.
    printf("capturing the legacy stream: %s\n",
           cudaGetErrorName(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal)));
    cudaGetLastError();
    printf("after the failed begin: s1 %d, s2 %d\n", status_of(s1), status_of(s2));

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    delete[] host;
    printf("done\n");
    return 0;
}
