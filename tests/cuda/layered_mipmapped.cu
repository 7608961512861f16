// Layered, cubemap and mipmapped arrays in the style of NVIDIA's simpleLayeredTexture and
// simpleCubemapTexture: a 2D layered array filled with cudaMemcpy3D and transformed per layer
// by a kernel reading tex2DLayered; a cubemap read by texCubemap along each axis; a mipmapped
// array whose levels are reached with cudaGetMipmappedArrayLevel and sampled with tex2DLod;
// and the errors CUDA answers for misuse.
#include "check.h"
#include <cstring>
#include <vector>

const int W = 8, H = 8, LAYERS = 3;

__global__ void transform_layers(cudaTextureObject_t t, float *out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y, layer = blockIdx.x;
    if (x < w && y < h)
        out[(layer * h + y) * w + x] = -tex2DLayered<float>(t, (x + 0.5f) / w, (y + 0.5f) / h, layer) + layer;
}

__global__ void cube_axes(cudaTextureObject_t t, float *out) {
    const float3 dirs[6] = {{1, 0, 0}, {-1, 0, 0}, {0, 1, 0}, {0, -1, 0}, {0, 0, 1}, {0, 0, -1}};
    int i = threadIdx.x;
    if (i < 6) out[i] = texCubemap<float>(t, dirs[i].x, dirs[i].y, dirs[i].z);
}

__global__ void lods(cudaTextureObject_t t, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex2DLod<float>(t, 0.5f, 0.5f, (float)i);
}

static cudaTextureObject_t texture_of(cudaResourceType type, cudaArray_t a, cudaMipmappedArray_t m, int levels) {
    cudaResourceDesc res;
    std::memset(&res, 0, sizeof res);
    res.resType = type;
    if (type == cudaResourceTypeArray)
        res.res.array.array = a;
    else
        res.res.mipmap.mipmap = m;
    cudaTextureDesc td;
    std::memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.normalizedCoords = 1;
    td.mipmapFilterMode = cudaFilterModePoint;
    td.maxMipmapLevelClamp = (float)(levels - 1);
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

int main() {
    // --- A layered 2D array.
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaArray_t layered;
    CHECK(cudaMalloc3DArray(&layered, &desc, make_cudaExtent(W, H, LAYERS), cudaArrayLayered));
    cudaChannelFormatDesc got;
    cudaExtent extent;
    unsigned int flags;
    CHECK(cudaArrayGetInfo(&got, &extent, &flags, layered));
    std::printf("layered: extent %zux%zux%zu, flags %u\n", extent.width, extent.height, extent.depth, flags);
    std::vector<float> data(W * H * LAYERS), out(W * H * LAYERS);
    for (int i = 0; i < W * H * LAYERS; i++) data[i] = (float)(i % 97) * 0.5f;
    cudaMemcpy3DParms p;
    std::memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(data.data(), W * sizeof(float), W, H);
    p.dstArray = layered;
    p.extent = make_cudaExtent(W, H, LAYERS);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaTextureObject_t tl = texture_of(cudaResourceTypeArray, layered, nullptr, 1);
    float *dout;
    CHECK(cudaMalloc(&dout, W * H * LAYERS * sizeof(float)));
    transform_layers<<<LAYERS, dim3(W, H)>>>(tl, dout, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dout, W * H * LAYERS * sizeof(float), cudaMemcpyDeviceToHost));
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < W * H; i++) EXPECT(out[l * W * H + i] == -data[l * W * H + i] + l);
    std::printf("layered texture ok\n");
    CHECK(cudaDestroyTextureObject(tl));

    // --- A cubemap: each face one value, read along each axis.
    const int F = 4;
    cudaArray_t cube;
    CHECK(cudaMalloc3DArray(&cube, &desc, make_cudaExtent(F, F, 6), cudaArrayCubemap));
    std::vector<float> faces(F * F * 6);
    for (int i = 0; i < F * F * 6; i++) faces[i] = 10.0f * (i / (F * F)) + 1.0f;
    std::memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(faces.data(), F * sizeof(float), F, F);
    p.dstArray = cube;
    p.extent = make_cudaExtent(F, F, 6);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaTextureObject_t tc = texture_of(cudaResourceTypeArray, cube, nullptr, 1);
    cube_axes<<<1, 6>>>(tc, dout);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dout, 6 * sizeof(float), cudaMemcpyDeviceToHost));
    for (int f = 0; f < 6; f++) EXPECT(out[f] == 10.0f * f + 1.0f);
    std::printf("cubemap ok\n");
    CHECK(cudaDestroyTextureObject(tc));

    // --- A mipmapped array: each level one value, sampled by level of detail.
    const int LEVELS = 3;
    cudaMipmappedArray_t mip;
    CHECK(cudaMallocMipmappedArray(&mip, &desc, make_cudaExtent(16, 16, 0), LEVELS));
    for (int l = 0; l < LEVELS; l++) {
        cudaArray_t level;
        CHECK(cudaGetMipmappedArrayLevel(&level, mip, l));
        cudaArray_t again;
        CHECK(cudaGetMipmappedArrayLevel(&again, mip, l));
        EXPECT(level == again);
        CHECK(cudaArrayGetInfo(&got, &extent, &flags, level));
        std::printf("level %d: %zux%zux%zu\n", l, extent.width, extent.height, extent.depth);
        int side = 16 >> l;
        std::vector<float> v(side * side, 100.0f * (l + 1));
        CHECK(cudaMemcpy2DToArray(level, 0, 0, v.data(), side * sizeof(float), side * sizeof(float), side,
                                  cudaMemcpyHostToDevice));
    }
    cudaTextureObject_t tm = texture_of(cudaResourceTypeMipmappedArray, nullptr, mip, LEVELS);
    lods<<<1, LEVELS>>>(tm, dout, LEVELS);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dout, LEVELS * sizeof(float), cudaMemcpyDeviceToHost));
    for (int l = 0; l < LEVELS; l++) EXPECT(out[l] == 100.0f * (l + 1));
    std::printf("mipmapped texture ok\n");
    cudaResourceDesc rq;
    CHECK(cudaGetTextureObjectResourceDesc(&rq, tm));
    EXPECT(rq.resType == cudaResourceTypeMipmappedArray && rq.res.mipmap.mipmap == mip);
    CHECK(cudaDestroyTextureObject(tm));

    // --- Misuse.
    cudaArray_t level;
    cudaError_t e = cudaGetMipmappedArrayLevel(&level, mip, LEVELS);
    std::printf("level past the last: %s\n", cudaGetErrorName(e));
    std::memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(data.data(), W * sizeof(float), W, H);
    p.dstArray = layered;
    p.extent = make_cudaExtent(W, H, LAYERS + 1);
    p.kind = cudaMemcpyHostToDevice;
    e = cudaMemcpy3D(&p);
    std::printf("3D copy past the last layer: %s\n", cudaGetErrorName(e));
    std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));

    CHECK(cudaFreeMipmappedArray(mip));
    CHECK(cudaFreeArray(layered));
    CHECK(cudaFreeArray(cube));
    CHECK(cudaFree(dout));
    std::printf("done\n");
    return 0;
}
