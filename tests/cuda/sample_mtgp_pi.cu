// The shape of NVIDIA's MersenneTwisterGP11213 and MC_EstimatePiQ samples: normals from an
// MTGP32 generator on the device are compared with those of a host generator of the same type
// and seed (curandCreateGeneratorHost), and their moments checked; then a two-dimensional
// SOBOL32 quasi-random sequence (curandSetQuasiRandomGeneratorDimensions) estimates pi from
// the points inside the quarter circle, counted by a kernel of the program's. Output is
// verdicts only (the same wherever it runs).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <curand.h>

#include "check.h"

#define RAND(call)                                                                           \
    do {                                                                                     \
        curandStatus_t s_ = (call);                                                          \
        if (s_ != CURAND_STATUS_SUCCESS) {                                                   \
            std::printf("FAILED: %s -> curandStatus %d at %s:%d\n", #call, (int)s_, __FILE__, \
                        __LINE__);                                                           \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static void mersenne_twister() {
    const size_t n = 1 << 16;
    const unsigned long long seed = 777;
    float *d_normals;
    CHECK(cudaMalloc(&d_normals, sizeof(float) * n));
    curandGenerator_t device_gen, host_gen;
    RAND(curandCreateGenerator(&device_gen, CURAND_RNG_PSEUDO_MTGP32));
    RAND(curandSetPseudoRandomGeneratorSeed(device_gen, seed));
    RAND(curandGenerateNormal(device_gen, d_normals, n, 0.0f, 1.0f));
    std::vector<float> on_device(n), on_host(n);
    CHECK(cudaMemcpy(on_device.data(), d_normals, sizeof(float) * n, cudaMemcpyDeviceToHost));

    RAND(curandCreateGeneratorHost(&host_gen, CURAND_RNG_PSEUDO_MTGP32));
    RAND(curandSetPseudoRandomGeneratorSeed(host_gen, seed));
    RAND(curandGenerateNormal(host_gen, on_host.data(), n, 0.0f, 1.0f));

    double l1_diff = 0.0, l1_ref = 0.0, mean = 0.0, square = 0.0;
    for (size_t i = 0; i < n; ++i) {
        l1_diff += std::fabs(on_device[i] - on_host[i]);
        l1_ref += std::fabs(on_host[i]);
        mean += on_device[i];
        square += (double)on_device[i] * on_device[i];
    }
    mean /= n;
    const double variance = square / n - mean * mean;
    std::printf("MTGP32 normals (%zu): device %s the host generator; mean %s, variance %s\n", n,
                l1_diff / l1_ref < 1e-6 ? "matches" : "DIFFERS from", std::fabs(mean) < 0.02 ? "near 0" : "WRONG",
                std::fabs(variance - 1.0) < 0.03 ? "near 1" : "WRONG");
    RAND(curandDestroyGenerator(device_gen));
    RAND(curandDestroyGenerator(host_gen));
    CHECK(cudaFree(d_normals));
}

// Points (x[i], y[i]) inside the unit quarter circle, counted per block.
__global__ void count_inside(const float *x, const float *y, int n, unsigned int *inside) {
    __shared__ unsigned int block_count;
    if (threadIdx.x == 0) block_count = 0;
    __syncthreads();
    unsigned int mine = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        mine += x[i] * x[i] + y[i] * y[i] <= 1.0f;
    atomicAdd(&block_count, mine);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(inside, block_count);
}

static void estimate_pi() {
    const int n = 1 << 16;
    float *d_points;
    unsigned int *d_inside;
    CHECK(cudaMalloc(&d_points, sizeof(float) * 2 * n));
    CHECK(cudaMalloc(&d_inside, sizeof(unsigned int)));
    CHECK(cudaMemset(d_inside, 0, sizeof(unsigned int)));
    curandGenerator_t gen;
    RAND(curandCreateGenerator(&gen, CURAND_RNG_QUASI_SOBOL32));
    RAND(curandSetQuasiRandomGeneratorDimensions(gen, 2));
    // Dimension-major: the first n values are every point's x, the next n every point's y.
    RAND(curandGenerateUniform(gen, d_points, 2 * n));
    count_inside<<<32, 128>>>(d_points, d_points + n, n, d_inside);
    CHECK_LAUNCH();
    unsigned int inside;
    CHECK(cudaMemcpy(&inside, d_inside, sizeof(unsigned int), cudaMemcpyDeviceToHost));
    const double pi = 4.0 * inside / n;
    std::printf("SOBOL32 (2 dimensions, %d points): pi estimate within %s of pi\n", n,
                std::fabs(pi - 3.14159265358979) < 1e-3 ? "1e-3" : "NOTHING");
    RAND(curandDestroyGenerator(gen));
    CHECK(cudaFree(d_points));
    CHECK(cudaFree(d_inside));
}

int main() {
    mersenne_twister();
    estimate_pi();
    std::printf("done\n");
    return 0;
}
