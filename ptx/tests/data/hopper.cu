// Newer kernel attributes and instructions; each part is compiled only where the target has it.
struct Params {
    float scale;
    int n;
    const float *src;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CLUSTER __cluster_dims__(2, 1, 1)
#else
#define CLUSTER
#endif

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
#define GRID_CONSTANT __grid_constant__
#else
#define GRID_CONSTANT
#endif

__global__ void CLUSTER cluster_kernel(float *out) {
    unsigned rank = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
#endif
    out[blockIdx.x * blockDim.x + threadIdx.x] = (float)rank;
}

__global__ void __launch_bounds__(128) grid_constant_kernel(const GRID_CONSTANT Params p, float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const Params *pp = &p;
    if (i < pp->n) out[i] = pp->src[i] * pp->scale;
}

__global__ void mbarrier_kernel(unsigned long long *out) {
#if __CUDA_ARCH__ >= 900
    __shared__ unsigned long long bar;
    unsigned addr = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(addr), "r"(blockDim.x));
    __syncthreads();
    unsigned long long state;
    asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(addr));
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(addr), "l"(state));
    }
    unsigned is_leader;
    asm volatile("{\n\t.reg .pred p;\n\telect.sync _|p, 0xffffffff;\n\tselp.u32 %0, 1, 0, p;\n\t}" : "=r"(is_leader));
    out[threadIdx.x] = state + is_leader;
#endif
}
