// CUDA arrays, texture objects and surface objects through the driver API (linked with -lcuda):
// arrays made with cuArrayCreate/cuArray3DCreate and described back, 1D copies (HtoA, AtoH,
// DtoA, AtoD, AtoA), cuMemcpy2D and cuMemcpy3D between host, device and array memory (with
// offsets and pitches, synchronous and on a stream), a texture object whose 8-bit texels the
// driver promotes to [0, 1] unless told to read integers, a surface object written by a kernel,
// a mipmapped array's levels, and the driver's errors for descriptors it refuses. Checks its own
// results; prints only what does not depend on the GPU model.
#include <cstring>
#include <vector>
#include <cuda.h>
#include "driver_check.h"

__global__ void sample(CUtexObject t, float *out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}

__global__ void sample_int(CUtexObject t, unsigned *out, int w) {
    int x = threadIdx.x;
    if (x < w) out[x] = tex2D<unsigned char>(t, x + 0.5f, 0.5f);
}

__global__ void stamp(CUsurfObject s, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) surf2Dwrite(x * 100 + y, s, x * (int)sizeof(int), y);
}

int main() {
    CHECK(cudaFree(0));
    CU(cuInit(0));
    CUcontext ctx;
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));

    // --- A 2D array of floats, described back.
    const int W = 16, H = 8;
    CUDA_ARRAY_DESCRIPTOR ad;
    std::memset(&ad, 0, sizeof ad);
    ad.Width = W;
    ad.Height = H;
    ad.Format = CU_AD_FORMAT_FLOAT;
    ad.NumChannels = 1;
    CUarray arr;
    CU(cuArrayCreate(&arr, &ad));
    CUDA_ARRAY_DESCRIPTOR back;
    CU(cuArrayGetDescriptor(&back, arr));
    EXPECT(back.Width == W && back.Height == H && back.Format == CU_AD_FORMAT_FLOAT && back.NumChannels == 1);
    CUDA_ARRAY3D_DESCRIPTOR back3;
    CU(cuArray3DGetDescriptor(&back3, arr));
    EXPECT(back3.Width == W && back3.Height == H && back3.Depth == 0 && back3.Flags == 0);
    std::printf("2D array described back: %zux%zu float x%u\n", back.Width, back.Height, back.NumChannels);

    // --- cuMemcpy2D: host rows (pitch wider than a row) into the array at an offset, back out
    // through device memory.
    const int HP = W + 5;
    std::vector<float> host(HP * H, -1.0f);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) host[y * HP + x] = (float)(y * 100 + x);
    CUDA_MEMCPY2D c;
    std::memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host.data();
    c.srcPitch = HP * sizeof(float);
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = arr;
    c.WidthInBytes = W * sizeof(float);
    c.Height = H;
    CU(cuMemcpy2D(&c));
    CUdeviceptr dev2d;
    size_t dpitch = 0;
    CU(cuMemAllocPitch(&dev2d, &dpitch, W * sizeof(float), H, 4));
    std::memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = arr;
    c.srcXInBytes = 2 * sizeof(float);
    c.srcY = 1;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dev2d;
    c.dstPitch = dpitch;
    c.WidthInBytes = (W - 2) * sizeof(float);
    c.Height = H - 1;
    CU(cuMemcpy2D(&c));
    std::vector<float> out((W - 2) * (H - 1));
    std::memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = dev2d;
    c.srcPitch = dpitch;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = out.data();
    c.dstPitch = (W - 2) * sizeof(float);
    c.WidthInBytes = (W - 2) * sizeof(float);
    c.Height = H - 1;
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU(cuMemcpy2DAsync(&c, stream));
    CU(cuStreamSynchronize(stream));
    for (int y = 0; y < H - 1; y++)
        for (int x = 0; x < W - 2; x++) EXPECT(out[y * (W - 2) + x] == (float)((y + 1) * 100 + x + 2));
    std::printf("cuMemcpy2D host -> array -> pitched device -> host (async): ok\n");

    // --- A texture object over the array: texel centres read back exactly.
    CUDA_RESOURCE_DESC rd;
    std::memset(&rd, 0, sizeof rd);
    rd.resType = CU_RESOURCE_TYPE_ARRAY;
    rd.res.array.hArray = arr;
    CUDA_TEXTURE_DESC td;
    std::memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    td.filterMode = CU_TR_FILTER_MODE_POINT;
    CUtexObject tex;
    CU(cuTexObjectCreate(&tex, &rd, &td, nullptr));
    float *dout;
    CHECK(cudaMalloc(&dout, W * H * sizeof(float)));
    sample<<<1, dim3(W, H)>>>(tex, dout, W, H);
    CHECK_LAUNCH();
    std::vector<float> sampled(W * H);
    CHECK(cudaMemcpy(sampled.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) EXPECT(sampled[y * W + x] == (float)(y * 100 + x));
    CUDA_RESOURCE_DESC rq;
    CU(cuTexObjectGetResourceDesc(&rq, tex));
    EXPECT(rq.resType == CU_RESOURCE_TYPE_ARRAY && rq.res.array.hArray == arr);
    CUDA_TEXTURE_DESC tq;
    CU(cuTexObjectGetTextureDesc(&tq, tex));
    EXPECT(tq.addressMode[0] == CU_TR_ADDRESS_MODE_CLAMP && tq.filterMode == CU_TR_FILTER_MODE_POINT &&
           (tq.flags & CU_TRSF_NORMALIZED_COORDINATES) == 0);
    CU(cuTexObjectDestroy(tex));
    std::printf("texture object over a driver array: texel centres exact, queries ok\n");

    // --- 8-bit texels: promoted to [0, 1] by default, integers with CU_TRSF_READ_AS_INTEGER.
    CUDA_ARRAY3D_DESCRIPTOR a3;
    std::memset(&a3, 0, sizeof a3);
    a3.Width = 4;
    a3.Height = 1;
    a3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    a3.NumChannels = 1;
    CUarray bytes;
    CU(cuArray3DCreate(&bytes, &a3));
    const unsigned char b[4] = {0, 51, 204, 255};
    CU(cuMemcpyHtoA(bytes, 0, b, sizeof b));
    rd.res.array.hArray = bytes;
    CU(cuTexObjectCreate(&tex, &rd, &td, nullptr));
    sample<<<1, dim3(4, 1)>>>(tex, dout, 4, 1);
    CHECK_LAUNCH();
    float promoted[4];
    CHECK(cudaMemcpy(promoted, dout, sizeof promoted, cudaMemcpyDeviceToHost));
    std::printf("8-bit texels read as floats: %.3f %.3f %.3f %.3f\n", promoted[0], promoted[1], promoted[2], promoted[3]);
    CU(cuTexObjectGetTextureDesc(&tq, tex));
    EXPECT((tq.flags & CU_TRSF_READ_AS_INTEGER) == 0);
    CU(cuTexObjectDestroy(tex));
    td.flags = CU_TRSF_READ_AS_INTEGER;
    CU(cuTexObjectCreate(&tex, &rd, &td, nullptr));
    unsigned *dints;
    CHECK(cudaMalloc(&dints, 4 * sizeof(unsigned)));
    sample_int<<<1, 4>>>(tex, dints, 4);
    CHECK_LAUNCH();
    unsigned ints[4];
    CHECK(cudaMemcpy(ints, dints, sizeof ints, cudaMemcpyDeviceToHost));
    std::printf("8-bit texels read as integers: %u %u %u %u\n", ints[0], ints[1], ints[2], ints[3]);
    CU(cuTexObjectGetTextureDesc(&tq, tex));
    EXPECT((tq.flags & CU_TRSF_READ_AS_INTEGER) != 0);
    CU(cuTexObjectDestroy(tex));

    // --- 1D copies: device -> array -> array -> host, at byte offsets.
    unsigned char *dbytes;
    CHECK(cudaMalloc(&dbytes, 4));
    CU(cuMemcpyAtoD((CUdeviceptr)dbytes, bytes, 1, 3));
    CUarray bytes2;
    CU(cuArray3DCreate(&bytes2, &a3));
    CU(cuMemcpyHtoA(bytes2, 0, "\x07\x07\x07\x07", 4));
    CU(cuMemcpyDtoA(bytes2, 0, (CUdeviceptr)dbytes, 2));
    CU(cuMemcpyAtoA(bytes2, 3, bytes, 0, 1));
    unsigned char got[4];
    CU(cuMemcpyAtoHAsync(got, bytes2, 0, 4, stream));
    CU(cuStreamSynchronize(stream));
    std::printf("1D array copies: %u %u %u %u\n", got[0], got[1], got[2], got[3]);
    EXPECT(got[0] == 51 && got[1] == 204 && got[2] == 7 && got[3] == 0);

    // --- A surface object over an array made for load/store, written by a kernel, read with
    // cuMemcpy3D into host memory with a slice pitch.
    CUDA_ARRAY3D_DESCRIPTOR sd;
    std::memset(&sd, 0, sizeof sd);
    sd.Width = 8;
    sd.Height = 4;
    sd.Format = CU_AD_FORMAT_SIGNED_INT32;
    sd.NumChannels = 1;
    sd.Flags = CUDA_ARRAY3D_SURFACE_LDST;
    CUarray sarr;
    CU(cuArray3DCreate(&sarr, &sd));
    rd.res.array.hArray = sarr;
    CUsurfObject surf;
    CU(cuSurfObjectCreate(&surf, &rd));
    stamp<<<1, dim3(8, 4)>>>(surf, 8, 4);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CUDA_RESOURCE_DESC sq;
    CU(cuSurfObjectGetResourceDesc(&sq, surf));
    EXPECT(sq.resType == CU_RESOURCE_TYPE_ARRAY && sq.res.array.hArray == sarr);
    std::vector<int> stamped(10 * 4, -1);
    CUDA_MEMCPY3D c3;
    std::memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c3.srcArray = sarr;
    c3.dstMemoryType = CU_MEMORYTYPE_HOST;
    c3.dstHost = stamped.data();
    c3.dstPitch = 10 * sizeof(int);
    c3.dstHeight = 4;
    c3.WidthInBytes = 8 * sizeof(int);
    c3.Height = 4;
    c3.Depth = 1;
    CU(cuMemcpy3D(&c3));
    for (int y = 0; y < 4; y++) {
        for (int x = 0; x < 8; x++) EXPECT(stamped[y * 10 + x] == x * 100 + y);
        EXPECT(stamped[y * 10 + 8] == -1 && stamped[y * 10 + 9] == -1);
    }
    CU(cuSurfObjectDestroy(surf));
    std::printf("surface object written by a kernel, read with cuMemcpy3D: ok\n");

    // --- A 3D array filled and read back with cuMemcpy3D (linear device memory in between).
    CUDA_ARRAY3D_DESCRIPTOR vd;
    std::memset(&vd, 0, sizeof vd);
    vd.Width = 4;
    vd.Height = 3;
    vd.Depth = 2;
    vd.Format = CU_AD_FORMAT_HALF;
    vd.NumChannels = 2;
    CUarray vol;
    CU(cuArray3DCreate(&vol, &vd));
    CU(cuArray3DGetDescriptor(&back3, vol));
    EXPECT(back3.Width == 4 && back3.Height == 3 && back3.Depth == 2 && back3.Format == CU_AD_FORMAT_HALF &&
           back3.NumChannels == 2);
    const int row = 4 * 4, n = row * 3 * 2;  // bytes: 4 texels of two halves
    std::vector<unsigned char> src(n), dst(n, 0);
    for (int i = 0; i < n; i++) src[i] = (unsigned char)(i * 7 + 1);
    CUdeviceptr lin;
    CU(cuMemAlloc(&lin, n));
    CU(cuMemcpyHtoD(lin, src.data(), n));
    std::memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c3.srcDevice = lin;
    c3.srcPitch = row;
    c3.srcHeight = 3;
    c3.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c3.dstArray = vol;
    c3.WidthInBytes = row;
    c3.Height = 3;
    c3.Depth = 2;
    CU(cuMemcpy3DAsync(&c3, stream));
    std::memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c3.srcArray = vol;
    c3.srcY = 1;
    c3.srcZ = 1;
    c3.dstMemoryType = CU_MEMORYTYPE_HOST;
    c3.dstHost = dst.data();
    c3.dstPitch = row;
    c3.dstHeight = 2;
    c3.WidthInBytes = row;
    c3.Height = 2;
    c3.Depth = 1;
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpy3D(&c3));
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < row; x++) EXPECT(dst[y * row + x] == src[(1 * 3 + y + 1) * row + x]);
    std::printf("cuMemcpy3D device -> 3D array -> host (corner 0,1,1): ok\n");

    // --- A mipmapped array: levels halve, each its own array.
    CUDA_ARRAY3D_DESCRIPTOR md;
    std::memset(&md, 0, sizeof md);
    md.Width = 16;
    md.Height = 8;
    md.Format = CU_AD_FORMAT_FLOAT;
    md.NumChannels = 4;
    CUmipmappedArray mip;
    CU(cuMipmappedArrayCreate(&mip, &md, 3));
    for (unsigned l = 0; l < 3; l++) {
        CUarray level;
        CU(cuMipmappedArrayGetLevel(&level, mip, l));
        CU(cuArray3DGetDescriptor(&back3, level));
        std::printf("mip level %u: %zux%zu x%u\n", l, back3.Width, back3.Height, back3.NumChannels);
    }
    CU(cuMipmappedArrayDestroy(mip));

    // --- What the driver refuses.
    ad.NumChannels = 3;
    CUarray bad;
    std::printf("cuArrayCreate with 3 channels: %s\n", name_of(cuArrayCreate(&bad, &ad)));
    ad.NumChannels = 1;
    ad.Width = 0;
    std::printf("cuArrayCreate of width 0: %s\n", name_of(cuArrayCreate(&bad, &ad)));
    std::memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host.data();
    c.srcPitch = 4;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = arr;
    c.WidthInBytes = 8;
    c.Height = 2;
    std::printf("cuMemcpy2D with a pitch below the width: %s\n", name_of(cuMemcpy2D(&c)));
    c.srcPitch = HP * sizeof(float);
    c.dstXInBytes = (W - 1) * sizeof(float);
    std::printf("cuMemcpy2D past an array's row: %s\n", name_of(cuMemcpy2D(&c)));
    rd.resType = CU_RESOURCE_TYPE_LINEAR;
    rd.res.linear.devPtr = lin;
    rd.res.linear.format = CU_AD_FORMAT_FLOAT;
    rd.res.linear.numChannels = 1;
    rd.res.linear.sizeInBytes = n;
    std::printf("cuSurfObjectCreate over linear memory: %s\n", name_of(cuSurfObjectCreate(&surf, &rd)));

    CU(cuArrayDestroy(arr));
    CU(cuArrayDestroy(bytes));
    CU(cuArrayDestroy(bytes2));
    CU(cuArrayDestroy(sarr));
    CU(cuArrayDestroy(vol));
    CU(cuMemFree(lin));
    CU(cuMemFree(dev2d));
    CU(cuStreamDestroy(stream));
    std::printf("done\n");
    return 0;
}
