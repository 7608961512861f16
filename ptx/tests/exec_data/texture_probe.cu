// Ground truth for the interpreter's textures and surfaces from a real GPU. Built as a program, it creates CUDA
// arrays (every shape, mipmapped too), linear and pitched memory, texture objects under every addressing, filtering
// and read mode, and surface objects; samples them at edge, out-of-range, NaN and random coordinates; and prints
// every texture's description and texels and every lookup's inputs and results (hex bit patterns). The output is
// stored as texture_probe_h100.txt; the interpreter's tests compile the same kernels to PTX, rebuild each texture
// from the recorded description and texels, replay the lookups and compare bit for bit.
//
//   nvcc -O2 -o texture_probe texture_probe.cu && ./texture_probe > texture_probe_h100.txt
//
// Line formats (numbers in decimal, bit patterns in hex):
//   texture ID RES KIND TYPE CHANNELS W H D LAYERS LEVELS ADDR0 ADDR1 ADDR2 FILTER READ NORMALIZED SRGB MIPFILTER
//           BORDER0 BORDER1 BORDER2 BORDER3 BIAS MINCLAMP MAXCLAMP
//   data ID LEVEL HEX          texels of a level, packed: layer, z, y, x, channel; little-endian
//   refused ID ERROR           cudaCreateTextureObject refused the texture
//   L ID OP LAYER X Y Z LOD DX0 DX1 DY0 DY1 : R0 R1 R2 R3
//   query ID Q0..Q12           txq answers (see probe_query)
//   surface ID ... / data      a surface's array, as for textures
//   S ID MODE X Y : R          surf2Dread<uchar4> (packed) with boundary mode MODE (0 zero, 1 clamp)
//   W ID MODE : HEX            the array after surf2Dwrite at every point of surface_points with MODE
//   squery ID Q0..Q6           suq answers
//   fault NAME ERROR           the error a faulting kernel reports (each runs in a child process)
// RES: 0 array, 1 mipmapped array, 2 linear, 3 pitch2D. KIND: 0 1D, 1 2D, 2 3D, 3 layered 1D, 4 layered 2D,
// 5 cubemap, 6 layered cubemap. TYPE: 0 u8, 1 u16, 2 u32, 3 s8, 4 s16, 5 s32, 6 f16, 7 f32.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// One lookup: the operation and its operands (unused ones are zero).
struct Q {
    int op, layer;
    float x, y, z, lod, dx0, dx1, dy0, dy1;
};

#define F(e)                                                                                                           \
    {                                                                                                                  \
        float4 f = e;                                                                                                  \
        r = make_uint4(__float_as_uint(f.x), __float_as_uint(f.y), __float_as_uint(f.z), __float_as_uint(f.w));       \
        break;                                                                                                         \
    }
#define I(e)                                                                                                           \
    {                                                                                                                  \
        int4 v = e;                                                                                                    \
        r = make_uint4(v.x, v.y, v.z, v.w);                                                                            \
        break;                                                                                                         \
    }

extern "C" __global__ void probe_tex(cudaTextureObject_t t, const Q *qs, uint4 *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Q q = qs[i];
    uint4 r = make_uint4(0xdeadbeef, 0xdeadbeef, 0xdeadbeef, 0xdeadbeef);
    switch (q.op) {
    case 0: F(tex1D<float4>(t, q.x))
    case 1: F(tex2D<float4>(t, q.x, q.y))
    case 2: F(tex3D<float4>(t, q.x, q.y, q.z))
    case 3: F(tex1DLayered<float4>(t, q.x, q.layer))
    case 4: F(tex2DLayered<float4>(t, q.x, q.y, q.layer))
    case 5: F(texCubemap<float4>(t, q.x, q.y, q.z))
    case 6: F(texCubemapLayered<float4>(t, q.x, q.y, q.z, q.layer))
    case 7: F(tex2DLod<float4>(t, q.x, q.y, q.lod))
    case 8: F(tex2DGrad<float4>(t, q.x, q.y, make_float2(q.dx0, q.dx1), make_float2(q.dy0, q.dy1)))
    case 9: F(tex2Dgather<float4>(t, q.x, q.y, q.layer))
    case 10: F(tex1Dfetch<float4>(t, q.layer))
    case 11: I(tex2D<int4>(t, q.x, q.y))
    case 12: I(tex2Dgather<int4>(t, q.x, q.y, q.layer))
    case 13: I(tex1Dfetch<int4>(t, q.layer))
    case 14: I(tex1D<int4>(t, q.x))
    case 15: I(tex3D<int4>(t, q.x, q.y, q.z))
    case 16: F(tex1DLod<float4>(t, q.x, q.lod))
    case 17: F(tex3DLod<float4>(t, q.x, q.y, q.z, q.lod))
    case 18: F(tex2DLayeredLod<float4>(t, q.x, q.y, q.layer, q.lod))
    case 19: F(texCubemapLod<float4>(t, q.x, q.y, q.z, q.lod))
    default: break;
    }
    out[i] = r;
}

