// Texture objects as CUDA programs use them: one kernel per fetch function, sampling at the coordinates given per
// thread and storing what the texture returned. The tests build the textures and check every result against a
// reference written from the CUDA Programming Guide's texture-fetching rules.
#include <cuda_runtime.h>

// Coordinates of one lookup: x, y, z (or a cubemap direction), the layer, a level of detail and gradients.
struct Coord {
    float x, y, z;
    int layer;
    float lod;
    float dx[2], dy[2];
    int comp;
};

#define KERNEL(name, T, expr)                                                                                     \
    extern "C" __global__ void name(cudaTextureObject_t t, const Coord *c, T *out, int n) {                        \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                                             \
        if (i < n) {                                                                                               \
            Coord k = c[i];                                                                                        \
            out[i] = expr;                                                                                         \
        }                                                                                                          \
    }

KERNEL(fetch_f4, float4, tex1Dfetch<float4>(t, (int)k.x))
KERNEL(fetch_i4, int4, tex1Dfetch<int4>(t, (int)k.x))
KERNEL(fetch_f1, float, tex1Dfetch<float>(t, (int)k.x))
KERNEL(tex1d_f4, float4, tex1D<float4>(t, k.x))
KERNEL(tex2d_f4, float4, tex2D<float4>(t, k.x, k.y))
KERNEL(tex2d_f1, float, tex2D<float>(t, k.x, k.y))
KERNEL(tex2d_i4, int4, tex2D<int4>(t, k.x, k.y))
KERNEL(tex2d_u4, uint4, tex2D<uint4>(t, k.x, k.y))
KERNEL(tex2d_uc4, uchar4, tex2D<uchar4>(t, k.x, k.y))
KERNEL(tex3d_f4, float4, tex3D<float4>(t, k.x, k.y, k.z))
KERNEL(tex1d_layered_f4, float4, tex1DLayered<float4>(t, k.x, k.layer))
KERNEL(tex2d_layered_f4, float4, tex2DLayered<float4>(t, k.x, k.y, k.layer))
KERNEL(cube_f4, float4, texCubemap<float4>(t, k.x, k.y, k.z))
KERNEL(cube_layered_f4, float4, texCubemapLayered<float4>(t, k.x, k.y, k.z, k.layer))
KERNEL(lod2d_f4, float4, tex2DLod<float4>(t, k.x, k.y, k.lod))
KERNEL(grad2d_f4, float4, tex2DGrad<float4>(t, k.x, k.y, make_float2(k.dx[0], k.dx[1]), make_float2(k.dy[0], k.dy[1])))
KERNEL(gather_f4, float4, tex2Dgather<float4>(t, k.x, k.y, k.comp))
KERNEL(gather_i4, int4, tex2Dgather<int4>(t, k.x, k.y, k.comp))

// txq answers for a texture object (inline PTX: CUDA C++ has no function for them).
extern "C" __global__ void texture_queries(cudaTextureObject_t t, unsigned *out) {
    unsigned r[12];
    asm("txq.width.b32 %0, [%1];" : "=r"(r[0]) : "l"(t));
    asm("txq.height.b32 %0, [%1];" : "=r"(r[1]) : "l"(t));
    asm("txq.depth.b32 %0, [%1];" : "=r"(r[2]) : "l"(t));
    asm("txq.array_size.b32 %0, [%1];" : "=r"(r[3]) : "l"(t));
    asm("txq.num_mipmap_levels.b32 %0, [%1];" : "=r"(r[4]) : "l"(t));
    asm("txq.normalized_coords.b32 %0, [%1];" : "=r"(r[5]) : "l"(t));
    asm("txq.filter_mode.b32 %0, [%1];" : "=r"(r[6]) : "l"(t));
    asm("txq.addr_mode_0.b32 %0, [%1];" : "=r"(r[7]) : "l"(t));
    asm("txq.addr_mode_1.b32 %0, [%1];" : "=r"(r[8]) : "l"(t));
    asm("txq.channel_data_type.b32 %0, [%1];" : "=r"(r[9]) : "l"(t));
    asm("txq.channel_order.b32 %0, [%1];" : "=r"(r[10]) : "l"(t));
    asm("txq.level.width.b32 %0, [%1], %2;" : "=r"(r[11]) : "l"(t), "r"(1));
    for (int k = 0; k < 12; ++k) out[k] = r[k];
}
