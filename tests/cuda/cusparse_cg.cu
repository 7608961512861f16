// cuSPARSE's generic API through Phos: a conjugate gradient solve of a random tridiagonal
// symmetric positive definite system in CSR (SpMV with cuSPARSE, dot/axpy/scal/copy with
// cuBLAS, as NVIDIA's conjugateGradient sample does), in single and double precision; SpMV of a
// COO matrix with index base 1, transposed; SpMM (column- and row-major operands, op(B)
// transposed); SpGEMM (work estimation, compute, copy); a sparse-to-dense and dense-to-sparse
// round trip; Xcoo2csr/Xcsr2coo; and misuse that cuSPARSE itself refuses, with the status it
// answers. Each result is checked on the host; what is printed is the same wherever the
// program runs. With `hostile` it makes the calls a careless or hostile program makes (arrays
// past their allocation, indices outside the matrix, made-up and destroyed objects) and prints
// the status each gets; with `checkpoint` it sets a handle and descriptors up (a product whose
// size SpGEMM chose among them), says so, waits three seconds (a checkpoint and restore happen
// then) and computes with them afterwards.
#include <cmath>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <cublas_v2.h>
#include <cusparse.h>

#include "check.h"

#define SPARSE(call)                                                                         \
    do {                                                                                     \
        cusparseStatus_t s_ = (call);                                                        \
        if (s_ != CUSPARSE_STATUS_SUCCESS) {                                                 \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, cusparseGetErrorName(s_),      \
                        __FILE__, __LINE__);                                                 \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

#define BLAS(call)                                                                           \
    do {                                                                                     \
        if ((call) != CUBLAS_STATUS_SUCCESS) {                                               \
            std::printf("FAILED: %s at %s:%d\n", #call, __FILE__, __LINE__);                 \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

template <typename T> static T *to_device(const std::vector<T> &v) {
    T *d = nullptr;
    CHECK(cudaMalloc(&d, (v.empty() ? 1 : v.size()) * sizeof(T)));
    if (!v.empty()) CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T> static std::vector<T> from_device(const T *d, size_t n) {
    std::vector<T> v(n);
    if (n) CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// A fixed linear congruential generator: the same matrix everywhere.
static unsigned lcg_state = 12345;
static double next_unit() {
    lcg_state = lcg_state * 1103515245u + 12345u;
    return ((lcg_state >> 8) & 0xffff) / 65536.0;
}

// A random tridiagonal symmetric positive definite matrix of order n in CSR (0-based), as
// NVIDIA's sample makes one: a diagonal that dominates its row.
struct Csr {
    int n, nnz;
    std::vector<int> offsets, columns;
    std::vector<double> values;
};
static Csr tridiagonal(int n) {
    Csr a{n, 0, {0}, {}, {}};
    std::vector<double> off(n);
    for (int i = 0; i < n; i++) off[i] = next_unit();
    for (int i = 0; i < n; i++) {
        if (i > 0) {
            a.columns.push_back(i - 1);
            a.values.push_back(off[i - 1]);
        }
        a.columns.push_back(i);
        a.values.push_back(next_unit() + 10.0);
        if (i + 1 < n) {
            a.columns.push_back(i + 1);
            a.values.push_back(off[i]);
        }
        a.offsets.push_back((int)a.columns.size());
    }
    a.nnz = (int)a.columns.size();
    return a;
}

template <typename T> struct Types;
template <> struct Types<float> {
    static constexpr cudaDataType type = CUDA_R_32F;
    static constexpr const char *name = "float";
    static cublasStatus_t dot(cublasHandle_t h, int n, const float *x, const float *y, float *r) { return cublasSdot(h, n, x, 1, y, 1, r); }
    static cublasStatus_t axpy(cublasHandle_t h, int n, const float *a, const float *x, float *y) { return cublasSaxpy(h, n, a, x, 1, y, 1); }
    static cublasStatus_t scal(cublasHandle_t h, int n, const float *a, float *x) { return cublasSscal(h, n, a, x, 1); }
    static cublasStatus_t copy(cublasHandle_t h, int n, const float *x, float *y) { return cublasScopy(h, n, x, 1, y, 1); }
};
template <> struct Types<double> {
    static constexpr cudaDataType type = CUDA_R_64F;
    static constexpr const char *name = "double";
    static cublasStatus_t dot(cublasHandle_t h, int n, const double *x, const double *y, double *r) { return cublasDdot(h, n, x, 1, y, 1, r); }
    static cublasStatus_t axpy(cublasHandle_t h, int n, const double *a, const double *x, double *y) { return cublasDaxpy(h, n, a, x, 1, y, 1); }
    static cublasStatus_t scal(cublasHandle_t h, int n, const double *a, double *x) { return cublasDscal(h, n, a, x, 1); }
    static cublasStatus_t copy(cublasHandle_t h, int n, const double *x, double *y) { return cublasDcopy(h, n, x, 1, y, 1); }
};

// The conjugate gradient method of NVIDIA's sample: solve A x = 1 to a residual of `tol`.
template <typename T> static void conjugate_gradient(cusparseHandle_t sp, cublasHandle_t bl, int n, T tol) {
    Csr a = tridiagonal(n);
    std::vector<T> vals(a.values.begin(), a.values.end());
    int *d_off = to_device(a.offsets), *d_col = to_device(a.columns);
    T *d_val = to_device(vals);
    T *d_x = to_device(std::vector<T>(n, 0)), *d_r = to_device(std::vector<T>(n, 1));
    T *d_p = to_device(std::vector<T>(n, 0)), *d_ax = to_device(std::vector<T>(n, 0));
    const cudaDataType type = Types<T>::type;
    cusparseSpMatDescr_t A;
    cusparseDnVecDescr_t vx, vp, vax;
    SPARSE(cusparseCreateCsr(&A, n, n, a.nnz, d_off, d_col, d_val, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, type));
    SPARSE(cusparseCreateDnVec(&vx, n, d_x, type));
    SPARSE(cusparseCreateDnVec(&vp, n, d_p, type));
    SPARSE(cusparseCreateDnVec(&vax, n, d_ax, type));
    T alpha = 1, beta = 0, alpham1 = -1;
    size_t bytes = 0;
    SPARSE(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vx, &beta, vax, type,
                                   CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
    void *buffer = nullptr;
    CHECK(cudaMalloc(&buffer, bytes ? bytes : 1));

    // r = b - A x (x = 0), as the sample writes it.
    SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vx, &beta, vax, type,
                        CUSPARSE_SPMV_ALG_DEFAULT, buffer));
    BLAS(Types<T>::axpy(bl, n, &alpham1, d_ax, d_r));
    T r1, r0 = 0, dot, a_k, b_k, na_k;
    BLAS(Types<T>::dot(bl, n, d_r, d_r, &r1));
    int k = 1;
    const int max_iter = 1000;
    while (r1 > tol * tol && k <= max_iter) {
        if (k > 1) {
            b_k = r1 / r0;
            BLAS(Types<T>::scal(bl, n, &b_k, d_p));
            BLAS(Types<T>::axpy(bl, n, &alpha, d_r, d_p));
        } else {
            BLAS(Types<T>::copy(bl, n, d_r, d_p));
        }
        SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vp, &beta, vax, type,
                            CUSPARSE_SPMV_ALG_DEFAULT, buffer));
        BLAS(Types<T>::dot(bl, n, d_p, d_ax, &dot));
        a_k = r1 / dot;
        BLAS(Types<T>::axpy(bl, n, &a_k, d_p, d_x));
        na_k = -a_k;
        BLAS(Types<T>::axpy(bl, n, &na_k, d_ax, d_r));
        r0 = r1;
        BLAS(Types<T>::dot(bl, n, d_r, d_r, &r1));
        k++;
    }
    EXPECT(k <= max_iter);
    // The residual of the solution on the host, in double precision.
    std::vector<T> x = from_device(d_x, n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double sum = 0;
        for (int j = a.offsets[i]; j < a.offsets[i + 1]; j++) sum += (double)vals[j] * x[a.columns[j]];
        worst = std::fmax(worst, std::fabs(sum - 1.0));
    }
    EXPECT(worst < 1e3 * tol);
    std::printf("CG (%s, n = %d, nnz = %d): converged, max |b - A x| below %g\n", Types<T>::name, n, a.nnz,
                1e3 * (double)tol);
    SPARSE(cusparseDestroySpMat(A));
    SPARSE(cusparseDestroyDnVec(vx));
    SPARSE(cusparseDestroyDnVec(vp));
    SPARSE(cusparseDestroyDnVec(vax));
    for (void *p : {(void *)d_off, (void *)d_col, (void *)d_val, (void *)d_x, (void *)d_r, (void *)d_p,
                    (void *)d_ax, buffer})
        CHECK(cudaFree(p));
}

// A small general matrix (4 x 5) as dense rows, and its CSR.
static const double SMALL[4][5] = {{1, 0, 2, 0, 0}, {0, 3, 0, 0, 4}, {5, 0, 0, 6, 0}, {0, 0, 7, 0, 8}};
static Csr small_csr(int base) {
    Csr a{4, 0, {base}, {}, {}};
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 5; j++)
            if (SMALL[i][j] != 0) {
                a.columns.push_back(j + base);
                a.values.push_back(SMALL[i][j]);
            }
        a.offsets.push_back((int)a.columns.size() + base);
    }
    a.nnz = (int)a.columns.size();
    return a;
}

static bool close(double a, double b) { return std::fabs(a - b) <= 1e-4 * (1 + std::fabs(b)); }

// y = 2 A^T x + 0.5 y with A in COO, index base 1, double precision.
static void coo_transposed_spmv(cusparseHandle_t sp) {
    std::vector<int> rows, cols;
    std::vector<double> vals;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            if (SMALL[i][j] != 0) {
                rows.push_back(i + 1);
                cols.push_back(j + 1);
                vals.push_back(SMALL[i][j]);
            }
    std::vector<double> x = {1, -1, 2, 0.5}, y = {1, 2, 3, 4, 5};
    int *d_r = to_device(rows), *d_c = to_device(cols);
    double *d_v = to_device(vals), *d_x = to_device(x), *d_y = to_device(y);
    cusparseSpMatDescr_t A;
    cusparseDnVecDescr_t vx, vy;
    SPARSE(cusparseCreateCoo(&A, 4, 5, (int64_t)vals.size(), d_r, d_c, d_v, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ONE,
                             CUDA_R_64F));
    SPARSE(cusparseCreateDnVec(&vx, 4, d_x, CUDA_R_64F));
    SPARSE(cusparseCreateDnVec(&vy, 5, d_y, CUDA_R_64F));
    double alpha = 2, beta = 0.5;
    size_t bytes = 0;
    SPARSE(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_TRANSPOSE, &alpha, A, vx, &beta, vy, CUDA_R_64F,
                                   CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
    void *buffer = nullptr;
    CHECK(cudaMalloc(&buffer, bytes ? bytes : 1));
    SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_TRANSPOSE, &alpha, A, vx, &beta, vy, CUDA_R_64F,
                        CUSPARSE_SPMV_ALG_DEFAULT, buffer));
    std::vector<double> got = from_device(d_y, 5);
    std::printf("SpMV (COO, base 1, transposed, double): y =");
    for (int j = 0; j < 5; j++) {
        double want = 0.5 * y[j];
        for (int i = 0; i < 4; i++) want += 2 * SMALL[i][j] * x[i];
        EXPECT(close(got[j], want));
        std::printf(" %.3f", got[j]);
    }
    std::printf("\n");
    int64_t r, c, nnz;
    SPARSE(cusparseSpMatGetSize(A, &r, &c, &nnz));
    cusparseFormat_t format;
    SPARSE(cusparseSpMatGetFormat(A, &format));
    cusparseIndexBase_t base;
    SPARSE(cusparseSpMatGetIndexBase(A, &base));
    EXPECT(r == 4 && c == 5 && nnz == (int64_t)vals.size() && format == CUSPARSE_FORMAT_COO &&
           base == CUSPARSE_INDEX_BASE_ONE);
    std::printf("SpMatGetSize/Format/IndexBase: 4 x 5, nnz %lld, COO, base 1\n", (long long)nnz);
    SPARSE(cusparseDestroySpMat(A));
    SPARSE(cusparseDestroyDnVec(vx));
    SPARSE(cusparseDestroyDnVec(vy));
    for (void *p : {(void *)d_r, (void *)d_c, (void *)d_v, (void *)d_x, (void *)d_y, buffer}) CHECK(cudaFree(p));
}

