// Single and double precision math library calls.
#include <math.h>

__global__ void math_float(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    out[i * 8 + 0] = expf(x);
    out[i * 8 + 1] = sqrtf(fabsf(x));
    out[i * 8 + 2] = sinf(x) + cosf(x);
    out[i * 8 + 3] = rsqrtf(x * x + 1.0f);
    out[i * 8 + 4] = __fdividef(x, 3.0f) + __expf(x) + __sinf(x) + __logf(x + 2.0f);
    out[i * 8 + 5] = fmaf(x, 2.0f, -1.0f) + floorf(x) + ceilf(x) + truncf(x) + roundf(x);
    out[i * 8 + 6] = powf(x, 2.5f) + logf(fabsf(x) + 1.0f) + tanhf(x) + atan2f(x, 1.0f);
    out[i * 8 + 7] = fminf(x, 0.0f) + fmaxf(x, 1.0f) + copysignf(1.0f, x) + (float)(int)x + (float)(unsigned)x;
}

__global__ void math_double(const double *in, double *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double x = in[i];
    out[i * 4 + 0] = exp(x) + log(x + 10.0);
    out[i * 4 + 1] = sqrt(fabs(x)) + rsqrt(x * x + 1.0);
    out[i * 4 + 2] = sin(x) * cos(x) + pow(x, 3.0);
    out[i * 4 + 3] = fma(x, x, 1.0 / (x + 0.5)) + (double)(long long)x + (float)x;
}

__global__ void int_math(const int *a, unsigned *b, long long *c) {
    int t = threadIdx.x;
    int v = a[t];
    b[t] = __clz(v) + __ffs(v) + __brev(v) + __popcll(c[t]) + (v / 7) + (v % 13) + __umulhi(v, 3u) + __byte_perm(v, 1, 0x3210);
    c[t] = (long long)v * v / 3 + __mul64hi(c[t], 5) + min(v, 3) + max((long long)v, c[t]) + abs(v);
}
