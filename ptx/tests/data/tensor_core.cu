// Tensor-core and async-copy paths, only compiled for targets that have them.
#include <mma.h>
#include <cuda_fp16.h>

__global__ void wmma_gemm_16x16(const __half *a, const __half *b, float *c) {
#if __CUDA_ARCH__ >= 700
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
#endif
}

__global__ void mma_inline(const unsigned *a, const unsigned *b, float *d) {
#if __CUDA_ARCH__ >= 800
    unsigned ra[4], rb[2];
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < 4; ++i) ra[i] = a[threadIdx.x * 4 + i];
    for (int i = 0; i < 2; ++i) rb[i] = b[threadIdx.x * 2 + i];
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
    for (int i = 0; i < 4; ++i) d[threadIdx.x * 4 + i] = acc[i];
#endif
}

__global__ void cp_async_copy(const float4 *g, float4 *out) {
#if __CUDA_ARCH__ >= 800
    __shared__ float4 s[128];
    unsigned saddr = (unsigned)__cvta_generic_to_shared(&s[threadIdx.x]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(g + threadIdx.x));
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) & 127];
#endif
}

__global__ void inline_asm_misc(unsigned *out) {
    unsigned lane, r;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\tselp.u32 %0, 1, 2, p;\n\t}" : "=r"(r) : "r"(lane));
    unsigned long long clk;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(clk));
    out[threadIdx.x] = lane + r + (unsigned)clk;
}
