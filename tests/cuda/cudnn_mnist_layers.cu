// The layers of a small mnistCUDNN-shaped network through cuDNN's legacy API, with cuBLAS for
// the fully connected layer: filter and convolution descriptors from each setter, read back;
// the convolution's output dimensions; the algorithm queries (the heuristics, Find and FindEx
// on the program's buffers) and their workspace sizes; convolution forward, the fused
// convolution + bias + RELU, a tanh activation, the fully connected layer (cublasSgemm), then
// convolution backward data, filter and bias and the activation's backward pass. Every result
// is compared with a host reference inside the program, which prints pass or fail and a sum
// rounded to two decimals (the inputs are multiples of 1/8, so the convolutions are exact in
// float whatever algorithm cuDNN picks, and FMA math keeps TF32 out). Then misuse that cuDNN
// itself refuses (a negative filter dimension, a zero stride, a zero group count, an output
// descriptor of the wrong shape).
//
// Modes: none (the above), `hostile` (through Phos only, as NVIDIA's library does not check
// device ranges: buffers outside the session's memory, a host workspace, destroyed, made-up
// and wrong-kind descriptors, double data, a workspace smaller than the algorithm needs),
// `checkpoint` (prints "cudnn ready" once its filter, convolution and activation descriptors
// are set, waits three seconds, in which a checkpoint and restore may happen, then reads them
// back and runs a grouped convolution and a tanh with them).
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#else
#include "cudnn_min.h"
#endif
#include <cublas_v2.h>

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

