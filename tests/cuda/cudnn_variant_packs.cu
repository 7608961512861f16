// Convolutions through cuDNN's backend (graph) API as cudnn-frontend runs them for PyTorch: one
// execution plan, made once, executed many times, each time with a variant pack made for it
// (created, its unique ids, data pointers and workspace set, finalized, executed, destroyed).
// Every execution writes its own output buffer (the packs' pointers differ, and every other
// pack lists its tensors in another order); all outputs are checked against a convolution on
// the host. Then what misuse gets, as cuDNN 9.14 answers it: a variant pack attribute of the
// wrong type is not supported, and a pack that was never finalized still executes.
//
// Arguments: the number of executions (default 8), `hostile` (what careless or hostile calls on
// variant packs get, with the statuses printed; run through Phos only), or `checkpoint` (halfway
// through, after an execution whose pack pointed into memory freed since, prints "cudnn ready"
// and waits three seconds, in which a checkpoint and restore may happen, then goes on).
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#else
#include "cudnn_min.h"
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <thread>
#include <vector>

#include "check.h"

// cuDNN's numbers (cudnn_graph.h), as the program's own constants.
enum : int {
    CONVOLUTION_DESCRIPTOR = 1, ENGINE_DESCRIPTOR = 2, ENGINECFG_DESCRIPTOR = 3, ENGINEHEUR_DESCRIPTOR = 4,
    EXECUTION_PLAN_DESCRIPTOR = 5, OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10, OPERATIONGRAPH_DESCRIPTOR = 15,
    VARIANT_PACK_DESCRIPTOR = 16, TENSOR_DESCRIPTOR = 17,
};
enum : int {
    CONV_COMP_TYPE = 100, CONV_MODE = 101, CONV_DILATIONS = 102, CONV_FILTER_STRIDES = 103, CONV_POST_PADDINGS = 104,
    CONV_PRE_PADDINGS = 105, CONV_SPATIAL_DIMS = 106, HEUR_MODE = 200, HEUR_GRAPH = 201, HEUR_RESULTS = 202,
    CFG_ENGINE = 300, PLAN_HANDLE = 400, PLAN_CONFIG = 401, PLAN_WORKSPACE_SIZE = 402, FWD_ALPHA = 700,
    FWD_BETA = 701, FWD_CONV = 702, FWD_W = 703, FWD_X = 704, FWD_Y = 705, GRAPH_HANDLE = 800, GRAPH_OPS = 801,
    TENSOR_ALIGNMENT = 900, TENSOR_DATA_TYPE = 901, TENSOR_DIMS = 902, TENSOR_STRIDES = 903, TENSOR_UID = 906,
    PACK_UIDS = 1000, PACK_POINTERS = 1001, PACK_WORKSPACE = 1003, ENGINE_GRAPH = 1300, ENGINE_INDEX = 1301,
};
const int DATA_FLOAT = 0, CROSS_CORRELATION = 1, HEUR_INSTANT = 0, NOT_SUPPORTED = 3000;

// The problem: 1 image of 2 channels, 5x5; 3 filters of 3x3, padding 1, stride 1.
const int64_t N = 1, C = 2, H = 5, W = 5, K = 3, R = 3, S = 3;

