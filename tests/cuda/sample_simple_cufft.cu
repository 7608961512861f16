// The shape of NVIDIA's simpleCUFFT sample and of a 2D real transform as image code makes
// it: a batch of 1D complex signals is padded, transformed forward (one C2C plan of the whole
// batch), multiplied pointwise by a filter's spectrum in a kernel of the program's, scaled
// and transformed back, and the result is checked against the direct circular convolution on
// the host; then a batch of 2D images goes through R2C and C2R plans made by cufftPlanMany
// (the default packed layout), the round trip is checked, and one spectrum bin is checked
// against its DFT sum. Last, a plan with one embedding NULL beside one that is not is
// refused, as cuFFT 13 refuses it. Output is verdicts only (the same wherever it runs).
#include <cmath>
#include <cstdio>
#include <vector>

#include <cufft.h>

#include "check.h"

#define FFT(call)                                                                            \
    do {                                                                                     \
        cufftResult r_ = (call);                                                             \
        if (r_ != CUFFT_SUCCESS) {                                                           \
            std::printf("FAILED: %s -> cufftResult %d at %s:%d\n", #call, (int)r_, __FILE__, \
                        __LINE__);                                                           \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

// Pointwise complex product of each signal's spectrum with the filter's, with the 1/n the
// inverse transform leaves out.
__global__ void multiply_and_scale(cufftComplex *signals, const cufftComplex *filter, int n,
                                   int batch, float scale) {
    int stride = blockDim.x * gridDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n * batch; i += stride) {
        cufftComplex a = signals[i], b = filter[i % n];
        cufftComplex c;
        c.x = (a.x * b.x - a.y * b.y) * scale;
        c.y = (a.x * b.y + a.y * b.x) * scale;
        signals[i] = c;
    }
}

static void convolution_1d() {
    const int n = 256, batch = 4, taps = 11;
    std::vector<cufftComplex> signals(n * batch), filter(n);
    for (int b = 0; b < batch; ++b)
        for (int i = 0; i < n; ++i)
            signals[b * n + i] = {(float)((i * 7 + b * 3) % 13) - 6.0f, (float)((i + b) % 5) - 2.0f};
    for (int i = 0; i < n; ++i) filter[i] = {0.0f, 0.0f};
    for (int i = 0; i < taps; ++i) filter[i] = {(float)(i % 4) - 1.5f, (float)(i % 3) * 0.5f};

    cufftComplex *d_signals, *d_filter;
    CHECK(cudaMalloc(&d_signals, sizeof(cufftComplex) * n * batch));
    CHECK(cudaMalloc(&d_filter, sizeof(cufftComplex) * n));
    CHECK(cudaMemcpy(d_signals, signals.data(), sizeof(cufftComplex) * n * batch, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_filter, filter.data(), sizeof(cufftComplex) * n, cudaMemcpyHostToDevice));

    cufftHandle batched, single;
    FFT(cufftPlan1d(&batched, n, CUFFT_C2C, batch));
    FFT(cufftPlan1d(&single, n, CUFFT_C2C, 1));
    FFT(cufftExecC2C(batched, d_signals, d_signals, CUFFT_FORWARD));
    FFT(cufftExecC2C(single, d_filter, d_filter, CUFFT_FORWARD));
    multiply_and_scale<<<8, 64>>>(d_signals, d_filter, n, batch, 1.0f / n);
    CHECK_LAUNCH();
    FFT(cufftExecC2C(batched, d_signals, d_signals, CUFFT_INVERSE));
    std::vector<cufftComplex> result(n * batch);
    CHECK(cudaMemcpy(result.data(), d_signals, sizeof(cufftComplex) * n * batch, cudaMemcpyDeviceToHost));

    double worst = 0.0;
    for (int b = 0; b < batch; ++b)
        for (int i = 0; i < n; ++i) {
            double re = 0.0, im = 0.0;
            for (int k = 0; k < taps; ++k) {
                const cufftComplex s = signals[b * n + ((i - k + n) % n)], f = filter[k];
                re += (double)s.x * f.x - (double)s.y * f.y;
                im += (double)s.x * f.y + (double)s.y * f.x;
            }
            worst = std::fmax(worst, std::fabs(re - result[b * n + i].x));
            worst = std::fmax(worst, std::fabs(im - result[b * n + i].y));
        }
    std::printf("1D C2C convolution (n = %d, batch = %d, %d taps): %s\n", n, batch, taps,
                worst < 1e-3 ? "matches the direct sum" : "WRONG");
    if (worst >= 1e-3) std::printf("  worst error %g\n", worst);
    FFT(cufftDestroy(batched));
    FFT(cufftDestroy(single));
    CHECK(cudaFree(d_signals));
    CHECK(cudaFree(d_filter));
}

static void real_2d() {
    const int rows = 32, cols = 48, batch = 3;
    const int half = cols / 2 + 1;
    int dims[2] = {rows, cols};
    std::vector<float> images(rows * cols * batch);
    for (int b = 0; b < batch; ++b)
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c)
                images[(b * rows + r) * cols + c] = (float)((r * 5 + c * 3 + b * 11) % 17) - 8.0f;

    float *d_images;
    cufftComplex *d_spectra;
    CHECK(cudaMalloc(&d_images, sizeof(float) * rows * cols * batch));
    CHECK(cudaMalloc(&d_spectra, sizeof(cufftComplex) * rows * half * batch));
    CHECK(cudaMemcpy(d_images, images.data(), sizeof(float) * images.size(), cudaMemcpyHostToDevice));

    cufftHandle forward, inverse;
    FFT(cufftPlanMany(&forward, 2, dims, NULL, 1, rows * cols, NULL, 1, rows * half, CUFFT_R2C, batch));
    FFT(cufftPlanMany(&inverse, 2, dims, NULL, 1, rows * half, NULL, 1, rows * cols, CUFFT_C2R, batch));
    FFT(cufftExecR2C(forward, d_images, d_spectra));
    std::vector<cufftComplex> spectra(rows * half * batch);
    CHECK(cudaMemcpy(spectra.data(), d_spectra, sizeof(cufftComplex) * spectra.size(), cudaMemcpyDeviceToHost));

    // One bin of the last image, against its DFT sum.
    const int b = batch - 1, u = 3, v = 5;
    const double pi = 3.14159265358979323846;
    double re = 0.0, im = 0.0;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const double angle = -2.0 * pi * ((double)u * r / rows + (double)v * c / cols);
            const double x = images[(b * rows + r) * cols + c];
            re += x * std::cos(angle);
            im += x * std::sin(angle);
        }
    const cufftComplex bin = spectra[(b * rows + u) * half + v];
    const bool bin_ok = std::fabs(re - bin.x) < 1e-2 && std::fabs(im - bin.y) < 1e-2;

    FFT(cufftExecC2R(inverse, d_spectra, d_images));
    std::vector<float> back(images.size());
    CHECK(cudaMemcpy(back.data(), d_images, sizeof(float) * back.size(), cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (size_t i = 0; i < back.size(); ++i)
        worst = std::fmax(worst, std::fabs(back[i] / (rows * cols) - images[i]));
    std::printf("2D R2C/C2R (cufftPlanMany, %d x %d, batch %d): bin (%d, %d) %s, round trip %s\n", rows,
                cols, batch, u, v, bin_ok ? "correct" : "WRONG", worst < 1e-4 ? "exact" : "WRONG");
    FFT(cufftDestroy(forward));
    FFT(cufftDestroy(inverse));
    CHECK(cudaFree(d_images));
    CHECK(cudaFree(d_spectra));
}

static void one_null_embedding() {
    int n[1] = {64}, embed[1] = {64};
    cufftHandle plan;
    cufftResult r = cufftPlanMany(&plan, 1, n, embed, 1, 64, NULL, 1, 64, CUFFT_C2C, 2);
    std::printf("cufftPlanMany with one NULL embedding: %s\n",
                r == CUFFT_INVALID_VALUE ? "CUFFT_INVALID_VALUE" : r == CUFFT_SUCCESS ? "accepted" : "other");
    if (r == CUFFT_SUCCESS) FFT(cufftDestroy(plan));
}

int main() {
    convolution_1d();
    real_2d();
    one_null_embedding();
    std::printf("done\n");
    return 0;
}
