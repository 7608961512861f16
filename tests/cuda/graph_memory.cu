// Graph memory nodes, as CUDA's programming guide uses them: an allocation node whose address
// is fixed when the node is added and used by later nodes of the graph, a free node; a graph
// whose allocation outlives its launch (freed by cudaFree, cudaFreeAsync or, instantiated with
// cudaGraphInstantiateFlagAutoFreeOnLaunch, by the next launch); cudaMallocAsync and
// cudaFreeAsync captured into allocation and free nodes; the graph memory attributes; user
// objects held by graphs and executable graphs; then CUDA's answers to misuse.
#include "check.h"

#include <atomic>
#include <unistd.h>

__global__ void fill(int *data, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = base + i;
}

__global__ void add(int *data, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += value;
}

static const int n = 1024;
static const int threads = 128;
static const int blocks = n / threads;
static const size_t bytes = n * sizeof(int);

static long long sum(const int *d) {
    static int host[n];
    CHECK(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
    long long s = 0;
    for (int i = 0; i < n; i++) s += (long long)host[i] * (i % 3 + 1);
    return s;
}

static cudaMemAllocNodeParams alloc_params(size_t size) {
    cudaMemAllocNodeParams p = {};
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = 0;
    p.bytesize = size;
    return p;
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t count, void *func, void **args) {
    cudaKernelNodeParams k = {};
    k.func = func;
    k.gridDim = dim3(blocks);
    k.blockDim = dim3(threads);
    k.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, deps, count, &k));
    return node;
}

static const char *yes(bool b) { return b ? "yes" : "no"; }

// A user object's destructor: counts its runs.
static void CUDART_CB destroy_object(void *p) { static_cast<std::atomic<int> *>(p)->fetch_add(1); }

// Destructors run asynchronously: wait (up to 10 s) for `value` runs.
static int wait_for(std::atomic<int> &runs, int value) {
    for (int i = 0; i < 10000 && runs.load() < value; i++) usleep(1000);
    return runs.load();
}

