// GEMMs as PyTorch issues them: before each one the handle's stream, workspace and math mode
// are set again (the same values every time), then the GEMM runs (cublasSgemm, cublasGemmEx
// and cublasSgemmStridedBatched in turn, each adding A*B to C). The results are checked
// against a host computation. The first argument is the number of GEMMs (default 60). Through
// Phos, the GEMMs and the setters that change something are sent without waiting and the
// setters that change nothing are answered by the guest library, so the number of synchronous
// calls does not grow with the number of GEMMs (the e2e test reads it from PHOS_PROFILE).
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

int main(int argc, char **argv) {
    int gemms = argc > 1 ? std::atoi(argv[1]) : 60;
    EXPECT(gemms > 0);
    const int n = 8;
    const size_t workspace_bytes = 1 << 20;
    std::vector<float> a(n * n), b(n * n), c(n * n, 0.0f);
    for (int i = 0; i < n * n; ++i) {
        a[i] = (float)(i % 7 - 3);
        b[i] = (float)(i % 5 - 2);
    }
    float *da, *db, *dc;
    void *workspace;
    CHECK(cudaMalloc(&da, n * n * sizeof(float)));
    CHECK(cudaMalloc(&db, n * n * sizeof(float)));
    CHECK(cudaMalloc(&dc, n * n * sizeof(float)));
    CHECK(cudaMalloc(&workspace, workspace_bytes));
    CHECK(cudaMemcpy(da, a.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dc, 0, n * n * sizeof(float)));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    const float one = 1.0f;
    for (int i = 0; i < gemms; ++i) {
        BLAS(cublasSetStream(h, stream));
        BLAS(cublasSetWorkspace(h, workspace, workspace_bytes));
        BLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
        switch (i % 3) {
        case 0:
            BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da, n, db, n, &one, dc, n));
            break;
        case 1:
            BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da, CUDA_R_32F, n, db, CUDA_R_32F, n, &one,
                              dc, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            break;
        default:
            BLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da, n, 0, db, n, 0, &one, dc,
                                           n, 0, 1));
            break;
        }
    }
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(c.data(), dc, n * n * sizeof(float), cudaMemcpyDeviceToHost));
    // Small integers: every sum is exact in single precision.
    int wrong = 0;
    for (int col = 0; col < n; ++col) {
        for (int row = 0; row < n; ++row) {
            float sum = 0;
            for (int k = 0; k < n; ++k) sum += a[row + k * n] * b[k + col * n];
            if (c[row + col * n] != sum * (float)gemms) ++wrong;
        }
    }
    std::printf("gemms with the handle's settings set before each: %s\n", wrong == 0 ? "C is right" : "C is WRONG");
    cudaStream_t got;
    BLAS(cublasGetStream(h, &got));
    std::printf("the handle's stream: %s\n", got == stream ? "the one set" : "WRONG");
    BLAS(cublasDestroy(h));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(workspace));
    CHECK(cudaFree(dc));
    CHECK(cudaFree(db));
    CHECK(cudaFree(da));
    std::printf("done\n");
    return wrong == 0 ? 0 : 1;
}
