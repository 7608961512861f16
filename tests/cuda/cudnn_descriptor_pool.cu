// cuDNN's legacy tensor descriptors as PyTorch uses them around every batch normalization:
// made, set, read back and destroyed again for each call, many times over. Each step makes
// fresh descriptors (4d, 4d with strides, Nd, Nd with a format, derived), reads them back,
// normalises a batch with them (checked against a host reference) and destroys them; the
// shapes cuDNN 9 documents as refused (negative dimensions, an unknown type or
// format, more than CUDNN_DIM_MAX dimensions, more than 2 Giga-elements) are refused with
// cuDNN's status on descriptors of every age, and (but the last) leave them as they were.
// (Negative strides, which cuDNN 9 takes in a setter, are refused by Phos: see
// docs/architecture.md, "cuDNN's legacy descriptors".)
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#else
#include "cudnn_min.h"
#endif

#include <cmath>
#include <cstdio>
#include <cstdlib>
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

const int DATA_FLOAT = 0, FORMAT_NCHW = 0, FORMAT_NHWC = 1, SPATIAL = 1;
const int N = 2, C = 3, H = 4, W = 5, COUNT = N * C * H * W;
const double EPS = 1e-5;

static cudnnDataType_t f32() { return (cudnnDataType_t)DATA_FLOAT; }
static cudnnTensorFormat_t fmt(int f) { return (cudnnTensorFormat_t)f; }

// Prints a descriptor as cudnnGetTensorNdDescriptor and cudnnGetTensorSizeInBytes read it.
static void describe(const char *what, cudnnTensorDescriptor_t d) {
    cudnnDataType_t t;
    int nb = 0, dims[8] = {0}, strides[8] = {0};
    DNN(cudnnGetTensorNdDescriptor(d, 8, &t, &nb, dims, strides));
    size_t bytes = 0;
    DNN(cudnnGetTensorSizeInBytes(d, &bytes));
    std::printf("%s: type %d, %d dims:", what, (int)t, nb);
    for (int i = 0; i < nb; i++) std::printf(" %d/%d", dims[i], strides[i]);
    std::printf(", %zu bytes\n", bytes);
}

// One step: fresh descriptors, read back, a forward training normalisation checked on the
// host, destroyed. `print` says whether to print what it reads (the first step).
static bool step(cudnnHandle_t handle, const float *x, float *y, float *p, const std::vector<float> &hx, int k,
                 bool print) {
    cudnnTensorDescriptor_t a, b, c, e, bn;
    for (cudnnTensorDescriptor_t *d : {&a, &b, &c, &e, &bn}) DNN(cudnnCreateTensorDescriptor(d));
    int dims[4] = {N, C, H, W}, strides[4] = {C * H * W, H * W, W, 1};
    // The same NCHW shape from each setter, so any of them may describe x.
    DNN(cudnnSetTensor4dDescriptor(a, fmt(FORMAT_NCHW), f32(), N, C, H, W));
    DNN(cudnnSetTensor4dDescriptorEx(b, f32(), N, C, H, W, C * H * W, H * W, W, 1));
    DNN(cudnnSetTensorNdDescriptor(c, f32(), 4, dims, strides));
    DNN(cudnnSetTensorNdDescriptorEx(e, fmt(FORMAT_NCHW), f32(), 4, dims));
    cudnnTensorDescriptor_t xs[4] = {a, b, c, e};
    cudnnTensorDescriptor_t xd = xs[k % 4], yd = xs[(k + 1) % 4];
    DNN(cudnnDeriveBNTensorDescriptor(bn, xd, (cudnnBatchNormMode_t)SPATIAL));
    cudnnDataType_t t;
    int n, cc, h, w, ns, cs, hs, ws;
    DNN(cudnnGetTensor4dDescriptor(yd, &t, &n, &cc, &h, &w, &ns, &cs, &hs, &ws));
    bool ok = n == N && cc == C && h == H && w == W && ns == C * H * W && cs == H * W && hs == W && ws == 1;
    if (print) {
        describe("x", xd);
        describe("bn", bn);
        std::printf("4d: %d %d %d %d, strides %d %d %d %d\n", n, cc, h, w, ns, cs, hs, ws);
    }
    // The sizes a training step asks for (how much is cuDNN's to say: not printed).
    size_t workspace = 0, reserve = 0;
    cudnnBatchNormOps_t ops = (cudnnBatchNormOps_t)0;
    DNN(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, (cudnnBatchNormMode_t)SPATIAL, ops, xd,
                                                                 nullptr, yd, bn, nullptr, &workspace));
    DNN(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, (cudnnBatchNormMode_t)SPATIAL, ops, nullptr, xd,
                                                             &reserve));
    float one = 1, zero = 0;
    DNN(cudnnBatchNormalizationForwardTraining(handle, (cudnnBatchNormMode_t)SPATIAL, &one, &zero, xd, x, yd, y, bn,
                                               p, p + C, 0.1, p + 2 * C, p + 3 * C, EPS, p + 4 * C, p + 5 * C));
    for (cudnnTensorDescriptor_t d : {a, b, c, e, bn}) DNN(cudnnDestroyTensorDescriptor(d));
    std::vector<float> hy(COUNT);
    CHECK(cudaMemcpy(hy.data(), y, COUNT * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int ch = 0; ch < C; ch++) {
        double sum = 0, sq = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < H * W; j++) sum += hx[(i * C + ch) * H * W + j];
        double mean = sum / (N * H * W);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < H * W; j++) sq += std::pow(hx[(i * C + ch) * H * W + j] - mean, 2);
        double inv = 1 / std::sqrt(sq / (N * H * W) + EPS);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < H * W; j++) {
                int at = (i * C + ch) * H * W + j;
                worst = std::fmax(worst, std::fabs(hy[at] - (hx[at] - mean) * inv));
            }
    }
    if (worst > 1e-4) {
        std::printf("step %d: y off by %g\n", k, worst);
        ok = false;
    }
    return ok;
}