// txq: width, height, depth, channel data type, channel order, normalized coordinates, array size, mipmap levels,
// filter mode, address modes 0-2, force_unnormalized_coords, width of level 1.
extern "C" __global__ void probe_query(cudaTextureObject_t t, unsigned *o) {
    asm("txq.width.b32 %0, [%1];" : "=r"(o[0]) : "l"(t));
    asm("txq.height.b32 %0, [%1];" : "=r"(o[1]) : "l"(t));
    asm("txq.depth.b32 %0, [%1];" : "=r"(o[2]) : "l"(t));
    asm("txq.channel_data_type.b32 %0, [%1];" : "=r"(o[3]) : "l"(t));
    asm("txq.channel_order.b32 %0, [%1];" : "=r"(o[4]) : "l"(t));
    asm("txq.normalized_coords.b32 %0, [%1];" : "=r"(o[5]) : "l"(t));
    asm("txq.array_size.b32 %0, [%1];" : "=r"(o[6]) : "l"(t));
    asm("txq.num_mipmap_levels.b32 %0, [%1];" : "=r"(o[7]) : "l"(t));
    asm("txq.filter_mode.b32 %0, [%1];" : "=r"(o[8]) : "l"(t));
    asm("txq.addr_mode_0.b32 %0, [%1];" : "=r"(o[9]) : "l"(t));
    asm("txq.addr_mode_1.b32 %0, [%1];" : "=r"(o[10]) : "l"(t));
    asm("txq.addr_mode_2.b32 %0, [%1];" : "=r"(o[11]) : "l"(t));
    asm("txq.level.width.b32 %0, [%1], %2;" : "=r"(o[12]) : "l"(t), "r"(1));
}

// surf2Dread<uchar4> at element coordinates with boundary mode 0 (zero) or 1 (clamp); 2 traps.
extern "C" __global__ void probe_surf_read(cudaSurfaceObject_t s, const int2 *xy, unsigned *out, int n, int mode) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = xy[i].x * 4, y = xy[i].y;
    uchar4 v;
    if (mode == 0) v = surf2Dread<uchar4>(s, x, y, cudaBoundaryModeZero);
    else if (mode == 1) v = surf2Dread<uchar4>(s, x, y, cudaBoundaryModeClamp);
    else v = surf2Dread<uchar4>(s, x, y, cudaBoundaryModeTrap);
    out[i] = v.x | v.y << 8 | v.z << 16 | (unsigned)v.w << 24;
}

// surf2Dwrite<uchar4> of (i, i+1, i+2, 0xC0 + i) at each point, one point at a time in order.
extern "C" __global__ void probe_surf_write(cudaSurfaceObject_t s, const int2 *xy, int n, int mode) {
    for (int i = 0; i < n; ++i) {
        int x = xy[i].x * 4, y = xy[i].y;
        uchar4 v = make_uchar4(i, i + 1, i + 2, 0xC0 + i);
        if (mode == 0) surf2Dwrite(v, s, x, y, cudaBoundaryModeZero);
        else if (mode == 1) surf2Dwrite(v, s, x, y, cudaBoundaryModeClamp);
        else surf2Dwrite(v, s, x, y, cudaBoundaryModeTrap);
    }
}

// suq: width, height, depth, channel data type, channel order, array size, memory layout.
extern "C" __global__ void probe_surf_query(cudaSurfaceObject_t s, unsigned *o) {
    asm("suq.width.b32 %0, [%1];" : "=r"(o[0]) : "l"(s));
    asm("suq.height.b32 %0, [%1];" : "=r"(o[1]) : "l"(s));
    asm("suq.depth.b32 %0, [%1];" : "=r"(o[2]) : "l"(s));
    asm("suq.channel_data_type.b32 %0, [%1];" : "=r"(o[3]) : "l"(s));
    asm("suq.channel_order.b32 %0, [%1];" : "=r"(o[4]) : "l"(s));
    asm("suq.array_size.b32 %0, [%1];" : "=r"(o[5]) : "l"(s));
    asm("suq.memory_layout.b32 %0, [%1];" : "=r"(o[6]) : "l"(s));
}

#ifndef __CUDA_ARCH__
#include <cmath>
#include <string>
#include <vector>

