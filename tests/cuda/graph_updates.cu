// Graph node queries, edits, clones and executable graph updates, as the public samples use
// them (simpleCudaGraphs and jacobiCudaGraphs walk a graph's nodes, read a kernel node's
// parameters and set them again in the executable graph; others update an executable graph
// from another of the same shape): root nodes, edges, dependencies and dependents, each
// node type's parameters read and set in the graph and in the executable graph, removed
// dependencies and destroyed nodes, disabled nodes, event nodes' events, a child graph node's
// own graph, clones and their nodes, cudaGraphExecUpdate and its failure for another shape, a
// DOT file of a graph; then CUDA's answers to misuse.
#include "check.h"

#include <cstring>
#include <unistd.h>

__global__ void fill(int *d, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = v + i;
}

__global__ void addk(int *d, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] += v;
}

static const int n = 256;
static const int threads = 64;

static void CUDART_CB bump(void *p) { (*(int *)p) += 1; }
static void CUDART_CB bump10(void *p) { (*(int *)p) += 10; }

static long long sum(const int *d) {
    int host[n];
    CHECK(cudaMemcpy(host, d, sizeof(host), cudaMemcpyDeviceToHost));
    long long s = 0;
    for (int i = 0; i < n; i++) s += host[i];
    return s;
}

static cudaKernelNodeParams kernel_params(void *func, void **args) {
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = dim3(n / threads);
    p.blockDim = dim3(threads);
    p.kernelParams = args;
    return p;
}

static size_t count_nodes(cudaGraph_t g) {
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    return count;
}

static size_t count_roots(cudaGraph_t g) {
    size_t count = 0;
    CHECK(cudaGraphGetRootNodes(g, nullptr, &count));
    return count;
}

static size_t edges(cudaGraph_t g, cudaGraphNode_t *from, cudaGraphNode_t *to, size_t room) {
    size_t count = room;
#if CUDART_VERSION >= 13000
    CHECK(cudaGraphGetEdges(g, from, to, nullptr, &count));
#else
    CHECK(cudaGraphGetEdges(g, from, to, &count));
#endif
    return count;
}

static size_t dependencies(cudaGraphNode_t node, cudaGraphNode_t *out, size_t room) {
    size_t count = room;
#if CUDART_VERSION >= 13000
    CHECK(cudaGraphNodeGetDependencies(node, out, nullptr, &count));
#else
    CHECK(cudaGraphNodeGetDependencies(node, out, &count));
#endif
    return count;
}

static size_t dependents(cudaGraphNode_t node, cudaGraphNode_t *out, size_t room) {
    size_t count = room;
#if CUDART_VERSION >= 13000
    CHECK(cudaGraphNodeGetDependentNodes(node, out, nullptr, &count));
#else
    CHECK(cudaGraphNodeGetDependentNodes(node, out, &count));
#endif
    return count;
}

static cudaError_t add_edge(cudaGraph_t g, cudaGraphNode_t from, cudaGraphNode_t to) {
#if CUDART_VERSION >= 13000
    return cudaGraphAddDependencies(g, &from, &to, nullptr, 1);
#else
    return cudaGraphAddDependencies(g, &from, &to, 1);
#endif
}

static cudaError_t remove_edge(cudaGraph_t g, cudaGraphNode_t from, cudaGraphNode_t to) {
#if CUDART_VERSION >= 13000
    return cudaGraphRemoveDependencies(g, &from, &to, nullptr, 1);
#else
    return cudaGraphRemoveDependencies(g, &from, &to, 1);
#endif
}

static int update(cudaGraphExec_t exec, cudaGraph_t g, cudaError_t *err) {
#if CUDART_VERSION >= 12000
    cudaGraphExecUpdateResultInfo info;
    *err = cudaGraphExecUpdate(exec, g, &info);
    return (int)info.result;
#else
    cudaGraphNode_t error_node;
    cudaGraphExecUpdateResult result;
    *err = cudaGraphExecUpdate(exec, g, &error_node, &result);
    return (int)result;
#endif
}