int main() {
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int *out;
    CHECK(cudaMalloc(&out, bytes));

    // 1. Allocate, fill, add, copy out, free: each launch allocates anew.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = alloc_params(bytes);
    cudaGraphNode_t alloc_node;
    CHECK(cudaGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &ap));
    int *a = static_cast<int *>(ap.dptr);
    EXPECT(a != nullptr);
    int count = n, base = 7, step = 5;
    void *fill_args[] = {&a, &count, &base};
    cudaGraphNode_t filled = kernel_node(g, &alloc_node, 1, (void *)fill, fill_args);
    void *add_args[] = {&a, &count, &step};
    cudaGraphNode_t added = kernel_node(g, &filled, 1, (void *)add, add_args);
    cudaGraphNode_t copied;
    CHECK(cudaGraphAddMemcpyNode1D(&copied, g, &added, 1, out, a, bytes, cudaMemcpyDeviceToDevice));
    cudaGraphNode_t free_node;
    CHECK(cudaGraphAddMemFreeNode(&free_node, g, &copied, 1, a));

    cudaGraphNodeType t_alloc, t_free;
    CHECK(cudaGraphNodeGetType(alloc_node, &t_alloc));
    CHECK(cudaGraphNodeGetType(free_node, &t_free));
    printf("node types: alloc %d free %d\n", (int)t_alloc, (int)t_free);
    cudaMemAllocNodeParams back = {};
    CHECK(cudaGraphMemAllocNodeGetParams(alloc_node, &back));
    printf("alloc params: bytesize %zu same address %s device %d type %d\n", back.bytesize, yes(back.dptr == a),
           back.poolProps.location.id, (int)back.poolProps.location.type);
    void *freed = nullptr;
    CHECK(cudaGraphMemFreeNodeGetParams(free_node, &freed));
    printf("free params: same address %s\n", yes(freed == a));

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    for (int i = 0; i < 3; i++) {
        CHECK(cudaMemsetAsync(out, 0, bytes, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaStreamSynchronize(stream));
        printf("launch %d: %lld\n", i, sum(out));
    }
    cudaGraphExec_t second;
    printf("second instantiation refused: %s\n", yes(cudaGraphInstantiateWithFlags(&second, g, 0) != cudaSuccess));
    cudaGetLastError();
    cudaGraph_t clone;
    printf("clone refused: %s\n", yes(cudaGraphClone(&clone, g) != cudaSuccess));
    cudaGetLastError();
    cudaGraph_t parent;
    CHECK(cudaGraphCreate(&parent, 0));
    cudaGraphNode_t child;
    printf("child graph refused: %s\n", yes(cudaGraphAddChildGraphNode(&child, parent, nullptr, 0, g) != cudaSuccess));
    cudaGetLastError();
    CHECK(cudaGraphDestroy(parent));

    // Misuse of free nodes: the same address twice, an address no allocation node returned.
    cudaGraphNode_t bad;
    printf("second free of the address: %s\n",
           cudaGetErrorName(cudaGraphAddMemFreeNode(&bad, g, &free_node, 1, a)));
    printf("allocation of 0 bytes: %s\n", cudaGetErrorName([&] {
               cudaMemAllocNodeParams zero = alloc_params(0);
               return cudaGraphAddMemAllocNode(&bad, g, nullptr, 0, &zero);
           }()));
    printf("allocation without parameters: %s\n", cudaGetErrorName(cudaGraphAddMemAllocNode(&bad, g, nullptr, 0, nullptr)));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // 2. An allocation the graph does not free: usable after the launch until freed.
    cudaGraph_t keep;
    CHECK(cudaGraphCreate(&keep, 0));
    cudaMemAllocNodeParams kp = alloc_params(bytes);
    cudaGraphNode_t keep_alloc;
    CHECK(cudaGraphAddMemAllocNode(&keep_alloc, keep, nullptr, 0, &kp));
    int *b = static_cast<int *>(kp.dptr);
    int kbase = 100;
    void *kargs[] = {&b, &count, &kbase};
    kernel_node(keep, &keep_alloc, 1, (void *)fill, kargs);
    cudaGraphExec_t kexec;
    CHECK(cudaGraphInstantiateWithFlags(&kexec, keep, 0));
    CHECK(cudaGraphLaunch(kexec, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("kept allocation: %lld\n", sum(b));
    unsigned long long used = 0, reserved = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &reserved));
    printf("used >= size: %s reserved >= used: %s\n", yes(used >= bytes), yes(reserved >= used));
    printf("relaunch before the free: %s\n", cudaGetErrorName(cudaGraphLaunch(kexec, stream)));
    cudaGetLastError();
    CHECK(cudaFree(b));
    CHECK(cudaGraphLaunch(kexec, stream));
    CHECK(cudaFreeAsync(b, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("relaunch after cudaFree and cudaFreeAsync: ok\n");
    CHECK(cudaGraphExecDestroy(kexec));
    // Freed on the next launch.
    cudaGraphExec_t auto_exec;
    CHECK(cudaGraphInstantiateWithFlags(&auto_exec, keep, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(auto_exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("auto free: %lld\n", sum(b));
    CHECK(cudaFree(b));
    CHECK(cudaGraphExecDestroy(auto_exec));
    CHECK(cudaGraphDestroy(keep));

    // 3. cudaMallocAsync and cudaFreeAsync captured: allocation and free nodes.
    cudaGraph_t captured;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    int *c = nullptr;
    CHECK(cudaMallocAsync((void **)&c, bytes, stream));
    int cbase = 1000;
    fill<<<blocks, threads, 0, stream>>>(c, n, cbase);
    add<<<blocks, threads, 0, stream>>>(c, n, 3);
    CHECK(cudaMemcpyAsync(out, c, bytes, cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaFreeAsync(c, stream));
    CHECK(cudaStreamEndCapture(stream, &captured));
    size_t node_count = 0;
    CHECK(cudaGraphGetNodes(captured, nullptr, &node_count));
    int allocs = 0, frees = 0;
    cudaGraphNode_t nodes[16];
    EXPECT(node_count <= 16);
    CHECK(cudaGraphGetNodes(captured, nodes, &node_count));
    for (size_t i = 0; i < node_count; i++) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(nodes[i], &t));
        if (t == cudaGraphNodeTypeMemAlloc) {
            allocs++;
            cudaMemAllocNodeParams p = {};
            CHECK(cudaGraphMemAllocNodeGetParams(nodes[i], &p));
            EXPECT(p.dptr == c && p.bytesize == bytes);
        }
        if (t == cudaGraphNodeTypeMemFree) frees++;
    }
    printf("captured: %zu nodes, %d allocation, %d free\n", node_count, allocs, frees);
    cudaGraphExec_t cexec;
    CHECK(cudaGraphInstantiateWithFlags(&cexec, captured, 0));
    for (int i = 0; i < 2; i++) {
        CHECK(cudaGraphLaunch(cexec, stream));
        CHECK(cudaStreamSynchronize(stream));
        printf("captured launch %d: %lld\n", i, sum(out));
    }
    CHECK(cudaGraphExecDestroy(cexec));
    CHECK(cudaGraphDestroy(captured));

#if CUDART_VERSION >= 12020
    // cudaGraphAddNode makes the same nodes.
    cudaGraph_t generic;
    CHECK(cudaGraphCreate(&generic, 0));
    cudaGraphNodeParams gp = {};
    gp.type = cudaGraphNodeTypeMemAlloc;
    gp.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    gp.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    gp.alloc.poolProps.location.id = 0;
    gp.alloc.bytesize = bytes;
    cudaGraphNode_t galloc, gfree;
    CHECK(cudaGraphAddNode(&galloc, generic, nullptr, nullptr, 0, &gp));
    EXPECT(gp.alloc.dptr != nullptr);
    cudaGraphNodeParams fp = {};
    fp.type = cudaGraphNodeTypeMemFree;
    fp.free.dptr = gp.alloc.dptr;
    CHECK(cudaGraphAddNode(&gfree, generic, &galloc, nullptr, 1, &fp));
    cudaGraphNodeType tg;
    CHECK(cudaGraphNodeGetType(gfree, &tg));
    EXPECT(tg == cudaGraphNodeTypeMemFree);
    CHECK(cudaGraphDestroy(generic));
#endif
    printf("generic node params: ok\n");

    // 4. The graph memory attributes.
    unsigned long long zero = 0;
    CHECK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero));
    CHECK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &zero));
    printf("setting the current use: %s\n",
           cudaGetErrorName(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &zero)));
    CHECK(cudaDeviceGraphMemTrim(0));
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
    printf("used after every free: %llu\n", used);
    printf("trim of a device that does not exist: %s\n", cudaGetErrorName(cudaDeviceGraphMemTrim(1 << 20)));

    // 5. User objects: the graph takes the creator's reference, the executable graph holds its
    // own, the destructor runs once both are gone.
    std::atomic<int> runs{0};
    cudaUserObject_t object;
    CHECK(cudaUserObjectCreate(&object, &runs, destroy_object, 1, cudaUserObjectNoDestructorSync));
    cudaGraph_t holder;
    CHECK(cudaGraphCreate(&holder, 0));
    int hbase = 5;
    void *hargs[] = {&out, &count, &hbase};
    kernel_node(holder, nullptr, 0, (void *)fill, hargs);
    CHECK(cudaGraphRetainUserObject(holder, object, 1, cudaGraphUserObjectMove));
    CHECK(cudaUserObjectRetain(object, 2));
    CHECK(cudaUserObjectRelease(object, 2));
    cudaGraphExec_t hexec;
    CHECK(cudaGraphInstantiateWithFlags(&hexec, holder, 0));
    CHECK(cudaGraphLaunch(hexec, stream));
    CHECK(cudaGraphDestroy(holder));
    CHECK(cudaStreamSynchronize(stream));
    printf("user object after its graph is destroyed: %d runs\n", runs.load());
    CHECK(cudaGraphExecDestroy(hexec));
    CHECK(cudaDeviceSynchronize());
    printf("after its executable graph is destroyed: %d runs\n", wait_for(runs, 1));
    // References released through the graph.
    std::atomic<int> runs2{0};
    cudaUserObject_t second_object;
    CHECK(cudaUserObjectCreate(&second_object, &runs2, destroy_object, 1, cudaUserObjectNoDestructorSync));
    cudaGraph_t holder2;
    CHECK(cudaGraphCreate(&holder2, 0));
    CHECK(cudaGraphRetainUserObject(holder2, second_object, 3, 0));
    CHECK(cudaUserObjectRelease(second_object, 1));
    CHECK(cudaGraphReleaseUserObject(holder2, second_object, 3));
    printf("released through the graph: %d runs\n", wait_for(runs2, 1));
    CHECK(cudaGraphDestroy(holder2));
    cudaUserObject_t refused;
    printf("user object without cudaUserObjectNoDestructorSync refused: %s\n",
           yes(cudaUserObjectCreate(&refused, &runs, destroy_object, 1, 0) != cudaSuccess));
    cudaGetLastError();
    printf("destructor runs in all: %d %d\n", runs.load(), runs2.load());

    CHECK(cudaFree(out));
    CHECK(cudaStreamDestroy(stream));
    printf("done\n");
    return 0;
}
