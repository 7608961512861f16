// Kernels whose parameter layouts the phos-fatbin tests check against the cubins nvcc builds.
// The expected layouts are spelled out in tests/common/mod.rs (`expected_kernels`).

struct Mixed {
    int i;     // offset 0
    double d;  // offset 8
    char c;    // offset 16; sizeof(Mixed) == 24, alignof(Mixed) == 8
};

struct Big {
    unsigned char bytes[300];  // sizeof(Big) == 300, alignof(Big) == 1
};

__constant__ float c_scale[16];
__device__ int d_counter;

// A device function that stays a real call: with -rdc it gets its own .nv.info section but
// must not be reported as a kernel.
__device__ __noinline__ float scaled(float x, int i) { return x * c_scale[i % 16]; }

extern "C" __global__ void mixed_kernel(const float *in, float *out, int n, Mixed m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = scaled(in[i], i) + m.i + m.d + m.c;
}

template <typename T>
__global__ void axpy(T a, const T *x, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

template __global__ void axpy<float>(float, const float *, float *, int);
template __global__ void axpy<double>(double, const double *, double *, int);
template __global__ void axpy<int>(int, const int *, int *, int);

extern "C" __global__ void no_params() { atomicAdd(&d_counter, 1); }

extern "C" __global__ void big_param(Big b, char tail, int *out) {
    out[threadIdx.x] = b.bytes[threadIdx.x % 300] + tail;
}

// The buffer ends at 9: the driver's parameter size is not rounded up to the alignment.
extern "C" __global__ void tail_padding(double d, char c) {
    if (c) d_counter = (int)d;
}
