// The shape of NVIDIA's batchCUBLAS sample: many small GEMMs computed three ways and checked
// against the host: one cublasSgemm/cublasDgemm per matrix, spread over several streams with
// cublasSetStream; one cublasSgemmBatched over arrays of pointers; one
// cublasSgemmStridedBatched over matrices laid out at a fixed stride. Output is verdicts only
// (the same wherever it runs).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuComplex.h>
#include <cublas_v2.h>

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

static const int m = 24, n = 20, k = 16, batch = 8, streams = 4;

// C_i = alpha A_i B_i + beta C_i on the host, column-major, for matrix i of the batch.
template <typename T>
static std::vector<T> reference(const std::vector<T> &a, const std::vector<T> &b, const std::vector<T> &c, T alpha,
                                T beta) {
    std::vector<T> out(c);
    for (int i = 0; i < batch; ++i)
        for (int col = 0; col < n; ++col)
            for (int row = 0; row < m; ++row) {
                double sum = 0.0;
                for (int l = 0; l < k; ++l) sum += (double)a[i * m * k + row + l * m] * b[i * k * n + l + col * k];
                out[i * m * n + row + col * m] = (T)(alpha * sum + beta * c[i * m * n + row + col * m]);
            }
    return out;
}

template <typename T>
static bool close(const std::vector<T> &got, const std::vector<T> &want, double tol) {
    for (size_t i = 0; i < got.size(); ++i)
        if (std::fabs((double)got[i] - (double)want[i]) > tol * (1.0 + std::fabs((double)want[i]))) return false;
    return true;
}

template <typename T>
static void fill(std::vector<T> &v, int seed) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = (T)((int)((i * 31 + seed * 17) % 19) - 9) / (T)8;
}

template <typename T>
static void per_stream(cublasHandle_t blas, cudaStream_t *stream, const char *name,
                       cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                              const T *, const T *, int, const T *, int, const T *, T *, int),
                       double tol) {
    std::vector<T> a(batch * m * k), b(batch * k * n), c(batch * m * n);
    fill(a, 1);
    fill(b, 2);
    fill(c, 3);
    T *d_a, *d_b, *d_c;
    CHECK(cudaMalloc(&d_a, sizeof(T) * a.size()));
    CHECK(cudaMalloc(&d_b, sizeof(T) * b.size()));
    CHECK(cudaMalloc(&d_c, sizeof(T) * c.size()));
    CHECK(cudaMemcpy(d_a, a.data(), sizeof(T) * a.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), sizeof(T) * b.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_c, c.data(), sizeof(T) * c.size(), cudaMemcpyHostToDevice));
    const T alpha = (T)1.5, beta = (T)-0.5;
    for (int i = 0; i < batch; ++i) {
        BLAS(cublasSetStream(blas, stream[i % streams]));
        BLAS(gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a + i * m * k, m, d_b + i * k * n, k, &beta,
                  d_c + i * m * n, m));
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<T> got(c.size());
    CHECK(cudaMemcpy(got.data(), d_c, sizeof(T) * got.size(), cudaMemcpyDeviceToHost));
    std::printf("%s on %d streams (%d matrices %d x %d x %d): %s\n", name, streams, batch, m, n, k,
                close(got, reference(a, b, c, alpha, beta), tol) ? "correct" : "WRONG");
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_c));
}

