// cuSOLVER's dense API through Phos: a handle on a stream, an LU solve (getrf/getrs, both
// transposes, the pivots and a singular matrix's devInfo), a QR least-squares solve
// (geqrf/ormqr and a back substitution), a Cholesky solve (potrf/potrs, both triangles), a
// symmetric eigenproblem (syevd) and an SVD (gesvd), in single and double precision. Each
// result is checked on the host; what is printed (pivots, info, solutions and spectra rounded)
// is the same wherever the program runs. With `hostile` it also makes the calls a careless or
// hostile program makes and prints the status each gets; with `checkpoint` it factors a
// matrix on a handle with a stream, says so, waits three seconds (a checkpoint and restore
// happen then) and solves with the factors and the handle afterwards.
#include <cmath>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <cusolverDn.h>

#include "check.h"

#define SOLVER(call)                                                                         \
    do {                                                                                     \
        cusolverStatus_t s_ = (call);                                                        \
        if (s_ != CUSOLVER_STATUS_SUCCESS) {                                                 \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, status_name(s_), __FILE__,     \
                        __LINE__);                                                           \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static const char *status_name(cusolverStatus_t s) {
    switch (s) {
    case CUSOLVER_STATUS_SUCCESS: return "CUSOLVER_STATUS_SUCCESS";
    case CUSOLVER_STATUS_NOT_INITIALIZED: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE: return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_MAPPING_ERROR: return "CUSOLVER_STATUS_MAPPING_ERROR";
    case CUSOLVER_STATUS_EXECUTION_FAILED: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    case CUSOLVER_STATUS_NOT_SUPPORTED: return "CUSOLVER_STATUS_NOT_SUPPORTED";
    default: return "another status";
    }
}

template <typename T> static T *to_device(const std::vector<T> &v) {
    T *d = nullptr;
    CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T> static std::vector<T> from_device(const T *d, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

static int read_info(const int *d_info) { return from_device(d_info, 1)[0]; }

// One name per operation for both precisions.
#define BOTH(name, sig_f, sig_d, args)                                                       \
    static cusolverStatus_t name sig_f { return cusolverDnS##name args; }                    \
    static cusolverStatus_t name sig_d { return cusolverDnD##name args; }
BOTH(getrf_bufferSize, (cusolverDnHandle_t h, int m, int n, float *A, int lda, int *lw),
     (cusolverDnHandle_t h, int m, int n, double *A, int lda, int *lw), (h, m, n, A, lda, lw))
BOTH(getrf, (cusolverDnHandle_t h, int m, int n, float *A, int lda, float *w, int *ipiv, int *info),
     (cusolverDnHandle_t h, int m, int n, double *A, int lda, double *w, int *ipiv, int *info),
     (h, m, n, A, lda, w, ipiv, info))
BOTH(getrs,
     (cusolverDnHandle_t h, cublasOperation_t t, int n, int nrhs, const float *A, int lda, const int *ipiv, float *B,
      int ldb, int *info),
     (cusolverDnHandle_t h, cublasOperation_t t, int n, int nrhs, const double *A, int lda, const int *ipiv,
      double *B, int ldb, int *info),
     (h, t, n, nrhs, A, lda, ipiv, B, ldb, info))
BOTH(potrf_bufferSize, (cusolverDnHandle_t h, cublasFillMode_t u, int n, float *A, int lda, int *lw),
     (cusolverDnHandle_t h, cublasFillMode_t u, int n, double *A, int lda, int *lw), (h, u, n, A, lda, lw))
BOTH(potrf, (cusolverDnHandle_t h, cublasFillMode_t u, int n, float *A, int lda, float *w, int lw, int *info),
     (cusolverDnHandle_t h, cublasFillMode_t u, int n, double *A, int lda, double *w, int lw, int *info),
     (h, u, n, A, lda, w, lw, info))
BOTH(potrs,
     (cusolverDnHandle_t h, cublasFillMode_t u, int n, int nrhs, const float *A, int lda, float *B, int ldb,
      int *info),
     (cusolverDnHandle_t h, cublasFillMode_t u, int n, int nrhs, const double *A, int lda, double *B, int ldb,
      int *info),
     (h, u, n, nrhs, A, lda, B, ldb, info))
BOTH(geqrf_bufferSize, (cusolverDnHandle_t h, int m, int n, float *A, int lda, int *lw),
     (cusolverDnHandle_t h, int m, int n, double *A, int lda, int *lw), (h, m, n, A, lda, lw))
BOTH(geqrf, (cusolverDnHandle_t h, int m, int n, float *A, int lda, float *tau, float *w, int lw, int *info),
     (cusolverDnHandle_t h, int m, int n, double *A, int lda, double *tau, double *w, int lw, int *info),
     (h, m, n, A, lda, tau, w, lw, info))
BOTH(ormqr_bufferSize,
     (cusolverDnHandle_t h, cublasSideMode_t s, cublasOperation_t t, int m, int n, int k, const float *A, int lda,
      const float *tau, const float *C, int ldc, int *lw),
     (cusolverDnHandle_t h, cublasSideMode_t s, cublasOperation_t t, int m, int n, int k, const double *A, int lda,
      const double *tau, const double *C, int ldc, int *lw),
     (h, s, t, m, n, k, A, lda, tau, C, ldc, lw))
BOTH(ormqr,
     (cusolverDnHandle_t h, cublasSideMode_t s, cublasOperation_t t, int m, int n, int k, const float *A, int lda,
      const float *tau, float *C, int ldc, float *w, int lw, int *info),
     (cusolverDnHandle_t h, cublasSideMode_t s, cublasOperation_t t, int m, int n, int k, const double *A, int lda,
      const double *tau, double *C, int ldc, double *w, int lw, int *info),
     (h, s, t, m, n, k, A, lda, tau, C, ldc, w, lw, info))
BOTH(syevd_bufferSize,
     (cusolverDnHandle_t h, cusolverEigMode_t j, cublasFillMode_t u, int n, const float *A, int lda, const float *W,
      int *lw),
     (cusolverDnHandle_t h, cusolverEigMode_t j, cublasFillMode_t u, int n, const double *A, int lda,
      const double *W, int *lw),
     (h, j, u, n, A, lda, W, lw))
BOTH(syevd,
     (cusolverDnHandle_t h, cusolverEigMode_t j, cublasFillMode_t u, int n, float *A, int lda, float *W, float *w,
      int lw, int *info),
     (cusolverDnHandle_t h, cusolverEigMode_t j, cublasFillMode_t u, int n, double *A, int lda, double *W,
      double *w, int lw, int *info),
     (h, j, u, n, A, lda, W, w, lw, info))
BOTH(gesvd,
     (cusolverDnHandle_t h, signed char ju, signed char jv, int m, int n, float *A, int lda, float *S, float *U,
      int ldu, float *VT, int ldvt, float *w, int lw, float *rw, int *info),
     (cusolverDnHandle_t h, signed char ju, signed char jv, int m, int n, double *A, int lda, double *S, double *U,
      int ldu, double *VT, int ldvt, double *w, int lw, double *rw, int *info),
     (h, ju, jv, m, n, A, lda, S, U, ldu, VT, ldvt, w, lw, rw, info))

template <typename T> static cusolverStatus_t gesvd_bufferSize(cusolverDnHandle_t h, int m, int n, int *lw);
template <> cusolverStatus_t gesvd_bufferSize<float>(cusolverDnHandle_t h, int m, int n, int *lw) {
    return cusolverDnSgesvd_bufferSize(h, m, n, lw);
}
template <> cusolverStatus_t gesvd_bufferSize<double>(cusolverDnHandle_t h, int m, int n, int *lw) {
    return cusolverDnDgesvd_bufferSize(h, m, n, lw);
}

template <typename T> static const char *prec() { return sizeof(T) == 4 ? "S" : "D"; }
template <typename T> static double tol() { return sizeof(T) == 4 ? 1e-4 : 1e-10; }

// A workspace of what the query asked for.
template <typename T> static T *workspace(int lwork) {
    T *d = nullptr;
    CHECK(cudaMalloc(&d, (lwork > 0 ? lwork : 1) * sizeof(T)));
    return d;
}

// Column-major y = A x (m x n).
template <typename T> static std::vector<double> matvec(const std::vector<T> &a, int m, int n, const std::vector<double> &x) {
    std::vector<double> y(m, 0.0);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) y[i] += (double)a[i + j * m] * x[j];
    return y;
}

// The 4 x 4 system of the LU test: its pivots are unambiguous (every column's largest element
// stands out), its solution (1, 2, 3, 4).
static const double LU_A[16] = {1, 4, 2, 8, /**/ 3, 1, 9, 2, /**/ 7, 2, 1, 3, /**/ 2, 6, 5, 1};

template <typename T> static void lu_solve(cusolverDnHandle_t h) {
    const int n = 4;
    std::vector<T> a(LU_A, LU_A + 16);
    std::vector<double> x = {1, 2, 3, 4};
    std::vector<double> b = matvec(a, n, n, x);
    // A^T x = c as well.
    std::vector<T> at(16);
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) at[i + j * n] = a[j + i * n];
    std::vector<double> c = matvec(at, n, n, x);
    std::vector<T> rhs(2 * n);
    for (int i = 0; i < n; ++i) rhs[i] = (T)b[i], rhs[n + i] = (T)c[i];
    T *da = to_device(a), *db = to_device(rhs);
    int *dipiv, *dinfo;
    CHECK(cudaMalloc(&dipiv, n * sizeof(int)));
    CHECK(cudaMalloc(&dinfo, sizeof(int)));
    int lwork = 0;
    SOLVER(getrf_bufferSize(h, n, n, da, n, &lwork));
    T *dw = workspace<T>(lwork);
    SOLVER(getrf(h, n, n, da, n, dw, dipiv, dinfo));
    int info = read_info(dinfo);
    std::vector<int> ipiv = from_device(dipiv, n);
    SOLVER(getrs(h, CUBLAS_OP_N, n, 1, da, n, dipiv, db, n, dinfo));
    SOLVER(getrs(h, CUBLAS_OP_T, n, 1, da, n, dipiv, db + n, n, dinfo));
    std::vector<T> got = from_device(db, 2 * n);
    for (int i = 0; i < 2 * n; ++i) EXPECT(std::fabs((double)got[i] - x[i % n]) < tol<T>() * 10);
    std::printf("%sgetrf/getrs: ipiv %d %d %d %d, info %d, x = %.3f %.3f %.3f %.3f, transposed correct\n", prec<T>(),
                ipiv[0], ipiv[1], ipiv[2], ipiv[3], info, (double)got[0], (double)got[1], (double)got[2],
                (double)got[3]);

    // A singular matrix: devInfo names the first zero pivot, as LAPACK's info does (powers of
    // two, so the elimination is exact and the zero is one everywhere).
    std::vector<T> sing = {1, 2, 4, /**/ 2, 4, 8, /**/ 0, 1, 5};
    T *ds = to_device(sing);
    SOLVER(getrf(h, 3, 3, ds, 3, dw, dipiv, dinfo));
    std::printf("%sgetrf of a singular matrix: info %d\n", prec<T>(), read_info(dinfo));
    CHECK(cudaFree(ds));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dipiv));
    CHECK(cudaFree(dinfo));
}

// Least squares min |A x - b| by QR: A = Q R (geqrf), Q^T b (ormqr), R x = (Q^T b)[0:n] on the
// host. b = A (1, -2, 0.5) + a residual orthogonal to A's columns, so the solution is exact.
template <typename T> static void qr_least_squares(cusolverDnHandle_t h) {
    const int m = 6, n = 3;
    std::vector<T> a(m * n);
    for (int i = 0; i < m; ++i) a[i] = 1, a[i + m] = (T)i, a[i + 2 * m] = (T)(i * i);
    std::vector<double> x = {1, -2, 0.5};
    std::vector<double> b = matvec(a, m, n, x);
    // (1, -3, 2, 2, -3, 1) is orthogonal to 1, t and t^2 on t = 0..5 (a fourth difference).
    const double r[6] = {1, -3, 2, 2, -3, 1};
    std::vector<T> bt(m);
    for (int i = 0; i < m; ++i) bt[i] = (T)(b[i] + r[i]);
    T *da = to_device(a), *db = to_device(bt), *dtau;
    int *dinfo;
    CHECK(cudaMalloc(&dtau, n * sizeof(T)));
    CHECK(cudaMalloc(&dinfo, sizeof(int)));
    int lq = 0, lo = 0;
    SOLVER(geqrf_bufferSize(h, m, n, da, m, &lq));
    SOLVER(ormqr_bufferSize(h, CUBLAS_SIDE_LEFT, CUBLAS_OP_T, m, 1, n, da, m, dtau, db, m, &lo));
    int lwork = lq > lo ? lq : lo;
    T *dw = workspace<T>(lwork);
    SOLVER(geqrf(h, m, n, da, m, dtau, dw, lwork, dinfo));
    EXPECT(read_info(dinfo) == 0);
    SOLVER(ormqr(h, CUBLAS_SIDE_LEFT, CUBLAS_OP_T, m, 1, n, da, m, dtau, db, m, dw, lwork, dinfo));
    EXPECT(read_info(dinfo) == 0);
    std::vector<T> qr = from_device(da, m * n), qtb = from_device(db, m);
    std::vector<double> sol(n);
    for (int i = n - 1; i >= 0; --i) {
        double s = qtb[i];
        for (int k = i + 1; k < n; ++k) s -= (double)qr[i + k * m] * sol[k];
        sol[i] = s / (double)qr[i + i * m];
    }
    for (int i = 0; i < n; ++i) EXPECT(std::fabs(sol[i] - x[i]) < tol<T>() * 100);
    // What is left of Q^T b below R is the residual's norm (sqrt 28).
    double res = 0;
    for (int i = n; i < m; ++i) res += (double)qtb[i] * qtb[i];
    std::printf("%sgeqrf/ormqr least squares: x = %.3f %.3f %.3f, residual norm %.3f\n", prec<T>(), sol[0], sol[1],
                sol[2], std::sqrt(res));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dtau));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dinfo));
}

