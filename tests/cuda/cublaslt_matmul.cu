// cuBLASLt through Phos: fp32 matmuls with descriptors and layouts (a plain D = alpha AB +
// beta C, a bias with RELU, a bias with GELU, a transposed A with a row-major B, a strided
// batch, device-side alpha and beta, and GELU_AUX keeping the activation's input), the
// heuristic query, attributes read back, and cublasLtMatrixTransform. Each result is checked
// on the host against a reference; what is printed is the same wherever the program runs.
// With `hostile` it also makes the calls a careless or hostile program makes and prints the
// status each gets; with `checkpoint` it sets up a handle and descriptors with a bias
// epilogue, says so, waits three seconds (a checkpoint and restore happen then) and runs the
// matmul with them afterwards.
#include <cmath>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "check.h"

#define LT(call)                                                                             \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, cublasLtGetStatusName(s_),     \
                        __FILE__, __LINE__);                                                 \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static float *to_device(const std::vector<float> &v) {
    float *d = nullptr;
    CHECK(cudaMalloc(&d, v.size() * sizeof(float)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> from_device(const float *d, size_t n) {
    std::vector<float> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

// Small integers: products and sums are exact in fp32.
static std::vector<float> pattern(size_t n, int seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float((int(i) * 7 + seed * 3) % 9 - 4);
    return v;
}

static float gelu(float x) {
    return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// One matmul problem: A (m x k, or k x m when transposed), B (k x n, column or row order),
// C and D m x n column-major, `batch` matrices each.
struct Problem {
    int m, n, k, batch;
    bool trans_a, b_rows;
    cublasLtEpilogue_t epilogue;
    float alpha, beta;
};

static cublasLtMatrixLayout_t layout(int rows, int cols, int ld, int batch, long long stride, bool row_major) {
    cublasLtMatrixLayout_t l;
    LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, rows, cols, ld));
    if (row_major) {
        cublasLtOrder_t order = CUBLASLT_ORDER_ROW;
        LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
    }
    if (batch > 1) {
        LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
        LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return l;
}

// Element (i, j) of op(A) and of B as stored.
static float a_at(const Problem &p, const std::vector<float> &a, int b, int i, int l) {
    size_t one = size_t(p.m) * p.k;
    return p.trans_a ? a[b * one + l + size_t(i) * p.k] : a[b * one + i + size_t(l) * p.m];
}
static float b_at(const Problem &p, const std::vector<float> &bm, int b, int l, int j) {
    size_t one = size_t(p.k) * p.n;
    return p.b_rows ? bm[b * one + size_t(l) * p.n + j] : bm[b * one + l + size_t(j) * p.k];
}

// Run `p` through cublasLtMatmul with a heuristic's algorithm and check D (and the auxiliary
// output of GELU_AUX) against the host; true when every element is within tolerance.
static bool run(cublasLtHandle_t lt, const Problem &p, bool device_scalars, const char *what) {
    size_t a_n = size_t(p.m) * p.k * p.batch, b_n = size_t(p.k) * p.n * p.batch, c_n = size_t(p.m) * p.n * p.batch;
    std::vector<float> a = pattern(a_n, 1), bm = pattern(b_n, 2), c = pattern(c_n, 3), bias = pattern(p.m, 4);
    float *da = to_device(a), *db = to_device(bm), *dc = to_device(c), *dbias = to_device(bias);
    float *dd = to_device(std::vector<float>(c_n, 0.0f)), *daux = to_device(std::vector<float>(c_n, 0.0f));

    cublasLtMatmulDesc_t desc;
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)));
    bool has_bias = p.epilogue == CUBLASLT_EPILOGUE_BIAS || p.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
                    p.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS || p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    bool has_aux = p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (has_bias) {
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof(dbias)));
    }
    if (has_aux) {
        int64_t ld = p.m, stride = int64_t(p.m) * p.n;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &daux, sizeof(daux)));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &stride, sizeof(stride)));
    }
    float *dalpha = nullptr, *dbeta = nullptr;
    if (device_scalars) {
        cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)));
        dalpha = to_device({p.alpha});
        dbeta = to_device({p.beta});
    }
    cublasLtMatrixLayout_t la = p.trans_a ? layout(p.k, p.m, p.k, p.batch, int64_t(p.m) * p.k, false)
                                          : layout(p.m, p.k, p.m, p.batch, int64_t(p.m) * p.k, false);
    cublasLtMatrixLayout_t lb = p.b_rows ? layout(p.k, p.n, p.n, p.batch, int64_t(p.k) * p.n, true)
                                         : layout(p.k, p.n, p.k, p.batch, int64_t(p.k) * p.n, false);
    cublasLtMatrixLayout_t lc = layout(p.m, p.n, p.m, p.batch, int64_t(p.m) * p.n, false);

    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    size_t workspace_size = 1 << 20;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_size,
                                            sizeof(workspace_size)));
    void *workspace;
    CHECK(cudaMalloc(&workspace, workspace_size));
    cublasLtMatmulHeuristicResult_t result[4];
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 4, result, &found));
    EXPECT(found >= 1 && result[0].state == CUBLAS_STATUS_SUCCESS && result[0].workspaceSize <= workspace_size);

    const void *alpha = device_scalars ? static_cast<const void *>(dalpha) : &p.alpha;
    const void *beta = device_scalars ? static_cast<const void *>(dbeta) : &p.beta;
    LT(cublasLtMatmul(lt, desc, alpha, da, la, db, lb, beta, dc, lc, dd, lc, &result[0].algo, workspace,
                      workspace_size, 0));
    std::vector<float> d = from_device(dd, c_n), aux = from_device(daux, c_n);

    bool relu = p.epilogue == CUBLASLT_EPILOGUE_RELU || p.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
    bool gelu_on = p.epilogue == CUBLASLT_EPILOGUE_GELU || p.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS || has_aux;
    bool ok = true;
    for (int b = 0; b < p.batch; ++b) {
        for (int j = 0; j < p.n; ++j) {
            for (int i = 0; i < p.m; ++i) {
                float acc = 0.0f;
                for (int l = 0; l < p.k; ++l) acc += a_at(p, a, b, i, l) * b_at(p, bm, b, l, j);
                size_t at = size_t(b) * p.m * p.n + i + size_t(j) * p.m;
                float v = p.alpha * acc + p.beta * c[at] + (has_bias ? bias[i] : 0.0f);
                if (has_aux && std::fabs(aux[at] - v) > 1e-3f * (1.0f + std::fabs(v))) ok = false;
                if (relu) v = v > 0.0f ? v : 0.0f;
                if (gelu_on) v = gelu(v);
                if (std::fabs(d[at] - v) > 1e-3f * (1.0f + std::fabs(v))) ok = false;
            }
        }
    }
    std::printf("%s: %dx%dx%d, batch %d: %s\n", what, p.m, p.n, p.k, p.batch, ok ? "matches the host" : "WRONG");

    LT(cublasLtMatmulPreferenceDestroy(pref));
    LT(cublasLtMatrixLayoutDestroy(la));
    LT(cublasLtMatrixLayoutDestroy(lb));
    LT(cublasLtMatrixLayoutDestroy(lc));
    LT(cublasLtMatmulDescDestroy(desc));
    for (float *x : {da, db, dc, dbias, dd, daux, dalpha, dbeta}) CHECK(cudaFree(x));
    CHECK(cudaFree(workspace));
    return ok;
}

