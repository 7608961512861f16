// Element-wise kernels, integer and float arithmetic, indexing in 1, 2 and 3 dimensions.
#include <cstdint>

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void saxpy(float alpha, const float *__restrict__ x, float *__restrict__ y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x)
        y[i] = alpha * x[i] + y[i];
}

// Integer semantics that must match the host exactly (the test computes the same on the CPU).
extern "C" __global__ void int_ops(const int *a, const int *b, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = a[i], y = b[i];
    unsigned ux = x, uy = y;
    int *o = out + i * 16;
    o[0] = x + y;
    o[1] = x * y;
    o[2] = y != 0 ? x / y : 0;
    o[3] = y != 0 ? x % y : 0;
    o[4] = uy != 0 ? (int)(ux / uy) : 0;
    o[5] = uy != 0 ? (int)(ux % uy) : 0;
    o[6] = x >> (y & 31);
    o[7] = (int)(ux >> (y & 31));
    o[8] = x << (y & 31);
    o[9] = __popc(ux) + 100 * __clz(x);
    o[10] = __brev(ux);
    o[11] = __mulhi(x, y);
    o[12] = (int)__umulhi(ux, uy);
    o[13] = min(x, y) ^ max(ux, uy);
    o[14] = __byte_perm(ux, uy, (unsigned)(i * 0x1357) & 0xffff);
    o[15] = (int)(((long long)x * y) >> 17);
}

extern "C" __global__ void int64_ops(const long long *a, const long long *b, long long *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long x = a[i], y = b[i];
    unsigned long long ux = x, uy = y;
    long long *o = out + i * 8;
    o[0] = x * y;
    o[1] = y != 0 ? x / y : 0;
    o[2] = y != 0 ? x % y : 0;
    o[3] = uy != 0 ? (long long)(ux / uy) : 0;
    o[4] = __mul64hi(x, y);
    o[5] = (long long)__umul64hi(ux, uy);
    o[6] = x >> (y & 63);
    o[7] = __popcll(ux) + 100 * __clzll(x) + 10000 * __ffsll(x);
}

// Float arithmetic that has exactly one correct answer (IEEE round to nearest, or explicit rounding intrinsics).
extern "C" __global__ void float_ops(const float *a, const float *b, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[i], y = b[i];
    float *o = out + i * 12;
    o[0] = x + y;
    o[1] = x * y;
    o[2] = x / y;
    o[3] = sqrtf(fabsf(x));
    o[4] = fmaf(x, y, 1.0f);
    o[5] = __fadd_rz(x, y);
    o[6] = __fmul_ru(x, y);
    o[7] = __fdiv_rd(x, y);
    o[8] = fminf(x, y) + fmaxf(x, y);
    o[9] = (float)(int)x + (float)(unsigned)fabsf(y);
    o[10] = __int_as_float(__float2int_rn(x * 1000.0f));
    o[11] = rintf(x) + floorf(y) + ceilf(x) + truncf(y);
}

extern "C" __global__ void double_ops(const double *a, const double *b, double *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double x = a[i], y = b[i];
    double *o = out + i * 8;
    o[0] = x + y;
    o[1] = x * y;
    o[2] = x / y;
    o[3] = sqrt(fabs(x));
    o[4] = fma(x, y, 0.5);
    o[5] = __dadd_rz(x, y);
    o[6] = (double)(float)x;
    o[7] = (double)(long long)(x * 1e6);
}

extern "C" __global__ void fill_3d(unsigned *out) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    int w = gridDim.x * blockDim.x, h = gridDim.y * blockDim.y;
    out[(z * h + y) * w + x] = (x << 20) | (y << 10) | z;
}

extern "C" __global__ void copy_vec4(const float4 *in, float4 *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float4 v = in[i];
        out[i] = make_float4(v.w, v.z, v.y, v.x);
    }
}

// Lane-dependent control flow: early return, loops with different trip counts, nested divergence.
extern "C" __global__ void divergent(const int *in, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    int acc = 0;
    for (int k = 0; k < (v & 15); ++k) {
        if (k & 1) acc += k * v;
        else if (k % 3 == 0) continue;
        else acc ^= k;
        if (acc > 100000) break;
    }
    if (threadIdx.x % 3 == 0) {
        out[i] = acc;
        return;
    }
    while (v > 1) v = (v & 1) ? 3 * v + 1 : v / 2, acc++;
    out[i] = acc;
}
