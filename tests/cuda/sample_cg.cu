// The shape of NVIDIA's conjugateGradient sample (CUDA 12 form): a random symmetric
// tridiagonal, diagonally dominant matrix in CSR, solved by conjugate gradient with
// cuSPARSE's generic SpMV and cublasSaxpy/Sdot/Sscal/Scopy, checked on the host. Built with
// CUDA 12 or later it describes the read-only vector and matrix with the const descriptors
// (cusparseCreateConstDnVec, cusparseCreateConstCsr) and reads them back with the Const
// getters; built with CUDA 11 it finds those exports at run time when the loaded libcusparse
// has them. Output is verdicts only (the same wherever it runs).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <vector>

#include <cublas_v2.h>
#include <cusparse.h>

#include "check.h"

#define BLAS(call)                                                                           \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            std::printf("FAILED: %s -> cublasStatus %d at %s:%d\n", #call, (int)s_, __FILE__, \
                        __LINE__);                                                           \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

#define SPARSE(call)                                                                         \
    do {                                                                                     \
        cusparseStatus_t s_ = (call);                                                        \
        if (s_ != CUSPARSE_STATUS_SUCCESS) {                                                 \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, cusparseGetErrorName(s_),      \
                        __FILE__, __LINE__);                                                 \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

// A deterministic generator of the program's own (the same numbers on every machine).
static unsigned int state = 12345u;
static float next_unit() {
    state = state * 1664525u + 1013904223u;
    return (float)(state >> 8) / 16777216.0f;
}

static void tridiagonal(int n, std::vector<int> &rows, std::vector<int> &cols, std::vector<float> &vals) {
    rows.assign(n + 1, 0);
    cols.clear();
    vals.clear();
    std::vector<float> off(n, 0.0f);
    for (int i = 0; i + 1 < n; ++i) off[i] = next_unit();
    for (int i = 0; i < n; ++i) {
        rows[i] = (int)cols.size();
        if (i > 0) {
            cols.push_back(i - 1);
            vals.push_back(off[i - 1]);
        }
        cols.push_back(i);
        vals.push_back(next_unit() + 10.0f);
        if (i + 1 < n) {
            cols.push_back(i + 1);
            vals.push_back(off[i]);
        }
    }
    rows[n] = (int)cols.size();
}

// The descriptors of x (read) and A, through the const API where it is there.
typedef cusparseStatus_t (*CreateDnVecFn)(void *, int64_t, const void *, cudaDataType);
typedef cusparseStatus_t (*CreateCsrFn)(void *, int64_t, int64_t, int64_t, const void *, const void *,
                                        const void *, cusparseIndexType_t, cusparseIndexType_t,
                                        cusparseIndexBase_t, cudaDataType);
typedef cusparseStatus_t (*ConstDnVecGetFn)(void *, int64_t *, const void **, cudaDataType *);

int main() {
    const int n = 4096, max_iter = 1000;
    const float tol = 1e-5f;
    std::vector<int> rows, cols;
    std::vector<float> vals;
    tridiagonal(n, rows, cols, vals);
    const int nnz = (int)vals.size();
    std::vector<float> x(n, 0.0f), rhs(n, 1.0f);

    int *d_rows, *d_cols;
    float *d_vals, *d_x, *d_r, *d_p, *d_ax;
    CHECK(cudaMalloc(&d_rows, sizeof(int) * (n + 1)));
    CHECK(cudaMalloc(&d_cols, sizeof(int) * nnz));
    CHECK(cudaMalloc(&d_vals, sizeof(float) * nnz));
    CHECK(cudaMalloc(&d_x, sizeof(float) * n));
    CHECK(cudaMalloc(&d_r, sizeof(float) * n));
    CHECK(cudaMalloc(&d_p, sizeof(float) * n));
    CHECK(cudaMalloc(&d_ax, sizeof(float) * n));
    CHECK(cudaMemcpy(d_rows, rows.data(), sizeof(int) * (n + 1), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_cols, cols.data(), sizeof(int) * nnz, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_vals, vals.data(), sizeof(float) * nnz, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_x, x.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_r, rhs.data(), sizeof(float) * n, cudaMemcpyHostToDevice));

    cublasHandle_t blas;
    cusparseHandle_t sparse;
    BLAS(cublasCreate(&blas));
    SPARSE(cusparseCreate(&sparse));

    cusparseDnVecDescr_t vec_ax;
    SPARSE(cusparseCreateDnVec(&vec_ax, n, d_ax, CUDA_R_32F));
    bool const_api;
    int64_t read_size = 0;
#if CUSPARSE_VER_MAJOR >= 12
    cusparseConstDnVecDescr_t vec_p;
    cusparseConstSpMatDescr_t mat_a;
    SPARSE(cusparseCreateConstDnVec(&vec_p, n, d_p, CUDA_R_32F));
    SPARSE(cusparseCreateConstCsr(&mat_a, n, n, nnz, d_rows, d_cols, d_vals, CUSPARSE_INDEX_32I,
                                  CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    const void *read_values;
    cudaDataType read_type;
    SPARSE(cusparseConstDnVecGet(vec_p, &read_size, &read_values, &read_type));
    const_api = read_values == d_p && read_type == CUDA_R_32F;
#else
    cusparseDnVecDescr_t vec_p;
    cusparseSpMatDescr_t mat_a;
    // The loaded library's own exports: Phos's libcusparse.so.11 has the const API too.
    CreateDnVecFn create_const_vec = (CreateDnVecFn)dlsym(RTLD_DEFAULT, "cusparseCreateConstDnVec");
    CreateCsrFn create_const_csr = (CreateCsrFn)dlsym(RTLD_DEFAULT, "cusparseCreateConstCsr");
    ConstDnVecGetFn const_vec_get = (ConstDnVecGetFn)dlsym(RTLD_DEFAULT, "cusparseConstDnVecGet");
    if (create_const_vec && create_const_csr && const_vec_get) {
        SPARSE(create_const_vec(&vec_p, n, d_p, CUDA_R_32F));
        SPARSE(create_const_csr(&mat_a, n, n, nnz, d_rows, d_cols, d_vals, CUSPARSE_INDEX_32I,
                                CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
        const void *read_values;
        cudaDataType read_type;
        SPARSE(const_vec_get(vec_p, &read_size, &read_values, &read_type));
        const_api = read_values == d_p && read_type == CUDA_R_32F;
    } else {
        SPARSE(cusparseCreateDnVec(&vec_p, n, d_p, CUDA_R_32F));
        SPARSE(cusparseCreateCsr(&mat_a, n, n, nnz, d_rows, d_cols, d_vals, CUSPARSE_INDEX_32I,
                                 CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
        read_size = n;
        const_api = true;
    }
#endif
    EXPECT(const_api && read_size == n);

    const float one = 1.0f, zero = 0.0f;
    size_t buffer_size = 0;
    SPARSE(cusparseSpMV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_a, vec_p, &zero, vec_ax,
                                   CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &buffer_size));
    void *buffer = NULL;
    CHECK(cudaMalloc(&buffer, buffer_size > 0 ? buffer_size : 1));

    // r = b - A x with x = 0 is b; the sample's loop from there.
    float r0 = 0.0f, r1, dot, alpha, beta, neg_alpha;
    BLAS(cublasSdot(blas, n, d_r, 1, d_r, 1, &r1));
    int k = 0;
    while (r1 > tol * tol && k <= max_iter) {
        ++k;
        if (k == 1) {
            BLAS(cublasScopy(blas, n, d_r, 1, d_p, 1));
        } else {
            beta = r1 / r0;
            BLAS(cublasSscal(blas, n, &beta, d_p, 1));
            BLAS(cublasSaxpy(blas, n, &one, d_r, 1, d_p, 1));
        }
        SPARSE(cusparseSpMV(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_a, vec_p, &zero, vec_ax, CUDA_R_32F,
                            CUSPARSE_SPMV_ALG_DEFAULT, buffer));
        BLAS(cublasSdot(blas, n, d_p, 1, d_ax, 1, &dot));
        alpha = r1 / dot;
        BLAS(cublasSaxpy(blas, n, &alpha, d_p, 1, d_x, 1));
        neg_alpha = -alpha;
        BLAS(cublasSaxpy(blas, n, &neg_alpha, d_ax, 1, d_r, 1));
        r0 = r1;
        BLAS(cublasSdot(blas, n, d_r, 1, d_r, 1, &r1));
    }
    CHECK(cudaMemcpy(x.data(), d_x, sizeof(float) * n, cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (int i = 0; i < n; ++i) {
        double sum = 0.0;
        for (int j = rows[i]; j < rows[i + 1]; ++j) sum += (double)vals[j] * x[cols[j]];
        worst = std::fmax(worst, std::fabs(sum - rhs[i]));
    }
    std::printf("CG (n = %d, nnz = %d): %s, max |b - A x| %s 1e-4\n", n, nnz,
                k <= max_iter ? "converged" : "did NOT converge", worst < 1e-4 ? "below" : "NOT below");
    std::printf("const descriptors: x described read-only, read back\n");

    SPARSE(cusparseDestroySpMat(mat_a));
    SPARSE(cusparseDestroyDnVec(vec_p));
    SPARSE(cusparseDestroyDnVec(vec_ax));
    SPARSE(cusparseDestroy(sparse));
    BLAS(cublasDestroy(blas));
    CHECK(cudaFree(buffer));
    CHECK(cudaFree(d_rows));
    CHECK(cudaFree(d_cols));
    CHECK(cudaFree(d_vals));
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_r));
    CHECK(cudaFree(d_p));
    CHECK(cudaFree(d_ax));
    std::printf("done\n");
    return 0;
}
