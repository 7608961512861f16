// Templated kernels instantiated for float, double and int.
#include "check.h"
#include <vector>

template <typename T>
__global__ void axpy(T alpha, const T *x, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = alpha * x[i] + y[i];
}

template <typename T>
__global__ void square_sum(const T *x, T *out, int n) {
    __shared__ T partial[128];
    T v = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i] * x[i];
    partial[threadIdx.x] = v;
    __syncthreads();
    for (int s = 64; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

template <typename T>
static void run(const char *name, T alpha) {
    const int n = 50000;
    std::vector<T> x(n), y(n);
    for (int i = 0; i < n; i++) {
        x[i] = (T)(i % 100);
        y[i] = (T)(i % 7);
    }
    T *dx, *dy, *dout;
    CHECK(cudaMalloc(&dx, n * sizeof(T)));
    CHECK(cudaMalloc(&dy, n * sizeof(T)));
    CHECK(cudaMalloc(&dout, 16 * sizeof(T)));
    CHECK(cudaMemcpy(dx, x.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    axpy<T><<<(n + 127) / 128, 128>>>(alpha, dx, dy, n);
    CHECK_LAUNCH();
    square_sum<T><<<16, 128>>>(dy, dout, n);
    CHECK_LAUNCH();
    std::vector<T> out(16);
    CHECK(cudaMemcpy(y.data(), dy, n * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(out.data(), dout, 16 * sizeof(T), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT(y[i] == alpha * (T)(i % 100) + (T)(i % 7));
    double total = 0;
    for (T v : out) total += (double)v;
    std::printf("%s: y[12345]=%.2f sum of squares=%.1f\n", name, (double)y[12345], total);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dout));
}

int main() {
    run<float>("float", 2.5f);
    run<double>("double", -1.25);
    run<int>("int", 3);
    std::printf("PASS\n");
    return 0;
}