static void batched(cublasHandle_t blas) {
    std::vector<float> a(batch * m * k), b(batch * k * n), c(batch * m * n);
    fill(a, 4);
    fill(b, 5);
    fill(c, 6);
    float *d_a, *d_b, *d_c;
    CHECK(cudaMalloc(&d_a, sizeof(float) * a.size()));
    CHECK(cudaMalloc(&d_b, sizeof(float) * b.size()));
    CHECK(cudaMalloc(&d_c, sizeof(float) * c.size()));
    CHECK(cudaMemcpy(d_a, a.data(), sizeof(float) * a.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), sizeof(float) * b.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_c, c.data(), sizeof(float) * c.size(), cudaMemcpyHostToDevice));
    const float alpha = 2.0f, beta = 1.0f;

    // The pointer arrays live in device memory, as cuBLAS wants them.
    std::vector<const float *> pa(batch), pb(batch);
    std::vector<float *> pc(batch);
    for (int i = 0; i < batch; ++i) {
        pa[i] = d_a + i * m * k;
        pb[i] = d_b + i * k * n;
        pc[i] = d_c + i * m * n;
    }
    const float **d_pa, **d_pb;
    float **d_pc;
    CHECK(cudaMalloc(&d_pa, sizeof(float *) * batch));
    CHECK(cudaMalloc(&d_pb, sizeof(float *) * batch));
    CHECK(cudaMalloc(&d_pc, sizeof(float *) * batch));
    CHECK(cudaMemcpy(d_pa, pa.data(), sizeof(float *) * batch, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_pb, pb.data(), sizeof(float *) * batch, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_pc, pc.data(), sizeof(float *) * batch, cudaMemcpyHostToDevice));
    BLAS(cublasSgemmBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_pa, m, d_pb, k, &beta, d_pc, m, batch));
    std::vector<float> got(c.size());
    CHECK(cudaMemcpy(got.data(), d_c, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
    std::vector<float> want = reference(a, b, c, alpha, beta);
    std::printf("cublasSgemmBatched (%d matrices): %s\n", batch, close(got, want, 1e-5) ? "correct" : "WRONG");

    // Strided: the same products again, on top of the first (C = 2 A B + C twice).
    BLAS(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a, m, (long long)m * k, d_b,
                                   k, (long long)k * n, &beta, d_c, m, (long long)m * n, batch));
    CHECK(cudaMemcpy(got.data(), d_c, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
    want = reference(a, b, want, alpha, beta);
    std::printf("cublasSgemmStridedBatched (%d matrices): %s\n", batch, close(got, want, 1e-5) ? "correct" : "WRONG");
    CHECK(cudaFree(d_pa));
    CHECK(cudaFree(d_pb));
    CHECK(cudaFree(d_pc));
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_c));
}

// C = alpha A^H B + beta C in both complex precisions, against the host.
template <typename T, typename Gemm>
static bool complex_gemm(cublasHandle_t blas, Gemm gemm, T (*make)(double, double), double tol) {
    const int cm = 5, cn = 3, ck = 4;
    std::vector<T> a(ck * cm), b(ck * cn), c(cm * cn);
    for (int i = 0; i < ck * cm; ++i) a[i] = make((i % 7) - 3.0, (i % 3) - 1.0);
    for (int i = 0; i < ck * cn; ++i) b[i] = make((i % 5) - 2.0, (i % 4) * 0.5);
    for (int i = 0; i < cm * cn; ++i) c[i] = make(i * 0.25, -1.0);
    T *d_a, *d_b, *d_c;
    CHECK(cudaMalloc(&d_a, sizeof(T) * a.size()));
    CHECK(cudaMalloc(&d_b, sizeof(T) * b.size()));
    CHECK(cudaMalloc(&d_c, sizeof(T) * c.size()));
    CHECK(cudaMemcpy(d_a, a.data(), sizeof(T) * a.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), sizeof(T) * b.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_c, c.data(), sizeof(T) * c.size(), cudaMemcpyHostToDevice));
    const T alpha = make(0.5, 1.0), beta = make(-1.0, 0.5);
    BLAS(gemm(blas, CUBLAS_OP_C, CUBLAS_OP_N, cm, cn, ck, &alpha, d_a, ck, d_b, ck, &beta, d_c, cm));
    std::vector<T> got(c.size());
    CHECK(cudaMemcpy(got.data(), d_c, sizeof(T) * got.size(), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int col = 0; col < cn; ++col)
        for (int row = 0; row < cm; ++row) {
            double re = 0.0, im = 0.0;
            for (int l = 0; l < ck; ++l) {
                // conj(A[l][row]) * B[l][col]
                const double ar = a[l + row * ck].x, ai = -a[l + row * ck].y, br = b[l + col * ck].x,
                             bi = b[l + col * ck].y;
                re += ar * br - ai * bi;
                im += ar * bi + ai * br;
            }
            const T old = c[row + col * cm];
            const double want_re = alpha.x * re - alpha.y * im + beta.x * old.x - beta.y * old.y;
            const double want_im = alpha.x * im + alpha.y * re + beta.x * old.y + beta.y * old.x;
            const T g = got[row + col * cm];
            ok = ok && std::fabs(g.x - want_re) < tol && std::fabs(g.y - want_im) < tol;
        }
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_c));
    return ok;
}

static cuComplex make_c(double re, double im) { return make_cuComplex((float)re, (float)im); }
static cuDoubleComplex make_z(double re, double im) { return make_cuDoubleComplex(re, im); }

static const int lu_n = 4, lu_batch = 64;

