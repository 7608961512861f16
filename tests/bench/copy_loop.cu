// Host<->device copies of 8 MiB in a loop (for tests that stop a guest in the middle of a
// copy). Prints "copying" once the first round trip is done, then "done" after N rounds
// (argument, default 4).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

int main(int argc, char **argv) {
    long rounds = argc > 1 ? std::atol(argv[1]) : 4;
    const size_t n = 8 << 20;
    std::vector<unsigned char> host(n, 7), back(n);
    unsigned char *dev;
    if (cudaMalloc(&dev, n) != cudaSuccess) return 1;
    for (long r = 0; r < rounds; r++) {
        if (cudaMemcpy(dev, host.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) return 2;
        if (cudaMemcpy(back.data(), dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return 3;
        if (back[n - 1] != 7) return 4;
        if (r == 0) {
            std::printf("copying\n");
            std::fflush(stdout);
        }
    }
    std::printf("done\n");
    return 0;
}
