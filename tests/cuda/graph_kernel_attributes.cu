// Kernel node attributes (cudaGraphKernelNodeSetAttribute, GetAttribute, CopyAttributes): the
// access policy window, priority and cooperative attributes set, read back, copied to another
// node, kept by a clone and by new parameters; a cooperative kernel node launched; CUDA's
// answers for a node that is not a kernel's. Checks its own results; prints only what CUDA
// determines.
#include "check.h"

__global__ void add(int *data, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += value;
}

__global__ void twice(int *data, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= 2;
}

static const int n = 256;
static const int threads = 64;
static const int blocks = n / threads;

static const char *yes(bool b) { return b ? "yes" : "no"; }

static cudaGraphNode_t kernel_node(cudaGraph_t graph, const cudaGraphNode_t *deps, size_t count, void *func,
                                   void **args) {
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = dim3(blocks);
    p.blockDim = dim3(threads);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, graph, deps, count, &p));
    return node;
}

static int cooperative_of(cudaGraphNode_t node) {
    cudaKernelNodeAttrValue v;
    CHECK(cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributeCooperative, &v));
    return v.cooperative;
}

int main() {
    int *d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));

    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaMemsetParams m = {};
    m.dst = d;
    m.value = 0;
    m.elementSize = 1;
    m.width = n * sizeof(int);
    m.height = 1;
    cudaGraphNode_t set;
    CHECK(cudaGraphAddMemsetNode(&set, graph, nullptr, 0, &m));
    int count = n, value = 5;
    void *add_args[] = {&d, &count, &value};
    cudaGraphNode_t first = kernel_node(graph, &set, 1, (void *)add, add_args);
    void *twice_args[] = {&d, &count};
    cudaGraphNode_t second = kernel_node(graph, &first, 1, (void *)twice, twice_args);

    // Defaults: an ordinary launch, priority 0.
    cudaKernelNodeAttrValue v;
    CHECK(cudaGraphKernelNodeGetAttribute(first, cudaKernelNodeAttributePriority, &v));
    std::printf("defaults: cooperative %d, priority %d\n", cooperative_of(first), v.priority);

    // The access policy window: read back as set.
    cudaKernelNodeAttrValue window = {};
    window.accessPolicyWindow.base_ptr = d;
    window.accessPolicyWindow.num_bytes = n * sizeof(int);
    window.accessPolicyWindow.hitRatio = 0.5f;
    window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CHECK(cudaGraphKernelNodeSetAttribute(first, cudaKernelNodeAttributeAccessPolicyWindow, &window));
    cudaKernelNodeAttrValue back = {};
    CHECK(cudaGraphKernelNodeGetAttribute(first, cudaKernelNodeAttributeAccessPolicyWindow, &back));
    const cudaAccessPolicyWindow &w = back.accessPolicyWindow;
    std::printf("window: same base %s, %zu bytes, hit ratio %.2f, hit %d, miss %d\n", yes(w.base_ptr == (void *)d),
                w.num_bytes, w.hitRatio, (int)w.hitProp, (int)w.missProp);

    // The priority: the device's greatest, read back.
    cudaKernelNodeAttrValue priority = {};
    priority.priority = greatest;
    CHECK(cudaGraphKernelNodeSetAttribute(first, cudaKernelNodeAttributePriority, &priority));
    CHECK(cudaGraphKernelNodeGetAttribute(first, cudaKernelNodeAttributePriority, &back));
    std::printf("priority: read back as set %s\n", yes(back.priority == greatest));

    // Cooperative: set, read back; the node runs (its grid fits on the device at once).
    cudaKernelNodeAttrValue coop = {};
    coop.cooperative = 1;
    CHECK(cudaGraphKernelNodeSetAttribute(first, cudaKernelNodeAttributeCooperative, &coop));
    std::printf("cooperative: first %d, second %d\n", cooperative_of(first), cooperative_of(second));

    // Copied to the second node: all of them.
    CHECK(cudaGraphKernelNodeCopyAttributes(second, first));
    CHECK(cudaGraphKernelNodeGetAttribute(second, cudaKernelNodeAttributeAccessPolicyWindow, &back));
    std::printf("copied: cooperative %d, window %zu bytes\n", cooperative_of(second),
                back.accessPolicyWindow.num_bytes);

    // New parameters keep the attributes.
    value = 7;
    cudaKernelNodeParams p = {};
    p.func = (void *)add;
    p.gridDim = dim3(blocks);
    p.blockDim = dim3(threads);
    p.kernelParams = add_args;
    CHECK(cudaGraphKernelNodeSetParams(first, &p));
    std::printf("after new parameters: cooperative %d\n", cooperative_of(first));

    // A clone keeps them.
    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, graph));
    cudaGraphNode_t cloned;
    CHECK(cudaGraphNodeFindInClone(&cloned, first, clone));
    CHECK(cudaGraphKernelNodeGetAttribute(cloned, cudaKernelNodeAttributeAccessPolicyWindow, &back));
    std::printf("clone: cooperative %d, window %zu bytes\n", cooperative_of(cloned),
                back.accessPolicyWindow.num_bytes);

    // Both graphs run: (0 + 7) * 2 everywhere.
    cudaGraphExec_t exec, exec_clone;
    CHECK(cudaGraphInstantiate(&exec, graph, nullptr, nullptr, 0));
    CHECK(cudaGraphInstantiate(&exec_clone, clone, nullptr, nullptr, 0));
    int host[n];
    bool ok = true;
    for (cudaGraphExec_t e : {exec, exec_clone}) {
        CHECK(cudaGraphLaunch(e, 0));
        CHECK(cudaStreamSynchronize(0));
        CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++) ok = ok && host[i] == 14;
    }
    std::printf("graphs ran: %s\n", yes(ok));

    // Set back to an ordinary launch.
    coop.cooperative = 0;
    CHECK(cudaGraphKernelNodeSetAttribute(first, cudaKernelNodeAttributeCooperative, &coop));
    std::printf("cooperative again: %d\n", cooperative_of(first));

    // A node that is not a kernel's has no kernel attributes.
    cudaError_t e = cudaGraphKernelNodeGetAttribute(set, cudaKernelNodeAttributeCooperative, &back);
    std::printf("memset node get: %s\n", cudaGetErrorName(e));
    e = cudaGraphKernelNodeSetAttribute(set, cudaKernelNodeAttributeCooperative, &coop);
    std::printf("memset node set: %s\n", cudaGetErrorName(e));
    e = cudaGraphKernelNodeCopyAttributes(set, first);
    std::printf("memset node copy: %s\n", cudaGetErrorName(e));
    cudaGetLastError();

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(exec_clone));
    CHECK(cudaGraphDestroy(clone));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaFree(d));
    std::printf("done\n");
    return 0;
}
