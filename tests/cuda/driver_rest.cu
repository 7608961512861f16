// More of the driver API (linked with -lcuda): a graph's copy node read and set in the graph
// (cuGraphMemcpyNodeGetParams, cuGraphMemcpyNodeSetParams) and in the executable graph
// (cuGraphExecMemcpyNodeSetParams), user objects shared by the driver and the runtime
// (cuUserObjectCreate, Retain, Release, cuGraphRetainUserObject, cuGraphReleaseUserObject with
// graphs of either API), the profiler's start and stop, cuCtxResetPersistingL2Cache,
// cuFlushGPUDirectRDMAWrites, the execution affinity queries, and the driver's errors for misuse.
// Checks its own results; prints only what CUDA determines.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <unistd.h>
#include <vector>
#include <cuda.h>
#include <cudaProfiler.h>
#include "driver_check.h"

static const char *yes(bool b) { return b ? "yes" : "no"; }

static void CUDA_CB destroy_object(void *p) { static_cast<std::atomic<int> *>(p)->fetch_add(1); }

// Destructors run asynchronously: wait (up to 10 s) for `value` runs.
static int wait_for(std::atomic<int> &runs, int value) {
    for (int i = 0; i < 10000 && runs.load() < value; i++) usleep(1000);
    return runs.load();
}

// A copy of `bytes` in one row from device memory at `src` to device memory at `dst`.
static CUDA_MEMCPY3D device_copy(CUdeviceptr src, CUdeviceptr dst, size_t bytes) {
    CUDA_MEMCPY3D p;
    std::memset(&p, 0, sizeof p);
    p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = src;
    p.srcPitch = bytes;
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = dst;
    p.dstPitch = bytes;
    p.WidthInBytes = bytes;
    p.Height = 1;
    p.Depth = 1;
    return p;
}

// Where a side of a copy is, whichever memory type names it.
static uintptr_t source_of(const CUDA_MEMCPY3D &p) {
    return p.srcMemoryType == CU_MEMORYTYPE_HOST ? (uintptr_t)p.srcHost : (uintptr_t)p.srcDevice;
}
static uintptr_t destination_of(const CUDA_MEMCPY3D &p) {
    return p.dstMemoryType == CU_MEMORYTYPE_HOST ? (uintptr_t)p.dstHost : (uintptr_t)p.dstDevice;
}

// Whether the `n` floats at device address `d` are `want`.
static bool holds(CUdeviceptr d, const std::vector<float> &want) {
    std::vector<float> got(want.size());
    CU(cuMemcpyDtoH(got.data(), d, want.size() * sizeof(float)));
    return std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0;
}

static void launch(CUgraphExec exec, CUstream s) {
    CU(cuGraphLaunch(exec, s));
    CU(cuStreamSynchronize(s));
}

