// Event records, waits on events and graph launches return before they run, as in CUDA (Phos
// sends one without waiting once the same call has succeeded). The order they give work
// across streams, what cudaEventQuery and cudaEventSynchronize answer, and the errors the
// calls themselves return (bad flags, a wait a stream capture refuses) must still be CUDA's.
// (A call on a destroyed event, stream or executable graph is not made: natively it is
// undefined, and CUDA 13 on an H100/H200 ends the process in cudaEventRecord; Phos's answer,
// cudaErrorInvalidResourceHandle from the call even after the same call went without waiting,
// is checked by guestlib's unit tests of `live.rs`.)
#include "check.h"

__global__ void step(unsigned *x, unsigned k) { *x = *x * 3u + k; }
__global__ void mix(unsigned *x, unsigned k) { *x = (*x ^ (*x >> 7)) + k; }

static void say(const char *what, cudaError_t e) {
    std::printf("%s: %s\n", what, cudaGetErrorName(e));
    // The call's error is the thread's last error too.
    cudaError_t last = cudaGetLastError();
    EXPECT(last == e);
}

int main() {
    unsigned *x;
    CHECK(cudaMalloc(&x, sizeof(unsigned)));
    CHECK(cudaMemset(x, 0, sizeof(unsigned)));
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t ea, eb;
    CHECK(cudaEventCreateWithFlags(&ea, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&eb, cudaEventDisableTiming));

    // 1. Two streams take turns on one value, ordered by events only: a non-commutative chain.
    unsigned want = 0;
    for (unsigned k = 0; k < 300; k++) {
        step<<<1, 1, 0, a>>>(x, k);
        CHECK(cudaEventRecord(ea, a));
        CHECK(cudaStreamWaitEvent(b, ea, 0));
        mix<<<1, 1, 0, b>>>(x, k);
        CHECK(cudaEventRecord(eb, b));
        CHECK(cudaStreamWaitEvent(a, eb, 0));
        want = want * 3u + k;
        want = (want ^ (want >> 7)) + k;
    }
    CHECK_LAUNCH();
    CHECK(cudaEventSynchronize(eb));
    unsigned got = 0;
    CHECK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == want);
    std::printf("300 rounds ordered by events: %u\n", got);

    // 2. Queries and synchronisation of records that went without waiting.
    cudaEvent_t never;
    CHECK(cudaEventCreate(&never));
    say("query of an event never recorded", cudaEventQuery(never));
    step<<<1, 1, 0, a>>>(x, 7);
    CHECK(cudaEventRecord(ea, a));
    CHECK(cudaStreamWaitEvent(b, ea, 0));
    mix<<<1, 1, 0, b>>>(x, 7);
    CHECK(cudaEventRecord(eb, b));
    say("synchronize", cudaEventSynchronize(eb));
    say("query after", cudaEventQuery(ea));
    say("query after", cudaEventQuery(eb));
    want = want * 3u + 7u;
    want = (want ^ (want >> 7)) + 7u;
    CHECK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == want);
    std::printf("after the waits: %u\n", got);

    // 3. Errors of the call itself, also right after the same call went without waiting.
    cudaEvent_t gone;
    CHECK(cudaEventCreateWithFlags(&gone, cudaEventDisableTiming));
    CHECK(cudaEventRecord(gone, a));
    CHECK(cudaEventRecord(gone, a));
    CHECK(cudaEventRecordWithFlags(gone, a, 0));
    CHECK(cudaEventRecordWithFlags(gone, a, 0));
    CHECK(cudaEventSynchronize(gone));
    CHECK(cudaEventDestroy(gone));
    say("wait with bad flags", cudaStreamWaitEvent(b, ea, 0x10));
    say("record with bad flags", cudaEventRecordWithFlags(ea, a, 0x10));

    cudaStream_t c;
    CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    CHECK(cudaStreamWaitEvent(c, ea, 0));
    CHECK(cudaStreamWaitEvent(c, ea, 0));
    CHECK(cudaEventRecord(eb, c));
    CHECK(cudaEventRecord(eb, c));
    CHECK(cudaStreamSynchronize(c));
    CHECK(cudaStreamDestroy(c));

    // A graph of one step, launched twice (the second launch goes without waiting), then
    // destroyed.
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
    step<<<1, 1, 0, a>>>(x, 11);
    CHECK(cudaStreamEndCapture(a, &g));
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, a));
    CHECK(cudaGraphLaunch(exec, a));
    CHECK(cudaEventRecord(ea, a));
    CHECK(cudaEventSynchronize(ea));
    want = want * 3u + 11u;
    want = want * 3u + 11u;
    CHECK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == want);
    std::printf("two graph launches: %u\n", got);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // 4. In a capture the same calls are the capture's: a capturing stream may not wait on an
    // event recorded outside it, even after the same wait succeeded outside the capture.
    CHECK(cudaStreamWaitEvent(b, ea, 0));
    CHECK(cudaStreamWaitEvent(b, ea, 0));
    CHECK(cudaStreamBeginCapture(b, cudaStreamCaptureModeThreadLocal));
    cudaError_t refusal = cudaStreamWaitEvent(b, ea, 0);
    EXPECT(cudaGetLastError() == refusal);
    std::printf("capturing stream waits on an outside event: %s\n", refusal == cudaSuccess ? "accepted" : "refused");
    cudaGraph_t refused = nullptr;
    say("end of that capture", cudaStreamEndCapture(b, &refused));
    EXPECT(refused == nullptr);
    // Recorded in a capture and waited on there: nodes of the capture.
    CHECK(cudaStreamBeginCapture(b, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaEventRecord(eb, b));
    CHECK(cudaStreamWaitEvent(b, eb, 0));
    step<<<1, 1, 0, b>>>(x, 13);
    CHECK(cudaStreamEndCapture(b, &g));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    std::printf("captured graph nodes: %zu\n", nodes);
    CHECK(cudaGraphDestroy(g));

    // The streams still work: nothing above was sticky.
    step<<<1, 1, 0, a>>>(x, 1);
    CHECK(cudaEventRecord(ea, a));
    CHECK(cudaStreamWaitEvent(b, ea, 0));
    mix<<<1, 1, 0, b>>>(x, 1);
    CHECK(cudaStreamSynchronize(b));
    want = want * 3u + 1u;
    want = (want ^ (want >> 7)) + 1u;
    CHECK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == want);
    std::printf("afterwards: %u\n", got);

    CHECK(cudaEventDestroy(never));
    CHECK(cudaEventDestroy(ea));
    CHECK(cudaEventDestroy(eb));
    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
    CHECK(cudaFree(x));
    std::printf("PASS\n");
    return 0;
}
