// Batch normalization through cuDNN's legacy API, as PyTorch's BatchNorm2d calls it: tensor
// descriptors made by each setter (4d, 4d with strides, Nd, Nd with a format) and by
// cudnnDeriveBNTensorDescriptor, read back; forward training (Ex, with cuDNN's workspace and
// reserve), inference and backward (Ex) on NCHW and NHWC, float and half data, then the plain
// forward training and backward in per-activation mode with alpha/beta blending. Every output
// is checked against a host reference with cuDNN's formulas (biased variance to normalise,
// unbiased for the running variance, saved inverse standard deviation).
//
// Modes: none (the above), `hostile` (what careless or hostile calls get: through Phos only,
// NVIDIA's library does not check device ranges), `checkpoint` (prints "cudnn ready" once its
// descriptors are set, waits three seconds, in which a checkpoint and restore may happen, then
// reads them back and normalises with them). Last, cudnnSetTensor fills a half and a double
// tensor (its value is a float for a half tensor, a double for a double one). A number N as the mode runs the above,
// then sets the stream and a tensor N times more (printing nothing more: the calls' cost is
// what differs).
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#else
#include "cudnn_min.h"
#endif
#include <cuda_fp16.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "check.h"

#define DNN(call)                                                                                      \
    do {                                                                                               \
        cudnnStatus_t s_ = (call);                                                                     \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                              \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, cudnnGetErrorString(s_), __FILE__, __LINE__); \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

// cuDNN's numbers (cudnn_graph.h, cudnn_ops.h), as the program's own constants.
const int DATA_FLOAT = 0, DATA_DOUBLE = 1, DATA_HALF = 2, FORMAT_NCHW = 0, FORMAT_NHWC = 1;
const int PER_ACTIVATION = 0, SPATIAL = 1, SPATIAL_PERSISTENT = 2, OPS_BN = 0, OPS_BN_ACTIVATION = 1;

const int N = 2, C = 3, H = 4, W = 5, COUNT = N * C * H * W;
const double EPS = 1e-5, FACTOR = 0.1;

static cudnnBatchNormMode_t bn_mode(int m) { return (cudnnBatchNormMode_t)m; }

// The element of logical index (n, c, h, w) in a layout.
static int at(bool nhwc, int n, int c, int h, int w) {
    return nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

// Data held as float or half on the device, as double on the host (logical NCHW order).
struct Data {
    bool half;
    bool nhwc;
    void *dev = nullptr;
    size_t bytes() const { return (size_t)COUNT * (half ? 2 : 4); }
    void alloc() { CHECK(cudaMalloc(&dev, bytes())); }
    void put(const std::vector<double> &v) {
        std::vector<unsigned char> raw(bytes());
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                for (int h = 0; h < H; h++)
                    for (int w = 0; w < W; w++) {
                        int i = ((n * C + c) * H + h) * W + w, o = at(nhwc, n, c, h, w);
                        if (half) {
                            __half x = __float2half((float)v[i]);
                            std::memcpy(&raw[o * 2], &x, 2);
                        } else {
                            float x = (float)v[i];
                            std::memcpy(&raw[o * 4], &x, 4);
                        }
                    }
        CHECK(cudaMemcpy(dev, raw.data(), raw.size(), cudaMemcpyHostToDevice));
    }
    std::vector<double> get() const {
        std::vector<unsigned char> raw(bytes());
        CHECK(cudaMemcpy(raw.data(), dev, raw.size(), cudaMemcpyDeviceToHost));
        std::vector<double> v(COUNT);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                for (int h = 0; h < H; h++)
                    for (int w = 0; w < W; w++) {
                        int i = ((n * C + c) * H + h) * W + w, o = at(nhwc, n, c, h, w);
                        if (half) {
                            __half x;
                            std::memcpy(&x, &raw[o * 2], 2);
                            v[i] = __half2float(x);
                        } else {
                            float x;
                            std::memcpy(&x, &raw[o * 4], 4);
                            v[i] = x;
                        }
                    }
        return v;
    }
    // What the device holds of `v` (half data is rounded).
    std::vector<double> rounded(std::vector<double> v) const {
        if (half)
            for (auto &x : v) x = __half2float(__float2half((float)x));
        return v;
    }
};

static float *floats(const std::vector<double> &v) {
    float *d;
    CHECK(cudaMalloc(&d, v.size() * 4));
    std::vector<float> f(v.begin(), v.end());
    CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    return d;
}

static std::vector<double> read_floats(const float *d, size_t n) {
    std::vector<float> f(n);
    CHECK(cudaMemcpy(f.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return std::vector<double>(f.begin(), f.end());
}

static bool close(const char *what, const std::vector<double> &got, const std::vector<double> &want, double tol) {
    for (size_t i = 0; i < want.size(); i++) {
        if (!(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])))) {
            std::printf("MISMATCH %s at %zu: got %.6f, want %.6f\n", what, i, got[i], want[i]);
            return false;
        }
    }
    return true;
}

