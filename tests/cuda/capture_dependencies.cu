// A capture's graph and dependencies while it is in progress: cudaStreamGetCaptureInfo's graph,
// dependency set and count (CUDA 11.3's _v2 form; the plain name in CUDA 12, with edge data in
// CUDA 13) through a fork and a join, the graph queried and grown by hand mid-capture (a kernel
// node and a memset node after the returned dependencies), cudaStreamUpdateCaptureDependencies
// (set, and add to the other branch) so captured work continues after them, the graph's shape, its launches'
// results, and the errors for misuse. Checks its own results; prints only what CUDA determines.
#include "check.h"

__global__ void add(int *data, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += value;
}

__global__ void scale(int *data, int n, int factor) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= factor;
}

__global__ void combine(int *out, const int *a, const int *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += a[i] + b[i];
}

static const int n = 4096;
static const int blocks = (n + 255) / 256;

static const char *yes(bool b) { return b ? "yes" : "no"; }

// The status, id, graph and dependencies of a stream's capture, in the form each CUDA version
// has (CUDA 13's with edge data, which must be the default: all zero).
static cudaError_t capture_info(cudaStream_t s, cudaStreamCaptureStatus *status, unsigned long long *id,
                                cudaGraph_t *graph, const cudaGraphNode_t **deps, size_t *count) {
#if CUDART_VERSION >= 13000
    const cudaGraphEdgeData *edges = nullptr;
    cudaError_t err = cudaStreamGetCaptureInfo(s, status, id, graph, deps, &edges, count);
    if (err == cudaSuccess && *status == cudaStreamCaptureStatusActive && *count > 0) {
        const unsigned char *bytes = (const unsigned char *)edges;
        for (size_t i = 0; i < *count * sizeof(cudaGraphEdgeData); i++) EXPECT(bytes[i] == 0);
    }
    return err;
#elif CUDART_VERSION >= 12000
    return cudaStreamGetCaptureInfo(s, status, id, graph, deps, count);
#else
    return cudaStreamGetCaptureInfo_v2(s, status, id, graph, deps, count);
#endif
}

static cudaError_t update_dependencies(cudaStream_t s, cudaGraphNode_t *deps, size_t count, unsigned int flags) {
#if CUDART_VERSION >= 13000
    return cudaStreamUpdateCaptureDependencies(s, deps, nullptr, count, flags);
#else
    return cudaStreamUpdateCaptureDependencies(s, deps, count, flags);
#endif
}

static size_t dependencies_of(cudaGraphNode_t node) {
    size_t count = 0;
#if CUDART_VERSION >= 13000
    CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count));
#else
    CHECK(cudaGraphNodeGetDependencies(node, nullptr, &count));
#endif
    return count;
}

static size_t edges_of(cudaGraph_t graph) {
    size_t count = 0;
#if CUDART_VERSION >= 13000
    CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
#else
    CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, &count));
#endif
    return count;
}

static cudaGraphNodeType type_of(cudaGraphNode_t node) {
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(node, &type));
    return type;
}

int main() {
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    int *a, *b, *out;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMalloc(&out, n * sizeof(int)));
    CHECK(cudaMemset(out, 0x55, n * sizeof(int)));

    cudaStreamCaptureStatus status;
    unsigned long long id = 0;
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t *deps = nullptr;
    size_t count = 0;

    // Not capturing.
    CHECK(capture_info(s1, &status, &id, &graph, &deps, &count));
    printf("before the capture: status %d\n", (int)status);
    printf("update without a capture: %s\n",
           cudaGetErrorName(update_dependencies(s1, nullptr, 0, cudaStreamAddCaptureDependencies)));
    cudaGetLastError();

    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(capture_info(s1, &status, &id, &graph, &deps, &count));
    cudaGraph_t captured = graph;
    unsigned long long capture_id = id;
    printf("at the start: status %d, graph %s, %zu dependencies\n", (int)status, yes(graph != nullptr), count);
    unsigned long long id_only = 0;
    CHECK(cudaStreamGetCaptureInfo(s1, &status, &id_only));
    printf("the plain query: status %d, same id %s\n", (int)status, yes(id_only == capture_id));

    CHECK(cudaMemsetAsync(a, 0, n * sizeof(int), s1));
    CHECK(capture_info(s1, &status, &id, &graph, &deps, &count));
    EXPECT(count == 1);
    cudaGraphNode_t first = deps[0];
    printf("after a memset: %zu dependency, of type %d, same graph %s\n", count, (int)type_of(first),
           yes(graph == captured));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(captured, nullptr, &nodes));
    printf("nodes of the graph being captured: %zu\n", nodes);

    // Fork: s2 joins the capture after the memset.
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    CHECK(capture_info(s2, &status, &id, &graph, &deps, &count));
    printf("s2 after the fork: status %d, same capture %s, same graph %s, %zu dependency, the memset %s\n",
           (int)status, yes(id == capture_id), yes(graph == captured), count, yes(count == 1 && deps[0] == first));
    CHECK(cudaMemsetAsync(b, 0, n * sizeof(int), s2));
    add<<<blocks, 256, 0, s2>>>(b, n, 2);
    CHECK_LAUNCH();
    add<<<blocks, 256, 0, s1>>>(a, n, 1);
    CHECK_LAUNCH();

    // A kernel node added by hand after s1's dependencies (the returned array passed as it
    // is), then made s1's only dependency: a *= 3 before s1's next kernel.
    CHECK(capture_info(s1, &status, &id, &graph, &deps, &count));
    EXPECT(count == 1);
    cudaGraphNode_t before_hand = deps[0];
    int count_arg = n, three = 3;
    void *scale_args[] = {&a, &count_arg, &three};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)scale;
    kp.gridDim = dim3(blocks);
    kp.blockDim = dim3(256);
    kp.kernelParams = scale_args;
    cudaGraphNode_t by_hand;
    CHECK(cudaGraphAddKernelNode(&by_hand, captured, deps, count, &kp));
    CHECK(update_dependencies(s1, &by_hand, 1, cudaStreamSetCaptureDependencies));
    CHECK(capture_info(s1, &status, &id, &graph, &deps, &count));
    printf("after setting: %zu dependency, the added node %s\n", count, yes(count == 1 && deps[0] == by_hand));
    cudaGraphNode_t after = nullptr;
    size_t one = 1;
