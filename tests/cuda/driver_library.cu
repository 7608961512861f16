// The driver API's libraries (CUDA 12's cuLibrary* and cuKernel*): PTX text loaded as a
// library, its kernels counted, enumerated and looked up (one handle per kernel), a kernel's
// function launched with cuLaunchKernel and from a graph instantiated with
// cuGraphInstantiateWithParams, its attributes read and set, the library's module and global
// variable; then the driver's answers to misuse: an image that is not one, a kernel
// name not in the library, null arguments.
#include "driver_check.h"

#include <cstring>
#include <dlfcn.h>

#if CUDA_VERSION < 12000
// What CUDA 12's cuda.h declares.
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef enum CUlibraryOption_enum { CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE = 0 } CUlibraryOption;
#endif

// Functions newer than the toolkit the program may be built with, found in the driver it runs
// on, under names of this program's.
#define DRIVER_FUNCTION_AS(local, name, params, args)                                              \
    static CUresult local params {                                                                 \
        typedef CUresult(*fn_t) params;                                                            \
        static fn_t found_ = (fn_t)dlsym(RTLD_DEFAULT, #name);                                     \
        return found_ ? found_ args : CUDA_ERROR_NOT_SUPPORTED;                                    \
    }
DRIVER_FUNCTION_AS(library_load_data, cuLibraryLoadData,
                   (CUlibrary * library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
                    unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
                    unsigned int numLibraryOptions),
                   (library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues,
                    numLibraryOptions))
DRIVER_FUNCTION_AS(library_unload, cuLibraryUnload, (CUlibrary library), (library))
DRIVER_FUNCTION_AS(library_get_kernel, cuLibraryGetKernel, (CUkernel * pKernel, CUlibrary library, const char *name),
                   (pKernel, library, name))
DRIVER_FUNCTION_AS(library_get_kernel_count, cuLibraryGetKernelCount, (unsigned int *count, CUlibrary lib),
                   (count, lib))
DRIVER_FUNCTION_AS(library_enumerate_kernels, cuLibraryEnumerateKernels,
                   (CUkernel * kernels, unsigned int numKernels, CUlibrary lib), (kernels, numKernels, lib))
DRIVER_FUNCTION_AS(library_get_global, cuLibraryGetGlobal,
                   (CUdeviceptr * dptr, size_t *bytes, CUlibrary library, const char *name),
                   (dptr, bytes, library, name))
DRIVER_FUNCTION_AS(library_get_module, cuLibraryGetModule, (CUmodule * pMod, CUlibrary library), (pMod, library))
DRIVER_FUNCTION_AS(kernel_get_function, cuKernelGetFunction, (CUfunction * pFunc, CUkernel kernel), (pFunc, kernel))
DRIVER_FUNCTION_AS(kernel_get_attribute, cuKernelGetAttribute,
                   (int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev), (pi, attrib, kernel, dev))
// CUDA_GRAPH_INSTANTIATE_PARAMS (CUDA 12's cuda.h).
struct InstantiateParams {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
};
DRIVER_FUNCTION_AS(graph_instantiate_with_params, cuGraphInstantiateWithParams,
                   (CUgraphExec * exec, CUgraph graph, InstantiateParams *params), (exec, graph, params))
DRIVER_FUNCTION_AS(kernel_set_attribute, cuKernelSetAttribute,
                   (CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev), (attrib, val, kernel, dev))

// out[i] = out[i] + delta for i < n; and a global of the library.
static const char *kPtx = R"(
.version 7.0
.target sm_52
.address_size 64

.visible .global .align 4 .u32 marker = 42;

.visible .entry shift(
    .param .u64 shift_out,
    .param .u32 shift_delta,
    .param .u32 shift_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [shift_out];
    ld.param.u32 %r6, [shift_delta];
    ld.param.u32 %r2, [shift_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r7, [%rd4];
    add.s32 %r7, %r7, %r6;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}

.visible .entry unused()
{
    ret;
}
)";

static const char *yes(bool b) { return b ? "yes" : "no"; }

int main() {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));

    CUlibrary lib;
    CU(library_load_data(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
    unsigned int count = 0;
    CU(library_get_kernel_count(&count, lib));
    CUkernel listed[2] = {};
    CU(library_enumerate_kernels(listed, 2, lib));
    CUkernel shift, unused, again;
    CU(library_get_kernel(&shift, lib, "shift"));
    CU(library_get_kernel(&unused, lib, "unused"));
    CU(library_get_kernel(&again, lib, "shift"));
    bool both = (listed[0] == shift && listed[1] == unused) || (listed[0] == unused && listed[1] == shift);
    printf("kernels: %u, enumerated both %s, one handle per kernel %s\n", count, yes(both),
           yes(again == shift && shift != unused));

    CUmodule module;
    CU(library_get_module(&module, lib));
    CUfunction by_module;
    CU(cuModuleGetFunction(&by_module, module, "shift"));
    CUfunction fn;
    CU(kernel_get_function(&fn, shift));

    CUdeviceptr marker;
    size_t marker_bytes;
    CU(library_get_global(&marker, &marker_bytes, lib, "marker"));
    unsigned int value = 0;
    CU(cuMemcpyDtoH(&value, marker, sizeof(value)));
    printf("global: %zu bytes, value %u\n", marker_bytes, value);

    const int n = 600;
    CUdeviceptr data;
    CU(cuMemAlloc(&data, n * sizeof(int)));
    static int host[n];
    for (int i = 0; i < n; i++) host[i] = i;
    CU(cuMemcpyHtoD(data, host, sizeof(host)));
    unsigned int delta = 5, len = n;
    void *args[] = {&data, &delta, &len};
    CU(cuLaunchKernel(fn, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
    // The CUkernel itself, where a CUfunction is taken (CUDA 12 allows it).
    CU(cuLaunchKernel((CUfunction)shift, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    // And the module's function of the same kernel.
    CU(cuLaunchKernel(by_module, (n + 63) / 64, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(host, data, sizeof(host)));
    long long sum = 0;
    for (int i = 0; i < n; i++) sum += host[i];
    printf("after three launches: [0] %d [599] %d sum %lld\n", host[0], host[n - 1], sum);

    int threads = 0;
    CU(kernel_get_attribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, shift, dev));
    printf("max threads per block at least 256: %s\n", yes(threads >= 256));
    CU(kernel_set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 2048, shift, dev));
    int dynamic = 0;
    CU(kernel_get_attribute(&dynamic, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shift, dev));
    printf("max dynamic shared memory set: %d\n", dynamic);

    // A graph's kernel node of the library's kernel, instantiated with parameters (an upload
    // to a stream).
    CUgraph graph;
    CU(cuGraphCreate(&graph, 0));
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof(kp));
    kp.func = fn;
    kp.gridDimX = (n + 127) / 128;
    kp.gridDimY = 1;
    kp.gridDimZ = 1;
    kp.blockDimX = 128;
    kp.blockDimY = 1;
    kp.blockDimZ = 1;
    kp.kernelParams = args;
    CUgraphNode node;
    CU(cuGraphAddKernelNode(&node, graph, nullptr, 0, &kp));
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    InstantiateParams ip = {2, stream, nullptr, 1};
    CUgraphExec exec;
    CU(graph_instantiate_with_params(&exec, graph, &ip));
    printf("instantiated with an upload: result %d\n", ip.result_out);
    CU(cuGraphLaunch(exec, stream));
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpyDtoH(host, data, sizeof(host)));
    sum = 0;
    for (int i = 0; i < n; i++) sum += host[i];
    printf("after the graph: [0] %d [599] %d sum %lld\n", host[0], host[n - 1], sum);
    printf("null parameters: %s\n", name_of(graph_instantiate_with_params(&exec, graph, nullptr)));
    CU(cuGraphExecDestroy(exec));
    CU(cuGraphDestroy(graph));
    CU(cuStreamDestroy(stream));

    // Misuse.
    CUlibrary bad;
    static const char garbage[] = "this is not an image";
    {
        // Lazy loading (the default since CUDA 12.2) may read the image only at first use.
        CUresult e = library_load_data(&bad, garbage, nullptr, nullptr, 0, nullptr, nullptr, 0);
        if (e == CUDA_SUCCESS) library_unload(bad);
        printf("not an image: %s\n", e == CUDA_SUCCESS || e == CUDA_ERROR_INVALID_PTX ? "refused or deferred" : name_of(e));
    }
    printf("null image: %s\n", name_of(library_load_data(&bad, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0)));
    CUkernel missing;
    printf("kernel not in the library: %s\n", name_of(library_get_kernel(&missing, lib, "no_such_kernel")));
    printf("null kernel out: %s\n", name_of(library_get_kernel(nullptr, lib, "shift")));
    CUdeviceptr nowhere;
    size_t none;
    printf("variable not in the library: %s\n", name_of(library_get_global(&nowhere, &none, lib, "no_such_variable")));
    printf("attribute on device 64: %s\n",
           name_of(kernel_get_attribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, shift, 64)));

    CU(cuMemFree(data));
    CU(library_unload(lib));
    CU(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
