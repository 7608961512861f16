// The content hash of phos_checkpoint::piece_hash, one block per warp: the source of
// hash_blocks.ptx (nvcc -ptx -arch=compute_60 -O3 hash_blocks.cu -o hash_blocks.ptx), which the
// cuda backend loads into each device's context for the exact held pass of a recopy.
#define SEED 0x243f6a8885a308d3ull
#define WORD_STEP 0x9e3779b97f4a7c15ull

__device__ __forceinline__ unsigned long long fmix64(unsigned long long k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

// blocks: count pairs (address, length); out: count hashes.
extern "C" __global__ void phos_hash_blocks(const unsigned long long *blocks, unsigned long long count,
                                            unsigned long long *out) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long warps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    for (unsigned long long b = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < count;
         b += warps) {
        const unsigned long long addr = blocks[2 * b], len = blocks[2 * b + 1];
        const unsigned long long words = (len + 7) >> 3;
        unsigned long long sum = 0;
        for (unsigned long long i = lane; i < words; i += 32) {
            unsigned long long w = 0;
            if ((addr & 7) == 0 && 8 * i + 8 <= len) {
                w = ((const unsigned long long *)addr)[i];
            } else {
                const unsigned char *p = (const unsigned char *)addr;
                for (unsigned k = 0; k < 8 && 8 * i + k < len; k++) w |= (unsigned long long)p[8 * i + k] << (8 * k);
            }
            sum += fmix64(w ^ (i * WORD_STEP) ^ SEED);
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
        if (lane == 0) out[b] = sum;
    }
}
