// The rest of an mnistCUDNN-shaped network through cuDNN's legacy API: convolution, then
// cudnnAddTensor for the bias, RELU, max pooling, cross-channel LRN and softmax, and the
// backward passes of softmax, LRN and pooling; average pooling counting the padding and not;
// the tensor operations (cudnnSetTensor, cudnnScaleTensor, cudnnTransformTensor to NHWC,
// cudnnOpTensor's ADD with a broadcast B, MUL, MIN, MAX, SQRT and NOT); pooling, LRN and
// op-tensor descriptors read back, the reductions (each operation, with the indices of MIN,
// MAX and AMAX), the pooling's output dimensions, and the convolution
// algorithm counts libcudnn answers. Every result is compared with a host reference inside the
// program, which prints pass or fail and a sum rounded to one decimal. Then misuse cuDNN
// refuses itself with CUDNN_STATUS_BAD_PARAM (a bias that does not fit, a pooled output of
// other channels, a softmax of two shapes, an unknown softmax algorithm, a zero pooling window,
// an LRN window of 17, a transform between shapes, a NULL pooling descriptor, a reduction into
// other channels).
//
// Mode `checkpoint`: prints "cudnn ready" once its pooling, LRN, op-tensor and reduce-tensor
// descriptors are set, waits three seconds, in which a checkpoint and restore may happen, then
// reads them back and pools, normalizes, multiplies and reduces with them. Mode `hostile`
// (through Phos only, as NVIDIA's library does not check device ranges): outputs past their
// allocation and on the host, made-up, wrong-kind and destroyed descriptors, indices too small
// or on the host, double data; then the descriptors still work.
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#else
#include "cudnn_min.h"
#endif

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

// cuDNN's numbers (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h), as the program's own constants.
const int DATA_FLOAT = 0, FORMAT_NCHW = 0, FORMAT_NHWC = 1, CROSS_CORRELATION = 1, FMA_MATH = 3;
const int ACT_RELU = 1, NOT_PROPAGATE_NAN = 0;
const int POOL_MAX = 0, POOL_AVG_INCLUDE = 1, POOL_AVG_EXCLUDE = 2;
const int SOFTMAX_ACCURATE = 1, SOFTMAX_LOG = 2, MODE_INSTANCE = 0, MODE_CHANNEL = 1;
const int LRN_CROSS_CHANNEL = 0;
const int OP_ADD = 0, OP_MUL = 1, OP_MIN = 2, OP_MAX = 3, OP_SQRT = 4, OP_NOT = 5;
const int REDUCE_ADD = 0, REDUCE_MUL = 1, REDUCE_MIN = 2, REDUCE_MAX = 3, REDUCE_AMAX = 4, REDUCE_AVG = 5,
          REDUCE_NORM1 = 6, REDUCE_NORM2 = 7, REDUCE_MUL_NO_ZEROS = 8, NO_INDICES = 0, FLATTENED_INDICES = 1,
          INDICES_32BIT = 0;

// N images of 1 x 12 x 12; a convolution of K 3x3 filters (10x10); max pooling 2x2 stride 2
// (5x5); an LRN over 3 of the K channels; softmax.
const int N = 2, H0 = 12, K = 4, R = 3, H1 = 10, H2 = 5;
const unsigned LRN_N = 3;
const double LRN_ALPHA = 0.5, LRN_BETA = 0.75, LRN_K = 2.0;

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

static float *zeros(size_t n) { return upload(std::vector<float>(n, 0.0f)); }

static std::vector<float> download(const float *d, size_t n) {
    std::vector<float> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

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
    // Sums that are 0 in exact arithmetic print as 0.0, whatever sign rounding leaves.
    if (std::fabs(sum) < 0.05) sum = 0;
    std::printf("%s: %s, sum %.1f\n", what, ok ? "pass" : "FAIL", sum);
    if (!ok) std::printf("  worst relative error %g\n", worst);
}

static void misuse(const char *what, cudnnStatus_t got) {
    std::printf("misuse: %s -> %s\n", what, cudnnGetErrorString(got));
}

static cudnnTensorDescriptor_t tensor(int n, int c, int h, int w, int format = FORMAT_NCHW) {
    cudnnTensorDescriptor_t t;
    DNN(cudnnCreateTensorDescriptor(&t));
    DNN(cudnnSetTensor4dDescriptor(t, fmt(format), dt(DATA_FLOAT), n, c, h, w));
    return t;
}

// Host references over NCHW planes.
static std::vector<double> pool_ref(const std::vector<double> &x, int planes, int h, int win, int pad, int stride,
                                    int out, int mode) {
    std::vector<double> y(planes * out * out);
    for (int p = 0; p < planes; p++)
        for (int oy = 0; oy < out; oy++)
            for (int ox = 0; ox < out; ox++) {
                double best = -1e30, sum = 0;
                int count = 0;
                for (int fy = 0; fy < win; fy++)
                    for (int fx = 0; fx < win; fx++) {
                        int iy = oy * stride - pad + fy, ix = ox * stride - pad + fx;
                        if (iy < 0 || ix < 0 || iy >= h || ix >= h) continue;
                        double v = x[(p * h + iy) * h + ix];
                        best = v > best ? v : best;
                        sum += v;
                        count++;
                    }
                double r = mode == POOL_MAX ? best : mode == POOL_AVG_INCLUDE ? sum / (win * win) : sum / count;
                y[(p * out + oy) * out + ox] = r;
            }
    return y;
}

