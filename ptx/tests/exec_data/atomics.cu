// Atomics on global and shared memory; a histogram over many blocks checks atomicity across worker threads.
extern "C" __global__ void atomics_global(int *i, unsigned *u, float *f, double *d, unsigned long long *ull) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(i, 1);
    atomicAdd(f, 0.5f);
#if __CUDA_ARCH__ >= 600
    atomicAdd(d, 0.25);
#else
    if (t == 0) *d = 0.25 * gridDim.x * blockDim.x;
#endif
    atomicMax(i + 1, t * 7 % 1000);
    atomicMin(i + 2, -t);
    atomicCAS(i + 3, 0, t + 1);
    atomicExch(u, 7u);
    atomicInc(u + 1, 100u);
    atomicDec(u + 2, 100u);
    atomicAnd(u + 3, ~(1u << (t % 32)));
    atomicOr(u + 4, 1u << (t % 32));
    atomicXor(u + 5, 1u << (t % 7));
    atomicAdd(ull, 3ull);
    atomicMax(ull + 1, (unsigned long long)t << 33);
    atomicSub(u + 6, 2u);
}

extern "C" __global__ void atomics_shared(int *out, float *fout) {
    __shared__ int si[4];
    __shared__ float sf;
    if (threadIdx.x < 4) si[threadIdx.x] = 0;
    if (threadIdx.x == 0) sf = 0.0f;
    __syncthreads();
    atomicAdd(&si[0], 1);
    atomicMax(&si[1], (int)threadIdx.x);
    atomicCAS(&si[2], 0, (int)threadIdx.x + 1);
    atomicInc((unsigned *)&si[3], 9u);
    atomicAdd(&sf, 0.5f);
    __syncthreads();
    if (threadIdx.x < 4) out[blockIdx.x * 4 + threadIdx.x] = si[threadIdx.x];
    if (threadIdx.x == 0) fout[blockIdx.x] = sf;
}

extern "C" __global__ void histogram256(const unsigned char *data, unsigned *bins, int n) {
    __shared__ unsigned local[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        if (local[b]) atomicAdd(&bins[b], local[b]);
}

extern "C" __global__ void global_histogram(const unsigned *data, unsigned *bins, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[data[i] % 64], 1u);
}

__device__ float atomic_max_float(float *addr, float value) {
    int *ai = (int *)addr;
    int old = *ai, assumed;
    do {
        assumed = old;
        if (__int_as_float(assumed) >= value) break;
        old = atomicCAS(ai, assumed, __float_as_int(value));
    } while (assumed != old);
    return __int_as_float(old);
}

extern "C" __global__ void cas_max(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomic_max_float(out, in[i]);
}