#define BLAS(call)                                                                                     \
    do {                                                                                               \
        cublasStatus_t s_ = (call);                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            std::printf("FAILED: %s -> %d at %s:%d\n", #call, (int)s_, __FILE__, __LINE__);            \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

// cuDNN's numbers (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h), as the program's own constants.
const int DATA_FLOAT = 0, DATA_DOUBLE = 1, FORMAT_NCHW = 0, CROSS_CORRELATION = 1, FMA_MATH = 3;
const int ACT_RELU = 1, ACT_TANH = 2, NOT_PROPAGATE_NAN = 0;

// The network: N images of 1 x 12 x 12; conv1 8 filters of 5x5 (pad 1, stride 1: 10x10);
// conv2 4 filters of 3x3 over 8 channels in 2 groups (pad 1, stride 2: 5x5); a fully connected
// layer of 10 outputs.
const int N = 2, C0 = 1, H0 = 12, K1 = 8, R1 = 5, P1 = 1, H1 = 10;
const int K2 = 4, R2 = 3, G2 = 2, P2 = 1, S2 = 2, H2 = 5, FC_IN = K2 * H2 * H2, FC_OUT = 10;

static cudnnDataType_t dt(int t) { return (cudnnDataType_t)t; }
static cudnnTensorFormat_t fmt(int f) { return (cudnnTensorFormat_t)f; }

// Deterministic values: multiples of 1/8 in [-1, 1].
static std::vector<float> values(size_t n, int seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)((int)((i * 37 + seed * 11) % 17) - 8) / 8.0f;
    return v;
}

static float *upload(const std::vector<float> &v) {
    float *d;
    CHECK(cudaMalloc(&d, v.size() * sizeof(float)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> download(const float *d, size_t n) {
    std::vector<float> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

// Compare with the reference and print pass or fail and the sum (two decimals).
static int failures = 0;
static void report(const char *what, const std::vector<float> &got, const std::vector<double> &want, double tol) {
    double worst = 0, sum = 0;
    for (size_t i = 0; i < want.size(); i++) {
        double err = std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i]));
        if (!(err <= worst)) worst = err;
        sum += got[i];
    }
    bool ok = worst <= tol;
    if (!ok) failures++;
    std::printf("%s: %s, sum %.2f\n", what, ok ? "pass" : "FAIL", sum);
    if (!ok) std::printf("  worst relative error %g\n", worst);
}

// Host convolution (cross-correlation), NCHW, groups, square padding and stride. `mode`: 0
// forward (x, w -> y), 1 backward data (w, dy -> dx), 2 backward filter (x, dy -> dw).
struct Conv {
    int n, c, h, k, r, pad, stride, groups, out;
    template <class F> void taps(F f) const {
        int cg = c / groups, kg = k / groups;
        for (int b = 0; b < n; b++)
            for (int o = 0; o < k; o++)
                for (int ci = 0; ci < cg; ci++)
                    for (int oy = 0; oy < out; oy++)
                        for (int ox = 0; ox < out; ox++)
                            for (int fy = 0; fy < r; fy++)
                                for (int fx = 0; fx < r; fx++) {
                                    int iy = oy * stride - pad + fy, ix = ox * stride - pad + fx;
                                    if (iy < 0 || ix < 0 || iy >= h || ix >= h) continue;
                                    int ch = (o / kg) * cg + ci;
                                    f(((b * c + ch) * h + iy) * h + ix, ((o * cg + ci) * r + fy) * r + fx,
                                      ((b * k + o) * out + oy) * out + ox);
                                }
    }
    size_t xs() const { return (size_t)n * c * h * h; }
    size_t ws() const { return (size_t)k * (c / groups) * r * r; }
    size_t ys() const { return (size_t)n * k * out * out; }
};

static cudnnTensorDescriptor_t tensor4(int n, int c, int h, int w) {
    cudnnTensorDescriptor_t t;
    DNN(cudnnCreateTensorDescriptor(&t));
    DNN(cudnnSetTensor4dDescriptor(t, fmt(FORMAT_NCHW), dt(DATA_FLOAT), n, c, h, w));
    return t;
}

static void hostile(cudnnHandle_t dnn);
static int after_restore(cudnnHandle_t dnn);

int main(int argc, char **argv) {
    bool hostile_mode = argc > 1 && std::strcmp(argv[1], "hostile") == 0;
    cudnnHandle_t dnn;
    DNN(cudnnCreate(&dnn));
    cublasHandle_t blas;
    BLAS(cublasCreate(&blas));
    if (hostile_mode) {
        hostile(dnn);
        std::printf("done\n");
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "checkpoint") == 0) return after_restore(dnn);

    // Descriptors, from each setter, read back.
    cudnnFilterDescriptor_t w1d, w2d;
    DNN(cudnnCreateFilterDescriptor(&w1d));
    DNN(cudnnCreateFilterDescriptor(&w2d));
    DNN(cudnnSetFilter4dDescriptor(w1d, dt(DATA_FLOAT), fmt(FORMAT_NCHW), K1, C0, R1, R1));
    int w2dims[4] = {K2, K1 / G2, R2, R2};
    DNN(cudnnSetFilterNdDescriptor(w2d, dt(DATA_FLOAT), fmt(FORMAT_NCHW), 4, w2dims));
    cudnnConvolutionDescriptor_t c1, c2;
    DNN(cudnnCreateConvolutionDescriptor(&c1));
    DNN(cudnnCreateConvolutionDescriptor(&c2));
    DNN(cudnnSetConvolution2dDescriptor(c1, P1, P1, 1, 1, 1, 1, (cudnnConvolutionMode_t)CROSS_CORRELATION,
                                        dt(DATA_FLOAT)));
    int pads[2] = {P2, P2}, strides[2] = {S2, S2}, dilations[2] = {1, 1};
    DNN(cudnnSetConvolutionNdDescriptor(c2, 2, pads, strides, dilations, (cudnnConvolutionMode_t)CROSS_CORRELATION,
                                        dt(DATA_FLOAT)));
    DNN(cudnnSetConvolutionGroupCount(c2, G2));
    DNN(cudnnSetConvolutionMathType(c1, (cudnnMathType_t)FMA_MATH));
    DNN(cudnnSetConvolutionMathType(c2, (cudnnMathType_t)FMA_MATH));
    {
        cudnnDataType_t t;
        cudnnTensorFormat_t f;
        int k, c, h, w, nb, dims[4];
        DNN(cudnnGetFilter4dDescriptor(w2d, &t, &f, &k, &c, &h, &w));
        DNN(cudnnGetFilterNdDescriptor(w1d, 4, &t, &f, &nb, dims));
        size_t bytes;
        DNN(cudnnGetFilterSizeInBytes(w2d, &bytes));
        std::printf("filters: %dx%dx%dx%d type %d format %d; %d dims %dx%dx%dx%d; %zu bytes\n", k, c, h, w, (int)t,
                    (int)f, nb, dims[0], dims[1], dims[2], dims[3], bytes);
        int ph, pw, u, v, dh, dw, len, pa[2], sa[2], da[2], groups;
        cudnnConvolutionMode_t mode;
        cudnnDataType_t compute;
        cudnnMathType_t math;
        DNN(cudnnGetConvolution2dDescriptor(c2, &ph, &pw, &u, &v, &dh, &dw, &mode, &compute));
        DNN(cudnnGetConvolutionNdDescriptor(c1, 2, &len, pa, sa, da, &mode, &compute));
        DNN(cudnnGetConvolutionGroupCount(c2, &groups));
        DNN(cudnnGetConvolutionMathType(c1, &math));
        std::printf("convolutions: pad %d,%d stride %d,%d dilation %d,%d; %d dims pad %d stride %d mode %d compute %d; "
                    "groups %d math %d\n",
                    ph, pw, u, v, dh, dw, len, pa[0], sa[0], (int)mode, (int)compute, groups, (int)math);
    }

    // The data and the layers' shapes.
    cudnnTensorDescriptor_t xd = tensor4(N, C0, H0, H0), y1d = tensor4(N, K1, H1, H1), b1d = tensor4(1, K1, 1, 1);
    cudnnTensorDescriptor_t y2d = tensor4(N, K2, H2, H2), b2d = tensor4(1, K2, 1, 1);
    {
        int n, c, h, w, dims[4];
        DNN(cudnnGetConvolution2dForwardOutputDim(c1, xd, w1d, &n, &c, &h, &w));
        DNN(cudnnGetConvolutionNdForwardOutputDim(c2, y1d, w2d, 4, dims));
        std::printf("output dims: %dx%dx%dx%d, %dx%dx%dx%d\n", n, c, h, w, dims[0], dims[1], dims[2], dims[3]);
    }
    Conv conv1{N, C0, H0, K1, R1, P1, 1, 1, H1}, conv2{N, K1, H1, K2, R2, P2, S2, G2, H2};
    std::vector<float> x = values(conv1.xs(), 1), w1 = values(conv1.ws(), 2), b1 = values(K1, 3);
    std::vector<float> w2 = values(conv2.ws(), 4), b2 = values(K2, 5), wfc = values(FC_OUT * FC_IN, 6);
    float *dx_in = upload(x), *dw1 = upload(w1), *db1 = upload(b1), *dw2 = upload(w2), *db2 = upload(b2);
    float *dwfc = upload(wfc);
    float *dy1, *dy2, *dh2, *dlogits;
    CHECK(cudaMalloc(&dy1, conv1.ys() * 4));
    CHECK(cudaMalloc(&dy2, conv2.ys() * 4));
    CHECK(cudaMalloc(&dh2, conv2.ys() * 4));
    CHECK(cudaMalloc(&dlogits, N * FC_OUT * 4));

    // Algorithms: counts, heuristics, searches; each answers at least one that works.
    int fwd_max, bwd_data_max, bwd_filter_max;
    DNN(cudnnGetConvolutionForwardAlgorithmMaxCount(dnn, &fwd_max));
    DNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(dnn, &bwd_data_max));
    DNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(dnn, &bwd_filter_max));
    // Not printed: NVIDIA's libcudnn 9 counts more than its enums name (10 8 9 on the H100).
    std::printf("algorithm counts: %s\n",
                fwd_max >= 1 && bwd_data_max >= 1 && bwd_filter_max >= 1 ? "at least one each" : "NONE");
    std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(fwd_max);
    int returned = 0;
    DNN(cudnnGetConvolutionForwardAlgorithm_v7(dnn, xd, w1d, c1, y1d, fwd_max, &returned, fwd.data()));
    EXPECT(returned >= 1 && fwd[0].status == CUDNN_STATUS_SUCCESS);
    cudnnConvolutionFwdAlgo_t algo1 = fwd[0].algo;
    DNN(cudnnFindConvolutionForwardAlgorithm(dnn, y1d, w2d, c2, y2d, fwd_max, &returned, fwd.data()));
    EXPECT(returned >= 1 && fwd[0].status == CUDNN_STATUS_SUCCESS);
    cudnnConvolutionFwdAlgo_t algo2 = fwd[0].algo;
    size_t ws1 = 0, ws2 = 0;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(dnn, xd, w1d, c1, y1d, algo1, &ws1));
    DNN(cudnnGetConvolutionForwardWorkspaceSize(dnn, y1d, w2d, c2, y2d, algo2, &ws2));
    size_t ws_bytes = (ws1 > ws2 ? ws1 : ws2) + (1 << 20);
    void *ws;
    CHECK(cudaMalloc(&ws, ws_bytes));
    DNN(cudnnFindConvolutionForwardAlgorithmEx(dnn, xd, dx_in, w1d, dw1, c1, y1d, dy1, fwd_max, &returned, fwd.data(),
                                               ws, ws_bytes));
    EXPECT(returned >= 1 && fwd[0].status == CUDNN_STATUS_SUCCESS && fwd[0].memory <= ws_bytes);
    std::printf("forward algorithms: found\n");

    // conv1, fused with its bias and RELU (z is y, unread with alpha2 = 0).
    cudnnActivationDescriptor_t relu, tanh_act;
    DNN(cudnnCreateActivationDescriptor(&relu));
    DNN(cudnnCreateActivationDescriptor(&tanh_act));
    DNN(cudnnSetActivationDescriptor(relu, (cudnnActivationMode_t)ACT_RELU, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 0.0));
    DNN(cudnnSetActivationDescriptor(tanh_act, (cudnnActivationMode_t)ACT_TANH, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN,
                                     0.0));
    {
        cudnnActivationMode_t mode;
        cudnnNanPropagation_t nan;
        double coef;
        DNN(cudnnGetActivationDescriptor(tanh_act, &mode, &nan, &coef));
        std::printf("activation: mode %d nan %d coef %.1f\n", (int)mode, (int)nan, coef);
    }
    float one = 1.0f, zero = 0.0f;
    DNN(cudnnConvolutionBiasActivationForward(dnn, &one, xd, dx_in, w1d, dw1, c1, algo1, ws, ws_bytes, &zero, y1d, dy1,
                                              b1d, db1, relu, y1d, dy1));
    std::vector<double> r1(conv1.ys(), 0.0);
    conv1.taps([&](int xi, int wi, int yi) { r1[yi] += (double)x[xi] * w1[wi]; });
    for (size_t i = 0; i < r1.size(); i++) r1[i] = std::fmax(0.0, r1[i] + b1[(i / (H1 * H1)) % K1]);
    std::vector<float> y1 = download(dy1, conv1.ys());
    report("conv1 + bias + relu", y1, r1, 1e-5);

    // conv2 (grouped, strided) with beta blending onto a prior output, then its bias through
    // the fused call with the identity activation is cuDNN's PRECOMP_GEMM-only path: the bias
    // is added by a second convolution call's blending instead.
    std::vector<float> prior = values(conv2.ys(), 7);
    CHECK(cudaMemcpy(dy2, prior.data(), prior.size() * 4, cudaMemcpyHostToDevice));
    float half_beta = 0.5f;
    DNN(cudnnConvolutionForward(dnn, &one, y1d, dy1, w2d, dw2, c2, algo2, ws, ws_bytes, &half_beta, y2d, dy2));
    std::vector<double> r2(conv2.ys(), 0.0);
    conv2.taps([&](int xi, int wi, int yi) { r2[yi] += (double)y1[xi] * w2[wi]; });
    for (size_t i = 0; i < r2.size(); i++) r2[i] += 0.5 * prior[i];
    std::vector<float> y2 = download(dy2, conv2.ys());
    report("conv2 (grouped, strided, blended)", y2, r2, 1e-5);

    // tanh, then the fully connected layer: logits (N x 10) = h2 (N x 100) . Wfc^T.
    DNN(cudnnActivationForward(dnn, tanh_act, &one, y2d, dy2, &zero, y2d, dh2));
    std::vector<double> rh(r2.size());
    for (size_t i = 0; i < rh.size(); i++) rh[i] = std::tanh((double)y2[i]);
    std::vector<float> h2 = download(dh2, conv2.ys());
    report("tanh", h2, rh, 1e-5);
    // Column-major: logits^T (10 x N) = Wfc (10 x 100, row-major = 100 x 10 col-major)^T . h2^T.
    BLAS(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, FC_OUT, N, FC_IN, &one, dwfc, FC_IN, dh2, FC_IN, &zero, dlogits,
                     FC_OUT));
    std::vector<double> rl(N * FC_OUT, 0.0);
    for (int b = 0; b < N; b++)
        for (int o = 0; o < FC_OUT; o++)
            for (int i = 0; i < FC_IN; i++) rl[b * FC_OUT + o] += (double)h2[b * FC_IN + i] * wfc[o * FC_IN + i];
    report("fully connected (cuBLAS)", download(dlogits, N * FC_OUT), rl, 1e-4);

    // Backward: a gradient at conv2's output, through tanh, conv2 (data and filter) and its bias.
    std::vector<float> g = values(conv2.ys(), 8);
    float *dgrad = upload(g), *dgrad_pre, *dgrad_y1, *dgrad_w2, *dgrad_b2;
    CHECK(cudaMalloc(&dgrad_pre, conv2.ys() * 4));
    CHECK(cudaMalloc(&dgrad_y1, conv1.ys() * 4));
    CHECK(cudaMalloc(&dgrad_w2, conv2.ws() * 4));
    CHECK(cudaMalloc(&dgrad_b2, K2 * 4));
    DNN(cudnnActivationBackward(dnn, tanh_act, &one, y2d, dh2, y2d, dgrad, y2d, dy2, &zero, y2d, dgrad_pre));
    std::vector<double> rpre(g.size());
    for (size_t i = 0; i < g.size(); i++) rpre[i] = g[i] * (1.0 - (double)h2[i] * h2[i]);
    std::vector<float> pre = download(dgrad_pre, conv2.ys());
    report("tanh backward", pre, rpre, 1e-5);
    // Exact gradients for the convolutions: the multiples of 1/8 again.
    CHECK(cudaMemcpy(dgrad_pre, g.data(), g.size() * 4, cudaMemcpyHostToDevice));

    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bd(bwd_data_max);
    DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn, w2d, y2d, c2, y1d, bwd_data_max, &returned, bd.data()));
    EXPECT(returned >= 1 && bd[0].status == CUDNN_STATUS_SUCCESS);
    DNN(cudnnFindConvolutionBackwardDataAlgorithmEx(dnn, w2d, dw2, y2d, dgrad_pre, c2, y1d, dgrad_y1, bwd_data_max,
                                                    &returned, bd.data(), ws, ws_bytes));
    EXPECT(returned >= 1 && bd[0].status == CUDNN_STATUS_SUCCESS);
    size_t need = 0;
    DNN(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn, w2d, y2d, c2, y1d, bd[0].algo, &need));
    EXPECT(need <= ws_bytes);
    DNN(cudnnConvolutionBackwardData(dnn, &one, w2d, dw2, y2d, dgrad_pre, c2, bd[0].algo, ws, ws_bytes, &zero, y1d,
                                     dgrad_y1));
    std::vector<double> rdx(conv1.ys(), 0.0);
    conv2.taps([&](int xi, int wi, int yi) { rdx[xi] += (double)w2[wi] * g[yi]; });
    report("conv2 backward data", download(dgrad_y1, conv1.ys()), rdx, 1e-5);

    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bf(bwd_filter_max);
    DNN(cudnnFindConvolutionBackwardFilterAlgorithm(dnn, y1d, y2d, c2, w2d, bwd_filter_max, &returned, bf.data()));
    EXPECT(returned >= 1 && bf[0].status == CUDNN_STATUS_SUCCESS);
    DNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn, y1d, y2d, c2, w2d, bwd_filter_max, &returned, bf.data()));
    EXPECT(returned >= 1 && bf[0].status == CUDNN_STATUS_SUCCESS);
    DNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn, y1d, y2d, c2, w2d, bf[0].algo, &need));
    EXPECT(need <= ws_bytes);
    DNN(cudnnConvolutionBackwardFilter(dnn, &one, y1d, dy1, y2d, dgrad_pre, c2, bf[0].algo, ws, ws_bytes, &zero, w2d,
                                       dgrad_w2));
    std::vector<double> rdw(conv2.ws(), 0.0);
    conv2.taps([&](int xi, int wi, int yi) { rdw[wi] += (double)y1[xi] * g[yi]; });
    report("conv2 backward filter", download(dgrad_w2, conv2.ws()), rdw, 1e-5);

    DNN(cudnnConvolutionBackwardBias(dnn, &one, y2d, dgrad_pre, &zero, b2d, dgrad_b2));
    std::vector<double> rdb(K2, 0.0);
    for (size_t i = 0; i < g.size(); i++) rdb[(i / (H2 * H2)) % K2] += g[i];
    report("conv2 backward bias", download(dgrad_b2, K2), rdb, 1e-5);

    // Misuse cuDNN itself refuses.
    auto say = [](const char *what, cudnnStatus_t s) { std::printf("misuse: %s -> %s\n", what, cudnnGetErrorString(s)); };
    say("negative filter dimension", cudnnSetFilter4dDescriptor(w1d, dt(DATA_FLOAT), fmt(FORMAT_NCHW), K1, C0, -1, R1));
    say("zero stride", cudnnSetConvolution2dDescriptor(c1, 0, 0, 0, 1, 1, 1, (cudnnConvolutionMode_t)CROSS_CORRELATION,
                                                       dt(DATA_FLOAT)));
    say("zero groups", cudnnSetConvolutionGroupCount(c1, 0));
    say("output of the wrong shape",
        cudnnConvolutionForward(dnn, &one, xd, dx_in, w1d, dw1, c1, algo1, ws, ws_bytes, &zero, y2d, dy2));
    // Set again (NVIDIA's libcudnn leaves a descriptor unusable after a refused setter), then
    // used as before.
    DNN(cudnnSetFilter4dDescriptor(w1d, dt(DATA_FLOAT), fmt(FORMAT_NCHW), K1, C0, R1, R1));
    DNN(cudnnSetConvolution2dDescriptor(c1, P1, P1, 1, 1, 1, 1, (cudnnConvolutionMode_t)CROSS_CORRELATION,
                                        dt(DATA_FLOAT)));
    DNN(cudnnSetConvolutionMathType(c1, (cudnnMathType_t)FMA_MATH));
    DNN(cudnnConvolutionForward(dnn, &one, xd, dx_in, w1d, dw1, c1, algo1, ws, ws_bytes, &zero, y1d, dy1));
    std::vector<double> plain(conv1.ys(), 0.0);
    conv1.taps([&](int xi, int wi, int yi) { plain[yi] += (double)x[xi] * w1[wi]; });
    report("conv1 after the misuse", download(dy1, conv1.ys()), plain, 1e-5);

    DNN(cudnnDestroyActivationDescriptor(relu));
    DNN(cudnnDestroyActivationDescriptor(tanh_act));
    DNN(cudnnDestroyConvolutionDescriptor(c1));
    DNN(cudnnDestroyConvolutionDescriptor(c2));
    DNN(cudnnDestroyFilterDescriptor(w1d));
    DNN(cudnnDestroyFilterDescriptor(w2d));
    BLAS(cublasDestroy(blas));
    DNN(cudnnDestroy(dnn));
    std::printf("%s\n", failures == 0 ? "done" : "FAILED");
    return failures == 0 ? 0 : 1;
}