// C = 2 A B + C (B, C column-major) and C = A B^T (B, C row-major), single precision.
static void spmm(cusparseHandle_t sp) {
    Csr a = small_csr(0);
    std::vector<float> av(a.values.begin(), a.values.end());
    int *d_off = to_device(a.offsets), *d_col = to_device(a.columns);
    float *d_val = to_device(av);
    cusparseSpMatDescr_t A;
    SPARSE(cusparseCreateCsr(&A, 4, 5, a.nnz, d_off, d_col, d_val, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    const int n = 3;
    // B is 5 x 3 column-major with ld 6; C is 4 x 3 column-major with ld 4.
    std::vector<float> b(6 * n, 0), c(4 * n);
    for (int k = 0; k < 5; k++)
        for (int j = 0; j < n; j++) b[k + j * 6] = (float)(k - j);
    for (int i = 0; i < 4 * n; i++) c[i] = (float)i;
    float *d_b = to_device(b), *d_c = to_device(c);
    cusparseDnMatDescr_t B, C;
    SPARSE(cusparseCreateDnMat(&B, 5, n, 6, d_b, CUDA_R_32F, CUSPARSE_ORDER_COL));
    SPARSE(cusparseCreateDnMat(&C, 4, n, 4, d_c, CUDA_R_32F, CUSPARSE_ORDER_COL));
    float alpha = 2, beta = 1;
    size_t bytes = 0;
    SPARSE(cusparseSpMM_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A,
                                   B, &beta, C, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, &bytes));
    void *buffer = nullptr;
    CHECK(cudaMalloc(&buffer, bytes ? bytes : 1));
    SPARSE(cusparseSpMM(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, B, &beta,
                        C, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, buffer));
    std::vector<float> got = from_device(d_c, 4 * n);
    double trace = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < n; j++) {
            double want = c[i + j * 4];
            for (int k = 0; k < 5; k++) want += 2 * SMALL[i][k] * b[k + j * 6];
            EXPECT(close(got[i + j * 4], want));
            if (i == j) trace += got[i + j * 4];
        }
    std::printf("SpMM: C = 2 A B + C (column-major) correct, trace %.1f\n", trace);

    // op(B) = B^T with B 3 x 5 row-major (ld 5), C 4 x 3 row-major (ld 3), beta 0.
    std::vector<float> bt(n * 5);
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 5; k++) bt[j * 5 + k] = (float)(k * j + 1);
    float *d_bt = to_device(bt), *d_c2 = to_device(std::vector<float>(4 * n, 99));
    cusparseDnMatDescr_t BT, C2;
    SPARSE(cusparseCreateDnMat(&BT, n, 5, 5, d_bt, CUDA_R_32F, CUSPARSE_ORDER_ROW));
    SPARSE(cusparseCreateDnMat(&C2, 4, n, n, d_c2, CUDA_R_32F, CUSPARSE_ORDER_ROW));
    float one = 1, zero = 0;
    SPARSE(cusparseSpMM_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_TRANSPOSE, &one, A, BT,
                                   &zero, C2, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, &bytes));
    void *buffer2 = nullptr;
    CHECK(cudaMalloc(&buffer2, bytes ? bytes : 1));
    SPARSE(cusparseSpMM(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_TRANSPOSE, &one, A, BT, &zero, C2,
                        CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, buffer2));
    got = from_device(d_c2, 4 * n);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < n; j++) {
            double want = 0;
            for (int k = 0; k < 5; k++) want += SMALL[i][k] * bt[j * 5 + k];
            EXPECT(close(got[i * n + j], want));
        }
    std::printf("SpMM: C = A B^T (row-major) correct, C[3][2] = %.1f\n", got[3 * n + 2]);
    SPARSE(cusparseDestroySpMat(A));
    for (cusparseDnMatDescr_t d : {B, C, BT, C2}) SPARSE(cusparseDestroyDnMat(d));
    for (void *p : {(void *)d_off, (void *)d_col, (void *)d_val, (void *)d_b, (void *)d_c, (void *)d_bt,
                    (void *)d_c2, buffer, buffer2})
        CHECK(cudaFree(p));
}

