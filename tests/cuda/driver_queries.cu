// The driver API's context, device, function, stream and memory calls that frameworks and
// CUDA's driver-API samples make beside the common ones: limits and configurations, context
// ids and flags, context-wide events, peers, PCI ids, UUIDs, the deprecated device queries,
// memory pools and stream-ordered allocation, functions' names and parameters, the module's
// function list, the occupancy calculator, stream attributes, ids and contexts, host
// functions and callbacks, managed memory with advice, prefetches and range attributes, and
// peer copies. Built with -lcuda. Functions newer than the toolkit it is built with are
// looked up with cuGetProcAddress (so the CUDA 11.8 build calls them too), by the CUDA
// version that introduced the form it declares. Prints only what CUDA determines: no
// addresses, ids, UUID bytes or bus ids (their consistency instead).
// The deprecated queries are exercised on purpose.
#define CUDA_ENABLE_DEPRECATED 1
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include <cuda.h>
#include "driver_check.h"

static const char *yes(bool b) { return b ? "yes" : "no"; }

// out[i] *= factor for i < n; fill(out, value, n): out[i] = value.
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

.visible .entry fill(
    .param .u64 fill_out,
    .param .u32 fill_value,
    .param .u32 fill_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [fill_out];
    ld.param.u32 %r6, [fill_value];
    ld.param.u32 %r2, [fill_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r6;
DONE:
    ret;
}
)";

// A driver function by name, as the CUDA version `version` declares it.
static void *proc(const char *name, int version, bool per_thread = false) {
    void *fn = nullptr;
    cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
#if CUDA_VERSION >= 12000
    CUdriverProcAddressQueryResult status;
    CU(cuGetProcAddress(name, &fn, version, flags, &status));
#else
    CU(cuGetProcAddress(name, &fn, version, flags));
#endif
    if (fn == nullptr) {
        std::printf("FAILED: %s not found\n", name);
        std::exit(1);
    }
    return fn;
}

// The forms newer than CUDA 11.8 (and those CUDA 13 renamed), by the version that declares them.
typedef CUresult (*CtxGetId)(CUcontext, unsigned long long *);
typedef CUresult (*CtxSetFlags)(unsigned int);
typedef CUresult (*CtxEvent)(CUcontext, CUevent);
typedef CUresult (*FuncGetName)(const char **, CUfunction);
typedef CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*FuncIsLoaded)(int *, CUfunction);
typedef CUresult (*FuncLoad)(CUfunction);
typedef CUresult (*ModuleGetFunctionCount)(unsigned int *, CUmodule);
typedef CUresult (*ModuleEnumerateFunctions)(CUfunction *, unsigned int, CUmodule);
typedef CUresult (*StreamGetId)(CUstream, unsigned long long *);
typedef CUresult (*StreamGetDevice)(CUstream, CUdevice *);
typedef CUresult (*StreamGetCtx)(CUstream, CUcontext *);
typedef CUresult (*StreamGetCtxV2)(CUstream, CUcontext *, void **);
typedef CUresult (*MemAdviseV1)(CUdeviceptr, size_t, CUmem_advise, CUdevice);
typedef CUresult (*MemAdviseV2)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation);
typedef CUresult (*MemPrefetchV1)(CUdeviceptr, size_t, CUdevice, CUstream);
typedef CUresult (*MemPrefetchV2)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream);
typedef CUresult (*UuidV2)(CUuuid *, CUdevice);
typedef CUresult (*LaunchEx)(const CUlaunchConfig *, CUfunction, void **, void **);

static int g_host_fn_runs = 0;
static int g_callback_runs = 0;
static CUresult g_callback_status = CUDA_ERROR_UNKNOWN;
static int g_smem_calls = 0;

static void CUDA_CB host_fn(void *arg) { *(int *)arg += 1; }
static void CUDA_CB stream_callback(CUstream, CUresult status, void *arg) {
    g_callback_status = status;
    *(int *)arg += 1;
}
static size_t CUDA_CB no_dynamic_smem(int) {
    g_smem_calls++;
    return 0;
}

