// The shape of NVIDIA's conjugateGradientPrecond sample: a 2D Laplacian (5-point stencil) in
// CSR solved by conjugate gradient, first plain, then preconditioned with its incomplete LU
// factorisation ILU(0), applied as two sparse triangular solves (cusparseSpSV with the lower,
// unit-diagonal and the upper, non-unit triangle of one CSR matrix, chosen by
// cusparseSpMatSetAttribute). The factorisation itself is computed on the host: the legacy
// csrilu02 API is probed (cusparseCreateCsrilu02Info, looked up at run time, since newer
// toolkits drop the legacy API) and Phos answers it CUSPARSE_STATUS_NOT_SUPPORTED. Output is
// verdicts only (the same wherever it runs). With `hostile` it makes the SpSV and attribute
// calls a careless or hostile program makes and prints the status each gets.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

static const int grid = 16, n = grid * grid, max_iter = 500;
static const float tol = 1e-5f;

static void laplacian(std::vector<int> &rows, std::vector<int> &cols, std::vector<float> &vals) {
    rows.assign(n + 1, 0);
    for (int iy = 0; iy < grid; ++iy)
        for (int ix = 0; ix < grid; ++ix) {
            const int i = iy * grid + ix;
            rows[i] = (int)cols.size();
            if (iy > 0) cols.push_back(i - grid), vals.push_back(-1.0f);
            if (ix > 0) cols.push_back(i - 1), vals.push_back(-1.0f);
            cols.push_back(i), vals.push_back(4.0f);
            if (ix + 1 < grid) cols.push_back(i + 1), vals.push_back(-1.0f);
            if (iy + 1 < grid) cols.push_back(i + grid), vals.push_back(-1.0f);
        }
    rows[n] = (int)cols.size();
}

// ILU(0) in place on the CSR pattern (columns sorted in each row): L unit lower, U upper.
static void ilu0(const std::vector<int> &rows, const std::vector<int> &cols, std::vector<float> &lu) {
    std::vector<int> diag(n);
    for (int i = 0; i < n; ++i)
        for (int j = rows[i]; j < rows[i + 1]; ++j)
            if (cols[j] == i) diag[i] = j;
    for (int i = 1; i < n; ++i)
        for (int kk = rows[i]; kk < rows[i + 1] && cols[kk] < i; ++kk) {
            const int k = cols[kk];
            lu[kk] /= lu[diag[k]];
            for (int jj = kk + 1; jj < rows[i + 1]; ++jj)
                for (int kj = rows[k]; kj < rows[k + 1]; ++kj)
                    if (cols[kj] == cols[jj]) lu[jj] -= lu[kk] * lu[kj];
        }
}

typedef cusparseStatus_t (*InfoFn)(void *);

static void report(const char *what, cusparseStatus_t s) {
    std::printf("hostile: %s -> %s\n", what, cusparseGetErrorName(s));
}

