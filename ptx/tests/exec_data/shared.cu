// Shared memory: tiled matrix multiply, reductions, dynamic shared memory.
template <int TILE>
__global__ void matmul_tiled(const float *A, const float *B, float *C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
template __global__ void matmul_tiled<16>(const float *, const float *, float *, int, int, int);
template __global__ void matmul_tiled<8>(const float *, const float *, float *, int, int, int);

extern "C" __global__ void reduce_shared(const int *in, int *out, int n) {
    __shared__ int s[256];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x * 2 + tid;
    int v = 0;
    if (i < n) v += in[i];
    if (i + blockDim.x < n) v += in[i + blockDim.x];
    s[tid] = v;
    __syncthreads();
    for (unsigned st = blockDim.x / 2; st > 0; st >>= 1) {
        if (tid < st) s[tid] += s[tid + st];
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = s[0];
}

extern "C" __global__ void reduce_shfl(const float *in, float *out, int n) {
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += in[i];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    __shared__ float warp_sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) atomicAdd(out, v);
    }
}

extern "C" __global__ void dynamic_reverse(int *data, int n) {
    extern __shared__ int buf[];
    int t = threadIdx.x;
    if (t < n) buf[t] = data[t];
    __syncthreads();
    if (t < n) data[t] = buf[n - 1 - t];
}

// __syncthreads_count / _and / _or (bar.red).
extern "C" __global__ void barrier_reductions(const int *in, int *out) {
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    int c = __syncthreads_count(v > 0);
    int a = __syncthreads_and(v > 0);
    int o = __syncthreads_or(v > 100);
    if (threadIdx.x == 0) {
        out[blockIdx.x * 3] = c;
        out[blockIdx.x * 3 + 1] = a;
        out[blockIdx.x * 3 + 2] = o;
    }
}
