// CUDA arrays, texture and surface objects and a conditional graph node kept across a
// checkpoint: a 2D array written by a kernel through a surface object and read through a
// texture object, a layered array read with tex2DLayered, a mipmapped array whose levels were
// filled through level handles and are sampled with tex2DLod, a texture of linear memory, and a
// graph with a while node counting down in its body's kernel (its handle assigned its default
// at each launch). Everything is made, then (with `pause`) the program prints "arrays ready"
// and sleeps 3 s, so that a test stops and restores its session there; afterwards every object
// is used again by the same handles and values, and the arrays' contents must be what they
// were. Checks its own results; prints only what CUDA determines.
//
// Older headers (CUDA 11.8, CI's) lack conditional nodes: as in graph_conditional.cu, what
// this program uses of them is declared below and the program is built as PTX only there.
#include <dlfcn.h>
#include <cstring>
#include <unistd.h>
#include <vector>
#include "check.h"

#if CUDART_VERSION < 12040
typedef unsigned long long cudaGraphConditionalHandle;
enum { cudaGraphCondAssignDefault = 1 };
enum cudaGraphConditionalNodeType { cudaGraphCondTypeIf = 0, cudaGraphCondTypeWhile = 1, cudaGraphCondTypeSwitch = 2 };
struct cudaConditionalNodeParams {
    cudaGraphConditionalHandle handle;
    enum cudaGraphConditionalNodeType type;
    unsigned int size;
    cudaGraph_t *phGraph_out;
};
static const int cudaGraphNodeTypeConditional = 13;
// cudaGraphNodeParams of CUDA 12.2+: the type, reserved words, a union of 29 words, a reserved word.
struct GraphNodeParams {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        struct cudaConditionalNodeParams conditional;
    };
    long long reserved2;
};
extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

template <typename F> static F runtime_fn(const char *name) {
    F f = (F)dlsym(RTLD_DEFAULT, name);
    if (!f) {
        std::printf("the CUDA runtime lacks %s\n", name);
        std::exit(1);
    }
    return f;
}
static cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle *h, cudaGraph_t g, unsigned int value,
                                                    unsigned int flags) {
    typedef cudaError_t (*Fn)(cudaGraphConditionalHandle *, cudaGraph_t, unsigned int, unsigned int);
    return runtime_fn<Fn>("cudaGraphConditionalHandleCreate")(h, g, value, flags);
}
static cudaError_t add_node(cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps, size_t count,
                            GraphNodeParams *p) {
    typedef cudaError_t (*Fn)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, const void *, size_t,
                              GraphNodeParams *);
    return runtime_fn<Fn>("cudaGraphAddNode_v2")(node, g, deps, nullptr, count, p);
}
#else
typedef cudaGraphNodeParams GraphNodeParams;
static cudaError_t add_node(cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps, size_t count,
                            GraphNodeParams *p) {
#if CUDART_VERSION >= 13000
    return cudaGraphAddNode(node, g, deps, nullptr, count, p);
#else
    return cudaGraphAddNode_v2(node, g, deps, nullptr, count, p);
#endif
}
#endif


const int W = 16, H = 8, LAYERS = 3, MIP = 16, LEVELS = 3, N = 64;

__global__ void write_surface(cudaSurfaceObject_t s, int w, int h, float add) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) surf2Dwrite((float)(x * 100 + y) + add, s, x * (int)sizeof(float), y);
}

__global__ void read_texture(cudaTextureObject_t t, float *out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}

__global__ void read_layers(cudaTextureObject_t t, float *out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y, layer = blockIdx.x;
    if (x < w && y < h) out[(layer * h + y) * w + x] = tex2DLayered<float>(t, x + 0.5f, y + 0.5f, layer);
}

__global__ void read_levels(cudaTextureObject_t t, float *out) {
    int l = threadIdx.x;
    out[l] = tex2DLod<float>(t, 0.5f, 0.5f, (float)l);
}

__global__ void read_linear(cudaTextureObject_t t, int *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<int>(t, i) * 2;
}

// A while loop's body: one step counted down; the loop goes on while steps remain.
__global__ void count_down(int *steps, int *done, cudaGraphConditionalHandle handle) {
    *steps -= 1;
    *done += 1;
    cudaGraphSetConditional(handle, *steps > 0 ? 1 : 0);
}