// The host reference: features are channels (spatial) or (channel, h, w) (per activation).
struct Reference {
    int mode;
    int features() const { return mode == PER_ACTIVATION ? C * H * W : C; }
    int feature(int i) const { return mode == PER_ACTIVATION ? i % (C * H * W) : (i / (H * W)) % C; }
    int count() const { return COUNT / features(); }
    void stats(const std::vector<double> &x, std::vector<double> &mean, std::vector<double> &var) const {
        mean.assign(features(), 0);
        var.assign(features(), 0);
        for (int i = 0; i < COUNT; i++) mean[feature(i)] += x[i] / count();
        for (int i = 0; i < COUNT; i++) var[feature(i)] += (x[i] - mean[feature(i)]) * (x[i] - mean[feature(i)]) / count();
    }
    std::vector<double> normalize(const std::vector<double> &x, const std::vector<double> &mean,
                                  const std::vector<double> &var, const std::vector<double> &scale,
                                  const std::vector<double> &bias) const {
        std::vector<double> y(COUNT);
        for (int i = 0; i < COUNT; i++) {
            int f = feature(i);
            y[i] = scale[f] * (x[i] - mean[f]) / std::sqrt(var[f] + EPS) + bias[f];
        }
        return y;
    }
    void backward(const std::vector<double> &x, const std::vector<double> &dy, const std::vector<double> &scale,
                  std::vector<double> &dx, std::vector<double> &dscale, std::vector<double> &dbias) const {
        std::vector<double> mean, var;
        stats(x, mean, var);
        dscale.assign(features(), 0);
        dbias.assign(features(), 0);
        for (int i = 0; i < COUNT; i++) {
            int f = feature(i);
            dbias[f] += dy[i];
            dscale[f] += dy[i] * (x[i] - mean[f]) / std::sqrt(var[f] + EPS);
        }
        dx.assign(COUNT, 0);
        double m = count();
        for (int i = 0; i < COUNT; i++) {
            int f = feature(i);
            double inv = 1 / std::sqrt(var[f] + EPS), xhat = (x[i] - mean[f]) * inv;
            dx[i] = scale[f] * inv / m * (m * dy[i] - dbias[f] - xhat * dscale[f]);
        }
    }
};

static std::vector<double> pattern(int seed, double lo, double step, int period) {
    std::vector<double> v(COUNT);
    for (int i = 0; i < COUNT; i++) v[i] = lo + step * ((i * seed + i / 7) % period) + 0.5 * ((i / (H * W)) % C);
    return v;
}

// A 4-d tensor descriptor made by setter `setter` (0: 4d, 1: 4dEx, 2: Nd, 3: NdEx).
static cudnnTensorDescriptor_t tensor(int setter, bool nhwc, int type) {
    cudnnTensorDescriptor_t d;
    DNN(cudnnCreateTensorDescriptor(&d));
    int dims[4] = {N, C, H, W};
    int strides[4] = {C * H * W, H * W, W, 1};
    if (nhwc) {
        strides[0] = H * W * C;
        strides[1] = 1;
        strides[2] = W * C;
        strides[3] = C;
    }
    cudnnDataType_t t = (cudnnDataType_t)type;
    cudnnTensorFormat_t f = (cudnnTensorFormat_t)(nhwc ? FORMAT_NHWC : FORMAT_NCHW);
    switch (setter) {
    case 0: DNN(cudnnSetTensor4dDescriptor(d, f, t, N, C, H, W)); break;
    case 1: DNN(cudnnSetTensor4dDescriptorEx(d, t, N, C, H, W, strides[0], strides[1], strides[2], strides[3])); break;
    case 2: DNN(cudnnSetTensorNdDescriptor(d, t, 4, dims, strides)); break;
    default: DNN(cudnnSetTensorNdDescriptorEx(d, f, t, 4, dims)); break;
    }
    return d;
}

