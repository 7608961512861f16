// Kernels calling __device__ functions that are not inlined (so PTX has .func and call),
// including recursion and functions returning structs.
#include "check.h"

struct Pair {
    int lo, hi;
};

__device__ __noinline__ int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

__device__ __noinline__ long long factorial(int n) { return n <= 1 ? 1 : n * factorial(n - 1); }

__device__ __noinline__ Pair split(unsigned v) { return Pair{(int)(v & 0xffff), (int)(v >> 16)}; }

__device__ __noinline__ float lerp3(float a, float b, float t) { return a + (b - a) * t; }

__global__ void compute(const unsigned *in, int *g, long long *f, Pair *p, float *l, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned v = in[i];
    g[i] = gcd((int)(v % 1000) + 1, (int)(v % 360) + 1);
    f[i] = factorial(i % 21);
    p[i] = split(v);
    l[i] = lerp3((float)(i % 10), (float)(i % 17), 0.25f);
}

int main() {
    const int n = 2048;
    unsigned in[n];
    for (int i = 0; i < n; i++) in[i] = (unsigned)i * 2654435761u;
    unsigned *din;
    int *dg;
    long long *df;
    Pair *dp;
    float *dl;
    CHECK(cudaMalloc(&din, sizeof(in)));
    CHECK(cudaMalloc(&dg, n * sizeof(int)));
    CHECK(cudaMalloc(&df, n * sizeof(long long)));
    CHECK(cudaMalloc(&dp, n * sizeof(Pair)));
    CHECK(cudaMalloc(&dl, n * sizeof(float)));
    CHECK(cudaMemcpy(din, in, sizeof(in), cudaMemcpyHostToDevice));
    compute<<<n / 128, 128>>>(din, dg, df, dp, dl, n);
    CHECK_LAUNCH();
    static int g[n];
    static long long f[n];
    static Pair p[n];
    static float l[n];
    CHECK(cudaMemcpy(g, dg, sizeof(g), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(f, df, sizeof(f), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(p, dp, sizeof(p), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(l, dl, sizeof(l), cudaMemcpyDeviceToHost));
    long long gsum = 0;
    double lsum = 0;
    for (int i = 0; i < n; i++) {
        gsum += g[i];
        lsum += l[i];
        EXPECT(p[i].lo == (int)(in[i] & 0xffff) && p[i].hi == (int)(in[i] >> 16));
    }
    std::printf("gcd sum=%lld 20!=%lld 13!=%lld lerp sum=%.2f\n", gsum, f[20], f[13], lsum);
    EXPECT(f[20] == 2432902008176640000LL);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dg));
    CHECK(cudaFree(df));
    CHECK(cudaFree(dp));
    CHECK(cudaFree(dl));
    std::printf("PASS\n");
    return 0;
}