static void contexts_and_devices(CUdevice dev, CUcontext ctx, CUfunction scale) {
    // Limits: the stack size is at least what is set; a limit that does not exist is refused.
    size_t stack = 0, heap = 0;
    CU(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 2048));
    CU(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
    CU(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE));
    std::printf("stack size at least what was set: %s, a malloc heap: %s\n", yes(stack >= 2048), yes(heap > 0));
    std::printf("an unknown limit refused: %s\n", yes(cuCtxGetLimit(&stack, (CUlimit)0x7fff) != CUDA_SUCCESS));
    std::printf("cuCtxGetLimit(NULL): %s\n", name_of(cuCtxGetLimit(nullptr, CU_LIMIT_STACK_SIZE)));

    // Cache and shared memory configurations: set, and read back within their ranges.
    CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
    CU(cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_SHARED));
    CU(cuCtxGetCacheConfig(&cache));
    std::printf("cache configuration read back: %s\n", yes(cache >= CU_FUNC_CACHE_PREFER_NONE && cache <= CU_FUNC_CACHE_PREFER_EQUAL));
    CU(cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_NONE));
    CUsharedconfig shared = CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE;
    CU(cuCtxGetSharedMemConfig(&shared));
    std::printf("shared memory configuration read: %s\n", yes(shared >= CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE && shared <= CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE));
    CU(cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE));
    CU(cuFuncSetSharedMemConfig(scale, CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE));

    // Context ids: the current context's by NULL and by handle, another context's differs.
    CtxGetId ctx_get_id = (CtxGetId)proc("cuCtxGetId", 12000);
    unsigned long long id_current = 0, id_handle = 0, id_other = 0;
    CU(ctx_get_id(nullptr, &id_current));
    CU(ctx_get_id(ctx, &id_handle));
    CUcontext other;
#if CUDA_VERSION >= 13000
    CU(cuCtxCreate(&other, nullptr, 0, dev));
#else
    CU(cuCtxCreate(&other, 0, dev));