static int hostile() {
    // A 3 x 3 lower triangular matrix [[2], [1, 4], [0, 3, 5]] and a 3 x 2 one.
    const int rows[4] = {0, 1, 3, 5}, cols[5] = {0, 0, 1, 1, 2};
    const float vals[5] = {2.0f, 1.0f, 4.0f, 3.0f, 5.0f}, rhs[3] = {2.0f, 5.0f, 8.0f};
    int *d_rows, *d_cols;
    float *d_vals, *d_x, *d_y;
    CHECK(cudaMalloc(&d_rows, sizeof(rows)));
    CHECK(cudaMalloc(&d_cols, sizeof(cols)));
    CHECK(cudaMalloc(&d_vals, sizeof(vals)));
    CHECK(cudaMalloc(&d_x, sizeof(rhs)));
    CHECK(cudaMalloc(&d_y, sizeof(rhs)));
    CHECK(cudaMemcpy(d_rows, rows, sizeof(rows), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_cols, cols, sizeof(cols), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_vals, vals, sizeof(vals), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_x, rhs, sizeof(rhs), cudaMemcpyHostToDevice));
    cusparseHandle_t h;
    SPARSE(cusparseCreate(&h));
    cusparseSpMatDescr_t a, wide;
    SPARSE(cusparseCreateCsr(&a, 3, 3, 5, d_rows, d_cols, d_vals, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    SPARSE(cusparseCreateCsr(&wide, 3, 2, 3, d_rows, d_cols, d_vals, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    cusparseDnVecDescr_t x, y, short_y;
    SPARSE(cusparseCreateDnVec(&x, 3, d_x, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&y, 3, d_y, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&short_y, 2, d_y, CUDA_R_32F));
    cusparseSpSVDescr_t spsv, gone;
    SPARSE(cusparseSpSV_createDescr(&spsv));
    SPARSE(cusparseSpSV_createDescr(&gone));
    SPARSE(cusparseSpSV_destroyDescr(gone));
    const float one = 1.0f;
    const cusparseOperation_t op = CUSPARSE_OPERATION_NON_TRANSPOSE;
    size_t size;
    int bad_value = 7;
    cusparseFillMode_t lower = CUSPARSE_FILL_MODE_LOWER;
    report("fill mode 7", cusparseSpMatSetAttribute(a, CUSPARSE_SPMAT_FILL_MODE, &bad_value, sizeof(bad_value)));
    long long eight_bytes = 0;
    report("attribute of 8 bytes",
           cusparseSpMatSetAttribute(a, CUSPARSE_SPMAT_FILL_MODE, &eight_bytes, sizeof(eight_bytes)));
    report("attribute 9", cusparseSpMatSetAttribute(a, (cusparseSpMatAttribute_t)9, &lower, sizeof(lower)));
    SPARSE(cusparseSpMatSetAttribute(a, CUSPARSE_SPMAT_FILL_MODE, &lower, sizeof(lower)));
    report("SpSV of a 3 x 2 matrix",
           cusparseSpSV_bufferSize(h, op, &one, wide, x, y, CUDA_R_32F, CUSPARSE_SPSV_ALG_DEFAULT, spsv, &size));
    report("SpSV into a short vector",
           cusparseSpSV_solve(h, op, &one, a, x, short_y, CUDA_R_32F, CUSPARSE_SPSV_ALG_DEFAULT, spsv));
    report("made-up SpSV descriptor", cusparseSpSV_solve(h, op, &one, a, x, y, CUDA_R_32F, CUSPARSE_SPSV_ALG_DEFAULT,
                                                         (cusparseSpSVDescr_t)0x5eed));
    report("destroyed SpSV descriptor",
           cusparseSpSV_solve(h, op, &one, a, x, y, CUDA_R_32F, CUSPARSE_SPSV_ALG_DEFAULT, gone));
    // Still works: [[2], [1, 4], [0, 3, 5]] y = (2, 5, 8) is y = (1, 1, 1).
    SPARSE(cusparseSpSV_bufferSize(h, op, &one, a, x, y, CUDA_R_32F, CUSPARSE_SPSV_ALG_DEFAULT, spsv, &size));
    void *buffer;
    CHECK(cudaMalloc(&buffer, size > 0 ? size : 1));
    SPARSE(cusparseSpSV_analysis(h, op, &one, a, x, y, CUDA_R_32F, CUSPARSE_SPSV_ALG_DEFAULT, spsv, buffer));
    SPARSE(cusparseSpSV_solve(h, op, &one, a, x, y, CUDA_R_32F, CUSPARSE_SPSV_ALG_DEFAULT, spsv));
    float got[3];
    CHECK(cudaMemcpy(got, d_y, sizeof(got), cudaMemcpyDeviceToHost));
    std::printf("hostile: %s\n", got[0] == 1.0f && got[1] == 1.0f && got[2] == 1.0f ? "the handle and descriptors still work"
                                                                                   : "the handle is BROKEN");
    SPARSE(cusparseSpSV_destroyDescr(spsv));
    SPARSE(cusparseDestroySpMat(a));
    SPARSE(cusparseDestroySpMat(wide));
    SPARSE(cusparseDestroyDnVec(x));
    SPARSE(cusparseDestroyDnVec(y));
    SPARSE(cusparseDestroyDnVec(short_y));
    SPARSE(cusparseDestroy(h));
    std::printf("done\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "hostile") == 0) return hostile();
    std::vector<int> rows, cols;
    std::vector<float> vals;
    laplacian(rows, cols, vals);
    const int nnz = (int)vals.size();
    std::vector<float> rhs(n, 1.0f), x(n);

    int *d_rows, *d_cols;
    float *d_vals, *d_lu, *d_x, *d_r, *d_p, *d_omega, *d_y, *d_z, *d_r_prev, *d_z_prev;
    CHECK(cudaMalloc(&d_rows, sizeof(int) * (n + 1)));
    CHECK(cudaMalloc(&d_cols, sizeof(int) * nnz));
    CHECK(cudaMalloc(&d_vals, sizeof(float) * nnz));
    CHECK(cudaMalloc(&d_lu, sizeof(float) * nnz));
    float **vectors[] = {&d_x, &d_r, &d_p, &d_omega, &d_y, &d_z, &d_r_prev, &d_z_prev};
    for (float **v : vectors) CHECK(cudaMalloc(v, sizeof(float) * n));
    CHECK(cudaMemcpy(d_rows, rows.data(), sizeof(int) * (n + 1), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_cols, cols.data(), sizeof(int) * nnz, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_vals, vals.data(), sizeof(float) * nnz, cudaMemcpyHostToDevice));

    cublasHandle_t blas;
    cusparseHandle_t sparse;
    BLAS(cublasCreate(&blas));
    SPARSE(cusparseCreate(&sparse));
    cusparseSpMatDescr_t mat_a, mat_lower, mat_upper;
    SPARSE(cusparseCreateCsr(&mat_a, n, n, nnz, d_rows, d_cols, d_vals, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    cusparseDnVecDescr_t vec_p, vec_omega, vec_r, vec_y, vec_z;
    SPARSE(cusparseCreateDnVec(&vec_p, n, d_p, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&vec_omega, n, d_omega, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&vec_r, n, d_r, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&vec_y, n, d_y, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&vec_z, n, d_z, CUDA_R_32F));
    const float one = 1.0f, zero = 0.0f;
    size_t mv_size;
    SPARSE(cusparseSpMV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_a, vec_p, &zero, vec_omega,
                                   CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &mv_size));
    void *mv_buffer;
    CHECK(cudaMalloc(&mv_buffer, mv_size > 0 ? mv_size : 1));

    // Plain CG.
    CHECK(cudaMemset(d_x, 0, sizeof(float) * n));
    CHECK(cudaMemcpy(d_r, rhs.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
    float r0 = 0.0f, r1, dot, alpha, beta, neg;
    BLAS(cublasSdot(blas, n, d_r, 1, d_r, 1, &r1));
    int plain = 0;
    while (r1 > tol * tol && plain <= max_iter) {
        ++plain;
        if (plain == 1) {
            BLAS(cublasScopy(blas, n, d_r, 1, d_p, 1));
        } else {
            beta = r1 / r0;
            BLAS(cublasSscal(blas, n, &beta, d_p, 1));
            BLAS(cublasSaxpy(blas, n, &one, d_r, 1, d_p, 1));
        }
        SPARSE(cusparseSpMV(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_a, vec_p, &zero, vec_omega,
                            CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, mv_buffer));
        BLAS(cublasSdot(blas, n, d_p, 1, d_omega, 1, &dot));
        alpha = r1 / dot;
        BLAS(cublasSaxpy(blas, n, &alpha, d_p, 1, d_x, 1));
        neg = -alpha;
        BLAS(cublasSaxpy(blas, n, &neg, d_omega, 1, d_r, 1));
        r0 = r1;
        BLAS(cublasSdot(blas, n, d_r, 1, d_r, 1, &r1));
    }
    std::printf("CG (2D Laplacian %d x %d): %s\n", grid, grid, plain <= max_iter ? "converged" : "did NOT converge");

    // The legacy ILU(0) is probed; the factors are the host's either way.
    InfoFn create_info = (InfoFn)dlsym(RTLD_DEFAULT, "cusparseCreateCsrilu02Info");
    InfoFn destroy_info = (InfoFn)dlsym(RTLD_DEFAULT, "cusparseDestroyCsrilu02Info");
    if (create_info && destroy_info) {
        void *info = NULL;
        if (create_info(&info) == CUSPARSE_STATUS_SUCCESS) destroy_info(info);
    }
    std::vector<float> lu(vals);
    ilu0(rows, cols, lu);
    CHECK(cudaMemcpy(d_lu, lu.data(), sizeof(float) * nnz, cudaMemcpyHostToDevice));

    // L and U: one CSR matrix, two triangles.
    SPARSE(cusparseCreateCsr(&mat_lower, n, n, nnz, d_rows, d_cols, d_lu, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    SPARSE(cusparseCreateCsr(&mat_upper, n, n, nnz, d_rows, d_cols, d_lu, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    cusparseFillMode_t lower = CUSPARSE_FILL_MODE_LOWER, upper = CUSPARSE_FILL_MODE_UPPER;
    cusparseDiagType_t unit = CUSPARSE_DIAG_TYPE_UNIT, non_unit = CUSPARSE_DIAG_TYPE_NON_UNIT;
    SPARSE(cusparseSpMatSetAttribute(mat_lower, CUSPARSE_SPMAT_FILL_MODE, &lower, sizeof(lower)));
    SPARSE(cusparseSpMatSetAttribute(mat_lower, CUSPARSE_SPMAT_DIAG_TYPE, &unit, sizeof(unit)));
    SPARSE(cusparseSpMatSetAttribute(mat_upper, CUSPARSE_SPMAT_FILL_MODE, &upper, sizeof(upper)));
    SPARSE(cusparseSpMatSetAttribute(mat_upper, CUSPARSE_SPMAT_DIAG_TYPE, &non_unit, sizeof(non_unit)));
    cusparseFillMode_t fill_read;
    cusparseDiagType_t diag_read;
    SPARSE(cusparseSpMatGetAttribute(mat_upper, CUSPARSE_SPMAT_FILL_MODE, &fill_read, sizeof(fill_read)));
    SPARSE(cusparseSpMatGetAttribute(mat_lower, CUSPARSE_SPMAT_DIAG_TYPE, &diag_read, sizeof(diag_read)));
    std::printf("attributes read back: %s\n",
                fill_read == CUSPARSE_FILL_MODE_UPPER && diag_read == CUSPARSE_DIAG_TYPE_UNIT ? "as set" : "WRONG");

    cusparseSpSVDescr_t spsv_lower, spsv_upper;
    SPARSE(cusparseSpSV_createDescr(&spsv_lower));
    SPARSE(cusparseSpSV_createDescr(&spsv_upper));
    size_t lower_size, upper_size;
    SPARSE(cusparseSpSV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_lower, vec_r, vec_y, CUDA_R_32F,
                                   CUSPARSE_SPSV_ALG_DEFAULT, spsv_lower, &lower_size));
    SPARSE(cusparseSpSV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_upper, vec_y, vec_z, CUDA_R_32F,
                                   CUSPARSE_SPSV_ALG_DEFAULT, spsv_upper, &upper_size));
    void *lower_buffer = NULL, *upper_buffer = NULL;
    CHECK(cudaMalloc(&lower_buffer, lower_size > 0 ? lower_size : 1));
    CHECK(cudaMalloc(&upper_buffer, upper_size > 0 ? upper_size : 1));
    SPARSE(cusparseSpSV_analysis(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_lower, vec_r, vec_y, CUDA_R_32F,
                                 CUSPARSE_SPSV_ALG_DEFAULT, spsv_lower, lower_buffer));
    SPARSE(cusparseSpSV_analysis(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_upper, vec_y, vec_z, CUDA_R_32F,
                                 CUSPARSE_SPSV_ALG_DEFAULT, spsv_upper, upper_buffer));

    // One application checked on the host: L U z = r for r = the right-hand side.
    CHECK(cudaMemcpy(d_r, rhs.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
    SPARSE(cusparseSpSV_solve(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_lower, vec_r, vec_y, CUDA_R_32F,
                              CUSPARSE_SPSV_ALG_DEFAULT, spsv_lower));
    SPARSE(cusparseSpSV_solve(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_upper, vec_y, vec_z, CUDA_R_32F,
                              CUSPARSE_SPSV_ALG_DEFAULT, spsv_upper));
    std::vector<float> z(n);
    CHECK(cudaMemcpy(z.data(), d_z, sizeof(float) * n, cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (int i = 0; i < n; ++i) {
        // (L U z)_i = sum_k L_ik (U z)_k, with L's unit diagonal.
        double lu_z = 0.0;
        for (int kk = rows[i]; kk < rows[i + 1]; ++kk) {
            const int k = cols[kk];
            if (k > i) continue;
            double u_z = 0.0;
            for (int jj = rows[k]; jj < rows[k + 1]; ++jj)
                if (cols[jj] >= k) u_z += lu[jj] * z[cols[jj]];
            lu_z += (k == i ? 1.0 : lu[kk]) * u_z;
        }
        worst = std::fmax(worst, std::fabs(lu_z - rhs[i]));
    }
    std::printf("SpSV lower (unit) then upper: L U z = r %s\n", worst < 1e-4 ? "holds" : "does NOT hold");

    // Preconditioned CG.
    CHECK(cudaMemset(d_x, 0, sizeof(float) * n));
    CHECK(cudaMemcpy(d_r, rhs.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
    BLAS(cublasSdot(blas, n, d_r, 1, d_r, 1, &r1));
    int precond = 0;
    float numerator, denominator;
    while (r1 > tol * tol && precond <= max_iter) {
        SPARSE(cusparseSpSV_solve(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_lower, vec_r, vec_y, CUDA_R_32F,
                                  CUSPARSE_SPSV_ALG_DEFAULT, spsv_lower));
        SPARSE(cusparseSpSV_solve(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_upper, vec_y, vec_z, CUDA_R_32F,
                                  CUSPARSE_SPSV_ALG_DEFAULT, spsv_upper));
        ++precond;
        if (precond == 1) {
            BLAS(cublasScopy(blas, n, d_z, 1, d_p, 1));
        } else {
            BLAS(cublasSdot(blas, n, d_r, 1, d_z, 1, &numerator));
            BLAS(cublasSdot(blas, n, d_r_prev, 1, d_z_prev, 1, &denominator));
            beta = numerator / denominator;
            BLAS(cublasSscal(blas, n, &beta, d_p, 1));
            BLAS(cublasSaxpy(blas, n, &one, d_z, 1, d_p, 1));
        }
        SPARSE(cusparseSpMV(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, mat_a, vec_p, &zero, vec_omega,
                            CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, mv_buffer));
        BLAS(cublasSdot(blas, n, d_r, 1, d_z, 1, &numerator));
        BLAS(cublasSdot(blas, n, d_p, 1, d_omega, 1, &denominator));
        alpha = numerator / denominator;
        BLAS(cublasSaxpy(blas, n, &alpha, d_p, 1, d_x, 1));
        BLAS(cublasScopy(blas, n, d_r, 1, d_r_prev, 1));
        BLAS(cublasScopy(blas, n, d_z, 1, d_z_prev, 1));
        neg = -alpha;
        BLAS(cublasSaxpy(blas, n, &neg, d_omega, 1, d_r, 1));
        BLAS(cublasSdot(blas, n, d_r, 1, d_r, 1, &r1));
    }
    CHECK(cudaMemcpy(x.data(), d_x, sizeof(float) * n, cudaMemcpyDeviceToHost));
    worst = 0.0;
    for (int i = 0; i < n; ++i) {
        double sum = 0.0;
        for (int j = rows[i]; j < rows[i + 1]; ++j) sum += (double)vals[j] * x[cols[j]];
        worst = std::fmax(worst, std::fabs(sum - rhs[i]));
    }
    std::printf("ILU(0)-preconditioned CG: %s, max |b - A x| %s 1e-4, fewer iterations than plain CG: %s\n",
                precond <= max_iter ? "converged" : "did NOT converge", worst < 1e-4 ? "below" : "NOT below",
                precond < plain ? "yes" : "no");

    SPARSE(cusparseSpSV_destroyDescr(spsv_lower));
    SPARSE(cusparseSpSV_destroyDescr(spsv_upper));
    SPARSE(cusparseDestroySpMat(mat_a));
    SPARSE(cusparseDestroySpMat(mat_lower));
    SPARSE(cusparseDestroySpMat(mat_upper));
    cusparseDnVecDescr_t descrs[] = {vec_p, vec_omega, vec_r, vec_y, vec_z};
    for (cusparseDnVecDescr_t v : descrs) SPARSE(cusparseDestroyDnVec(v));
    SPARSE(cusparseDestroy(sparse));
    BLAS(cublasDestroy(blas));
    for (float **v : vectors) CHECK(cudaFree(*v));
    CHECK(cudaFree(d_rows));
    CHECK(cudaFree(d_cols));
    CHECK(cudaFree(d_vals));
    CHECK(cudaFree(d_lu));
    CHECK(cudaFree(mv_buffer));
    CHECK(cudaFree(lower_buffer));
    CHECK(cudaFree(upper_buffer));
    std::printf("done\n");
    return 0;
}
