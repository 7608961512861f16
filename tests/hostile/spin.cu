// A kernel that runs for as long as asked (argument: milliseconds; 0: for ever), then writes
// a result the host checks. Prints "launched" once the launch is sent, and "PASS" when the
// result is right: a session whose checkpoint gave up must carry on unharmed.
#include <cstdlib>

#include "check.h"

__global__ void spin(int *out, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (ns == 0 || now - start < ns);
    out[threadIdx.x] = 2 * threadIdx.x + 1;
}

int main(int argc, char **argv) {
    unsigned long long ms = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
    int *d;
    CHECK(cudaMalloc(&d, 64 * sizeof(int)));
    CHECK(cudaMemset(d, 0, 64 * sizeof(int)));
    // A first launch of the shape waits for its answer; later ones return once sent, so
    // "launched" is printed while the long kernel runs.
    spin<<<1, 64>>>(d, 1);
    CHECK(cudaDeviceSynchronize());
    spin<<<1, 64>>>(d, ms * 1000000ull);
    CHECK_LAUNCH();
    std::printf("launched\n");
    std::fflush(stdout);
    int h[64];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++) EXPECT(h[i] == 2 * i + 1);
    std::printf("PASS\n");
    return 0;
}
