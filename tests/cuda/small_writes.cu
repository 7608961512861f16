// Rewrites one small region of a large buffer, again and again, for recopy and migration
// tests (usage: small_writes ROUNDS): a 64 MiB buffer, every byte 0x11 at the start; round r
// copies 4 KiB of the value r into it, 20 MiB in, and waits a millisecond. At the end the
// whole buffer is read back: the region holds the last round's value, everything else 0x11.
#include "check.h"
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 100;
    const size_t size = 64u << 20, at = 20u << 20, len = 4096;
    unsigned char *buf;
    CHECK(cudaMalloc(&buf, size));
    CHECK(cudaMemset(buf, 0x11, size));
    std::vector<unsigned char> region(len);
    for (int r = 1; r <= rounds; r++) {
        std::memset(region.data(), r & 0xff, len);
        CHECK(cudaMemcpy(buf + at, region.data(), len, cudaMemcpyHostToDevice));
        if (r == 10) {
            std::printf("running\n");
            std::fflush(stdout);
        }
        usleep(1000);
    }
    std::vector<unsigned char> all(size);
    CHECK(cudaMemcpy(all.data(), buf, size, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < size; i++) {
        unsigned char want = (i >= at && i < at + len) ? (unsigned char)(rounds & 0xff) : 0x11;
        if (all[i] != want) {
            std::printf("FAILED: byte %zu is %u, expected %u\n", i, all[i], want);
            return 1;
        }
    }
    CHECK(cudaFree(buf));
    std::printf("PASS\n");
    return 0;
}
