// Memory operations without kernels: memset, copies in every direction (explicit and
// cudaMemcpyDefault), pinned host memory, a large copy, and allocation bookkeeping.
#include "check.h"
#include <cstring>
#include <vector>

static unsigned long long checksum(const unsigned char *p, size_t n) {
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main() {
    const size_t n = 64 << 20;
    std::vector<unsigned char> a(n), b(n);
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)((i * 2654435761u) >> 13);
    unsigned char *d1, *d2;
    CHECK(cudaMalloc(&d1, n));
    CHECK(cudaMalloc(&d2, n));
    CHECK(cudaMemcpy(d1, a.data(), n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d2, d1, n, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(b.data(), d2, n, cudaMemcpyDeviceToHost));
    EXPECT(std::memcmp(a.data(), b.data(), n) == 0);
    std::printf("64 MiB round trip checksum=%016llx\n", checksum(b.data(), n));

    // memset, then copy a window back with cudaMemcpyDefault.
    CHECK(cudaMemset(d2 + 1000, 0x5a, 5000));
    std::vector<unsigned char> w(7000);
    CHECK(cudaMemcpy(w.data(), d2 + 0, 7000, cudaMemcpyDefault));
    for (int i = 0; i < 7000; i++) EXPECT(w[i] == (i >= 1000 && i < 6000 ? 0x5a : a[i]));
    std::printf("memset window ok\n");

    // Host to host through the runtime.
    unsigned char x[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, y[16] = {};
    CHECK(cudaMemcpy(y, x, 16, cudaMemcpyHostToHost));
    EXPECT(std::memcmp(x, y, 16) == 0);
    CHECK(cudaMemcpy(y, x, 16, cudaMemcpyDefault));

    // Pinned memory and async copies on the default stream.
    unsigned char *pinned;
    CHECK(cudaHostAlloc((void **)&pinned, 1 << 20, cudaHostAllocDefault));
    CHECK(cudaMemcpyAsync(pinned, d1, 1 << 20, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaMemsetAsync(d1, 0, 1 << 20, 0));
    CHECK(cudaDeviceSynchronize());
    EXPECT(std::memcmp(pinned, a.data(), 1 << 20) == 0);
    CHECK(cudaMemcpy(pinned, d1, 1 << 20, cudaMemcpyDeviceToHost));
    for (int i = 0; i < (1 << 20); i++) EXPECT(pinned[i] == 0);
    CHECK(cudaFreeHost(pinned));
    std::printf("pinned ok\n");

    // Many small allocations: distinct, aligned, and all usable.
    std::vector<int *> small(1000);
    for (int i = 0; i < 1000; i++) {
        CHECK(cudaMalloc(&small[i], 4 + i));
        EXPECT(((unsigned long long)small[i] % 256) == 0);
        CHECK(cudaMemset(small[i], i & 0xff, 4 + i));
    }
    for (int i = 0; i < 1000; i += 97) {
        unsigned char v[4];
        CHECK(cudaMemcpy(v, small[i], 4, cudaMemcpyDeviceToHost));
        EXPECT(v[0] == (i & 0xff) && v[3] == (i & 0xff));
    }
    for (int i = 0; i < 1000; i++) CHECK(cudaFree(small[i]));
    std::printf("1000 small allocations ok\n");

    CHECK(cudaFree(d1));
    CHECK(cudaFree(d2));
    CHECK(cudaMemcpy(b.data(), a.data(), 0, cudaMemcpyHostToHost));
    std::printf("PASS\n");
    return 0;
}
