// Warp-level primitives: shuffle reductions and broadcasts, votes, ballots and match, in
// converged and divergent code.
#include "check.h"
#include <vector>

__global__ void warp_sum(const int *in, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i < n ? in[i] : 0;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, v);
}

__global__ void butterfly_max(const float *in, float *out) {
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int mask = 16; mask > 0; mask >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, mask));
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void votes(const int *in, unsigned *ballots, int *flags) {
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int v = in[threadIdx.x];
    unsigned b = __ballot_sync(0xffffffff, v > 50);
    int any = __any_sync(0xffffffff, v > 95);
    int all = __all_sync(0xffffffff, v >= 0);
    int broadcast = __shfl_sync(0xffffffff, v, 7);
    int up = __shfl_up_sync(0xffffffff, v, 3);
    if (lane == 0) {
        ballots[warp] = b;
        flags[warp * 4 + 0] = any;
        flags[warp * 4 + 1] = all;
        flags[warp * 4 + 2] = broadcast;
    }
    if (lane == 2) flags[warp * 4 + 3] = up;  // lanes below 3 keep their own value
    // Divergent: only odd lanes vote, and see only each other.
    if (lane & 1) {
        unsigned active = __activemask();
        unsigned odd = __ballot_sync(active, v % 2 == 0);
        if (lane == 1) ballots[8 + warp] = active ^ odd;
    }
#if __CUDA_ARCH__ >= 700
    unsigned same = __match_any_sync(0xffffffff, v % 4);
    if (lane == 5) ballots[16 + warp] = same;
#else
    if (lane == 5) ballots[16 + warp] = 0;
#endif
}

int main() {
    const int n = 100000;
    std::vector<int> in(n);
    long long expected = 0;
    for (int i = 0; i < n; i++) {
        in[i] = (i * 37) % 101;
        expected += in[i];
    }
    int *din, *dout;
    CHECK(cudaMalloc(&din, n * sizeof(int)));
    CHECK(cudaMalloc(&dout, sizeof(int)));
    CHECK(cudaMemcpy(din, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0, sizeof(int)));
    warp_sum<<<(n + 255) / 256, 256>>>(din, dout, n);
    CHECK_LAUNCH();
    int total = 0;
    CHECK(cudaMemcpy(&total, dout, sizeof(int), cudaMemcpyDeviceToHost));
    std::printf("warp shuffle sum=%d expected=%lld\n", total, expected);
    EXPECT(total == expected);

    std::vector<float> f(256);
    for (int i = 0; i < 256; i++) f[i] = (float)((i * 73) % 256) * 0.5f;
    float *df, *dmax;
    CHECK(cudaMalloc(&df, 256 * sizeof(float)));
    CHECK(cudaMalloc(&dmax, 256 * sizeof(float)));
    CHECK(cudaMemcpy(df, f.data(), 256 * sizeof(float), cudaMemcpyHostToDevice));
    butterfly_max<<<2, 128>>>(df, dmax);
    CHECK_LAUNCH();
    std::vector<float> mx(256);
    CHECK(cudaMemcpy(mx.data(), dmax, 256 * sizeof(float), cudaMemcpyDeviceToHost));
    for (int w = 0; w < 8; w++) std::printf("warp %d max=%.1f\n", w, mx[w * 32 + 13]);

    unsigned *dballots;
    int *dflags;
    CHECK(cudaMalloc(&dballots, 24 * sizeof(unsigned)));
    CHECK(cudaMalloc(&dflags, 32 * sizeof(int)));
    CHECK(cudaMemset(dballots, 0, 24 * sizeof(unsigned)));
    votes<<<1, 256>>>(din, dballots, dflags);
    CHECK_LAUNCH();
    unsigned ballots[24];
    int flags[32];
    CHECK(cudaMemcpy(ballots, dballots, sizeof(ballots), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(flags, dflags, sizeof(flags), cudaMemcpyDeviceToHost));
    for (int w = 0; w < 8; w++)
        std::printf("warp %d ballot=%08x any=%d all=%d bcast=%d up=%d odd=%08x\n", w, ballots[w], flags[w * 4],
                    flags[w * 4 + 1], flags[w * 4 + 2], flags[w * 4 + 3], ballots[8 + w]);
    for (int w = 0; w < 8; w++) std::printf("warp %d match lane5=%08x\n", w, ballots[16 + w]);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(df));
    CHECK(cudaFree(dmax));
    CHECK(cudaFree(dballots));
    CHECK(cudaFree(dflags));
    std::printf("PASS\n");
    return 0;
}
