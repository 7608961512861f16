// The shape of NVIDIA's cuSolverDn_LinearSolver sample: one dense symmetric positive
// definite system A x = b solved three ways in double precision, by Cholesky
// (cusolverDnDpotrf/Dpotrs), by LU with partial pivoting (Dgetrf/Dgetrs) and by QR
// (Dgeqrf, Dormqr applying Q^T to b, cublasDtrsm solving R x = Q^T b); each solution's
// residual |b - A x| is computed on the device with cublasDgemv and cublasDnrm2, relative to
// |A| |x| + |b|. Output is verdicts only (the same wherever it runs). With `unsupported` it
// makes one call of cuSOLVER's sparse API and one of cublasXt and prints the status of each
// (Phos carries neither: it answers the library's not-supported status).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublas_v2.h>
#include <cusolverDn.h>
// Toolkits that drop the sparse solver or cublasXt build the program without its `unsupported`
// half (which the tests run on emu only).
#if __has_include(<cusolverSp.h>) && __has_include(<cublasXt.h>)
#include <cublasXt.h>
#include <cusolverSp.h>
#define HAS_SPARSE_SOLVER_AND_XT 1
#endif

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

#define SOLVER(call)                                                                         \
    do {                                                                                     \
        cusolverStatus_t s_ = (call);                                                        \
        if (s_ != CUSOLVER_STATUS_SUCCESS) {                                                 \
            std::printf("FAILED: %s -> cusolverStatus %d at %s:%d\n", #call, (int)s_,        \
                        __FILE__, __LINE__);                                                 \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static const int n = 64, lda = n;

// |b - A x| / (|A|_F |x| + |b|) with the device's BLAS; A, x and b are left as they were.
static double relative_residual(cublasHandle_t blas, const double *d_a, const double *d_x, const double *d_b,
                                double a_norm) {
    double *d_r;
    CHECK(cudaMalloc(&d_r, sizeof(double) * n));
    CHECK(cudaMemcpy(d_r, d_b, sizeof(double) * n, cudaMemcpyDeviceToDevice));
    const double minus_one = -1.0, one = 1.0;
    BLAS(cublasDgemv(blas, CUBLAS_OP_N, n, n, &minus_one, d_a, lda, d_x, 1, &one, d_r, 1));
    double r_norm, x_norm, b_norm;
    BLAS(cublasDnrm2(blas, n, d_r, 1, &r_norm));
    BLAS(cublasDnrm2(blas, n, d_x, 1, &x_norm));
    BLAS(cublasDnrm2(blas, n, d_b, 1, &b_norm));
    CHECK(cudaFree(d_r));
    return r_norm / (a_norm * x_norm + b_norm);
}

static void report(const char *how, double residual, int info) {
    std::printf("%s: info %d, relative residual %s 1e-12\n", how, info, residual < 1e-12 ? "below" : "NOT below");
}

static int unsupported() {
#ifdef HAS_SPARSE_SOLVER_AND_XT
    cusolverSpHandle_t sp;
    cusolverStatus_t s = cusolverSpCreate(&sp);
    std::printf("cusolverSpCreate -> %s\n", s == CUSOLVER_STATUS_SUCCESS         ? "CUSOLVER_STATUS_SUCCESS"
                                           : s == CUSOLVER_STATUS_NOT_SUPPORTED ? "CUSOLVER_STATUS_NOT_SUPPORTED"
                                                                                : "another status");
    if (s == CUSOLVER_STATUS_SUCCESS) cusolverSpDestroy(sp);
    cublasXtHandle_t xt;
    cublasStatus_t b = cublasXtCreate(&xt);
    std::printf("cublasXtCreate -> %s\n", b == CUBLAS_STATUS_SUCCESS         ? "CUBLAS_STATUS_SUCCESS"
                                         : b == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
                                                                            : "another status");
    if (b == CUBLAS_STATUS_SUCCESS) cublasXtDestroy(xt);
#endif
    std::printf("done\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "unsupported") == 0) return unsupported();
    // A = M^T M + n I for a deterministic M: symmetric positive definite.
    std::vector<double> m(n * n), a(n * n), b(n);
    for (int i = 0; i < n * n; ++i) m[i] = (double)((i * 37 + 11) % 23) / 23.0 - 0.5;
    double a_norm = 0.0;
    for (int c = 0; c < n; ++c)
        for (int r = 0; r < n; ++r) {
            double sum = r == c ? n : 0.0;
            for (int k = 0; k < n; ++k) sum += m[k + r * n] * m[k + c * n];
            a[r + c * lda] = sum;
            a_norm += sum * sum;
        }
    a_norm = std::sqrt(a_norm);
    for (int i = 0; i < n; ++i) b[i] = 1.0 + (i % 7) * 0.25;

    cusolverDnHandle_t solver;
    cublasHandle_t blas;
    cudaStream_t stream;
    SOLVER(cusolverDnCreate(&solver));
    BLAS(cublasCreate(&blas));
    CHECK(cudaStreamCreate(&stream));
    SOLVER(cusolverDnSetStream(solver, stream));
    BLAS(cublasSetStream(blas, stream));

    double *d_a, *d_a0, *d_x, *d_b, *d_tau;
    int *d_info, *d_pivots;
    CHECK(cudaMalloc(&d_a, sizeof(double) * lda * n));
    CHECK(cudaMalloc(&d_a0, sizeof(double) * lda * n));
    CHECK(cudaMalloc(&d_x, sizeof(double) * n));
    CHECK(cudaMalloc(&d_b, sizeof(double) * n));
    CHECK(cudaMalloc(&d_tau, sizeof(double) * n));
    CHECK(cudaMalloc(&d_info, sizeof(int)));
    CHECK(cudaMalloc(&d_pivots, sizeof(int) * n));
    CHECK(cudaMemcpy(d_a0, a.data(), sizeof(double) * lda * n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), sizeof(double) * n, cudaMemcpyHostToDevice));

    int work_len = 0, len;
    SOLVER(cusolverDnDpotrf_bufferSize(solver, CUBLAS_FILL_MODE_LOWER, n, d_a0, lda, &len));
    work_len = len > work_len ? len : work_len;
    SOLVER(cusolverDnDgetrf_bufferSize(solver, n, n, d_a0, lda, &len));
    work_len = len > work_len ? len : work_len;
    SOLVER(cusolverDnDgeqrf_bufferSize(solver, n, n, d_a0, lda, &len));
    work_len = len > work_len ? len : work_len;
    SOLVER(cusolverDnDormqr_bufferSize(solver, CUBLAS_SIDE_LEFT, CUBLAS_OP_T, n, 1, n, d_a0, lda, d_tau, d_x, n,
                                       &len));
    work_len = len > work_len ? len : work_len;
    double *d_work;
    CHECK(cudaMalloc(&d_work, sizeof(double) * work_len));
    int info;

    // Cholesky.
    CHECK(cudaMemcpyAsync(d_a, d_a0, sizeof(double) * lda * n, cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaMemcpyAsync(d_x, d_b, sizeof(double) * n, cudaMemcpyDeviceToDevice, stream));
    SOLVER(cusolverDnDpotrf(solver, CUBLAS_FILL_MODE_LOWER, n, d_a, lda, d_work, work_len, d_info));
    SOLVER(cusolverDnDpotrs(solver, CUBLAS_FILL_MODE_LOWER, n, 1, d_a, lda, d_x, n, d_info));
    CHECK(cudaMemcpyAsync(&info, d_info, sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    report("Cholesky (Dpotrf/Dpotrs)", relative_residual(blas, d_a0, d_x, d_b, a_norm), info);

    // LU with partial pivoting.
    CHECK(cudaMemcpyAsync(d_a, d_a0, sizeof(double) * lda * n, cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaMemcpyAsync(d_x, d_b, sizeof(double) * n, cudaMemcpyDeviceToDevice, stream));
    SOLVER(cusolverDnDgetrf(solver, n, n, d_a, lda, d_work, d_pivots, d_info));
    SOLVER(cusolverDnDgetrs(solver, CUBLAS_OP_N, n, 1, d_a, lda, d_pivots, d_x, n, d_info));
    CHECK(cudaMemcpyAsync(&info, d_info, sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    report("LU (Dgetrf/Dgetrs)", relative_residual(blas, d_a0, d_x, d_b, a_norm), info);

    // QR: A = Q R, x = R^-1 Q^T b.
    CHECK(cudaMemcpyAsync(d_a, d_a0, sizeof(double) * lda * n, cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaMemcpyAsync(d_x, d_b, sizeof(double) * n, cudaMemcpyDeviceToDevice, stream));
    SOLVER(cusolverDnDgeqrf(solver, n, n, d_a, lda, d_tau, d_work, work_len, d_info));
    SOLVER(cusolverDnDormqr(solver, CUBLAS_SIDE_LEFT, CUBLAS_OP_T, n, 1, n, d_a, lda, d_tau, d_x, n, d_work,
                            work_len, d_info));
    const double one = 1.0;
    BLAS(cublasDtrsm(blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, n, 1, &one,
                     d_a, lda, d_x, n));
    CHECK(cudaMemcpyAsync(&info, d_info, sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    report("QR (Dgeqrf/Dormqr/Dtrsm)", relative_residual(blas, d_a0, d_x, d_b, a_norm), info);

    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_a0));
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_tau));
    CHECK(cudaFree(d_info));
    CHECK(cudaFree(d_pivots));
    CHECK(cudaFree(d_work));
    SOLVER(cusolverDnDestroy(solver));
    BLAS(cublasDestroy(blas));
    CHECK(cudaStreamDestroy(stream));
    std::printf("done\n");
    return 0;
}
