// CUDA 12's context-independent loading (the library API): PTX text embedded in the program
// loaded as a library, its kernels counted, enumerated and looked up by name (one handle per
// kernel), launched through cudaLaunchKernel, cudaLaunchKernelExC and a graph's kernel node,
// their attributes read and set; the library's global variable found, read and written by a
// kernel; the library unloaded; then CUDA's answers to misuse: an image that is not one, a
// kernel or variable name not in the library, null arguments.
#include "check.h"

#include <cstring>
#include <dlfcn.h>
#include <unistd.h>

// A runtime function the headers or the libraries the program is built with may lack, found in
// the runtime it runs on.
#define RUNTIME_FUNCTION_AS(local, name, params, args)                                             \
    static cudaError_t local params {                                                              \
        typedef cudaError_t(*fn_t) params;                                                         \
        static fn_t found_ = (fn_t)dlsym(RTLD_DEFAULT, #name);                                     \
        return found_ ? found_ args : cudaErrorNotSupported;                                       \
    }
#define RUNTIME_FUNCTION(name, params, args) RUNTIME_FUNCTION_AS(name, name, params, args)
RUNTIME_FUNCTION_AS(func_get_param_info, cudaFuncGetParamInfo,
                    (const void *func, size_t paramIndex, size_t *paramOffset, size_t *paramSize),
                    (func, paramIndex, paramOffset, paramSize))

#if CUDART_VERSION < 12000
// What CUDA 12's headers declare (driver_types.h, cuda_runtime_api.h of CUDA 12.9); the
// functions are found in the runtime the program runs on, which 11.8's libraries lack.
typedef struct CUkern_st *cudaKernel_t;
typedef struct CUlib_st *cudaLibrary_t;
enum cudaJitOption { cudaJitMaxRegisters = 0 };
enum cudaLibraryOption { cudaLibraryHostUniversalFunctionAndDataTable = 0, cudaLibraryBinaryIsPreserved = 1 };
RUNTIME_FUNCTION(cudaLibraryLoadData,
                 (cudaLibrary_t * library, const void *code, enum cudaJitOption *jitOptions, void **jitOptionsValues,
                  unsigned int numJitOptions, enum cudaLibraryOption *libraryOptions, void **libraryOptionValues,
                  unsigned int numLibraryOptions),
                 (library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues,
                  numLibraryOptions))
RUNTIME_FUNCTION(cudaLibraryLoadFromFile,
                 (cudaLibrary_t * library, const char *fileName, enum cudaJitOption *jitOptions,
                  void **jitOptionsValues, unsigned int numJitOptions, enum cudaLibraryOption *libraryOptions,
                  void **libraryOptionValues, unsigned int numLibraryOptions),
                 (library, fileName, jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues,
                  numLibraryOptions))
RUNTIME_FUNCTION(cudaLibraryUnload, (cudaLibrary_t library), (library))
RUNTIME_FUNCTION(cudaLibraryGetKernel, (cudaKernel_t * pKernel, cudaLibrary_t library, const char *name),
                 (pKernel, library, name))
RUNTIME_FUNCTION(cudaLibraryGetGlobal, (void **dptr, size_t *bytes, cudaLibrary_t library, const char *name),
                 (dptr, bytes, library, name))
RUNTIME_FUNCTION(cudaLibraryGetKernelCount, (unsigned int *count, cudaLibrary_t lib), (count, lib))
RUNTIME_FUNCTION(cudaLibraryEnumerateKernels, (cudaKernel_t * kernels, unsigned int numKernels, cudaLibrary_t lib),
                 (kernels, numKernels, lib))
#endif

// out[i] = out[i] * factor + counter for i < n; counter += 1 by add_counter.
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
    .reg .f32 %f<5>;
    .reg .b32 %r<7>;
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
    ld.global.u32 %r6, [counter];
    cvt.rn.f32.u32 %f4, %r6;
    fma.rn.f32 %f3, %f2, %f1, %f4;
    st.global.f32 [%rd4], %f3;
DONE:
    ret;
}

