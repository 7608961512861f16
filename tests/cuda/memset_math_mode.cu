// cudaMemsetAsync and cublasGetMathMode as PyTorch issues them in a training loop: memsets
// of a few bytes to a MiB on the legacy default stream and on a created stream, and the
// handle's math mode asked, set and set back around each GEMM. The first argument is the
// number of rounds (default 50). The memsets' results are checked, and so is what CUDA
// answers a memset of freed memory and a null mode pointer. Through Phos, the memsets after
// the first on a range go without waiting and the guest library answers the math mode, so the
// number of synchronous calls does not grow with the rounds (the e2e test reads it from
// PHOS_PROFILE).
#include <cstdlib>
#include <vector>

#include <cublas_v2.h>

#include "check.h"

#define BLAS(call)                                                                           \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            std::printf("FAILED: %s -> %d at %s:%d\n", #call, (int)s_, __FILE__, __LINE__); \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static const size_t big = 1 << 20;

// Every byte of `d` (`n` bytes) is `value`.
static bool all_bytes(const unsigned char *d, size_t n, unsigned char value) {
    std::vector<unsigned char> h(n);
    CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i)
        if (h[i] != value) return false;
    return true;
}

static int math_mode(cublasHandle_t h) {
    cublasMath_t mode;
    BLAS(cublasGetMathMode(h, &mode));
    return (int)mode;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 50;
    EXPECT(rounds > 0);
    unsigned char *buf, *small;
    CHECK(cudaMalloc(&buf, big));
    CHECK(cudaMalloc(&small, 64));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    BLAS(cublasSetStream(h, stream));
    std::printf("math mode of a new handle: %d\n", math_mode(h));

    bool modes_ok = true;
    for (int i = 0; i < rounds; ++i) {
        unsigned char v = (unsigned char)(i + 1);
        // The whole buffer on the created stream, then parts of it and a few bytes on stream 0.
        // (The created stream is a blocking one: stream 0's work and its own are ordered.)
        CHECK(cudaMemsetAsync(buf, v, big, stream));
        CHECK(cudaMemsetAsync(buf + 4096, v + 1, 8192, 0));
        CHECK(cudaMemsetAsync(small, v, 4, 0));
        CHECK(cudaMemsetAsync(small + 4, v + 2, 60, stream));
        CHECK(cudaMemsetAsync(buf, v, 0, stream));

        int before = math_mode(h);
        BLAS(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
        int during = math_mode(h);
        BLAS(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
        int flagged = math_mode(h);
        BLAS(cublasSetMathMode(h, (cublasMath_t)before));
        modes_ok = modes_ok && before == CUBLAS_DEFAULT_MATH && during == CUBLAS_TF32_TENSOR_OP_MATH &&
                   flagged == (CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    }
    CHECK(cudaDeviceSynchronize());
    unsigned char last = (unsigned char)rounds;
    bool memsets_ok = all_bytes(buf, 4096, last) && all_bytes(buf + 4096, 8192, (unsigned char)(last + 1)) &&
                      all_bytes(buf + 4096 + 8192, big - 4096 - 8192, last) && all_bytes(small, 4, last) &&
                      all_bytes(small + 4, 60, (unsigned char)(last + 2));
    std::printf("memsets: %s\n", memsets_ok ? "ok" : "WRONG");
    std::printf("math modes: %s\n", modes_ok ? "ok" : "WRONG");
    std::printf("math mode after the rounds: %d\n", math_mode(h));
    std::printf("null mode pointer: %d\n", (int)cublasGetMathMode(h, nullptr));

    // Freed memory: the memset that proved its range no longer holds.
    CHECK(cudaFree(buf));
    cudaError_t freed = cudaMemsetAsync(buf, 0, 64, stream);
    std::printf("memset of freed memory: %s\n", cudaGetErrorName(freed));
    std::printf("last error after it: %s\n", cudaGetErrorName(cudaGetLastError()));
    std::printf("last error now: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaStreamSynchronize(stream));

    BLAS(cublasDestroy(h));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(small));
    std::printf("done\n");
    return memsets_ok && modes_ok ? 0 : 1;
}
