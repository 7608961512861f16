// Half precision arithmetic (native on compute_53+, emulated through float before that).
#include <cuda_fp16.h>

__global__ void half_ops(const __half *a, const __half *b, __half *out, float *fout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half x = a[i];
    __half y = b[i];
#if __CUDA_ARCH__ >= 530
    __half r = __hadd(__hmul(x, y), __float2half(1.0f));
    out[i] = __hfma(r, x, y);
#else
    out[i] = __float2half(__half2float(x) * __half2float(y));
#endif
    fout[i] = __half2float(x) + __half2float(y);
}

__global__ void half2_ops(const __half2 *a, __half2 *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
#if __CUDA_ARCH__ >= 530
    __half2 v = a[i];
    out[i] = __hmul2(v, __hadd2(v, __float2half2_rn(0.5f)));
#else
    out[i] = a[i];
#endif
}
