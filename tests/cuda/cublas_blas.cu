// cuBLAS through Phos: handles and their settings, level-1 and level-2 BLAS, GEMMs (plain,
// batched, strided, mixed precision with fp16), both pointer modes, a handle on a stream, and
// the transfers of cublas_api.h. Every result is checked against a host computation; the
// program prints one line per step. With the argument `hostile` it also makes the calls a
// careless or hostile program makes (bad leading dimension, a matrix past its allocation, a
// destroyed handle) and prints the status each gets. With `checkpoint` it sets a handle up
// (a stream, device pointer mode, a math mode, a workspace), says so, waits three seconds (a
// checkpoint and restore happen then), and checks the handle kept everything.
#include <cmath>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "check.h"

#define BLAS(call)                                                                           \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            std::printf("FAILED: %s -> %d at %s:%d\n", #call, (int)s_, __FILE__, __LINE__); \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

// Column-major reference: C = alpha op(A) op(B) + beta C.
template <typename T>
static void ref_gemm(bool ta, bool tb, int m, int n, int k, T alpha, const T *a, int lda, const T *b, int ldb,
                     T beta, T *c, int ldc) {
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double acc = 0;
            for (int p = 0; p < k; ++p) {
                double x = ta ? a[p + i * lda] : a[i + p * lda];
                double y = tb ? b[j + p * ldb] : b[p + j * ldb];
                acc += x * y;
            }
            c[i + j * ldc] = (T)(alpha * acc + beta * c[i + j * ldc]);
        }
}

template <typename T>
static bool close(const std::vector<T> &got, const std::vector<T> &want, double tol) {
    for (size_t i = 0; i < got.size(); ++i)
        if (std::fabs((double)got[i] - (double)want[i]) > tol * (1 + std::fabs((double)want[i]))) {
            std::printf("  element %zu: got %g want %g\n", i, (double)got[i], (double)want[i]);
            return false;
        }
    return true;
}