#if CUDART_VERSION >= 13000
    CHECK(cudaGraphNodeGetDependencies(by_hand, &after, nullptr, &one));
#else
    CHECK(cudaGraphNodeGetDependencies(by_hand, &after, &one));
#endif
    printf("the added node: type %d, after the kernel before it %s\n", (int)type_of(by_hand),
           yes(one == 1 && after == before_hand));
    add<<<blocks, 256, 0, s1>>>(a, n, 10);
    CHECK_LAUNCH();

    // A memset node by hand after s1's last kernel (out = 0), added to s2's dependencies:
    // s2's next kernel follows both its own work and that node.
    CHECK(capture_info(s1, &status, &id, &graph, &deps, &count));
    EXPECT(count == 1);
    cudaMemsetParams mp = {};
    mp.dst = out;
    mp.value = 0;
    mp.elementSize = 4;
    mp.width = n;
    mp.height = 1;
    cudaGraphNode_t cleared;
    CHECK(cudaGraphAddMemsetNode(&cleared, captured, deps, count, &mp));
    CHECK(update_dependencies(s2, &cleared, 1, cudaStreamAddCaptureDependencies));
    CHECK(capture_info(s2, &status, &id, &graph, &deps, &count));
    bool among = false;
    for (size_t i = 0; i < count; i++) among = among || deps[i] == cleared;
    printf("s2 after adding: %zu dependencies, the memset among them %s\n", count, yes(among));
    combine<<<blocks, 256, 0, s2>>>(out, a, b, n);
    CHECK_LAUNCH();
    CHECK(capture_info(s2, &status, &id, &graph, &deps, &count));
    EXPECT(count == 1);
    cudaGraphNode_t last = deps[0];
    CHECK(cudaGraphGetNodes(captured, nullptr, &nodes));
    printf("nodes before the end: %zu\n", nodes);

    // Join.
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    cudaGraph_t ended;
    CHECK(cudaStreamEndCapture(s1, &ended));
    printf("the ended graph is the one queried: %s\n", yes(ended == captured));
    CHECK(capture_info(s1, &status, &id, &graph, &deps, &count));
    printf("after the end: status %d\n", (int)status);
    size_t roots = 0;
    CHECK(cudaGraphGetRootNodes(ended, nullptr, &roots));
    CHECK(cudaGraphGetNodes(ended, nullptr, &nodes));
    printf("graph: %zu nodes, %zu edges, %zu root, the last node after %zu\n", nodes, edges_of(ended), roots,
           dependencies_of(last));

    // out = (0 + 1) * 3 + 10 + (0 + 2) after each launch (a, b and out are reset by the graph).
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, ended, 0));
    for (int k = 0; k < 3; k++) CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    int *host = new int[n];
    CHECK(cudaMemcpy(host, out, n * sizeof(int), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && host[i] == 15;
    printf("graph launched 3 times: %s\n", ok ? "ok" : "wrong");

    // Misuse, in a capture of its own: a node of another graph, flags that are neither.
    cudaGraph_t other;
    CHECK(cudaGraphCreate(&other, 0));
    cudaGraphNode_t foreign;
    CHECK(cudaGraphAddEmptyNode(&foreign, other, nullptr, 0));
    CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(b, 1, n * sizeof(int), s2));
    printf("a node of another graph: %s\n",
           cudaGetErrorName(update_dependencies(s2, &foreign, 1, cudaStreamAddCaptureDependencies)));
    printf("flags 2: %s\n", cudaGetErrorName(update_dependencies(s2, nullptr, 0, 2)));
    cudaGetLastError();
    cudaGraph_t misuse = nullptr;
    if (cudaStreamEndCapture(s2, &misuse) == cudaSuccess) CHECK(cudaGraphDestroy(misuse));
    cudaGetLastError();

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(ended));
    CHECK(cudaGraphDestroy(other));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(out));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    delete[] host;
    printf("done\n");
    return 0;
}