// What careless or hostile calls get through Phos (NVIDIA's library does not check ranges).
static void hostile(cudnnHandle_t dnn) {
    auto say = [](const char *what, cudnnStatus_t s) { std::printf("hostile: %s -> %s\n", what, cudnnGetErrorString(s)); };
    cudnnTensorDescriptor_t xd = tensor4(1, 1, 8, 8), yd = tensor4(1, 2, 6, 6);
    cudnnFilterDescriptor_t wd;
    DNN(cudnnCreateFilterDescriptor(&wd));
    DNN(cudnnSetFilter4dDescriptor(wd, dt(DATA_FLOAT), fmt(FORMAT_NCHW), 2, 1, 3, 3));
    cudnnConvolutionDescriptor_t cd;
    DNN(cudnnCreateConvolutionDescriptor(&cd));
    DNN(cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, (cudnnConvolutionMode_t)CROSS_CORRELATION, dt(DATA_FLOAT)));
    float *x, *w, *y;
    CHECK(cudaMalloc(&x, 64 * 4));
    CHECK(cudaMalloc(&w, 18 * 4));
    CHECK(cudaMalloc(&y, 72 * 4));
    float one = 1.0f, zero = 0.0f;
    auto fwd = (cudnnConvolutionFwdAlgo_t)0;
    say("x past its allocation", cudnnConvolutionForward(dnn, &one, xd, x + 8, wd, w, cd, fwd, nullptr, 0, &zero, yd, y));
    float host[72];
    say("y on the host", cudnnConvolutionForward(dnn, &one, xd, x, wd, w, cd, fwd, nullptr, 0, &zero, yd, host));
    say("a host workspace", cudnnConvolutionForward(dnn, &one, xd, x, wd, w, cd, fwd, host, sizeof host, &zero, yd, y));
    say("unknown algorithm",
        cudnnConvolutionForward(dnn, &one, xd, x, wd, w, cd, (cudnnConvolutionFwdAlgo_t)99, nullptr, 0, &zero, yd, y));
    cudnnFilterDescriptor_t fake = (cudnnFilterDescriptor_t)(uintptr_t)0x7e27000000000099ull;
    say("made-up filter", cudnnConvolutionForward(dnn, &one, xd, x, fake, w, cd, fwd, nullptr, 0, &zero, yd, y));
    say("a filter as the convolution",
        cudnnConvolutionForward(dnn, &one, xd, x, wd, w, (cudnnConvolutionDescriptor_t)wd, fwd, nullptr, 0, &zero, yd, y));
    cudnnConvolutionDescriptor_t unset;
    DNN(cudnnCreateConvolutionDescriptor(&unset));
    say("a convolution never set", cudnnConvolutionForward(dnn, &one, xd, x, wd, w, unset, fwd, nullptr, 0, &zero, yd, y));
    cudnnFilterDescriptor_t gone;
    DNN(cudnnCreateFilterDescriptor(&gone));
    DNN(cudnnDestroyFilterDescriptor(gone));
    say("destroyed filter", cudnnSetFilter4dDescriptor(gone, dt(DATA_FLOAT), fmt(FORMAT_NCHW), 2, 1, 3, 3));
    cudnnTensorDescriptor_t xdouble, ydouble;
    DNN(cudnnCreateTensorDescriptor(&xdouble));
    DNN(cudnnCreateTensorDescriptor(&ydouble));
    DNN(cudnnSetTensor4dDescriptor(xdouble, fmt(FORMAT_NCHW), dt(DATA_DOUBLE), 1, 1, 8, 8));
    DNN(cudnnSetTensor4dDescriptor(ydouble, fmt(FORMAT_NCHW), dt(DATA_DOUBLE), 1, 2, 6, 6));
    cudnnFilterDescriptor_t wdouble;
    DNN(cudnnCreateFilterDescriptor(&wdouble));
    DNN(cudnnSetFilter4dDescriptor(wdouble, dt(DATA_DOUBLE), fmt(FORMAT_NCHW), 2, 1, 3, 3));
    say("double data", cudnnConvolutionForward(dnn, &one, xdouble, x, wdouble, w, cd, fwd, nullptr, 0, &zero, ydouble, y));
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int returned = 0;
    say("FindEx with y past its allocation",
        cudnnFindConvolutionForwardAlgorithmEx(dnn, xd, x, wd, w, cd, yd, y + 40, 8, &returned, perf, nullptr, 0));
    cudnnActivationDescriptor_t act;
    DNN(cudnnCreateActivationDescriptor(&act));
    say("unknown activation mode",
        cudnnSetActivationDescriptor(act, (cudnnActivationMode_t)42, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 0.0));
    say("an activation never set", cudnnActivationForward(dnn, act, &one, yd, y, &zero, yd, y));
    // A workspace smaller than the algorithm needs (only where an algorithm needs one).
    for (int a = 0; a < 8; a++) {
        size_t need = 0;
        if (cudnnGetConvolutionForwardWorkspaceSize(dnn, xd, wd, cd, yd, (cudnnConvolutionFwdAlgo_t)a, &need) ==
                CUDNN_STATUS_SUCCESS &&
            need > 0) {
            void *small;
            CHECK(cudaMalloc(&small, need));
            std::printf("hostile: workspace smaller than needed -> %s\n",
                        cudnnGetErrorString(cudnnConvolutionForward(dnn, &one, xd, x, wd, w, cd,
                                                                    (cudnnConvolutionFwdAlgo_t)a, small, need - 1, &zero,
                                                                    yd, y)));
            break;
        }
    }
    // Nothing changed: the descriptors still work.
    std::vector<float> ones(64, 1.0f), w9(18, 0.5f);
    CHECK(cudaMemcpy(x, ones.data(), 64 * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(w, w9.data(), 18 * 4, cudaMemcpyHostToDevice));
    DNN(cudnnConvolutionForward(dnn, &one, xd, x, wd, w, cd, fwd, nullptr, 0, &zero, yd, y));
    std::vector<float> out = download(y, 72);
    double sum = 0;
    for (float v : out) sum += v;
    std::printf("hostile: the descriptors still work (sum %.1f)\n", sum);
}