// C = alpha A^T + beta B, with A 3x2 transposed into 2x3.
static void transform(cublasLtHandle_t lt) {
    std::vector<float> a = pattern(6, 5), b = pattern(6, 6);
    float *da = to_device(a), *db = to_device(b), *dc = to_device(std::vector<float>(6, 0.0f));
    cublasLtMatrixTransformDesc_t t;
    LT(cublasLtMatrixTransformDescCreate(&t, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T;
    LT(cublasLtMatrixTransformDescSetAttribute(t, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, &ta, sizeof(ta)));
    cublasLtMatrixLayout_t la = layout(3, 2, 3, 1, 0, false), lc = layout(2, 3, 2, 1, 0, false);
    float alpha = 2.0f, beta = -1.0f;
    LT(cublasLtMatrixTransform(lt, t, &alpha, da, la, &beta, db, lc, dc, lc, 0));
    std::vector<float> c = from_device(dc, 6);
    bool ok = true;
    for (int j = 0; j < 3; ++j)
        for (int i = 0; i < 2; ++i) ok = ok && c[i + j * 2] == alpha * a[j + i * 3] + beta * b[i + j * 2];
    std::printf("transform: C = 2 A^T - B %s\n", ok ? "matches the host" : "WRONG");
    LT(cublasLtMatrixLayoutDestroy(la));
    LT(cublasLtMatrixLayoutDestroy(lc));
    LT(cublasLtMatrixTransformDescDestroy(t));
    for (float *x : {da, db, dc}) CHECK(cudaFree(x));
}

int main(int argc, char **argv) {
    bool hostile = argc > 1 && std::strcmp(argv[1], "hostile") == 0;
    bool checkpoint = argc > 1 && std::strcmp(argv[1], "checkpoint") == 0;
    cublasLtHandle_t lt;
    LT(cublasLtCreate(&lt));

    if (checkpoint) {
        // Descriptors with attributes and a bias in device memory, made before the checkpoint
        // and used after the restore.
        Problem p{8, 4, 6, 1, false, false, CUBLASLT_EPILOGUE_RELU_BIAS, 1.0f, 0.0f};
        std::vector<float> a = pattern(48, 1), b = pattern(24, 2), bias = pattern(8, 4);
        float *da = to_device(a), *db = to_device(b), *dbias = to_device(bias);
        float *dd = to_device(std::vector<float>(32, 0.0f));
        cublasLtMatmulDesc_t desc;
        LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof(dbias)));
        cublasLtMatrixLayout_t la = layout(8, 6, 8, 1, 0, false), lb = layout(6, 4, 6, 1, 0, false);
        cublasLtMatrixLayout_t ld = layout(8, 4, 8, 1, 0, false);
        std::printf("cublaslt ready\n");
        std::fflush(stdout);
        sleep(3);
        cublasLtEpilogue_t epilogue;
        size_t written = 0;
        LT(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), &written));
        EXPECT(epilogue == CUBLASLT_EPILOGUE_RELU_BIAS && written == sizeof(epilogue));
        LT(cublasLtMatmul(lt, desc, &p.alpha, da, la, db, lb, &p.beta, dd, ld, dd, ld, nullptr, nullptr, 0, 0));
        std::vector<float> d = from_device(dd, 32);
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 8; ++i) {
                float acc = bias[i];
                for (int l = 0; l < 6; ++l) acc += a[i + l * 8] * b[l + j * 6];
                EXPECT(d[i + j * 8] == (acc > 0.0f ? acc : 0.0f));
            }
        std::printf("after the restore: the descriptors kept their epilogue and bias\n");
        return 0;
    }

    std::printf("version %s, cudart %s\n", cublasLtGetVersion() >= 110000 ? "11 or later" : "too old",
                cublasLtGetCudartVersion() >= 11000 ? "11 or later" : "too old");
    std::printf("status name: %s\n", cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE));

    bool ok = true;
    ok &= run(lt, {16, 12, 8, 1, false, false, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.5f}, false, "plain");
    ok &= run(lt, {16, 12, 8, 1, false, false, CUBLASLT_EPILOGUE_RELU_BIAS, 1.0f, 0.0f}, false, "bias+relu");
    ok &= run(lt, {16, 12, 8, 1, false, false, CUBLASLT_EPILOGUE_GELU_BIAS, 0.25f, 0.0f}, false, "bias+gelu");
    ok &= run(lt, {16, 12, 8, 1, true, true, CUBLASLT_EPILOGUE_RELU, 1.0f, 1.0f}, false, "A^T, B row-major, relu");
    ok &= run(lt, {8, 8, 4, 3, false, false, CUBLASLT_EPILOGUE_BIAS, 2.0f, -1.0f}, false, "strided batch, bias");
    ok &= run(lt, {8, 4, 4, 1, false, false, CUBLASLT_EPILOGUE_DEFAULT, 3.0f, 2.0f}, true, "device alpha and beta");
    ok &= run(lt, {8, 4, 4, 2, false, false, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 0.5f, 0.0f}, false, "gelu aux+bias");
    // A cuBLAS handle cast to a cuBLASLt handle, as NVIDIA's documentation allows and PyTorch
    // does for the biased matmuls of its linear layers.
    {
        cublasHandle_t blas;
        EXPECT(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
        ok &= run(reinterpret_cast<cublasLtHandle_t>(blas),
                  {16, 12, 8, 1, false, false, CUBLASLT_EPILOGUE_RELU_BIAS, 1.0f, 0.0f}, false,
                  "bias+relu on a cuBLAS handle");
        EXPECT(cublasDestroy(blas) == CUBLAS_STATUS_SUCCESS);
    }

    // Attributes read back, and the size query.
    {
        cublasLtMatmulDesc_t desc;
        LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t tb = CUBLAS_OP_T, got = CUBLAS_OP_N;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        size_t written = 0;
        LT(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &got, sizeof(got), &written));
        LT(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0, &written));
        std::printf("attributes: TRANSB read back %s, BIAS_POINTER is %zu bytes\n", got == CUBLAS_OP_T ? "T" : "wrong",
                    written);
        LT(cublasLtMatmulDescDestroy(desc));
    }
    transform(lt);

    if (hostile) {
        float *small;
        CHECK(cudaMalloc(&small, 16 * sizeof(float)));
        cublasLtMatmulDesc_t desc;
        LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasLtMatrixLayout_t big = layout(64, 64, 64, 1, 0, false), fits = layout(4, 4, 4, 1, 0, false);
        float one = 1.0f, zero = 0.0f;
        // What only the server can check (the session's memory, the layouts against each
        // other) may fail a matmul after it returned (it is sent without waiting): the failure
        // comes back from the next synchronous call on the handle, as CUDA reports an
        // asynchronous error.
        cublasLtMatmulPreference_t pref;
        LT(cublasLtMatmulPreferenceCreate(&pref));
        // Each time another question (the number of algorithms asked for), so that it goes to
        // the server: Phos's guest answers a heuristic query it has asked before itself.
        int asked = 0;
        auto reported = [&](cublasStatus_t s) {
            cublasLtMatmulHeuristicResult_t result[8];
            int found = 0;
            asked = asked % 8 + 1;
            return s != CUBLAS_STATUS_SUCCESS
                       ? s
                       : cublasLtMatmulAlgoGetHeuristic(lt, desc, fits, fits, fits, fits, pref, asked, result, &found);
        };
        // A layout larger than the memory behind it.
        std::printf("hostile: matrix past its allocation -> %s\n",
                    cublasLtGetStatusName(reported(cublasLtMatmul(lt, desc, &one, small, big, small, big, &zero, small,
                                                                  big, small, big, nullptr, nullptr, 0, 0))));
        // A bias pointer that is not device memory of the program's.
        cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
        void *bogus = reinterpret_cast<void *>(0x1000);
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bogus, sizeof(bogus)));
        std::printf("hostile: bias pointer not the program's -> %s\n",
                    cublasLtGetStatusName(reported(cublasLtMatmul(lt, desc, &one, small, fits, small, fits, &zero,
                                                                  small, fits, small, fits, nullptr, nullptr, 0, 0))));
        // A workspace said to be larger than its allocation.
        e = CUBLASLT_EPILOGUE_DEFAULT;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
        std::printf("hostile: workspace past its allocation -> %s\n",
                    cublasLtGetStatusName(reported(cublasLtMatmul(lt, desc, &one, small, fits, small, fits, &zero,
                                                                  small, fits, small, fits, nullptr, small, 1 << 20,
                                                                  0))));
        // An attribute value of the wrong size, and layouts that do not agree.
        int32_t short_epilogue = 1;
        std::printf("hostile: attribute of the wrong size -> %s\n",
                    cublasLtGetStatusName(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                                         &short_epilogue, sizeof(short_epilogue))));
        cublasLtMatrixLayout_t other = layout(3, 4, 3, 1, 0, false);
        std::printf("hostile: layouts that do not agree -> %s\n",
                    cublasLtGetStatusName(reported(cublasLtMatmul(lt, desc, &one, small, other, small, fits, &zero,
                                                                  small, fits, small, fits, nullptr, nullptr, 0, 0))));
        // A made-up handle and a destroyed descriptor.
        std::printf("hostile: made-up handle -> %s\n",
                    cublasLtGetStatusName(cublasLtMatmul(reinterpret_cast<cublasLtHandle_t>(0x5150), desc, &one, small,
                                                         fits, small, fits, &zero, small, fits, small, fits, nullptr,
                                                         nullptr, 0, 0)));
        cublasLtMatmulDesc_t gone;
        LT(cublasLtMatmulDescCreate(&gone, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        LT(cublasLtMatmulDescDestroy(gone));
        std::printf("hostile: destroyed descriptor -> %s\n",
                    cublasLtGetStatusName(cublasLtMatmul(lt, gone, &one, small, fits, small, fits, &zero, small, fits,
                                                         small, fits, nullptr, nullptr, 0, 0)));
        // The handle and descriptors still work.
        LT(cublasLtMatmul(lt, desc, &one, small, fits, small, fits, &zero, small, fits, small, fits, nullptr, nullptr,
                          0, 0));
        std::printf("hostile: the handle still works\n");
        LT(cublasLtMatmulPreferenceDestroy(pref));
        LT(cublasLtMatrixLayoutDestroy(big));
        LT(cublasLtMatrixLayoutDestroy(fits));
        LT(cublasLtMatrixLayoutDestroy(other));
        LT(cublasLtMatmulDescDestroy(desc));
        CHECK(cudaFree(small));
    }

    LT(cublasLtDestroy(lt));
    std::printf(ok ? "done\n" : "FAILED\n");
    return ok ? 0 : 1;
}
