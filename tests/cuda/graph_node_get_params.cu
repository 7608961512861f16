// Needs CUDA 13.1 (cudaGraphNodeGetParams: not in the headers of CUDA 13.0): tests/e2e/programs.rs lists it in NEEDS_NEWER_CUDA.
// cudaGraphNodeGetParams on a node of each type Phos makes (kernel, memset, copy, host, child
// graph, empty, event record and wait, memory allocation and free): the type and the fields
// the node was made with; CUDA's answer for a missing struct. Checks its own results; prints
// only what CUDA determines.
#include "check.h"

#include <cstring>

__global__ void add(int *data, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += value;
}

static void host_fn(void *) {}

static const int n = 256;

static const char *yes(bool b) { return b ? "yes" : "no"; }

// cudaGraphNodeParams has no default constructor in CUDA 13's C++ headers (its union holds
// members that have constructors): storage of its size instead, filled with a pattern before
// each query.
union NodeParams {
    cudaGraphNodeParams p;
    unsigned char bytes[sizeof(cudaGraphNodeParams)];
    NodeParams() { std::memset(bytes, 0xab, sizeof bytes); }
    ~NodeParams() {}
};
static NodeParams storage;

static const cudaGraphNodeParams &get(cudaGraphNode_t node) {
    std::memset(storage.bytes, 0xab, sizeof storage.bytes);
    CHECK(cudaGraphNodeGetParams(node, &storage.p));
    return storage.p;
}

int main() {
    int *a = nullptr, *b = nullptr;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    cudaEvent_t event;
    CHECK(cudaEventCreate(&event));
    cudaGraph_t graph, child;
    CHECK(cudaGraphCreate(&graph, 0));
    CHECK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t inner;
    CHECK(cudaGraphAddEmptyNode(&inner, child, nullptr, 0));

    int count = n, value = 3;
    void *args[] = {&a, &count, &value};
    cudaKernelNodeParams k = {};
    k.func = (void *)add;
    k.gridDim = dim3(4);
    k.blockDim = dim3(64);
    k.kernelParams = args;
    cudaGraphNode_t kernel;
    CHECK(cudaGraphAddKernelNode(&kernel, graph, nullptr, 0, &k));
    const cudaGraphNodeParams &p = get(kernel);
    const cudaKernelNodeParamsV2 &kp = p.kernel;
    int arg_n = *(int *)kp.kernelParams[1];
    int arg_value = *(int *)kp.kernelParams[2];
    std::printf("kernel: type %d, same function %s, grid %u, block %u, shared %u, arguments %d %d\n", (int)p.type,
                yes(kp.func == (void *)add), kp.gridDim.x, kp.blockDim.x, kp.sharedMemBytes, arg_n, arg_value);

    cudaMemsetParams m = {};
    m.dst = a;
    m.value = 7;
    m.elementSize = 1;
    m.width = n * sizeof(int);
    m.height = 1;
    cudaGraphNode_t memset;
    CHECK(cudaGraphAddMemsetNode(&memset, graph, &kernel, 1, &m));
    get(memset);
    std::printf("memset: type %d, same destination %s, value %u, element size %u, width %zu, height %zu\n",
                (int)p.type, yes(p.memset.dst == (void *)a), p.memset.value, p.memset.elementSize, p.memset.width,
                p.memset.height);

    cudaGraphNode_t copy;
    CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, &memset, 1, b, a, n * sizeof(int), cudaMemcpyDeviceToDevice));
    get(copy);
    const cudaMemcpy3DParms &c = p.memcpy.copyParams;
    std::printf("copy: type %d, same source %s, same destination %s, extent %zu x %zu x %zu, kind %d\n", (int)p.type,
                yes(c.srcPtr.ptr == (void *)a), yes(c.dstPtr.ptr == (void *)b), c.extent.width, c.extent.height,
                c.extent.depth, (int)c.kind);

    int tag = 0;
    cudaHostNodeParams h = {};
    h.fn = host_fn;
    h.userData = &tag;
    cudaGraphNode_t host;
    CHECK(cudaGraphAddHostNode(&host, graph, &copy, 1, &h));
    get(host);
    std::printf("host: type %d, same function %s, same data %s\n", (int)p.type, yes(p.host.fn == host_fn),
                yes(p.host.userData == &tag));

    cudaGraphNode_t sub;
    CHECK(cudaGraphAddChildGraphNode(&sub, graph, &host, 1, child));
    get(sub);
    cudaGraph_t owned = nullptr;
    CHECK(cudaGraphChildGraphNodeGetGraph(sub, &owned));
    size_t inner_count = 0;
    CHECK(cudaGraphGetNodes(p.graph.graph, nullptr, &inner_count));
    std::printf("child graph: type %d, the node's graph %s, %zu node\n", (int)p.type, yes(p.graph.graph == owned),
                inner_count);

    cudaGraphNode_t empty;
    CHECK(cudaGraphAddEmptyNode(&empty, graph, &sub, 1));
    get(empty);
    std::printf("empty: type %d\n", (int)p.type);

    cudaGraphNode_t record, wait;
    CHECK(cudaGraphAddEventRecordNode(&record, graph, &empty, 1, event));
    get(record);
    std::printf("event record: type %d, same event %s\n", (int)p.type, yes(p.eventRecord.event == event));
    CHECK(cudaGraphAddEventWaitNode(&wait, graph, &record, 1, event));
    get(wait);
    std::printf("event wait: type %d, same event %s\n", (int)p.type, yes(p.eventWait.event == event));

    int device = 0;
    CHECK(cudaGetDevice(&device));
    cudaMemAllocNodeParams alloc = {};
    alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    alloc.poolProps.location.id = device;
    alloc.bytesize = 1 << 20;
    cudaGraphNode_t alloc_node, free_node;
    CHECK(cudaGraphAddMemAllocNode(&alloc_node, graph, &wait, 1, &alloc));
    get(alloc_node);
    std::printf("allocation: type %d, %zu bytes, same address %s\n", (int)p.type, p.alloc.bytesize,
                yes(p.alloc.dptr == alloc.dptr));
    CHECK(cudaGraphAddMemFreeNode(&free_node, graph, &alloc_node, 1, alloc.dptr));
    get(free_node);
    std::printf("free: type %d, same address %s\n", (int)p.type, yes(p.free.dptr == alloc.dptr));

    cudaError_t e = cudaGraphNodeGetParams(kernel, nullptr);
    std::printf("no struct: %s\n", cudaGetErrorName(e));
    cudaGetLastError();

    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaEventDestroy(event));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    std::printf("done\n");
    return 0;
}