template <typename T> static void cholesky(cusolverDnHandle_t h) {
    const int n = 3;
    // Symmetric positive definite; solution (1, -1, 2).
    std::vector<T> a = {4, 2, 2, /**/ 2, 5, 3, /**/ 2, 3, 6};
    std::vector<double> x = {1, -1, 2};
    std::vector<double> b = matvec(a, n, n, x);
    int *dinfo;
    CHECK(cudaMalloc(&dinfo, sizeof(int)));
    for (cublasFillMode_t uplo : {CUBLAS_FILL_MODE_LOWER, CUBLAS_FILL_MODE_UPPER}) {
        std::vector<T> bt(b.begin(), b.end());
        T *da = to_device(a), *db = to_device(bt);
        int lwork = 0;
        SOLVER(potrf_bufferSize(h, uplo, n, da, n, &lwork));
        T *dw = workspace<T>(lwork);
        SOLVER(potrf(h, uplo, n, da, n, dw, lwork, dinfo));
        EXPECT(read_info(dinfo) == 0);
        SOLVER(potrs(h, uplo, n, 1, da, n, db, n, dinfo));
        std::vector<T> got = from_device(db, n);
        for (int i = 0; i < n; ++i) EXPECT(std::fabs((double)got[i] - x[i]) < tol<T>() * 10);
        CHECK(cudaFree(da));
        CHECK(cudaFree(db));
        CHECK(cudaFree(dw));
    }
    // Not positive definite: the order of the failing minor.
    std::vector<T> bad = {1, 2, 0, /**/ 2, 1, 0, /**/ 0, 0, 1};
    T *dbad = to_device(bad);
    int lwork = 0;
    SOLVER(potrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, dbad, n, &lwork));
    T *dw = workspace<T>(lwork);
    SOLVER(potrf(h, CUBLAS_FILL_MODE_LOWER, n, dbad, n, dw, lwork, dinfo));
    std::printf("%spotrf/potrs: lower and upper correct, an indefinite matrix's info %d\n", prec<T>(),
                read_info(dinfo));
    CHECK(cudaFree(dbad));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dinfo));
}

