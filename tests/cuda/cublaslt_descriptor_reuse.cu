// cuBLASLt descriptors made, set, used and destroyed around every matmul, as PyTorch makes
// them: many cycles of matmul descriptor, layouts and preference creation, attribute settings
// (epilogues with and without a bias, transposes, row-major layouts, strided batches), the
// heuristic query (the same questions again and again) and the matmul, each result checked on
// the host against a reference. A descriptor made after one with other attributes was
// destroyed starts from cuBLASLt's defaults: after a bias epilogue, a transposed A and a
// row-major batched layout, a new descriptor reads back the defaults and computes a plain GEMM.
// Setting what is set already, and setting an attribute back, change nothing else. What is
// printed is the same wherever the program runs. The first argument is the number of cycles
// (default 48, at least 6); with `checkpoint` it uses and destroys descriptors with a bias epilogue, makes
// new ones, says so, waits three seconds (a checkpoint and restore happen then) and checks
// afterwards that the new ones are fresh.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <cublasLt.h>

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
    for (size_t i = 0; i < n; ++i) v[i] = float((int(i) * 5 + seed * 3) % 7 - 3);
    return v;
}

// One matmul: A (m x k, or k x m when transposed), B (k x n, column or row order), C and D
// m x n column-major, `batch` matrices each.
struct Problem {
    const char *name;
    int m, n, k, batch;
    bool trans_a, b_rows;
    cublasLtEpilogue_t epilogue;
    float alpha, beta;
};

static const Problem PROBLEMS[] = {
    {"plain", 16, 12, 8, 1, false, false, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f},
    {"bias", 16, 12, 8, 1, false, false, CUBLASLT_EPILOGUE_BIAS, 1.0f, 1.0f},
    {"relu, A^T", 8, 8, 12, 1, true, false, CUBLASLT_EPILOGUE_RELU, 2.0f, 0.0f},
    {"relu, B row-major", 12, 4, 8, 1, false, true, CUBLASLT_EPILOGUE_RELU, 1.0f, -1.0f},
    {"strided batch", 8, 4, 4, 3, false, false, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 2.0f},
    {"strided batch, bias, A^T", 4, 8, 4, 2, true, false, CUBLASLT_EPILOGUE_BIAS, -1.0f, 0.0f},
};
static const int N_PROBLEMS = sizeof(PROBLEMS) / sizeof(PROBLEMS[0]);

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

static bool has_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
}

// D of `p` on the host.
static std::vector<float> reference(const Problem &p, const std::vector<float> &a, const std::vector<float> &bm,
                                    const std::vector<float> &c, const std::vector<float> &bias) {
    std::vector<float> d(size_t(p.m) * p.n * p.batch);
    size_t a_one = size_t(p.m) * p.k, b_one = size_t(p.k) * p.n;
    for (int b = 0; b < p.batch; ++b)
        for (int j = 0; j < p.n; ++j)
            for (int i = 0; i < p.m; ++i) {
                float acc = 0.0f;
                for (int l = 0; l < p.k; ++l) {
                    float x = p.trans_a ? a[b * a_one + l + size_t(i) * p.k] : a[b * a_one + i + size_t(l) * p.m];
                    float y = p.b_rows ? bm[b * b_one + size_t(l) * p.n + j] : bm[b * b_one + l + size_t(j) * p.k];
                    acc += x * y;
                }
                size_t at = size_t(b) * p.m * p.n + i + size_t(j) * p.m;
                float v = p.alpha * acc + p.beta * c[at] + (has_bias(p.epilogue) ? bias[i] : 0.0f);
                if (p.epilogue == CUBLASLT_EPILOGUE_RELU || p.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS)
                    v = v > 0.0f ? v : 0.0f;
                d[at] = v;
            }
    return d;
}

// The descriptors of one matmul, made and set for `p`: only what differs from the defaults is
// set, as a framework does.
struct Descriptors {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
};

static Descriptors make(const Problem &p, float *dbias, size_t workspace_size) {
    Descriptors d;
    LT(cublasLtMatmulDescCreate(&d.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (p.trans_a) {
        cublasOperation_t t = CUBLAS_OP_T;
        LT(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    }
    if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        LT(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)));
    }
    if (has_bias(p.epilogue)) {
        LT(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof(dbias)));
    }
    d.la = p.trans_a ? layout(p.k, p.m, p.k, p.batch, int64_t(p.m) * p.k, false)
                     : layout(p.m, p.k, p.m, p.batch, int64_t(p.m) * p.k, false);
    d.lb = p.b_rows ? layout(p.k, p.n, p.n, p.batch, int64_t(p.k) * p.n, true)
                    : layout(p.k, p.n, p.k, p.batch, int64_t(p.k) * p.n, false);
    d.lc = layout(p.m, p.n, p.m, p.batch, int64_t(p.m) * p.n, false);
    LT(cublasLtMatmulPreferenceCreate(&d.pref));
    LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_size,
                                            sizeof(workspace_size)));
    return d;
}