// Descriptors set before a checkpoint, used after the restore.
static int after_restore(cudnnHandle_t dnn) {
    cudnnFilterDescriptor_t wd;
    DNN(cudnnCreateFilterDescriptor(&wd));
    int wdims[4] = {K2, K1 / G2, R2, R2};
    DNN(cudnnSetFilterNdDescriptor(wd, dt(DATA_FLOAT), fmt(FORMAT_NCHW), 4, wdims));
    cudnnConvolutionDescriptor_t cd;
    DNN(cudnnCreateConvolutionDescriptor(&cd));
    int pads[2] = {P2, P2}, strides[2] = {S2, S2}, dilations[2] = {1, 1};
    DNN(cudnnSetConvolutionNdDescriptor(cd, 2, pads, strides, dilations, (cudnnConvolutionMode_t)CROSS_CORRELATION,
                                        dt(DATA_FLOAT)));
    DNN(cudnnSetConvolutionGroupCount(cd, G2));
    DNN(cudnnSetConvolutionMathType(cd, (cudnnMathType_t)FMA_MATH));
    cudnnActivationDescriptor_t act;
    DNN(cudnnCreateActivationDescriptor(&act));
    DNN(cudnnSetActivationDescriptor(act, (cudnnActivationMode_t)ACT_TANH, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 0.0));
    std::printf("cudnn ready\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    cudnnDataType_t t;
    cudnnTensorFormat_t f;
    int k, c, h, w, groups;
    DNN(cudnnGetFilter4dDescriptor(wd, &t, &f, &k, &c, &h, &w));
    DNN(cudnnGetConvolutionGroupCount(cd, &groups));
    std::printf("after the restore: filter %dx%dx%dx%d, %d groups\n", k, c, h, w, groups);
    cudnnTensorDescriptor_t xd = tensor4(N, K1, H1, H1), yd = tensor4(N, K2, H2, H2);
    Conv conv{N, K1, H1, K2, R2, P2, S2, G2, H2};
    std::vector<float> x = values(conv.xs(), 1), wv = values(conv.ws(), 2);
    float *dx = upload(x), *dw = upload(wv), *dy, *dt_out;
    CHECK(cudaMalloc(&dy, conv.ys() * 4));
    CHECK(cudaMalloc(&dt_out, conv.ys() * 4));
    float one = 1.0f, zero = 0.0f;
    DNN(cudnnConvolutionForward(dnn, &one, xd, dx, wd, dw, cd, (cudnnConvolutionFwdAlgo_t)0, nullptr, 0, &zero, yd, dy));
    DNN(cudnnActivationForward(dnn, act, &one, yd, dy, &zero, yd, dt_out));
    std::vector<double> ref(conv.ys(), 0.0);
    conv.taps([&](int xi, int wi, int yi) { ref[yi] += (double)x[xi] * wv[wi]; });
    for (double &v : ref) v = std::tanh(v);
    report("after the restore: convolution and tanh", download(dt_out, conv.ys()), ref, 1e-5);
    std::printf("%s\n", failures == 0 ? "done" : "FAILED");
    return failures == 0 ? 0 : 1;
}
