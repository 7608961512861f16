// Pitched 2D/3D memory, 2D/3D copies and memsets, peer and symbol copies, pointer attributes, registered host memory and stream-ordered pools.
#include "check.h"
#include <cstdint>
#include <cstring>
#include <utility>

__device__ int table[64];
int host_only[64];

__global__ void add_one(float *m, size_t pitch, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) ((float *)((char *)m + y * pitch))[x] += 1.0f;
}

__global__ void twice3d(cudaPitchedPtr p, int w, int h, int d) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y, z = blockIdx.z;
    if (x < w && y < h && z < d) ((float *)((char *)p.ptr + (z * h + y) * p.pitch))[x] *= 2.0f;
}

__global__ void bump(int *p, int n, int by) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += by;
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    // --- 2D: a 300x200 float matrix.
    const int W = 300, H = 200, HP = 320;  // HP: host row pitch in floats
    const size_t wb = W * sizeof(float);
    float *dm, *hm, *hout;
    size_t pitch = 0;
    CHECK(cudaMallocPitch((void **)&dm, &pitch, wb, H));
    EXPECT(pitch >= wb);
    std::printf("pitch ok\n");
    CHECK(cudaMallocHost(&hm, HP * H * sizeof(float)));
    CHECK(cudaMallocHost(&hout, HP * H * sizeof(float)));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < HP; x++) {
            hm[y * HP + x] = x < W ? (float)(y * 1000 + x) : -7.0f;
            hout[y * HP + x] = -5.0f;
        }
    CHECK(cudaMemcpy2D(dm, pitch, hm, HP * sizeof(float), wb, H, cudaMemcpyHostToDevice));
    add_one<<<dim3((W + 31) / 32, (H + 7) / 8), dim3(32, 8), 0, s>>>(dm, pitch, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy2DAsync(hout, HP * sizeof(float), dm, pitch, wb, H, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < HP; x++) EXPECT(hout[y * HP + x] == (x < W ? (float)(y * 1000 + x + 1) : -5.0f));
    std::printf("copy2d ok\n");

    // 2D device->device into a tightly packed buffer, then back.
    float *dlin;
    CHECK(cudaMalloc(&dlin, wb * H));
    CHECK(cudaMemcpy2D(dlin, wb, dm, pitch, wb, H, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(hm, dlin, wb * H, cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) EXPECT(hm[y * W + x] == (float)(y * 1000 + x + 1));
    std::printf("copy2d d2d ok\n");
    cudaError_t e = cudaMemcpy2D(hout, HP * sizeof(float), dm, 100, wb, 10, cudaMemcpyDeviceToHost);
    std::printf("copy2d width > spitch: %s\n", cudaGetErrorName(e));
    EXPECT(e != cudaSuccess);
    cudaGetLastError();

    // Memset2D: all zero, then two sub-rectangles (one async).
    unsigned char *hb = (unsigned char *)hout;
    CHECK(cudaMemset2D(dm, pitch, 0, wb, H));
    CHECK(cudaMemset2D((char *)dm + 10 * pitch + 40, pitch, 0x11, 200, 30));    // rows 10..39, bytes 40..239
    CHECK(cudaMemset2DAsync((char *)dm + 100 * pitch + 600, pitch, 0x22, 400, 50, s));  // rows 100..149, bytes 600..999
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy2D(hb, wb, dm, pitch, wb, H, cudaMemcpyDeviceToHost));
    long inside = 0;
    for (int y = 0; y < H; y++)
        for (size_t x = 0; x < wb; x++) {
            unsigned char want = 0;
            if (y >= 10 && y < 40 && x >= 40 && x < 240) want = 0x11;
            if (y >= 100 && y < 150 && x >= 600 && x < 1000) want = 0x22;
            EXPECT(hb[y * wb + x] == want);
            inside += want != 0;
        }
    std::printf("memset2d ok (%ld bytes set)\n", inside);

    // --- 3D: 40x30x8 floats.
    const int X = 40, Y = 30, Z = 8, XP = 50;  // XP: host row pitch in floats
    cudaExtent ext = make_cudaExtent(X * sizeof(float), Y, Z);
    cudaPitchedPtr dp;
    CHECK(cudaMalloc3D(&dp, ext));
    EXPECT(dp.pitch >= X * sizeof(float));
    std::printf("pitch3d ok\n");
    float *h3;
    CHECK(cudaMallocHost(&h3, XP * Y * Z * sizeof(float)));
    CHECK(cudaMemset3D(dp, 0, ext));
    // Sub-box: bytes 16..95 of rows 5..14 of slices 2..5.
    cudaPitchedPtr sub = make_cudaPitchedPtr((char *)dp.ptr + (2 * Y + 5) * dp.pitch + 16, dp.pitch, 80, Y);
    CHECK(cudaMemset3D(sub, 0x5a, make_cudaExtent(80, 10, 4)));
    cudaMemcpy3DParms p;
    std::memset(&p, 0, sizeof(p));
    p.srcPtr = dp;
    p.dstPtr = make_cudaPitchedPtr(h3, XP * sizeof(float), X * sizeof(float), Y);
    p.extent = ext;
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    for (int z = 0; z < Z; z++)
        for (int y = 0; y < Y; y++)
            for (int x = 0; x < X * 4; x++) {
                bool in = z >= 2 && z < 6 && y >= 5 && y < 15 && x >= 16 && x < 96;
                EXPECT(((unsigned char *)h3)[(z * Y + y) * XP * 4 + x] == (in ? 0x5a : 0));
            }
    std::printf("memset3d + copy3d ok\n");
    for (int i = 0; i < XP * Y * Z; i++) h3[i] = (float)(i % 977);
    std::memset(&p, 0, sizeof(p));
    p.srcPtr = make_cudaPitchedPtr(h3, XP * sizeof(float), X * sizeof(float), Y);
    p.dstPtr = dp;
    p.extent = ext;
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3DAsync(&p, s));
    twice3d<<<dim3(1, Y, Z), 64, 0, s>>>(dp, X, Y, Z);
    CHECK_LAUNCH();
    std::swap(p.srcPtr, p.dstPtr);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3DAsync(&p, s));
    CHECK(cudaStreamSynchronize(s));
    for (int z = 0; z < Z; z++)
        for (int y = 0; y < Y; y++)
            for (int x = 0; x < XP; x++) {
                int i = (z * Y + y) * XP + x;
                EXPECT(h3[i] == (float)(i % 977) * (x < X ? 2.0f : 1.0f));
            }
    std::printf("copy3d async ok\n");

    // --- Peer copies within device 0.
    const int n = 4096;
    int *da, *db, hi[n];
    CHECK(cudaMalloc(&da, n * sizeof(int)));
    CHECK(cudaMalloc(&db, n * sizeof(int)));
    for (int i = 0; i < n; i++) hi[i] = i * 7;
    CHECK(cudaMemcpy(da, hi, sizeof(hi), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyPeer(db, 0, da, 0, sizeof(hi)));
    bump<<<n / 256, 256, 0, s>>>(db, n, 1);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyPeerAsync(da, 0, db, 0, sizeof(hi), s));
    CHECK(cudaMemcpyAsync(hi, da, sizeof(hi), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(hi[i] == i * 7 + 1);
    std::printf("peer copies ok\n");

    // --- Symbols.
    int t[64], u[64];
    for (int i = 0; i < 64; i++) t[i] = 100 + i;
    CHECK(cudaMemcpyToSymbolAsync(table, t, sizeof(t), 0, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyFromSymbolAsync(u, table, 32 * sizeof(int), 32 * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 32; i++) EXPECT(u[i] == 132 + i);
    void *addr = nullptr;
    size_t size = 0;
    CHECK(cudaGetSymbolAddress(&addr, table));
    CHECK(cudaGetSymbolSize(&size, table));
    EXPECT(size == 256);
    std::printf("symbol size: %zu\n", size);
    std::memset(u, 0, sizeof(u));
    CHECK(cudaMemcpy(u, addr, sizeof(u), cudaMemcpyDeviceToHost));
    EXPECT(std::memcmp(t, u, sizeof(t)) == 0);
    std::printf("symbols ok\n");
    std::printf("symbol address of a host variable: %s\n", cudaGetErrorName(cudaGetSymbolAddress(&addr, host_only)));
    cudaGetLastError();

    // --- Pointer attributes.
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, da));
    EXPECT(a.type == cudaMemoryTypeDevice && a.device == 0 && a.devicePointer == da);
    std::printf("device pointer: type=%d\n", (int)a.type);
    CHECK(cudaPointerGetAttributes(&a, hm));
    EXPECT(a.type == cudaMemoryTypeHost);
    std::printf("pinned pointer: type=%d\n", (int)a.type);
    int *plain = (int *)std::malloc(4096);
    std::memset(&a, 0, sizeof(a));
    e = cudaPointerGetAttributes(&a, plain);
    std::printf("malloc pointer: %s type=%d\n", cudaGetErrorName(e), (int)a.type);
    cudaGetLastError();

    // --- Registered and portable host memory.
    const size_t rb = 64 * 1024;
    int *reg = (int *)aligned_alloc(4096, rb);
    for (size_t i = 0; i < rb / sizeof(int); i++) reg[i] = (int)i ^ 0x55;
    CHECK(cudaHostRegister(reg, rb, cudaHostRegisterDefault));
    // The flags read back depend on how the driver sub-allocates pinned memory (small
    // allocations share a chunk whose flags are reported), so only success is checked.
    unsigned int hf = 0;
    CHECK(cudaHostGetFlags(&hf, reg));
    int *port;
    CHECK(cudaHostAlloc(&port, rb, cudaHostAllocPortable));
    CHECK(cudaHostGetFlags(&hf, port));
    std::printf("host flags ok\n");
    std::printf("host flags of malloc memory: %s\n", cudaGetErrorName(cudaHostGetFlags(&hf, plain)));
    cudaGetLastError();
    CHECK(cudaPointerGetAttributes(&a, reg));
    EXPECT(a.type == cudaMemoryTypeHost);
    std::printf("registered pointer: type=%d\n", (int)a.type);
    int *dr;
    CHECK(cudaMalloc(&dr, rb));
    CHECK(cudaMemcpyAsync(dr, reg, rb, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(port, dr, rb, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(std::memcmp(reg, port, rb) == 0);
    std::printf("registered copy ok\n");
    CHECK(cudaHostUnregister(reg));
    std::printf("unregister twice: %s\n", cudaGetErrorName(cudaHostUnregister(reg)));
    cudaGetLastError();

    // --- Stream-ordered allocation and the default pool.
    int *pa = nullptr;
    CHECK(cudaMallocAsync((void **)&pa, n * sizeof(int), s));
    CHECK(cudaMemsetAsync(pa, 0, n * sizeof(int), s));
    bump<<<n / 256, 256, 0, s>>>(pa, n, 9);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(hi, pa, sizeof(hi), cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(pa, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(hi[i] == 9);
    std::printf("malloc async ok\n");
    cudaMemPool_t pool, cur;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX, back = 0;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &back));
    EXPECT(back == UINT64_MAX);
    std::printf("release threshold ok\n");
    CHECK(cudaMemPoolTrimTo(pool, 0));
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    EXPECT(cur == pool);
    std::printf("current pool is default\n");
    CHECK(cudaMallocFromPoolAsync((void **)&pa, n * sizeof(int), pool, s));
    CHECK(cudaMemcpyAsync(pa, da, n * sizeof(int), cudaMemcpyDeviceToDevice, s));
    bump<<<n / 256, 256, 0, s>>>(pa, n, -1);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(hi, pa, sizeof(hi), cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(pa, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(hi[i] == i * 7);
    std::printf("pool alloc ok\n");
    thr = 0;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    CHECK(cudaMemPoolTrimTo(pool, 0));

    CHECK(cudaFree(dr));
    CHECK(cudaFreeHost(port));
    std::free(reg);
    std::free(plain);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFreeHost(h3));
    CHECK(cudaFree(dp.ptr));
    CHECK(cudaFree(dlin));
    CHECK(cudaFreeHost(hm));
    CHECK(cudaFreeHost(hout));
    CHECK(cudaFree(dm));
    CHECK(cudaStreamDestroy(s));
    std::printf("done\n");
    return 0;
}
