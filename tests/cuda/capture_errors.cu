// Stream capture's errors and capture into an existing graph: ending a capture whose forked
// stream was not joined back (cudaErrorStreamCaptureUnjoined, every stream out of capture, no
// graph), work on the legacy stream while a blocking stream captures
// (cudaErrorStreamCaptureImplicit, the capture invalidated) but not while only a non-blocking
// stream does, and cudaStreamBeginCaptureToGraph: work captured into a graph the program made,
// after a node of it, the graph answered by cudaStreamEndCapture, launched and checked.
// Checks its own results; prints only what CUDA determines.
#include <dlfcn.h>
#include <vector>
#include "check.h"

__global__ void add(int *data, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += value;
}

__global__ void scale(int *data, int n, int factor) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= factor;
}

static const int n = 1024;
static const int blocks = (n + 255) / 256;

// cudaStreamBeginCaptureToGraph is CUDA 12.3's: a build with older headers finds it in the
// loaded runtime.
#if CUDART_VERSION >= 12030
static cudaError_t begin_capture_to_graph(cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t *deps, size_t count) {
    return cudaStreamBeginCaptureToGraph(s, g, deps, nullptr, count, cudaStreamCaptureModeGlobal);
}
#else
typedef cudaError_t (*BeginToGraphFn)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *, const void *, size_t,
                                      cudaStreamCaptureMode);
static cudaError_t begin_capture_to_graph(cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t *deps, size_t count) {
    BeginToGraphFn f = (BeginToGraphFn)dlsym(RTLD_DEFAULT, "cudaStreamBeginCaptureToGraph");
    if (!f) {
        std::printf("the CUDA runtime lacks cudaStreamBeginCaptureToGraph\n");
        std::exit(1);
    }
    return f(s, g, deps, nullptr, count, cudaStreamCaptureModeGlobal);
}
#endif

static cudaStreamCaptureStatus status_of(cudaStream_t s) {
    cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing(s, &status));
    return status;
}

static bool all_equal(const std::vector<int> &v, int value) {
    for (int x : v)
        if (x != value) return false;
    return true;
}

int main() {
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemset(d, 0, n * sizeof(int)));
    std::vector<int> h(n);
    cudaStream_t a, b, quiet;
    CHECK(cudaStreamCreate(&a));
    CHECK(cudaStreamCreate(&b));
    CHECK(cudaStreamCreateWithFlags(&quiet, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    // A fork not joined back: the end fails, and every stream of the capture leaves it.
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    add<<<blocks, 256, 0, a>>>(d, n, 1);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(fork, a));
    CHECK(cudaStreamWaitEvent(b, fork, 0));
    add<<<blocks, 256, 0, b>>>(d, n, 2);
    CHECK_LAUNCH();
    EXPECT(status_of(b) == cudaStreamCaptureStatusActive);
    cudaGraph_t graph = (cudaGraph_t)0x1;
    cudaError_t err = cudaStreamEndCapture(a, &graph);
    std::printf("unjoined fork: %s, graph %s\n", cudaGetErrorName(err), graph == nullptr ? "null" : "set");
    (void)cudaGetLastError();  // the failed end is the last error too
    EXPECT(status_of(a) == cudaStreamCaptureStatusNone);
    EXPECT(status_of(b) == cudaStreamCaptureStatusNone);

    // Joined back, the same capture makes a graph of both branches.
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    add<<<blocks, 256, 0, a>>>(d, n, 1);
    CHECK(cudaEventRecord(fork, a));
    CHECK(cudaStreamWaitEvent(b, fork, 0));
    add<<<blocks, 256, 0, b>>>(d, n, 2);
    CHECK(cudaEventRecord(join, b));
    CHECK(cudaStreamWaitEvent(a, join, 0));
    scale<<<blocks, 256, 0, a>>>(d, n, 10);
    CHECK_LAUNCH();
    CHECK(cudaStreamEndCapture(a, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, a));
    CHECK(cudaStreamSynchronize(a));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(all_equal(h, 30));
    std::printf("joined fork: %d\n", h[0]);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // The legacy stream while a blocking stream captures: a query of it is refused and leaves
    // the capture as it is; work on it is refused, and the capture is invalidated.
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    add<<<blocks, 256, 0, a>>>(d, n, 1);
    CHECK_LAUNCH();
    {
        cudaStreamCaptureStatus legacy;
        err = cudaStreamIsCapturing(cudaStreamLegacy, &legacy);
        (void)cudaGetLastError();
        std::printf("query of the legacy stream while capturing: %s, capture still active %s\n",
                    cudaGetErrorName(err), status_of(a) == cudaStreamCaptureStatusActive ? "yes" : "no");
    }
    add<<<blocks, 256>>>(d, n, 100);
    err = cudaGetLastError();
    std::printf("legacy stream launch while capturing: %s\n", cudaGetErrorName(err));
    EXPECT(status_of(a) == cudaStreamCaptureStatusInvalidated);
    graph = (cudaGraph_t)0x1;
    err = cudaStreamEndCapture(a, &graph);
    std::printf("its end: %s, graph %s\n", cudaGetErrorName(err), graph == nullptr ? "null" : "set");
    (void)cudaGetLastError();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(all_equal(h, 30));

    // While only a non-blocking stream captures, the legacy stream works.
    CHECK(cudaStreamBeginCapture(quiet, cudaStreamCaptureModeGlobal));
    add<<<blocks, 256, 0, quiet>>>(d, n, 5);
    add<<<blocks, 256>>>(d, n, 2);
    CHECK_LAUNCH();
    CHECK(cudaStreamEndCapture(quiet, &graph));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(all_equal(h, 32));
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, quiet));
    CHECK(cudaStreamSynchronize(quiet));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(all_equal(h, 37));
    std::printf("legacy stream beside a non-blocking capture: %d\n", h[0]);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // Capture into a graph the program made, after its memset node.
    cudaGraph_t mine;
    CHECK(cudaGraphCreate(&mine, 0));
    cudaMemsetParams ms = {};
    ms.dst = d;
    ms.value = 0;
    ms.elementSize = sizeof(int);
    ms.width = n;
    ms.height = 1;
    cudaGraphNode_t reset;
    CHECK(cudaGraphAddMemsetNode(&reset, mine, nullptr, 0, &ms));
    CHECK(begin_capture_to_graph(a, mine, &reset, 1));
    EXPECT(status_of(a) == cudaStreamCaptureStatusActive);
    add<<<blocks, 256, 0, a>>>(d, n, 4);
    scale<<<blocks, 256, 0, a>>>(d, n, 3);
    CHECK_LAUNCH();
    graph = nullptr;
    CHECK(cudaStreamEndCapture(a, &graph));
    size_t nodes = 0, roots = 0;
    CHECK(cudaGraphGetNodes(mine, nullptr, &nodes));
    CHECK(cudaGraphGetRootNodes(mine, nullptr, &roots));
    std::printf("captured into an existing graph: same graph %s, %zu nodes, %zu root\n", graph == mine ? "yes" : "no",
                nodes, roots);
    CHECK(cudaGraphInstantiateWithFlags(&exec, mine, 0));
    for (int i = 0; i < 2; i++) CHECK(cudaGraphLaunch(exec, a));
    CHECK(cudaStreamSynchronize(a));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(all_equal(h, (0 + 4) * 3));
    std::printf("its launches: %d\n", h[0]);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(mine));

    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
    CHECK(cudaStreamDestroy(quiet));
    CHECK(cudaFree(d));
    std::printf("done\n");
    return 0;
}
