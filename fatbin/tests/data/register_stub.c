/*
 * Stand-ins for the CUDA runtime's registration entry points, so that a test can load a
 * library built with `nvcc -cudart none` into its own process and capture exactly what
 * nvcc's generated constructors pass to __cudaRegisterFatBinary, as the Phos guest library
 * does. Nothing here ever runs device code.
 */
#include <stddef.h>

#define MAX_MODULES 64
#define MAX_KERNELS 256

static const void *wrappers[MAX_MODULES];
static void *handles[MAX_MODULES];
static int wrapper_count;
static const char *kernel_names[MAX_KERNELS];
static int kernel_count;

void **__cudaRegisterFatBinary(void *fat_cubin) {
    int slot = wrapper_count < MAX_MODULES ? wrapper_count : MAX_MODULES - 1;
    wrappers[slot] = fat_cubin;
    if (wrapper_count < MAX_MODULES) wrapper_count++;
    return &handles[slot];
}

void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }
void __cudaUnregisterFatBinary(void **handle) { (void)handle; }

void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                            int thread_limit, void *tid, void *bid, void *block_dim, void *grid_dim, int *warp_size) {
    (void)handle; (void)host_fun; (void)device_fun; (void)thread_limit;
    (void)tid; (void)bid; (void)block_dim; (void)grid_dim; (void)warp_size;
    if (kernel_count < MAX_KERNELS) kernel_names[kernel_count++] = device_name;
}

void __cudaRegisterVar(void **handle, char *host_var, char *device_address, const char *device_name, int ext,
                       size_t size, int constant, int global) {
    (void)handle; (void)host_var; (void)device_address; (void)device_name;
    (void)ext; (void)size; (void)constant; (void)global;
}

char __cudaInitModule(void **handle) {
    (void)handle;
    return 1;
}

/* Referenced by kernel launch stubs (CUDA 11.8 and 13); never called by the tests. */
unsigned __cudaPushCallConfiguration(void) { return 0; }
unsigned __cudaPopCallConfiguration(void *grid, void *block, size_t *shared, void *stream) {
    (void)grid; (void)block; (void)shared; (void)stream;
    return 1;
}
int cudaLaunchKernel(void) { return 1; }
int __cudaLaunchKernel(void) { return 1; }
int __cudaGetKernel(void) { return 1; }

int phos_test_wrapper_count(void) { return wrapper_count; }
const void *phos_test_wrapper(int i) { return i >= 0 && i < wrapper_count ? wrappers[i] : NULL; }
int phos_test_kernel_count(void) { return kernel_count; }
const char *phos_test_kernel_name(int i) { return i >= 0 && i < kernel_count ? kernel_names[i] : NULL; }