struct Case {
    const char *name;
    bool nhwc, half;
    int mode, setter;
};

// Forward training (Ex), inference and backward (Ex) of one layout and type, checked.
static bool run_case(cudnnHandle_t handle, const Case &k) {
    int type = k.half ? DATA_HALF : DATA_FLOAT;
    cudnnTensorDescriptor_t xd = tensor(k.setter, k.nhwc, type), bnd;
    DNN(cudnnCreateTensorDescriptor(&bnd));
    DNN(cudnnDeriveBNTensorDescriptor(bnd, xd, bn_mode(k.mode)));
    Reference ref{k.mode};
    int F = ref.features();
    Data x{k.half, k.nhwc}, y{k.half, k.nhwc}, dy{k.half, k.nhwc}, dx{k.half, k.nhwc};
    for (Data *d : {&x, &y, &dy, &dx}) d->alloc();
    std::vector<double> hx = x.rounded(pattern(5, -1.5, 0.25, 11)), hdy = dy.rounded(pattern(3, -0.75, 0.125, 13));
    x.put(hx);
    dy.put(hdy);
    std::vector<double> scale(F), bias(F), rmean(F, 0.0), rvar(F, 1.0);
    for (int f = 0; f < F; f++) {
        scale[f] = 0.5 + 0.25 * (f % 4);
        bias[f] = -0.5 + 0.125 * (f % 5);
    }
    float *dscale_in = floats(scale), *dbias_in = floats(bias), *drm = floats(rmean), *drv = floats(rvar);
    float *dsm = floats(rmean), *dsi = floats(rmean), *ddscale = floats(rmean), *ddbias = floats(rmean);
    size_t fwd_ws = 0, bwd_ws = 0, reserve = 0;
    cudnnBatchNormOps_t ops = (cudnnBatchNormOps_t)OPS_BN;
    DNN(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, bn_mode(k.mode), ops, xd, nullptr, xd, bnd,
                                                                  nullptr, &fwd_ws));
    DNN(cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, bn_mode(k.mode), ops, xd, nullptr, xd, nullptr, xd,
                                                           bnd, nullptr, &bwd_ws));
    DNN(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, bn_mode(k.mode), ops, nullptr, xd, &reserve));
    void *ws = nullptr, *rs = nullptr;
    size_t ws_size = fwd_ws > bwd_ws ? fwd_ws : bwd_ws;
    if (ws_size) CHECK(cudaMalloc(&ws, ws_size));
    if (reserve) CHECK(cudaMalloc(&rs, reserve));
    float one = 1, zero = 0;

    DNN(cudnnBatchNormalizationForwardTrainingEx(handle, bn_mode(k.mode), ops, &one, &zero, xd, x.dev, nullptr,
                                                 nullptr, xd, y.dev, bnd, dscale_in, dbias_in, FACTOR, drm, drv, EPS,
                                                 dsm, dsi, nullptr, ws, ws_size, rs, reserve));
    std::vector<double> mean, var;
    ref.stats(hx, mean, var);
    double tol = k.half ? 1e-2 : 1e-4;
    bool ok = close("y", y.get(), ref.normalize(hx, mean, var, scale, bias), tol);
    std::vector<double> want_rm(F), want_rv(F), want_inv(F);
    for (int f = 0; f < F; f++) {
        want_rm[f] = FACTOR * mean[f];
        want_rv[f] = (1 - FACTOR) + FACTOR * var[f] * ref.count() / (ref.count() - 1);
        want_inv[f] = 1 / std::sqrt(var[f] + EPS);
    }
    ok = ok && close("running mean", read_floats(drm, F), want_rm, 1e-4);
    ok = ok && close("running variance", read_floats(drv, F), want_rv, 1e-4);
    ok = ok && close("saved mean", read_floats(dsm, F), mean, 1e-4);
    ok = ok && close("saved inverse variance", read_floats(dsi, F), want_inv, 1e-3);
    std::printf("%s: forward training %s\n", k.name, ok ? "ok" : "WRONG");

    // Inference with the running statistics just made.
    std::vector<double> rm = read_floats(drm, F), rv = read_floats(drv, F);
    DNN(cudnnBatchNormalizationForwardInference(handle, bn_mode(k.mode), &one, &zero, xd, x.dev, xd, y.dev, bnd,
                                                dscale_in, dbias_in, drm, drv, EPS));
    bool inf_ok = close("inference y", y.get(), ref.normalize(hx, rm, rv, scale, bias), tol);
    std::printf("%s: inference %s\n", k.name, inf_ok ? "ok" : "WRONG");

    DNN(cudnnBatchNormalizationBackwardEx(handle, bn_mode(k.mode), ops, &one, &zero, &one, &zero, xd, x.dev, nullptr,
                                          nullptr, xd, dy.dev, nullptr, nullptr, xd, dx.dev, bnd, dscale_in, dbias_in,
                                          ddscale, ddbias, EPS, dsm, dsi, nullptr, ws, ws_size, rs, reserve));
    std::vector<double> want_dx, want_dscale, want_dbias;
    ref.backward(hx, hdy, scale, want_dx, want_dscale, want_dbias);
    bool bwd_ok = close("dx", dx.get(), want_dx, k.half ? 2e-2 : 1e-3);
    bwd_ok = bwd_ok && close("dscale", read_floats(ddscale, F), want_dscale, 1e-3);
    bwd_ok = bwd_ok && close("dbias", read_floats(ddbias, F), want_dbias, 1e-3);
    std::printf("%s: backward %s\n", k.name, bwd_ok ? "ok" : "WRONG");

    for (void *p : {x.dev, y.dev, dy.dev, dx.dev, (void *)dscale_in, (void *)dbias_in, (void *)drm, (void *)drv,
                    (void *)dsm, (void *)dsi, (void *)ddscale, (void *)ddbias, ws, rs})
        if (p) CHECK(cudaFree(p));
    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroyTensorDescriptor(bnd));
    return ok && inf_ok && bwd_ok;
}

