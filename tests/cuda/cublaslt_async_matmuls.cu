// cuBLASLt matmuls as PyTorch issues them: on a cuBLAS handle cast to a cuBLASLt handle, on a
// stream, each adding A*B to C in place (D is C). The result is checked against a host
// computation. The first argument is the number of matmuls (default 60). Through Phos, the
// matmuls after the first are sent without waiting (the handle is live and the guest knows
// the descriptors), so the number of synchronous calls does not grow with the number of
// matmuls (the e2e test reads it from PHOS_PROFILE).
#include <cstdlib>
#include <vector>

#include <cublasLt.h>
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
    int matmuls = argc > 1 ? std::atoi(argv[1]) : 60;
    EXPECT(matmuls > 0);
    const int n = 8;
    std::vector<float> a(n * n), b(n * n), c(n * n, 0.0f);
    for (int i = 0; i < n * n; ++i) {
        a[i] = (float)(i % 7 - 3);
        b[i] = (float)(i % 5 - 2);
    }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, n * n * sizeof(float)));
    CHECK(cudaMalloc(&db, n * n * sizeof(float)));
    CHECK(cudaMalloc(&dc, n * n * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dc, 0, n * n * sizeof(float)));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    cublasLtHandle_t lt = reinterpret_cast<cublasLtHandle_t>(h);
    cublasLtMatmulDesc_t desc;
    BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t layout;
    BLAS(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, n, n, n));
    const float one = 1.0f;
    for (int i = 0; i < matmuls; ++i) {
        BLAS(cublasLtMatmul(lt, desc, &one, da, layout, db, layout, &one, dc, layout, dc, layout, nullptr, nullptr, 0,
                            stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(c.data(), dc, n * n * sizeof(float), cudaMemcpyDeviceToHost));
    // Small integers: every sum is exact in single precision.
    int wrong = 0;
    for (int col = 0; col < n; ++col) {
        for (int row = 0; row < n; ++row) {
            float sum = 0;
            for (int k = 0; k < n; ++k) sum += a[row + k * n] * b[k + col * n];
            if (c[row + col * n] != sum * (float)matmuls) ++wrong;
        }
    }
    std::printf("matmuls on a cuBLAS handle: %s\n", wrong == 0 ? "C is right" : "C is WRONG");
    BLAS(cublasLtMatrixLayoutDestroy(layout));
    BLAS(cublasLtMatmulDescDestroy(desc));
    BLAS(cublasDestroy(h));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dc));
    CHECK(cudaFree(db));
    CHECK(cudaFree(da));
    std::printf("done\n");
    return wrong == 0 ? 0 : 1;
}
