// Surface objects in the style of NVIDIA's simpleSurfaceWrite: a kernel writes a CUDA array
// through surf2Dwrite, another reads it through surf2Dread with each boundary mode and through
// a texture object of the same array; a 3D array through surf3Dwrite/surf3Dread; and the errors
// CUDA answers for misuse.
#include "check.h"
#include <cstring>
#include <unistd.h>
#include <vector>

const int W = 12, H = 7;

__global__ void write_pattern(cudaSurfaceObject_t s, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite((float)(x * 100 + y), s, x * (int)sizeof(float), y);
}

// Reads at (x + dx, y + dy): outside the array, zero or the clamped texel per the mode.
__global__ void read_shifted(cudaSurfaceObject_t s, float *out, int w, int h, int dx, int dy, int clamp) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x >= w || y >= h) return;
    int bx = (x + dx) * (int)sizeof(float), by = y + dy;
    out[y * w + x] = clamp ? surf2Dread<float>(s, bx, by, cudaBoundaryModeClamp)
                           : surf2Dread<float>(s, bx, by, cudaBoundaryModeZero);
}

__global__ void through_texture(cudaTextureObject_t t, float *out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}

__global__ void invert3d(cudaSurfaceObject_t s, int w, int h, int d) {
    int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
    if (x < w && y < h && z < d) {
        uchar4 v = surf3Dread<uchar4>(s, x * 4, y, z);
        surf3Dwrite(make_uchar4(255 - v.x, 255 - v.y, 255 - v.z, v.w), s, x * 4, y, z);
    }
}

static cudaSurfaceObject_t surface_of(cudaArray_t a) {
    cudaResourceDesc res;
    std::memset(&res, 0, sizeof res);
    res.resType = cudaResourceTypeArray;
    res.res.array.array = a;
    cudaSurfaceObject_t s = 0;
    CHECK(cudaCreateSurfaceObject(&s, &res));
    return s;
}