// Uploads a batch of matrices and an array of device pointers to them.
static float **upload_batch(const std::vector<float> &host, int count, int elems, float **d_data) {
    CHECK(cudaMalloc(d_data, sizeof(float) * host.size()));
    CHECK(cudaMemcpy(*d_data, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice));
    std::vector<float *> pointers(count);
    for (int i = 0; i < count; ++i) pointers[i] = *d_data + i * elems;
    float **d_pointers;
    CHECK(cudaMalloc(&d_pointers, sizeof(float *) * count));
    CHECK(cudaMemcpy(d_pointers, pointers.data(), sizeof(float *) * count, cudaMemcpyHostToDevice));
    return d_pointers;
}

static void lu_batched(cublasHandle_t blas) {
    const int n = lu_n, elems = n * n;
    std::vector<float> a(lu_batch * elems);
    for (int b = 0; b < lu_batch; ++b)
        for (int i = 0; i < elems; ++i) a[b * elems + i] = (float)((i * 7 + b * 5) % 11) - 5.0f + (i % 5 == 0 ? 20.0f : 0.0f);
    float *d_a, *d_c;
    float **d_pa = upload_batch(a, lu_batch, elems, &d_a);
    float **d_pc = upload_batch(std::vector<float>(a.size(), 0.0f), lu_batch, elems, &d_c);
    int *d_pivots, *d_info;
    CHECK(cudaMalloc(&d_pivots, sizeof(int) * n * lu_batch));
    CHECK(cudaMalloc(&d_info, sizeof(int) * lu_batch));
    BLAS(cublasSgetrfBatched(blas, n, d_pa, n, d_pivots, d_info, lu_batch));
    std::vector<float> lu(a.size());
    std::vector<int> pivots(n * lu_batch), info(lu_batch);
    CHECK(cudaMemcpy(lu.data(), d_a, sizeof(float) * lu.size(), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(pivots.data(), d_pivots, sizeof(int) * pivots.size(), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(info.data(), d_info, sizeof(int) * info.size(), cudaMemcpyDeviceToHost));
    bool factors = true, all_regular = true;
    for (int b = 0; b < lu_batch; ++b) {
        all_regular = all_regular && info[b] == 0;
        // P A: A's rows interchanged as the pivots say, in order.
        std::vector<float> pa(a.begin() + b * elems, a.begin() + (b + 1) * elems);
        for (int k = 0; k < n; ++k) {
            const int q = pivots[b * n + k] - 1;
            for (int c = 0; c < n; ++c) std::swap(pa[k + c * n], pa[q + c * n]);
        }
        const float *f = &lu[b * elems];
        for (int r = 0; r < n; ++r)
            for (int c = 0; c < n; ++c) {
                double sum = 0.0;
                for (int k = 0; k <= r && k <= c; ++k) sum += (k == r ? 1.0 : f[r + k * n]) * f[k + c * n];
                factors = factors && std::fabs(sum - pa[r + c * n]) < 1e-4 * (1.0 + std::fabs(pa[r + c * n]));
            }
    }
    std::printf("cublasSgetrfBatched (%d matrices %d x %d, pivoting): info all 0 %s, P A = L U %s\n", lu_batch, n,
                n, all_regular ? "yes" : "no", factors ? "holds" : "does NOT hold");

    BLAS(cublasSgetriBatched(blas, n, (const float **)d_pa, n, d_pivots, d_pc, n, d_info, lu_batch));
    std::vector<float> inverse(a.size());
    CHECK(cudaMemcpy(inverse.data(), d_c, sizeof(float) * inverse.size(), cudaMemcpyDeviceToHost));
    bool identity = true;
    for (int b = 0; b < lu_batch; ++b)
        for (int r = 0; r < n; ++r)
            for (int c = 0; c < n; ++c) {
                double sum = 0.0;
                for (int k = 0; k < n; ++k) sum += (double)a[b * elems + r + k * n] * inverse[b * elems + k + c * n];
                identity = identity && std::fabs(sum - (r == c ? 1.0 : 0.0)) < 1e-3;
            }
    std::printf("cublasSgetriBatched: A A^-1 = I %s\n", identity ? "holds" : "does NOT hold");
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_c));
    CHECK(cudaFree(d_pa));
    CHECK(cudaFree(d_pc));
    CHECK(cudaFree(d_pivots));
    CHECK(cudaFree(d_info));
}

static const char *status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "another status";
    }
}