template <typename T> static void eigen(cusolverDnHandle_t h) {
    // The second-difference matrix: eigenvalues 2 - 2 cos(k pi / 5), k = 1..4.
    const int n = 4;
    std::vector<T> a(n * n, 0);
    for (int i = 0; i < n; ++i) {
        a[i + i * n] = 2;
        if (i + 1 < n) a[i + 1 + i * n] = a[i + (i + 1) * n] = -1;
    }
    T *da = to_device(a), *dw_vals;
    int *dinfo;
    CHECK(cudaMalloc(&dw_vals, n * sizeof(T)));
    CHECK(cudaMalloc(&dinfo, sizeof(int)));
    int lwork = 0;
    SOLVER(syevd_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, da, n, dw_vals, &lwork));
    T *dw = workspace<T>(lwork);
    SOLVER(syevd(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, da, n, dw_vals, dw, lwork, dinfo));
    EXPECT(read_info(dinfo) == 0);
    std::vector<T> w = from_device(dw_vals, n), v = from_device(da, n * n);
    for (int k = 0; k < n; ++k) {
        EXPECT(std::fabs(w[k] - (2 - 2 * std::cos((k + 1) * M_PI / 5))) < tol<T>() * 10);
        // A v = lambda v.
        std::vector<double> vk(v.begin() + k * n, v.begin() + (k + 1) * n);
        std::vector<double> av = matvec(a, n, n, vk);
        for (int i = 0; i < n; ++i) EXPECT(std::fabs(av[i] - w[k] * vk[i]) < tol<T>() * 10);
    }
    std::printf("%ssyevd: eigenvalues %.3f %.3f %.3f %.3f ascending, vectors correct\n", prec<T>(), (double)w[0],
                (double)w[1], (double)w[2], (double)w[3]);
    CHECK(cudaFree(da));
    CHECK(cudaFree(dw_vals));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dinfo));
}