static void refused(cudnnTensorDescriptor_t d, const char *age) {
    auto say = [&](const char *what, cudnnStatus_t s) {
        std::printf("%s descriptor, %s -> %s\n", age, what, cudnnGetErrorString(s));
    };
    say("negative batch", cudnnSetTensor4dDescriptor(d, fmt(FORMAT_NCHW), f32(), -1, C, H, W));
    say("unknown data type", cudnnSetTensor4dDescriptor(d, fmt(FORMAT_NCHW), (cudnnDataType_t)99, N, C, H, W));
    say("unknown format", cudnnSetTensor4dDescriptor(d, fmt(9), f32(), N, C, H, W));
    int dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, strides[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    say("nine dimensions", cudnnSetTensorNdDescriptor(d, f32(), 9, dims, strides));
    // Nothing changed: it still has the shape it had.
    cudnnDataType_t t;
    int n, c, h, w, ns, cs, hs, ws;
    DNN(cudnnGetTensor4dDescriptor(d, &t, &n, &c, &h, &w, &ns, &cs, &hs, &ws));
    std::printf("%s descriptor still %d %d %d %d, strides %d %d %d %d\n", age, n, c, h, w, ns, cs, hs, ws);
    // Past 2 Giga-elements: refused, but cuDNN 9 keeps the dimensions given (what the
    // descriptor holds then is not documented, so it is set again before any use).
    int big[4] = {65536, 65536, 1, 1};
    say("2^32 elements", cudnnSetTensorNdDescriptorEx(d, fmt(FORMAT_NCHW), f32(), 4, big));
    DNN(cudnnSetTensor4dDescriptor(d, fmt(FORMAT_NHWC), f32(), N, C, H, W));
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? std::atoi(argv[1]) : 20;
    std::printf("cudnn major version: %zu\n", cudnnGetVersion() / 10000);
    cudnnHandle_t handle;
    DNN(cudnnCreate(&handle));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    DNN(cudnnSetStream(handle, stream));
    std::vector<float> hx(COUNT);
    for (int i = 0; i < COUNT; i++) hx[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
    float *x, *y, *p;
    CHECK(cudaMalloc(&x, COUNT * 4));
    CHECK(cudaMalloc(&y, COUNT * 4));
    CHECK(cudaMalloc(&p, 6 * C * 4));
    CHECK(cudaMemcpy(x, hx.data(), COUNT * 4, cudaMemcpyHostToDevice));
    std::vector<float> params(6 * C, 0.0f);
    for (int i = 0; i < C; i++) params[i] = 1.0f;      // scale
    for (int i = 0; i < C; i++) params[3 * C + i] = 1; // running variance
    CHECK(cudaMemcpy(p, params.data(), params.size() * 4, cudaMemcpyHostToDevice));

    // A first descriptor, refused bad shapes (made by the library).
    cudnnTensorDescriptor_t first;
    DNN(cudnnCreateTensorDescriptor(&first));
    DNN(cudnnSetTensor4dDescriptor(first, fmt(FORMAT_NHWC), f32(), N, C, H, W));
    refused(first, "a new");
    DNN(cudnnDestroyTensorDescriptor(first));

    bool ok = true;
    for (int k = 0; k < steps; k++) ok = step(handle, x, y, p, hx, k, k == 0) && ok;
    // (The count is the program's argument: what it prints does not depend on it.)
    std::printf("steps with fresh descriptors: %s\n", ok ? "ok" : "WRONG");

    // A descriptor made after many were destroyed (a reused one, through Phos): the same.
    cudnnTensorDescriptor_t later;
    DNN(cudnnCreateTensorDescriptor(&later));
    DNN(cudnnSetTensor4dDescriptor(later, fmt(FORMAT_NHWC), f32(), N, C, H, W));
    refused(later, "a later");
    describe("later", later);
    DNN(cudnnDestroyTensorDescriptor(later));

    CHECK(cudaStreamSynchronize(stream));
    for (void *q : {(void *)x, (void *)y, (void *)p}) CHECK(cudaFree(q));
    DNN(cudnnDestroy(handle));
    CHECK(cudaStreamDestroy(stream));
    std::printf("done\n");
    return ok ? 0 : 1;
}