typedef unsigned long long u64;
static u64 seed = 0x2545f4914f6cdd1dull;
static u64 rnd() {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() % 1000001) / 1000000.0f; }
static unsigned bits(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

#define CHECK(e)                                                                                                       \
    do {                                                                                                               \
        cudaError_t err_ = (e);                                                                                        \
        if (err_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #e, cudaGetErrorString(err_));                      \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

enum { U8, U16, U32, S8, S16, S32, F16, F32 };
enum { K1D, K2D, K3D, KL1D, KL2D, KCUBE, KLCUBE };
enum { ARRAY, MIPMAPPED, LINEAR, PITCH2D };
enum { WRAP, CLAMP, MIRROR, BORDER };
static const int TYPE_BYTES[] = {1, 2, 4, 1, 2, 4, 2, 4};

struct Cfg {
    int res = ARRAY, kind = K2D, type = F32, ch = 1, w = 1, h = 1, d = 1, layers = 1, levels = 1;
    int addr[3] = {CLAMP, CLAMP, CLAMP};
    int filter = 0, read = 0, norm = 0, srgb = 0, mipfilter = 0;
    float border[4] = {0.25f, -2.0f, 7.5f, 1e9f};
    float bias = 0, minc = 0, maxc = 0;
    int data = 0; // 0: random values of the type; 1: include float extremes (subnormals, infinities)
};

static int next_id = 1;

// Random texel channel of a type; floats are mostly "nice" values (small integers, binary fractions, powers).
static unsigned texel_value(const Cfg &c) {
    int r = rnd() % 8;
    switch (c.type) {
    case F32: {
        if (c.data == 1 && r == 0) {
            static const unsigned X[] = {0x00000001, 0x007fffff, 0x80000010, 0x7f800000, 0xff800000, 0x7f7fffff, 0x00800000};
            return X[rnd() % 7];
        }
        if (r < 3) return bits((float)((int)(rnd() % 33) - 16));
        if (r < 6) return bits((float)((int)(rnd() % 2001) - 1000) / 64.0f);
        return bits(frand(-1000.0f, 1000.0f));
    }
    case F16: {
        unsigned h = rnd() & 0xffff;
        if ((h & 0x7c00) == 0x7c00) h &= 0xfbff; // no infinities or NaNs
        return h;
    }
    default: {
        unsigned v = (unsigned)rnd();
        if (r == 0) v = 0;
        if (r == 1) v = 0xffffffffu;
        if (r == 2) v = 1u << (8 * TYPE_BYTES[c.type] - 1);
        if (TYPE_BYTES[c.type] < 4) v &= (1u << (8 * TYPE_BYTES[c.type])) - 1;
        return v;
    }
    }
}

struct Level {
    int w, h, d; // d counts layers for layered kinds
    std::vector<unsigned char> bytes;
};

static int esize(const Cfg &c) { return TYPE_BYTES[c.type] * c.ch; }

static std::vector<Level> make_levels(const Cfg &c) {
    std::vector<Level> ls;
    for (int l = 0; l < c.levels; ++l) {
        Level v;
        v.w = c.w >> l ? c.w >> l : 1;
        bool has_h = c.kind != K1D && c.kind != KL1D;
        v.h = has_h ? (c.h >> l ? c.h >> l : 1) : 1;
        v.d = c.kind == K3D ? (c.d >> l ? c.d >> l : 1) : c.layers;
        size_t n = (size_t)v.w * v.h * v.d * c.ch;
        for (size_t k = 0; k < n; ++k) {
            unsigned x = texel_value(c);
            for (int b = 0; b < TYPE_BYTES[c.type]; ++b) v.bytes.push_back((x >> (8 * b)) & 0xff);
        }
        ls.push_back(v);
    }
    return ls;
}

static cudaChannelFormatDesc channel_desc(const Cfg &c) {
    int b = 8 * TYPE_BYTES[c.type];
    cudaChannelFormatKind k = c.type >= F16 ? cudaChannelFormatKindFloat
                              : c.type >= S8 ? cudaChannelFormatKindSigned
                                             : cudaChannelFormatKindUnsigned;
    return cudaCreateChannelDesc(b, c.ch > 1 ? b : 0, c.ch > 2 ? b : 0, c.ch > 3 ? b : 0, k);
}

static cudaExtent alloc_extent(const Cfg &c) {
    switch (c.kind) {
    case K1D: return make_cudaExtent(c.w, 0, 0);
    case K2D: return make_cudaExtent(c.w, c.h, 0);
    case K3D: return make_cudaExtent(c.w, c.h, c.d);
    case KL1D: return make_cudaExtent(c.w, 0, c.layers);
    default: return make_cudaExtent(c.w, c.kind == KL2D ? c.h : c.w, c.layers);
    }
}

static unsigned array_flags(const Cfg &c, bool surface) {
    unsigned f = surface ? cudaArraySurfaceLoadStore : 0;
    if (c.kind == KL1D || c.kind == KL2D || c.kind == KLCUBE) f |= cudaArrayLayered;
    if (c.kind == KCUBE || c.kind == KLCUBE) f |= cudaArrayCubemap;
    return f;
}

static void copy_level(cudaArray_t a, const Cfg &c, const Level &l) {
    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr((void *)l.bytes.data(), (size_t)l.w * esize(c), l.w, l.h);
    p.dstArray = a;
    p.extent = make_cudaExtent(l.w, l.h, l.d);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
}

static void print_cfg(const char *what, int id, const Cfg &c, const std::vector<Level> &ls) {
    printf("%s %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %x %x %x %x %x %x %x\n", what, id, c.res, c.kind,
           c.type, c.ch, c.w, c.h, c.d, c.layers, c.levels, c.addr[0], c.addr[1], c.addr[2], c.filter, c.read, c.norm,
           c.srgb, c.mipfilter, bits(c.border[0]), bits(c.border[1]), bits(c.border[2]), bits(c.border[3]),
           bits(c.bias), bits(c.minc), bits(c.maxc));
    for (size_t l = 0; l < ls.size(); ++l) {
        printf("data %d %zu ", id, l);
        for (unsigned char b : ls[l].bytes) printf("%02x", b);
        printf("\n");
    }
}

// Coordinates along a dimension of n texels: edges, just inside and outside them, far away, NaN and infinities,
// ties of the 8-bit weights, and random values (in texels, or normalized).
static std::vector<float> coords(int n, bool norm, int randoms) {
    float N = (float)n;
    std::vector<float> v = {-N - 0.5f, -1.5f, -0.5f, -0.25f, -1.0f / 512, 0.0f, 1.0f / 1024, 0.25f, 0.5f,
                            0.5f + 1.0f / 512, 0.5f + 3.0f / 512, 1.0f, 1.5f, N / 2, N - 1, N - 0.5f, N - 1.0f / 1024, N,
                            N + 0.25f, N + 0.5f, 2 * N + 0.3f, 1e6f, -1e6f, NAN, INFINITY, -INFINITY};
    for (int k = 0; k < randoms; ++k) v.push_back(frand(-2.0f, N + 2.0f));
    if (norm)
        for (float &x : v) x /= N;
    return v;
}

// Creates the texture, prints it, runs the lookups and prints them, then its txq answers.
static void run(Cfg c, const std::vector<Q> &qs) {
    int id = next_id++;
    std::vector<Level> ls = make_levels(c);
    print_cfg("texture", id, c, ls);
    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    cudaArray_t arr = 0;
    cudaMipmappedArray_t mm = 0;
    void *mem = 0;
    cudaChannelFormatDesc cd = channel_desc(c);
    if (c.res == ARRAY) {
        CHECK(cudaMalloc3DArray(&arr, &cd, alloc_extent(c), array_flags(c, false)));
        copy_level(arr, c, ls[0]);
        rd.resType = cudaResourceTypeArray;
        rd.res.array.array = arr;
    } else if (c.res == MIPMAPPED) {
        CHECK(cudaMallocMipmappedArray(&mm, &cd, alloc_extent(c), c.levels, array_flags(c, false)));
        for (int l = 0; l < c.levels; ++l) {
            cudaArray_t a;
            CHECK(cudaGetMipmappedArrayLevel(&a, mm, l));
            copy_level(a, c, ls[l]);
        }
        rd.resType = cudaResourceTypeMipmappedArray;
        rd.res.mipmap.mipmap = mm;
    } else if (c.res == LINEAR) {
        CHECK(cudaMalloc(&mem, ls[0].bytes.size()));
        CHECK(cudaMemcpy(mem, ls[0].bytes.data(), ls[0].bytes.size(), cudaMemcpyHostToDevice));
        rd.resType = cudaResourceTypeLinear;
        rd.res.linear.devPtr = mem;
        rd.res.linear.desc = cd;
        rd.res.linear.sizeInBytes = ls[0].bytes.size();
    } else {
        size_t pitch;
        CHECK(cudaMallocPitch(&mem, &pitch, (size_t)c.w * esize(c), c.h));
        CHECK(cudaMemcpy2D(mem, pitch, ls[0].bytes.data(), (size_t)c.w * esize(c), (size_t)c.w * esize(c), c.h,
                           cudaMemcpyHostToDevice));
        rd.resType = cudaResourceTypePitch2D;
        rd.res.pitch2D.devPtr = mem;
        rd.res.pitch2D.desc = cd;
        rd.res.pitch2D.width = c.w;
        rd.res.pitch2D.height = c.h;
        rd.res.pitch2D.pitchInBytes = pitch;
    }
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    for (int k = 0; k < 3; ++k) td.addressMode[k] = (cudaTextureAddressMode)c.addr[k];
    td.filterMode = (cudaTextureFilterMode)c.filter;
    td.readMode = (cudaTextureReadMode)c.read;
    td.sRGB = c.srgb;
    for (int k = 0; k < 4; ++k) td.borderColor[k] = c.border[k];
    td.normalizedCoords = c.norm;
    td.mipmapFilterMode = (cudaTextureFilterMode)c.mipfilter;
    td.mipmapLevelBias = c.bias;
    td.minMipmapLevelClamp = c.minc;
    td.maxMipmapLevelClamp = c.maxc;
    cudaTextureObject_t t = 0;
    cudaError_t e = cudaCreateTextureObject(&t, &rd, &td, 0);
    if (e != cudaSuccess) {
        printf("refused %d %d\n", id, (int)e);
        cudaGetLastError();
    } else {
        int n = (int)qs.size();
        Q *dq;
        uint4 *dout;
        unsigned *dqr;
        CHECK(cudaMalloc(&dq, n * sizeof(Q)));
        CHECK(cudaMalloc(&dout, n * sizeof(uint4)));
        CHECK(cudaMalloc(&dqr, 13 * sizeof(unsigned)));
        CHECK(cudaMemcpy(dq, qs.data(), n * sizeof(Q), cudaMemcpyHostToDevice));
        probe_tex<<<(n + 127) / 128, 128>>>(t, dq, dout, n);
        CHECK(cudaGetLastError()); // a launch that fails must not pass for all-zero results
        probe_query<<<1, 1>>>(t, dqr);
        CHECK(cudaGetLastError()); // a launch that fails must not pass for all-zero results
        std::vector<uint4> out(n);
        unsigned qr[13];
        CHECK(cudaMemcpy(out.data(), dout, n * sizeof(uint4), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(qr, dqr, sizeof qr, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i) {
            const Q &q = qs[i];
            printf("L %d %d %d %x %x %x %x %x %x %x %x : %x %x %x %x\n", id, q.op, q.layer, bits(q.x), bits(q.y),
                   bits(q.z), bits(q.lod), bits(q.dx0), bits(q.dx1), bits(q.dy0), bits(q.dy1), out[i].x, out[i].y,
                   out[i].z, out[i].w);
        }
        printf("query %d", id);
        for (int k = 0; k < 13; ++k) printf(" %u", qr[k]);
        printf("\n");
        CHECK(cudaDestroyTextureObject(t));
        CHECK(cudaFree(dq));
        CHECK(cudaFree(dout));
        CHECK(cudaFree(dqr));
    }
    if (arr) CHECK(cudaFreeArray(arr));
    if (mm) CHECK(cudaFreeMipmappedArray(mm));
    if (mem) CHECK(cudaFree(mem));
}

static Q q(int op, float x, float y = 0, float z = 0, int layer = 0, float lod = 0) {
    Q v;
    memset(&v, 0, sizeof v);
    v.op = op;
    v.x = x;
    v.y = y;
    v.z = z;
    v.layer = layer;
    v.lod = lod;
    return v;
}

// Lookups of a 2D operation on a grid of edge coordinates plus random points.
static std::vector<Q> grid2d(const Cfg &c, int op, int ylimit = 8, int randoms = 16) {
    std::vector<float> xs = coords(c.w, c.norm, 2), ys = coords(c.h, c.norm, 2);
    std::vector<Q> v;
    for (float x : xs)
        for (int k = 0; k < (int)ys.size() && k < ylimit; ++k) v.push_back(q(op, x, ys[k]));
    float s = c.norm ? 1.0f : 1.0f * c.w, t = c.norm ? 1.0f : 1.0f * c.h;
    for (int k = 0; k < randoms; ++k) v.push_back(q(op, frand(-0.5f, 1.5f) * s, frand(-0.5f, 1.5f) * t));
    return v;
}

static std::vector<Q> line1d(const Cfg &c, int op, int layers = 0) {
    std::vector<float> xs = coords(c.w, c.norm, 10);
    std::vector<Q> v;
    for (float x : xs) v.push_back(q(op, x));
    if (layers) {
        int ls[] = {-1, 0, 1, c.layers - 1, c.layers, 1000};
        std::vector<Q> out;
        for (const Q &a : v)
            for (int l : ls) {
                Q b = a;
                b.layer = l;
                out.push_back(b);
            }
        return out;
    }
    return v;
}

static std::vector<Q> cube_dirs(int op, int cubes) {
    std::vector<Q> v;
    float fixed[][3] = {{1, 0, 0},     {-1, 0, 0},     {0, 1, 0},       {0, -1, 0},    {0, 0, 1},       {0, 0, -1},
                        {1, 1, 0},     {1, 0, 1},      {0, 1, 1},       {1, 1, 1},     {-1, -1, -1},    {-1, 1, -1},
                        {1, -1, 1},    {2, 0.5f, -1},  {-3, 1, 2.9f},   {0.2f, -5, 1}, {0.5f, 0.5f, 4}, {-1, 0.3f, -2},
                        {1, 0.999f, 0}, {1, -0.999f, 0.999f}, {0.75f, 1, -0.75f}, {1, 0.125f, -0.375f},
                        {0, 0, 0},     {NAN, 1, 0},    {1e30f, 1, 1},   {1, 1e-30f, -1e-30f}};
    for (auto &d : fixed) v.push_back(q(op, d[0], d[1], d[2]));
    for (int k = 0; k < 60; ++k) v.push_back(q(op, frand(-2, 2), frand(-2, 2), frand(-2, 2)));
    if (cubes) {
        for (size_t k = 0; k < v.size(); ++k) v[k].layer = (int)(k % (cubes + 2)) - 1;
    }
    return v;
}

static Cfg tex2d(int type, int ch, int w, int h) {
    Cfg c;
    c.type = type;
    c.ch = ch;
    c.w = w;
    c.h = h;
    return c;
}

static int fault(int which);

// Surface probes on a uchar4 2D array of 5x3.
static std::vector<int> surface_points() {
    return {0, 0, 4, 2, -1, 0, 5, 0, 2, -1, 0, 3, 100, 100, -7, 1, 3, 1, 9, 2, -3, 2, 2, 7, 4, -1, 1, 1};
}

static void surfaces() {
    Cfg c = tex2d(U8, 4, 5, 3);
    int id = next_id++;
    std::vector<Level> ls = make_levels(c);
    print_cfg("surface", id, c, ls);
    cudaChannelFormatDesc cd = channel_desc(c);
    cudaArray_t a;
    CHECK(cudaMallocArray(&a, &cd, c.w, c.h, cudaArraySurfaceLoadStore));
    std::vector<int> pts = surface_points();
    int n = (int)pts.size() / 2;
    int2 *dxy;
    unsigned *dout;
    CHECK(cudaMalloc(&dxy, pts.size() * sizeof(int)));
    CHECK(cudaMalloc(&dout, 64 * sizeof(unsigned)));
    CHECK(cudaMemcpy(dxy, pts.data(), pts.size() * sizeof(int), cudaMemcpyHostToDevice));
    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = a;
    cudaSurfaceObject_t s;
    CHECK(cudaCreateSurfaceObject(&s, &rd));
    for (int mode = 0; mode < 2; ++mode) {
        copy_level(a, c, ls[0]);
        probe_surf_read<<<1, 64>>>(s, dxy, dout, n, mode);
        CHECK(cudaGetLastError()); // a launch that fails must not pass for all-zero results
        unsigned out[64];
        CHECK(cudaMemcpy(out, dout, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i) printf("S %d %d %d %d : %x\n", id, mode, pts[2 * i], pts[2 * i + 1], out[i]);
        probe_surf_write<<<1, 1>>>(s, dxy, n, mode);
        CHECK(cudaGetLastError()); // a launch that fails must not pass for all-zero results
        std::vector<unsigned char> back(c.w * c.h * 4);
        CHECK(cudaMemcpy2DFromArray(back.data(), c.w * 4, a, 0, 0, c.w * 4, c.h, cudaMemcpyDeviceToHost));
        printf("W %d %d : ", id, mode);
        for (unsigned char b : back) printf("%02x", b);
        printf("\n");
    }
    probe_surf_query<<<1, 1>>>(s, dout);
    CHECK(cudaGetLastError()); // a launch that fails must not pass for all-zero results
    unsigned qr[7];
    CHECK(cudaMemcpy(qr, dout, sizeof qr, cudaMemcpyDeviceToHost));
    printf("squery %d", id);
    for (int k = 0; k < 7; ++k) printf(" %u", qr[k]);
    printf("\n");
    CHECK(cudaDestroySurfaceObject(s));
    CHECK(cudaFreeArray(a));
    CHECK(cudaFree(dxy));
    CHECK(cudaFree(dout));
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--fault")) return fault(atoi(argv[2]));
    CHECK(cudaFree(0));
    // 2D float textures: each address mode on each axis, both filters, both coordinate kinds.
    int combos[][2] = {{WRAP, CLAMP}, {CLAMP, WRAP}, {MIRROR, BORDER}, {BORDER, MIRROR}};
    for (auto &m : combos)
        for (int filter = 0; filter < 2; ++filter)
            for (int norm = 0; norm < 2; ++norm) {
                Cfg c = tex2d(F32, 4, 5, 3);
                c.addr[0] = m[0];
                c.addr[1] = m[1];
                c.filter = filter;
                c.norm = norm;
                run(c, grid2d(c, 1));
            }
    // Normalized-float reads of 8- and 16-bit integers, half floats, float extremes, sRGB.
    int formats[][2] = {{U8, 4}, {S8, 1}, {U16, 2}, {S16, 4}, {S8, 2}, {U16, 1}};
    for (auto &f : formats)
        for (int variant = 0; variant < 3; ++variant) {
            Cfg c = tex2d(f[0], f[1], 4, 4);
            c.read = 1;
            c.filter = variant > 0;
            c.addr[0] = c.addr[1] = variant == 2 ? BORDER : CLAMP;
            run(c, grid2d(c, 1, 6, 8));
        }
    for (int filter = 0; filter < 2; ++filter) {
        Cfg c = tex2d(F16, 2, 4, 4);
        c.filter = filter;
        run(c, grid2d(c, 1, 6, 8));
        Cfg e = tex2d(F32, 1, 4, 4);
        e.filter = filter;
        e.data = 1;
        run(e, grid2d(e, 1, 6, 8));
        Cfg s = tex2d(U8, 4, 4, 4);
        s.read = 1;
        s.srgb = 1;
        s.filter = filter;
        run(s, grid2d(s, 1, 6, 8));
    }
    // Element-type reads of integers; the border colour of integer textures.
    int ints[][3] = {{U8, 4, 11}, {S8, 2, 11}, {S16, 2, 11}, {U16, 1, 11}, {S32, 1, 11}, {U32, 4, 11}};
    for (auto &f : ints)
        for (int mode : {WRAP, CLAMP, MIRROR, BORDER}) {
            if (f[0] != U8 && (mode == CLAMP || mode == MIRROR)) continue;
            Cfg c = tex2d(f[0], f[1], 4, 3);
            c.norm = 1;
            c.addr[0] = c.addr[1] = mode;
            run(c, grid2d(c, f[2], 4, 8));
        }
    // One-texel textures.
    for (int mode : {WRAP, CLAMP, MIRROR, BORDER})
        for (int filter = 0; filter < 2; ++filter)
            for (int norm = 0; norm < 2; ++norm) {
                Cfg c = tex2d(F32, 4, 1, 1);
                c.addr[0] = c.addr[1] = mode;
                c.filter = filter;
                c.norm = norm;
                run(c, grid2d(c, 1, 3, 4));
            }
    // 1D, 3D, layered.
    for (int mode : {WRAP, CLAMP, MIRROR, BORDER})
        for (int filter = 0; filter < 2; ++filter) {
            Cfg c;
            c.kind = K1D;
            c.ch = 4;
            c.w = 6;
            c.addr[0] = mode;
            c.filter = filter;
            c.norm = mode == WRAP || mode == MIRROR;
            run(c, line1d(c, 0));
        }
    {
        Cfg c;
        c.kind = K1D;
        c.type = S16;
        c.ch = 2;
        c.w = 7;
        run(c, line1d(c, 14));
    }
    int modes3[][3] = {{WRAP, CLAMP, BORDER}, {MIRROR, BORDER, WRAP}, {CLAMP, CLAMP, CLAMP}, {BORDER, MIRROR, CLAMP}};
    for (auto &m : modes3)
        for (int filter = 0; filter < 2; ++filter) {
            Cfg c;
            c.kind = K3D;
            c.ch = 2;
            c.w = 4;
            c.h = 3;
            c.d = 5;
            for (int k = 0; k < 3; ++k) c.addr[k] = m[k];
            c.filter = filter;
            c.norm = m[0] == WRAP || m[0] == MIRROR || m[1] == MIRROR;
            std::vector<float> xs = coords(4, c.norm, 4), ys = coords(3, c.norm, 2), zs = coords(5, c.norm, 2);
            std::vector<Q> v;
            for (size_t i = 0; i < xs.size(); ++i)
                for (size_t j = 0; j < ys.size(); j += 5) v.push_back(q(2, xs[i], ys[j], zs[(i * 7 + j) % zs.size()]));
            for (int k = 0; k < 40; ++k) v.push_back(q(2, frand(-0.5f, 1.5f) * (c.norm ? 1 : 4), frand(-0.5f, 1.5f) * (c.norm ? 1 : 3), frand(-0.5f, 1.5f) * (c.norm ? 1 : 5)));
            run(c, v);
        }
    {
        Cfg c;
        c.kind = K3D;
        c.type = U8;
        c.ch = 4;
        c.w = 3;
        c.h = 2;
        c.d = 2;
        std::vector<Q> v;
        for (int k = 0; k < 40; ++k) v.push_back(q(15, frand(-1, 4), frand(-1, 3), frand(-1, 3)));
        run(c, v);
    }
    for (int filter = 0; filter < 2; ++filter)
        for (int mode : {WRAP, BORDER}) {
            Cfg c;
            c.kind = KL1D;
            c.ch = 4;
            c.w = 6;
            c.layers = 3;
            c.addr[0] = mode;
            c.filter = filter;
            c.norm = mode == WRAP;
            run(c, line1d(c, 3, 1));
            Cfg d;
            d.kind = KL2D;
            d.w = 4;
            d.h = 3;
            d.layers = 4;
            d.addr[0] = d.addr[1] = mode;
            d.filter = filter;
            d.norm = mode == WRAP;
            std::vector<Q> v = grid2d(d, 4, 4, 8);
            for (size_t k = 0; k < v.size(); ++k) v[k].layer = (int)(k % 7) - 1;
            run(d, v);
        }
    // Cubemaps and layered cubemaps.
    for (int filter = 0; filter < 2; ++filter)
        for (int mode : {CLAMP, BORDER, WRAP}) {
            Cfg c;
            c.kind = KCUBE;
            c.w = c.h = 4;
            c.layers = 6;
            c.addr[0] = c.addr[1] = c.addr[2] = mode;
            c.filter = filter;
            c.norm = 1;
            run(c, cube_dirs(5, 0));
        }
    for (int filter = 0; filter < 2; ++filter) {
        Cfg c;
        c.kind = KLCUBE;
        c.ch = 2;
        c.w = c.h = 3;
        c.layers = 12;
        c.filter = filter;
        c.norm = 1;
        run(c, cube_dirs(6, 2));
    }
    // Mipmaps: level of detail under each filter pair, with a bias and clamps; gradients; other shapes.
    float lods[] = {-1, 0, 0.25f, 0.5f, 0.51f, 1, 1.3f, 1.5f, 2.75f, 3, 9, NAN};
    float clamps[][3] = {{0, 0, 3}, {0.5f, 0, 3}, {0, 1, 2}, {0, 0, 0}, {-0.75f, 0.5f, 2.5f}};
    int filters[][2] = {{0, 0}, {1, 1}, {0, 1}, {1, 0}};
    for (auto &f : filters)
        for (auto &cl : clamps) {
            Cfg c = tex2d(F32, 4, 8, 8);
            c.res = MIPMAPPED;
            c.levels = 4;
            c.norm = 1;
            c.addr[0] = c.addr[1] = WRAP;
            c.filter = f[0];
            c.mipfilter = f[1];
            c.bias = cl[0];
            c.minc = cl[1];
            c.maxc = cl[2];
            std::vector<Q> v;
            for (float lod : lods)
                for (int k = 0; k < 6; ++k) v.push_back(q(7, frand(-0.2f, 1.2f), frand(-0.2f, 1.2f), 0, 0, lod));
            for (int k = 0; k < 6; ++k) v.push_back(q(1, frand(0, 1), frand(0, 1)));
            run(c, v);
        }
    for (int mipf = 0; mipf < 2; ++mipf) {
        Cfg c = tex2d(F32, 4, 8, 8);
        c.res = MIPMAPPED;
        c.levels = 4;
        c.norm = 1;
        c.mipfilter = mipf;
        c.maxc = 3;
        std::vector<Q> v;
        float g[] = {0, 1.0f / 64, 0.125f, 0.2f, 0.25f, 0.5f, 0.7f, 1, 3};
        for (float a : g)
            for (float b : g) {
                Q x = q(8, frand(0, 1), frand(0, 1));
                x.dx0 = a;
                x.dy1 = b;
                v.push_back(x);
                Q y = x;
                y.dx1 = b;
                y.dy0 = -a;
                v.push_back(y);
            }
        run(c, v);
    }
    {
        Cfg c;
        c.res = MIPMAPPED;
        c.kind = K1D;
        c.ch = 2;
        c.w = 16;
        c.levels = 5;
        c.norm = 1;
        c.filter = 1;
        c.mipfilter = 1;
        c.maxc = 4;
        std::vector<Q> v;
        for (float lod : lods)
            for (int k = 0; k < 6; ++k) v.push_back(q(16, frand(-0.2f, 1.2f), 0, 0, 0, lod));
        run(c, v);
        Cfg d;
        d.res = MIPMAPPED;
        d.kind = K3D;
        d.w = 4;
        d.h = 4;
        d.d = 8;
        d.levels = 4;
        d.norm = 1;
        d.mipfilter = 1;
        d.maxc = 3;
        v.clear();
        for (float lod : lods)
            for (int k = 0; k < 4; ++k) v.push_back(q(17, frand(0, 1), frand(0, 1), frand(0, 1), 0, lod));
        run(d, v);
        Cfg e;
        e.res = MIPMAPPED;
        e.kind = KL2D;
        e.w = 8;
        e.h = 4;
        e.layers = 3;
        e.levels = 3;
        e.norm = 1;
        e.filter = 1;
        e.maxc = 2;
        v.clear();
        for (float lod : lods)
            for (int k = 0; k < 4; ++k) v.push_back(q(18, frand(0, 1), frand(0, 1), 0, k - 1, lod));
        run(e, v);
        Cfg f;
        f.res = MIPMAPPED;
        f.kind = KCUBE;
        f.w = f.h = 8;
        f.layers = 6;
        f.levels = 4;
        f.norm = 1;
        f.mipfilter = 1;
        f.maxc = 3;
        v.clear();
        for (float lod : lods)
            for (int k = 0; k < 4; ++k) v.push_back(q(19, frand(-1, 1), frand(-1, 1), frand(-1, 1), 0, lod));
        run(f, v);
    }
    // Gather.
    for (int read = 0; read < 2; ++read)
        for (int mode : {WRAP, CLAMP, MIRROR, BORDER}) {
            Cfg c = tex2d(U8, 4, 4, 3);
            c.read = read;
            c.norm = 1;
            c.addr[0] = c.addr[1] = mode;
            std::vector<Q> base = grid2d(c, read ? 9 : 12, 4, 8), v;
            for (size_t k = 0; k < base.size(); ++k) {
                Q x = base[k];
                x.layer = (int)(k % 4);
                v.push_back(x);
            }
            run(c, v);
        }
    {
        Cfg c = tex2d(F32, 1, 5, 3);
        c.addr[0] = c.addr[1] = BORDER;
        run(c, grid2d(c, 9, 4, 8));
    }
    // Linear and pitched memory.
    int linear[][3] = {{F32, 4, 10}, {S16, 2, 13}, {U8, 1, 10}, {U8, 4, 13}};
    for (auto &f : linear) {
        Cfg c;
        c.res = LINEAR;
        c.kind = K1D;
        c.type = f[0];
        c.ch = f[1];
        c.w = 37;
        c.read = f[0] == U8 && f[1] == 1;
        std::vector<Q> v;
        int idx[] = {-5, -1, 0, 1, 17, 36, 37, 40, 100000, -2147483647 - 1};
        for (int i : idx) v.push_back(q(f[2], 0, 0, 0, i));
        run(c, v);
    }
    for (int filter = 0; filter < 2; ++filter)
        for (int mode : {CLAMP, BORDER}) {
            Cfg c = tex2d(F32, 1, 6, 4);
            c.res = PITCH2D;
            c.addr[0] = c.addr[1] = mode;
            c.filter = filter;
            run(c, grid2d(c, 1, 6, 8));
        }
    surfaces();
    // Faults, each in a child process (a fault leaves the context unusable).
    for (int k = 0; k < 4; ++k) {
        fflush(stdout);
        std::string cmd = std::string(argv[0]) + " --fault " + std::to_string(k);
        FILE *p = popen(cmd.c_str(), "r");
        char line[256];
        while (p && fgets(line, sizeof line, p)) fputs(line, stdout);
        if (p) pclose(p);
    }
    return 0;
}

// 0: a lookup through a handle that is no texture object; 1: surf2Dwrite out of range in trap mode; 2: surf2Dread
// out of range in trap mode; 3: a surface read through a handle that is no surface object.
static int fault(int which) {
    static const char *names[] = {"texture_handle", "surface_write_trap", "surface_read_trap", "surface_handle"};
    Cfg c = tex2d(U8, 4, 5, 3);
    cudaChannelFormatDesc cd = channel_desc(c);
    cudaArray_t a;
    CHECK(cudaMallocArray(&a, &cd, c.w, c.h, cudaArraySurfaceLoadStore));
    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = a;
    cudaSurfaceObject_t s;
    CHECK(cudaCreateSurfaceObject(&s, &rd));
    int pts[] = {1, 1, 7, 1};
    int2 *dxy;
    unsigned *dout;
    Q *dq;
    CHECK(cudaMalloc(&dxy, sizeof pts));
    CHECK(cudaMalloc(&dout, 64));
    CHECK(cudaMalloc(&dq, sizeof(Q)));
    CHECK(cudaMemcpy(dxy, pts, sizeof pts, cudaMemcpyHostToDevice));
    Q one = q(1, 0.5f, 0.5f);
    CHECK(cudaMemcpy(dq, &one, sizeof one, cudaMemcpyHostToDevice));
    switch (which) {
    case 0: probe_tex<<<1, 1>>>((cudaTextureObject_t)0xdead, dq, (uint4 *)dout, 1); break;
    case 1: probe_surf_write<<<1, 1>>>(s, dxy, 2, 2); break;
    case 2: probe_surf_read<<<1, 2>>>(s, dxy, dout, 2, 2); break;
    default: probe_surf_read<<<1, 1>>>((cudaSurfaceObject_t)0xdead, dxy, dout, 1, 2); break;
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("fault %s %d\n", names[which], (int)e);
    return 0;
}
#endif
