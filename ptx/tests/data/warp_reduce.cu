// Warp-level primitives: shuffles, votes, active masks.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

__global__ void block_reduce_sum(const float *in, float *out, int n) {
    __shared__ float partial[32];
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += in[i];
    v = warp_sum(v);
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x >> 5) ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) atomicAdd(out, v);
    }
}

__global__ void vote_kernel(const int *in, unsigned *ballots, int *counts, unsigned *masks) {
    int v = in[threadIdx.x];
    unsigned active = __activemask();
    unsigned b = __ballot_sync(0xffffffffu, v > 0);
    int all = __all_sync(0xffffffffu, v != 0);
    int any = __any_sync(active, v < -5);
    __syncwarp();
    int x = __shfl_sync(0xffffffffu, v, 3);
    int up = __shfl_up_sync(0xffffffffu, v, 1);
    int xr = __shfl_xor_sync(0xffffffffu, v, 8);
    if ((threadIdx.x & 31) == 0) {
        ballots[threadIdx.x >> 5] = b;
        counts[threadIdx.x >> 5] = __popc(b) + all + any;
        masks[threadIdx.x >> 5] = active;
    }
    __syncwarp(0x0000ffffu);
    counts[blockDim.x + threadIdx.x] = x + up + xr;
}

__global__ void shfl_double(double *d) {
    double v = d[threadIdx.x];
    v += __shfl_down_sync(0xffffffffu, v, 4, 16);
    d[threadIdx.x] = v;
}
