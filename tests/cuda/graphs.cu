// Stream capture and graphs: a captured fork/join of two streams, launched many times;
// capture status; an executable graph updated from another capture; misuse.
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

static const int n = 1 << 14;
static const int blocks = (n + 255) / 256;

// out += (a + 1) * f + (b + 2): a and b are reset each launch, out accumulates.
static cudaGraph_t capture(cudaStream_t s1, cudaStream_t s2, cudaEvent_t fork, cudaEvent_t join, int *a, int *b,
                           int *out, int f, const int *seed) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing(s1, &status));
    printf("while capturing: s1 %d\n", (int)status);
    CHECK(cudaMemcpyAsync(a, seed, n * sizeof(int), cudaMemcpyDeviceToDevice, s1));
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    CHECK(cudaStreamIsCapturing(s2, &status));
    printf("after the fork: s2 %d\n", (int)status);
    CHECK(cudaMemsetAsync(b, 0, n * sizeof(int), s2));
    add<<<blocks, 256, 0, s2>>>(b, n, 2);
    CHECK(cudaEventRecord(join, s2));
    add<<<blocks, 256, 0, s1>>>(a, n, 1);
    scale<<<blocks, 256, 0, s1>>>(a, n, f);
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    combine<<<blocks, 256, 0, s1>>>(out, a, b, n);
    CHECK(cudaStreamEndCapture(s1, &g));
    CHECK(cudaStreamIsCapturing(s1, &status));
    printf("after the capture: s1 %d\n", (int)status);
    return g;
}

int main() {
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    int *a, *b, *out, *seed;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMalloc(&out, n * sizeof(int)));
    CHECK(cudaMalloc(&seed, n * sizeof(int)));
    int *host = new int[n];
    for (int i = 0; i < n; i++) host[i] = i % 100;
    CHECK(cudaMemcpy(seed, host, n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(out, 0, n * sizeof(int)));

    cudaGraph_t g = capture(s1, s2, fork, join, a, b, out, 3, seed);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    const int launches = 10;
    for (int k = 0; k < launches; k++) CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaMemcpy(host, out, n * sizeof(int), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && host[i] == launches * (((i % 100) + 1) * 3 + 2);
    printf("graph launched %d times: %s\n", launches, ok ? "ok" : "wrong");

    // Same shape, another factor: the executable graph takes the new parameters.
    cudaGraph_t g2 = capture(s1, s2, fork, join, a, b, out, 5, seed);
#if CUDART_VERSION >= 12000
    cudaGraphExecUpdateResultInfo info;
    cudaError_t updated = cudaGraphExecUpdate(exec, g2, &info);
    printf("update: %s result %d\n", cudaGetErrorName(updated), (int)info.result);
#else
    cudaGraphNode_t error_node;
    cudaGraphExecUpdateResult result;
    cudaError_t updated = cudaGraphExecUpdate(exec, g2, &error_node, &result);
    printf("update: %s result %d\n", cudaGetErrorName(updated), (int)result);
#endif
    CHECK(cudaMemset(out, 0, n * sizeof(int)));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaMemcpy(host, out, n * sizeof(int), cudaMemcpyDeviceToHost));
    ok = true;
    for (int i = 0; i < n; i++) ok = ok && host[i] == ((i % 100) + 1) * 5 + 2;
    printf("updated graph: %s\n", ok ? "ok" : "wrong");

    // A graph built node by node: set a to 0, add 7, then double (an edge added afterwards),
    // copy a to b, and an empty node at the end.
    cudaGraph_t m;
    CHECK(cudaGraphCreate(&m, 0));
    cudaGraphNode_t set, k1, k2, cp, last;
    cudaMemsetParams mp = {};
    mp.dst = a;
    mp.value = 0;
    mp.elementSize = 4;
    mp.width = n;
    mp.height = 1;
    CHECK(cudaGraphAddMemsetNode(&set, m, nullptr, 0, &mp));
    int count_arg = n, seven = 7, two = 2;
    void *add_args[] = {&a, &count_arg, &seven};
    void *scale_args[] = {&a, &count_arg, &two};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)add;
    kp.gridDim = dim3(blocks);
    kp.blockDim = dim3(256);
    kp.kernelParams = add_args;
    CHECK(cudaGraphAddKernelNode(&k1, m, &set, 1, &kp));
    kp.func = (void *)scale;
    kp.kernelParams = scale_args;
    CHECK(cudaGraphAddKernelNode(&k2, m, nullptr, 0, &kp));
#if CUDART_VERSION >= 13000
    CHECK(cudaGraphAddDependencies(m, &k1, &k2, nullptr, 1));
#else
    CHECK(cudaGraphAddDependencies(m, &k1, &k2, 1));
#endif
    CHECK(cudaGraphAddMemcpyNode1D(&cp, m, &k2, 1, b, a, n * sizeof(int), cudaMemcpyDeviceToDevice));
    CHECK(cudaGraphAddEmptyNode(&last, m, &cp, 1));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(m, nullptr, &nodes));
    cudaGraphNodeType types[5];
    cudaGraphNode_t all[5] = {set, k1, k2, cp, last};
    for (int i = 0; i < 5; i++) CHECK(cudaGraphNodeGetType(all[i], &types[i]));
    printf("nodes: %zu, types %d %d %d %d %d\n", nodes, types[0], types[1], types[2], types[3], types[4]);
    cudaGraphExec_t built;
    CHECK(cudaGraphInstantiateWithFlags(&built, m, 0));
    CHECK(cudaGraphLaunch(built, s2));
    CHECK(cudaStreamSynchronize(s2));
    CHECK(cudaMemcpy(host, b, n * sizeof(int), cudaMemcpyDeviceToHost));
    ok = true;
    for (int i = 0; i < n; i++) ok = ok && host[i] == 14;
    printf("graph built from nodes: %s\n", ok ? "ok" : "wrong");
    CHECK(cudaGraphExecDestroy(built));
    CHECK(cudaGraphDestroy(m));

    // A synchronisation inside a capture invalidates it.
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeRelaxed));
    add<<<blocks, 256, 0, s1>>>(a, n, 1);
    printf("sync while capturing: %s\n", cudaGetErrorName(cudaStreamSynchronize(s1)));
    cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing(s1, &status));
    printf("status after it: %d\n", (int)status);
    cudaGraph_t broken = nullptr;
    printf("end of the broken capture: %s\n", cudaGetErrorName(cudaStreamEndCapture(s1, &broken)));
    cudaGetLastError();
    printf("ending a capture never begun: %s\n", cudaGetErrorName(cudaStreamEndCapture(s2, &broken)));
    cudaGetLastError();
    printf("capturing the legacy stream: %s\n",
           cudaGetErrorName(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal)));
    cudaGetLastError();

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    delete[] host;
    printf("done\n");
    return 0;
}
