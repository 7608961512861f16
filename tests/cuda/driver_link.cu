// JIT linking through the driver API (numba's, CuPy's and CUDA's ptxjit sample's way of
// building device code at run time): one PTX module linked with cuLinkAddData and loaded
// from the image cuLinkComplete hands out; two PTX modules, one calling a function and
// reading a variable the other defines (the second added from a file with cuLinkAddFile);
// a missing symbol, which the link refuses with its name in the error log; and the driver's
// answers to misuse (bad PTX, a missing file, null arguments).
#include "driver_check.h"

#include <cstring>
#include <unistd.h>

// out[i] = i * i for i < n.
static const char *kSquare = R"(
.version 7.0
.target sm_52
.address_size 64

.visible .entry square(.param .u64 square_out, .param .u32 square_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [square_out];
    ld.param.u32 %r1, [square_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.lo.s32 %r6, %r5, %r5;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r6;
DONE:
    ret;
}
)";

// out[i] = twice(i) + bias, both defined by another module.
static const char *kApply = R"(
.version 7.0
.target sm_52
.address_size 64

.extern .func (.param .b32 func_retval0) twice(.param .b32 twice_param_0);
.extern .global .align 4 .u32 bias;

.visible .entry apply(.param .u64 apply_out, .param .u32 apply_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [apply_out];
    ld.param.u32 %r1, [apply_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    {
    .param .b32 param0;
    st.param.b32 [param0+0], %r5;
    .param .b32 retval0;
    call.uni (retval0), twice, (param0);
    ld.param.b32 %r6, [retval0+0];
    }
    ld.global.u32 %r7, [bias];
    add.s32 %r8, %r6, %r7;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r8;
DONE:
    ret;
}
)";

static const char *kLibrary = R"(
.version 7.0
.target sm_52
.address_size 64

.visible .global .align 4 .u32 bias = 5;

.visible .func (.param .b32 func_retval0) twice(.param .b32 twice_param_0)
{
    .reg .b32 %r<3>;

    ld.param.b32 %r1, [twice_param_0];
    add.s32 %r2, %r1, %r1;
    st.param.b32 [func_retval0+0], %r2;
    ret;
}
)";

static const char *yes(bool b) { return b ? "yes" : "no"; }

static const int kN = 300;

// Loads the linked image, runs `kernel` over kN elements and answers the output.
static void run(const void *image, const char *kernel, unsigned *out, CUmodule *module_out) {
    CUmodule module;
    CU(cuModuleLoadData(&module, image));
    CUfunction fn;
    CU(cuModuleGetFunction(&fn, module, kernel));
    CUdeviceptr d;
    CU(cuMemAlloc(&d, kN * sizeof(unsigned)));
    CU(cuMemsetD32(d, 0, kN));
    unsigned n = kN;
    void *params[] = {&d, &n};
    CU(cuLaunchKernel(fn, (kN + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(out, d, kN * sizeof(unsigned)));
    CU(cuMemFree(d));
    *module_out = module;
}

int main() {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));

    // One module, with the logs and the wall time asked for.
    char info[4096] = {}, error[4096] = {};
    float wall = -1.0f;
    CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                              CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE, CU_JIT_WALL_TIME};
    void *values[] = {info, (void *)(size_t)sizeof(info), error, (void *)(size_t)sizeof(error), (void *)(size_t)1,
                      nullptr};
    CUlinkState link;
    CU(cuLinkCreate(6, options, values, &link));
    CU(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)kSquare, strlen(kSquare) + 1, "square.ptx", 0, nullptr,
                     nullptr));
    void *image = nullptr;
    size_t size = 0;
    CU(cuLinkComplete(link, &image, &size));
    std::memcpy(&wall, &values[5], sizeof(wall));
    unsigned out[kN];
    CUmodule square;
    run(image, "square", out, &square);
    bool right = true;
    for (int i = 0; i < kN; i++) right = right && out[i] == unsigned(i * i);
    printf("one module: image %s, results right %s, wall time reported %s, error log empty %s\n", yes(size > 0),
           yes(right), yes(wall >= 0.0f), yes(error[0] == 0));
    CU(cuModuleUnload(square));
    CU(cuLinkDestroy(link));

    // Two modules: the library from a file.
    char path[] = "/tmp/phos_link_XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    EXPECT(write(fd, kLibrary, strlen(kLibrary)) == (ssize_t)strlen(kLibrary));
    close(fd);
    CU(cuLinkCreate(0, nullptr, nullptr, &link));
    CU(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)kApply, strlen(kApply) + 1, "apply.ptx", 0, nullptr, nullptr));
    CU(cuLinkAddFile(link, CU_JIT_INPUT_PTX, path, 0, nullptr, nullptr));
    CU(cuLinkComplete(link, &image, &size));
    CUmodule apply;
    run(image, "apply", out, &apply);
    right = true;
    for (int i = 0; i < kN; i++) right = right && out[i] == unsigned(2 * i + 5);
    CUdeviceptr bias;
    size_t bias_bytes = 0;
    CU(cuModuleGetGlobal(&bias, &bias_bytes, apply, "bias"));
    unsigned bias_value = 0;
    CU(cuMemcpyDtoH(&bias_value, bias, sizeof(bias_value)));
    printf("two modules: results right %s, [1] %u [299] %u, the other's variable %zu bytes = %u\n", yes(right), out[1],
           out[299], bias_bytes, bias_value);
    CU(cuModuleUnload(apply));
    CU(cuLinkDestroy(link));
    unlink(path);

    // A missing symbol: the module that calls `twice` alone.
    void *error_values[] = {error, (void *)(size_t)sizeof(error)};
    CUjit_option error_options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    error[0] = 0;
    CU(cuLinkCreate(2, error_options, error_values, &link));
    CU(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)kApply, strlen(kApply) + 1, "apply.ptx", 0, nullptr, nullptr));
    CUresult r = cuLinkComplete(link, &image, &size);
    printf("missing symbol: refused %s, the error log names it %s\n", yes(r != CUDA_SUCCESS),
           yes(strstr(error, "twice") != nullptr));
    CU(cuLinkDestroy(link));

    // Misuse.
    CU(cuLinkCreate(2, error_options, error_values, &link));
    error[0] = 0;
    r = cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)"not ptx at all", 15, "bad.ptx", 0, nullptr, nullptr);
    printf("bad PTX: %s, error log written %s\n", name_of(r), yes(error[0] != 0));
    printf("missing file: %s\n",
           name_of(cuLinkAddFile(link, CU_JIT_INPUT_PTX, "/nonexistent/phos.ptx", 0, nullptr, nullptr)));
    printf("null data: %s\n", name_of(cuLinkAddData(link, CU_JIT_INPUT_PTX, nullptr, 10, "x", 0, nullptr, nullptr)));
    printf("null outputs: %s\n", name_of(cuLinkComplete(link, nullptr, &size)));
    CU(cuLinkDestroy(link));
    printf("null state out: %s\n", name_of(cuLinkCreate(0, nullptr, nullptr, nullptr)));
    return 0;
}