static void destroy(const Descriptors &d) {
    LT(cublasLtMatmulPreferenceDestroy(d.pref));
    LT(cublasLtMatrixLayoutDestroy(d.la));
    LT(cublasLtMatrixLayoutDestroy(d.lb));
    LT(cublasLtMatrixLayoutDestroy(d.lc));
    LT(cublasLtMatmulDescDestroy(d.desc));
}

// Device memory of one problem, with its host copies.
struct Operands {
    std::vector<float> a, b, c, bias;
    float *da, *db, *dc, *dd, *dbias;
};

static Operands operands(const Problem &p, int seed) {
    Operands o;
    size_t c_n = size_t(p.m) * p.n * p.batch;
    o.a = pattern(size_t(p.m) * p.k * p.batch, seed);
    o.b = pattern(size_t(p.k) * p.n * p.batch, seed + 1);
    o.c = pattern(c_n, seed + 2);
    o.bias = pattern(p.m, seed + 3);
    o.da = to_device(o.a);
    o.db = to_device(o.b);
    o.dc = to_device(o.c);
    o.dd = to_device(std::vector<float>(c_n, 0.0f));
    o.dbias = to_device(o.bias);
    return o;
}

static void release(const Operands &o) {
    for (float *x : {o.da, o.db, o.dc, o.dd, o.dbias}) CHECK(cudaFree(x));
}

// Run `p` with `d` and check D against the host.
static bool run(cublasLtHandle_t lt, const Problem &p, const Descriptors &d, const Operands &o, void *workspace,
                size_t workspace_size, int requested) {
    cublasLtMatmulHeuristicResult_t result[4];
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(lt, d.desc, d.la, d.lb, d.lc, d.lc, d.pref, requested, result, &found));
    EXPECT(found >= 1 && found <= requested && result[0].state == CUBLAS_STATUS_SUCCESS &&
           result[0].workspaceSize <= workspace_size);
    LT(cublasLtMatmul(lt, d.desc, &p.alpha, o.da, d.la, o.db, d.lb, &p.beta, o.dc, d.lc, o.dd, d.lc, &result[0].algo,
                      workspace, workspace_size, 0));
    std::vector<float> got = from_device(o.dd, size_t(p.m) * p.n * p.batch);
    std::vector<float> want = reference(p, o.a, o.b, o.c, o.bias);
    for (size_t i = 0; i < got.size(); ++i)
        if (std::fabs(got[i] - want[i]) > 1e-3f * (1.0f + std::fabs(want[i]))) return false;
    return true;
}

// The attributes a descriptor and layout made with nothing set read back: cuBLASLt's defaults.
static bool reads_back_defaults(const Descriptors &d) {
    cublasLtEpilogue_t epilogue;
    cublasOperation_t transa;
    cublasLtOrder_t order;
    int32_t batch = 0;
    uint64_t workspace = 1;
    size_t written = 0;
    bool fresh = true;
    LT(cublasLtMatmulDescGetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), &written));
    LT(cublasLtMatmulDescGetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa), &written));
    for (cublasLtMatrixLayout_t l : {d.la, d.lb, d.lc}) {
        LT(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order), &written));
        LT(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch), &written));
        fresh = fresh && order == CUBLASLT_ORDER_COL && batch == 1;
    }
    LT(cublasLtMatmulPreferenceGetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                            sizeof(workspace), &written));
    return fresh && epilogue == CUBLASLT_EPILOGUE_DEFAULT && transa == CUBLAS_OP_N && workspace == 0;
}

// Descriptors with a bias epilogue, a transposed A, batched layouts and a workspace are used
// and destroyed, and a row-major batched layout made and destroyed.
static void used_and_destroyed(cublasLtHandle_t lt, void *workspace, size_t workspace_size) {
    Problem busy{"busy", 4, 4, 4, 2, true, false, CUBLASLT_EPILOGUE_RELU_BIAS, 1.0f, 1.0f};
    Operands o = operands(busy, 11);
    Descriptors d = make(busy, o.dbias, workspace_size);
    EXPECT(run(lt, busy, d, o, workspace, workspace_size, 1));
    destroy(d);
    release(o);
    LT(cublasLtMatrixLayoutDestroy(layout(4, 4, 4, 3, 16, true)));
}