// The plain calls, per activation, blending into what y, dx and the gradients held.
static bool run_plain(cudnnHandle_t handle) {
    cudnnTensorDescriptor_t xd = tensor(0, false, DATA_FLOAT), bnd;
    DNN(cudnnCreateTensorDescriptor(&bnd));
    DNN(cudnnDeriveBNTensorDescriptor(bnd, xd, bn_mode(PER_ACTIVATION)));
    Reference ref{PER_ACTIVATION};
    int F = ref.features();
    Data x{false, false}, y{false, false}, dy{false, false}, dx{false, false};
    for (Data *d : {&x, &y, &dy, &dx}) d->alloc();
    std::vector<double> hx = pattern(7, -2, 0.375, 9), hdy = pattern(2, -1, 0.25, 7), prior(COUNT, 1.0);
    x.put(hx);
    dy.put(hdy);
    y.put(prior);
    dx.put(prior);
    std::vector<double> scale(F, 1.5), bias(F, 0.25), ones(F, 1.0);
    float *ds = floats(scale), *db = floats(bias), *dgs = floats(ones), *dgb = floats(ones);
    float alpha = 2, beta = 0.5;
    DNN(cudnnBatchNormalizationForwardTraining(handle, bn_mode(PER_ACTIVATION), &alpha, &beta, xd, x.dev, xd, y.dev,
                                               bnd, ds, db, 1.0, nullptr, nullptr, EPS, nullptr, nullptr));
    std::vector<double> mean, var;
    ref.stats(hx, mean, var);
    std::vector<double> want = ref.normalize(hx, mean, var, scale, bias);
    for (auto &v : want) v = 2 * v + 0.5;
    bool ok = close("blended y", y.get(), want, 1e-4);
    std::printf("per activation, plain calls: forward training %s\n", ok ? "ok" : "WRONG");
    float alpha_d = 1, beta_d = 1, alpha_p = 1, beta_p = 1;
    DNN(cudnnBatchNormalizationBackward(handle, bn_mode(PER_ACTIVATION), &alpha_d, &beta_d, &alpha_p, &beta_p, xd,
                                        x.dev, xd, dy.dev, xd, dx.dev, bnd, ds, dgs, dgb, EPS, nullptr, nullptr));
    std::vector<double> want_dx, want_dscale, want_dbias;
    ref.backward(hx, hdy, scale, want_dx, want_dscale, want_dbias);
    for (auto &v : want_dx) v += 1;
    for (auto &v : want_dscale) v += 1;
    for (auto &v : want_dbias) v += 1;
    bool bwd_ok = close("blended dx", dx.get(), want_dx, 1e-3);
    bwd_ok = bwd_ok && close("accumulated dscale", read_floats(dgs, F), want_dscale, 1e-3);
    bwd_ok = bwd_ok && close("accumulated dbias", read_floats(dgb, F), want_dbias, 1e-3);
    std::printf("per activation, plain calls: backward %s\n", bwd_ok ? "ok" : "WRONG");
    for (void *p : {x.dev, y.dev, dy.dev, dx.dev, (void *)ds, (void *)db, (void *)dgs, (void *)dgb}) CHECK(cudaFree(p));
    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroyTensorDescriptor(bnd));
    return ok && bwd_ok;
}

