// The API server's cost per cuBLASLt call, PyTorch-style: each matmul sets its cuBLAS handle's
// stream and workspace, makes its descriptors (a matmul descriptor with TRANSA, TRANSB and the
// epilogue set, three layouts, a preference with its workspace and alignments set), asks for a
// heuristic, runs, and destroys them (as at::cuda::blas's gemm_and_bias does); then empty
// launches. Tiny matrices (8 x 8), so that on emu the calls, not the arithmetic, dominate.
// Run through Phos with PHOS_PROFILE=1 in the server's environment: its table at the session's
// end gives the server's microseconds per call of each function, e.g. on emu:
//   PHOS_PROFILE=1 phosctl run --backend emu --transport shm -- ./lt_rate 2000
// Build: nvcc -O2 -cudart shared -arch=sm_70 -o lt_rate tests/bench/lt_rate.cu -lcublasLt -lcublas
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#define OK(call)                                                                 \
    do {                                                                         \
        int s_ = (int)(call);                                                    \
        if (s_ != 0) {                                                           \
            std::printf("FAILED: %s -> %d at line %d\n", #call, s_, __LINE__);   \
            std::exit(1);                                                        \
        }                                                                        \
    } while (0)

__global__ void empty() {}

static double now() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? std::atoi(argv[1]) : 1000;
    const int n = 8;
    const size_t ws_bytes = 1 << 20;
    float *a, *b, *c, *bias;
    void *ws;
    OK(cudaMalloc(&a, n * n * 4));
    OK(cudaMalloc(&b, n * n * 4));
    OK(cudaMalloc(&c, n * n * 4));
    OK(cudaMalloc(&bias, n * 4));
    OK(cudaMalloc(&ws, ws_bytes));
    OK(cudaMemset(a, 0, n * n * 4));
    OK(cudaMemset(b, 0, n * n * 4));
    OK(cudaMemset(bias, 0, n * 4));
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t h;
    OK(cublasCreate(&h));
    cublasLtHandle_t lt = reinterpret_cast<cublasLtHandle_t>(h);
    const float one = 1.0f, zero = 0.0f;
    double t0 = now();
    for (int i = 0; i < iters; i++) {
        OK(cublasSetStream(h, s));
        OK(cublasSetWorkspace(h, ws, ws_bytes));
        cublasLtMatmulDesc_t desc;
        OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        cublasLtMatrixLayout_t la, lb, lc;
        OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, n, n));
        OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, n, n, n));
        OK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, n, n));
        cublasLtMatmulPreference_t pref;
        OK(cublasLtMatmulPreferenceCreate(&pref));
        OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof(ws_bytes)));
        uint32_t align = 16;
        OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, 4));
        OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, 4));
        OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, 4));
        OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, 4));
        cublasLtMatmulHeuristicResult_t heuristic = {};
        int found = 0;
        OK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heuristic, &found));
        if (found == 0) {
            std::printf("FAILED: no algorithm\n");
            return 1;
        }
        OK(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, c, lc, c, lc, &heuristic.algo, ws, ws_bytes, s));
        OK(cublasLtMatmulPreferenceDestroy(pref));
        OK(cublasLtMatrixLayoutDestroy(lc));
        OK(cublasLtMatrixLayoutDestroy(lb));
        OK(cublasLtMatrixLayoutDestroy(la));
        OK(cublasLtMatmulDescDestroy(desc));
    }
    double t1 = now();
    OK(cudaStreamSynchronize(s));
    double t2 = now();
    std::printf("lt matmul, PyTorch-style: %.2f us/iter enqueue, %.2f us/iter with sync\n", (t1 - t0) / iters,
                (t2 - t0) / iters);
    t0 = now();
    for (int i = 0; i < iters; i++) empty<<<1, 32, 0, s>>>();
    t1 = now();
    OK(cudaStreamSynchronize(s));
    t2 = now();
    std::printf("empty launch: %.2f us/call enqueue, %.2f us/call with sync\n", (t1 - t0) / iters, (t2 - t0) / iters);
    OK(cublasDestroy(h));
    return 0;
}