static std::vector<double> pool_backward_ref(const std::vector<double> &x, const std::vector<double> &dy, int planes,
                                             int h, int win, int pad, int stride, int out, int mode) {
    std::vector<double> dx(planes * h * h, 0.0);
    for (int p = 0; p < planes; p++)
        for (int oy = 0; oy < out; oy++)
            for (int ox = 0; ox < out; ox++) {
                double g = dy[(p * out + oy) * out + ox];
                int best = -1, count = 0;
                for (int fy = 0; fy < win; fy++)
                    for (int fx = 0; fx < win; fx++) {
                        int iy = oy * stride - pad + fy, ix = ox * stride - pad + fx;
                        if (iy < 0 || ix < 0 || iy >= h || ix >= h) continue;
                        int i = (p * h + iy) * h + ix;
                        if (best < 0 || x[i] > x[best]) best = i;
                        count++;
                    }
                for (int fy = 0; fy < win; fy++)
                    for (int fx = 0; fx < win; fx++) {
                        int iy = oy * stride - pad + fy, ix = ox * stride - pad + fx;
                        if (iy < 0 || ix < 0 || iy >= h || ix >= h) continue;
                        int i = (p * h + iy) * h + ix;
                        if (mode == POOL_MAX) {
                            if (i == best) dx[i] += g;
                        } else {
                            dx[i] += g / (mode == POOL_AVG_INCLUDE ? win * win : count);
                        }
                    }
            }
    return dx;
}

// LRN over channels: scale = k + alpha / n * sum of squares in the window.
static std::vector<double> lrn_scale(const std::vector<double> &x, int n, int c, int spatial) {
    std::vector<double> s(x.size());
    int behind = (LRN_N - 1) / 2, ahead = LRN_N - 1 - behind;
    for (int b = 0; b < n; b++)
        for (int ch = 0; ch < c; ch++)
            for (int p = 0; p < spatial; p++) {
                double sum = 0;
                for (int j = ch - behind; j <= ch + ahead; j++)
                    if (j >= 0 && j < c) sum += x[(b * c + j) * spatial + p] * x[(b * c + j) * spatial + p];
                s[(b * c + ch) * spatial + p] = LRN_K + LRN_ALPHA / LRN_N * sum;
            }
    return s;
}