static int set(cudnnBackendDescriptor_t d, int name, int type, int64_t n, const void *v) {
    return cudnnBackendSetAttribute(d, (cudnnBackendAttributeName_t)name, (cudnnBackendAttributeType_t)type, n, v);
}
static int get(cudnnBackendDescriptor_t d, int name, int type, int64_t n, int64_t *count, void *v) {
    return cudnnBackendGetAttribute(d, (cudnnBackendAttributeName_t)name, (cudnnBackendAttributeType_t)type, n, count,
                                    v);
}
static cudnnBackendDescriptor_t make(int type) {
    cudnnBackendDescriptor_t d = nullptr;
    int s = cudnnBackendCreateDescriptor((cudnnBackendDescriptorType_t)type, &d);
    if (s != 0) {
        std::printf("FAILED: create descriptor %d -> %s\n", type, cudnnGetErrorString((cudnnStatus_t)s));
        std::exit(1);
    }
    return d;
}
#define DNN(call)                                                                                      \
    do {                                                                                               \
        int s_ = (call);                                                                               \
        if (s_ != 0) {                                                                                 \
            std::printf("FAILED: %s -> %s at line %d\n", #call, cudnnGetErrorString((cudnnStatus_t)s_), \
                        __LINE__);                                                                     \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

static cudnnBackendDescriptor_t tensor(int64_t uid, int64_t n, int64_t c, int64_t h, int64_t w) {
    cudnnBackendDescriptor_t t = make(TENSOR_DESCRIPTOR);
    int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, h * w, w, 1}, alignment = 4;
    int type = DATA_FLOAT;
    DNN(set(t, TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    DNN(set(t, TENSOR_DIMS, CUDNN_TYPE_INT64, 4, dims));
    DNN(set(t, TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
    DNN(set(t, TENSOR_UID, CUDNN_TYPE_INT64, 1, &uid));
    DNN(set(t, TENSOR_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    DNN(cudnnBackendFinalize(t));
    return t;
}

struct Plan {
    cudnnBackendDescriptor_t plan = nullptr;
    int64_t workspace = 0;
    bool from_heuristics = false;
};

// An execution plan for `graph`: the first heuristics config that finalizes, else engine 0.
static Plan make_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t graph) {
    Plan p;
    cudnnBackendDescriptor_t heur = make(ENGINEHEUR_DESCRIPTOR);
    int mode = HEUR_INSTANT;
    DNN(set(heur, HEUR_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
    DNN(set(heur, HEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    DNN(cudnnBackendFinalize(heur));
    int64_t available = 0;
    int s = get(heur, HEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr);
    std::vector<cudnnBackendDescriptor_t> configs;
    // Every config made, filled or not: the program destroys them all once it has its plan.
    std::vector<cudnnBackendDescriptor_t> made;
    if (s == 0 && available > 0) {
        // One more than offered, as a framework with a fixed-size array asks: cuDNN fills the
        // lesser of the two counts and answers the attribute's.
        made.resize(available + 1);
        for (auto &c : made) c = make(ENGINECFG_DESCRIPTOR);
        int64_t got = 0;
        DNN(get(heur, HEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)made.size(), &got, made.data()));
        configs.assign(made.begin(), made.begin() + std::min<int64_t>(got, available));
        std::printf("heuristics: configs offered\n");
    } else {
        std::printf("heuristics: %s\n", cudnnGetErrorString((cudnnStatus_t)s));
        cudnnBackendDescriptor_t engine = make(ENGINE_DESCRIPTOR);
        int64_t index = 0;
        DNN(set(engine, ENGINE_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
        DNN(set(engine, ENGINE_INDEX, CUDNN_TYPE_INT64, 1, &index));
        DNN(cudnnBackendFinalize(engine));
        cudnnBackendDescriptor_t config = make(ENGINECFG_DESCRIPTOR);
        DNN(set(config, CFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine));
        DNN(cudnnBackendFinalize(config));
        // The config keeps what it needs of the engine: the program lets go of it.
        DNN(cudnnBackendDestroyDescriptor(engine));
        configs.push_back(config);
        made.push_back(config);
    }
    for (auto config : configs) {
        cudnnBackendDescriptor_t plan = make(EXECUTION_PLAN_DESCRIPTOR);
        DNN(set(plan, PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
        DNN(set(plan, PLAN_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config));
        if (cudnnBackendFinalize(plan) == 0) {
            p.plan = plan;
            break;
        }
        cudnnBackendDestroyDescriptor(plan);
    }
    // The plan keeps what it needs of its config and the heuristics: the program lets go of
    // them (the heuristics after the configs filled from it, as a framework's do).
    for (auto config : made) DNN(cudnnBackendDestroyDescriptor(config));
    DNN(cudnnBackendDestroyDescriptor(heur));
    if (!p.plan) {
        std::printf("FAILED: no execution plan finalizes\n");
        std::exit(1);
    }
    int64_t count = 0;
    if (get(p.plan, PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count, &p.workspace) != 0) p.workspace = 0;
    return p;
}

static void host_conv(const std::vector<float> &x, const std::vector<float> &w, std::vector<float> &y) {
    for (int64_t k = 0; k < K; k++)
        for (int64_t i = 0; i < H; i++)
            for (int64_t j = 0; j < W; j++) {
                float acc = 0;
                for (int64_t c = 0; c < C; c++)
                    for (int64_t r = 0; r < R; r++)
                        for (int64_t s = 0; s < S; s++) {
                            int64_t ii = i + r - 1, jj = j + s - 1;
                            if (ii < 0 || ii >= H || jj < 0 || jj >= W) continue;
                            acc += x[(c * H + ii) * W + jj] * w[((k * C + c) * R + r) * S + s];
                        }
                y[(k * H + i) * W + j] = acc;
            }
}


static int64_t g_uids[3] = {'x', 'w', 'y'};

// A fresh variant pack for one execution: the three tensors' pointers (listed in reverse on
// odd executions) and the workspace, finalized.
static cudnnBackendDescriptor_t pack_for(int i, float *x, float *w, float *y, void *workspace) {
    cudnnBackendDescriptor_t pack = make(VARIANT_PACK_DESCRIPTOR);
    int64_t uids[3];
    void *pointers[3], *given[3] = {x, w, y};
    for (int k = 0; k < 3; k++) {
        int at = i % 2 ? 2 - k : k;
        uids[k] = g_uids[at];
        pointers[k] = given[at];
    }
    DNN(set(pack, PACK_UIDS, CUDNN_TYPE_INT64, 3, uids));
    DNN(set(pack, PACK_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers));
    DNN(set(pack, PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    DNN(cudnnBackendFinalize(pack));
    return pack;
}

static const char *name(int s) { return cudnnGetErrorString((cudnnStatus_t)s); }

// Through Phos only: each misuse and its status.
static void hostile(cudnnHandle_t handle, const Plan &plan, float *x, float *w, float *y, void *workspace) {
    auto say = [](const char *what, int s) { std::printf("hostile: %s -> %s\n", what, name(s)); };
    int64_t uids[3] = {'x', 'w', 'y'};
    void *pointers[3] = {x, w, y};
    cudnnBackendDescriptor_t pack = make(VARIANT_PACK_DESCRIPTOR);
    say("unique ids as pointers", set(pack, PACK_UIDS, CUDNN_TYPE_VOID_PTR, 3, uids));
    say("two workspaces", set(pack, PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 2, pointers));
    DNN(set(pack, PACK_UIDS, CUDNN_TYPE_INT64, 3, uids));
    DNN(set(pack, PACK_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers));
    DNN(set(pack, PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    say("execute a pack not finalized", cudnnBackendExecute(handle, plan.plan, pack));
    DNN(cudnnBackendFinalize(pack));
    say("finalize twice", cudnnBackendFinalize(pack));
    say("set a finalized pack", set(pack, PACK_UIDS, CUDNN_TYPE_INT64, 3, uids));
    DNN(cudnnBackendDestroyDescriptor(pack));
    say("destroy twice", cudnnBackendDestroyDescriptor(pack));
    say("execute a destroyed pack", cudnnBackendExecute(handle, plan.plan, pack));
    cudnnBackendDescriptor_t made_up = (cudnnBackendDescriptor_t)(uintptr_t)0x7e25000000004321ull;
    say("destroy a made-up pack", cudnnBackendDestroyDescriptor(made_up));
    // A host pointer is the server's to refuse: the setting goes without waiting, and the
    // next synchronous cuDNN call returns the failure.
    cudnnBackendDescriptor_t fresh = make(VARIANT_PACK_DESCRIPTOR);
    int64_t host = 0;
    void *host_pointers[3] = {&host, w, y};
    int s = set(fresh, PACK_POINTERS, CUDNN_TYPE_VOID_PTR, 3, host_pointers);
    cudaStream_t st;
    int next = cudnnGetStream(handle, &st);
    std::printf("hostile: host pointer in a pack -> %s, the next synchronous call -> %s\n", name(s), name(next));
    DNN(cudnnBackendDestroyDescriptor(fresh));
    // What the program still has works.
    cudnnBackendDescriptor_t good = pack_for(0, x, w, y, workspace);
    DNN(cudnnBackendExecute(handle, plan.plan, good));
    DNN(cudnnBackendDestroyDescriptor(good));
    DNN(cudnnGetStream(handle, &st));
    std::printf("hostile: the plan and fresh packs still work\n");
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    bool is_hostile = !std::strcmp(mode, "hostile"), checkpoint = !std::strcmp(mode, "checkpoint");
    int runs = argc > 1 && !is_hostile && !checkpoint ? std::atoi(argv[1]) : 8;
    if (runs < 1) runs = 1;
    cudnnHandle_t handle;
    DNN(cudnnCreate(&handle));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    DNN(cudnnSetStream(handle, stream));

    cudnnBackendDescriptor_t x = tensor('x', N, C, H, W), w = tensor('w', K, C, R, S), y = tensor('y', N, K, H, W);
    cudnnBackendDescriptor_t conv = make(CONVOLUTION_DESCRIPTOR);
    int64_t spatial = 2, pads[2] = {1, 1}, strides[2] = {1, 1}, dilations[2] = {1, 1};
    int comp = DATA_FLOAT, conv_mode = CROSS_CORRELATION;
    DNN(set(conv, CONV_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial));
    DNN(set(conv, CONV_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    DNN(set(conv, CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &conv_mode));
    DNN(set(conv, CONV_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads));
    DNN(set(conv, CONV_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads));
    DNN(set(conv, CONV_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides));
    DNN(set(conv, CONV_DILATIONS, CUDNN_TYPE_INT64, 2, dilations));
    DNN(cudnnBackendFinalize(conv));
    cudnnBackendDescriptor_t op = make(OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    float alpha = 1, beta = 0;
    DNN(set(op, FWD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    DNN(set(op, FWD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w));
    DNN(set(op, FWD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    DNN(set(op, FWD_CONV, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
    DNN(set(op, FWD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha));
    DNN(set(op, FWD_BETA, CUDNN_TYPE_FLOAT, 1, &beta));
    DNN(cudnnBackendFinalize(op));
    for (auto d : {x, w, y, conv}) DNN(cudnnBackendDestroyDescriptor(d));
    cudnnBackendDescriptor_t graph = make(OPERATIONGRAPH_DESCRIPTOR);
    DNN(set(graph, GRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    DNN(set(graph, GRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
    DNN(cudnnBackendFinalize(graph));
    Plan plan = make_plan(handle, graph);
    DNN(cudnnBackendDestroyDescriptor(graph));
    DNN(cudnnBackendDestroyDescriptor(op));
    std::printf("plan: finalized\n");

    const size_t out = N * K * H * W;
    std::vector<float> hx(N * C * H * W), hw(K * C * R * S), hy(out * runs, -1), want(out);
    for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)((int)(i * 7 % 5) - 2);
    for (size_t i = 0; i < hw.size(); i++) hw[i] = (float)((int)(i * 3 % 5) - 2);
    host_conv(hx, hw, want);
    float *dx, *dw, *dy;
    void *workspace = nullptr;
    CHECK(cudaMalloc(&dx, hx.size() * 4));
    CHECK(cudaMalloc(&dw, hw.size() * 4));
    CHECK(cudaMalloc(&dy, hy.size() * 4));
    if (plan.workspace > 0) CHECK(cudaMalloc(&workspace, plan.workspace));
    CHECK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dw, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, hy.data(), hy.size() * 4, cudaMemcpyHostToDevice));

    if (is_hostile) {
        hostile(handle, plan, dx, dw, dy, workspace);
    } else {
        for (int i = 0; i < runs; i++) {
            if (checkpoint && i == runs / 2) {
                // A pack that pointed into memory freed since waits in Phos's pool: a restore
                // must not set its pointers again.
                float *scratch;
                CHECK(cudaMalloc(&scratch, out * 4));
                cudnnBackendDescriptor_t pack = pack_for(i, dx, dw, scratch, workspace);
                DNN(cudnnBackendExecute(handle, plan.plan, pack));
                DNN(cudnnBackendDestroyDescriptor(pack));
                CHECK(cudaStreamSynchronize(stream));
                CHECK(cudaFree(scratch));
                std::printf("cudnn ready\n");
                std::fflush(stdout);
                std::this_thread::sleep_for(std::chrono::seconds(3));
            }
            cudnnBackendDescriptor_t pack = pack_for(i, dx, dw, dy + out * i, workspace);
            int s = cudnnBackendExecute(handle, plan.plan, pack);
            if (s == NOT_SUPPORTED) {
                std::printf("execute: %s\n", name(s));
                return 1;
            }
            DNN(s);
            DNN(cudnnBackendDestroyDescriptor(pack));
        }
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaMemcpy(hy.data(), dy, hy.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (size_t i = 0; i < hy.size(); i++) worst = std::fmax(worst, std::fabs(hy[i] - want[i % out]));
        std::printf("executions, each with a fresh variant pack: %s\n", worst < 1e-3 ? "as the host convolution" : "WRONG");
        if (worst >= 1e-3) return 1;

        // Misuse, answered as cuDNN answers it.
        cudnnBackendDescriptor_t pack = make(VARIANT_PACK_DESCRIPTOR);
        int s = set(pack, PACK_UIDS, CUDNN_TYPE_VOID_PTR, 3, g_uids);
        std::printf("unique ids of the wrong type: %s\n", name(s));
        void *pointers[3] = {dx, dw, dy};
        DNN(set(pack, PACK_UIDS, CUDNN_TYPE_INT64, 3, g_uids));
        DNN(set(pack, PACK_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers));
        DNN(set(pack, PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
        s = cudnnBackendExecute(handle, plan.plan, pack);
        std::printf("execute with a pack not finalized: %s\n", s != 0 ? "refused" : "ACCEPTED");
        DNN(cudnnBackendDestroyDescriptor(pack));
    }
    DNN(cudnnBackendDestroyDescriptor(plan.plan));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dy));
    if (workspace) CHECK(cudaFree(workspace));
    DNN(cudnnDestroy(handle));
    std::printf("done\n");
    return 0;
}