template <typename T> static void svd(cusolverDnHandle_t h) {
    const int m = 5, n = 3;
    std::vector<T> a(m * n);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) a[i + j * m] = (T)((i + 1) * (j + 2) % 7) - 3;
    T *da = to_device(a), *ds, *du, *dvt;
    int *dinfo;
    CHECK(cudaMalloc(&ds, n * sizeof(T)));
    CHECK(cudaMalloc(&du, m * m * sizeof(T)));
    CHECK(cudaMalloc(&dvt, n * n * sizeof(T)));
    CHECK(cudaMalloc(&dinfo, sizeof(int)));
    int lwork = 0;
    SOLVER(gesvd_bufferSize<T>(h, m, n, &lwork));
    T *dw = workspace<T>(lwork);
    SOLVER(gesvd(h, 'A', 'A', m, n, da, m, ds, du, m, dvt, n, dw, lwork, nullptr, dinfo));
    EXPECT(read_info(dinfo) == 0);
    std::vector<T> s = from_device(ds, n), u = from_device(du, m * m), vt = from_device(dvt, n * n);
    EXPECT(s[0] >= s[1] && s[1] >= s[2]);
    // U S V^T = A, and U is orthogonal.
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double acc = 0;
            for (int k = 0; k < n; ++k) acc += (double)u[i + k * m] * s[k] * vt[k + j * n];
            EXPECT(std::fabs(acc - a[i + j * m]) < tol<T>() * 100);
        }
    for (int p = 0; p < m; ++p)
        for (int q = 0; q < m; ++q) {
            double dot = 0;
            for (int i = 0; i < m; ++i) dot += (double)u[i + p * m] * u[i + q * m];
            EXPECT(std::fabs(dot - (p == q)) < tol<T>() * 100);
        }
    std::printf("%sgesvd: singular values %.3f %.3f %.3f descending, U S VT = A\n", prec<T>(), (double)s[0],
                (double)s[1], (double)s[2]);
    CHECK(cudaFree(da));
    CHECK(cudaFree(ds));
    CHECK(cudaFree(du));
    CHECK(cudaFree(dvt));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dinfo));
}

