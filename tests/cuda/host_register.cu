// Host memory registered with cudaHostRegister: malloc'd and mmap'd buffers with unaligned
// starts and sizes, kernels reading and writing them through their device pointers,
// synchronous and asynchronous copies both ways, bytes around the range on its first and
// last page left alone, contents kept by cudaHostUnregister, pointer attributes and flags,
// and misuse.
#include "check.h"
#include <cstdint>
#include <cstring>
#include <sys/mman.h>

__global__ void add_offset(unsigned *p, unsigned k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += k + (unsigned)i;
}

__global__ void sum_into(const unsigned *in, unsigned long long *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(out, (unsigned long long)in[i]);
}

static unsigned long long checksum(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(((i + seed) * 2654435761u) >> 13);
}

int main() {
    // --- A malloc'd buffer, registered from an unaligned start for an unaligned size, with
    // marked bytes just outside the range (on its first and last page).
    const size_t n = 3 * 65536 + 17; // unsigned values
    const size_t bytes = n * sizeof(unsigned);
    unsigned char *block = (unsigned char *)std::malloc(bytes + 4096 + 64);
    unsigned *h = (unsigned *)(block + 36); // not page aligned
    std::memset(block, 0x5a, 36);
    std::memset((unsigned char *)h + bytes, 0xa5, 64);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned)(i * 7);
    CHECK(cudaHostRegister(h, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    bool around = true;
    for (int i = 0; i < 36; i++) around &= block[i] == 0x5a;
    for (int i = 0; i < 64; i++) around &= ((unsigned char *)h + bytes)[i] == 0xa5;
    bool kept = true;
    for (size_t i = 0; i < n; i++) kept &= h[i] == (unsigned)(i * 7);
    std::printf("registered: contents kept %s, bytes around kept %s\n", kept ? "yes" : "no", around ? "yes" : "no");

    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, h + 10));
    std::printf("flags: portable %s, mapped %s\n", flags & cudaHostRegisterPortable ? "yes" : "no",
                flags & cudaHostRegisterMapped ? "yes" : "no");

    // Kernels read and write it through its device pointer.
    unsigned *d;
    CHECK(cudaHostGetDevicePointer((void **)&d, h, 0));
    unsigned *dmid;
    CHECK(cudaHostGetDevicePointer((void **)&dmid, h + 1000, 0));
    EXPECT(dmid == d + 1000);
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, h + 5));
    EXPECT(a.hostPointer == (void *)(h + 5) && a.devicePointer == (void *)(d + 5));
    std::printf("attributes: type=%d\n", (int)a.type);

    unsigned long long *dsum;
    CHECK(cudaMalloc((void **)&dsum, sizeof(unsigned long long)));
    CHECK(cudaMemset(dsum, 0, sizeof(unsigned long long)));
    const int threads = 256, blocks = (int)((n + threads - 1) / threads);
    sum_into<<<blocks, threads>>>(d, dsum, (int)n);
    CHECK_LAUNCH();
    unsigned long long sum = 0, want = 0;
    CHECK(cudaMemcpy(&sum, dsum, sizeof sum, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) want += (unsigned)(i * 7);
    std::printf("kernel read through the device pointer: %s (%llu)\n", sum == want ? "right" : "wrong", sum);
    add_offset<<<blocks, threads>>>(d, 3u, (int)n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != (unsigned)(i * 7) + 3u + (unsigned)i;
    std::printf("kernel wrote through the device pointer: %u wrong\n", bad);

    // Synchronous copies both ways, whole and from an offset.
    unsigned *dev;
    CHECK(cudaMalloc((void **)&dev, bytes));
    CHECK(cudaMemcpy(dev, h, bytes, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < n; i++) h[i] = 0;
    CHECK(cudaMemcpy(h + 1, dev + 1, bytes - 2 * sizeof(unsigned), cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 1; i + 1 < n; i++) bad += h[i] != (unsigned)(i * 7) + 3u + (unsigned)i;
    std::printf("synchronous copies: %u wrong, ends %u %u\n", bad, h[0], h[n - 1]);
    h[0] = 3u;
    h[n - 1] = (unsigned)((n - 1) * 7) + 3u + (unsigned)(n - 1);

    // --- An mmap'd buffer (whole pages, registered from an offset), copies on a stream.
    const size_t mbytes = (9u << 20) + 4096;
    unsigned char *m = (unsigned char *)mmap(nullptr, mbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(m != MAP_FAILED);
    unsigned char *src = m + 100;
    const size_t half = (4u << 20) + 333;
    unsigned char *dst = src + half + 11;
    fill(src, half, 1);
    std::memset(dst, 0, half);
    CHECK(cudaHostRegister(m + 100, 2 * half + 11, cudaHostRegisterDefault));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned char *mdev;
    CHECK(cudaMalloc((void **)&mdev, half));
    CHECK(cudaMemcpyAsync(mdev, src, half, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemsetAsync(mdev + 5000, 0x77, 123, s));
    CHECK(cudaMemcpyAsync(dst, mdev, half, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    bool set = true;
    for (int i = 5000; i < 5123; i++) set &= dst[i] == 0x77;
    std::memset(dst + 5000, 0, 123);
    std::memset(src + 5000, 0, 123);
    std::printf("asynchronous copies: %s, memset seen %s, checksum=%016llx\n",
                std::memcmp(src, dst, half) == 0 ? "same" : "different", set ? "yes" : "no", checksum(dst, half));

    // --- Misuse.
    std::printf("register null: %s\n", cudaGetErrorName(cudaHostRegister(nullptr, 4096, 0)));
    cudaGetLastError();
    std::printf("register zero bytes: %s\n", cudaGetErrorName(cudaHostRegister(h, 0, 0)));
    cudaGetLastError();
    std::printf("register an overlap: %s\n", cudaGetErrorName(cudaHostRegister(h + 100, 4096, 0)));
    cudaGetLastError();
    std::printf("register the same range again: %s\n", cudaGetErrorName(cudaHostRegister(src, half, 0)));
    cudaGetLastError();
    unsigned char *plain = (unsigned char *)std::malloc(8192);
    std::printf("unregister unknown memory: %s\n", cudaGetErrorName(cudaHostUnregister(plain)));
    cudaGetLastError();
    std::printf("unregister inside a range: %s\n", cudaGetErrorName(cudaHostUnregister(h + 1)));
    cudaGetLastError();
    std::printf("register I/O memory that is not: %s\n",
                cudaHostRegister(plain, 8192, cudaHostRegisterIoMemory) == cudaSuccess ? "accepted" : "refused");
    cudaGetLastError();

    // --- Unregistering keeps the contents (and the bytes around), and the memory stays usable.
    unsigned long long before = checksum(h, bytes);
    CHECK(cudaHostUnregister(h));
    around = true;
    for (int i = 0; i < 36; i++) around &= block[i] == 0x5a;
    for (int i = 0; i < 64; i++) around &= ((unsigned char *)h + bytes)[i] == 0xa5;
    std::printf("unregistered: contents kept %s, bytes around kept %s\n", checksum(h, bytes) == before ? "yes" : "no",
                around ? "yes" : "no");
    for (size_t i = 0; i < n; i++) h[i] ^= 0xffffffffu;
    EXPECT(h[2] == ~(2u * 7 + 3u + 2u));
    std::printf("unregister again: %s\n", cudaGetErrorName(cudaHostUnregister(h)));
    cudaGetLastError();
    unsigned long long mbefore = checksum(m, mbytes);
    CHECK(cudaHostUnregister(m + 100));
    std::printf("mmap'd contents kept: %s\n", checksum(m, mbytes) == mbefore ? "yes" : "no");

    // The same memory registered again is reachable again.
    CHECK(cudaHostRegister(h, bytes, cudaHostRegisterMapped));
    CHECK(cudaHostGetDevicePointer((void **)&d, h, 0));
    add_offset<<<blocks, threads>>>(d, 1u, (int)n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != ~((unsigned)(i * 7) + 3u + (unsigned)i) + 1u + (unsigned)i;
    std::printf("registered again, kernel wrote: %u wrong\n", bad);
    CHECK(cudaHostUnregister(h));

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dev));
    CHECK(cudaFree(mdev));
    CHECK(cudaFree(dsum));
    munmap(m, mbytes);
    std::free(plain);
    std::free(block);
    std::printf("done\n");
    return 0;
}