#endif
    CU(ctx_get_id(other, &id_other));
    CUcontext popped;
    CU(cuCtxPopCurrent(&popped));
    CU(cuCtxDestroy(other));
    std::printf("context ids: the current one's by NULL and by handle the same %s, another context's differs %s\n",
                yes(id_current == id_handle), yes(id_other != id_handle));
    std::printf("cuCtxGetId(NULL out): %s\n", name_of(ctx_get_id(ctx, nullptr)));

    // Flags of the current context.
    CtxSetFlags ctx_set_flags = (CtxSetFlags)proc("cuCtxSetFlags", 12010);
    unsigned int flags = 0;
    CU(ctx_set_flags(CU_CTX_SCHED_BLOCKING_SYNC));
    CU(cuCtxGetFlags(&flags));
    std::printf("scheduling flag set: %s\n", yes((flags & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC));
    CU(ctx_set_flags(CU_CTX_SCHED_AUTO));
    CU(cuCtxGetFlags(&flags));
    std::printf("scheduling flag cleared: %s\n", yes((flags & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_AUTO));

    // Peers: a device is not its own peer.
    int can = -1;
    CU(cuDeviceCanAccessPeer(&can, dev, dev));
    std::printf("the device can access itself as a peer: %d\n", can);
    int p2p = -1;
    std::printf("cuDeviceGetP2PAttribute(dev, dev): %s\n",
                name_of(cuDeviceGetP2PAttribute(&p2p, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, dev, dev)));

    // PCI bus id: the device it names is the device.
    char bus[32] = {0};
    CU(cuDeviceGetPCIBusId(bus, sizeof bus, dev));
    CUdevice by_bus = -1;
    CU(cuDeviceGetByPCIBusId(&by_bus, bus));
    std::printf("the PCI bus id names the device: %s\n", yes(by_bus == dev));

    // UUID: both forms give the same bytes.
    CUuuid u1, u2;
    std::memset(&u1, 0, sizeof u1);
    std::memset(&u2, 1, sizeof u2);
    CU(((UuidV2)proc("cuDeviceGetUuid", 9020))(&u1, dev));
    CU(((UuidV2)proc("cuDeviceGetUuid", 11040))(&u2, dev));
    std::printf("UUID the same in both forms: %s\n", yes(std::memcmp(&u1, &u2, sizeof u1) == 0));

    // The deprecated queries agree with the device's attributes.
    int major = 0, minor = 0, attr_major = -1, attr_minor = -1, threads = 0, warp = 0;
    CU(cuDeviceComputeCapability(&major, &minor, dev));
    CU(cuDeviceGetAttribute(&attr_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CU(cuDeviceGetAttribute(&attr_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CU(cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev));
    CU(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev));
    std::printf("cuDeviceComputeCapability agrees: %s\n", yes(major == attr_major && minor == attr_minor));
    CUdevprop prop;
    std::memset(&prop, 0, sizeof prop);
    CU(cuDeviceGetProperties(&prop, dev));
    std::printf("cuDeviceGetProperties agrees: %s\n", yes(prop.maxThreadsPerBlock == threads && prop.SIMDWidth == warp));
    std::printf("cuDeviceComputeCapability(invalid device): %s\n", name_of(cuDeviceComputeCapability(&major, &minor, 99)));

    size_t width = 0;
    CU(cuDeviceGetTexture1DLinearMaxWidth(&width, CU_AD_FORMAT_FLOAT, 4, dev));
    std::printf("1D linear texture width: %s\n", yes(width > 0));

    // A context-wide event: after it, the kernel launched before is done.
    CUevent ev;
    CU(cuEventCreate(&ev, CU_EVENT_DEFAULT));
    CUdeviceptr d;
    CU(cuMemAlloc(&d, 256 * sizeof(float)));
    CU(cuMemsetD32(d, 0x3f800000, 256));  // 1.0f
    float two = 2.0f;
    unsigned int n = 256;
    void *args[] = {&d, &two, &n};
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU(cuLaunchKernel(scale, 1, 1, 1, 256, 1, 1, 0, s, args, nullptr));
    CU(((CtxEvent)proc("cuCtxRecordEvent", 12050))(ctx, ev));
    CU(cuEventSynchronize(ev));
    CU(((CtxEvent)proc("cuCtxWaitEvent", 12050))(ctx, ev));
    std::vector<float> h(256);
    CU(cuMemcpyDtoH(h.data(), d, 256 * sizeof(float)));
    std::printf("the context's event followed its work: %s\n", yes(h[0] == 2.0f && h[255] == 2.0f));
    CU(cuStreamDestroy(s));
    CU(cuEventDestroy(ev));
    CU(cuMemFree(d));
}

static void functions_and_modules(CUmodule module, CUfunction scale, CUfunction fill) {
    FuncGetName func_get_name = (FuncGetName)proc("cuFuncGetName", 12030);
    const char *name = nullptr;
    CU(func_get_name(&name, scale));
    std::printf("cuFuncGetName: %s\n", name);
    CU(func_get_name(&name, fill));
    std::printf("cuFuncGetName: %s\n", name);
    std::printf("cuFuncGetName(NULL out): %s\n", name_of(func_get_name(nullptr, scale)));

    FuncGetParamInfo param_info = (FuncGetParamInfo)proc("cuFuncGetParamInfo", 12040);
    std::printf("scale's parameters:");
    for (size_t i = 0; i < 3; i++) {
        size_t offset = 99, size = 99;
        CU(param_info(scale, i, &offset, &size));
        std::printf(" (%zu, %zu)", offset, size);
    }
    std::printf("\n");
    size_t offset = 0, size = 0;
    std::printf("a fourth parameter: %s\n", name_of(param_info(scale, 3, &offset, &size)));
    CU(param_info(scale, 1, &offset, nullptr));
    std::printf("the offset alone: %zu\n", offset);

    int state = -1;
    CU(((FuncIsLoaded)proc("cuFuncIsLoaded", 12040))(&state, scale));
    CU(((FuncLoad)proc("cuFuncLoad", 12040))(fill));
    CU(((FuncIsLoaded)proc("cuFuncIsLoaded", 12040))(&state, fill));
    std::printf("loaded after cuFuncLoad: %s\n", yes(state == 1));

    CUmodule of = nullptr;
    CU(cuFuncGetModule(&of, fill));
    std::printf("cuFuncGetModule: the module it came from %s\n", yes(of == module));

    unsigned int count = 0;
    CU(((ModuleGetFunctionCount)proc("cuModuleGetFunctionCount", 12040))(&count, module));
    std::vector<CUfunction> fns(count);
    CU(((ModuleEnumerateFunctions)proc("cuModuleEnumerateFunctions", 12040))(fns.data(), count, module));
    std::vector<std::string> names;
    for (CUfunction f : fns) {
        CU(func_get_name(&name, f));
        names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    std::printf("the module's %u functions:", count);
    for (const std::string &s : names) std::printf(" %s", s.c_str());
    std::printf("\n");

    CUmoduleLoadingMode mode = (CUmoduleLoadingMode)0;
    CU(cuModuleGetLoadingMode(&mode));
    std::printf("loading mode known: %s\n", yes(mode == CU_MODULE_EAGER_LOADING || mode == CU_MODULE_LAZY_LOADING));

    // The occupancy calculator: a block size of whole warps, a grid of whole waves of the
    // device's multiprocessors, the same with a callback giving the same shared memory.
    CUdevice dev;
    CU(cuCtxGetDevice(&dev));
    int sms = 0, max_threads_sm = 0;
    CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CU(cuDeviceGetAttribute(&max_threads_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev));
    int grid = 0, block = 0, grid2 = 0, block2 = 0, grid3 = 0, block3 = 0;
    CU(cuOccupancyMaxPotentialBlockSize(&grid, &block, scale, nullptr, 0, 0));
    CU(cuOccupancyMaxPotentialBlockSize(&grid2, &block2, scale, no_dynamic_smem, 0, 0));
    CU(cuOccupancyMaxPotentialBlockSizeWithFlags(&grid3, &block3, scale, nullptr, 0, 128, CU_OCCUPANCY_DEFAULT));
    int blocks_per_sm = 0;
    CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, scale, block, 0));
    std::printf("potential block size: whole warps %s, full occupancy %s, a grid of whole waves %s\n",
                yes(block > 0 && block % 32 == 0), yes(block * blocks_per_sm == max_threads_sm),
                yes(grid > 0 && grid == blocks_per_sm * sms));
    std::printf("with a callback: the same %s, called %s; within a limit of 128: %s\n",
                yes(grid2 == grid && block2 == block), yes(g_smem_calls > 0), yes(block3 > 0 && block3 <= 128));
    std::printf("cuOccupancyMaxPotentialBlockSize(NULL out): %s\n",
                name_of(cuOccupancyMaxPotentialBlockSize(nullptr, &block, scale, nullptr, 0, 0)));
    size_t smem = 0;
    CU(cuOccupancyAvailableDynamicSMemPerBlock(&smem, scale, 1, 128));
    std::printf("dynamic shared memory available to a block: %s\n", yes(smem > 0));

    // Clusters: whether a PTX kernel of an older target runs in clusters is the driver's to
    // say, so only the misuse is printed (the answers go to standard error).
    CUlaunchAttribute cluster;
    std::memset(&cluster, 0, sizeof cluster);
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1;
    CUlaunchConfig config;
    std::memset(&config, 0, sizeof config);
    config.gridDimX = 8;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 128;
    config.blockDimY = config.blockDimZ = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = -1, cluster_size = -1;
    CUresult r1 = cuOccupancyMaxActiveClusters(&clusters, scale, &config);
    CUresult r2 = cuOccupancyMaxPotentialClusterSize(&cluster_size, scale, &config);
    std::fprintf(stderr, "cuOccupancyMaxActiveClusters: %s, %d; cuOccupancyMaxPotentialClusterSize: %s, %d\n",
                 name_of(r1), clusters, name_of(r2), cluster_size);
    std::printf("cuOccupancyMaxActiveClusters(NULL out): %s\n", name_of(cuOccupancyMaxActiveClusters(nullptr, scale, &config)));
}

static void streams_and_events(CUcontext ctx, CUfunction fill) {
    CUstream s, t;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));

    // Attributes: set on one stream, read back, copied to another.
    CUstreamAttrValue v, got, copied;
    std::memset(&v, 0, sizeof v);
    std::memset(&got, 0, sizeof got);
    std::memset(&copied, 0, sizeof copied);
    v.syncPolicy = CU_SYNC_POLICY_SPIN;
    CU(cuStreamSetAttribute(s, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v));
    CU(cuStreamGetAttribute(s, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &got));
    CU(cuStreamCopyAttributes(t, s));
    CU(cuStreamGetAttribute(t, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &copied));
    std::printf("synchronization policy read back %s, copied %s\n", yes(got.syncPolicy == CU_SYNC_POLICY_SPIN),
                yes(copied.syncPolicy == CU_SYNC_POLICY_SPIN));

    // Ids, device, context.
    StreamGetId get_id = (StreamGetId)proc("cuStreamGetId", 12000);
    unsigned long long id_s = 0, id_s2 = 0, id_t = 0;
    CU(get_id(s, &id_s));
    CU(get_id(s, &id_s2));
    CU(get_id(t, &id_t));
    std::printf("stream ids: stable %s, distinct %s\n", yes(id_s == id_s2), yes(id_s != id_t));
    CUdevice sdev = -1;
    CU(((StreamGetDevice)proc("cuStreamGetDevice", 12080))(s, &sdev));
    std::printf("the stream's device: %d\n", sdev);
    CUcontext sctx = nullptr, sctx2 = nullptr;
    void *green = (void *)1;
    CU(((StreamGetCtx)proc("cuStreamGetCtx", 9020))(s, &sctx));
    CU(((StreamGetCtxV2)proc("cuStreamGetCtx", 12050))(s, &sctx2, &green));
    std::printf("the stream's context is the current one: %s, in both forms %s, no green context %s\n",
                yes(sctx == ctx), yes(sctx2 == ctx), yes(green == nullptr));

    // Work ordered with host functions, callbacks and an event recorded with flags.
    CUdeviceptr d;
    CU(cuMemAlloc(&d, 64 * sizeof(int)));
    int value = 7;
    unsigned int n = 64;
    void *args[] = {&d, &value, &n};
    CU(cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, s, args, nullptr));
    CU(cuLaunchHostFunc(s, host_fn, &g_host_fn_runs));
    CU(cuStreamAddCallback(s, stream_callback, &g_callback_runs, 0));
    std::printf("cuStreamAddCallback(flags 1): %s\n", name_of(cuStreamAddCallback(s, stream_callback, &g_callback_runs, 1)));
    CUevent ev;
    CU(cuEventCreate(&ev, CU_EVENT_DEFAULT));
    CU(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_DEFAULT));
    CU(cuEventSynchronize(ev));
    CU(cuStreamSynchronize(s));
    std::printf("host function ran %d time(s), callback %d time(s) with %s\n", g_host_fn_runs, g_callback_runs,
                name_of(g_callback_status));

    // cuLaunchKernelEx of the per-thread default stream: a null stream is the thread's.
    LaunchEx launch_ptsz = (LaunchEx)proc("cuLaunchKernelEx", 11060, true);
    CUlaunchConfig config;
    std::memset(&config, 0, sizeof config);
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 64;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = nullptr;
    int nine = 9;
    void *args9[] = {&d, &nine, &n};
    CU(launch_ptsz(&config, fill, args9, nullptr));
    CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    std::vector<int> h(64);
    CU(cuMemcpyDtoH(h.data(), d, 64 * sizeof(int)));
    std::printf("per-thread cuLaunchKernelEx wrote: %d %d\n", h[0], h[63]);

    CU(cuEventDestroy(ev));
    CU(cuMemFree(d));
    CU(cuStreamDestroy(t));
    CU(cuStreamDestroy(s));
}

