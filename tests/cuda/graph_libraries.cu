// Library calls inside stream capture: a graph captured on one stream holds a cuBLAS GEMM
// (host scalars, taken when captured), a dot product and an axpy in device pointer mode
// (scalars read when the graph runs), a cuSPARSE SpMV, a cuFFT transform and a cuRAND
// generation; it is launched several times on another stream with its inputs changed between
// launches, and every result is checked against the host's (the random numbers against a
// second generator with the same seed: CUDA's graph keeps the generator's offset as captured,
// so every launch draws the same numbers). Then a conjugate gradient solve built like NVIDIA's
// "conjugate gradient with CUDA graphs" sample: one iteration (kernels, cuBLAS scal/axpy/dot
// in device pointer mode, cuSPARSE SpMV, memsets and copies) captured once and launched until
// the residual is small, the solution checked on the host. What is printed is the same
// wherever the program runs.
//
// Modes (through Phos): `refusals` captures what CUDA cannot capture either (a dot product
// with its result on the host) and prints the status and the capture's end; `hostile`
// destroys the cuBLAS handle a captured GEMM uses before launching the graph and prints what
// the launch answers, then shows a new handle works; `checkpoint` captures the graph, says
// so, waits three seconds (a checkpoint and restore happen then) and launches it afterwards.
#include <cmath>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <cublas_v2.h>
#include <cufft.h>
#include <curand.h>
#include <cusparse.h>

#include "check.h"

#define BLAS(call)                                                                           \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            std::printf("FAILED: %s -> %d at %s:%d\n", #call, (int)s_, __FILE__, __LINE__);  \
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

