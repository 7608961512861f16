// Graphs through the driver API (linked with -lcuda), as JAX/XLA and TensorFlow use them: stream
// capture of driver launches, copies and memsets (cuStreamBeginCapture, cuStreamIsCapturing,
// cuStreamGetCaptureInfo, cuStreamEndCapture), a graph built node by node (memset, copy, kernel
// nodes of a module's function and of a registered kernel, empty and host nodes, dependencies),
// instantiation in both forms, upload and launch, node queries, kernel node parameters read and
// set in the graph and in the executable graph, clones, cuGraphExecUpdate and its failure for
// another shape, graphs shared with the runtime API, and the driver's errors for misuse. Checks
// its own results; prints only what CUDA determines.
#include <cstring>
#include <vector>
#include <cuda.h>
#include "driver_check.h"

static const char *yes(bool b) { return b ? "yes" : "no"; }

// out[i] *= factor for i < n.
static const char *kPtx = R"(
.version 7.0
.target sm_52
.address_size 64

.visible .entry scale(
    .param .u64 scale_out,
    .param .f32 scale_factor,
    .param .u32 scale_n
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [scale_out];
    ld.param.f32 %f1, [scale_factor];
    ld.param.u32 %r2, [scale_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f2, [%rd4];
    mul.f32 %f3, %f2, %f1;
    st.global.f32 [%rd4], %f3;
DONE:
    ret;
}
)";

// out[i] += in[i].
__global__ void accumulate(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += in[i];
}

static void CUDA_CB bump(void *count) { ++*(int *)count; }

// The capture status through cuStreamGetCaptureInfo, whose parameters grew in CUDA 12 and 13.
static CUresult capture_info(CUstream s, CUstreamCaptureStatus *status) {
    cuuint64_t id = 0;
#if CUDA_VERSION >= 13000
    return cuStreamGetCaptureInfo(s, status, &id, nullptr, nullptr, nullptr, nullptr);
#elif CUDA_VERSION >= 12000
    return cuStreamGetCaptureInfo(s, status, &id, nullptr, nullptr, nullptr);
#else
    return cuStreamGetCaptureInfo(s, status, &id);
#endif
}

// The graph of a capture in progress and its dependency set: CUDA 11.3's _v2 (the plain name
// in CUDA 12), CUDA 13's plain name (with edge data, not asked for here).
static CUresult capture_graph(CUstream s, CUstreamCaptureStatus *status, CUgraph *graph, const CUgraphNode **deps,
                              size_t *count) {
    cuuint64_t id = 0;
#if CUDA_VERSION >= 13000
    return cuStreamGetCaptureInfo(s, status, &id, graph, deps, nullptr, count);
#else
    return cuStreamGetCaptureInfo_v2(s, status, &id, graph, deps, count);
#endif
}

// The same with edge data: the CUDA 12.3 form (_v3), found by cuGetProcAddress whatever the
// headers.
typedef CUresult(CUDAAPI *CaptureInfoV3)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                         const CUgraphNode **, const void **, size_t *);
static CUresult capture_graph_edges(CUstream s, CUstreamCaptureStatus *status, CUgraph *graph,
                                    const CUgraphNode **deps, const void **edges, size_t *count) {
    void *fn = nullptr;
#if CUDA_VERSION >= 12000
    CUdriverProcAddressQueryResult found;
    CUresult r = cuGetProcAddress("cuStreamGetCaptureInfo", &fn, 12030, CU_GET_PROC_ADDRESS_DEFAULT, &found);
#else
    CUresult r = cuGetProcAddress("cuStreamGetCaptureInfo", &fn, 12030, CU_GET_PROC_ADDRESS_DEFAULT);
#endif
    if (r != CUDA_SUCCESS) return r;
    cuuint64_t id = 0;
    return ((CaptureInfoV3)fn)(s, status, &id, graph, deps, edges, count);
}

// cuStreamUpdateCaptureDependencies: CUDA 13's takes edge data before the count.
static CUresult update_dependencies(CUstream s, CUgraphNode *deps, size_t count, unsigned int flags) {
#if CUDA_VERSION >= 13000
    return cuStreamUpdateCaptureDependencies(s, deps, nullptr, count, flags);
#else
    return cuStreamUpdateCaptureDependencies(s, deps, count, flags);
#endif
}