.visible .entry add_counter(
    .param .u32 add_counter_value
)
{
    .reg .b32 %r<3>;

    ld.param.u32 %r1, [add_counter_value];
    atom.global.add.u32 %r2, [counter], %r1;
    ret;
}
)";

static const char *yes(bool b) { return b ? "yes" : "no"; }

static const int n = 1000;

static void show(const char *what, const float *d) {
    static float host[n];
    CHECK(cudaMemcpy(host, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) sum += host[i] * (i % 7 + 1);
    printf("%s: [0] %.1f [999] %.1f weighted sum %.1f\n", what, host[0], host[n - 1], sum);
}

int main() {
    cudaLibrary_t lib;
    CHECK(cudaLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
    unsigned int count = 0;
    CHECK(cudaLibraryGetKernelCount(&count, lib));
    printf("kernels in the library: %u\n", count);
    cudaKernel_t listed[2] = {};
    CHECK(cudaLibraryEnumerateKernels(listed, 2, lib));
    cudaKernel_t scale, add_counter, again;
    CHECK(cudaLibraryGetKernel(&scale, lib, "scale"));
    CHECK(cudaLibraryGetKernel(&add_counter, lib, "add_counter"));
    CHECK(cudaLibraryGetKernel(&again, lib, "scale"));
    printf("one handle per kernel: %s\n", yes(again == scale && scale != add_counter));
    bool both = (listed[0] == scale && listed[1] == add_counter) || (listed[0] == add_counter && listed[1] == scale);
    printf("enumerated: both kernels %s\n", yes(both));

    void *counter = nullptr;
    size_t counter_bytes = 0;
    CHECK(cudaLibraryGetGlobal(&counter, &counter_bytes, lib, "counter"));
    unsigned int value = 0;
    CHECK(cudaMemcpy(&value, counter, sizeof(value), cudaMemcpyDeviceToHost));
    printf("global counter: %zu bytes, value %u\n", counter_bytes, value);

    float *data;
    CHECK(cudaMalloc(&data, n * sizeof(float)));
    static float init[n];
    for (int i = 0; i < n; i++) init[i] = (float)(i % 10);
    CHECK(cudaMemcpy(data, init, sizeof(init), cudaMemcpyHostToDevice));

    // cudaLaunchKernel takes a cudaKernel_t in place of a host function.
    float factor = 2.0f;
    unsigned int len = n;
    void *args[] = {&data, &factor, &len};
    CHECK(cudaLaunchKernel((const void *)scale, dim3((n + 255) / 256), dim3(256), args, 0, 0));
    CHECK(cudaDeviceSynchronize());
    show("after cudaLaunchKernel", data);

    // The counter, through another kernel of the library.
    unsigned int step = 3;
    void *add_args[] = {&step};
    CHECK(cudaLaunchKernel((const void *)add_counter, dim3(4), dim3(32), add_args, 0, 0));
    CHECK(cudaMemcpy(&value, counter, sizeof(value), cudaMemcpyDeviceToHost));
    printf("counter after 128 additions of 3: %u\n", value);
    value = 1;
    CHECK(cudaMemcpy(counter, &value, sizeof(value), cudaMemcpyHostToDevice));

    // cudaLaunchKernelExC, on a stream.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((n + 127) / 128);
    config.blockDim = dim3(128);
    config.stream = stream;
    factor = 0.5f;
    CHECK(cudaLaunchKernelExC(&config, (const void *)scale, args));
    CHECK(cudaStreamSynchronize(stream));
    show("after cudaLaunchKernelExC", data);

    // A graph's kernel node.
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaKernelNodeParams kp = {};
    kp.func = (void *)scale;
    kp.gridDim = dim3((n + 255) / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    factor = 3.0f;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &kp));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    show("after a graph's kernel node", data);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // Attributes of a library kernel.
    cudaFuncAttributes attr;
    CHECK(cudaFuncGetAttributes(&attr, (const void *)scale));
    printf("attributes: max threads per block at least 256 %s, no static shared memory %s\n",
           yes(attr.maxThreadsPerBlock >= 256), yes(attr.sharedSizeBytes == 0));
    CHECK(cudaFuncSetAttribute((const void *)scale, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024));
    CHECK(cudaFuncGetAttributes(&attr, (const void *)scale));
    printf("max dynamic shared memory set: %d\n", attr.maxDynamicSharedSizeBytes);
    size_t offset = 0, size = 0;
    CHECK(func_get_param_info((const void *)scale, 1, &offset, &size));
    printf("parameter 1 of scale: offset %zu, size %zu; parameter 3: %s\n", offset, size,
           cudaGetErrorName(func_get_param_info((const void *)scale, 3, &offset, &size)));
    cudaGetLastError();

    // Misuse.
    cudaLibrary_t bad;
    static const char garbage[] = "this is not an image";
    {
        // With lazy loading (CUDA's default since 12.2) the image may be read only at first use:
        // success is CUDA's answer then; read at once, it is cudaErrorInvalidPtx.
        cudaError_t e = cudaLibraryLoadData(&bad, garbage, nullptr, nullptr, 0, nullptr, nullptr, 0);
        if (e == cudaSuccess) cudaLibraryUnload(bad);
        printf("not an image: %s\n", e == cudaSuccess || e == cudaErrorInvalidPtx ? "refused or deferred" : cudaGetErrorName(e));
    }
    cudaGetLastError();
    printf("null image: %s\n",
           cudaGetErrorName(cudaLibraryLoadData(&bad, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0)));
    cudaGetLastError();
    printf("null library out: %s\n",
           cudaGetErrorName(cudaLibraryLoadData(nullptr, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0)));
    cudaGetLastError();
    printf("missing file: %s\n", cudaGetErrorName(cudaLibraryLoadFromFile(&bad, "/nonexistent/library.ptx", nullptr,
                                                                          nullptr, 0, nullptr, nullptr, 0)));
    cudaGetLastError();
    cudaKernel_t missing;
    printf("kernel not in the library: %s\n", cudaGetErrorName(cudaLibraryGetKernel(&missing, lib, "no_such_kernel")));
    cudaGetLastError();
    printf("null kernel name: %s\n", cudaGetErrorName(cudaLibraryGetKernel(&missing, lib, nullptr)));
    cudaGetLastError();
    void *nowhere;
    size_t none;
    printf("variable not in the library: %s\n",
           cudaGetErrorName(cudaLibraryGetGlobal(&nowhere, &none, lib, "no_such_variable")));
    cudaGetLastError();
    printf("null count: %s\n", cudaGetErrorName(cudaLibraryGetKernelCount(nullptr, lib)));
    cudaGetLastError();

    // The same image from a file, then both unloaded.
    char path[] = "/tmp/phos_library_XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    FILE *f = fdopen(fd, "w");
    EXPECT(f != nullptr);
    fputs(kPtx, f);
    fclose(f);
    cudaLibrary_t from_file;
    CHECK(cudaLibraryLoadFromFile(&from_file, path, nullptr, nullptr, 0, nullptr, nullptr, 0));
    unlink(path);
    cudaKernel_t file_scale;
    CHECK(cudaLibraryGetKernel(&file_scale, from_file, "scale"));
    CHECK(cudaLibraryGetKernelCount(&count, from_file));
    printf("from a file: %u kernels\n", count);
    CHECK(cudaLibraryUnload(from_file));
    CHECK(cudaLibraryUnload(lib));
    CHECK(cudaFree(data));
    CHECK(cudaStreamDestroy(stream));
    printf("done\n");
    return 0;
}
