// A convolution forward through cuDNN's backend (graph) API: tensor, convolution, operation and
// operation graph descriptors, heuristics (or, where cuDNN offers none, the engine of global
// index 0), engine config, execution plan and variant pack, checked against a convolution on
// the host. The program lets go of every descriptor but the plan before it executes (the plan
// keeps what it needs), as a framework's cached plans do. Without cuDNN (Phos on emu) the
// descriptors still hold and give back their attributes, the heuristics offer emu's one engine
// config and the execution answers CUDNN_STATUS_NOT_SUPPORTED, which the program says.
//
// Modes: none (the convolution), `hostile` (what careless or hostile calls get), `checkpoint`
// (prints "cudnn ready" once its plan and variant pack are finalized, waits three seconds, in
// which a checkpoint and restore may happen, then reads them back and executes);
// `checkpoint-configs` and `checkpoint-plan` wait the same way once the heuristics have filled
// the configs (before any plan), and once the plan is made and the configs and heuristics are
// destroyed (before the graph and operation are).
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

static const char *g_mode = "";

// In mode `checkpoint-STAGE`, at STAGE: says so and waits for a checkpoint and restore.
static void pause_at(const char *stage) {
    if (std::strncmp(g_mode, "checkpoint-", 11) != 0 || std::strcmp(g_mode + 11, stage) != 0) return;
    std::printf("cudnn ready\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(3));
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
        pause_at("configs");
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

static void hostile(cudnnHandle_t handle, cudnnBackendDescriptor_t x) {
    auto say = [](const char *what, int s) { std::printf("hostile: %s -> %s\n", what, cudnnGetErrorString((cudnnStatus_t)s)); };
    int64_t one = 1;
    cudnnBackendDescriptor_t made_up = (cudnnBackendDescriptor_t)(uintptr_t)0x7e25000000001234ull;
    say("made-up descriptor", set(made_up, TENSOR_UID, CUDNN_TYPE_INT64, 1, &one));
    say("negative element count", set(x, TENSOR_UID, CUDNN_TYPE_INT64, -1, &one));
    say("unknown attribute type", set(x, TENSOR_UID, 999, 1, &one));
    cudnnBackendDescriptor_t op = make(OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    say("descriptor element made up", set(op, FWD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &made_up));
    void *host = &one;
    say("pointer on a tensor", set(op, FWD_X, CUDNN_TYPE_VOID_PTR, 1, &host));
    cudnnBackendDescriptor_t pack = make(VARIANT_PACK_DESCRIPTOR);
    // Through Phos a variant pack's pointers are set without waiting: a refusal of the
    // server's is returned by the next synchronous cuDNN call.
    int refused = set(pack, PACK_POINTERS, CUDNN_TYPE_VOID_PTR, 1, &host);
    cudaStream_t st;
    if (refused == 0) refused = cudnnGetStream(handle, &st);
    say("host pointer in a variant pack", refused);
    cudnnBackendDescriptor_t gone = make(TENSOR_DESCRIPTOR);
    DNN(cudnnBackendDestroyDescriptor(gone));
    say("destroyed descriptor", set(gone, TENSOR_UID, CUDNN_TYPE_INT64, 1, &one));
    cudnnHandle_t fake = (cudnnHandle_t)(uintptr_t)0x7e24000000000099ull;
    say("made-up handle", cudnnSetStream(fake, nullptr));
    cudnnRNNDescriptor_t legacy;
    say("legacy RNN descriptor", cudnnCreateRNNDescriptor(&legacy));
    char last[128];
    cudnnGetLastErrorString(last, sizeof last);
    std::printf("hostile: last error names %s\n", std::strstr(last, "cudnnCreateRNNDescriptor") ? "the call" : last);
    DNN(cudnnBackendDestroyDescriptor(op));
    DNN(cudnnBackendDestroyDescriptor(pack));
    cudnnBackendDescriptor_t fine = make(TENSOR_DESCRIPTOR);
    DNN(set(fine, TENSOR_UID, CUDNN_TYPE_INT64, 1, &one));
    DNN(cudnnBackendDestroyDescriptor(fine));
    DNN(cudnnSetStream(handle, nullptr));
    std::printf("hostile: the handle and descriptors still work\n");
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    g_mode = mode;
    size_t version = cudnnGetVersion();
    std::printf("cudnn major version: %zu\n", version / 10000);
    cudnnHandle_t handle;
    DNN(cudnnCreate(&handle));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    DNN(cudnnSetStream(handle, stream));

    cudnnBackendDescriptor_t x = tensor('x', N, C, H, W), w = tensor('w', K, C, R, S), y = tensor('y', N, K, H, W);
    // What the program set comes back.
    int64_t dims[4] = {0}, count = 0;
    DNN(get(x, TENSOR_DIMS, CUDNN_TYPE_INT64, 4, &count, dims));
    std::printf("x: %lld dims %lld %lld %lld %lld\n", (long long)count, (long long)dims[0], (long long)dims[1],
                (long long)dims[2], (long long)dims[3]);
    if (!std::strcmp(mode, "hostile")) {
        hostile(handle, x);
        DNN(cudnnDestroy(handle));
        std::printf("done\n");
        return 0;
    }

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
    // The operation keeps its tensors and convolution: the program lets go of them.
    for (auto d : {x, w, y, conv}) DNN(cudnnBackendDestroyDescriptor(d));

    cudnnBackendDescriptor_t graph = make(OPERATIONGRAPH_DESCRIPTOR);
    DNN(set(graph, GRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    DNN(set(graph, GRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
    // (cuDNN 9.x on the H100 does not give a graph's handle back: CUDNN_STATUS_NOT_SUPPORTED.)
    DNN(cudnnBackendFinalize(graph));

    Plan plan = make_plan(handle, graph);
    std::printf("plan: finalized\n");
    pause_at("plan");
    // The plan is all the program keeps: its graph and operation go before it executes.
    DNN(cudnnBackendDestroyDescriptor(graph));
    DNN(cudnnBackendDestroyDescriptor(op));

    std::vector<float> hx(N * C * H * W), hw(K * C * R * S), hy(N * K * H * W, -1), want(N * K * H * W);
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

    cudnnBackendDescriptor_t pack = make(VARIANT_PACK_DESCRIPTOR);
    int64_t uids[3] = {'x', 'w', 'y'};
    void *pointers[3] = {dx, dw, dy};
    DNN(set(pack, PACK_UIDS, CUDNN_TYPE_INT64, 3, uids));
    DNN(set(pack, PACK_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers));
    DNN(set(pack, PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    DNN(cudnnBackendFinalize(pack));

    if (!std::strcmp(mode, "checkpoint")) {
        std::printf("cudnn ready\n");
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::seconds(3));
        int64_t back_uids[3] = {0};
        DNN(get(pack, PACK_UIDS, CUDNN_TYPE_INT64, 3, &count, back_uids));
        bool kept = back_uids[0] == 'x' && back_uids[2] == 'y';
        std::printf("after the restore: the descriptors %s\n", kept ? "kept their attributes" : "CHANGED");
    }
    int s = cudnnBackendExecute(handle, plan.plan, pack);
    if (s == NOT_SUPPORTED) {
        std::printf("execute: %s\n", cudnnGetErrorString((cudnnStatus_t)s));
    } else {
        DNN(s);
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaMemcpy(hy.data(), dy, hy.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (size_t i = 0; i < hy.size(); i++) worst = std::fmax(worst, std::fabs(hy[i] - want[i]));
        std::printf("execute: %zu outputs, %s\n", hy.size(), worst < 1e-3 ? "as the host convolution" : "WRONG");
        if (worst >= 1e-3) return 1;
    }
    for (auto d : {pack, plan.plan}) DNN(cudnnBackendDestroyDescriptor(d));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dy));
    if (workspace) CHECK(cudaFree(workspace));
    DNN(cudnnDestroy(handle));
    std::printf("done\n");
    return 0;
}
