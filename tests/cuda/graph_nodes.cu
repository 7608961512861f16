// Graphs built node by node, as the public samples build them (simpleCudaGraphs,
// jacobiCudaGraphs, simpleHyperQ-style host nodes): memcpy, memset and kernel nodes, a child
// graph (copied when added), host nodes running in stream order, event record and wait
// nodes between two graphs on two streams, copies to and from a __device__ symbol, an
// executable graph updated from another graph of the same shape, launched many times; then
// CUDA's answers to misuse.
#include "check.h"

#include <cstring>
#include <unistd.h>

__device__ int window[4];

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

__global__ void copy(int *dst, const int *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

static const int n = 1024;
static const int threads = 128;
static const int blocks = n / threads;

// What a host node sees: how often it ran, and a tag per run.
struct HostLog {
    int runs;
    int tags[16];
    int tag;
};

static void CUDART_CB host_step(void *data) {
    HostLog *log = static_cast<HostLog *>(data);
    if (log->runs < 16) log->tags[log->runs] = log->tag + log->runs;
    log->runs++;
}

static long long sum(const int *d, int count) {
    int host[n];
    CHECK(cudaMemcpy(host, d, count * sizeof(int), cudaMemcpyDeviceToHost));
    long long s = 0;
    for (int i = 0; i < count; i++) s += (long long)host[i] * (i % 5 + 1);
    return s;
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t count, void *func,
                                   void **args) {
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = dim3(blocks);
    p.blockDim = dim3(threads);
    p.sharedMemBytes = 0;
    p.kernelParams = args;
    p.extra = nullptr;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, deps, count, &p));
    return node;
}

struct Buffers {
    int *a, *b, *c, *out;
    int added;
    int factor;
    int three;
    int hundred;
    int count;
};

// The main graph:
//   a <- seed (memcpy), b <- 0 (memset); a += added; child {a *= factor; b += 3};
//   then an event record, a host node, out += a + b, window <- a[0..4], c <- window.
static cudaGraph_t build_main(Buffers *bufs, const int *seed, cudaEvent_t done, HostLog *log, cudaGraph_t *child_out,
                              cudaGraphNode_t *nodes_out) {
    void *add_args[] = {&bufs->a, &bufs->count, &bufs->added};
    void *scale_args[] = {&bufs->a, &bufs->count, &bufs->factor};
    void *add_b_args[] = {&bufs->b, &bufs->count, &bufs->three};
    void *combine_args[] = {&bufs->out, &bufs->a, &bufs->b, &bufs->count};

    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    kernel_node(child, nullptr, 0, (void *)scale, scale_args);
    kernel_node(child, nullptr, 0, (void *)add, add_b_args);

    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t copy_in, memset_b, add_a, child_node, record, host, sum_node, to_symbol, from_symbol;
    CHECK(cudaGraphAddMemcpyNode1D(&copy_in, g, nullptr, 0, bufs->a, seed, n * sizeof(int),
                                   cudaMemcpyHostToDevice));
    cudaMemsetParams m = {};
    m.dst = bufs->b;
    m.value = 0;
    m.elementSize = 4;
    m.width = n;
    m.height = 1;
    CHECK(cudaGraphAddMemsetNode(&memset_b, g, nullptr, 0, &m));
    add_a = kernel_node(g, &copy_in, 1, (void *)add, add_args);
    cudaGraphNode_t before_child[] = {memset_b, add_a};
    CHECK(cudaGraphAddChildGraphNode(&child_node, g, before_child, 2, child));
    cudaHostNodeParams hp = {};
    hp.fn = host_step;
    hp.userData = log;
    CHECK(cudaGraphAddHostNode(&host, g, &child_node, 1, &hp));
    sum_node = kernel_node(g, &child_node, 1, (void *)combine, combine_args);
    // After the kernel that writes `out`: the other graph waits for this event and copies it
    // (a record node beside that kernel would race with it).
    CHECK(cudaGraphAddEventRecordNode(&record, g, &sum_node, 1, done));
    CHECK(cudaGraphAddMemcpyNodeToSymbol(&to_symbol, g, &sum_node, 1, window, bufs->a, sizeof(window), 0,
                                         cudaMemcpyDeviceToDevice));
    CHECK(cudaGraphAddMemcpyNodeFromSymbol(&from_symbol, g, &to_symbol, 1, bufs->c, window, 2 * sizeof(int),
                                           2 * sizeof(int), cudaMemcpyDeviceToDevice));
    cudaGraphNode_t all[] = {copy_in, memset_b, add_a, child_node, record, host, sum_node, to_symbol, from_symbol};
    for (int i = 0; i < 9; i++) nodes_out[i] = all[i];
    *child_out = child;
    return g;
}

