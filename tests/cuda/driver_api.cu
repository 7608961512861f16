// The driver API as frameworks use it (PyTorch, Triton, programs of their own): entry points
// by name, the primary context and the context stack, memory, copies and memsets, a module
// loaded from a PTX string and launched with both parameter forms, streams and events, and
// handles shared with the runtime. Built with -lcuda. Prints only what does not depend on the
// GPU model; where the driver's entry points live goes to standard error.
#include <cstring>
#include <cstdlib>
#include <vector>
#include <dlfcn.h>
#include <unistd.h>
#include <cuda.h>
#include "driver_check.h"

static const char *yes(bool b) { return b ? "yes" : "no"; }

// out[i] *= factor for i < n; and a module variable.
static const char *kPtx = R"(
.version 7.0
.target sm_52
.address_size 64

.visible .global .align 4 .u32 counter = 5;

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

static const void *object_of(const void *p, const char **path) {
    Dl_info info;
    if (dladdr(p, &info) == 0) return nullptr;
    if (path) *path = info.dli_fname;
    return info.dli_fbase;
}

int main(int argc, char **argv) {
    // `driver_api hold`: stop with virtual memory mapped, for a checkpoint test.
    const bool hold = argc > 1 && std::strcmp(argv[1], "hold") == 0;
    // Entry points by name work before cuInit: that is how a runtime finds the driver.
    void *fn = nullptr;
#if CUDA_VERSION >= 12000
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CU(cuGetProcAddress("cuInit", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status));
#else
    CU(cuGetProcAddress("cuInit", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT));
#endif
    std::printf("cuInit found before cuInit: %s\n", yes(fn != nullptr));
    CU(((CUresult (*)(unsigned int))fn)(0));

    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));

    // No context yet on this thread.
    CUcontext ctx = (CUcontext)0x1;
    CU(cuCtxGetCurrent(&ctx));
    std::printf("current context before any: %s\n", ctx == nullptr ? "none" : "some");
    CUdevice got = -1;
    std::printf("cuCtxGetDevice without a context: %s\n", name_of(cuCtxGetDevice(&got)));
    CUdeviceptr none = 0;
    std::printf("cuMemAlloc without a context: %s\n", name_of(cuMemAlloc(&none, 16)));

    // The primary context.
    unsigned int flags = 99;
    int active = -1;
    CU(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    std::printf("primary context active before retain: %d\n", active);
    CUcontext primary = nullptr;
    CU(cuDevicePrimaryCtxRetain(&primary, dev));
    CU(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    std::printf("primary context active after retain: %d\n", active);
    CU(cuCtxSetCurrent(primary));
    CU(cuCtxGetCurrent(&ctx));
    std::printf("current is the primary: %s\n", yes(ctx == primary));
    CU(cuCtxGetDevice(&got));
    std::printf("its device: %s\n", yes(got == dev));
    unsigned int api = 0;
    CU(cuCtxGetApiVersion(primary, &api));
    std::printf("context API version at least 3.2: %s\n", yes(api >= 3020));

    // A context of its own, pushed and popped.
    CUcontext mine = nullptr;
#if CUDA_VERSION >= 13000
    CU(cuCtxCreate(&mine, nullptr, 0, dev));
#else
    CU(cuCtxCreate(&mine, 0, dev));
#endif
    CU(cuCtxGetCurrent(&ctx));
    std::printf("a created context is current and not the primary: %s\n", yes(ctx == mine && mine != primary));
    CUcontext popped = nullptr;
    CU(cuCtxPopCurrent(&popped));
    CU(cuCtxGetCurrent(&ctx));
    std::printf("popping it gives it back, the primary current again: %s\n", yes(popped == mine && ctx == primary));
    CU(cuCtxPushCurrent(mine));
    CU(cuCtxPopCurrent(nullptr));
    CU(cuCtxDestroy(mine));
    CU(cuCtxSetCurrent(primary));
    CU(cuCtxSynchronize());

    // Entry points: by version, unknown names, and the runtime's own way to them.
    void *alloc_fn = nullptr;
#if CUDA_VERSION >= 12000
    CU(cuGetProcAddress("cuMemAlloc", &alloc_fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    void *missing = (void *)0x1;
    CUresult r = cuGetProcAddress("cuNoSuchFunction", &missing, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    std::printf("an unknown name: %s, status %d, pointer %s\n", name_of(r), (int)status, missing ? "set" : "NULL");
    r = cuGetProcAddress("cuMemCreate", &missing, 10000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    std::printf("a name newer than the version asked: %s, status %d\n", name_of(r), (int)status);
#else
    CU(cuGetProcAddress("cuMemAlloc", &alloc_fn, 11000, CU_GET_PROC_ADDRESS_DEFAULT));
    void *missing = (void *)0x1;
    CUresult r = cuGetProcAddress("cuNoSuchFunction", &missing, 11000, CU_GET_PROC_ADDRESS_DEFAULT);
    std::printf("an unknown name: %s, pointer %s\n", name_of(r), missing ? "set" : "NULL");
#endif
    void *runtime_fn = nullptr;
    CHECK(cudaGetDriverEntryPoint("cuMemAlloc", &runtime_fn, cudaEnableDefault));
    const char *path = nullptr;
    const void *runtime_object = object_of(runtime_fn, &path);
    std::fprintf(stderr, "cudaGetDriverEntryPoint(cuMemAlloc) lies in %s\n", path ? path : "?");
    std::printf("the runtime's driver entry point is in the library of cuInit: %s\n",
                yes(runtime_object != nullptr && runtime_object == object_of((const void *)&cuInit, nullptr)));
    std::printf("and in the one cuGetProcAddress answers from: %s\n", yes(runtime_object == object_of(alloc_fn, nullptr)));

    // Memory through the pointer cuGetProcAddress gave.
    const int n = 1024;
    CUdeviceptr d = 0;
    CU(((CUresult (*)(CUdeviceptr *, size_t))alloc_fn)(&d, n * sizeof(float)));
    size_t free_mem = 0, total_mem = 0;
    CU(cuMemGetInfo(&free_mem, &total_mem));
    std::printf("free memory within the total: %s\n", yes(free_mem <= total_mem && total_mem > 0));
    CUdeviceptr base = 0;
    size_t size = 0;
    CU(cuMemGetAddressRange(&base, &size, d + 100));
    std::printf("address range of an inner address: %s\n", yes(base == d && size >= n * sizeof(float)));
    unsigned int memtype = 0;
    CU(cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d));
    int ordinal = -1;
    CU(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d));
    CUdeviceptr start = 0;
    CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 8));
    std::printf("pointer attributes: device memory %s, device %d, range start %s\n",
                yes(memtype == CU_MEMORYTYPE_DEVICE), ordinal, yes(start == d));
    int on_stack = 0;
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER};
    unsigned int stack_type = 77;
    CUdeviceptr stack_dptr = 77;
    void *data[] = {&stack_type, &stack_dptr};
    CU(cuPointerGetAttributes(2, which, data, (CUdeviceptr)&on_stack));
    std::printf("host memory the driver does not know: type %u, device pointer %llu\n", stack_type,
                (unsigned long long)stack_dptr);

    std::vector<float> h(n);
    CU(cuMemsetD32(d, 0x3f800000u, n));  // 1.0f
    CU(cuMemcpyDtoH(h.data(), d, n * sizeof(float)));
    bool ones = true;
    for (float v : h) ones = ones && v == 1.0f;
    std::printf("cuMemsetD32 of 1.0f: %s\n", yes(ones));
    CU(cuMemsetD16(d, 0x4000, 2 * n));  // every half 2.0 in half precision: words 0x40004000
    unsigned int word = 0;
    CU(cuMemcpyDtoH(&word, d + 40, 4));
    std::printf("cuMemsetD16: 0x%08x\n", word);
    CU(cuMemsetD8(d, 0x5a, n * sizeof(float)));
    CU(cuMemcpyDtoH(&word, d + 4000, 4));
    std::printf("cuMemsetD8: 0x%08x\n", word);
    std::printf("a misaligned cuMemsetD32: %s\n", name_of(cuMemsetD32(d + 2, 0, 4)));
    std::printf("a memset past the allocation: %s\n", yes(cuMemsetD8(d, 0, n * sizeof(float) + 1) != CUDA_SUCCESS));

    for (int i = 0; i < n; ++i) h[i] = (float)i;
    CU(cuMemcpyHtoD(d, h.data(), n * sizeof(float)));
    CUdeviceptr d2 = 0;
    CU(cuMemAlloc(&d2, n * sizeof(float)));
    CU(cuMemcpyDtoD(d2, d, n * sizeof(float)));

    // A module from PTX, launched with both parameter forms.
    CUmodule module;
    CU(cuModuleLoadData(&module, kPtx));
    CUfunction scale;
    CU(cuModuleGetFunction(&scale, module, "scale"));
    CUfunction nope;
    std::printf("a kernel the module does not have: %s\n", name_of(cuModuleGetFunction(&nope, module, "nope")));
    int max_threads = 0;
    CU(cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale));
    std::printf("max threads per block at least 256: %s\n", yes(max_threads >= 256));
    int blocks = 0;
    CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, scale, 128, 0));
    std::printf("resident blocks of 128 threads at least 1: %s\n", yes(blocks >= 1));
    CUdeviceptr counter = 0;
    size_t counter_size = 0;
    CU(cuModuleGetGlobal(&counter, &counter_size, module, "counter"));
    unsigned int counter_value = 0;
    CU(cuMemcpyDtoH(&counter_value, counter, sizeof counter_value));
    std::printf("module variable: %zu bytes, value %u\n", counter_size, counter_value);

    float factor = 2.0f;
    unsigned int count = n;
    void *args[] = {&d2, &factor, &count};
    CU(cuLaunchKernel(scale, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
    struct {
        CUdeviceptr out;
        float factor;
        unsigned int n;
    } packed = {d2, 3.0f, (unsigned int)n};
    size_t packed_size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                     CU_LAUNCH_PARAM_END};
    CU(cuLaunchKernel(scale, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, nullptr, extra));
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(h.data(), d2, n * sizeof(float)));
    bool scaled = true;
    for (int i = 0; i < n; ++i) scaled = scaled && h[i] == 6.0f * i;
    std::printf("two launches scaled by 2 then 3: %s (h[7] = %.1f)\n", yes(scaled), h[7]);
