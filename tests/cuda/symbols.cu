// __constant__ and __device__ variables: initial values, cudaMemcpyToSymbol/FromSymbol with
// offsets, a kernel reading constants and updating a device counter atomically.
#include "check.h"
#include <cmath>

__constant__ float coefficients[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__device__ int counter = 100;
__device__ float table[8];

__global__ void evaluate(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = coefficients[0] + v * (coefficients[1] + v * (coefficients[2] + v * coefficients[3])) + table[i % 8];
        atomicAdd(&counter, 1);
    }
}

int main() {
    const int n = 1000;
    float x[n], y[n];
    for (int i = 0; i < n; i++) x[i] = (i % 17) * 0.125f;
    int initial = 0;
    CHECK(cudaMemcpyFromSymbol(&initial, counter, sizeof(int)));
    std::printf("initial counter=%d\n", initial);
    float init_coeff[4];
    CHECK(cudaMemcpyFromSymbol(init_coeff, coefficients, sizeof(init_coeff)));
    std::printf("initial coefficients=%.1f %.1f %.1f %.1f\n", init_coeff[0], init_coeff[1], init_coeff[2], init_coeff[3]);
    // Replace the last two coefficients only (offset copy).
    float tail[2] = {0.5f, -1.0f};
    CHECK(cudaMemcpyToSymbol(coefficients, tail, sizeof(tail), 2 * sizeof(float)));
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = i * 10.0f;
    CHECK(cudaMemcpyToSymbol(table, t, sizeof(t)));
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, sizeof(x)));
    CHECK(cudaMalloc(&dy, sizeof(y)));
    CHECK(cudaMemcpy(dx, x, sizeof(x), cudaMemcpyHostToDevice));
    evaluate<<<(n + 127) / 128, 128>>>(dx, dy, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(y, dy, sizeof(y), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float v = x[i];
        float want = 1.0f + v * (2.0f + v * (0.5f + v * -1.0f)) + (i % 8) * 10.0f;
        EXPECT(std::abs(y[i] - want) <= 1e-4f * (1.0f + std::abs(want)));
        sum += y[i];
    }
    int final_count = 0;
    CHECK(cudaMemcpyFromSymbol(&final_count, counter, sizeof(int)));
    std::printf("final counter=%d sum=%.3f\n", final_count, sum);
    EXPECT(final_count == 100 + n);
    // Out of bounds: 8 bytes at offset 12 of a 16-byte symbol.
    cudaError_t e = cudaMemcpyToSymbol(coefficients, tail, 8, 12);
    std::printf("out-of-bounds symbol copy: %s\n", cudaGetErrorName(e));
    EXPECT(e != cudaSuccess);
    CHECK(cudaGetLastError() == e ? cudaSuccess : cudaErrorUnknown);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    std::printf("PASS\n");
    return 0;
}