int main() {
    CHECK(cudaFree(0));
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    const int n = 256;
    const size_t bytes = n * sizeof(float);
    std::vector<float> h(n), zero(n, 0.0f);
    for (int i = 0; i < n; ++i) h[i] = 1.5f * (float)i;
    CUdeviceptr a, b, c;
    CU(cuMemAlloc(&a, bytes));
    CU(cuMemAlloc(&b, bytes));
    CU(cuMemAlloc(&c, bytes));
    CU(cuMemsetD32(a, 0, n));
    CU(cuMemsetD32(b, 0, n));
    CU(cuMemsetD32(c, 0, n));

    // --- A copy node from the host: its parameters read back, then launched.
    CUgraph g;
    CU(cuGraphCreate(&g, 0));
    CUDA_MEMCPY3D up;
    std::memset(&up, 0, sizeof up);
    up.srcMemoryType = CU_MEMORYTYPE_HOST;
    up.srcHost = h.data();
    up.srcPitch = bytes;
    up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    up.dstDevice = a;
    up.dstPitch = bytes;
    up.WidthInBytes = bytes;
    up.Height = 1;
    up.Depth = 1;
    CUgraphNode copy;
    CU(cuGraphAddMemcpyNode(&copy, g, nullptr, 0, &up, ctx));
    CUDA_MEMCPY3D got;
    CU(cuGraphMemcpyNodeGetParams(copy, &got));
    std::printf("copy node: %zu x %zu x %zu bytes, from the host array: %s, to a: %s\n", got.WidthInBytes,
                got.Height, got.Depth, yes(source_of(got) == (uintptr_t)h.data()), yes(destination_of(got) == a));
    CUgraphExec exec;
    CU(cuGraphInstantiateWithFlags(&exec, g, 0));
    launch(exec, s);
    std::printf("launched: a holds the host array: %s\n", yes(holds(a, h)));
    CU(cuGraphExecDestroy(exec));

    // --- Set in the graph: a copy from a to b.
    CUDA_MEMCPY3D a_to_b = device_copy(a, b, bytes);
    CU(cuGraphMemcpyNodeSetParams(copy, &a_to_b));
    CU(cuGraphMemcpyNodeGetParams(copy, &got));
    std::printf("set in the graph: from a: %s, to b: %s, %zu bytes\n", yes(source_of(got) == a),
                yes(destination_of(got) == b), got.WidthInBytes);
    CU(cuGraphInstantiateWithFlags(&exec, g, 0));
    launch(exec, s);
    std::printf("launched: b holds the host array: %s\n", yes(holds(b, h)));

    // --- Set in the executable graph: a copy from a to c; the graph keeps its own.
    CU(cuMemsetD32(b, 0, n));
    CUDA_MEMCPY3D a_to_c = device_copy(a, c, bytes);
    CU(cuGraphExecMemcpyNodeSetParams(exec, copy, &a_to_c, ctx));
    launch(exec, s);
    std::printf("set in the executable graph: c holds the host array: %s, b untouched: %s\n", yes(holds(c, h)),
                yes(holds(b, zero)));
    CU(cuGraphMemcpyNodeGetParams(copy, &got));
    std::printf("the graph's node still copies to b: %s\n", yes(destination_of(got) == b));

    // --- Misuse.
    CUDA_MEMSET_NODE_PARAMS ms;
    std::memset(&ms, 0, sizeof ms);
    ms.dst = c;
    ms.value = 0;
    ms.elementSize = 4;
    ms.width = n;
    ms.height = 1;
    CUgraphNode memset_node;
    CU(cuGraphAddMemsetNode(&memset_node, g, nullptr, 0, &ms, ctx));
    std::printf("copy parameters into null: %s\n", name_of(cuGraphMemcpyNodeGetParams(copy, nullptr)));
    std::printf("copy parameters of a memset node: %s\n", name_of(cuGraphMemcpyNodeGetParams(memset_node, &got)));
    std::printf("null copy parameters set: %s\n", name_of(cuGraphMemcpyNodeSetParams(copy, nullptr)));
    std::printf("copy parameters set on a memset node: %s\n",
                name_of(cuGraphMemcpyNodeSetParams(memset_node, &a_to_b)));
    CU(cuGraphExecDestroy(exec));
    CU(cuGraphDestroy(g));

    // --- User objects: one made by the driver, held by a runtime graph; one made by the
    // runtime, held and released through a driver graph.
    std::atomic<int> runs{0};
    CUuserObject object;
    CU(cuUserObjectCreate(&object, &runs, destroy_object, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    cudaGraph_t rg;
    CHECK(cudaGraphCreate(&rg, 0));
    CU(cuGraphRetainUserObject((CUgraph)rg, object, 1, CU_GRAPH_USER_OBJECT_MOVE));
    CHECK(cudaUserObjectRetain((cudaUserObject_t)object, 2));
    CU(cuUserObjectRelease(object, 2));
    std::printf("driver user object before its runtime graph is destroyed: %d runs\n", runs.load());
    CHECK(cudaGraphDestroy(rg));
    std::printf("after: %d runs\n", wait_for(runs, 1));

    std::atomic<int> runs2{0};
    cudaUserObject_t robject;
    CHECK(cudaUserObjectCreate(&robject, &runs2, destroy_object, 1, cudaUserObjectNoDestructorSync));
    CUgraph dg;
    CU(cuGraphCreate(&dg, 0));
    CU(cuGraphRetainUserObject(dg, (CUuserObject)robject, 3, 0));
    CU(cuUserObjectRelease((CUuserObject)robject, 1));
    std::printf("runtime user object held by a driver graph: %d runs\n", runs2.load());
    CU(cuGraphReleaseUserObject(dg, (CUuserObject)robject, 3));
    std::printf("released through the driver graph: %d runs\n", wait_for(runs2, 1));
    CU(cuGraphDestroy(dg));
    CUuserObject refused;
    std::printf("user object without CU_USER_OBJECT_NO_DESTRUCTOR_SYNC: %s\n",
                name_of(cuUserObjectCreate(&refused, &runs, destroy_object, 1, 0)));
    std::printf("destructor runs in all: %d %d\n", runs.load(), runs2.load());

    // --- The profiler, the persisting L2 lines, GPUDirect RDMA writes.
    std::printf("profiler start: %s, stop: %s\n", name_of(cuProfilerStart()), name_of(cuProfilerStop()));
    std::printf("persisting L2 cache reset: %s\n", name_of(cuCtxResetPersistingL2Cache()));
    int flush_options = 0;
    CU(cuDeviceGetAttribute(&flush_options, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, dev));
    bool host_flush = (flush_options & CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST) != 0;
    CUresult owner = cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                                CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
    CUresult all = cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                              CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES);
    std::printf("GPUDirect RDMA flushes succeed where the device has them: %s\n",
                yes(!host_flush || (owner == CUDA_SUCCESS && all == CUDA_SUCCESS)));
    CUresult bad_scope = cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                                    (CUflushGPUDirectRDMAWritesScope)7);
    std::printf("a flush of an unknown scope refused: %s\n", yes(bad_scope != CUDA_SUCCESS));

    // --- Execution affinity: the device's support, and a context made without affinity.
    int support = -1;
    CUresult r = cuDeviceGetExecAffinitySupport(&support, CU_EXEC_AFFINITY_TYPE_SM_COUNT, dev);
    std::printf("execution affinity support: %s, 0 or 1: %s\n", name_of(r), yes(support == 0 || support == 1));
    std::printf("of a device that does not exist: %s\n",
                name_of(cuDeviceGetExecAffinitySupport(&support, CU_EXEC_AFFINITY_TYPE_SM_COUNT, 1 << 20)));
    int sms = 0;
    CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUexecAffinityParam affinity;
    std::memset(&affinity, 0, sizeof affinity);
    r = cuCtxGetExecAffinity(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT);
    std::printf("the context's SM count: %s, every SM: %s\n", name_of(r),
                yes(affinity.type == CU_EXEC_AFFINITY_TYPE_SM_COUNT && (int)affinity.param.smCount.val == sms));

    // --- A thread without a current context.
    std::thread([] {
        CUexecAffinityParam p;
        std::printf("without a context: affinity %s, L2 reset %s\n",
                    name_of(cuCtxGetExecAffinity(&p, CU_EXEC_AFFINITY_TYPE_SM_COUNT)),
                    name_of(cuCtxResetPersistingL2Cache()));
    }).join();

    CU(cuMemFree(a));
    CU(cuMemFree(b));
    CU(cuMemFree(c));
    CU(cuStreamDestroy(s));
    CU(cuDevicePrimaryCtxRelease(dev));
    std::printf("done\n");
    return 0;
}