static size_t edge_count(CUgraph g) {
    size_t count = 0;
#if CUDA_VERSION >= 13000
    CU(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &count));
#else
    CU(cuGraphGetEdges(g, nullptr, nullptr, &count));
#endif
    return count;
}

// cuGraphInstantiate: CUDA 11's five parameters, CUDA 12's flags.
static CUresult instantiate(CUgraphExec *exec, CUgraph g) {
#if CUDA_VERSION >= 12000
    return cuGraphInstantiate(exec, g, 0);
#else
    return cuGraphInstantiate(exec, g, nullptr, nullptr, 0);
#endif
}

// cuGraphExecUpdate: CUDA 11's two out parameters, CUDA 12's result info.
static CUresult update(CUgraphExec exec, CUgraph g, int *result) {
#if CUDA_VERSION >= 12000
    CUgraphExecUpdateResultInfo info;
    std::memset(&info, 0, sizeof info);
    CUresult r = cuGraphExecUpdate(exec, g, &info);
    *result = (int)info.result;
#else
    CUgraphNode error_node;
    CUgraphExecUpdateResult res = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    CUresult r = cuGraphExecUpdate(exec, g, &error_node, &res);
    *result = (int)res;
#endif
    return r;
}

static CUresult add_dependency(CUgraph g, CUgraphNode from, CUgraphNode to) {
#if CUDA_VERSION >= 13000
    return cuGraphAddDependencies(g, &from, &to, nullptr, 1);
#else
    return cuGraphAddDependencies(g, &from, &to, 1);
#endif
}

static void print_types(const char *what, CUgraph g) {
    size_t count = 0;
    CU(cuGraphGetNodes(g, nullptr, &count));
    std::vector<CUgraphNode> nodes(count);
    CU(cuGraphGetNodes(g, nodes.data(), &count));
    std::printf("%s: %zu nodes, types", what, count);
    for (CUgraphNode node : nodes) {
        CUgraphNodeType type;
        CU(cuGraphNodeGetType(node, &type));
        std::printf(" %d", (int)type);
    }
    std::printf("\n");
}

static float at(CUdeviceptr p, int i) {
    float v = 0;
    CU(cuMemcpyDtoH(&v, p + i * sizeof(float), sizeof v));
    return v;
}

