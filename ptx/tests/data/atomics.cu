// Atomics on global and shared memory, and a shared-memory histogram.
__global__ void atomics_global(int *i, unsigned *u, float *f, double *d, unsigned long long *ull, int v) {
    atomicAdd(i, v);
    atomicAdd(f, 1.5f);
#if __CUDA_ARCH__ >= 600
    atomicAdd(d, 2.25);
#endif
    atomicMax(i + 1, v);
    atomicMin(i + 2, v);
    atomicCAS(i + 3, 0, v);
    atomicExch(u, 7u);
    atomicInc(u + 1, 100u);
    atomicDec(u + 2, 100u);
    atomicAnd(u + 3, 0xf0u);
    atomicOr(u + 4, 0x0fu);
    atomicXor(u + 5, 0xffu);
    atomicAdd(ull, 1ull);
    atomicCAS(ull + 1, 5ull, 6ull);
    unsigned old = atomicSub(u + 6, 3u);
    if (old == 42) u[7] = old;
}

__global__ void atomics_shared(int *out, float *fout) {
    __shared__ int si[4];
    __shared__ float sf;
    if (threadIdx.x < 4) si[threadIdx.x] = 0;
    if (threadIdx.x == 0) sf = 0.0f;
    __syncthreads();
    atomicAdd(&si[0], 1);
    atomicMax(&si[1], (int)threadIdx.x);
    atomicCAS(&si[2], 0, (int)threadIdx.x + 1);
    atomicExch(&si[3], 9);
    atomicAdd(&sf, 0.5f);
    __syncthreads();
    if (threadIdx.x < 4) out[threadIdx.x] = si[threadIdx.x];
    if (threadIdx.x == 0) *fout = sf;
}

__global__ void histogram256(const unsigned char *data, unsigned *bins, int n) {
    __shared__ unsigned local[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        if (local[b]) atomicAdd(&bins[b], local[b]);
}

// A CAS loop: atomic max on floats.
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

__global__ void max_reduce(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomic_max_float(out, in[i]);
}