template <typename T>
static T *to_device(const std::vector<T> &v) {
    T *d = nullptr;
    CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
static std::vector<T> from_device(const T *d, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

static std::vector<float> seq_f(int n, float scale, float shift) {
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = scale * (float)((i * 7) % 11) + shift;
    return v;
}

static std::vector<double> seq_d(int n, double scale, double shift) {
    std::vector<double> v(n);
    for (int i = 0; i < n; ++i) v[i] = scale * (double)((i * 5) % 13) + shift;
    return v;
}

// A handle set up before a checkpoint is the same handle after the restore.
static int across_a_restore() {
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    BLAS(cublasSetStream(h, stream));
    BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
    BLAS(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
    void *workspace;
    CHECK(cudaMalloc(&workspace, 1 << 20));
    BLAS(cublasSetWorkspace(h, workspace, 1 << 20));
    const int n = 4;
    std::vector<float> a = seq_f(n * n, 1.0f, -2.0f), b = seq_f(n * n, 0.5f, 1.0f), c(n * n, 0.0f);
    std::vector<float> scalars = {1.0f, 0.0f};
    float *da = to_device(a), *db = to_device(b), *dc = to_device(c), *ds = to_device(scalars);
    std::printf("cublas ready\n");
    std::fflush(stdout);
    sleep(3);
    cudaStream_t got;
    BLAS(cublasGetStream(h, &got));
    cublasPointerMode_t mode;
    BLAS(cublasGetPointerMode(h, &mode));
    cublasMath_t math;
    BLAS(cublasGetMathMode(h, &math));
    EXPECT(got == stream && mode == CUBLAS_POINTER_MODE_DEVICE && math == CUBLAS_TF32_TENSOR_OP_MATH);
    BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &ds[0], da, n, db, n, &ds[1], dc, n));
    CHECK(cudaStreamSynchronize(stream));
    ref_gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    EXPECT(close(from_device(dc, n * n), c, 1e-3));
    std::printf("after the restore: the handle kept its stream, pointer mode and math mode; sgemm correct\n");
    BLAS(cublasDestroy(h));
    CHECK(cudaStreamDestroy(stream));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "checkpoint") == 0) return across_a_restore();
    bool hostile = argc > 1 && std::strcmp(argv[1], "hostile") == 0;
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    int version = 0;
    BLAS(cublasGetVersion(h, &version));
    int major = 0;
    BLAS(cublasGetProperty(MAJOR_VERSION, &major));
    EXPECT(version / 10000 == major && major == CUBLAS_VER_MAJOR);
    // The major version is the one the program was built with (CUDA 11 and 13 builds print the same).
    std::printf("handle: version of cuBLAS as built (%s)\n", major == CUBLAS_VER_MAJOR ? "matches" : "differs");
    // The names are cuBLAS's enumerators; the texts are the library's own words (not compared).
    EXPECT(std::strlen(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0);
    std::printf("status name: %s\n", cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE));

    // Settings read back as set.
    BLAS(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
    cublasMath_t math;
    BLAS(cublasGetMathMode(h, &math));
    EXPECT(math == CUBLAS_TF32_TENSOR_OP_MATH);
    BLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    BLAS(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_ALLOWED));
    cublasAtomicsMode_t atomics;
    BLAS(cublasGetAtomicsMode(h, &atomics));
    EXPECT(atomics == CUBLAS_ATOMICS_ALLOWED);
    std::printf("settings: math and atomics modes read back\n");

    // Level 1, host pointer mode.
    {
        const int n = 10;
        std::vector<float> x = seq_f(n, 0.5f, -1.0f), y = seq_f(n, -0.25f, 2.0f);
        float *dx = to_device(x), *dy = to_device(y);
        float alpha = 1.5f;
        BLAS(cublasSaxpy(h, n, &alpha, dx, 1, dy, 1));
        std::vector<float> want = y;
        for (int i = 0; i < n; ++i) want[i] += alpha * x[i];
        EXPECT(close(from_device(dy, n), want, 1e-6));
        float dot = 0, nrm = 0;
        BLAS(cublasSdot(h, n, dx, 1, dy, 1, &dot));
        double wdot = 0, wnrm = 0;
        for (int i = 0; i < n; ++i) wdot += (double)x[i] * want[i], wnrm += (double)x[i] * x[i];
        EXPECT(std::fabs(dot - wdot) < 1e-4 * (1 + std::fabs(wdot)));
        BLAS(cublasSnrm2(h, n, dx, 1, &nrm));
        EXPECT(std::fabs(nrm - std::sqrt(wnrm)) < 1e-4);
        int imax = 0;
        BLAS(cublasIsamax(h, n, dx, 1, &imax));
        int wmax = 1;
        for (int i = 1; i < n; ++i)
            if (std::fabs(x[i]) > std::fabs(x[wmax - 1])) wmax = i + 1;
        EXPECT(imax == wmax);
        float scale = -2.0f;
        BLAS(cublasSscal(h, n / 2, &scale, dx, 2));
        std::vector<float> sx = x;
        for (int i = 0; i < n; i += 2) sx[i] *= scale;
        EXPECT(close(from_device(dx, n), sx, 1e-6));
        BLAS(cublasSswap(h, n, dx, 1, dy, 1));
        EXPECT(close(from_device(dy, n), sx, 1e-6));
        BLAS(cublasScopy(h, n, dy, -1, dx, 1));
        std::vector<float> rev(sx.rbegin(), sx.rend());
        EXPECT(close(from_device(dx, n), rev, 1e-6));
        std::vector<double> xd = seq_d(n, 1.0, -6.0);
        double *dxd = to_device(xd);
        double asum = 0;
        BLAS(cublasDasum(h, n, dxd, 1, &asum));
        double wasum = 0;
        for (double v : xd) wasum += std::fabs(v);
        EXPECT(std::fabs(asum - wasum) < 1e-9);
        std::printf("level 1: axpy dot nrm2 amax scal swap copy asum correct\n");
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dy));
        CHECK(cudaFree(dxd));
    }

    // Level 2.
    {
        const int m = 5, n = 4, lda = 6;
        std::vector<double> a = seq_d(lda * n, 0.5, -1.0), x = seq_d(m, 1.0, 0.5), y = seq_d(n, -1.0, 3.0);
        double *da = to_device(a), *dx = to_device(x), *dy = to_device(y);
        double alpha = 2.0, beta = -1.0;
        BLAS(cublasDgemv(h, CUBLAS_OP_T, m, n, &alpha, da, lda, dx, 1, &beta, dy, 1));
        std::vector<double> want = y;
        for (int j = 0; j < n; ++j) {
            double acc = 0;
            for (int i = 0; i < m; ++i) acc += a[i + j * lda] * x[i];
            want[j] = alpha * acc + beta * y[j];
        }
        EXPECT(close(from_device(dy, n), want, 1e-12));
        BLAS(cublasDger(h, m, n, &alpha, dx, 1, dy, 1, da, lda));
        std::vector<double> wa = a;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) wa[i + j * lda] += alpha * x[i] * want[j];
        EXPECT(close(from_device(da, lda * n), wa, 1e-12));
        std::printf("level 2: gemv ger correct\n");
        CHECK(cudaFree(da));
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dy));
    }

    // SGEMM and DGEMM with transposes and padded leading dimensions.
    {
        const int m = 7, n = 5, k = 6, lda = 8, ldb = 9, ldc = 8;
        std::vector<float> a = seq_f(lda * m, 0.25f, -1.0f), b = seq_f(ldb * n, -0.5f, 1.0f), c = seq_f(ldc * n, 1.0f, 0.0f);
        float *da = to_device(a), *db = to_device(b), *dc = to_device(c);
        float alpha = 0.75f, beta = 0.5f;
        BLAS(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da, lda, db, ldb, &beta, dc, ldc));
        ref_gemm(true, false, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        EXPECT(close(from_device(dc, ldc * n), c, 1e-5));
        std::vector<double> ad = seq_d(k * k, 0.1, -0.3), bd = seq_d(n * k, 0.2, 0.1), cd(k * n, 0.0);
        double *dad = to_device(ad), *dbd = to_device(bd), *dcd = to_device(cd);
        double one = 1.0, zero = 0.0;
        BLAS(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, k, n, k, &one, dad, k, dbd, n, &zero, dcd, k));
        ref_gemm(false, true, k, n, k, 1.0, ad.data(), k, bd.data(), n, 0.0, cd.data(), k);
        EXPECT(close(from_device(dcd, k * n), cd, 1e-12));
        std::printf("gemm: sgemm (A transposed) and dgemm (B transposed) correct\n");
        CHECK(cudaFree(da));
        CHECK(cudaFree(db));
        CHECK(cudaFree(dc));
        CHECK(cudaFree(dad));
        CHECK(cudaFree(dbd));
        CHECK(cudaFree(dcd));
    }

    // Batched GEMMs: strided (float) and by pointer arrays (double).
    {
        const int m = 4, n = 3, k = 5, batch = 3;
        const long long sa = m * k + 2, sb = k * n, sc = m * n + 1;
        std::vector<float> a = seq_f(sa * batch, 0.5f, -2.0f), b = seq_f(sb * batch, 0.25f, 0.5f), c(sc * batch, 1.0f);
        float *da = to_device(a), *db = to_device(b), *dc = to_device(c);
        float alpha = 1.0f, beta = 2.0f;
        BLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, sa, db, k, sb, &beta, dc,
                                       m, sc, batch));
        for (int i = 0; i < batch; ++i)
            ref_gemm(false, false, m, n, k, alpha, &a[i * sa], m, &b[i * sb], k, beta, &c[i * sc], m);
        EXPECT(close(from_device(dc, sc * batch), c, 1e-5));

        std::vector<double *> pa(batch), pb(batch), pc(batch);
        std::vector<std::vector<double>> ha(batch), hb(batch), hc(batch);
        for (int i = 0; i < batch; ++i) {
            ha[i] = seq_d(m * k, 0.1 * (i + 1), -0.5);
            hb[i] = seq_d(k * n, -0.2, 0.3 * i);
            hc[i] = seq_d(m * n, 1.0, 0.0);
            pa[i] = to_device(ha[i]);
            pb[i] = to_device(hb[i]);
            pc[i] = to_device(hc[i]);
        }
        double **dpa = to_device(pa), **dpb = to_device(pb), **dpc = to_device(pc);
        double dalpha = -1.0, dbeta = 0.5;
        BLAS(cublasDgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &dalpha, dpa, m, dpb, k, &dbeta, dpc, m, batch));
        for (int i = 0; i < batch; ++i) {
            ref_gemm(false, false, m, n, k, dalpha, ha[i].data(), m, hb[i].data(), k, dbeta, hc[i].data(), m);
            EXPECT(close(from_device(pc[i], m * n), hc[i], 1e-12));
            CHECK(cudaFree(pa[i]));
            CHECK(cudaFree(pb[i]));
            CHECK(cudaFree(pc[i]));
        }
        std::printf("batched: sgemmStridedBatched and dgemmBatched correct\n");
        CHECK(cudaFree(da));
        CHECK(cudaFree(db));
        CHECK(cudaFree(dc));
        CHECK(cudaFree(dpa));
        CHECK(cudaFree(dpb));
        CHECK(cudaFree(dpc));
    }

    // Mixed precision: fp16 A and B, fp32 C and compute.
    {
        const int m = 8, n = 6, k = 4, batch = 2;
        std::vector<float> af = seq_f(m * k * batch, 0.25f, -1.0f), bf = seq_f(k * n * batch, 0.5f, -0.5f);
        std::vector<__half> a(af.size()), b(bf.size());
        for (size_t i = 0; i < af.size(); ++i) a[i] = __float2half(af[i]);
        for (size_t i = 0; i < bf.size(); ++i) b[i] = __float2half(bf[i]);
        std::vector<float> c(m * n * batch, 0.0f);
        __half *da = to_device(a), *db = to_device(b);
        float *dc = to_device(c);
        float alpha = 1.0f, beta = 0.0f;
        BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, CUDA_R_16F, m, db, CUDA_R_16F, k, &beta, dc,
                          CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        std::vector<float> want(m * n * batch, 0.0f);
        ref_gemm(false, false, m, n, k, 1.0f, af.data(), m, bf.data(), k, 0.0f, want.data(), m);
        EXPECT(close(from_device(dc, m * n), std::vector<float>(want.begin(), want.begin() + m * n), 1e-3));
        BLAS(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, CUDA_R_16F, m, m * k, db,
                                        CUDA_R_16F, k, k * n, &beta, dc, CUDA_R_32F, m, m * n, batch,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        ref_gemm(false, false, m, n, k, 1.0f, &af[m * k], m, &bf[k * n], k, 0.0f, &want[m * n], m);
        EXPECT(close(from_device(dc, m * n * batch), want, 1e-3));
        std::printf("mixed precision: GemmEx and GemmStridedBatchedEx with fp16 inputs correct\n");
        CHECK(cudaFree(da));
        CHECK(cudaFree(db));
        CHECK(cudaFree(dc));
    }

    // A handle on a stream, with its scalars and result in device memory.
    {
        cudaStream_t stream;
        CHECK(cudaStreamCreate(&stream));
        BLAS(cublasSetStream(h, stream));
        cudaStream_t got;
        BLAS(cublasGetStream(h, &got));
        EXPECT(got == stream);
        BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
        cublasPointerMode_t mode;
        BLAS(cublasGetPointerMode(h, &mode));
        EXPECT(mode == CUBLAS_POINTER_MODE_DEVICE);
        const int n = 16;
        std::vector<float> x = seq_f(n, 1.0f, -3.0f), y = seq_f(n, 0.5f, 1.0f);
        std::vector<float> scalars = {2.0f, 0.0f};
        float *dx = to_device(x), *dy = to_device(y), *ds = to_device(scalars);
        BLAS(cublasSaxpy(h, n, &ds[0], dx, 1, dy, 1));
        BLAS(cublasSdot(h, n, dx, 1, dy, 1, &ds[1]));
        CHECK(cudaStreamSynchronize(stream));
        double want = 0;
        for (int i = 0; i < n; ++i) want += (double)x[i] * (y[i] + 2.0f * x[i]);
        std::vector<float> back = from_device(ds, 2);
        EXPECT(std::fabs(back[1] - want) < 1e-3 * (1 + std::fabs(want)));
        BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
        BLAS(cublasSetStream(h, 0));
        CHECK(cudaStreamDestroy(stream));
        std::printf("stream and device pointer mode: saxpy and sdot correct\n");
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dy));
        CHECK(cudaFree(ds));
    }

    // The transfers of cublas_api.h: every other element, and a sub-matrix.
    {
        std::vector<float> host = seq_f(12, 1.0f, 0.0f), back(12, -1.0f);
        float *d;
        CHECK(cudaMalloc(&d, 12 * sizeof(float)));
        BLAS(cublasSetVector(6, sizeof(float), host.data(), 2, d, 1));
        BLAS(cublasGetVector(6, sizeof(float), d, 1, back.data(), 1));
        for (int i = 0; i < 6; ++i) EXPECT(back[i] == host[2 * i]);
        BLAS(cublasSetMatrix(3, 4, sizeof(float), host.data(), 3, d, 3));
        std::vector<float> sub(8, 0.0f);
        BLAS(cublasGetMatrix(2, 4, sizeof(float), d, 3, sub.data(), 2));
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 2; ++i) EXPECT(sub[i + 2 * j] == host[i + 3 * j]);
        CHECK(cudaFree(d));
        std::printf("transfers: set/get vector and matrix correct\n");
    }

    // geam runs where the server has NVIDIA's libcublas; on emu it answers NOT_SUPPORTED.
    {
        const int m = 3, n = 2;
        std::vector<float> a = seq_f(m * n, 1.0f, 0.0f), b = seq_f(n * m, -1.0f, 2.0f), c(m * n, 0.0f);
        float *da = to_device(a), *db = to_device(b), *dc = to_device(c);
        float alpha = 2.0f, beta = 1.0f;
        cublasStatus_t s = cublasSgeam(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, &alpha, da, m, &beta, db, n, dc, m);
        bool right = s == CUBLAS_STATUS_NOT_SUPPORTED;
        if (s == CUBLAS_STATUS_SUCCESS) {
            std::vector<float> want(m * n);
            for (int j = 0; j < n; ++j)
                for (int i = 0; i < m; ++i) want[i + j * m] = alpha * a[i + j * m] + beta * b[j + i * n];
            right = close(from_device(dc, m * n), want, 1e-6);
        }
        std::printf("geam: %s\n", right ? "answered" : "wrong");
        CHECK(cudaFree(da));
        CHECK(cudaFree(db));
        CHECK(cudaFree(dc));
    }

    // A complex GEMM of nothing answers (on any backend, whether it carries complex types or not).
    {
        cuComplex one = {1.0f, 0.0f};
        cublasStatus_t s = cublasCgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 0, 0, &one, nullptr, 1, nullptr, 1, &one,
                                       nullptr, 1);
        std::printf("cgemm of nothing: %s\n", s == CUBLAS_STATUS_SUCCESS || s == CUBLAS_STATUS_NOT_SUPPORTED ? "answered" : "failed");
    }

    if (hostile) {
        float *d;
        CHECK(cudaMalloc(&d, 16 * sizeof(float)));
        float one = 1.0f;
        // What only the server can check (the session's memory) may fail a GEMM after it
        // returned (it is sent without waiting): the failure comes back from the next
        // synchronous call on the handle, as CUDA reports an asynchronous error.
        auto reported = [&](cublasStatus_t s) {
            cudaStream_t current;
            return s != CUBLAS_STATUS_SUCCESS ? s : cublasGetStream(h, &current);
        };
        // lda smaller than m.
        std::printf("hostile: bad lda -> %s\n",
                    cublasGetStatusName(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 2, d, 4, &one, d, 4)));
        // A 4x4 matrix is 16 floats; 8x8 runs past the allocation.
        std::printf("hostile: matrix past its allocation -> %s\n",
                    cublasGetStatusName(reported(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, 8, d, 8, &one, d, 8))));
        // A pointer array whose entries point nowhere.
        float **arr;
        CHECK(cudaMalloc(&arr, 2 * sizeof(float *)));
        std::vector<float *> bogus = {d, (float *)0x10};
        CHECK(cudaMemcpy(arr, bogus.data(), 2 * sizeof(float *), cudaMemcpyHostToDevice));
        std::printf("hostile: batched pointer outside memory -> %s\n",
                    cublasGetStatusName(reported(cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, arr, 2,
                                                                    arr, 2, &one, arr, 2, 2))));
        cublasHandle_t gone;
        BLAS(cublasCreate(&gone));
        BLAS(cublasDestroy(gone));
        std::printf("hostile: destroyed handle -> %s\n", cublasGetStatusName(cublasSscal(gone, 4, &one, d, 1)));
        // A result for the host in a stream capture: cuBLAS would wait for the stream, which a
        // capture forbids; the call is refused and the capture invalidated.
        cudaStream_t cs;
        CHECK(cudaStreamCreate(&cs));
        BLAS(cublasSetStream(h, cs));
        BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
        CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        float norm = 0;
        cublasStatus_t in_capture = cublasSnrm2(h, 4, d, 1, &norm);
        cudaGraph_t graph = nullptr;
        cudaError_t ended = cudaStreamEndCapture(cs, &graph);
        std::printf("hostile: a host result in a capture -> %s, end of capture -> %s\n",
                    cublasGetStatusName(in_capture), cudaGetErrorName(ended));
        if (graph) CHECK(cudaGraphDestroy(graph));
        BLAS(cublasSetStream(h, 0));
        CHECK(cudaStreamDestroy(cs));
        // The session still works.
        BLAS(cublasSscal(h, 4, &one, d, 1));
        CHECK(cudaFree(arr));
        CHECK(cudaFree(d));
        std::printf("hostile: the handle still works\n");
    }

    BLAS(cublasDestroy(h));
    std::printf("done\n");
    return 0;
}