// C = A B with A the small 4 x 5 matrix and B = its transpose's pattern (5 x 4), in CSR.
struct Product {
    cusparseSpMatDescr_t A, B, C;
    int *d_c_off, *d_c_col = nullptr;
    double *d_c_val = nullptr;
    int64_t nnz;
};
static Product spgemm(cusparseHandle_t sp, double *expected) {
    Csr a = small_csr(0);
    // B = A^T as CSR.
    Csr b{5, 0, {0}, {}, {}};
    for (int j = 0; j < 5; j++) {
        for (int i = 0; i < 4; i++)
            if (SMALL[i][j] != 0) {
                b.columns.push_back(i);
                b.values.push_back(SMALL[i][j]);
            }
        b.offsets.push_back((int)b.columns.size());
    }
    b.nnz = (int)b.columns.size();
    Product p;
    SPARSE(cusparseCreateCsr(&p.A, 4, 5, a.nnz, to_device(a.offsets), to_device(a.columns), to_device(a.values),
                             CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    SPARSE(cusparseCreateCsr(&p.B, 5, 4, b.nnz, to_device(b.offsets), to_device(b.columns), to_device(b.values),
                             CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    CHECK(cudaMalloc(&p.d_c_off, 5 * sizeof(int)));
    SPARSE(cusparseCreateCsr(&p.C, 4, 4, 0, p.d_c_off, nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    double alpha = 1, beta = 0;
    const cusparseOperation_t N = CUSPARSE_OPERATION_NON_TRANSPOSE;
    cusparseSpGEMMDescr_t g;
    SPARSE(cusparseSpGEMM_createDescr(&g));
    size_t size1 = 0, size2 = 0;
    void *buf1 = nullptr, *buf2 = nullptr;
    SPARSE(cusparseSpGEMM_workEstimation(sp, N, N, &alpha, p.A, p.B, &beta, p.C, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT, g,
                                         &size1, nullptr));
    CHECK(cudaMalloc(&buf1, size1));
    SPARSE(cusparseSpGEMM_workEstimation(sp, N, N, &alpha, p.A, p.B, &beta, p.C, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT, g,
                                         &size1, buf1));
    SPARSE(cusparseSpGEMM_compute(sp, N, N, &alpha, p.A, p.B, &beta, p.C, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT, g,
                                  &size2, nullptr));
    CHECK(cudaMalloc(&buf2, size2));
    SPARSE(cusparseSpGEMM_compute(sp, N, N, &alpha, p.A, p.B, &beta, p.C, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT, g,
                                  &size2, buf2));
    int64_t rows, cols;
    SPARSE(cusparseSpMatGetSize(p.C, &rows, &cols, &p.nnz));
    CHECK(cudaMalloc(&p.d_c_col, p.nnz * sizeof(int)));
    CHECK(cudaMalloc(&p.d_c_val, p.nnz * sizeof(double)));
    SPARSE(cusparseCsrSetPointers(p.C, p.d_c_off, p.d_c_col, p.d_c_val));
    SPARSE(cusparseSpGEMM_copy(sp, N, N, &alpha, p.A, p.B, &beta, p.C, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT, g));
    SPARSE(cusparseSpGEMM_destroyDescr(g));
    CHECK(cudaFree(buf1));
    CHECK(cudaFree(buf2));
    // A A^T on the host.
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            expected[i * 4 + j] = 0;
            for (int k = 0; k < 5; k++) expected[i * 4 + j] += SMALL[i][k] * SMALL[j][k];
        }
    return p;
}

// The product's entries must be A A^T's, every stored one and no other.
static bool product_correct(const Product &p, const double *expected) {
    std::vector<int> off = from_device(p.d_c_off, 5), col = from_device(p.d_c_col, p.nnz);
    std::vector<double> val = from_device(p.d_c_val, p.nnz);
    double dense[16] = {0};
    if (off[0] != 0 || off[4] != p.nnz) return false;
    for (int i = 0; i < 4; i++)
        for (int k = off[i]; k < off[i + 1]; k++) dense[i * 4 + col[k]] += val[k];
    for (int i = 0; i < 16; i++)
        if (!close(dense[i], expected[i])) return false;
    return true;
}

// A in CSR (base 1, float) to a dense row-major matrix, and a dense column-major matrix back
// to CSR (base 0) with dense-to-sparse's analysis and conversion.
static void conversions(cusparseHandle_t sp) {
    Csr a = small_csr(1);
    std::vector<float> av(a.values.begin(), a.values.end());
    cusparseSpMatDescr_t A;
    SPARSE(cusparseCreateCsr(&A, 4, 5, a.nnz, to_device(a.offsets), to_device(a.columns), to_device(av),
                             CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ONE, CUDA_R_32F));
    float *d_dense = to_device(std::vector<float>(4 * 5, -1));
    cusparseDnMatDescr_t D;
    SPARSE(cusparseCreateDnMat(&D, 4, 5, 5, d_dense, CUDA_R_32F, CUSPARSE_ORDER_ROW));
    size_t bytes = 0;
    SPARSE(cusparseSparseToDense_bufferSize(sp, A, D, CUSPARSE_SPARSETODENSE_ALG_DEFAULT, &bytes));
    void *buffer = nullptr;
    CHECK(cudaMalloc(&buffer, bytes ? bytes : 1));
    SPARSE(cusparseSparseToDense(sp, A, D, CUSPARSE_SPARSETODENSE_ALG_DEFAULT, buffer));
    std::vector<float> dense = from_device(d_dense, 20);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) EXPECT(dense[i * 5 + j] == (float)SMALL[i][j]);
    std::printf("SparseToDense (CSR base 1 -> row-major): correct\n");

    // Column-major copy of SMALL, with ld 4.
    std::vector<double> col(4 * 5);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) col[i + j * 4] = SMALL[i][j];
    double *d_col_major = to_device(col);
    cusparseDnMatDescr_t M;
    SPARSE(cusparseCreateDnMat(&M, 4, 5, 4, d_col_major, CUDA_R_64F, CUSPARSE_ORDER_COL));
    int *d_off = nullptr;
    CHECK(cudaMalloc(&d_off, 5 * sizeof(int)));
    cusparseSpMatDescr_t S;
    SPARSE(cusparseCreateCsr(&S, 4, 5, 0, d_off, nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    SPARSE(cusparseDenseToSparse_bufferSize(sp, M, S, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, &bytes));
    void *buffer2 = nullptr;
    CHECK(cudaMalloc(&buffer2, bytes ? bytes : 1));
    SPARSE(cusparseDenseToSparse_analysis(sp, M, S, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, buffer2));
    int64_t rows, cols, nnz;
    SPARSE(cusparseSpMatGetSize(S, &rows, &cols, &nnz));
    EXPECT(nnz == a.nnz);
    int *d_cols = nullptr;
    double *d_vals = nullptr;
    CHECK(cudaMalloc(&d_cols, nnz * sizeof(int)));
    CHECK(cudaMalloc(&d_vals, nnz * sizeof(double)));
    SPARSE(cusparseCsrSetPointers(S, d_off, d_cols, d_vals));
    SPARSE(cusparseDenseToSparse_convert(sp, M, S, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, buffer2));
    Csr back = small_csr(0);
    EXPECT(from_device(d_off, 5) == back.offsets);
    EXPECT(from_device(d_cols, nnz) == back.columns);
    EXPECT(from_device(d_vals, nnz) == back.values);
    void *p_off, *p_col, *p_val;
    cusparseIndexType_t t_off, t_col;
    cusparseIndexBase_t base;
    cudaDataType vt;
    SPARSE(cusparseCsrGet(S, &rows, &cols, &nnz, &p_off, &p_col, &p_val, &t_off, &t_col, &base, &vt));
    EXPECT(p_off == d_off && p_col == d_cols && p_val == d_vals && t_off == CUSPARSE_INDEX_32I && vt == CUDA_R_64F);
    std::printf("DenseToSparse (column-major -> CSR base 0): nnz %lld, the original arrays\n", (long long)nnz);
    SPARSE(cusparseDestroySpMat(A));
    SPARSE(cusparseDestroySpMat(S));
    SPARSE(cusparseDestroyDnMat(D));
    SPARSE(cusparseDestroyDnMat(M));
}

// COO rows to CSR offsets and back, index base 1.
static void index_conversions(cusparseHandle_t sp) {
    Csr a = small_csr(1);
    std::vector<int> coo_rows;
    for (int i = 0; i < 4; i++)
        for (int k = a.offsets[i]; k < a.offsets[i + 1]; k++) coo_rows.push_back(i + 1);
    int *d_rows = to_device(coo_rows), *d_off = to_device(std::vector<int>(5, 0));
    SPARSE(cusparseXcoo2csr(sp, d_rows, a.nnz, 4, d_off, CUSPARSE_INDEX_BASE_ONE));
    EXPECT(from_device(d_off, 5) == a.offsets);
    int *d_rows2 = to_device(std::vector<int>(a.nnz, 0));
    SPARSE(cusparseXcsr2coo(sp, d_off, a.nnz, 4, d_rows2, CUSPARSE_INDEX_BASE_ONE));
    EXPECT(from_device(d_rows2, a.nnz) == coo_rows);
    std::printf("Xcoo2csr/Xcsr2coo (base 1): round trip exact\n");
}

// What cuSPARSE itself refuses, with the status it answers natively too.
static void misuse(cusparseHandle_t sp) {
    int *d_off = to_device(std::vector<int>(5, 0));
    float *d_v = to_device(std::vector<float>(8, 0));
    cusparseSpMatDescr_t A;
    std::printf("misuse: negative rows -> %s\n",
                cusparseGetErrorName(cusparseCreateCsr(&A, -1, 4, 0, d_off, nullptr, nullptr, CUSPARSE_INDEX_32I,
                                                       CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F)));
    std::printf("misuse: pointer mode 7 -> %s\n",
                cusparseGetErrorName(cusparseSetPointerMode(sp, (cusparsePointerMode_t)7)));
    std::printf("misuse: NULL handle out -> %s\n", cusparseGetErrorName(cusparseCreate(nullptr)));
    // SpMV whose vectors do not fit the matrix.
    SPARSE(cusparseCreateCsr(&A, 4, 4, 0, d_off, nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    cusparseDnVecDescr_t x, y;
    SPARSE(cusparseCreateDnVec(&x, 8, d_v, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&y, 4, d_v, CUDA_R_32F));
    float one = 1;
    size_t bytes = 0;
    std::printf("misuse: SpMV with x of 8 for a 4 x 4 matrix -> %s\n",
                cusparseGetErrorName(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, x, &one, y,
                                                             CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &bytes)));
    cusparseSpGEMMDescr_t g;
    SPARSE(cusparseSpGEMM_createDescr(&g));
    size_t size1 = 0;
    std::printf("misuse: SpGEMM of a transposed A -> %s\n",
                cusparseGetErrorName(cusparseSpGEMM_workEstimation(
                    sp, CUSPARSE_OPERATION_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, A, &one, A, CUDA_R_32F,
                    CUSPARSE_SPGEMM_DEFAULT, g, &size1, nullptr)));
    SPARSE(cusparseSpGEMM_destroyDescr(g));
    // A function Phos does not carry answers (NOT_SUPPORTED through Phos, success natively);
    // CUDA 13's cuSPARSE no longer has it.
#if CUDART_VERSION < 13000
    cusparseStatus_t s = cusparseSpMatSetStridedBatch(A, 1);
    std::printf("SpMatSetStridedBatch: %s\n",
                s == CUSPARSE_STATUS_SUCCESS || s == CUSPARSE_STATUS_NOT_SUPPORTED ? "answered" : "failed");
#endif
    SPARSE(cusparseDestroySpMat(A));
    SPARSE(cusparseDestroyDnVec(x));
    SPARSE(cusparseDestroyDnVec(y));
}

// A legacy matrix descriptor, as older samples set one up.
static void mat_descr() {
    cusparseMatDescr_t d;
    SPARSE(cusparseCreateMatDescr(&d));
    EXPECT(cusparseGetMatType(d) == CUSPARSE_MATRIX_TYPE_GENERAL &&
           cusparseGetMatIndexBase(d) == CUSPARSE_INDEX_BASE_ZERO);
    SPARSE(cusparseSetMatType(d, CUSPARSE_MATRIX_TYPE_SYMMETRIC));
    SPARSE(cusparseSetMatIndexBase(d, CUSPARSE_INDEX_BASE_ONE));
    SPARSE(cusparseSetMatFillMode(d, CUSPARSE_FILL_MODE_UPPER));
    SPARSE(cusparseSetMatDiagType(d, CUSPARSE_DIAG_TYPE_UNIT));
    EXPECT(cusparseGetMatType(d) == CUSPARSE_MATRIX_TYPE_SYMMETRIC &&
           cusparseGetMatIndexBase(d) == CUSPARSE_INDEX_BASE_ONE && cusparseGetMatFillMode(d) == CUSPARSE_FILL_MODE_UPPER &&
           cusparseGetMatDiagType(d) == CUSPARSE_DIAG_TYPE_UNIT);
    SPARSE(cusparseDestroyMatDescr(d));
    std::printf("matrix descriptor: settings kept\n");
}

// What a careless or hostile program gets through Phos (not compared with a native run:
// cuSPARSE itself does not check device memory).
static void hostile(cusparseHandle_t sp) {
    int *d_off = to_device(std::vector<int>{0, 1, 2});
    int *d_col = to_device(std::vector<int>{0, 7});
    float *d_v = to_device(std::vector<float>{1, 2});
    cusparseDnVecDescr_t x;
    std::printf("hostile: vector past its allocation -> %s\n",
                cusparseGetErrorName(cusparseCreateDnVec(&x, 1000, d_v, CUDA_R_32F)));
    cusparseSpMatDescr_t A;
    std::printf("hostile: arrays past their allocation -> %s\n",
                cusparseGetErrorName(cusparseCreateCsr(&A, 2, 2, 64, d_off, d_col, d_v, CUSPARSE_INDEX_32I,
                                                       CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F)));
    // A column index (7) outside the 2 x 2 matrix.
    SPARSE(cusparseCreateCsr(&A, 2, 2, 2, d_off, d_col, d_v, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    cusparseDnVecDescr_t y;
    float *d_x = to_device(std::vector<float>{1, 1}), *d_y = to_device(std::vector<float>{0, 0});
    SPARSE(cusparseCreateDnVec(&x, 2, d_x, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&y, 2, d_y, CUDA_R_32F));
    float one = 1, zero = 0;
    std::printf("hostile: column index outside the matrix -> %s\n",
                cusparseGetErrorName(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, x, &zero, y,
                                                  CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, nullptr)));
    int *d_small = to_device(std::vector<int>{0});
    std::printf("hostile: CsrSetPointers with a short index array -> %s\n",
                cusparseGetErrorName(cusparseCsrSetPointers(A, d_off, d_small, d_v)));
    std::printf("hostile: made-up descriptor -> %s\n",
                cusparseGetErrorName(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one,
                                                  (cusparseSpMatDescr_t)0x1234, x, &zero, y, CUDA_R_32F,
                                                  CUSPARSE_SPMV_ALG_DEFAULT, nullptr)));
    std::printf("hostile: made-up handle -> %s\n",
                cusparseGetErrorName(cusparseSetStream((cusparseHandle_t)0x777, nullptr)));
    cusparseDnVecDescr_t gone;
    SPARSE(cusparseCreateDnVec(&gone, 2, d_x, CUDA_R_32F));
    SPARSE(cusparseDestroyDnVec(gone));
    std::printf("hostile: destroyed descriptor -> %s\n", cusparseGetErrorName(cusparseDnVecSetValues(gone, d_x)));
    // The handle, the matrix (its pointers unchanged) and the vectors still work once the
    // index is fixed.
    int fixed = 1;
    CHECK(cudaMemcpy(d_col + 1, &fixed, sizeof(int), cudaMemcpyHostToDevice));
    SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, x, &zero, y, CUDA_R_32F,
                        CUSPARSE_SPMV_ALG_DEFAULT, nullptr));
    std::vector<float> got = from_device(d_y, 2);
    EXPECT(got[0] == 1 && got[1] == 2);
    std::printf("hostile: the handle and descriptors still work\n");
}

int main(int argc, char **argv) {
    bool hostile_mode = argc > 1 && std::strcmp(argv[1], "hostile") == 0;
    bool checkpoint = argc > 1 && std::strcmp(argv[1], "checkpoint") == 0;
    cusparseHandle_t sp;
    SPARSE(cusparseCreate(&sp));
    int version = 0;
    SPARSE(cusparseGetVersion(sp, &version));
    EXPECT(version >= 11000);

    if (checkpoint) {
        cudaStream_t stream;
        CHECK(cudaStreamCreate(&stream));
        SPARSE(cusparseSetStream(sp, stream));
        double expected[16];
        Product p = spgemm(sp, expected);
        CHECK(cudaStreamSynchronize(stream));
        std::printf("cusparse ready\n");
        std::fflush(stdout);
        sleep(3);
        cudaStream_t got;
        SPARSE(cusparseGetStream(sp, &got));
        EXPECT(got == stream);
        int64_t rows, cols, nnz;
        SPARSE(cusparseSpMatGetSize(p.C, &rows, &cols, &nnz));
        EXPECT(rows == 4 && cols == 4 && nnz == p.nnz);
        EXPECT(product_correct(p, expected));
        // y = C 1: the row sums of A A^T, with the restored descriptors.
        double *d_x = to_device(std::vector<double>(4, 1)), *d_y = to_device(std::vector<double>(4, 0));
        cusparseDnVecDescr_t x, y;
        SPARSE(cusparseCreateDnVec(&x, 4, d_x, CUDA_R_64F));
        SPARSE(cusparseCreateDnVec(&y, 4, d_y, CUDA_R_64F));
        double one = 1, zero = 0;
        size_t bytes = 0;
        SPARSE(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, p.C, x, &zero, y, CUDA_R_64F,
                                       CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
        void *buffer = nullptr;
        CHECK(cudaMalloc(&buffer, bytes ? bytes : 1));
        SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, p.C, x, &zero, y, CUDA_R_64F,
                            CUSPARSE_SPMV_ALG_DEFAULT, buffer));
        std::vector<double> sums = from_device(d_y, 4);
        for (int i = 0; i < 4; i++) {
            double want = 0;
            for (int j = 0; j < 4; j++) want += expected[i * 4 + j];
            EXPECT(close(sums[i], want));
        }
        std::printf("after the restore: the handle kept its stream and the product its size and arrays\n");
        SPARSE(cusparseDestroy(sp));
        std::printf("done\n");
        return 0;
    }

    cublasHandle_t bl;
    BLAS(cublasCreate(&bl));
    conjugate_gradient<float>(sp, bl, 1024, 1e-5f);
    conjugate_gradient<double>(sp, bl, 4096, 1e-10);
    coo_transposed_spmv(sp);
    spmm(sp);
    double expected[16];
    Product p = spgemm(sp, expected);
    EXPECT(product_correct(p, expected));
    std::printf("SpGEMM: C = A A^T, 4 x 4, nnz %lld, entries correct\n", (long long)p.nnz);
    conversions(sp);
    index_conversions(sp);
    mat_descr();
    misuse(sp);
    std::printf("error texts: %s, %s\n", cusparseGetErrorName(CUSPARSE_STATUS_SUCCESS),
                cusparseGetErrorName(CUSPARSE_STATUS_NOT_SUPPORTED));
    if (hostile_mode) hostile(sp);
    BLAS(cublasDestroy(bl));
    SPARSE(cusparseDestroy(sp));
    std::printf("done\n");
    return 0;
}
