// Needs CUDA 12.2 (the node-params structs): tests/e2e/programs.rs lists it in NEEDS_NEWER_CUDA.
// Graph nodes made and changed from a node-params struct, through both APIs (linked with
// -lcuda): cudaGraphAddNode of memset, kernel, copy and host nodes, cudaGraphNodeSetParams in
// the graph and cudaGraphExecNodeSetParams in the executable graph; cuGraphAddNode of a
// module's kernel and a copy, cuGraphNodeSetParams and cuGraphExecNodeSetParams; the errors
// for a missing struct. Checks its own results; prints only what CUDA determines.
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

// out[i] += v.
__global__ void add_value(float *out, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += v;
}

static void CUDART_CB bump(void *count) { ++*(int *)count; }

// cudaGraphAddNode and cuGraphAddNode took edge data in CUDA 13.
static cudaError_t add_node(cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps, size_t n,
                            cudaGraphNodeParams *p) {
#if CUDART_VERSION >= 13000
    return cudaGraphAddNode(node, g, deps, nullptr, n, p);
#else
    return cudaGraphAddNode(node, g, deps, n, p);
#endif
}

static CUresult cu_add_node(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, CUgraphNodeParams *p) {
#if CUDA_VERSION >= 13000
    return cuGraphAddNode(node, g, deps, nullptr, n, p);
#else
    return cuGraphAddNode(node, g, deps, n, p);
#endif
}

int main() {
    const int n = 512;
    float *a = nullptr;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    std::vector<float> h(n);

    // --- The runtime: memset, then a kernel, then a host node.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    // cudaGraphNodeParams has no default constructor in CUDA 13's C++ headers (its union
    // holds members that have constructors): zeroed storage of its size instead.
    union NodeParams {
        cudaGraphNodeParams p;
        unsigned char bytes[sizeof(cudaGraphNodeParams)];
        NodeParams() { std::memset(bytes, 0, sizeof bytes); }
        ~NodeParams() {}
    } storage;
    cudaGraphNodeParams &p = storage.p;
    p.type = cudaGraphNodeTypeMemset;
    p.memset.dst = a;
    p.memset.value = 0;
    p.memset.elementSize = 4;
    p.memset.width = n;
    p.memset.height = 1;
    cudaGraphNode_t set_node;
    CHECK(add_node(&set_node, g, nullptr, 0, &p));
    float v = 1.5f;
    int count = n;
    void *args[] = {&a, &v, &count};
    std::memset(&p, 0, sizeof p);
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = (void *)add_value;
    p.kernel.gridDim = dim3(n / 128);
    p.kernel.blockDim = dim3(128);
    p.kernel.kernelParams = args;
    cudaGraphNode_t kernel_node;
    CHECK(add_node(&kernel_node, g, &set_node, 1, &p));
    int host_runs = 0;
    std::memset(&p, 0, sizeof p);
    p.type = cudaGraphNodeTypeHost;
    p.host.fn = bump;
    p.host.userData = &host_runs;
    cudaGraphNode_t host_node;
    CHECK(add_node(&host_node, g, &kernel_node, 1, &p));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMemcpy(h.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("runtime graph: %zu nodes, a[7] = %.1f, host runs %d\n", nodes, h[7], host_runs);

    // The kernel's value set in the graph (2.5: not the executable graph's), then in the
    // executable graph (4.0).
    std::memset(&p, 0, sizeof p);
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = (void *)add_value;
    p.kernel.gridDim = dim3(n / 128);
    p.kernel.blockDim = dim3(128);
    p.kernel.kernelParams = args;
    v = 2.5f;
    CHECK(cudaGraphNodeSetParams(kernel_node, &p));
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMemcpy(h.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("set in the graph: a[7] = %.1f, host runs %d\n", h[7], host_runs);
    v = 4.0f;
    CHECK(cudaGraphExecNodeSetParams(exec, kernel_node, &p));
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMemcpy(h.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaKernelNodeParams got;
    CHECK(cudaGraphKernelNodeGetParams(kernel_node, &got));
    std::printf("set in the executable graph: a[7] = %.1f, host runs %d; the graph's value %.1f\n", h[7], host_runs,
                *(float *)got.kernelParams[1]);
    cudaGraphNode_t bad;
    std::printf("a node without parameters: %s\n", cudaGetErrorName(add_node(&bad, g, nullptr, 0, nullptr)));

    // --- The driver: a copy from page-locked memory, then a module's kernel.
    CU(cuInit(0));
    CUmodule module;
    CU(cuModuleLoadData(&module, kPtx));
    CUfunction scale;
    CU(cuModuleGetFunction(&scale, module, "scale"));
    float *pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
    for (int i = 0; i < n; ++i) pinned[i] = (float)i;
    CUgraph dg;
    CU(cuGraphCreate(&dg, 0));
    CUgraphNodeParams dp;
    std::memset(&dp, 0, sizeof dp);
    dp.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    CUDA_MEMCPY3D &c = dp.memcpy.copyParams;
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = pinned;
    c.srcPitch = n * sizeof(float);
    c.srcHeight = 1;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = (CUdeviceptr)a;
    c.dstPitch = n * sizeof(float);
    c.dstHeight = 1;
    c.WidthInBytes = n * sizeof(float);
    c.Height = 1;
    c.Depth = 1;
    CUgraphNode copy_node;
    CU(cu_add_node(&copy_node, dg, nullptr, 0, &dp));
    float factor = 3.0f;
    unsigned int un = n;
    CUdeviceptr da = (CUdeviceptr)a;
    void *scale_args[] = {&da, &factor, &un};
    std::memset(&dp, 0, sizeof dp);
    dp.type = CU_GRAPH_NODE_TYPE_KERNEL;
    dp.kernel.func = scale;
    dp.kernel.gridDimX = n / 128;
    dp.kernel.gridDimY = dp.kernel.gridDimZ = 1;
    dp.kernel.blockDimX = 128;
    dp.kernel.blockDimY = dp.kernel.blockDimZ = 1;
    dp.kernel.kernelParams = scale_args;
    CUgraphNode scale_node;
    CU(cu_add_node(&scale_node, dg, &copy_node, 1, &dp));
    CUgraphExec dexec;
    CU(cuGraphInstantiateWithFlags(&dexec, dg, 0));
    CU(cuGraphLaunch(dexec, nullptr));
    CU(cuStreamSynchronize(nullptr));
    CHECK(cudaMemcpy(h.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("driver graph: a[7] = %.1f\n", h[7]);
    factor = 5.0f;
    CU(cuGraphExecNodeSetParams(dexec, scale_node, &dp));
    factor = 7.0f;
    CU(cuGraphNodeSetParams(scale_node, &dp));
    CU(cuGraphLaunch(dexec, nullptr));
    CU(cuStreamSynchronize(nullptr));
    CHECK(cudaMemcpy(h.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_KERNEL_NODE_PARAMS dgot;
    std::memset(&dgot, 0, sizeof dgot);
    CU(cuGraphKernelNodeGetParams(scale_node, &dgot));
    std::printf("driver set: a[7] = %.1f; the graph's factor %.1f, its function %s\n", h[7],
                *(float *)dgot.kernelParams[1], yes(dgot.func == scale));
    CUgraphNode dbad;
    std::printf("a driver node without parameters: %s\n", name_of(cu_add_node(&dbad, dg, nullptr, 0, nullptr)));

    CU(cuGraphExecDestroy(dexec));
    CU(cuGraphDestroy(dg));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(a));
    CU(cuModuleUnload(module));
    std::printf("done\n");
    return 0;
}
