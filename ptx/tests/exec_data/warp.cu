// Warp-level primitives.
extern "C" __global__ void warp_ops(const int *in, unsigned *out) {
    int lane = threadIdx.x & 31;
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    unsigned *o = out + (blockIdx.x * blockDim.x + threadIdx.x) * 12;
    o[0] = __ballot_sync(0xffffffffu, v & 1);
    o[1] = __any_sync(0xffffffffu, v > 1000);
    o[2] = __all_sync(0xffffffffu, v >= 0);
    o[3] = __shfl_sync(0xffffffffu, v, (lane * 7) & 31);
    o[4] = __shfl_up_sync(0xffffffffu, v, 3);
    o[5] = __shfl_down_sync(0xffffffffu, v, 5, 16);
    o[6] = __shfl_xor_sync(0xffffffffu, v, 9);
    o[7] = __match_any_sync(0xffffffffu, v % 4);
    int pred;
    o[8] = __match_all_sync(0xffffffffu, v / 1000, &pred);
    o[9] = pred;
    o[10] = __activemask();
#if __CUDA_ARCH__ >= 800
    o[11] = __reduce_add_sync(0xffffffffu, v) + __reduce_max_sync(0xffffffffu, (unsigned)v);
#else
    o[11] = 0xdeadbeefu;
#endif
}

// Divergent warps: the odd lanes vote among themselves.
extern "C" __global__ void warp_divergent(const int *in, unsigned *out) {
    int lane = threadIdx.x & 31;
    int v = in[threadIdx.x];
    unsigned r = 0;
    if (lane & 1) {
        r = __ballot_sync(0xaaaaaaaau, v > 10) | 1u;
        r += __shfl_sync(0xaaaaaaaau, v, 1);
    } else {
        r = __activemask();
    }
    __syncwarp();
    out[threadIdx.x] = r;
}
