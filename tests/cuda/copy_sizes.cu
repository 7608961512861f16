// Synchronous and async host<->device copies of pageable memory at odd sizes and offsets,
// around the sizes where a copy's path may change (one byte, a page, 64 KiB, 256 KiB, a
// mebibyte): each arrives whole, in both directions, and a device-to-host copy writes exactly
// its bytes (guard bytes around it stay). A copy of zero bytes succeeds; an unknown kind is
// refused before anything moves.
#include "check.h"
#include <cstring>
#include <vector>

static unsigned char pattern(size_t i, int round) { return (unsigned char)(i * 131 + round * 7 + 1); }

int main() {
    const size_t sizes[] = {1, 3, 8, 100, 4095, 4096, 4097, 65535, 65537, 262143, 262144, 262145, 1048577};
    const size_t offsets[] = {0, 1, 13};
    const size_t guard = 64, largest = 1048577 + 64;
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, largest));
    std::vector<unsigned char> src(largest + guard), dst(largest + 2 * guard);
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int copies = 0, round = 0;
    for (size_t n : sizes) {
        for (size_t off : offsets) {
            for (int async = 0; async < 2; async++) {
                round++;
                for (size_t i = 0; i < n; i++) src[off + i] = pattern(i, round);
                std::memset(dst.data(), 0xA5, dst.size());
                unsigned char *d = dev + (off * 5) % 32;
                unsigned char *out = dst.data() + guard + off;
                if (async) {
                    CHECK(cudaMemcpyAsync(d, src.data() + off, n, cudaMemcpyHostToDevice, stream));
                    CHECK(cudaMemcpyAsync(out, d, n, cudaMemcpyDeviceToHost, stream));
                    CHECK(cudaStreamSynchronize(stream));
                } else {
                    CHECK(cudaMemcpy(d, src.data() + off, n, cudaMemcpyHostToDevice));
                    CHECK(cudaMemcpy(out, d, n, cudaMemcpyDeviceToHost));
                }
                for (size_t i = 0; i < n; i++) {
                    if (out[i] != pattern(i, round)) {
                        std::printf("FAILED: %zu bytes at offset %zu (%s): byte %zu differs\n", n, off,
                                    async ? "async" : "sync", i);
                        return 1;
                    }
                }
                for (size_t i = 0; i < guard + off; i++) EXPECT(dst[i] == 0xA5);
                for (size_t i = guard + off + n; i < dst.size(); i++) EXPECT(dst[i] == 0xA5);
                copies++;
            }
        }
    }
    std::printf("%d copies of %zu sizes arrived whole\n", copies, sizeof sizes / sizeof sizes[0]);

    // Device to host after a copy on the device: the copy reads what the device holds.
    CHECK(cudaMemset(dev, 0x3C, 4096));
    CHECK(cudaMemcpy(dev + 4096, dev, 4096, cudaMemcpyDeviceToDevice));
    std::memset(dst.data(), 0, 4096);
    CHECK(cudaMemcpy(dst.data(), dev + 4096, 4096, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < 4096; i++) EXPECT(dst[i] == 0x3C);
    std::printf("device-to-device then to host ok\n");

    // Zero bytes: nothing to move, success.
    CHECK(cudaMemcpy(dst.data(), dev, 0, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(dev, src.data(), 0, cudaMemcpyHostToDevice));
    // An unknown kind is refused, and the destination is left alone.
    std::memset(dst.data(), 0x5A, 16);
    cudaError_t e = cudaMemcpy(dst.data(), dev, 16, (cudaMemcpyKind)7);
    std::printf("unknown kind: %s\n", cudaGetErrorName(e));
    EXPECT(e != cudaSuccess);
    for (size_t i = 0; i < 16; i++) EXPECT(dst[i] == 0x5A);
    cudaGetLastError();

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dev));
    std::printf("PASS\n");
    return 0;
}