static void memory(CUdevice dev, CUcontext ctx, CUfunction scale) {
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    // Stream-ordered allocation from the device's pool and from a pool of the program's.
    CUmemoryPool def = nullptr, cur = nullptr;
    CU(cuDeviceGetDefaultMemPool(&def, dev));
    CU(cuDeviceGetMemPool(&cur, dev));
    std::printf("the device's pool is its default one: %s\n", yes(def == cur));
    CUdeviceptr a;
    CU(cuMemAllocAsync(&a, 1 << 20, s));
    CU(cuMemsetD32Async(a, 5, (1 << 20) / 4, s));
    unsigned int first = 0;
    CU(cuMemcpyDtoHAsync(&first, a, 4, s));
    CU(cuMemFreeAsync(a, s));
    CU(cuStreamSynchronize(s));
    std::printf("stream-ordered memory held: %u\n", first);

    CUmemPoolProps props;
    std::memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    CUmemoryPool pool;
    CU(cuMemPoolCreate(&pool, &props));
    cuuint64_t threshold = 1 << 20, read = 0;
    CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &read));
    std::printf("release threshold read back: %s\n", yes(read == threshold));
    CUmemLocation loc;
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev;
    CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CU(cuMemPoolGetAccess(&access, pool, &loc));
    std::printf("the pool's device reads and writes it: %s\n", yes(access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CUmemAccessDesc desc;
    desc.location = loc;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemPoolSetAccess(pool, &desc, 1));
    CU(cuDeviceSetMemPool(dev, pool));
    CU(cuDeviceGetMemPool(&cur, dev));
    std::printf("the device's pool set: %s\n", yes(cur == pool));
    CU(cuDeviceSetMemPool(dev, def));
    CUdeviceptr b;
    CU(cuMemAllocFromPoolAsync(&b, 4096, pool, s));
    CU(cuMemsetD8Async(b, 3, 4096, s));
    unsigned char byte = 0;
    CU(cuMemcpyDtoHAsync(&byte, b + 4095, 1, s));
    CU(cuMemFreeAsync(b, s));
    CU(cuStreamSynchronize(s));
    std::printf("memory from the program's pool held: %u\n", byte);
    CU(cuMemPoolTrimTo(pool, 0));
    CU(cuMemPoolDestroy(pool));
    std::printf("cuMemAllocAsync(NULL out): %s\n", name_of(cuMemAllocAsync(nullptr, 16, s)));

    // Managed memory: written by the host, scaled by a kernel, read by the host; advice,
    // prefetches and range attributes.
    CUdeviceptr m;
    CU(cuMemAllocManaged(&m, 1024 * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    float *hm = (float *)(uintptr_t)m;
    for (int i = 0; i < 1024; i++) hm[i] = (float)i;
    float three = 3.0f;
    unsigned int n = 1024;
    void *args[] = {&m, &three, &n};
    CU(cuLaunchKernel(scale, 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CU(cuCtxSynchronize());
    std::printf("managed memory scaled: %g %g\n", hm[1], hm[1023]);
    CU(((MemAdviseV1)proc("cuMemAdvise", 8000))(m, 1024 * sizeof(float), CU_MEM_ADVISE_SET_READ_MOSTLY, dev));
    int read_mostly = 0;
    CU(cuMemRangeGetAttribute(&read_mostly, sizeof read_mostly, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 1024 * sizeof(float)));
    std::printf("read mostly: %d\n", read_mostly);
    CUmemLocation here;
    here.type = CU_MEM_LOCATION_TYPE_DEVICE;
    here.id = dev;
    CU(((MemAdviseV2)proc("cuMemAdvise", 12020))(m, 1024 * sizeof(float), CU_MEM_ADVISE_UNSET_READ_MOSTLY, here));
    CU(((MemAdviseV2)proc("cuMemAdvise", 12020))(m, 1024 * sizeof(float), CU_MEM_ADVISE_SET_PREFERRED_LOCATION, here));
    int preferred = -9, last = -9;
    void *data[] = {&read_mostly, &preferred};
    size_t sizes[] = {sizeof read_mostly, sizeof preferred};
    CUmem_range_attribute attrs[] = {CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION};
    CU(cuMemRangeGetAttributes(data, sizes, attrs, 2, m, 1024 * sizeof(float)));
    std::printf("after advice: read mostly %d, preferred location the device %s\n", read_mostly, yes(preferred == dev));
    CU(((MemPrefetchV1)proc("cuMemPrefetchAsync", 8000))(m, 1024 * sizeof(float), dev, s));
    CU(((MemPrefetchV2)proc("cuMemPrefetchAsync", 12020))(m, 1024 * sizeof(float), here, 0, s));
    CU(cuStreamSynchronize(s));
    CU(cuMemRangeGetAttribute(&last, sizeof last, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, 1024 * sizeof(float)));
    std::printf("last prefetched to the device: %s\n", yes(last == dev));
    CU(cuStreamAttachMemAsync(s, m, 0, CU_MEM_ATTACH_GLOBAL));
    CU(cuStreamSynchronize(s));
    std::printf("cuMemAdvise of a null address: %s\n",
                name_of(((MemAdviseV1)proc("cuMemAdvise", 8000))(0, 16, CU_MEM_ADVISE_SET_READ_MOSTLY, dev)));
    CU(cuMemFree(m));

    // Synchronous memory operations on device memory: accepted.
    CUdeviceptr d;
    CU(cuMemAlloc(&d, 4096));
    unsigned int one = 1;
    CU(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d));

    // Peer copies within the device's own context.
    CUdeviceptr e;
    CU(cuMemAlloc(&e, 4096));
    CU(cuMemsetD8(d, 0x11, 4096));
    CU(cuMemsetD8(e, 0, 4096));
    CU(cuMemcpyPeer(e, ctx, d, ctx, 1024));
    CU(cuMemcpyPeerAsync(e + 1024, ctx, d, ctx, 1024, s));
    CU(cuStreamSynchronize(s));
    CUDA_MEMCPY3D_PEER p;
    std::memset(&p, 0, sizeof p);
    p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = d;
    p.srcContext = ctx;
    p.srcPitch = 64;
    p.srcHeight = 16;
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = e + 2048;
    p.dstContext = ctx;
    p.dstPitch = 64;
    p.dstHeight = 16;
    p.WidthInBytes = 32;
    p.Height = 16;
    p.Depth = 1;
    CU(cuMemcpy3DPeer(&p));
    p.dstDevice = e + 3072;
    CU(cuMemcpy3DPeerAsync(&p, s));
    CU(cuStreamSynchronize(s));
    std::vector<unsigned char> he(4096);
    CU(cuMemcpyDtoH(he.data(), e, 4096));
    int copied = 0;
    for (unsigned char c : he) copied += c == 0x11;
    std::printf("peer copies: %d bytes copied, the 3D copies' gaps untouched %s\n", copied,
                yes(he[2048 + 32] == 0 && he[3072 + 32] == 0));
    CU(cuMemFree(e));
    CU(cuMemFree(d));
    CU(cuStreamDestroy(s));
}

// Virtual memory: the access a mapping has, and its handle found again from its address.
static void virtual_memory(CUdevice dev) {
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va;
    CU(cuMemAddressReserve(&va, gran, 0, 0, 0));
    CUmemGenericAllocationHandle handle, again;
    CU(cuMemCreate(&handle, gran, &prop, 0));
    CU(cuMemMap(va, gran, 0, handle, 0));
    CUmemAccessDesc desc;
    desc.location = prop.location;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(va, gran, &desc, 1));
    unsigned long long flags = 0;
    CU(cuMemGetAccess(&flags, &prop.location, va));
    std::printf("the mapping's device reads and writes it: %s\n", yes(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)va));
    std::printf("the handle found from the address: %s\n", yes(again == handle));
    CU(cuMemRelease(again));
    CU(cuMemUnmap(va, gran));
    CU(cuMemRelease(handle));
    CU(cuMemAddressFree(va, gran));
}

int main() {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));

    CUmodule module;
    CU(cuModuleLoadData(&module, kPtx));
    CUfunction scale, fill;
    CU(cuModuleGetFunction(&scale, module, "scale"));
    CU(cuModuleGetFunction(&fill, module, "fill"));

    contexts_and_devices(dev, ctx, scale);
    functions_and_modules(module, scale, fill);
    streams_and_events(ctx, fill);
    memory(dev, ctx, scale);
    virtual_memory(dev);

    CU(cuModuleUnload(module));
    CU(cuDevicePrimaryCtxRelease(dev));
    std::printf("done\n");
    return 0;
}