int main(int argc, char **argv) {
    const bool checkpoint = argc > 1 && !std::strcmp(argv[1], "checkpoint");
    int *a, *b, *b2, *c, *d;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMalloc(&b2, n * sizeof(int)));
    CHECK(cudaMalloc(&c, n * sizeof(int)));
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemset(b2, 0, n * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int host_count = 0;

    // memset c; fill a -> add to a -> copy a to b -> host (also after the memset); an empty
    // node of its own.
    int nn = n, one = 1, five = 5;
    void *fill_args[] = {&a, &nn, &one};
    void *add_args[] = {&a, &nn, &five};
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemsetParams mp = {};
    mp.dst = c;
    mp.value = 3;
    mp.elementSize = 1;
    mp.width = n * sizeof(int);
    mp.height = 1;
    cudaGraphNode_t ms, k1, k2, cp, h, e;
    CHECK(cudaGraphAddMemsetNode(&ms, g, nullptr, 0, &mp));
    cudaKernelNodeParams kp1 = kernel_params((void *)fill, fill_args);
    CHECK(cudaGraphAddKernelNode(&k1, g, nullptr, 0, &kp1));
    cudaKernelNodeParams kp2 = kernel_params((void *)addk, add_args);
    CHECK(cudaGraphAddKernelNode(&k2, g, &k1, 1, &kp2));
    CHECK(cudaGraphAddMemcpyNode1D(&cp, g, &k2, 1, b, a, n * sizeof(int), cudaMemcpyDeviceToDevice));
    cudaHostNodeParams hp = {};
    hp.fn = bump;
    hp.userData = &host_count;
    cudaGraphNode_t before_host[] = {cp, ms};
    CHECK(cudaGraphAddHostNode(&h, g, before_host, 2, &hp));
    CHECK(cudaGraphAddEmptyNode(&e, g, nullptr, 0));

    // Queries.
    cudaGraphNode_t roots[8], from[8], to[8], list[8];
    size_t root_count = 8;
    CHECK(cudaGraphGetRootNodes(g, roots, &root_count));
    int roots_ok = root_count == 3;
    for (size_t i = 0; i < root_count; i++) roots_ok &= roots[i] == ms || roots[i] == k1 || roots[i] == e;
    size_t edge_count = edges(g, from, to, 8);
    int edges_ok = edge_count == 4 && edges(g, nullptr, nullptr, 0) == 4;
    for (size_t i = 0; i < edge_count; i++) {
        edges_ok &= (from[i] == k1 && to[i] == k2) || (from[i] == k2 && to[i] == cp) || (from[i] == cp && to[i] == h) ||
                    (from[i] == ms && to[i] == h);
    }
    printf("graph: %zu nodes, %zu roots (%s), %zu edges (%s)\n", count_nodes(g), root_count,
           roots_ok ? "memset, fill, empty" : "WRONG", edge_count, edges_ok ? "as added" : "WRONG");
    size_t deps_k2 = dependencies(k2, list, 8);
    int deps_ok = deps_k2 == 1 && list[0] == k1;
    size_t after_k2 = dependents(k2, list, 8);
    deps_ok &= after_k2 == 1 && list[0] == cp;
    size_t deps_h = dependencies(h, list, 8);
    deps_ok &= deps_h == 2 && ((list[0] == cp && list[1] == ms) || (list[0] == ms && list[1] == cp));
    printf("add node: %zu dependency, %zu dependent; host node: %zu dependencies, %zu dependents (%s)\n", deps_k2,
           after_k2, deps_h, dependents(h, nullptr, 0), deps_ok ? "the nodes added" : "WRONG");
    cudaGraphNode_t all[] = {ms, k1, k2, cp, h, e};
    printf("types:");
    for (cudaGraphNode_t node : all) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(node, &t));
        printf(" %d", (int)t);
    }
    printf("\n");

    cudaKernelNodeParams got = {};
    CHECK(cudaGraphKernelNodeGetParams(k2, &got));
    printf("kernel node: %s grid %u block %u shared %u n %d value %d\n", got.func == (void *)addk ? "addk" : "WRONG",
           got.gridDim.x, got.blockDim.x, got.sharedMemBytes, *(int *)got.kernelParams[1],
           *(int *)got.kernelParams[2]);
    cudaMemsetParams mgot = {};
    CHECK(cudaGraphMemsetNodeGetParams(ms, &mgot));
    printf("memset node: %s value %u element %u width %zu height %zu\n", mgot.dst == c ? "c" : "WRONG", mgot.value,
           mgot.elementSize, mgot.width, mgot.height);
    cudaMemcpy3DParms cgot = {};
    CHECK(cudaGraphMemcpyNodeGetParams(cp, &cgot));
    printf("memcpy node: %s to %s extent %zu %zu %zu kind %d\n", cgot.srcPtr.ptr == a ? "a" : "WRONG",
           cgot.dstPtr.ptr == b ? "b" : "WRONG", cgot.extent.width, cgot.extent.height, cgot.extent.depth,
           (int)cgot.kind);
    cudaHostNodeParams hgot = {};
    CHECK(cudaGraphHostNodeGetParams(h, &hgot));
    printf("host node: %s\n", hgot.fn == bump && hgot.userData == &host_count ? "bump, the count" : "WRONG");

    // Edits of the graph.
    int seven = 7;
    void *add7[] = {&a, &nn, &seven};
    cudaKernelNodeParams kp7 = kernel_params((void *)addk, add7);
    CHECK(cudaGraphKernelNodeSetParams(k2, &kp7));
    CHECK(cudaGraphKernelNodeGetParams(k2, &got));
    printf("kernel node set: value %d\n", *(int *)got.kernelParams[2]);
    CHECK(remove_edge(g, ms, h));
    printf("without memset -> host: %zu edges, host %zu dependencies, memset %zu dependents\n", edges(g, nullptr, nullptr, 0),
           dependencies(h, nullptr, 0), dependents(ms, nullptr, 0));
    CHECK(add_edge(g, ms, h));
    printf("an edge that is not there: %s\n", cudaGetErrorName(remove_edge(g, ms, k2)));
    CHECK(cudaGraphDestroyNode(e));
    printf("empty node destroyed: %zu nodes, %zu roots, %zu edges\n", count_nodes(g), count_roots(g),
           edges(g, nullptr, nullptr, 0));

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
#if CUDART_VERSION >= 12000
    unsigned long long flags = 0;
    CHECK(cudaGraphExecGetFlags(exec, &flags));
    printf("exec flags: %llu\n", flags);