#if CUDA_VERSION >= 12000
    // cuLaunchKernelEx as Triton calls it: a configuration with a cluster of one block.
    CUlaunchAttribute attr;
    std::memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
    CUlaunchConfig config;
    std::memset(&config, 0, sizeof config);
    config.gridDimX = (n + 127) / 128;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 128;
    config.blockDimY = config.blockDimZ = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    float half = 0.5f;
    void *ex_args[] = {&d2, &half, &count};
    CU(cuLaunchKernelEx(&config, scale, ex_args, nullptr));
    CU(cuMemcpyDtoH(h.data(), d2, n * sizeof(float)));
    std::printf("cuLaunchKernelEx: h[7] = %.1f\n", h[7]);
    half = 2.0f;
    CU(cuLaunchKernelEx(&config, scale, ex_args, nullptr));
#endif
    std::printf("a launch with both parameter forms: %s\n",
                name_of(cuLaunchKernel(scale, 1, 1, 1, 1, 1, 1, 0, nullptr, args, extra)));
    std::printf("a garbage image is refused: %s\n", yes(cuModuleLoadData(&module, "not a module") != CUDA_SUCCESS));
    // The same PTX from a file: a module of its own to the program, unloaded on its own;
    // and a cooperative launch of its kernel.
    char ptx_path[] = "/tmp/phos-driver-api-XXXXXX";
    int fd = mkstemp(ptx_path);
    if (fd < 0 || write(fd, kPtx, std::strlen(kPtx)) != (ssize_t)std::strlen(kPtx)) return 1;
    close(fd);
    CUmodule from_file;
    CU(cuModuleLoad(&from_file, ptx_path));
    unlink(ptx_path);
    CUfunction scale_again;
    CU(cuModuleGetFunction(&scale_again, from_file, "scale"));
    int cooperative = 0;
    CU(cuDeviceGetAttribute(&cooperative, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev));
    if (cooperative) {
        float third = 1.0f / 3.0f;
        // d holds 0, 1, 2...: one block of 128 threads scales the first 128 by 1/3.
        void *coop_args[] = {&d, &third, &count};
        CU(cuLaunchCooperativeKernel(scale_again, 1, 1, 1, 128, 1, 1, 0, nullptr, coop_args));
        CU(cuCtxSynchronize());
        CU(cuMemcpyDtoH(h.data(), d, n * sizeof(float)));
    }
    std::printf("a cooperative launch from a module loaded from a file: %s\n",
                yes(!cooperative || (h[3] == 1.0f && h[200] == 200.0f)));
    CU(cuModuleUnload(from_file));
    CU(cuLaunchKernel(scale, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
    CU(cuCtxSynchronize());
    std::printf("the first module outlives the second's unload: yes\n");
    std::printf("a file that is not there: %s\n", name_of(cuModuleLoad(&from_file, "/nonexistent/module.ptx")));

    // Virtual memory management as PyTorch's expandable segments use it: a reservation, two
    // handles mapped side by side, one range of memory across them.
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    std::printf("granularity a power of two: %s\n", yes(gran > 0 && (gran & (gran - 1)) == 0));
    CUdeviceptr va = 0;
    CU(cuMemAddressReserve(&va, 4 * gran, 0, 0, 0));
    CUmemGenericAllocationHandle handles[2];
    for (auto &hd : handles) CU(cuMemCreate(&hd, gran, &prop, 0));
    CU(cuMemMap(va, gran, 0, handles[0], 0));
    CU(cuMemMap(va + gran, gran, 0, handles[1], 0));
    CUmemAccessDesc access;
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(va, 2 * gran, &access, 1));
    CUmemGenericAllocationHandle spare;
    CU(cuMemCreate(&spare, gran, &prop, 0));
    std::printf("a mapping outside the reservation: %s\n",
                yes(cuMemMap(va + 4 * gran, gran, 0, spare, 0) != CUDA_SUCCESS));
    CU(cuMemRelease(spare));
    // 2048 floats across the boundary between the two mappings.
    const int across = 2048;
    CUdeviceptr straddle = va + gran - across / 2 * sizeof(float);
    CU(cuMemsetD32(straddle, 0x3f800000u, across));  // 1.0f
    float four = 4.0f;
    unsigned int across_n = across;
    void *vargs[] = {&straddle, &four, &across_n};
    CU(cuLaunchKernel(scale, across / 128, 1, 1, 128, 1, 1, 0, nullptr, vargs, nullptr));
    std::vector<float> vh(across);
    CU(cuMemcpyDtoH(vh.data(), straddle, across * sizeof(float)));
    bool fours = true;
    for (float v : vh) fours = fours && v == 4.0f;
    std::printf("a kernel and copies across two mappings: %s\n", yes(fours));
    if (hold) {
        std::printf("holding mappings\n");
        std::fflush(stdout);
        sleep(120);
        return 0;
    }
    CUmemAllocationProp got_prop;
    CU(cuMemGetAllocationPropertiesFromHandle(&got_prop, handles[1]));
    std::printf("a handle's properties: device %s\n", yes(got_prop.location.id == dev));
    CU(cuMemRelease(handles[0]));  // still mapped: the memory stays until unmapped
    float kept = 0;
    CU(cuMemcpyDtoH(&kept, va + gran - 4, sizeof kept));
    std::printf("released while mapped, still there: %.1f\n", kept);
    CU(cuMemUnmap(va, 2 * gran));
    CU(cuMemRelease(handles[1]));
    CU(cuMemAddressFree(va, 4 * gran));
    std::printf("a copy from unmapped memory: %s\n", yes(cuMemcpyDtoH(&kept, va, sizeof kept) != CUDA_SUCCESS));

    // Streams and events, shared with the runtime.
    int least = 0, greatest = 0;
    CU(cuCtxGetStreamPriorityRange(&least, &greatest));
    CUstream s1, s2;
    CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CU(cuStreamCreateWithPriority(&s2, CU_STREAM_DEFAULT, greatest));
    unsigned int s_flags = 0;
    int prio = 99;
    CU(cuStreamGetFlags(s1, &s_flags));
    CU(cuStreamGetPriority(s2, &prio));
    std::printf("stream flags %u, priority is the greatest: %s\n", s_flags, yes(prio == greatest));
    CUevent begin, end;
    CU(cuEventCreate(&begin, CU_EVENT_DEFAULT));
    CU(cuEventCreate(&end, CU_EVENT_DEFAULT));
    float *pinned = nullptr;
    CU(cuMemAllocHost((void **)&pinned, n * sizeof(float)));
    CU(cuEventRecord(begin, s1));
    CU(cuMemsetD32Async(d, 0x40400000u, n, s1));  // 3.0f
    void *args1[] = {&d, &factor, &count};
    CU(cuLaunchKernel(scale, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s1, args1, nullptr));
    CU(cuEventRecord(end, s1));
    CU(cuStreamWaitEvent(s2, end, 0));
    CU(cuMemcpyDtoHAsync(pinned, d, n * sizeof(float), s2));
    CU(cuStreamSynchronize(s2));
    std::printf("stream 2 waited for stream 1's work: %s (%.1f)\n", yes(pinned[0] == 6.0f && pinned[n - 1] == 6.0f),
                pinned[0]);
    CU(cuEventSynchronize(end));
    std::printf("cuEventQuery after it completed: %s\n", name_of(cuEventQuery(end)));
    float ms = -1;
    CU(cuEventElapsedTime(&ms, begin, end));
    std::printf("elapsed time not negative: %s\n", yes(ms >= 0));
    std::printf("cuStreamQuery of an idle stream: %s\n", name_of(cuStreamQuery(s1)));

    // Host memory: page-locked by the driver, and registered.
    void *registered = nullptr;
    CU(cuMemHostAlloc(&registered, 1 << 16, CU_MEMHOSTALLOC_PORTABLE));
    CU(cuMemFreeHost(registered));
    std::vector<float> plain(n, 0.0f);
    CU(cuMemHostRegister(plain.data(), n * sizeof(float), 0));
    CU(cuMemcpyDtoHAsync(plain.data(), d2, n * sizeof(float), s1));
    CU(cuStreamSynchronize(s1));
    unsigned int registered_flags = 0;
    CU(cuMemHostGetFlags(&registered_flags, plain.data()));
    CU(cuMemHostUnregister(plain.data()));
    std::printf("copy into registered memory: %s\n", yes(plain[10] == 60.0f));

    // The runtime's objects are the driver's.
    cudaStream_t rs;
    CHECK(cudaStreamCreate(&rs));
    float *rd = nullptr;
    CHECK(cudaMalloc(&rd, n * sizeof(float)));
    CU(cuMemcpyHtoDAsync((CUdeviceptr)rd, pinned, n * sizeof(float), (CUstream)rs));
    CU(cuStreamSynchronize((CUstream)rs));
    float back = 0;
    CHECK(cudaMemcpy(&back, rd + 5, sizeof back, cudaMemcpyDeviceToHost));
    std::printf("a runtime stream and allocation through the driver: %.1f\n", back);
    CU(cuMemFree((CUdeviceptr)rd));
    CHECK(cudaStreamDestroy(rs));
    CU(cuCtxGetCurrent(&ctx));
    std::printf("after runtime calls the primary is still current: %s\n", yes(ctx == primary));

    CU(cuMemFreeHost(pinned));
    CU(cuEventDestroy(begin));
    CU(cuEventDestroy(end));
    CU(cuStreamDestroy(s1));
    CU(cuStreamDestroy(s2));
    CU(cuModuleUnload(module));
    CU(cuMemFree(d));
    CU(cuMemFree(d2));
    std::printf("a second free: %s\n", yes(cuMemFree(d2) != CUDA_SUCCESS));
    CU(cuDevicePrimaryCtxRelease(dev));
    std::printf("done\n");
    return 0;
}