static cudaTextureObject_t texture_of(const cudaResourceDesc &res, bool mipmapped) {
    cudaTextureDesc td;
    std::memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = mipmapped;
    if (mipmapped) {
        td.mipmapFilterMode = cudaFilterModePoint;
        td.maxMipmapLevelClamp = LEVELS - 1;
    }
    cudaTextureObject_t t = 0;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

static cudaResourceDesc array_resource(cudaArray_t a) {
    cudaResourceDesc res;
    std::memset(&res, 0, sizeof res);
    res.resType = cudaResourceTypeArray;
    res.res.array.array = a;
    return res;
}

static int read_int(const int *d) {
    int h;
    CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    return h;
}

static void write_int(int *d, int value) { CHECK(cudaMemcpy(d, &value, sizeof value, cudaMemcpyHostToDevice)); }

int main(int argc, char **argv) {
    const bool pause = argc > 1 && std::strcmp(argv[1], "pause") == 0;
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();

    // A 2D array written through a surface object, read through a texture object.
    cudaArray_t plain;
    CHECK(cudaMallocArray(&plain, &fdesc, W, H, cudaArraySurfaceLoadStore));
    cudaSurfaceObject_t surf;
    cudaResourceDesc res = array_resource(plain);
    CHECK(cudaCreateSurfaceObject(&surf, &res));
    cudaTextureObject_t tex = texture_of(res, false);
    write_surface<<<1, dim3(W, H)>>>(surf, W, H, 0.0f);
    CHECK_LAUNCH();

    // A layered array, each layer copied from the host.
    cudaArray_t layered;
    CHECK(cudaMalloc3DArray(&layered, &fdesc, make_cudaExtent(W, H, LAYERS), cudaArrayLayered));
    std::vector<float> texels(W * H * LAYERS);
    for (int i = 0; i < W * H * LAYERS; i++) texels[i] = (float)(i * 3 + 1);
    cudaMemcpy3DParms p;
    std::memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(texels.data(), W * sizeof(float), W, H);
    p.dstArray = layered;
    p.extent = make_cudaExtent(W, H, LAYERS);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaTextureObject_t layers_tex = texture_of(array_resource(layered), false);

    // A mipmapped array, each level filled through its level handle with its own value.
    cudaMipmappedArray_t mip;
    CHECK(cudaMallocMipmappedArray(&mip, &fdesc, make_cudaExtent(MIP, MIP, 0), LEVELS));
    cudaArray_t level_of[LEVELS];
    for (int l = 0; l < LEVELS; l++) {
        CHECK(cudaGetMipmappedArrayLevel(&level_of[l], mip, l));
        int side = MIP >> l;
        std::vector<float> level(side * side, (float)(l + 1) * 10.0f);
        CHECK(cudaMemcpy2DToArray(level_of[l], 0, 0, level.data(), side * sizeof(float), side * sizeof(float), side,
                                  cudaMemcpyHostToDevice));
    }
    cudaResourceDesc mres;
    std::memset(&mres, 0, sizeof mres);
    mres.resType = cudaResourceTypeMipmappedArray;
    mres.res.mipmap.mipmap = mip;
    cudaTextureObject_t mip_tex = texture_of(mres, true);

    // A texture of linear memory.
    int *linear;
    CHECK(cudaMalloc(&linear, N * sizeof(int)));
    std::vector<int> ints(N);
    for (int i = 0; i < N; i++) ints[i] = i * i - 7;
    CHECK(cudaMemcpy(linear, ints.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    cudaResourceDesc lres;
    std::memset(&lres, 0, sizeof lres);
    lres.resType = cudaResourceTypeLinear;
    lres.res.linear.devPtr = linear;
    lres.res.linear.desc = cudaCreateChannelDesc<int>();
    lres.res.linear.sizeInBytes = N * sizeof(int);
    cudaTextureObject_t linear_tex = texture_of(lres, false);

    // A graph with a while node whose handle is assigned its default (1) at each launch.
    int *steps, *done;
    CHECK(cudaMalloc(&steps, sizeof(int)));
    CHECK(cudaMalloc(&done, sizeof(int)));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
    // Aggregate-initialised: CUDA 13's struct has no default constructor (its union does not).
    GraphNodeParams gp = {(decltype(GraphNodeParams::type))cudaGraphNodeTypeConditional};
    memset((void *)&gp, 0, sizeof gp);
    gp.type = (decltype(gp.type))cudaGraphNodeTypeConditional;
    gp.conditional.handle = h;
    gp.conditional.type = cudaGraphCondTypeWhile;
    gp.conditional.size = 1;
    cudaGraphNode_t node;
    CHECK(add_node(&node, g, nullptr, 0, &gp));
    cudaKernelNodeParams kp = {};
    void *args[] = {&steps, &done, &h};
    kp.func = (void *)count_down;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(1);
    kp.kernelParams = args;
    cudaGraphNode_t body;
    CHECK(cudaGraphAddKernelNode(&body, gp.conditional.phGraph_out[0], nullptr, 0, &kp));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    write_int(steps, 4);
    write_int(done, 0);
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaDeviceSynchronize());
    std::printf("before: while ran %d steps, %d left\n", read_int(done), read_int(steps));
    std::printf("arrays ready\n");
    std::fflush(stdout);
    if (pause) sleep(3);

    // The 2D array kept its texels, read through the same texture object.
    float *out;
    CHECK(cudaMalloc(&out, W * H * LAYERS * sizeof(float)));
    std::vector<float> host(W * H * LAYERS);
    read_texture<<<1, dim3(W, H)>>>(tex, out, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(host.data(), out, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    bool same = true;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) same &= host[y * W + x] == (float)(x * 100 + y);
    std::printf("2D array through its texture: %s\n", same ? "kept" : "changed");
    // Written again through the same surface object, read back by a copy.
    write_surface<<<1, dim3(W, H)>>>(surf, W, H, 0.5f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy2DFromArray(host.data(), W * sizeof(float), plain, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    same = true;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) same &= host[y * W + x] == (float)(x * 100 + y) + 0.5f;
    std::printf("2D array written through its surface: %s\n", same ? "yes" : "no");
    cudaResourceDesc back;
    CHECK(cudaGetTextureObjectResourceDesc(&back, tex));
    std::printf("the texture's array is the same handle: %s\n", back.res.array.array == plain ? "yes" : "no");
    CHECK(cudaGetSurfaceObjectResourceDesc(&back, surf));
    std::printf("the surface's array is the same handle: %s\n", back.res.array.array == plain ? "yes" : "no");

    // The layered array, layer by layer.
    read_layers<<<LAYERS, dim3(W, H)>>>(layers_tex, out, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(host.data(), out, W * H * LAYERS * sizeof(float), cudaMemcpyDeviceToHost));
    same = true;
    for (int i = 0; i < W * H * LAYERS; i++) same &= host[i] == texels[i];
    std::printf("layered array: %s\n", same ? "kept" : "changed");

    // The mipmapped array's levels, sampled and through the same level handles.
    read_levels<<<1, LEVELS>>>(mip_tex, out);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(host.data(), out, LEVELS * sizeof(float), cudaMemcpyDeviceToHost));
    for (int l = 0; l < LEVELS; l++) std::printf("level %d samples %.1f\n", l, host[l]);
    for (int l = 0; l < LEVELS; l++) {
        cudaArray_t again;
        CHECK(cudaGetMipmappedArrayLevel(&again, mip, l));
        float corner = 0;
        CHECK(cudaMemcpy2DFromArray(&corner, sizeof(float), level_of[l], 0, 0, sizeof(float), 1,
                                    cudaMemcpyDeviceToHost));
        std::printf("level %d: the same handle %s, corner %.1f\n", l, again == level_of[l] ? "yes" : "no", corner);
    }

    // The linear memory's texture.
    int *iout;
    CHECK(cudaMalloc(&iout, N * sizeof(int)));
    read_linear<<<1, N>>>(linear_tex, iout, N);
    CHECK_LAUNCH();
    std::vector<int> ihost(N);
    CHECK(cudaMemcpy(ihost.data(), iout, N * sizeof(int), cudaMemcpyDeviceToHost));
    same = true;
    for (int i = 0; i < N; i++) same &= ihost[i] == ints[i] * 2;
    std::printf("linear memory through its texture: %s\n", same ? "kept" : "changed");

    // The conditional graph launched again: its handle's default enters the loop.
    write_int(steps, 3);
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaDeviceSynchronize());
    std::printf("after: while ran %d steps in all, %d left\n", read_int(done), read_int(steps));
    // One executable graph of a graph with conditional nodes at a time.
    cudaGraphExec_t exec2;
    std::printf("instantiated while the first lives: %s\n",
                cudaGetErrorName(cudaGraphInstantiateWithFlags(&exec2, g, 0)));
    cudaGetLastError();
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphInstantiateWithFlags(&exec2, g, 0));
    write_int(steps, 2);
    CHECK(cudaGraphLaunch(exec2, 0));
    CHECK(cudaDeviceSynchronize());
    std::printf("instantiated again: while ran %d steps in all, %d left\n", read_int(done), read_int(steps));

    // Everything goes as usual.
    CHECK(cudaGraphExecDestroy(exec2));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaDestroyTextureObject(linear_tex));
    CHECK(cudaDestroyTextureObject(mip_tex));
    CHECK(cudaDestroyTextureObject(layers_tex));
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaFreeMipmappedArray(mip));
    CHECK(cudaFreeArray(layered));
    CHECK(cudaFreeArray(plain));
    CHECK(cudaFree(linear));
    CHECK(cudaFree(iout));
    CHECK(cudaFree(out));
    CHECK(cudaFree(steps));
    CHECK(cudaFree(done));
    std::printf("done\n");
    return 0;
}