#define FFT(call)                                                                            \
    do {                                                                                     \
        cufftResult r_ = (call);                                                             \
        if (r_ != CUFFT_SUCCESS) {                                                           \
            std::printf("FAILED: %s -> %d at %s:%d\n", #call, (int)r_, __FILE__, __LINE__);  \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

#define RAND(call)                                                                           \
    do {                                                                                     \
        curandStatus_t r_ = (call);                                                          \
        if (r_ != CURAND_STATUS_SUCCESS) {                                                   \
            std::printf("FAILED: %s -> %d at %s:%d\n", #call, (int)r_, __FILE__, __LINE__);  \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

// A fixed linear congruential generator: the same inputs everywhere.
static unsigned lcg_state = 2024;
static float next_unit() {
    lcg_state = lcg_state * 1103515245u + 12345u;
    return ((lcg_state >> 8) & 0xffff) / 65536.0f;
}
static std::vector<float> random_vector(size_t n, float offset) {
    std::vector<float> v(n);
    for (auto &x : v) x = next_unit() + offset;
    return v;
}

template <typename T> static T *device_copy(const std::vector<T> &v) {
    T *d = nullptr;
    CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <typename T> static void upload(T *d, const std::vector<T> &v) {
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T> static std::vector<T> download(const T *d, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

static bool near(double got, double want, double tol) {
    return std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
}
static void expect_all_close(const char *what, const std::vector<float> &got, const std::vector<double> &want,
                             double tol) {
    for (size_t i = 0; i < got.size(); i++) {
        if (!near(got[i], want[i], tol)) {
            std::printf("FAILED: %s[%zu] = %g, expected %g\n", what, i, got[i], want[i]);
            std::exit(1);
        }
    }
}

// A tridiagonal symmetric positive definite matrix of order n in CSR (0-based): a diagonal
// that dominates its row, as NVIDIA's sample makes one.
struct Csr {
    int n, nnz;
    std::vector<int> offsets, columns;
    std::vector<float> values;
};
static Csr tridiagonal(int n) {
    Csr a{n, 0, {0}, {}, {}};
    std::vector<float> off(n);
    for (int i = 0; i < n; i++) off[i] = next_unit();
    for (int i = 0; i < n; i++) {
        if (i > 0) {
            a.columns.push_back(i - 1);
            a.values.push_back(off[i - 1]);
        }
        a.columns.push_back(i);
        a.values.push_back(next_unit() + 4.0f);
        if (i + 1 < n) {
            a.columns.push_back(i + 1);
            a.values.push_back(off[i]);
        }
        a.offsets.push_back((int)a.columns.size());
    }
    a.nnz = (int)a.columns.size();
    return a;
}
static std::vector<double> host_spmv(const Csr &a, const std::vector<float> &x, double alpha) {
    std::vector<double> y(a.n, 0.0);
    for (int i = 0; i < a.n; i++)
        for (int k = a.offsets[i]; k < a.offsets[i + 1]; k++) y[i] += alpha * a.values[k] * x[a.columns[k]];
    return y;
}

// The graph of every library, its operands and the host's reference of its results.
struct Mixed {
    static const int M = 8, N = 6, K = 5, V = 64, F = 16, S = 32, R = 64;
    cudaStream_t capture, launch;
    cublasHandle_t blas;
    cusparseHandle_t sparse;
    cufftHandle fft;
    curandGenerator_t gen;
    float *d_rand;
    float *d_a, *d_b, *d_c, *d_x, *d_y, *d_z, *d_dot, *d_alpha, *d_sx, *d_sy, *d_ws;
    cufftComplex *d_fin, *d_fout;
    Csr sm;
    int *d_off, *d_col;
    float *d_val;
    cusparseSpMatDescr_t A;
    cusparseDnVecDescr_t vx, vy;
    void *sparse_buffer;
    float gemm_alpha = 1.5f, gemm_beta = 0.0f, spmv_alpha = 2.0f, spmv_beta = 0.0f;
    cudaGraphExec_t exec;
    cudaGraph_t graph;

    void setup() {
        CHECK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
        CHECK(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking));
        BLAS(cublasCreate(&blas));
        BLAS(cublasSetStream(blas, capture));
        // As PyTorch does before it captures: a workspace of the program's own.
        CHECK(cudaMalloc(&d_ws, 4 << 20));
        BLAS(cublasSetWorkspace(blas, d_ws, 4 << 20));
        d_a = device_copy(random_vector(M * K, 0));
        d_b = device_copy(random_vector(K * N, 0));
        d_c = device_copy(std::vector<float>(M * N, 0));
        d_x = device_copy(random_vector(V, 0));
        d_y = device_copy(random_vector(V, 0));
        d_z = device_copy(std::vector<float>(V, 0));
        d_dot = device_copy(std::vector<float>(1, 0));
        d_alpha = device_copy(std::vector<float>(1, 0.5f));

        SPARSE(cusparseCreate(&sparse));
        SPARSE(cusparseSetStream(sparse, capture));
        sm = tridiagonal(S);
        d_off = device_copy(sm.offsets);
        d_col = device_copy(sm.columns);
        d_val = device_copy(sm.values);
        d_sx = device_copy(random_vector(S, 0));
        d_sy = device_copy(std::vector<float>(S, 0));
        SPARSE(cusparseCreateCsr(&A, S, S, sm.nnz, d_off, d_col, d_val, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                 CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
        SPARSE(cusparseCreateDnVec(&vx, S, d_sx, CUDA_R_32F));
        SPARSE(cusparseCreateDnVec(&vy, S, d_sy, CUDA_R_32F));
        size_t bytes = 0;
        SPARSE(cusparseSpMV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &spmv_alpha, A, vx, &spmv_beta, vy,
                                       CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
        CHECK(cudaMalloc(&sparse_buffer, bytes ? bytes : 1));

        FFT(cufftPlan1d(&fft, F, CUFFT_C2C, 1));
        FFT(cufftSetStream(fft, capture));
        CHECK(cudaMalloc(&d_fin, F * sizeof(cufftComplex)));
        CHECK(cudaMalloc(&d_fout, F * sizeof(cufftComplex)));
        CHECK(cudaMemset(d_fin, 0, F * sizeof(cufftComplex)));

        RAND(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT));
        RAND(curandSetPseudoRandomGeneratorSeed(gen, 1234));
        RAND(curandSetStream(gen, capture));
        CHECK(cudaMalloc(&d_rand, R * sizeof(float)));
        // cuRAND sets a generator up at its first generation, allocating device memory,
        // which a capture refuses (CURAND_STATUS_ALLOCATION_FAILED on CUDA 13): draw once first.
        RAND(curandGenerateUniform(gen, d_rand, R));
        CHECK(cudaStreamSynchronize(capture));
    }

    // Capture every library's call on `capture`.
    void record() {
        CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
        BLAS(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &gemm_alpha, d_a, M, d_b, K, &gemm_beta, d_c, M));
        BLAS(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_DEVICE));
        BLAS(cublasSdot(blas, V, d_x, 1, d_y, 1, d_dot));
        BLAS(cublasSaxpy(blas, V, d_alpha, d_x, 1, d_z, 1));
        BLAS(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
        SPARSE(cusparseSpMV(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &spmv_alpha, A, vx, &spmv_beta, vy,
                            CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, sparse_buffer));
        FFT(cufftExecC2C(fft, d_fin, d_fout, CUFFT_FORWARD));
        RAND(curandGenerateUniform(gen, d_rand, R));
        CHECK(cudaStreamEndCapture(capture, &graph));
        CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
        // Host scalars were taken when captured: changing them now changes nothing.
        gemm_alpha = 100.0f;
        spmv_alpha = 100.0f;
    }

    // The graph's nodes: at least one per library call, each a kernel, memset or copy node
    // (CUDA's graph holds the libraries' kernels).
    void check_nodes() {
        size_t count = 0;
        CHECK(cudaGraphGetNodes(graph, nullptr, &count));
        EXPECT(count >= 6);
        std::vector<cudaGraphNode_t> nodes(count);
        CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
        int kernels = 0;
        for (auto n : nodes) {
            cudaGraphNodeType t;
            CHECK(cudaGraphNodeGetType(n, &t));
            EXPECT(t == cudaGraphNodeTypeKernel || t == cudaGraphNodeTypeMemset || t == cudaGraphNodeTypeMemcpy);
            kernels += t == cudaGraphNodeTypeKernel;
        }
        EXPECT(kernels >= 6);
        std::printf("graph: every library call is a kernel node\n");
    }

    // Launch `rounds` times on `launch`, new inputs each time, checking every result.
    void run(int rounds) {
        for (int round = 0; round < rounds; round++) {
            std::vector<float> a = random_vector(M * K, -0.5f), b = random_vector(K * N, -0.5f);
            std::vector<float> x = random_vector(V, -0.5f), y = random_vector(V, 0), z = random_vector(V, 0);
            std::vector<float> sx = random_vector(S, 0);
            float alpha = 0.25f + round;
            std::vector<float2> fin(F);
            for (auto &v : fin) v = make_float2(next_unit() - 0.5f, next_unit() - 0.5f);
            upload(d_a, a);
            upload(d_b, b);
            upload(d_x, x);
            upload(d_y, y);
            upload(d_z, z);
            upload(d_alpha, std::vector<float>{alpha});
            upload(d_sx, sx);
            CHECK(cudaMemcpy(d_fin, fin.data(), F * sizeof(cufftComplex), cudaMemcpyHostToDevice));
            CHECK(cudaGraphLaunch(exec, launch));
            CHECK(cudaStreamSynchronize(launch));

            std::vector<double> c(M * N, 0.0), want_z(V);
            for (int j = 0; j < N; j++)
                for (int i = 0; i < M; i++) {
                    double s = 0;
                    for (int k = 0; k < K; k++) s += (double)a[i + k * M] * b[k + j * K];
                    c[i + j * M] = 1.5 * s;
                }
            expect_all_close("gemm", download(d_c, M * N), c, 1e-4);
            double dot = 0;
            for (int i = 0; i < V; i++) dot += (double)x[i] * y[i];
            expect_all_close("dot", download(d_dot, 1), {dot}, 1e-4);
            for (int i = 0; i < V; i++) want_z[i] = z[i] + (double)alpha * x[i];
            expect_all_close("axpy", download(d_z, V), want_z, 1e-5);
            expect_all_close("spmv", download(d_sy, S), host_spmv(sm, sx, 2.0), 1e-4);
            std::vector<float2> fout = download(reinterpret_cast<float2 *>(d_fout), F);
            std::vector<float> got(2 * F);
            std::vector<double> want(2 * F);
            for (int k = 0; k < F; k++) {
                double re = 0, im = 0;
                for (int t = 0; t < F; t++) {
                    double ang = -2.0 * M_PI * k * t / F;
                    re += fin[t].x * std::cos(ang) - fin[t].y * std::sin(ang);
                    im += fin[t].x * std::sin(ang) + fin[t].y * std::cos(ang);
                }
                want[2 * k] = re;
                want[2 * k + 1] = im;
                got[2 * k] = fout[k].x;
                got[2 * k + 1] = fout[k].y;
            }
            expect_all_close("fft", got, want, 1e-4);
            // The first launch draws what a fresh generator with the same seed draws second
            // (the first draw was before the capture). Later launches: CUDA's generators that
            // keep their state on the device (XORWOW, the default) move on at every launch,
            // where Phos draws the captured position again, so only the range is checked.
            std::vector<float> drawn = download(d_rand, R);
            std::vector<float> first(R, 0.5f);
            if (round == 0) {
                curandGenerator_t fresh;
                RAND(curandCreateGenerator(&fresh, CURAND_RNG_PSEUDO_DEFAULT));
                RAND(curandSetPseudoRandomGeneratorSeed(fresh, 1234));
                float *d_fresh = nullptr;
                CHECK(cudaMalloc(&d_fresh, R * sizeof(float)));
                RAND(curandGenerateUniform(fresh, d_fresh, R));
                RAND(curandGenerateUniform(fresh, d_fresh, R));
                first = download(d_fresh, R);
                RAND(curandDestroyGenerator(fresh));
                CHECK(cudaFree(d_fresh));
            }
            for (int i = 0; i < R; i++) {
                if ((round == 0 && drawn[i] != first[i]) || !(drawn[i] > 0.0f && drawn[i] <= 1.0f)) {
                    std::printf("FAILED: rand[%d] = %g, a fresh generator drew %g\n", i, drawn[i], first[i]);
                    std::exit(1);
                }
            }
            CHECK(cudaMemset(d_rand, 0, R * sizeof(float)));
            std::printf("launch %d: gemm, dot, axpy, spmv, fft and rand match the host\n", round + 1);
        }
    }
};

// NVIDIA's sample's small kernels: b = r1 / r0, and na = -a.
__global__ void ratio(const float *num, const float *den, float *out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = num[0] / den[0];
}
__global__ void negate(const float *a, float *na) {
    if (threadIdx.x == 0 && blockIdx.x == 0) na[0] = -a[0];
}

// A conjugate gradient solve of A x = 1 with one iteration captured and launched until the
// residual is small.
static void conjugate_gradient() {
    const int n = 256;
    const float tol = 1e-5f;
    Csr a = tridiagonal(n);
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    cublasHandle_t bl;
    cusparseHandle_t sp;
    BLAS(cublasCreate(&bl));
    BLAS(cublasSetStream(bl, stream));
    SPARSE(cusparseCreate(&sp));
    SPARSE(cusparseSetStream(sp, stream));
    int *d_off = device_copy(a.offsets), *d_col = device_copy(a.columns);
    float *d_val = device_copy(a.values);
    float *d_x = device_copy(std::vector<float>(n, 0)), *d_r = device_copy(std::vector<float>(n, 1));
    float *d_p = device_copy(std::vector<float>(n, 0)), *d_ax = device_copy(std::vector<float>(n, 0));
    float *d_scalars = device_copy(std::vector<float>(6, 0));
    float *d_r1 = d_scalars, *d_r0 = d_scalars + 1, *d_dot = d_scalars + 2, *d_a = d_scalars + 3,
          *d_b = d_scalars + 4, *d_na = d_scalars + 5;
    float *r1 = nullptr;  // page-locked: the graph copies the residual there
    CHECK(cudaMallocHost(&r1, sizeof(float)));
    cusparseSpMatDescr_t A;
    cusparseDnVecDescr_t vx, vp, vax;
    SPARSE(cusparseCreateCsr(&A, n, n, a.nnz, d_off, d_col, d_val, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&vx, n, d_x, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&vp, n, d_p, CUDA_R_32F));
    SPARSE(cusparseCreateDnVec(&vax, n, d_ax, CUDA_R_32F));
    float alpha = 1, beta = 0, alpham1 = -1;
    size_t bytes = 0;
    SPARSE(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vx, &beta, vax, CUDA_R_32F,
                                   CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
    void *buffer = nullptr;
    CHECK(cudaMalloc(&buffer, bytes ? bytes : 1));

    // r = b - A x; r1 = r.r; then the first iteration by hand, as the sample does.
    SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vx, &beta, vax, CUDA_R_32F,
                        CUSPARSE_SPMV_ALG_DEFAULT, buffer));
    BLAS(cublasSaxpy(bl, n, &alpham1, d_ax, 1, d_r, 1));
    BLAS(cublasSetPointerMode(bl, CUBLAS_POINTER_MODE_DEVICE));
    BLAS(cublasSdot(bl, n, d_r, 1, d_r, 1, d_r1));
    BLAS(cublasScopy(bl, n, d_r, 1, d_p, 1));
    SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vp, &beta, vax, CUDA_R_32F,
                        CUSPARSE_SPMV_ALG_DEFAULT, buffer));
    BLAS(cublasSdot(bl, n, d_p, 1, d_ax, 1, d_dot));
    ratio<<<1, 1, 0, stream>>>(d_r1, d_dot, d_a);
    CHECK_LAUNCH();
    BLAS(cublasSaxpy(bl, n, d_a, d_p, 1, d_x, 1));
    negate<<<1, 1, 0, stream>>>(d_a, d_na);
    BLAS(cublasSaxpy(bl, n, d_na, d_ax, 1, d_r, 1));
    CHECK(cudaMemcpyAsync(d_r0, d_r1, sizeof(float), cudaMemcpyDeviceToDevice, stream));
    BLAS(cublasSdot(bl, n, d_r, 1, d_r, 1, d_r1));
    CHECK(cudaMemcpyAsync(r1, d_r1, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));

    // One iteration, captured.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    ratio<<<1, 1, 0, stream>>>(d_r1, d_r0, d_b);
    BLAS(cublasSetPointerMode(bl, CUBLAS_POINTER_MODE_DEVICE));
    BLAS(cublasSscal(bl, n, d_b, d_p, 1));
    BLAS(cublasSetPointerMode(bl, CUBLAS_POINTER_MODE_HOST));
    BLAS(cublasSaxpy(bl, n, &alpha, d_r, 1, d_p, 1));
    BLAS(cublasSetPointerMode(bl, CUBLAS_POINTER_MODE_DEVICE));
    SPARSE(cusparseSetPointerMode(sp, CUSPARSE_POINTER_MODE_HOST));
    SPARSE(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vp, &beta, vax, CUDA_R_32F,
                        CUSPARSE_SPMV_ALG_DEFAULT, buffer));
    CHECK(cudaMemsetAsync(d_dot, 0, sizeof(float), stream));
    BLAS(cublasSdot(bl, n, d_p, 1, d_ax, 1, d_dot));
    ratio<<<1, 1, 0, stream>>>(d_r1, d_dot, d_a);
    BLAS(cublasSaxpy(bl, n, d_a, d_p, 1, d_x, 1));
    negate<<<1, 1, 0, stream>>>(d_a, d_na);
    BLAS(cublasSaxpy(bl, n, d_na, d_ax, 1, d_r, 1));
    CHECK(cudaMemcpyAsync(d_r0, d_r1, sizeof(float), cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaMemsetAsync(d_r1, 0, sizeof(float), stream));
    BLAS(cublasSdot(bl, n, d_r, 1, d_r, 1, d_r1));
    CHECK(cudaMemcpyAsync(r1, d_r1, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));

    int k = 2;
    const int max_iter = 200;
    while (*r1 > tol * tol && k <= max_iter) {
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaStreamSynchronize(stream));
        k++;
    }
    EXPECT(k <= max_iter);

    // The solution, checked on the host: |A x - 1| small.
    std::vector<float> x = download(d_x, n);
    std::vector<double> ax = host_spmv(a, x, 1.0);
    double err = 0;
    for (int i = 0; i < n; i++) err = std::fmax(err, std::fabs(ax[i] - 1.0));
    if (!(err < 1e-4)) {
        std::printf("FAILED: conjugate gradient residual %g after %d iterations\n", err, k);
        std::exit(1);
    }
    std::printf("conjugate gradient with a captured iteration: converged, |Ax - b| < 1e-4\n");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    SPARSE(cusparseDestroySpMat(A));
    SPARSE(cusparseDestroyDnVec(vx));
    SPARSE(cusparseDestroyDnVec(vp));
    SPARSE(cusparseDestroyDnVec(vax));
    SPARSE(cusparseDestroy(sp));
    BLAS(cublasDestroy(bl));
    CHECK(cudaFreeHost(r1));
}

// What CUDA cannot capture either: a dot product whose result goes to the host waits for the
// stream, so the call fails and the capture ends invalidated.
static void refusals() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t bl;
    BLAS(cublasCreate(&bl));
    BLAS(cublasSetStream(bl, s));
    float *d_v = device_copy(random_vector(16, 0));
    float result = 0;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cublasStatus_t st = cublasSdot(bl, 16, d_v, 1, d_v, 1, &result);
    std::printf("refusals: dot with a host result in a capture -> %s\n",
                st == CUBLAS_STATUS_SUCCESS ? "success" : "refused");
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    std::printf("refusals: the capture ends -> %s\n", cudaGetErrorName(e));
    // The handle still works outside the capture.
    BLAS(cublasSdot(bl, 16, d_v, 1, d_v, 1, &result));
    EXPECT(result > 0);
    std::printf("refusals: the handle still works\n");
    BLAS(cublasDestroy(bl));
}

// A captured GEMM whose handle is destroyed before the graph is launched.
static void hostile() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t bl;
    BLAS(cublasCreate(&bl));
    BLAS(cublasSetStream(bl, s));
    const int n = 4;
    float *d_a = device_copy(random_vector(n * n, 0)), *d_c = device_copy(std::vector<float>(n * n, 0));
    float one = 1, zero = 0;
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    BLAS(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, d_a, n, d_a, n, &zero, d_c, n));
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    BLAS(cublasDestroy(bl));
    cudaError_t launched = cudaGraphLaunch(exec, s);
    cudaError_t synced = cudaStreamSynchronize(s);
    std::printf("hostile: launch after the handle was destroyed -> %s\n",
                cudaGetErrorName(launched != cudaSuccess ? launched : synced));
    // The session goes on: a new handle's GEMM runs.
    cudaGetLastError();
    BLAS(cublasCreate(&bl));
    BLAS(cublasSetStream(bl, s));
    BLAS(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, d_a, n, d_a, n, &zero, d_c, n));
    CHECK(cudaStreamSynchronize(s));
    std::printf("hostile: a new handle works\n");
    BLAS(cublasDestroy(bl));
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!std::strcmp(mode, "refusals")) {
        refusals();
        std::printf("done\n");
        return 0;
    }
    if (!std::strcmp(mode, "hostile")) {
        hostile();
        std::printf("done\n");
        return 0;
    }
    Mixed m;
    m.setup();
    m.record();
    if (!std::strcmp(mode, "checkpoint")) {
        std::printf("graph-libs ready\n");
        std::fflush(stdout);
        sleep(3);
        m.run(2);
        std::printf("after the restore: the graph's library calls ran\n");
        return 0;
    }
    m.check_nodes();
    m.run(3);
    conjugate_gradient();
    std::printf("done\n");
    return 0;
}