int main() {
    CHECK(cudaFree(0));
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));

    CUmodule module;
    CU(cuModuleLoadData(&module, kPtx));
    CUfunction scale;
    CU(cuModuleGetFunction(&scale, module, "scale"));
    CUfunction acc;
    CHECK(cudaGetFuncBySymbol((cudaFunction_t *)&acc, (const void *)accumulate));

    const int n = 1024;
    std::vector<float> h(n);
    for (int i = 0; i < n; ++i) h[i] = (float)i;
    CUdeviceptr a, b;
    CU(cuMemAlloc(&a, n * sizeof(float)));
    CU(cuMemAlloc(&b, n * sizeof(float)));
    CU(cuMemcpyHtoD(a, h.data(), n * sizeof(float)));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    // --- Capture: a launch of the module's kernel, a copy and a memset.
    CUstreamCaptureStatus status, info_status;
    CU(cuStreamIsCapturing(s, &status));
    std::printf("before the capture: %d\n", (int)status);
    CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU(cuStreamIsCapturing(s, &status));
    CU(capture_info(s, &info_status));
    std::printf("while capturing: %d, capture info %d\n", (int)status, (int)info_status);
    float two = 2.0f;
    unsigned int count = n;
    void *args[] = {&a, &two, &count};
    CU(cuLaunchKernel(scale, n / 128, 1, 1, 128, 1, 1, 0, s, args, nullptr));
    CU(cuMemcpyDtoDAsync(b, a, n * sizeof(float), s));
    CU(cuMemsetD32Async(a, 0, n, s));
    CUgraph captured;
    CU(cuStreamEndCapture(s, &captured));
    CU(cuStreamIsCapturing(s, &status));
    std::printf("after the capture: %d\n", (int)status);
    print_types("captured graph", captured);
    std::printf("nothing ran while capturing: %s\n", yes(at(a, 7) == 7.0f));
    CUgraphExec captured_exec;
    CU(instantiate(&captured_exec, captured));
    CU(cuGraphLaunch(captured_exec, s));
    CU(cuStreamSynchronize(s));
    std::printf("captured graph launched: b[7] = %.1f, a[7] = %.1f\n", at(b, 7), at(a, 7));
    CU(cuMemcpyHtoD(a, h.data(), n * sizeof(float)));
    for (int i = 0; i < 3; ++i) CU(cuGraphLaunch(captured_exec, s));
    CU(cuStreamSynchronize(s));
    std::printf("launched 3 more times: b[7] = %.1f (a was reset once)\n", at(b, 7));

    // --- Misuse of capture.
    CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    std::printf("sync while capturing: %s\n", name_of(cuStreamSynchronize(s)));
    CU(cuStreamIsCapturing(s, &status));
    std::printf("status after it: %d\n", (int)status);
    CUgraph broken = nullptr;
    std::printf("end of the broken capture: %s\n", name_of(cuStreamEndCapture(s, &broken)));
    std::printf("ending a capture never begun: %s\n", name_of(cuStreamEndCapture(s, &broken)));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU(cuThreadExchangeStreamCaptureMode(&mode));
    int was = (int)mode;
    CU(cuThreadExchangeStreamCaptureMode(&mode));
    std::printf("capture mode exchanged: was %d, then %d\n", was, (int)mode);

    // --- A graph built node by node.
    float *pinned = nullptr;
    CU(cuMemAllocHost((void **)&pinned, n * sizeof(float)));
    for (int i = 0; i < n; ++i) pinned[i] = (float)(2 * i);
    CUgraph g;
    CU(cuGraphCreate(&g, 0));
    CUDA_MEMSET_NODE_PARAMS ms;
    std::memset(&ms, 0, sizeof ms);
    ms.dst = b;
    ms.value = 0;
    ms.elementSize = 4;
    ms.width = n;
    ms.height = 1;
    CUgraphNode set_node;
    CU(cuGraphAddMemsetNode(&set_node, g, nullptr, 0, &ms, ctx));
    CUDA_MEMCPY3D cp;
    std::memset(&cp, 0, sizeof cp);
    cp.srcMemoryType = CU_MEMORYTYPE_HOST;
    cp.srcHost = pinned;
    cp.srcPitch = n * sizeof(float);
    cp.srcHeight = 1;
    cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.dstDevice = a;
    cp.dstPitch = n * sizeof(float);
    cp.dstHeight = 1;
    cp.WidthInBytes = n * sizeof(float);
    cp.Height = 1;
    cp.Depth = 1;
    CUgraphNode copy_node;
    CU(cuGraphAddMemcpyNode(&copy_node, g, nullptr, 0, &cp, ctx));
    float three = 3.0f;
    void *scale_args[] = {&a, &three, &count};
    CUDA_KERNEL_NODE_PARAMS kp;
    std::memset(&kp, 0, sizeof kp);
    kp.func = scale;
    kp.gridDimX = n / 128;
    kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = 128;
    kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = scale_args;
    CUgraphNode scale_node;
    CU(cuGraphAddKernelNode(&scale_node, g, &copy_node, 1, &kp));
    int nn = n;
    void *acc_args[] = {&b, &a, &nn};
    CUDA_KERNEL_NODE_PARAMS kp2 = kp;
    kp2.func = acc;
    kp2.kernelParams = acc_args;
    CUgraphNode acc_deps[] = {scale_node, set_node};
    CUgraphNode acc_node;
    CU(cuGraphAddKernelNode(&acc_node, g, acc_deps, 2, &kp2));
    CUgraphNode empty;
    CU(cuGraphAddEmptyNode(&empty, g, nullptr, 0));
    CU(add_dependency(g, acc_node, empty));
    int host_runs = 0;
    CUDA_HOST_NODE_PARAMS hp;
    hp.fn = bump;
    hp.userData = &host_runs;
    CUgraphNode host_node;
    CU(cuGraphAddHostNode(&host_node, g, &empty, 1, &hp));
    print_types("built graph", g);
    size_t roots = 0;
    CU(cuGraphGetRootNodes(g, nullptr, &roots));
    std::printf("root nodes: %zu\n", roots);

    CUDA_KERNEL_NODE_PARAMS got;
    std::memset(&got, 0, sizeof got);
    CU(cuGraphKernelNodeGetParams(scale_node, &got));
    std::printf("scale node: its function %s, grid %u block %u, factor %.1f\n", yes(got.func == scale), got.gridDimX,
                got.blockDimX, *(float *)got.kernelParams[1]);
    CU(cuGraphKernelNodeGetParams(acc_node, &got));
    std::printf("accumulate node: its function %s, n %d\n", yes(got.func == acc), *(int *)got.kernelParams[2]);

    CUgraphExec exec;
    CU(cuGraphInstantiateWithFlags(&exec, g, 0));
    CU(cuGraphUpload(exec, s));
    CU(cuGraphLaunch(exec, s));
    CU(cuStreamSynchronize(s));
    std::printf("launch: b[7] = %.1f, host runs %d\n", at(b, 7), host_runs);

    // Parameters set in the graph do not reach the executable graph; set in it, they do.
    float four = 4.0f, five = 5.0f;
    void *four_args[] = {&a, &four, &count};
    kp.kernelParams = four_args;
    CU(cuGraphKernelNodeSetParams(scale_node, &kp));
    CU(cuGraphLaunch(exec, s));
    CU(cuStreamSynchronize(s));
    std::printf("set in the graph: b[7] = %.1f, host runs %d\n", at(b, 7), host_runs);
    void *five_args[] = {&a, &five, &count};
    kp.kernelParams = five_args;
    CU(cuGraphExecKernelNodeSetParams(exec, scale_node, &kp));
    CU(cuGraphLaunch(exec, s));
    CU(cuStreamSynchronize(s));
    CU(cuGraphKernelNodeGetParams(scale_node, &got));
    std::printf("set in the executable graph: b[7] = %.1f, host runs %d; the graph's factor %.1f\n", at(b, 7),
                host_runs, *(float *)got.kernelParams[1]);

    // A clone, and its node found by the original's.
    CUgraph clone;
    CU(cuGraphClone(&clone, g));
    size_t clone_nodes = 0;
    CU(cuGraphGetNodes(clone, nullptr, &clone_nodes));
    std::printf("clone: %zu nodes\n", clone_nodes);
    CUgraphNode scale_in_clone;
    CU(cuGraphNodeFindInClone(&scale_in_clone, scale_node, clone));
    CU(cuGraphKernelNodeGetParams(scale_in_clone, &got));
    std::printf("the clone's scale node: factor %.1f\n", *(float *)got.kernelParams[1]);

    // An update from the graph (factor 4), then from a graph of another shape.
    int result = -1;
    CUresult r = update(exec, g, &result);
    std::printf("update: %s result %d\n", name_of(r), result);
    CU(cuGraphLaunch(exec, s));
    CU(cuStreamSynchronize(s));
    std::printf("after the update: b[7] = %.1f, host runs %d\n", at(b, 7), host_runs);
    CUgraph small;
    CU(cuGraphCreate(&small, 0));
    CUgraphNode lone;
    CU(cuGraphAddEmptyNode(&lone, small, nullptr, 0));
    r = update(exec, small, &result);
    std::printf("update from a smaller graph: %s result %d\n", name_of(r), result);

    // --- Graphs are the runtime's too.
    CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)s));
    CHECK(cudaStreamSynchronize((cudaStream_t)s));
    std::printf("launched by the runtime: b[7] = %.1f, host runs %d\n", at(b, 7), host_runs);
    CHECK(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeGlobal));
    CU(cuStreamIsCapturing(s, &status));
    CHECK(cudaMemsetAsync((void *)b, 0, n * sizeof(float), (cudaStream_t)s));
    cudaGraph_t runtime_graph;
    CHECK(cudaStreamEndCapture((cudaStream_t)s, &runtime_graph));
    std::printf("a runtime capture seen by the driver: %d\n", (int)status);
    print_types("runtime graph", (CUgraph)runtime_graph);

    // --- Misuse.
    CUgraphNode bad;
    std::printf("a kernel node without parameters: %s\n", name_of(cuGraphAddKernelNode(&bad, g, nullptr, 0, nullptr)));
    std::printf("a dependency of another graph: %s\n", name_of(cuGraphAddEmptyNode(&bad, small, &scale_node, 1)));
    std::printf("kernel parameters of a memset node in the executable graph: %s\n",
                name_of(cuGraphExecKernelNodeSetParams(exec, set_node, &kp)));

    // --- The graph of a capture in progress: its dependency set (cuStreamGetCaptureInfo_v2, and
    // the CUDA 12.3 form's edge data), an empty node added after it and made the stream's
    // dependency (cuStreamUpdateCaptureDependencies), captured work after that.
    CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU(cuMemsetD32Async(a, 0, n, s));
    CUgraph being = nullptr;
    const CUgraphNode *deps = nullptr;
    size_t ndeps = 0;
    CU(capture_graph(s, &info_status, &being, &deps, &ndeps));
    CUgraphNodeType dep_type = CU_GRAPH_NODE_TYPE_EMPTY;
    if (ndeps == 1) CU(cuGraphNodeGetType(deps[0], &dep_type));
    std::printf("capture in progress: status %d, %zu dependency, of type %d\n", (int)info_status, ndeps,
                (int)dep_type);
    CUgraphNode memset_node = ndeps == 1 ? deps[0] : nullptr;
    CUgraph being3 = nullptr;
    const CUgraphNode *deps3 = nullptr;
    const void *edge_data = nullptr;
    size_t ndeps3 = 0;
    CU(capture_graph_edges(s, &info_status, &being3, &deps3, &edge_data, &ndeps3));
    bool default_edge = edge_data != nullptr;
    for (size_t i = 0; default_edge && i < 8; ++i)
        default_edge = ((const unsigned char *)edge_data)[i] == 0;
    std::printf("with edge data: same graph %s, same dependency %s, default edge %s\n", yes(being3 == being),
                yes(ndeps3 == 1 && deps3[0] == memset_node), yes(default_edge));
    CUgraphNode by_hand;
    CU(cuGraphAddEmptyNode(&by_hand, being, deps3, ndeps3));
    CU(update_dependencies(s, &by_hand, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    CU(cuMemsetD32Async(b, 0x3f800000, n, s));
    CUgraph ended = nullptr;
    CU(cuStreamEndCapture(s, &ended));
    size_t ended_nodes = 0;
    CU(cuGraphGetNodes(ended, nullptr, &ended_nodes));
    std::printf("ended graph: the one queried %s, %zu nodes, %zu edges\n", yes(ended == being), ended_nodes,
                edge_count(ended));
    CUgraphExec ended_exec;
    CU(instantiate(&ended_exec, ended));
    CU(cuGraphLaunch(ended_exec, s));
    CU(cuStreamSynchronize(s));
    std::printf("launched: a[7] = %.1f, b[7] = %.1f\n", at(a, 7), at(b, 7));
    std::printf("update without a capture: %s\n",
                name_of(update_dependencies(s, nullptr, 0, CU_STREAM_ADD_CAPTURE_DEPENDENCIES)));
    CU(cuGraphExecDestroy(ended_exec));
    CU(cuGraphDestroy(ended));

    CU(cuGraphExecDestroy(exec));
    CU(cuGraphExecDestroy(captured_exec));
    CU(cuGraphDestroy(g));
    CU(cuGraphDestroy(clone));
    CU(cuGraphDestroy(small));
    CU(cuGraphDestroy(captured));
    CHECK(cudaGraphDestroy(runtime_graph));
    CU(cuMemFreeHost(pinned));
    CU(cuMemFree(a));
    CU(cuMemFree(b));
    CU(cuStreamDestroy(s));
    CU(cuModuleUnload(module));
    std::printf("done\n");
    return 0;
}
