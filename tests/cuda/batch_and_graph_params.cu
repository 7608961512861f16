// Runtime calls of CUDA 12 and 13 around copies and graphs: batched copies
// (cudaMemcpyBatchAsync with attribute ranges, cudaMemcpy3DBatchAsync between pitched
// pointers and a CUDA array), instantiation with a cudaGraphInstantiateParams (upload
// stream, result), copy nodes to and from a __device__ symbol re-pointed in the graph and in
// the executable graph, the ids of graphs, executable graphs and nodes, a host function
// launched with cudaLaunchHostFunc_v2 and the widest 1D linear texture; then CUDA's answers to
// misuse: a batch with a bad entry (and its failIdx), a batch on the legacy stream, bad
// attributes, a second instantiation of a graph whose allocation node is live, symbol ranges
// past the variable.
#include "check.h"

#include <cstring>
#include <dlfcn.h>

// A runtime function newer than the headers or the libraries the program is built with, found
// in the runtime it runs on.
#define RUNTIME_FUNCTION_AS(local, name, params, args)                                             \
    static cudaError_t local params {                                                              \
        typedef cudaError_t(*fn_t) params;                                                         \
        static fn_t found_ = (fn_t)dlsym(RTLD_DEFAULT, #name);                                     \
        return found_ ? found_ args : cudaErrorNotSupported;                                       \
    }
#define RUNTIME_FUNCTION(name, params, args) RUNTIME_FUNCTION_AS(name, name, params, args)

#if CUDART_VERSION < 12000
// What CUDA 12's headers declare (driver_types.h, cuda_runtime_api.h of CUDA 12.9).
typedef enum cudaGraphInstantiateResult {
    cudaGraphInstantiateSuccess = 0,
    cudaGraphInstantiateError = 1,
    cudaGraphInstantiateInvalidStructure = 2,
    cudaGraphInstantiateNodeOperationNotSupported = 3,
    cudaGraphInstantiateMultipleDevicesNotSupported = 4
} cudaGraphInstantiateResult;
typedef struct cudaGraphInstantiateParams_st {
    unsigned long long flags;
    cudaStream_t uploadStream;
    cudaGraphNode_t errNode_out;
    cudaGraphInstantiateResult result_out;
} cudaGraphInstantiateParams;
enum { cudaGraphInstantiateFlagUpload = 2 };
RUNTIME_FUNCTION(cudaGraphInstantiateWithParams,
                 (cudaGraphExec_t * pGraphExec, cudaGraph_t graph, cudaGraphInstantiateParams *instantiateParams),
                 (pGraphExec, graph, instantiateParams))
#endif

#if CUDART_VERSION < 12080
// CUDA 12.8's batched copies (driver_types.h and cuda_runtime_api.h of CUDA 12.9).
enum cudaMemcpySrcAccessOrder {
    cudaMemcpySrcAccessOrderInvalid = 0x0,
    cudaMemcpySrcAccessOrderStream = 0x1,
    cudaMemcpySrcAccessOrderDuringApiCall = 0x2,
    cudaMemcpySrcAccessOrderAny = 0x3,
    cudaMemcpySrcAccessOrderMax = 0x7FFFFFFF
};
struct cudaMemcpyAttributes {
    enum cudaMemcpySrcAccessOrder srcAccessOrder;
    struct cudaMemLocation srcLocHint;
    struct cudaMemLocation dstLocHint;
    unsigned int flags;
};
enum cudaMemcpy3DOperandType {
    cudaMemcpyOperandTypePointer = 0x1,
    cudaMemcpyOperandTypeArray = 0x2,
    cudaMemcpyOperandTypeMax = 0x7FFFFFFF
};
struct cudaOffset3D {
    size_t x;
    size_t y;
    size_t z;
};
struct cudaMemcpy3DOperand {
    enum cudaMemcpy3DOperandType type;
    union {
        struct {
            void *ptr;
            size_t rowLength;
            size_t layerHeight;
            struct cudaMemLocation locHint;
        } ptr;
        struct {
            cudaArray_t array;
            struct cudaOffset3D offset;
        } array;
    } op;
};
struct cudaMemcpy3DBatchOp {
    struct cudaMemcpy3DOperand src;
    struct cudaMemcpy3DOperand dst;
    struct cudaExtent extent;
    enum cudaMemcpySrcAccessOrder srcAccessOrder;
    unsigned int flags;
};
RUNTIME_FUNCTION(cudaMemcpyBatchAsync,
                 (void **dsts, void **srcs, size_t *sizes, size_t count, struct cudaMemcpyAttributes *attrs,
                  size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, cudaStream_t stream),
                 (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream))
RUNTIME_FUNCTION(cudaMemcpy3DBatchAsync,
                 (size_t numOps, struct cudaMemcpy3DBatchOp *opList, size_t *failIdx, unsigned long long flags,
                  cudaStream_t stream),
                 (numOps, opList, failIdx, flags, stream))
#endif

// CUDA 13's (its later releases), under names of this program's.
RUNTIME_FUNCTION_AS(graph_get_id, cudaGraphGetId, (cudaGraph_t hGraph, unsigned int *graphID), (hGraph, graphID))
RUNTIME_FUNCTION_AS(graph_exec_get_id, cudaGraphExecGetId, (cudaGraphExec_t hGraphExec, unsigned int *graphID),
                    (hGraphExec, graphID))
RUNTIME_FUNCTION_AS(graph_node_get_local_id, cudaGraphNodeGetLocalId, (cudaGraphNode_t hNode, unsigned int *nodeId),
                    (hNode, nodeId))
RUNTIME_FUNCTION_AS(graph_node_get_tools_id, cudaGraphNodeGetToolsId,
                    (cudaGraphNode_t hNode, unsigned long long *toolsNodeId), (hNode, toolsNodeId))
RUNTIME_FUNCTION_AS(launch_host_func_v2, cudaLaunchHostFunc_v2,
                    (cudaStream_t stream, cudaHostFn_t fn, void *userData, unsigned int syncMode),
                    (stream, fn, userData, syncMode))
// CUDA 12's, which 11.8 lacks.
RUNTIME_FUNCTION_AS(graph_exec_get_flags, cudaGraphExecGetFlags, (cudaGraphExec_t graphExec, unsigned long long *flags),
                    (graphExec, flags))

// CUDA 13 dropped the batches' failIdx: where the ABI has it, a wrong index is printed.
#if CUDART_VERSION >= 13000
#define BATCH(d, s, z, c, a, i, n, fail, st) cudaMemcpyBatchAsync(d, s, z, c, a, i, n, st)
#define BATCH_3D(n, ops, fail, fl, st) cudaMemcpy3DBatchAsync(n, ops, fl, st)
#define EXPECT_FAIL_IDX(fail, want)
#else
#define BATCH(d, s, z, c, a, i, n, fail, st) cudaMemcpyBatchAsync(d, s, z, c, a, i, n, fail, st)
#define BATCH_3D(n, ops, fail, fl, st) cudaMemcpy3DBatchAsync(n, ops, fail, fl, st)
#define EXPECT_FAIL_IDX(fail, want)                                                                 \
    do {                                                                                            \
        if ((fail) != (size_t)(want)) printf("failIdx %zu, expected %zu\n", (size_t)(fail), (size_t)(want)); \
    } while (0)
#endif

static const char *yes(bool b) { return b ? "yes" : "no"; }

__device__ int sym[16];

__global__ void fill(int *data, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = base + i;
}

static long long weighted(const int *h, int n) {
    long long s = 0;
    for (int i = 0; i < n; i++) s += (long long)h[i] * (i % 5 + 1);
    return s;
}

static cudaMemcpyAttributes attributes(cudaMemcpySrcAccessOrder order) {
    cudaMemcpyAttributes a;
    memset(&a, 0, sizeof(a));
    a.srcAccessOrder = order;
    return a;
}

static void batches(cudaStream_t stream) {
    const int n = 256;
    static int h[3][n], back[3][n];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n; i++) h[k][i] = k * 1000 + i;
    int *d[3];
    for (int k = 0; k < 3; k++) CHECK(cudaMalloc(&d[k], n * sizeof(int)));

    // Host to device, one attribute for all three.
    void *dsts[3] = {d[0], d[1], d[2]};
    void *srcs[3] = {h[0], h[1], h[2]};
    size_t sizes[3] = {n * sizeof(int), n * sizeof(int), 100 * sizeof(int)};
    cudaMemcpyAttributes attrs[2] = {attributes(cudaMemcpySrcAccessOrderStream),
                                     attributes(cudaMemcpySrcAccessOrderDuringApiCall)};
    size_t idxs[2] = {0, 2};
    size_t fail = 12345;
    CHECK(BATCH(dsts, srcs, sizes, 3, attrs, idxs, 1, &fail, stream));
    // Back to the host, two attribute ranges (copies 0-1, then 2).
    void *to_host[3] = {back[0], back[1], back[2]};
    void *from_dev[3] = {d[0], d[1], d[2]};
    memset(back, 0, sizeof(back));
    CHECK(BATCH(to_host, from_dev, sizes, 3, attrs, idxs, 2, &fail, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("batch: copies back %lld %lld %lld (third: %d copied, then %d)\n", weighted(back[0], n),
           weighted(back[1], n), weighted(back[2], 100), back[2][99], back[2][100]);

    // Device to device in one batch.
    void *dd[2] = {d[1], d[2]};
    void *ds[2] = {d[0], d[0]};
    size_t dz[2] = {n * sizeof(int), 16 * sizeof(int)};
    CHECK(BATCH(dd, ds, dz, 2, attrs, idxs, 1, &fail, stream));
    CHECK(cudaMemcpyAsync(back[1], d[1], n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(back[2], d[2], n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("batch on the device: %lld, first 16 of the other %lld then %d\n", weighted(back[1], n),
           weighted(back[2], 16), back[2][16]);

    // Misuse: a null destination at index 2 (failIdx 2).
    CHECK(cudaMemset(d[0], 0, n * sizeof(int)));
    void *bad_dsts[3] = {d[0], d[1], nullptr};
    fail = 12345;
    cudaError_t r = BATCH(bad_dsts, srcs, sizes, 3, attrs, idxs, 1, &fail, stream);
    printf("batch with a null destination: %s\n", cudaGetErrorName(r));
    EXPECT_FAIL_IDX(fail, 2);
    cudaGetLastError();
    r = BATCH(dsts, srcs, sizes, 3, attrs, idxs, 1, &fail, (cudaStream_t)0);
    printf("batch on the legacy stream: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    cudaMemcpyAttributes invalid[1] = {attributes(cudaMemcpySrcAccessOrderInvalid)};
    r = BATCH(dsts, srcs, sizes, 3, invalid, idxs, 1, &fail, stream);
    printf("batch with an invalid source access order: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    size_t late[1] = {1};
    r = BATCH(dsts, srcs, sizes, 3, attrs, late, 1, &fail, stream);
    printf("batch whose attributes start at copy 1: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    r = BATCH(dsts, srcs, sizes, 3, attrs, idxs, 4, &fail, stream);
    printf("batch with more attributes than copies: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    // (Whether a refused batch ran some of its copies is not documented: CUDA 13's refused
    // batches above left d[0] written, Phos checks a whole batch before any copy. Not printed.)
    CHECK(cudaStreamSynchronize(stream));
    for (int k = 0; k < 3; k++) CHECK(cudaFree(d[k]));
}

static void batches_3d(cudaStream_t stream) {
    // A 24x10 block of bytes from a host image 32 bytes wide into a pitched allocation, and a
    // 16x8 float array filled from the host and read back into a 20-float-wide host image.
    const int hw = 32, hh = 12;
    static unsigned char image[hh][hw], out[hh][hw];
    for (int y = 0; y < hh; y++)
        for (int x = 0; x < hw; x++) image[y][x] = (unsigned char)(y * 7 + x);
    unsigned char *pitched;
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&pitched, &pitch, 24, 10));
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaArray_t array;
    CHECK(cudaMallocArray(&array, &desc, 16, 8));
    static float floats[8][16], wide[8][20];
    for (int y = 0; y < 8; y++)
        for (int x = 0; x < 16; x++) floats[y][x] = y * 16 + x + 0.5f;

    cudaMemcpy3DBatchOp ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].src.type = cudaMemcpyOperandTypePointer;
    ops[0].src.op.ptr.ptr = &image[1][2];
    ops[0].src.op.ptr.rowLength = hw;
    ops[0].dst.type = cudaMemcpyOperandTypePointer;
    ops[0].dst.op.ptr.ptr = pitched;
    ops[0].dst.op.ptr.rowLength = pitch;
    ops[0].extent = make_cudaExtent(24, 10, 1);
    ops[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    ops[1].src.type = cudaMemcpyOperandTypePointer;
    ops[1].src.op.ptr.ptr = floats;
    ops[1].dst.type = cudaMemcpyOperandTypeArray;
    ops[1].dst.op.array.array = array;
    ops[1].extent = make_cudaExtent(16, 8, 1);
    ops[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t fail = 12345;
    CHECK(BATCH_3D(2, ops, &fail, 0, stream));

    // Back: the pitched block into `out` at (3, 1), the array's rows 2-7 from column 4 into
    // `wide`.
    memset(out, 0, sizeof(out));
    memset(wide, 0, sizeof(wide));
    cudaMemcpy3DBatchOp back[2];
    memset(back, 0, sizeof(back));
    back[0].src.type = cudaMemcpyOperandTypePointer;
    back[0].src.op.ptr.ptr = pitched;
    back[0].src.op.ptr.rowLength = pitch;
    back[0].dst.type = cudaMemcpyOperandTypePointer;
    back[0].dst.op.ptr.ptr = &out[1][3];
    back[0].dst.op.ptr.rowLength = hw;
    back[0].extent = make_cudaExtent(24, 10, 1);
    back[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    back[1].src.type = cudaMemcpyOperandTypeArray;
    back[1].src.op.array.array = array;
    back[1].src.op.array.offset.x = 4;
    back[1].src.op.array.offset.y = 2;
    back[1].dst.type = cudaMemcpyOperandTypePointer;
    back[1].dst.op.ptr.ptr = wide;
    back[1].dst.op.ptr.rowLength = 20;
    back[1].extent = make_cudaExtent(12, 6, 1);
    back[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    CHECK(BATCH_3D(2, back, &fail, 0, stream));
    CHECK(cudaStreamSynchronize(stream));
    long long s = 0;
    for (int y = 0; y < hh; y++)
        for (int x = 0; x < hw; x++) s += out[y][x] * (x + 1);
    printf("3D batch: pitched block %lld, out[1][3] %d out[10][26] %d out[11][27] %d\n", s, out[1][3], out[10][26],
           out[11][27]);
    printf("3D batch: array rows wide[0][0] %.1f wide[5][11] %.1f wide[5][12] %.1f\n", wide[0][0], wide[5][11],
           wide[5][12]);

    // Misuse: an empty extent in the second operation; flags.
    back[1].extent = make_cudaExtent(0, 6, 1);
    fail = 12345;
    cudaError_t r = BATCH_3D(2, back, &fail, 0, stream);
    printf("3D batch with an empty extent: %s\n", cudaGetErrorName(r));
    EXPECT_FAIL_IDX(fail, 1);
    cudaGetLastError();
    back[1].extent = make_cudaExtent(12, 6, 1);
    r = BATCH_3D(2, back, &fail, 1, stream);
    printf("3D batch with flags: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    back[0].src.op.ptr.rowLength = 8;
    r = BATCH_3D(2, back, &fail, 0, stream);
    printf("3D batch with rows shorter than the extent: %s\n", cudaGetErrorName(r));
    EXPECT_FAIL_IDX(fail, 0);
    cudaGetLastError();
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaFreeArray(array));
    CHECK(cudaFree(pitched));
}

static void instantiate_with_params(cudaStream_t stream) {
    const int n = 512;
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    int count = n, base = 7;
    void *args[] = {&d, &count, &base};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)fill;
    kp.gridDim = dim3(n / 128);
    kp.blockDim = dim3(128);
    kp.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, nullptr, 0, &kp));

    cudaGraphInstantiateParams p;
    memset(&p, 0, sizeof(p));
    p.flags = cudaGraphInstantiateFlagUpload;
    p.uploadStream = stream;
    p.result_out = cudaGraphInstantiateError;
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithParams(&exec, g, &p));
    printf("instantiated with an upload: result %d\n", (int)p.result_out);
    unsigned long long flags = 99;
    CHECK(graph_exec_get_flags(exec, &flags));
    printf("executable graph's flags: %llu\n", flags);
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    static int h[n];
    CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    printf("launched: %lld\n", weighted(h, n));

    // Ids (CUDA 13.1's functions): unique, and the same each time they are asked for. A runtime
    // without them (CUDA 13.0's answers cudaErrorNotSupported) prints the same line, so the
    // output does not depend on the runtime's minor version; wrong ids print what is wrong.
    cudaGraph_t g2;
    CHECK(cudaGraphCreate(&g2, 0));
    cudaGraphNode_t e1, e2, e3;
    CHECK(cudaGraphAddEmptyNode(&e1, g2, nullptr, 0));
    CHECK(cudaGraphAddEmptyNode(&e2, g2, &e1, 1));
    unsigned int id1, id2, id1b, exec_id, l1, l2, l1b, l3;
    cudaError_t have = graph_get_id(g, &id1);
    cudaGetLastError();
    if (have == cudaErrorNotSupported) {
        printf("graph and node ids: as documented, or not in this runtime\n");
    } else {
        CHECK(have);
        CHECK(graph_get_id(g2, &id2));
        CHECK(graph_get_id(g, &id1b));
        CHECK(graph_exec_get_id(exec, &exec_id));
        CHECK(graph_node_get_local_id(e1, &l1));
        CHECK(graph_node_get_local_id(e2, &l2));
        CHECK(graph_node_get_local_id(e1, &l1b));
        CHECK(cudaGraphAddEmptyNode(&e3, g2, &e2, 1));
        CHECK(graph_node_get_local_id(e3, &l3));
        unsigned long long t1, t2, t0;
        CHECK(graph_node_get_tools_id(e1, &t1));
        CHECK(graph_node_get_tools_id(e2, &t2));
        CHECK(graph_node_get_tools_id(node, &t0));
        cudaError_t null_graph = graph_get_id(g, nullptr);
        cudaGetLastError();
        cudaError_t null_node = graph_node_get_local_id(e1, nullptr);
        cudaGetLastError();
        bool graphs_ok = id1 != id2 && id1 == id1b;
        bool nodes_ok = l1 != l2 && l3 != l1 && l3 != l2 && l1 == l1b;
        bool tools_ok = t1 != t2 && t0 != t1 && t0 != t2;
        bool nulls_ok = null_graph == cudaErrorInvalidValue && null_node == cudaErrorInvalidValue;
        if (graphs_ok && nodes_ok && tools_ok && nulls_ok) {
            printf("graph and node ids: as documented, or not in this runtime\n");
        } else {
            printf("graph ids distinct and stable %s, node local ids %s, tools ids %s, null outs %s / %s\n",
                   yes(graphs_ok), yes(nodes_ok), yes(tools_ok), cudaGetErrorName(null_graph),
                   cudaGetErrorName(null_node));
        }
    }
    cudaGraphExec_t none;
    printf("null parameters: %s\n", cudaGetErrorName(cudaGraphInstantiateWithParams(&none, g, nullptr)));
    cudaGetLastError();
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // A graph with an allocation node: one executable graph of it at a time.
    cudaGraph_t mg;
    CHECK(cudaGraphCreate(&mg, 0));
    cudaMemAllocNodeParams ap;
    memset(&ap, 0, sizeof(ap));
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = 1 << 20;
    cudaGraphNode_t alloc;
    CHECK(cudaGraphAddMemAllocNode(&alloc, mg, nullptr, 0, &ap));
    cudaGraphNode_t free_node;
    CHECK(cudaGraphAddMemFreeNode(&free_node, mg, &alloc, 1, ap.dptr));
    cudaGraphExec_t first, second;
    memset(&p, 0, sizeof(p));
    CHECK(cudaGraphInstantiateWithParams(&first, mg, &p));
    printf("memory graph instantiated: result %d\n", (int)p.result_out);
    memset(&p, 0, sizeof(p));
    cudaError_t r = cudaGraphInstantiateWithParams(&second, mg, &p);
    printf("second instantiation refused: %s, result says so %s\n", yes(r != cudaSuccess),
           yes(p.result_out != cudaGraphInstantiateSuccess));
    cudaGetLastError();
    CHECK(cudaGraphLaunch(first, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaGraphExecDestroy(first));
    CHECK(cudaGraphDestroy(mg));
    CHECK(cudaFree(d));
}

static void symbol_nodes(cudaStream_t stream) {
    static int a[16], b[16], c[16], back[16];
    for (int i = 0; i < 16; i++) {
        a[i] = 100 + i;
        b[i] = 200 + i;
        c[i] = 300 + i;
    }
    int zero[16] = {};
    CHECK(cudaMemcpyToSymbol(sym, zero, sizeof(zero)));
    int *dev;
    CHECK(cudaMalloc(&dev, 16 * sizeof(int)));
    CHECK(cudaMemset(dev, 0, 16 * sizeof(int)));

    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t to, from;
    CHECK(cudaGraphAddMemcpyNodeToSymbol(&to, g, nullptr, 0, sym, a, 16 * sizeof(int), 0, cudaMemcpyHostToDevice));
    CHECK(cudaGraphAddMemcpyNodeFromSymbol(&from, g, &to, 1, dev, sym, 16 * sizeof(int), 0,
                                           cudaMemcpyDeviceToDevice));
    // Re-pointed in the graph: 8 ints of b at element 4; the copy out reads 12 ints from
    // element 2 of the symbol.
    CHECK(cudaGraphMemcpyNodeSetParamsToSymbol(to, sym, b, 8 * sizeof(int), 4 * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaGraphMemcpyNodeSetParamsFromSymbol(from, dev, sym, 12 * sizeof(int), 2 * sizeof(int),
                                                 cudaMemcpyDeviceToDevice));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpyFromSymbol(back, sym, sizeof(back)));
    printf("symbol after the graph: %lld (sym[3] %d sym[4] %d sym[11] %d sym[12] %d)\n", weighted(back, 16), back[3],
           back[4], back[11], back[12]);
    CHECK(cudaMemcpy(back, dev, sizeof(back), cudaMemcpyDeviceToHost));
    printf("copied out of it: %lld\n", weighted(back, 16));

    // Re-pointed in the executable graph: all of c, and the copy out from element 0.
    CHECK(cudaGraphExecMemcpyNodeSetParamsToSymbol(exec, to, sym, c, 16 * sizeof(int), 0, cudaMemcpyHostToDevice));
    CHECK(cudaGraphExecMemcpyNodeSetParamsFromSymbol(exec, from, dev, sym, 12 * sizeof(int), 0,
                                                     cudaMemcpyDeviceToDevice));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpyFromSymbol(back, sym, sizeof(back)));
    printf("symbol after the executable graph: %lld\n", weighted(back, 16));
    CHECK(cudaMemcpy(back, dev, sizeof(back), cudaMemcpyDeviceToHost));
    printf("copied out of it: %lld\n", weighted(back, 16));

    // Misuse: past the variable's end, and a direction the node cannot have.
    cudaError_t r = cudaGraphMemcpyNodeSetParamsToSymbol(to, sym, a, 16 * sizeof(int), 4, cudaMemcpyHostToDevice);
    printf("range past the symbol: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    r = cudaGraphExecMemcpyNodeSetParamsFromSymbol(exec, from, dev, sym, 4, 16 * sizeof(int), cudaMemcpyDeviceToDevice);
    printf("offset past the symbol: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    r = cudaGraphMemcpyNodeSetParamsToSymbol(to, sym, a, 4, 0, cudaMemcpyDeviceToHost);
    printf("to a symbol from the device to the host: %s\n", cudaGetErrorName(r));
    cudaGetLastError();
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(dev));
}

static void host_function(void *p) { *(int *)p += 1; }

static void host_func_and_texture_width(cudaStream_t stream) {
    // cudaLaunchHostFunc_v2 is a later runtime's (CUDA 13.0's answers cudaErrorNotSupported):
    // the line is the same either way, wrong counts print what they are.
    int calls = 0;
    cudaError_t have = launch_host_func_v2(stream, host_function, &calls, 0);
    cudaGetLastError();
    if (have == cudaErrorNotSupported) {
        printf("host functions run: as documented, or not in this runtime\n");
    } else {
        CHECK(have);
        CHECK(launch_host_func_v2(stream, host_function, &calls, 0));
        CHECK(cudaStreamSynchronize(stream));
        if (calls == 2) printf("host functions run: as documented, or not in this runtime\n");
        else printf("host functions run: %d\n", calls);
    }

    size_t w1 = 0, w4 = 0;
    cudaChannelFormatDesc f1 = cudaCreateChannelDesc<float>();
    cudaChannelFormatDesc u4 = cudaCreateChannelDesc<uchar4>();
    CHECK(cudaDeviceGetTexture1DLinearMaxWidth(&w1, &f1, 0));
    CHECK(cudaDeviceGetTexture1DLinearMaxWidth(&w4, &u4, 0));
    printf("1D linear texture widths: at least 2^27 %s\n", yes(w1 >= (1u << 27) && w4 >= (1u << 27)));
    printf("width of a null format: %s\n", cudaGetErrorName(cudaDeviceGetTexture1DLinearMaxWidth(&w1, nullptr, 0)));
    cudaGetLastError();
    printf("width on device 64: %s\n", cudaGetErrorName(cudaDeviceGetTexture1DLinearMaxWidth(&w1, &f1, 64)));
    cudaGetLastError();
}

int main() {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    batches(stream);
    batches_3d(stream);
    instantiate_with_params(stream);
    symbol_nodes(stream);
    host_func_and_texture_width(stream);
    CHECK(cudaStreamDestroy(stream));
    printf("done\n");
    return 0;
}