static std::vector<double> widen(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

// Descriptors set before a checkpoint, used after the restore.
static int after_restore(cudnnHandle_t h) {
    cudnnPoolingDescriptor_t pd;
    DNN(cudnnCreatePoolingDescriptor(&pd));
    DNN(cudnnSetPooling2dDescriptor(pd, (cudnnPoolingMode_t)POOL_MAX, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 2, 2,
                                    0, 0, 2, 2));
    cudnnLRNDescriptor_t ld;
    DNN(cudnnCreateLRNDescriptor(&ld));
    DNN(cudnnSetLRNDescriptor(ld, LRN_N, LRN_ALPHA, LRN_BETA, LRN_K));
    cudnnOpTensorDescriptor_t od;
    DNN(cudnnCreateOpTensorDescriptor(&od));
    DNN(cudnnSetOpTensorDescriptor(od, (cudnnOpTensorOp_t)OP_MUL, dt(DATA_FLOAT), (cudnnNanPropagation_t)NOT_PROPAGATE_NAN));
    cudnnReduceTensorDescriptor_t rd;
    DNN(cudnnCreateReduceTensorDescriptor(&rd));
    DNN(cudnnSetReduceTensorDescriptor(rd, (cudnnReduceTensorOp_t)REDUCE_ADD, dt(DATA_FLOAT),
                                       (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, (cudnnReduceTensorIndices_t)NO_INDICES,
                                       (cudnnIndicesType_t)INDICES_32BIT));
    std::printf("cudnn ready\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    cudnnPoolingMode_t pm;
    cudnnNanPropagation_t pn;
    int wh, ww, ph, pw, sh, sw;
    DNN(cudnnGetPooling2dDescriptor(pd, &pm, &pn, &wh, &ww, &ph, &pw, &sh, &sw));
    unsigned ln;
    double la, lb, lk;
    DNN(cudnnGetLRNDescriptor(ld, &ln, &la, &lb, &lk));
    cudnnOpTensorOp_t op;
    cudnnDataType_t ot;
    cudnnNanPropagation_t on;
    DNN(cudnnGetOpTensorDescriptor(od, &op, &ot, &on));
    cudnnReduceTensorOp_t rop;
    cudnnDataType_t rt;
    cudnnNanPropagation_t rn;
    cudnnReduceTensorIndices_t ri;
    cudnnIndicesType_t rit;
    DNN(cudnnGetReduceTensorDescriptor(rd, &rop, &rt, &rn, &ri, &rit));
    std::printf("after the restore: pooling %d window %dx%d stride %d,%d; lrn n %u k %.2f; op %d; reduce %d\n", (int)pm,
                wh, ww, sh, sw, ln, lk, (int)op, (int)rop);
    const float one = 1.0f, zero = 0.0f;
    cudnnTensorDescriptor_t xd = tensor(N, K, H1, H1), pld = tensor(N, K, H2, H2), cd = tensor(N, K, 1, 1);
    const int xn = N * K * H1 * H1, pn_ = N * K * H2 * H2;
    std::vector<float> hx(xn);
    for (int i = 0; i < xn; i++) hx[i] = (float)((i * 37) % 809) / 128.0f - 3.0f;
    float *x = upload(hx), *p = zeros(pn_), *l = zeros(pn_), *m = zeros(pn_), *c = zeros(N * K);
    DNN(cudnnPoolingForward(h, pd, &one, xd, x, &zero, pld, p));
    DNN(cudnnLRNCrossChannelForward(h, ld, (cudnnLRNMode_t)LRN_CROSS_CHANNEL, &one, pld, p, &zero, pld, l));
    DNN(cudnnOpTensor(h, od, &one, pld, l, &one, pld, p, &zero, pld, m));
    DNN(cudnnReduceTensor(h, rd, nullptr, 0, nullptr, 0, &one, pld, m, &zero, cd, c));
    std::vector<double> pooled = pool_ref(widen(hx), N * K, H1, 2, 0, 2, H2, POOL_MAX);
    std::vector<double> scale = lrn_scale(pooled, N, K, H2 * H2), sums(N * K, 0.0);
    for (int i = 0; i < pn_; i++) sums[i / (H2 * H2)] += pooled[i] * std::pow(scale[i], -LRN_BETA) * pooled[i];
    report("after the restore: pooling, lrn, op tensor and reduce", download(c, N * K), sums, 1e-4);
    std::printf("%s\n", failures == 0 ? "done" : "FAILED");
    return failures == 0 ? 0 : 1;
}

// What a careless or hostile program gets: CUDNN_STATUS_BAD_PARAM (NOT_SUPPORTED for double
// data), and the descriptors still work after.
static int hostile(cudnnHandle_t h) {
    const float one = 1.0f, zero = 0.0f;
    const int xn = N * K * H1 * H1, yn = N * K * H2 * H2;
    cudnnTensorDescriptor_t xd = tensor(N, K, H1, H1), yd = tensor(N, K, H2, H2), cd = tensor(N, K, 1, 1);
    float *x = upload(values(xn, 1)), *y = zeros(yn), *c = zeros(N * K);
    cudnnPoolingDescriptor_t pd;
    DNN(cudnnCreatePoolingDescriptor(&pd));
    DNN(cudnnSetPooling2dDescriptor(pd, (cudnnPoolingMode_t)POOL_MAX, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 2, 2,
                                    0, 0, 2, 2));
    cudnnLRNDescriptor_t ld;
    DNN(cudnnCreateLRNDescriptor(&ld));
    cudnnReduceTensorDescriptor_t rd;
    DNN(cudnnCreateReduceTensorDescriptor(&rd));
    DNN(cudnnSetReduceTensorDescriptor(rd, (cudnnReduceTensorOp_t)REDUCE_MAX, dt(DATA_FLOAT),
                                       (cudnnNanPropagation_t)NOT_PROPAGATE_NAN,
                                       (cudnnReduceTensorIndices_t)FLATTENED_INDICES, (cudnnIndicesType_t)INDICES_32BIT));
    size_t isize = 0;
    DNN(cudnnGetReductionIndicesSize(h, rd, yd, cd, &isize));
    void *ind;
    CHECK(cudaMalloc(&ind, isize));
    std::vector<float> host(xn);
    auto say = [](const char *what, cudnnStatus_t s) { std::printf("hostile: %s -> %s\n", what, cudnnGetErrorString(s)); };
    say("y past its allocation", cudnnPoolingForward(h, pd, &one, xd, x, &zero, yd, y + 8));
    say("x on the host", cudnnSoftmaxForward(h, (cudnnSoftmaxAlgorithm_t)SOFTMAX_ACCURATE,
                                             (cudnnSoftmaxMode_t)MODE_INSTANCE, &one, xd, host.data(), &zero, xd, x));
    say("a made-up tensor descriptor",
        cudnnAddTensor(h, &one, (cudnnTensorDescriptor_t)0x1234, x, &one, xd, x));
    say("a pooling descriptor as the LRN descriptor",
        cudnnLRNCrossChannelForward(h, (cudnnLRNDescriptor_t)pd, (cudnnLRNMode_t)LRN_CROSS_CHANNEL, &one, yd, y, &zero,
                                    yd, y));
    say("indices smaller than asked", cudnnReduceTensor(h, rd, ind, isize - 4, nullptr, 0, &one, yd, y, &zero, cd, c));
    say("indices on the host",
        cudnnReduceTensor(h, rd, host.data(), isize, nullptr, 0, &one, yd, y, &zero, cd, c));
    cudnnOpTensorDescriptor_t od;
    DNN(cudnnCreateOpTensorDescriptor(&od));
    DNN(cudnnSetOpTensorDescriptor(od, (cudnnOpTensorOp_t)OP_ADD, dt(DATA_FLOAT), (cudnnNanPropagation_t)NOT_PROPAGATE_NAN));
    DNN(cudnnDestroyOpTensorDescriptor(od));
    say("a destroyed op-tensor descriptor", cudnnOpTensor(h, od, &one, yd, y, &one, yd, y, &zero, yd, y));
    cudnnTensorDescriptor_t dxd, dyd;
    DNN(cudnnCreateTensorDescriptor(&dxd));
    DNN(cudnnCreateTensorDescriptor(&dyd));
    DNN(cudnnSetTensor4dDescriptor(dxd, fmt(FORMAT_NCHW), dt(1), N, K, H1, H1));
    DNN(cudnnSetTensor4dDescriptor(dyd, fmt(FORMAT_NCHW), dt(1), N, K, H2, H2));
    double *dx, *dy;
    CHECK(cudaMalloc(&dx, xn * sizeof(double)));
    CHECK(cudaMalloc(&dy, yn * sizeof(double)));
    say("double data", cudnnPoolingForward(h, pd, &one, dxd, dx, &zero, dyd, dy));
    DNN(cudnnPoolingForward(h, pd, &one, xd, x, &zero, yd, y));
    DNN(cudnnLRNCrossChannelForward(h, ld, (cudnnLRNMode_t)LRN_CROSS_CHANNEL, &one, yd, y, &zero, yd, y));
    DNN(cudnnReduceTensor(h, rd, ind, isize, nullptr, 0, &one, yd, y, &zero, cd, c));
    std::vector<float> out = download(c, N * K);
    double sum = 0;
    for (float v : out) sum += v;
    std::printf("hostile: the descriptors still work (sum %.1f)\n", sum);
    return 0;
}

int main(int argc, char **argv) {
    cudnnHandle_t h;
    DNN(cudnnCreate(&h));
    if (argc > 1 && std::strcmp(argv[1], "checkpoint") == 0) return after_restore(h);
    if (argc > 1 && std::strcmp(argv[1], "hostile") == 0) {
        hostile(h);
        std::printf("done\n");
        return 0;
    }
    const float one = 1.0f, zero = 0.0f;

    // The convolution: x (N x 1 x 12 x 12) by K 3x3 filters.
    std::vector<float> hx = values(N * H0 * H0, 1), hw = values(K * R * R, 2), hb = values(K, 3);
    float *x = upload(hx), *w = upload(hw), *bias = upload(hb);
    cudnnTensorDescriptor_t xd = tensor(N, 1, H0, H0), yd = tensor(N, K, H1, H1), bd = tensor(1, K, 1, 1);
    cudnnTensorDescriptor_t bd2 = tensor(N, K, 1, 1);
    cudnnFilterDescriptor_t wd;
    DNN(cudnnCreateFilterDescriptor(&wd));
    DNN(cudnnSetFilter4dDescriptor(wd, dt(DATA_FLOAT), fmt(FORMAT_NCHW), K, 1, R, R));
    cudnnConvolutionDescriptor_t cd;
    DNN(cudnnCreateConvolutionDescriptor(&cd));
    DNN(cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, (cudnnConvolutionMode_t)CROSS_CORRELATION,
                                        dt(DATA_FLOAT)));
    DNN(cudnnSetConvolutionMathType(cd, (cudnnMathType_t)FMA_MATH));
    int fwd = 0, bwd_data = 0, bwd_filter = 0;
    DNN(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &fwd));
    DNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &bwd_data));
    DNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &bwd_filter));
    std::printf("algorithm max counts: forward %d, backward data %d, backward filter %d\n", fwd, bwd_data,
                bwd_filter);
    size_t ws_size = 0;
    cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)0;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo, &ws_size));
    void *ws = nullptr;
    if (ws_size) CHECK(cudaMalloc(&ws, ws_size));
    float *y1 = zeros(N * K * H1 * H1);
    DNN(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, algo, ws, ws_size, &zero, yd, y1));

    // + bias (cudnnAddTensor), then RELU.
    DNN(cudnnAddTensor(h, &one, bd, bias, &one, yd, y1));
    std::vector<double> conv(N * K * H1 * H1, 0.0);
    for (int b = 0; b < N; b++)
        for (int k = 0; k < K; k++)
            for (int oy = 0; oy < H1; oy++)
                for (int ox = 0; ox < H1; ox++) {
                    double s = hb[k];
                    for (int fy = 0; fy < R; fy++)
                        for (int fx = 0; fx < R; fx++)
                            s += hx[(b * H0 + oy + fy) * H0 + ox + fx] * hw[(k * R + fy) * R + fx];
                    conv[((b * K + k) * H1 + oy) * H1 + ox] = s;
                }
    report("convolution + bias (cudnnAddTensor)", download(y1, conv.size()), conv, 1e-5);
    cudnnActivationDescriptor_t relu;
    DNN(cudnnCreateActivationDescriptor(&relu));
    DNN(cudnnSetActivationDescriptor(relu, (cudnnActivationMode_t)ACT_RELU, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN,
                                     0.0));
    float *a1 = zeros(conv.size());
    DNN(cudnnActivationForward(h, relu, &one, yd, y1, &zero, yd, a1));
    std::vector<double> act(conv.size());
    for (size_t i = 0; i < conv.size(); i++) act[i] = conv[i] > 0 ? conv[i] : 0;

    // Max pooling 2x2, stride 2.
    cudnnPoolingDescriptor_t pd;
    DNN(cudnnCreatePoolingDescriptor(&pd));
    DNN(cudnnSetPooling2dDescriptor(pd, (cudnnPoolingMode_t)POOL_MAX, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 2, 2,
                                    0, 0, 2, 2));
    cudnnPoolingMode_t pm;
    cudnnNanPropagation_t pn;
    int wh, ww, ph, pw, sh, sw;
    DNN(cudnnGetPooling2dDescriptor(pd, &pm, &pn, &wh, &ww, &ph, &pw, &sh, &sw));
    std::printf("pooling: mode %d nan %d window %dx%d padding %d,%d stride %d,%d\n", (int)pm, (int)pn, wh, ww, ph, pw,
                sh, sw);
    int on, oc, oh, ow;
    DNN(cudnnGetPooling2dForwardOutputDim(pd, yd, &on, &oc, &oh, &ow));
    std::printf("pooling output: %dx%dx%dx%d\n", on, oc, oh, ow);
    cudnnTensorDescriptor_t pld = tensor(N, K, H2, H2);
    const int pooled_n = N * K * H2 * H2;
    float *p1 = zeros(pooled_n);
    DNN(cudnnPoolingForward(h, pd, &one, yd, a1, &zero, pld, p1));
    std::vector<double> pooled = pool_ref(act, N * K, H1, 2, 0, 2, H2, POOL_MAX);
    report("max pooling", download(p1, pooled_n), pooled, 1e-6);

    // Cross-channel LRN.
    cudnnLRNDescriptor_t ld;
    DNN(cudnnCreateLRNDescriptor(&ld));
    DNN(cudnnSetLRNDescriptor(ld, LRN_N, LRN_ALPHA, LRN_BETA, LRN_K));
    unsigned ln;
    double la, lb, lk;
    DNN(cudnnGetLRNDescriptor(ld, &ln, &la, &lb, &lk));
    std::printf("lrn: n %u alpha %.2f beta %.2f k %.2f\n", ln, la, lb, lk);
    float *l1 = zeros(pooled_n);
    DNN(cudnnLRNCrossChannelForward(h, ld, (cudnnLRNMode_t)LRN_CROSS_CHANNEL, &one, pld, p1, &zero, pld, l1));
    std::vector<double> scale = lrn_scale(pooled, N, K, H2 * H2), lrn(pooled_n);
    for (int i = 0; i < pooled_n; i++) lrn[i] = pooled[i] * std::pow(scale[i], -LRN_BETA);
    report("lrn forward", download(l1, pooled_n), lrn, 1e-4);

    // Softmax over each image (accurate), and the log-softmax over the channels.
    float *sm = zeros(pooled_n), *lsm = zeros(pooled_n);
    DNN(cudnnSoftmaxForward(h, (cudnnSoftmaxAlgorithm_t)SOFTMAX_ACCURATE, (cudnnSoftmaxMode_t)MODE_INSTANCE, &one, pld,
                            l1, &zero, pld, sm));
    DNN(cudnnSoftmaxForward(h, (cudnnSoftmaxAlgorithm_t)SOFTMAX_LOG, (cudnnSoftmaxMode_t)MODE_CHANNEL, &one, pld, l1,
                            &zero, pld, lsm));
    const int image = K * H2 * H2, spatial = H2 * H2;
    std::vector<double> soft(pooled_n), logsoft(pooled_n);
    for (int b = 0; b < N; b++) {
        double mx = -1e30, sum = 0;
        for (int i = 0; i < image; i++) mx = std::fmax(mx, lrn[b * image + i]);
        for (int i = 0; i < image; i++) sum += std::exp(lrn[b * image + i] - mx);
        for (int i = 0; i < image; i++) soft[b * image + i] = std::exp(lrn[b * image + i] - mx) / sum;
        for (int p = 0; p < spatial; p++) {
            double m = -1e30, s = 0;
            for (int c = 0; c < K; c++) m = std::fmax(m, lrn[b * image + c * spatial + p]);
            for (int c = 0; c < K; c++) s += std::exp(lrn[b * image + c * spatial + p] - m);
            for (int c = 0; c < K; c++)
                logsoft[b * image + c * spatial + p] = lrn[b * image + c * spatial + p] - m - std::log(s);
        }
    }
    report("softmax (instance, accurate)", download(sm, pooled_n), soft, 1e-5);
    report("log-softmax (channel)", download(lsm, pooled_n), logsoft, 1e-5);

    // Backward: softmax, then LRN, then max pooling.
    std::vector<float> hdy = values(pooled_n, 4);
    float *dy = upload(hdy), *dsm = zeros(pooled_n), *dl = zeros(pooled_n);
    DNN(cudnnSoftmaxBackward(h, (cudnnSoftmaxAlgorithm_t)SOFTMAX_ACCURATE, (cudnnSoftmaxMode_t)MODE_INSTANCE, &one, pld,
                             sm, pld, dy, &zero, pld, dsm));
    std::vector<double> dsoft(pooled_n);
    for (int b = 0; b < N; b++) {
        double dot = 0;
        for (int i = 0; i < image; i++) dot += hdy[b * image + i] * soft[b * image + i];
        for (int i = 0; i < image; i++) dsoft[b * image + i] = soft[b * image + i] * (hdy[b * image + i] - dot);
    }
    std::vector<float> got_dsm = download(dsm, pooled_n);
    report("softmax backward", got_dsm, dsoft, 1e-5);
    DNN(cudnnLRNCrossChannelBackward(h, ld, (cudnnLRNMode_t)LRN_CROSS_CHANNEL, &one, pld, l1, pld, dsm, pld, p1, &zero,
                                     pld, dl));
    std::vector<double> g = widen(got_dsm), dlrn(pooled_n);
    {
        int behind = (LRN_N - 1) / 2, ahead = LRN_N - 1 - behind;
        for (int b = 0; b < N; b++)
            for (int c = 0; c < K; c++)
                for (int p = 0; p < spatial; p++) {
                    int i = b * image + c * spatial + p;
                    double sum = 0;
                    for (int j = c - ahead; j <= c + behind; j++) {
                        if (j < 0 || j >= K) continue;
                        int q = b * image + j * spatial + p;
                        sum += g[q] * lrn[q] / scale[q];
                    }
                    dlrn[i] = g[i] * std::pow(scale[i], -LRN_BETA) - 2 * LRN_BETA * LRN_ALPHA / LRN_N * pooled[i] * sum;
                }
    }
    std::vector<float> got_dl = download(dl, pooled_n);
    report("lrn backward", got_dl, dlrn, 1e-4);
    // The max pooling's backward pass on an input of distinct values (a window of ties would
    // leave cuDNN free to pick which element takes the gradient).
    std::vector<float> hq(conv.size());
    for (size_t i = 0; i < hq.size(); i++) hq[i] = (float)((i * 37) % 809) / 128.0f - 3.0f;
    float *q = upload(hq), *pq = zeros(pooled_n), *da = zeros(conv.size());
    DNN(cudnnPoolingForward(h, pd, &one, yd, q, &zero, pld, pq));
    DNN(cudnnPoolingBackward(h, pd, &one, pld, pq, pld, dl, yd, q, &zero, yd, da));
    report("max pooling backward", download(da, conv.size()),
           pool_backward_ref(widen(hq), widen(got_dl), N * K, H1, 2, 0, 2, H2, POOL_MAX), 1e-6);

    // Average pooling 3x3, padding 1, stride 2 (10x10 -> 5x5), counting the padding and not,
    // through an Nd descriptor; blended into what y holds (beta 0.5).
    const int win[2] = {3, 3}, pad[2] = {1, 1}, str[2] = {2, 2};
    for (int mode : {POOL_AVG_INCLUDE, POOL_AVG_EXCLUDE}) {
        cudnnPoolingDescriptor_t ad;
        DNN(cudnnCreatePoolingDescriptor(&ad));
        DNN(cudnnSetPoolingNdDescriptor(ad, (cudnnPoolingMode_t)mode, (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 2, win,
                                        pad, str));
        int nb = 0, rw[2], rp[2], rs[2];
        DNN(cudnnGetPoolingNdDescriptor(ad, 2, &pm, &pn, &nb, rw, rp, rs));
        int dims[4];
        DNN(cudnnGetPoolingNdForwardOutputDim(ad, yd, 4, dims));
        std::printf("average pooling (mode %d): %d dims window %dx%d padding %d,%d stride %d,%d -> %dx%dx%dx%d\n",
                    (int)pm, nb, rw[0], rw[1], rp[0], rp[1], rs[0], rs[1], dims[0], dims[1], dims[2], dims[3]);
        std::vector<float> prior = values(pooled_n, 5);
        float *avg = upload(prior);
        const float blend = 0.5f;
        DNN(cudnnPoolingForward(h, ad, &one, yd, a1, &blend, pld, avg));
        std::vector<double> want = pool_ref(act, N * K, H1, 3, 1, 2, H2, mode);
        for (int i = 0; i < pooled_n; i++) want[i] += 0.5 * prior[i];
        report(mode == POOL_AVG_INCLUDE ? "average pooling (padding counted)" : "average pooling (padding not counted)",
               download(avg, pooled_n), want, 1e-5);
        float *dav = zeros(conv.size());
        DNN(cudnnPoolingBackward(h, ad, &one, pld, avg, pld, dy, yd, a1, &zero, yd, dav));
        report("average pooling backward", download(dav, conv.size()),
               pool_backward_ref(act, widen(hdy), N * K, H1, 3, 1, 2, H2, mode), 1e-5);
        CHECK(cudaFree(avg));
        CHECK(cudaFree(dav));
        DNN(cudnnDestroyPoolingDescriptor(ad));
    }

    // Tensor operations on the pooled shape.
    float *t = zeros(pooled_n);
    const float half_value = 0.5f, two = 2.0f;
    DNN(cudnnSetTensor(h, pld, t, &half_value));
    DNN(cudnnScaleTensor(h, pld, t, &two));
    report("set + scale", download(t, pooled_n), std::vector<double>(pooled_n, 1.0), 0);
    cudnnTensorDescriptor_t nhwc = tensor(N, K, H2, H2, FORMAT_NHWC);
    float *tr = zeros(pooled_n);
    DNN(cudnnTransformTensor(h, &two, pld, p1, &zero, nhwc, tr));
    std::vector<double> want_tr(pooled_n);
    for (int b = 0; b < N; b++)
        for (int c = 0; c < K; c++)
            for (int p = 0; p < spatial; p++) want_tr[(b * spatial + p) * K + c] = 2 * pooled[b * image + c * spatial + p];
    report("transform to NHWC", download(tr, pooled_n), want_tr, 0);
    cudnnOpTensorDescriptor_t od;
    DNN(cudnnCreateOpTensorDescriptor(&od));
    std::vector<float> ha = values(pooled_n, 6), hbb = values(pooled_n, 7);
    float *A = upload(ha), *B = upload(hbb), *C = zeros(pooled_n);
    const float a1f = 1.0f, a2f = 0.5f;
    for (int op : {OP_ADD, OP_MUL, OP_MIN, OP_MAX, OP_SQRT, OP_NOT}) {
        DNN(cudnnSetOpTensorDescriptor(od, (cudnnOpTensorOp_t)op, dt(DATA_FLOAT), (cudnnNanPropagation_t)NOT_PROPAGATE_NAN));
        cudnnOpTensorOp_t rop;
        cudnnDataType_t rtype;
        cudnnNanPropagation_t rnan;
        DNN(cudnnGetOpTensorDescriptor(od, &rop, &rtype, &rnan));
        // ADD takes the bias as B, broadcast over the images and positions.
        bool broadcast = op == OP_ADD;
        const float *a = op == OP_SQRT ? p1 : A;
        const std::vector<double> av = op == OP_SQRT ? pooled : widen(ha);
        DNN(cudnnOpTensor(h, od, &a1f, pld, a, &a2f, broadcast ? bd : pld, broadcast ? (const float *)bias : B, &zero,
                          pld, C));
        std::vector<double> want(pooled_n);
        for (int i = 0; i < pooled_n; i++) {
            double u = av[i], v = 0.5 * (broadcast ? hb[(i / spatial) % K] : hbb[i]);
            switch (op) {
            case OP_ADD: want[i] = u + v; break;
            case OP_MUL: want[i] = u * v; break;
            case OP_MIN: want[i] = u < v ? u : v; break;
            case OP_MAX: want[i] = u > v ? u : v; break;
            case OP_SQRT: want[i] = std::sqrt(u); break;
            default: want[i] = 1 - u; break;
            }
        }
        char what[64];
        std::snprintf(what, sizeof what, "op tensor %d (read back op %d type %d)", op, (int)rop, (int)rtype);
        report(what, download(C, pooled_n), want, 1e-6);
    }

    // Reductions of each image and channel over its positions (2x4x5x5 -> 2x4x1x1), of distinct
    // values in [-0.9, 1.1]; MIN, MAX and AMAX with their indices, each of which must name an
    // element of its group holding the result.
    std::vector<float> hr(pooled_n);
    for (int i = 0; i < pooled_n; i++) hr[i] = (float)((i * 37) % 809) / 809.0f * 2.0f - 0.9f;
    float *R_in = upload(hr), *R_out = zeros(N * K);
    cudnnReduceTensorDescriptor_t rd;
    DNN(cudnnCreateReduceTensorDescriptor(&rd));
    for (int op = REDUCE_ADD; op <= REDUCE_MUL_NO_ZEROS; op++) {
        bool indexed = op == REDUCE_MIN || op == REDUCE_MAX || op == REDUCE_AMAX;
        DNN(cudnnSetReduceTensorDescriptor(rd, (cudnnReduceTensorOp_t)op, dt(DATA_FLOAT),
                                           (cudnnNanPropagation_t)NOT_PROPAGATE_NAN,
                                           (cudnnReduceTensorIndices_t)(indexed ? FLATTENED_INDICES : NO_INDICES),
                                           (cudnnIndicesType_t)INDICES_32BIT));
        cudnnReduceTensorOp_t rop;
        cudnnDataType_t rtype;
        cudnnNanPropagation_t rnan;
        cudnnReduceTensorIndices_t rind;
        cudnnIndicesType_t ritype;
        DNN(cudnnGetReduceTensorDescriptor(rd, &rop, &rtype, &rnan, &rind, &ritype));
        size_t isize = 0, wsize = 0;
        DNN(cudnnGetReductionIndicesSize(h, rd, pld, bd2, &isize));
        DNN(cudnnGetReductionWorkspaceSize(h, rd, pld, bd2, &wsize));
        void *ind = nullptr, *rws = nullptr;
        if (isize) CHECK(cudaMalloc(&ind, isize));
        if (wsize) CHECK(cudaMalloc(&rws, wsize));
        DNN(cudnnReduceTensor(h, rd, ind, isize, rws, wsize, &one, pld, R_in, &zero, bd2, R_out));
        std::vector<double> want(N * K);
        for (int g = 0; g < N * K; g++) {
            double acc = op == REDUCE_MUL || op == REDUCE_MUL_NO_ZEROS ? 1 : op == REDUCE_MIN ? 1e30 : op == REDUCE_MAX ? -1e30 : 0;
            for (int p = 0; p < spatial; p++) {
                double v = hr[g * spatial + p];
                switch (op) {
                case REDUCE_ADD: case REDUCE_AVG: acc += v; break;
                case REDUCE_MUL: acc *= v; break;
                case REDUCE_MUL_NO_ZEROS: if (v != 0) acc *= v; break;
                case REDUCE_MIN: acc = v < acc ? v : acc; break;
                case REDUCE_MAX: acc = v > acc ? v : acc; break;
                case REDUCE_AMAX: acc = std::fabs(v) > acc ? std::fabs(v) : acc; break;
                case REDUCE_NORM1: acc += std::fabs(v); break;
                default: acc += v * v; break;
                }
            }
            want[g] = op == REDUCE_AVG ? acc / spatial : op == REDUCE_NORM2 ? std::sqrt(acc) : acc;
        }
        std::vector<float> got = download(R_out, N * K);
        bool indices_ok = true;
        if (indexed) {
            std::vector<unsigned> idx(N * K);
            CHECK(cudaMemcpy(idx.data(), ind, idx.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
            for (int g = 0; g < N * K; g++) {
                if (idx[g] >= (unsigned)spatial) { indices_ok = false; continue; }
                double v = hr[g * spatial + idx[g]];
                if ((op == REDUCE_AMAX ? std::fabs(v) : v) != got[g]) indices_ok = false;
            }
        }
        char what[96];
        std::snprintf(what, sizeof what, "reduce %d (read back op %d indices %d)%s", op, (int)rop, (int)rind,
                      indexed ? (indices_ok ? ", indices pass" : ", indices FAIL") : "");
        if (!indices_ok) failures++;
        report(what, got, want, 1e-5);
        if (ind) CHECK(cudaFree(ind));
        if (rws) CHECK(cudaFree(rws));
    }

    // Misuse cuDNN refuses.
    cudnnTensorDescriptor_t bad_bias = tensor(1, K - 1, 1, 1), other_channels = tensor(N, K - 1, H2, H2);
    misuse("a bias of other channels", cudnnAddTensor(h, &one, bad_bias, bias, &one, yd, y1));
    misuse("a pooled output of other channels", cudnnPoolingForward(h, pd, &one, yd, a1, &zero, other_channels, p1));
    misuse("a softmax of two shapes", cudnnSoftmaxForward(h, (cudnnSoftmaxAlgorithm_t)SOFTMAX_ACCURATE,
                                                          (cudnnSoftmaxMode_t)MODE_INSTANCE, &one, pld, l1, &zero,
                                                          other_channels, sm));
    misuse("an unknown softmax algorithm", cudnnSoftmaxForward(h, (cudnnSoftmaxAlgorithm_t)7,
                                                               (cudnnSoftmaxMode_t)MODE_INSTANCE, &one, pld, l1, &zero,
                                                               pld, sm));
    // Bad settings, on descriptors of their own (what a refused setter leaves is cuDNN's affair).
    cudnnPoolingDescriptor_t bad_pd;
    cudnnLRNDescriptor_t bad_ld;
    DNN(cudnnCreatePoolingDescriptor(&bad_pd));
    DNN(cudnnCreateLRNDescriptor(&bad_ld));
    misuse("a zero pooling window", cudnnSetPooling2dDescriptor(bad_pd, (cudnnPoolingMode_t)POOL_MAX,
                                                                (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, 0, 2, 0, 0,
                                                                2, 2));
    misuse("an LRN window of 17", cudnnSetLRNDescriptor(bad_ld, 17, LRN_ALPHA, LRN_BETA, LRN_K));
    DNN(cudnnDestroyPoolingDescriptor(bad_pd));
    DNN(cudnnDestroyLRNDescriptor(bad_ld));
    misuse("a transform between shapes", cudnnTransformTensor(h, &one, pld, p1, &zero, other_channels, tr));
    misuse("a NULL pooling descriptor", cudnnPoolingForward(h, nullptr, &one, yd, a1, &zero, pld, p1));
    DNN(cudnnSetReduceTensorDescriptor(rd, (cudnnReduceTensorOp_t)REDUCE_ADD, dt(DATA_FLOAT),
                                       (cudnnNanPropagation_t)NOT_PROPAGATE_NAN, (cudnnReduceTensorIndices_t)NO_INDICES,
                                       (cudnnIndicesType_t)INDICES_32BIT));
    misuse("a reduction into other channels",
           cudnnReduceTensor(h, rd, nullptr, 0, nullptr, 0, &one, pld, R_in, &zero, bad_bias, R_out));

    // The calls still work after the misuse.
    DNN(cudnnPoolingForward(h, pd, &one, yd, a1, &zero, pld, p1));
    report("max pooling after the misuse", download(p1, pooled_n), pooled, 1e-6);

    DNN(cudnnDestroyReduceTensorDescriptor(rd));
    DNN(cudnnDestroyOpTensorDescriptor(od));
    DNN(cudnnDestroyLRNDescriptor(ld));
    DNN(cudnnDestroyPoolingDescriptor(pd));
    DNN(cudnnDestroyActivationDescriptor(relu));
    DNN(cudnnDestroyConvolutionDescriptor(cd));
    DNN(cudnnDestroyFilterDescriptor(wd));
    for (cudnnTensorDescriptor_t d : {xd, yd, bd, bd2, pld, nhwc, bad_bias, other_channels})
        DNN(cudnnDestroyTensorDescriptor(d));
    DNN(cudnnDestroy(h));
    std::printf(failures ? "FAILED\n" : "done\n");
    return failures ? 1 : 0;
}
