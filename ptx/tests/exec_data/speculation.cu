// Kernels for the speculation and validation tests (ptx::access, ptx::instrument): pointer
// parameters read and written, a by-value struct of pointers, module variables, a pointer
// kept in device memory, a device function that stores through its argument, and generic
// stores to shared memory.

struct Pair {
    float *out;
    const float *in;
    int n;
};

__device__ float total;
__device__ int counter;
__constant__ float scale[4];

extern "C" __global__ void copy_scaled(const float *a, float *b, Pair p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        b[i] = a[i] * scale[i % 4];
        p.out[i] = p.in[i] + 1.0f;
        atomicAdd(&total, a[i]);
    }
}

// Writes through a pointer the kernel reads from device memory: speculation cannot see it.
extern "C" __global__ void chase(float *const *table, const float *a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) table[0][i] = a[i] * 2.0f;
}

// Not inlined, so that its store is generic: global or shared depending on the caller.
__device__ __noinline__ void put(float *p, int i, float v) { p[i] = v; }

extern "C" __global__ void through_call(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) put(out, i, i * 3.0f);
}

extern "C" __global__ void shared_generic(float *out, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    put(s, threadIdx.x, threadIdx.x * 0.5f);
    __syncthreads();
    if (i < n) out[i] = s[blockDim.x - 1 - threadIdx.x];
}

extern "C" __global__ void bump(int n) {
    if (threadIdx.x == 0) atomicAdd(&counter, n);
}