int main(int argc, char **argv) {
    // `surface_objects hold`: stop holding an array and a surface object, for a checkpoint test.
    const bool hold = argc > 1 && std::strcmp(argv[1], "hold") == 0;
    cudaChannelFormatDesc desc = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &desc, W, H, cudaArraySurfaceLoadStore));
    cudaSurfaceObject_t s = surface_of(arr);
    write_pattern<<<dim3(2, 1), dim3(8, 8)>>>(s, W, H);
    CHECK_LAUNCH();
    std::vector<float> host(W * H);
    CHECK(cudaMemcpy2DFromArray(host.data(), W * sizeof(float), arr, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) EXPECT(host[y * W + x] == (float)(x * 100 + y));
    std::printf("surf2Dwrite ok\n");
    if (hold) {
        std::printf("holding arrays\n");
        std::fflush(stdout);
        sleep(120);
        return 0;
    }

    float *dout;
    CHECK(cudaMalloc(&dout, W * H * sizeof(float)));
    const int shifts[][2] = {{0, 0}, {-3, 0}, {4, 2}, {0, -5}, {20, 20}};
    for (auto &sh : shifts)
        for (int clamp = 0; clamp < 2; clamp++) {
            read_shifted<<<1, dim3(W, H)>>>(s, dout, W, H, sh[0], sh[1], clamp);
            CHECK_LAUNCH();
            CHECK(cudaMemcpy(host.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    int sx = x + sh[0], sy = y + sh[1];
                    bool inside = sx >= 0 && sx < W && sy >= 0 && sy < H;
                    int cx = sx < 0 ? 0 : (sx >= W ? W - 1 : sx), cy = sy < 0 ? 0 : (sy >= H ? H - 1 : sy);
                    float want = inside || clamp ? (float)(cx * 100 + cy) : 0.0f;
                    EXPECT(host[y * W + x] == want);
                }
        }
    std::printf("surf2Dread with zero and clamp boundaries ok\n");

    // A texture object of the array the surface wrote.
    cudaResourceDesc res;
    CHECK(cudaGetSurfaceObjectResourceDesc(&res, s));
    EXPECT(res.resType == cudaResourceTypeArray && res.res.array.array == arr);
    cudaTextureDesc td;
    std::memset(&td, 0, sizeof td);
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    through_texture<<<1, dim3(W, H)>>>(t, dout, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(host.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) EXPECT(host[y * W + x] == (float)(x * 100 + y));
    std::printf("texture of the surface's array ok\n");
    CHECK(cudaDestroyTextureObject(t));

    // --- A 3D uchar4 array, written with cudaMemcpy3D, inverted in place through a surface.
    const int X = 6, Y = 5, Z = 4;
    cudaChannelFormatDesc c4 = cudaCreateChannelDesc<uchar4>();
    cudaArray_t vol;
    CHECK(cudaMalloc3DArray(&vol, &c4, make_cudaExtent(X, Y, Z), cudaArraySurfaceLoadStore));
    cudaExtent extent;
    unsigned int flags;
    cudaChannelFormatDesc vdesc;
    CHECK(cudaArrayGetInfo(&vdesc, &extent, &flags, vol));
    EXPECT(vdesc.x == 8 && vdesc.w == 8 && vdesc.f == cudaChannelFormatKindUnsigned);
    std::printf("volume: extent %zux%zux%zu, flags %u\n", extent.width, extent.height, extent.depth, flags);
    std::vector<uchar4> voxels(X * Y * Z), back(X * Y * Z);
    for (int i = 0; i < X * Y * Z; i++) voxels[i] = make_uchar4(i, i * 2, i * 3, 7);
    cudaMemcpy3DParms p;
    std::memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(voxels.data(), X * sizeof(uchar4), X, Y);
    p.dstArray = vol;
    p.extent = make_cudaExtent(X, Y, Z);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaSurfaceObject_t sv = surface_of(vol);
    invert3d<<<Z, dim3(X, Y)>>>(sv, X, Y, Z);
    CHECK_LAUNCH();
    std::memset(&p, 0, sizeof p);
    p.srcArray = vol;
    p.dstPtr = make_cudaPitchedPtr(back.data(), X * sizeof(uchar4), X, Y);
    p.extent = make_cudaExtent(X, Y, Z);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    for (int i = 0; i < X * Y * Z; i++) {
        uchar4 v = voxels[i];
        EXPECT(back[i].x == 255 - v.x && back[i].y == 255 - v.y && back[i].z == 255 - v.z && back[i].w == 7);
    }
    // One slab of the volume, from the corner (1, 2, 1), 3 x 2 x 2 texels.
    std::vector<uchar4> slab(3 * 2 * 2);
    std::memset(&p, 0, sizeof p);
    p.srcArray = vol;
    p.srcPos = make_cudaPos(1, 2, 1);
    p.dstPtr = make_cudaPitchedPtr(slab.data(), 3 * sizeof(uchar4), 3, 2);
    p.extent = make_cudaExtent(3, 2, 2);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 2; y++)
            for (int x = 0; x < 3; x++) {
                int i = ((z + 1) * Y + (y + 2)) * X + (x + 1);
                EXPECT(std::memcmp(&slab[(z * 2 + y) * 3 + x], &back[i], 4) == 0);
            }
    std::printf("surf3D and 3D copies ok\n");

    // --- Misuse.
    cudaSurfaceObject_t bad = 0;
    cudaError_t e = cudaCreateSurfaceObject(&bad, nullptr);
    std::printf("surface without a resource: %s\n", cudaGetErrorName(e));
    std::memset(&p, 0, sizeof p);
    p.srcArray = vol;
    p.srcPos = make_cudaPos(4, 0, 0);
    p.dstPtr = make_cudaPitchedPtr(back.data(), X * sizeof(uchar4), X, Y);
    p.extent = make_cudaExtent(3, 1, 1);
    p.kind = cudaMemcpyDeviceToHost;
    e = cudaMemcpy3D(&p);
    std::printf("3D copy past the array: %s\n", cudaGetErrorName(e));
    std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));

    CHECK(cudaDestroySurfaceObject(s));
    CHECK(cudaDestroySurfaceObject(sv));
    CHECK(cudaFreeArray(arr));
    CHECK(cudaFreeArray(vol));
    CHECK(cudaFree(dout));
    std::printf("done\n");
    return 0;
}