#else
    printf("exec flags: %llu\n", 1ull);
#endif
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    int c0;
    CHECK(cudaMemcpy(&c0, c, sizeof(int), cudaMemcpyDeviceToHost));
    printf("launch: b %lld c[0] %#x host %d\n", sum(b), c0, host_count);

    // Updates of the executable graph: the graph keeps its parameters.
    int nine = 9;
    void *add9[] = {&a, &nn, &nine};
    cudaKernelNodeParams kp9 = kernel_params((void *)addk, add9);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, k2, &kp9));
    cudaMemsetParams mp2 = mp;
    mp2.value = 2;
    CHECK(cudaGraphExecMemsetNodeSetParams(exec, ms, &mp2));
    CHECK(cudaGraphExecMemcpyNodeSetParams1D(exec, cp, b2, a, n * sizeof(int), cudaMemcpyDeviceToDevice));
    cudaHostNodeParams hp10 = {};
    hp10.fn = bump10;
    hp10.userData = &host_count;
    CHECK(cudaGraphExecHostNodeSetParams(exec, h, &hp10));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&c0, c, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaGraphKernelNodeGetParams(k2, &got));
    printf("exec set: b %lld b2 %lld c[0] %#x host %d; graph's value %d\n", sum(b), sum(b2), c0, host_count,
           *(int *)got.kernelParams[2]);

    unsigned int enabled = 7;
    CHECK(cudaGraphNodeSetEnabled(exec, k2, 0));
    CHECK(cudaGraphNodeGetEnabled(exec, k2, &enabled));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("add disabled (%u): b2 %lld host %d\n", enabled, sum(b2), host_count);
    if (checkpoint) {
        // A checkpoint and restore while the program sleeps: the executable graph comes back
        // with its set parameters, its disabled node and its node handles, the graph with its
        // edits.
        printf("graph-updates ready\n");
        fflush(stdout);
        sleep(3);
        CHECK(cudaGraphNodeGetEnabled(exec, k2, &enabled));
        EXPECT(enabled == 0);
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(sum(b2) == 32896 && host_count == 31);
        CHECK(cudaGraphNodeSetEnabled(exec, k2, 1));
        CHECK(cudaGraphExecKernelNodeSetParams(exec, k2, &kp7));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(sum(b2) == 34688 && host_count == 41);
        CHECK(cudaGraphKernelNodeGetParams(k2, &got));
        EXPECT(*(int *)got.kernelParams[2] == 7 && count_nodes(g) == 5 && edges(g, nullptr, nullptr, 0) == 4);
        cudaGraph_t gc;
        CHECK(cudaGraphClone(&gc, g));
        cudaGraphExec_t again;
        CHECK(cudaGraphInstantiateWithFlags(&again, gc, 0));
        CHECK(cudaGraphLaunch(again, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(sum(b) == 34688 && host_count == 42);
        printf("after the restore: the executable graph kept its updates\n");
        return 0;
    }
    CHECK(cudaGraphNodeSetEnabled(exec, k2, 1));
    CHECK(cudaGraphNodeGetEnabled(exec, k2, &enabled));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("add enabled (%u): b2 %lld host %d\n", enabled, sum(b2), host_count);

    // Clones.
    cudaGraph_t gc;
    CHECK(cudaGraphClone(&gc, g));
    cudaGraphNode_t kc;
    CHECK(cudaGraphNodeFindInClone(&kc, k2, gc));
    CHECK(cudaGraphKernelNodeGetParams(kc, &got));
    int found_value = *(int *)got.kernelParams[2];
    int eleven = 11;
    void *add11[] = {&a, &nn, &eleven};
    cudaKernelNodeParams kp11 = kernel_params((void *)addk, add11);
    CHECK(cudaGraphKernelNodeSetParams(kc, &kp11));
    CHECK(cudaGraphKernelNodeGetParams(k2, &got));
    printf("clone: %zu nodes, %zu edges, its add node %s value %d (set 11; the original's %d)\n", count_nodes(gc),
           edges(gc, nullptr, nullptr, 0), kc != k2 ? "another" : "WRONG", found_value, *(int *)got.kernelParams[2]);

    // The executable graph updated from the clone (same shape), then from a smaller graph.
    cudaError_t err;
    int result = update(exec, gc, &err);
    printf("update from the clone: %s result %d\n", cudaGetErrorName(err), result);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("after the update: b %lld host %d\n", sum(b), host_count);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, k2, &kp9));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("set again by the original node: b %lld\n", sum(b));
    cudaGraph_t smaller;
    CHECK(cudaGraphClone(&smaller, g));
    cudaGraphNode_t cp_small;
    CHECK(cudaGraphNodeFindInClone(&cp_small, cp, smaller));
    CHECK(cudaGraphDestroyNode(cp_small));
    result = update(exec, smaller, &err);
    printf("update from a smaller graph: %s result %d\n", cudaGetErrorName(err), result);
    cudaGetLastError();

    // Event record and wait nodes.
    cudaEvent_t ev1, ev2;
    CHECK(cudaEventCreate(&ev1));
    CHECK(cudaEventCreate(&ev2));
    cudaGraph_t ge;
    CHECK(cudaGraphCreate(&ge, 0));
    cudaGraphNode_t rec, wait;
    CHECK(cudaGraphAddEventRecordNode(&rec, ge, nullptr, 0, ev1));
    CHECK(cudaGraphAddEventWaitNode(&wait, ge, &rec, 1, ev1));
    cudaEvent_t got_ev;
    CHECK(cudaGraphEventRecordNodeGetEvent(rec, &got_ev));
    int ev_ok = got_ev == ev1;
    CHECK(cudaGraphEventRecordNodeSetEvent(rec, ev2));
    CHECK(cudaGraphEventRecordNodeGetEvent(rec, &got_ev));
    ev_ok &= got_ev == ev2;
    CHECK(cudaGraphEventWaitNodeGetEvent(wait, &got_ev));
    ev_ok &= got_ev == ev1;
    CHECK(cudaGraphEventWaitNodeSetEvent(wait, ev2));
    CHECK(cudaGraphEventWaitNodeGetEvent(wait, &got_ev));
    ev_ok &= got_ev == ev2;
    cudaGraphExec_t exec_e;
    CHECK(cudaGraphInstantiateWithFlags(&exec_e, ge, 0));
    CHECK(cudaGraphExecEventRecordNodeSetEvent(exec_e, rec, ev1));
    CHECK(cudaGraphExecEventWaitNodeSetEvent(exec_e, wait, ev1));
    CHECK(cudaGraphLaunch(exec_e, s));
    CHECK(cudaStreamSynchronize(s));
    printf("event nodes: %s; after the launch ev1 %s\n", ev_ok ? "events as set" : "WRONG",
           cudaGetErrorName(cudaEventQuery(ev1)));

    // A child graph node owns its graph: changes to it reach the node.
    int fifty = 50, seventy = 70, ninety = 90;
    void *fill50[] = {&d, &nn, &fifty};
    void *fill70[] = {&d, &nn, &seventy};
    void *fill90[] = {&d, &nn, &ninety};
    cudaGraph_t child, child2, parent;
    CHECK(cudaGraphCreate(&child, 0));
    CHECK(cudaGraphCreate(&child2, 0));
    CHECK(cudaGraphCreate(&parent, 0));
    cudaGraphNode_t ck, ck2, pn;
    cudaKernelNodeParams kf50 = kernel_params((void *)fill, fill50);
    cudaKernelNodeParams kf70 = kernel_params((void *)fill, fill70);
    cudaKernelNodeParams kf90 = kernel_params((void *)fill, fill90);
    CHECK(cudaGraphAddKernelNode(&ck, child, nullptr, 0, &kf50));
    CHECK(cudaGraphAddKernelNode(&ck2, child2, nullptr, 0, &kf70));
    CHECK(cudaGraphAddChildGraphNode(&pn, parent, nullptr, 0, child));
    cudaGraph_t owned;
    CHECK(cudaGraphChildGraphNodeGetGraph(pn, &owned));
    cudaGraphNode_t owned_nodes[2];
    size_t owned_count = 2;
    CHECK(cudaGraphGetNodes(owned, owned_nodes, &owned_count));
    cudaGraphExec_t exec_p;
    CHECK(cudaGraphInstantiateWithFlags(&exec_p, parent, 0));
    CHECK(cudaGraphLaunch(exec_p, s));
    CHECK(cudaStreamSynchronize(s));
    long long first = sum(d);
    CHECK(cudaGraphExecChildGraphNodeSetParams(exec_p, pn, child2));
    CHECK(cudaGraphLaunch(exec_p, s));
    CHECK(cudaStreamSynchronize(s));
    long long second = sum(d);
    CHECK(cudaGraphKernelNodeSetParams(owned_nodes[0], &kf90));
    cudaGraphExec_t exec_p2;
    CHECK(cudaGraphInstantiateWithFlags(&exec_p2, parent, 0));
    CHECK(cudaGraphLaunch(exec_p2, s));
    CHECK(cudaStreamSynchronize(s));
    printf("child graph: %s, %zu node; d %lld, from child2 %lld, its own graph set %lld\n",
           owned != child ? "its own" : "WRONG", owned_count, first, second, sum(d));

    // A DOT file of the graph.
    char path[64];
    snprintf(path, sizeof(path), "/tmp/graph_updates_%d.dot", (int)getpid());
    CHECK(cudaGraphDebugDotPrint(g, path, cudaGraphDebugDotFlagsVerbose));
    FILE *f = fopen(path, "r");
    char head[16] = {};
    size_t got_bytes = f ? fread(head, 1, 7, f) : 0;
    if (f) fclose(f);
    unlink(path);
    printf("dot file: %s\n", got_bytes == 7 && strncmp(head, "digraph", 7) == 0 ? "a digraph" : "WRONG");

    // Misuse.
    printf("roots without a count: %s\n", cudaGetErrorName(cudaGraphGetRootNodes(g, roots, nullptr)));
    printf("a node in a graph that is not its clone: %s\n",
           cudaGetErrorName(cudaGraphNodeFindInClone(&kc, k2, parent)));
    printf("kernel parameters of a memset node in the executable graph: %s\n",
           cudaGetErrorName(cudaGraphExecKernelNodeSetParams(exec, ms, &kp9)));
    cudaGetLastError();

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(exec_e));
    CHECK(cudaGraphExecDestroy(exec_p));
    CHECK(cudaGraphExecDestroy(exec_p2));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(gc));
    CHECK(cudaGraphDestroy(smaller));
    CHECK(cudaGraphDestroy(ge));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaGraphDestroy(child2));
    CHECK(cudaGraphDestroy(parent));
    CHECK(cudaEventDestroy(ev1));
    CHECK(cudaEventDestroy(ev2));
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
