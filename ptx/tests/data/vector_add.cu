// Element-wise kernels with grid-stride loops.
#include <cstddef>

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}

__global__ void saxpy_grid_stride(float alpha, const float *__restrict__ x, float *__restrict__ y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x) {
        y[i] = alpha * x[i] + y[i];
    }
}

__global__ void scale_int64(long long *v, long long factor, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = v[i] * factor - 7;
}

__global__ void fill_3d(unsigned char *out, int pitch) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    out[(z * gridDim.y * blockDim.y + y) * pitch + x] = (unsigned char)(x ^ y ^ z);
}

__global__ void copy_vec4(const float4 *in, float4 *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float4 v = __ldg(&in[i]);
        v.x += 1.0f;
        v.w *= -2.5f;
        out[i] = v;
    }
}

__global__ void no_params_kernel() {}