int main(int argc, char **argv) {
    const bool checkpoint = argc > 1 && !std::strcmp(argv[1], "checkpoint");
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));

    Buffers bufs = {};
    bufs.added = 1;
    bufs.factor = 2;
    bufs.three = 3;
    bufs.hundred = 100;
    bufs.count = n;
    int *out2;
    CHECK(cudaMalloc(&bufs.a, n * sizeof(int)));
    CHECK(cudaMalloc(&bufs.b, n * sizeof(int)));
    CHECK(cudaMalloc(&bufs.c, 2 * sizeof(int)));
    CHECK(cudaMalloc(&bufs.out, n * sizeof(int)));
    CHECK(cudaMalloc(&out2, n * sizeof(int)));
    CHECK(cudaMemset(bufs.out, 0, n * sizeof(int)));
    CHECK(cudaMemset(out2, 0, n * sizeof(int)));
    // Page-locked, as the samples' copy nodes use (pageable under checkpoint: the test that
    // checkpoints this program restores no page-locked arena).
    static int pageable[n];
    int *seed = pageable;
    if (!checkpoint) CHECK(cudaMallocHost(&seed, n * sizeof(int)));
    for (int i = 0; i < n; i++) seed[i] = i % 7;

    HostLog log = {};
    log.tag = 100;
    cudaGraph_t child;
    cudaGraphNode_t nodes[9];
    cudaGraph_t g = build_main(&bufs, seed, done, &log, &child, nodes);

    // The child was copied into its node: a node added to it now changes nothing in `g`.
    void *hundred_args[] = {&bufs.a, &bufs.count, &bufs.hundred};
    kernel_node(child, nullptr, 0, (void *)add, hundred_args);
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    printf("main graph: %zu nodes; types", count);
    for (int i = 0; i < 9; i++) {
        cudaGraphNodeType type;
        CHECK(cudaGraphNodeGetType(nodes[i], &type));
        printf(" %d", (int)type);
    }
    printf("\n");
    CHECK(cudaGraphGetNodes(child, nullptr, &count));
    printf("child graph: %zu nodes\n", count);

    // A second graph on another stream waits for the first one's event, then copies out.
    cudaGraph_t waiter;
    CHECK(cudaGraphCreate(&waiter, 0));
    cudaGraphNode_t wait_node;
    CHECK(cudaGraphAddEventWaitNode(&wait_node, waiter, nullptr, 0, done));
    void *copy_args[] = {&out2, &bufs.out, &bufs.count};
    kernel_node(waiter, &wait_node, 1, (void *)copy, copy_args);
    cudaGraphNodeType wait_type;
    CHECK(cudaGraphNodeGetType(wait_node, &wait_type));
    printf("wait node type %d\n", (int)wait_type);

    cudaGraphExec_t exec, waiter_exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    CHECK(cudaGraphInstantiateWithFlags(&waiter_exec, waiter, 0));
    if (checkpoint) {
        // A checkpoint and restore while the program sleeps, then three launches: the graphs
        // come back with their event record and wait, child graph, host and symbol copy nodes
        // (the host node's callback thread starts after the restore).
        printf("graph-nodes ready\n");
        fflush(stdout);
        sleep(3);
        // The first host function after the restore, on its own.
        HostLog first = {};
        first.tag = 700;
        CHECK(cudaLaunchHostFunc(s1, host_step, &first));
        CHECK(cudaStreamSynchronize(s1));
        EXPECT(first.runs == 1 && first.tags[0] == 700);
        for (int launch = 0; launch < 3; launch++) {
            CHECK(cudaGraphLaunch(exec, s1));
            CHECK(cudaGraphLaunch(waiter_exec, s2));
        }
        CHECK(cudaDeviceSynchronize());
        static int out[n], copied[n];
        CHECK(cudaMemcpy(out, bufs.out, sizeof(out), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(copied, out2, sizeof(copied), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++) {
            EXPECT(out[i] == 3 * ((seed[i] + 1) * 2 + 3));
            EXPECT(copied[i] == out[i]);
        }
        int c[2];
        CHECK(cudaMemcpy(c, bufs.c, sizeof(c), cudaMemcpyDeviceToHost));
        EXPECT(c[0] == (seed[2] + 1) * 2 && c[1] == (seed[3] + 1) * 2);
        EXPECT(log.runs == 3 && log.tags[2] == 102);
        // Plain copies to and from the symbol, whose address the program resolved before.
        const int put[4] = {4, 3, 2, 1};
        int got[4] = {};
        CHECK(cudaMemcpyToSymbol(window, put, sizeof(put)));
        CHECK(cudaMemcpyFromSymbol(got, window, sizeof(got)));
        EXPECT(std::memcmp(put, got, sizeof(got)) == 0);
        printf("after the restore: the graph's nodes ran\n");
        return 0;
    }
    for (int launch = 0; launch < 5; launch++) {
        CHECK(cudaGraphLaunch(exec, s1));
        CHECK(cudaGraphLaunch(waiter_exec, s2));
        CHECK(cudaStreamSynchronize(s2));
        CHECK(cudaStreamSynchronize(s1));
        int c[2];
        CHECK(cudaMemcpy(c, bufs.c, sizeof(c), cudaMemcpyDeviceToHost));
        printf("launch %d: a %lld b %lld out %lld out2 %lld window[2..4] %d %d host runs %d\n", launch,
               sum(bufs.a, n), sum(bufs.b, n), sum(bufs.out, n), sum(out2, n), c[0], c[1], log.runs);
    }
    printf("host tags:");
    for (int i = 0; i < log.runs && i < 16; i++) printf(" %d", log.tags[i]);
    printf("\n");

    // An update from a graph of the same shape: another addend, another host log.
    HostLog other = {};
    other.tag = 500;
    Buffers bufs2 = bufs;
    bufs2.added = 5;
    cudaGraph_t child2;
    cudaGraphNode_t nodes2[9];
    cudaGraph_t g2 = build_main(&bufs2, seed, done, &other, &child2, nodes2);
#if CUDART_VERSION >= 12000
    cudaGraphExecUpdateResultInfo info;
    cudaError_t updated = cudaGraphExecUpdate(exec, g2, &info);
    cudaGraphExecUpdateResult result = info.result;
#else
    cudaGraphNode_t error_node;
    cudaGraphExecUpdateResult result;
    cudaError_t updated = cudaGraphExecUpdate(exec, g2, &error_node, &result);
#endif
    printf("update: %s result %d\n", cudaGetErrorName(updated), (int)result);
    for (int launch = 0; launch < 3; launch++) CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("after the update: a %lld out %lld host runs %d (first log %d)\n", sum(bufs.a, n), sum(bufs.out, n),
           other.runs, log.runs);
    printf("updated host tags:");
    for (int i = 0; i < other.runs && i < 16; i++) printf(" %d", other.tags[i]);
    printf("\n");

    // A kernel node, then a host node after it: through cudaGraphAddNode and
    // cudaGraphNodeParams where the runtime has them (CUDA 12.3), else the per-type calls.
    {
        HostLog third = {};
        third.tag = 900;
        cudaGraph_t g3;
        CHECK(cudaGraphCreate(&g3, 0));
        cudaGraphNode_t k, h;
#if CUDART_VERSION >= 12030
        cudaGraphNodeParams kp = {};
        kp.type = cudaGraphNodeTypeKernel;
        kp.kernel.func = (void *)add;
        kp.kernel.gridDim = dim3(blocks);
        kp.kernel.blockDim = dim3(threads);
        kp.kernel.kernelParams = hundred_args;
        cudaGraphNodeParams hostp = {};
        hostp.type = cudaGraphNodeTypeHost;
        hostp.host.fn = host_step;
        hostp.host.userData = &third;
#if CUDART_VERSION >= 13000
        CHECK(cudaGraphAddNode(&k, g3, nullptr, nullptr, 0, &kp));
        CHECK(cudaGraphAddNode(&h, g3, &k, nullptr, 1, &hostp));
#else
        CHECK(cudaGraphAddNode(&k, g3, nullptr, 0, &kp));
        CHECK(cudaGraphAddNode(&h, g3, &k, 1, &hostp));
#endif
#else
        k = kernel_node(g3, nullptr, 0, (void *)add, hundred_args);
        cudaHostNodeParams third_params = {};
        third_params.fn = host_step;
        third_params.userData = &third;
        CHECK(cudaGraphAddHostNode(&h, g3, &k, 1, &third_params));
#endif
        cudaGraphNodeType types[2];
        CHECK(cudaGraphNodeGetType(k, &types[0]));
        CHECK(cudaGraphNodeGetType(h, &types[1]));
        cudaGraphExec_t e3;
        CHECK(cudaGraphInstantiateWithFlags(&e3, g3, 0));
        CHECK(cudaGraphLaunch(e3, s1));
        CHECK(cudaGraphLaunch(e3, s1));
        CHECK(cudaStreamSynchronize(s1));
        printf("node by parameters: types %d %d a %lld host runs %d tag %d\n", (int)types[0], (int)types[1],
               sum(bufs.a, n), third.runs, third.tags[1]);
        CHECK(cudaGraphExecDestroy(e3));
        CHECK(cudaGraphDestroy(g3));
    }

    // Misuse.
    cudaGraphNode_t bad;
    cudaHostNodeParams no_fn = {};
    no_fn.userData = &log;
    printf("host node without a function: %s\n", cudaGetErrorName(cudaGraphAddHostNode(&bad, waiter, nullptr, 0, &no_fn)));
    printf("host node without parameters: %s\n",
           cudaGetErrorName(cudaGraphAddHostNode(&bad, waiter, nullptr, 0, nullptr)));
    printf("a dependency of another graph: %s\n",
           cudaGetErrorName(cudaGraphAddEventRecordNode(&bad, waiter, &nodes[0], 1, done)));
    printf("a copy past the symbol's end: %s\n",
           cudaGetErrorName(cudaGraphAddMemcpyNodeToSymbol(&bad, waiter, nullptr, 0, window, bufs.a, sizeof(window),
                                                           4, cudaMemcpyDeviceToDevice)));
    cudaGetLastError();

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(waiter_exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaGraphDestroy(child2));
    CHECK(cudaGraphDestroy(waiter));
    CHECK(cudaEventDestroy(done));
    if (!checkpoint) CHECK(cudaFreeHost(seed));
    printf("done\n");
    return 0;
}