// The LU of LU_A, left on the device for a later solve.
struct Factored {
    double *a;
    int *ipiv, *info;
};

static Factored factor(cusolverDnHandle_t h) {
    std::vector<double> a(LU_A, LU_A + 16);
    Factored f{to_device(a), nullptr, nullptr};
    CHECK(cudaMalloc(&f.ipiv, 4 * sizeof(int)));
    CHECK(cudaMalloc(&f.info, sizeof(int)));
    int lwork = 0;
    SOLVER(cusolverDnDgetrf_bufferSize(h, 4, 4, f.a, 4, &lwork));
    double *dw = workspace<double>(lwork);
    SOLVER(cusolverDnDgetrf(h, 4, 4, f.a, 4, dw, f.ipiv, f.info));
    CHECK(cudaFree(dw));
    return f;
}

// Solve LU_A x = LU_A (1, 2, 3, 4) with the factors: true when x comes back.
static bool solves(cusolverDnHandle_t h, const Factored &f) {
    std::vector<double> a(LU_A, LU_A + 16), x = {1, 2, 3, 4};
    std::vector<double> b = matvec(a, 4, 4, x);
    double *db = to_device(b);
    cusolverStatus_t s = cusolverDnDgetrs(h, CUBLAS_OP_N, 4, 1, f.a, 4, f.ipiv, db, 4, f.info);
    std::vector<double> got = from_device(db, 4);
    CHECK(cudaFree(db));
    bool ok = s == CUSOLVER_STATUS_SUCCESS;
    for (int i = 0; i < 4; ++i) ok = ok && std::fabs(got[i] - x[i]) < 1e-10;
    return ok;
}

