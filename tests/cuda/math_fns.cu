// Single and double precision arithmetic and math functions; results checked against the
// host with tolerances and printed at a precision where the GPU's approximations agree.
#include "check.h"
#include <cmath>

__global__ void math(const float *x, const double *y, float *fo, double *dout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = x[i];
    double b = y[i];
    fo[i * 8 + 0] = sqrtf(a);
    fo[i * 8 + 1] = expf(-a * 0.01f);
    fo[i * 8 + 2] = logf(a + 1.0f);
    fo[i * 8 + 3] = sinf(a * 0.1f);
    fo[i * 8 + 4] = cosf(a * 0.1f);
    fo[i * 8 + 5] = fmaf(a, 1.5f, -2.0f);
    fo[i * 8 + 6] = a / 3.0f;
    fo[i * 8 + 7] = rsqrtf(a + 1.0f);
    dout[i * 6 + 0] = sqrt(b);
    dout[i * 6 + 1] = exp(-b * 0.01);
    dout[i * 6 + 2] = log(b + 1.0);
    dout[i * 6 + 3] = sin(b * 0.1);
    dout[i * 6 + 4] = pow(b + 1.0, 0.3);
    dout[i * 6 + 5] = b / 7.0;
}

int main() {
    const int n = 1000;
    static float x[n], fo[n * 8];
    static double y[n], dout[n * 6];
    for (int i = 0; i < n; i++) {
        x[i] = i * 0.37f;
        y[i] = i * 0.73;
    }
    float *dx, *dfo;
    double *dy, *ddo;
    CHECK(cudaMalloc(&dx, sizeof(x)));
    CHECK(cudaMalloc(&dy, sizeof(y)));
    CHECK(cudaMalloc(&dfo, sizeof(fo)));
    CHECK(cudaMalloc(&ddo, sizeof(dout)));
    CHECK(cudaMemcpy(dx, x, sizeof(x), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y, sizeof(y), cudaMemcpyHostToDevice));
    math<<<(n + 127) / 128, 128>>>(dx, dy, dfo, ddo, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(fo, dfo, sizeof(fo), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(dout, ddo, sizeof(dout), cudaMemcpyDeviceToHost));
    double fsum[8] = {}, dsum[6] = {};
    for (int i = 0; i < n; i++) {
        float a = x[i];
        double b = y[i];
        float fref[8] = {sqrtf(a), expf(-a * 0.01f), logf(a + 1.0f), sinf(a * 0.1f), cosf(a * 0.1f),
                         a * 1.5f - 2.0f, a / 3.0f, 1.0f / sqrtf(a + 1.0f)};
        double dref[6] = {sqrt(b), exp(-b * 0.01), log(b + 1.0), sin(b * 0.1), pow(b + 1.0, 0.3), b / 7.0};
        for (int k = 0; k < 8; k++) {
            EXPECT(std::fabs(fo[i * 8 + k] - fref[k]) <= 1e-5f * (1.0f + std::fabs(fref[k])));
            fsum[k] += fo[i * 8 + k];
        }
        for (int k = 0; k < 6; k++) {
            EXPECT(std::fabs(dout[i * 6 + k] - dref[k]) <= 1e-12 * (1.0 + std::fabs(dref[k])));
            dsum[k] += dout[i * 6 + k];
        }
    }
    std::printf("float sums: sqrt %.2f exp %.2f log %.2f sin %.2f cos %.2f fma %.1f div %.2f rsqrt %.2f\n", fsum[0],
                fsum[1], fsum[2], fsum[3], fsum[4], fsum[5], fsum[6], fsum[7]);
    std::printf("double sums: sqrt %.6f exp %.6f log %.6f sin %.6f pow %.6f div %.6f\n", dsum[0], dsum[1], dsum[2],
                dsum[3], dsum[4], dsum[5]);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dfo));
    CHECK(cudaFree(ddo));
    std::printf("PASS\n");
    return 0;
}
