// Surface objects as CUDA programs use them: reads and writes through surf*read/surf*write with each boundary mode.
// The tests build the surfaces over host memory and check what the kernels read and wrote.
#include <cuda_runtime.h>

// Doubles a float surface into another, one thread per element (x is a byte offset, as in CUDA).
extern "C" __global__ void scale2d(cudaSurfaceObject_t src, cudaSurfaceObject_t dst, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < width && y < height) {
        float v = surf2Dread<float>(src, x * 4, y);
        surf2Dwrite(v * 2.0f, dst, x * 4, y);
    }
}

// Reads uchar4 texels at arbitrary (x, y) element coordinates with the given boundary mode and stores them.
extern "C" __global__ void read_uchar4(cudaSurfaceObject_t s, const int2 *xy, uchar4 *out, int n, int mode) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = xy[i].x * 4, y = xy[i].y;
    uchar4 v;
    if (mode == 0) v = surf2Dread<uchar4>(s, x, y, cudaBoundaryModeZero);
    else if (mode == 1) v = surf2Dread<uchar4>(s, x, y, cudaBoundaryModeClamp);
    else v = surf2Dread<uchar4>(s, x, y, cudaBoundaryModeTrap);
    out[i] = v;
}

// Writes uchar4 texels at arbitrary element coordinates with the given boundary mode.
extern "C" __global__ void write_uchar4(cudaSurfaceObject_t s, const int2 *xy, int n, int mode) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = xy[i].x * 4, y = xy[i].y;
    uchar4 v = make_uchar4(i, i + 1, i + 2, 200);
    if (mode == 0) surf2Dwrite(v, s, x, y, cudaBoundaryModeZero);
    else if (mode == 1) surf2Dwrite(v, s, x, y, cudaBoundaryModeClamp);
    else surf2Dwrite(v, s, x, y, cudaBoundaryModeTrap);
}

// 1D: float4 elements, read and written back incremented.
extern "C" __global__ void bump1d(cudaSurfaceObject_t s, int width) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x < width) {
        float4 v = surf1Dread<float4>(s, x * 16);
        surf1Dwrite(make_float4(v.x + 1, v.y + 2, v.z + 3, v.w + 4), s, x * 16);
    }
}

// 3D: each thread writes an int2 element (x + 100 y, z).
extern "C" __global__ void fill3d(cudaSurfaceObject_t s, int w, int h, int d) {
    int x = threadIdx.x, y = blockIdx.x % h, z = blockIdx.x / h;
    if (x < w && z < d) surf3Dwrite(make_int2(x + 100 * y, z), s, x * 8, y, z);
}

// Layered 2D and cubemap surfaces: copy layer `from` to layer `to` (halves), then write faces of a cubemap.
extern "C" __global__ void layers2d(cudaSurfaceObject_t s, int w, int h, int from, int to) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) {
        short2 v = surf2DLayeredread<short2>(s, x * 4, y, from);
        surf2DLayeredwrite(make_short2(v.x / 2, v.y / 2), s, x * 4, y, to);
    }
}

extern "C" __global__ void cube_faces(cudaSurfaceObject_t s, int w) {
    int x = threadIdx.x, y = blockIdx.x % w, face = blockIdx.x / w;
    if (x < w) surfCubemapwrite((float)(face * 1000 + y * 10 + x), s, x * 4, y, face);
}

// 1D layered: 8-byte elements read as two 32-bit words.
extern "C" __global__ void layered1d(cudaSurfaceObject_t s, int w, int layer, unsigned *out) {
    int x = threadIdx.x;
    if (x < w) {
        uint2 v = surf1DLayeredread<uint2>(s, x * 8, layer);
        out[2 * x] = v.x;
        out[2 * x + 1] = v.y;
    }
}

// Formatted store (sust.p: the x coordinate counts elements) and the suq queries (inline PTX).
extern "C" __global__ void formatted(cudaSurfaceObject_t s, int x, int y, float a, float b, unsigned *q) {
    asm volatile("sust.p.2d.v2.b32.trap [%0, {%1, %2}], {%3, %4};" ::"l"(s), "r"(x), "r"(y), "f"(a), "f"(b));
    asm("suq.width.b32 %0, [%1];" : "=r"(q[0]) : "l"(s));
    asm("suq.height.b32 %0, [%1];" : "=r"(q[1]) : "l"(s));
    asm("suq.depth.b32 %0, [%1];" : "=r"(q[2]) : "l"(s));
    asm("suq.array_size.b32 %0, [%1];" : "=r"(q[3]) : "l"(s));
    asm("suq.channel_data_type.b32 %0, [%1];" : "=r"(q[4]) : "l"(s));
    asm("suq.channel_order.b32 %0, [%1];" : "=r"(q[5]) : "l"(s));
    asm("suq.memory_layout.b32 %0, [%1];" : "=r"(q[6]) : "l"(s));
}