int main(int argc, char **argv) {
    bool hostile = argc > 1 && std::strcmp(argv[1], "hostile") == 0;
    bool checkpoint = argc > 1 && std::strcmp(argv[1], "checkpoint") == 0;
    cusolverDnHandle_t h;
    SOLVER(cusolverDnCreate(&h));

    if (checkpoint) {
        cudaStream_t stream;
        CHECK(cudaStreamCreate(&stream));
        SOLVER(cusolverDnSetStream(h, stream));
        Factored f = factor(h);
        CHECK(cudaStreamSynchronize(stream));
        std::printf("cusolver ready\n");
        std::fflush(stdout);
        sleep(3);
        cudaStream_t got;
        SOLVER(cusolverDnGetStream(h, &got));
        EXPECT(got == stream);
        EXPECT(solves(h, f));
        std::printf("after the restore: the handle kept its stream and the factors solve\n");
        SOLVER(cusolverDnDestroy(h));
        return 0;
    }

    // The handle on a stream of the program's.
    {
        cudaStream_t stream, got;
        CHECK(cudaStreamCreate(&stream));
        SOLVER(cusolverDnSetStream(h, stream));
        SOLVER(cusolverDnGetStream(h, &got));
        EXPECT(got == stream);
        lu_solve<float>(h);
        CHECK(cudaStreamSynchronize(stream));
        SOLVER(cusolverDnSetStream(h, 0));
        CHECK(cudaStreamDestroy(stream));
        std::printf("handle: a stream set and read back\n");
    }
    lu_solve<double>(h);
    qr_least_squares<float>(h);
    qr_least_squares<double>(h);
    cholesky<float>(h);
    cholesky<double>(h);
    eigen<float>(h);
    eigen<double>(h);
    svd<float>(h);
    svd<double>(h);

    // A function Phos does not carry answers the library's own status.
    {
        int lwork = -1;
        cusolverStatus_t s = cusolverDnCgetrf_bufferSize(h, 2, 2, nullptr, 2, &lwork);
        std::printf("Cgetrf_bufferSize: %s\n",
                    s == CUSOLVER_STATUS_SUCCESS || s == CUSOLVER_STATUS_NOT_SUPPORTED ? "answered" : "failed");
    }

    if (hostile) {
        double *d;
        CHECK(cudaMalloc(&d, 16 * sizeof(double)));
        int *dipiv, *dinfo;
        CHECK(cudaMalloc(&dipiv, 8 * sizeof(int)));
        CHECK(cudaMalloc(&dinfo, sizeof(int)));
        // lda smaller than m.
        std::printf("hostile: bad lda -> %s\n", status_name(cusolverDnDgetrf(h, 4, 4, d, 2, d, dipiv, dinfo)));
        // A 4x4 matrix is 16 doubles; 8x8 runs past the allocation.
        std::printf("hostile: matrix past its allocation -> %s\n",
                    status_name(cusolverDnDgetrf(h, 8, 8, d, 8, nullptr, dipiv, dinfo)));
        // A workspace said to be larger than its allocation.
        std::printf("hostile: workspace past its allocation -> %s\n",
                    status_name(cusolverDnDpotrf(h, CUBLAS_FILL_MODE_LOWER, 4, d, 4, d, 1000, dinfo)));
        // Pivots that name rows the matrix does not have.
        std::vector<int> bogus = {1, 99, 3, 4};
        CHECK(cudaMemcpy(dipiv, bogus.data(), 4 * sizeof(int), cudaMemcpyHostToDevice));
        std::printf("hostile: pivots out of range -> %s\n",
                    status_name(cusolverDnDgetrs(h, CUBLAS_OP_N, 4, 1, d, 4, dipiv, d, 4, dinfo)));
        // A handle that was never made, and one destroyed.
        std::printf("hostile: made-up handle -> %s\n",
                    status_name(cusolverDnDgetrf(reinterpret_cast<cusolverDnHandle_t>(0x5150), 4, 4, d, 4, nullptr,
                                                 dipiv, dinfo)));
        cusolverDnHandle_t gone;
        SOLVER(cusolverDnCreate(&gone));
        SOLVER(cusolverDnDestroy(gone));
        int lwork = 0;
        std::printf("hostile: destroyed handle -> %s\n",
                    status_name(cusolverDnDgetrf_bufferSize(gone, 4, 4, d, 4, &lwork)));
        // A factorisation in a stream capture: not carried in graphs by Phos (refused by name,
        // the capture invalidated).
        cudaStream_t kept, cs;
        SOLVER(cusolverDnGetStream(h, &kept));
        CHECK(cudaStreamCreate(&cs));
        SOLVER(cusolverDnSetStream(h, cs));
        CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        cusolverStatus_t in_capture = cusolverDnDgetrf(h, 4, 4, d, 4, d, dipiv, dinfo);
        cudaGraph_t graph = nullptr;
        cudaError_t ended = cudaStreamEndCapture(cs, &graph);
        std::printf("hostile: getrf in a capture -> %s, end of capture -> %s\n", status_name(in_capture),
                    cudaGetErrorName(ended));
        if (graph) CHECK(cudaGraphDestroy(graph));
        SOLVER(cusolverDnSetStream(h, kept));
        CHECK(cudaStreamDestroy(cs));
        Factored f = factor(h);
        EXPECT(solves(h, f));
        std::printf("hostile: the handle still works\n");
        CHECK(cudaFree(d));
    }

    SOLVER(cusolverDnDestroy(h));
    std::printf("done\n");
    return 0;
}