static void describe(cudnnTensorDescriptor_t d) {
    cudnnDataType_t t;
    int nb = 0, dims[8] = {0}, strides[8] = {0};
    size_t bytes = 0;
    DNN(cudnnGetTensorNdDescriptor(d, 8, &t, &nb, dims, strides));
    DNN(cudnnGetTensorSizeInBytes(d, &bytes));
    std::printf("descriptor: type %d, %d dims", (int)t, nb);
    for (int i = 0; i < nb; i++) std::printf(" %d", dims[i]);
    std::printf(", strides");
    for (int i = 0; i < nb; i++) std::printf(" %d", strides[i]);
    std::printf(", %zu bytes\n", bytes);
}

// cudnnSetTensor on a half and a double tensor: the value is a float for the half one, a double
// for the double one (as libcudnn reads it).
static bool set_tensor_types(cudnnHandle_t handle) {
    const int n = 2 * 3 * 4 * 5;
    bool ok = true;
    cudnnTensorDescriptor_t d;
    DNN(cudnnCreateTensorDescriptor(&d));
    void *mem;
    CHECK(cudaMalloc(&mem, n * 8));
    // Half: the value is a float (libcudnn reads a float for half tensors); 1.5 is 0x3e00.
    DNN(cudnnSetTensor4dDescriptor(d, (cudnnTensorFormat_t)FORMAT_NCHW, (cudnnDataType_t)DATA_HALF, 2, 3, 4, 5));
    CHECK(cudaMemset(mem, 0, n * 8));
    float half_value = 1.5f;
    DNN(cudnnSetTensor(handle, d, mem, &half_value));
    std::vector<uint16_t> halves(n + 4);
    CHECK(cudaMemcpy(halves.data(), mem, (n + 4) * 2, cudaMemcpyDeviceToHost));
    bool half_ok = true;
    for (int i = 0; i < n; i++) half_ok = half_ok && halves[i] == 0x3e00;
    for (int i = n; i < n + 4; i++) half_ok = half_ok && halves[i] == 0;
    // Double: 2.25 exactly, then again with another value (the descriptor set anew).
    DNN(cudnnSetTensor4dDescriptor(d, (cudnnTensorFormat_t)FORMAT_NCHW, (cudnnDataType_t)DATA_DOUBLE, 2, 3, 4, 5));
    bool double_ok = true;
    for (double value : {2.25, -1.0 / 3.0}) {
        DNN(cudnnSetTensor(handle, d, mem, &value));
        std::vector<double> doubles(n);
        CHECK(cudaMemcpy(doubles.data(), mem, n * 8, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++) double_ok = double_ok && doubles[i] == value;
    }
    std::printf("set tensor: half %s, double %s\n", half_ok ? "ok" : "wrong", double_ok ? "ok" : "wrong");
    ok = half_ok && double_ok;
    CHECK(cudaFree(mem));
    DNN(cudnnDestroyTensorDescriptor(d));
    return ok;
}

// The stream set again and a float tensor set `repeat` times, as a training loop does.
static bool repeated(cudnnHandle_t handle, cudaStream_t stream, int repeat) {
    if (repeat <= 0) return true;
    cudnnTensorDescriptor_t d;
    DNN(cudnnCreateTensorDescriptor(&d));
    DNN(cudnnSetTensor4dDescriptor(d, (cudnnTensorFormat_t)FORMAT_NCHW, (cudnnDataType_t)DATA_FLOAT, 1, 2, 4, 4));
    float *mem;
    CHECK(cudaMalloc(&mem, 32 * 4));
    for (int i = 0; i < repeat; i++) {
        DNN(cudnnSetStream(handle, stream));
        float value = (float)i;
        DNN(cudnnSetTensor(handle, d, mem, &value));
    }
    float back[32];
    CHECK(cudaMemcpy(back, mem, sizeof back, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (float v : back) ok = ok && v == (float)(repeat - 1);
    if (!ok) std::printf("repeated: wrong\n");
    CHECK(cudaFree(mem));
    DNN(cudnnDestroyTensorDescriptor(d));
    return ok;
}

static void hostile(cudnnHandle_t handle) {
    auto say = [](const char *what, cudnnStatus_t s) { std::printf("hostile: %s -> %s\n", what, cudnnGetErrorString(s)); };
    cudnnTensorDescriptor_t d, bnd;
    DNN(cudnnCreateTensorDescriptor(&d));
    DNN(cudnnCreateTensorDescriptor(&bnd));
    cudnnDataType_t f = (cudnnDataType_t)DATA_FLOAT;
    cudnnTensorFormat_t nchw = (cudnnTensorFormat_t)FORMAT_NCHW;
    say("zero batch", cudnnSetTensor4dDescriptor(d, nchw, f, 0, C, H, W));
    say("negative stride", cudnnSetTensor4dDescriptorEx(d, f, N, C, H, W, -1, H * W, W, 1));
    say("unknown data type", cudnnSetTensor4dDescriptor(d, nchw, (cudnnDataType_t)99, N, C, H, W));
    say("unknown format", cudnnSetTensor4dDescriptor(d, (cudnnTensorFormat_t)9, f, N, C, H, W));
    int dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, strides[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    say("nine dimensions", cudnnSetTensorNdDescriptor(d, f, 9, dims, strides));
    size_t bytes = 0;
    say("a descriptor never set", cudnnGetTensorSizeInBytes(d, &bytes));
    cudnnTensorDescriptor_t made_up = (cudnnTensorDescriptor_t)(uintptr_t)0x7e26000000001234ull;
    say("made-up descriptor", cudnnSetTensor4dDescriptor(made_up, nchw, f, N, C, H, W));
    say("a handle as a descriptor", cudnnSetTensor4dDescriptor((cudnnTensorDescriptor_t)handle, nchw, f, N, C, H, W));
    DNN(cudnnSetTensor4dDescriptor(d, nchw, f, N, C, H, W));
    DNN(cudnnDeriveBNTensorDescriptor(bnd, d, bn_mode(SPATIAL)));
    float *x, *y, *p;
    CHECK(cudaMalloc(&x, COUNT * 4));
    CHECK(cudaMalloc(&y, COUNT * 4));
    CHECK(cudaMalloc(&p, 16 * C * 4));
    float one = 1, zero = 0;
    cudnnBatchNormOps_t ops = (cudnnBatchNormOps_t)OPS_BN;
    auto forward = [&](const float *xp, float *yp, void *ws, size_t ws_size, cudnnTensorDescriptor_t b, int o) {
        return cudnnBatchNormalizationForwardTrainingEx(handle, bn_mode(SPATIAL), (cudnnBatchNormOps_t)o, &one, &zero,
                                                        d, xp, nullptr, nullptr, d, yp, b, p, p + C, FACTOR, p + 2 * C,
                                                        p + 3 * C, EPS, p + 4 * C, p + 5 * C, nullptr, ws, ws_size,
                                                        nullptr, 0);
    };
    say("x past its allocation", forward(x + 8, y, nullptr, 0, bnd, OPS_BN));
    say("y on the host", forward(x, &one, nullptr, 0, bnd, OPS_BN));
    say("workspace larger than its allocation", forward(x, y, p, 4096, bnd, OPS_BN));
    say("data descriptor as the scale's", forward(x, y, nullptr, 0, d, OPS_BN));
    say("fused activation", forward(x, y, nullptr, 0, bnd, OPS_BN_ACTIVATION));
    say("negative epsilon", cudnnBatchNormalizationForwardInference(handle, bn_mode(SPATIAL), &one, &zero, d, x, d, y,
                                                                     bnd, p, p + C, p + 2 * C, p + 3 * C, -1.0));
    say("unknown mode", cudnnBatchNormalizationForwardInference(handle, bn_mode(7), &one, &zero, d, x, d, y, bnd, p,
                                                                 p + C, p + 2 * C, p + 3 * C, EPS));
    say("one running statistic", cudnnBatchNormalizationForwardTraining(handle, bn_mode(SPATIAL), &one, &zero, d, x, d,
                                                                         y, bnd, p, p + C, FACTOR, p + 2 * C, nullptr,
                                                                         EPS, nullptr, nullptr));
    cudnnTensorDescriptor_t gone;
    DNN(cudnnCreateTensorDescriptor(&gone));
    DNN(cudnnDestroyTensorDescriptor(gone));
    say("destroyed descriptor", cudnnGetTensorSizeInBytes(gone, &bytes));
    cudnnRNNDescriptor_t rnn;
    say("legacy RNN descriptor", cudnnCreateRNNDescriptor(&rnn));
    char last[128];
    cudnnGetLastErrorString(last, sizeof last);
    std::printf("hostile: last error names %s\n", std::strstr(last, "cudnnCreateRNNDescriptor") ? "the call" : last);
    // Nothing changed: the descriptors and the handle still work.
    DNN(forward(x, y, nullptr, 0, bnd, OPS_BN));
    DNN(cudnnGetTensorSizeInBytes(d, &bytes));
    std::printf("hostile: the handle and descriptors still work (%zu bytes)\n", bytes);
    // The same call again, with x past its allocation: it has succeeded with these
    // descriptors, so it goes without waiting; the failure comes back from the next call on
    // the handle, as an asynchronous error.
    say("x past its allocation, once proven", forward(x + 8, y, nullptr, 0, bnd, OPS_BN));
    cudaStream_t on;
    say("the next call on the handle", cudnnGetStream(handle, &on));
    say("the call after it", cudnnGetStream(handle, &on));
    for (void *q : {(void *)x, (void *)y, (void *)p}) CHECK(cudaFree(q));
    DNN(cudnnDestroyTensorDescriptor(d));
    DNN(cudnnDestroyTensorDescriptor(bnd));
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    std::printf("cudnn major version: %zu\n", cudnnGetVersion() / 10000);
    cudnnHandle_t handle;
    DNN(cudnnCreate(&handle));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    DNN(cudnnSetStream(handle, stream));
    if (!std::strcmp(mode, "hostile")) {
        hostile(handle);
        DNN(cudnnDestroy(handle));
        std::printf("done\n");
        return 0;
    }
    if (!std::strcmp(mode, "checkpoint")) {
        cudnnTensorDescriptor_t xd = tensor(1, true, DATA_FLOAT), bnd;
        DNN(cudnnCreateTensorDescriptor(&bnd));
        DNN(cudnnDeriveBNTensorDescriptor(bnd, xd, bn_mode(SPATIAL)));
        cudnnTensorDescriptor_t dropped = tensor(0, false, DATA_HALF);
        DNN(cudnnDestroyTensorDescriptor(dropped));
        std::printf("cudnn ready\n");
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::seconds(3));
        describe(xd);
        describe(bnd);
        DNN(cudnnDestroyTensorDescriptor(xd));
        DNN(cudnnDestroyTensorDescriptor(bnd));
        bool ok = run_case(handle, {"after the restore: nhwc float", true, false, SPATIAL, 1});
        DNN(cudnnDestroy(handle));
        std::printf("done\n");
        return ok ? 0 : 1;
    }
    cudnnTensorDescriptor_t shown = tensor(3, true, DATA_HALF);
    describe(shown);
    cudnnDataType_t t;
    int n, c, h, w, ns, cs, hs, ws;
    DNN(cudnnGetTensor4dDescriptor(shown, &t, &n, &c, &h, &w, &ns, &cs, &hs, &ws));
    std::printf("4d: %d %d %d %d, strides %d %d %d %d\n", n, c, h, w, ns, cs, hs, ws);
    DNN(cudnnDestroyTensorDescriptor(shown));
    const Case cases[] = {
        {"nchw float spatial", false, false, SPATIAL, 0},
        {"nhwc float spatial persistent", true, false, SPATIAL_PERSISTENT, 1},
        {"nchw half spatial", false, true, SPATIAL, 2},
        {"nhwc half spatial persistent", true, true, SPATIAL_PERSISTENT, 3},
        {"nchw float per activation", false, false, PER_ACTIVATION, 2},
    };
    bool ok = true;
    for (const Case &k : cases) ok = run_case(handle, k) && ok;
    ok = run_plain(handle) && ok;
    ok = set_tensor_types(handle) && ok;
    ok = repeated(handle, stream, std::atoi(mode)) && ok;
    CHECK(cudaStreamDestroy(stream));
    DNN(cudnnDestroy(handle));
    std::printf("done\n");
    return ok ? 0 : 1;
}