// What a careless or hostile program gets from the batched LU and the triangular solve.
static int hostile(cublasHandle_t blas) {
    const int n = 2;
    std::vector<float> a = {4.0f, 2.0f, 1.0f, 3.0f};
    float *d_a, *d_c;
    float **d_pa = upload_batch(a, 1, 4, &d_a);
    float **d_pc = upload_batch(a, 1, 4, &d_c);
    int *d_pivots, *d_info;
    CHECK(cudaMalloc(&d_pivots, sizeof(int) * n));
    CHECK(cudaMalloc(&d_info, sizeof(int)));
    // A pointer array naming a matrix far past the end of its allocation.
    float *past = d_a + (1 << 22);
    float **d_bad;
    CHECK(cudaMalloc(&d_bad, sizeof(float *)));
    CHECK(cudaMemcpy(d_bad, &past, sizeof(float *), cudaMemcpyHostToDevice));
    std::printf("hostile: matrix past its allocation -> %s\n",
                status_name(cublasSgetrfBatched(blas, n, d_bad, n, d_pivots, d_info, 1)));
    std::printf("hostile: lda below n -> %s\n", status_name(cublasSgetrfBatched(blas, n, d_pa, 1, d_pivots, d_info, 1)));
    BLAS(cublasSgetrfBatched(blas, n, d_pa, n, d_pivots, d_info, 1));
    const int wild[2] = {99, 2};
    CHECK(cudaMemcpy(d_pivots, wild, sizeof(wild), cudaMemcpyHostToDevice));
    std::printf("hostile: pivots out of range -> %s\n",
                status_name(cublasSgetriBatched(blas, n, (const float **)d_pa, n, d_pivots, d_pc, n, d_info, 1)));
    const float one = 1.0f;
    std::printf("hostile: trsm lda below m -> %s\n",
                status_name(cublasStrsm(blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N,
                                        CUBLAS_DIAG_NON_UNIT, n, 1, &one, d_a, 1, d_c, n)));
    // The handle still works: the inverse of [[4, 1], [2, 3]] without pivots.
    CHECK(cudaMemcpy(d_a, a.data(), sizeof(float) * 4, cudaMemcpyHostToDevice));
    BLAS(cublasSgetrfBatched(blas, n, d_pa, n, NULL, d_info, 1));
    BLAS(cublasSgetriBatched(blas, n, (const float **)d_pa, n, NULL, d_pc, n, d_info, 1));
    float c[4];
    CHECK(cudaMemcpy(c, d_c, sizeof(c), cudaMemcpyDeviceToHost));
    const bool works = std::fabs(c[0] - 0.3f) < 1e-6f && std::fabs(c[1] + 0.2f) < 1e-6f &&
                       std::fabs(c[2] + 0.1f) < 1e-6f && std::fabs(c[3] - 0.4f) < 1e-6f;
    std::printf("hostile: %s\n", works ? "the handle still works" : "the handle is BROKEN");
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_c));
    CHECK(cudaFree(d_pa));
    CHECK(cudaFree(d_pc));
    CHECK(cudaFree(d_bad));
    CHECK(cudaFree(d_pivots));
    CHECK(cudaFree(d_info));
    BLAS(cublasDestroy(blas));
    std::printf("done\n");
    return 0;
}

int main(int argc, char **argv) {
    cublasHandle_t blas;
    BLAS(cublasCreate(&blas));
    if (argc > 1 && std::strcmp(argv[1], "hostile") == 0) return hostile(blas);
    cudaStream_t stream[streams];
    for (int i = 0; i < streams; ++i) CHECK(cudaStreamCreate(&stream[i]));
    per_stream<float>(blas, stream, "cublasSgemm", cublasSgemm, 1e-5);
    per_stream<double>(blas, stream, "cublasDgemm", cublasDgemm, 1e-12);
    BLAS(cublasSetStream(blas, 0));
    batched(blas);
    const bool c_ok = complex_gemm<cuComplex>(blas, cublasCgemm, make_c, 1e-4);
    const bool z_ok = complex_gemm<cuDoubleComplex>(blas, cublasZgemm, make_z, 1e-12);
    std::printf("cublasCgemm/cublasZgemm (A^H B, complex scalars): %s/%s\n", c_ok ? "correct" : "WRONG",
                z_ok ? "correct" : "WRONG");
    lu_batched(blas);
    for (int i = 0; i < streams; ++i) CHECK(cudaStreamDestroy(stream[i]));
    BLAS(cublasDestroy(blas));
    std::printf("done\n");
    return 0;
}
