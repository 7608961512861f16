// Kernels taking structs by value: mixed alignment, a large struct, and scalars around them.
#include "check.h"

struct Mixed {
    char tag;
    double scale;
    int offset;
    short small;
};

struct Big {
    int values[64];
    float weight;
};

__global__ void apply(Mixed m, const int *in, double *out, int n, Big big, char suffix) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (in[i] + m.offset + m.small) * m.scale + big.values[i % 64] * big.weight + m.tag + suffix;
}

int main() {
    const int n = 4096;
    Mixed m{'A', 0.25, 1000, -7};
    Big big;
    for (int i = 0; i < 64; i++) big.values[i] = i * i;
    big.weight = 0.5f;
    int *din;
    double *dout;
    int in[n];
    for (int i = 0; i < n; i++) in[i] = i - n / 2;
    CHECK(cudaMalloc(&din, sizeof(in)));
    CHECK(cudaMalloc(&dout, n * sizeof(double)));
    CHECK(cudaMemcpy(din, in, sizeof(in), cudaMemcpyHostToDevice));
    apply<<<n / 128, 128>>>(m, din, dout, n, big, 'z');
    CHECK_LAUNCH();
    static double out[n];
    CHECK(cudaMemcpy(out, dout, sizeof(out), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double want = (in[i] + m.offset + m.small) * m.scale + big.values[i % 64] * big.weight + m.tag + 'z';
        EXPECT(out[i] == want);
        sum += out[i];
    }
    std::printf("struct_args sizeof(Mixed)=%zu sizeof(Big)=%zu sum=%.2f\n", sizeof(Mixed), sizeof(Big), sum);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    std::printf("PASS\n");
    return 0;
}