static Descriptors make_plain(const Problem &p) {
    Descriptors d;
    LT(cublasLtMatmulDescCreate(&d.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatrixLayoutCreate(&d.la, CUDA_R_32F, p.m, p.k, p.m));
    LT(cublasLtMatrixLayoutCreate(&d.lb, CUDA_R_32F, p.k, p.n, p.k));
    LT(cublasLtMatrixLayoutCreate(&d.lc, CUDA_R_32F, p.m, p.n, p.m));
    LT(cublasLtMatmulPreferenceCreate(&d.pref));
    return d;
}

int main(int argc, char **argv) {
    bool checkpoint = argc > 1 && std::strcmp(argv[1], "checkpoint") == 0;
    int cycles = argc > 1 && !checkpoint ? std::atoi(argv[1]) : 48;
    EXPECT(cycles >= N_PROBLEMS);
    cublasLtHandle_t lt;
    LT(cublasLtCreate(&lt));
    size_t workspace_size = 1 << 20;
    void *workspace;
    CHECK(cudaMalloc(&workspace, workspace_size));
    Problem plain{"plain", 8, 4, 6, 1, false, false, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f};

    if (checkpoint) {
        // Descriptors with a bias epilogue used and destroyed, then new ones with nothing set,
        // made before the checkpoint and used after the restore.
        used_and_destroyed(lt, workspace, workspace_size);
        Descriptors d = make_plain(plain);
        Operands o = operands(plain, 21);
        std::printf("lt-reuse ready\n");
        std::fflush(stdout);
        sleep(3);
        EXPECT(reads_back_defaults(d));
        LT(cublasLtMatmul(lt, d.desc, &plain.alpha, o.da, d.la, o.db, d.lb, &plain.beta, o.dc, d.lc, o.dd, d.lc,
                          nullptr, nullptr, 0, 0));
        std::vector<float> got = from_device(o.dd, 32), want = reference(plain, o.a, o.b, o.c, o.bias);
        EXPECT(got == want);
        std::printf("after the restore: the new descriptors have the defaults, a plain GEMM matches the host\n");
        destroy(d);
        release(o);
        LT(cublasLtDestroy(lt));
        CHECK(cudaFree(workspace));
        return 0;
    }

    // Cycles of make, set, ask, multiply, check, destroy.
    int matched[N_PROBLEMS] = {0}, ran[N_PROBLEMS] = {0};
    for (int i = 0; i < cycles; ++i) {
        const Problem &p = PROBLEMS[i % N_PROBLEMS];
        Operands o = operands(p, i % 5);
        Descriptors d = make(p, o.dbias, workspace_size);
        ran[i % N_PROBLEMS] += 1;
        matched[i % N_PROBLEMS] += run(lt, p, d, o, workspace, workspace_size, i % 2 ? 4 : 1);
        destroy(d);
        release(o);
    }
    for (int i = 0; i < N_PROBLEMS; ++i) {
        if (matched[i] == ran[i])
            std::printf("%s: %dx%dx%d, batch %d: every cycle matches the host\n", PROBLEMS[i].name, PROBLEMS[i].m,
                        PROBLEMS[i].n, PROBLEMS[i].k, PROBLEMS[i].batch);
        else
            std::printf("%s: WRONG in %d of %d cycles\n", PROBLEMS[i].name, ran[i] - matched[i], ran[i]);
    }

    // A descriptor made after one with other attributes starts from the defaults.
    bool fresh = true;
    for (int round = 0; round < 3; ++round) {
        used_and_destroyed(lt, workspace, workspace_size);
        Descriptors d = make_plain(plain);
        fresh = fresh && reads_back_defaults(d);
        Operands o = operands(plain, round);
        fresh = fresh && run(lt, plain, d, o, workspace, workspace_size, 1);
        destroy(d);
        release(o);
    }
    std::printf("after a bias epilogue, a transposed A and row-major batches: defaults and a plain GEMM %s\n",
                fresh ? "match the host" : "WRONG");

    // Setting what is set already, and an attribute set and set back.
    Operands o = operands(plain, 7);
    Descriptors d = make_plain(plain);
    cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU, none = CUBLASLT_EPILOGUE_DEFAULT;
    for (int i = 0; i < 3; ++i)
        LT(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof(relu)));
    Problem relu_plain = plain;
    relu_plain.epilogue = CUBLASLT_EPILOGUE_RELU;
    bool again = run(lt, relu_plain, d, o, workspace, workspace_size, 1);
    LT(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof(none)));
    again = again && run(lt, plain, d, o, workspace, workspace_size, 1);
    LT(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof(relu)));
    again = again && run(lt, relu_plain, d, o, workspace, workspace_size, 1);
    cublasLtEpilogue_t read = none;
    size_t written = 0;
    LT(cublasLtMatmulDescGetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &read, sizeof(read), &written));
    again = again && read == CUBLASLT_EPILOGUE_RELU && written == sizeof(read);
    std::printf("an epilogue set three times, set back and set again: %s\n", again ? "matches the host" : "WRONG");
    destroy(d);
    release(o);

    LT(cublasLtDestroy(lt));
    CHECK(cudaFree(workspace));
    std::printf("done\n");
    return 0;
}
