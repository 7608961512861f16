// A workload that keeps launching kernels while it is checkpointed (usage: cr_busy GIB
// [WINDOW_KIB]): allocates GIB GiB in 256 MiB buffers and fills them, prints "ready", then
// launches kernels until a line arrives on stdin: each stamps a window (4 MiB by default) of
// one buffer (the buffers in
// turn, so that a concurrent checkpoint meets writes to memory it has not copied yet). Every
// 64 launches it synchronises and prints "t UNIX_SECONDS LAUNCHES KERNEL_US": the wall time,
// the launches so far, and the device time of the last launch (events), so that a script can
// tell the launch rate and the kernel time before, during and after a checkpoint.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <poll.h>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            std::printf("FAILED %s: %s\n", #call, cudaGetErrorString(e_));                   \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

const unsigned long long BUFFER = 256ull << 20;

__global__ void stamp(unsigned *p, unsigned long long words, unsigned window, unsigned step) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < window) p[(step * 7919ull * window + i) % words] = step * 2654435761u + i;
}

static double now() {
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const double gib = argc > 1 ? std::atof(argv[1]) : 1;
    if (gib < 0.25) {
        std::printf("usage: cr_busy GIB (at least 0.25) [WINDOW_KIB] [HOT_BUFFERS]\n");
        return 2;
    }
    const size_t count = (size_t)(gib * (1ull << 30) / BUFFER + 0.5);
    const unsigned window = (argc > 2 ? (unsigned)std::atoi(argv[2]) : 4096) * 256;
    // The kernels write the first HOT buffers in turn (all by default): fewer bound the
    // memory a checkpoint or migration finds written again.
    const size_t hot = argc > 3 ? std::max<size_t>(1, std::min<size_t>(count, std::atoi(argv[3]))) : count;
    std::vector<unsigned *> bufs(count);
    for (auto &b : bufs) {
        CHECK(cudaMalloc(&b, BUFFER));
        CHECK(cudaMemset(b, 0x5a, BUFFER));
    }
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t start, end;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end));
    std::printf("ready %zu buffers\n", count);
    std::fflush(stdout);
    pollfd in = {0, POLLIN, 0};
    for (unsigned step = 1;; step++) {
        const bool timed = step % 64 == 0;
        if (timed) CHECK(cudaEventRecord(start));
        stamp<<<(window + 255) / 256, 256>>>(bufs[step % hot], BUFFER / 4, window, step);
        CHECK(cudaGetLastError());
        if (timed) {
            CHECK(cudaEventRecord(end));
            CHECK(cudaEventSynchronize(end));
            float ms = 0;
            CHECK(cudaEventElapsedTime(&ms, start, end));
            std::printf("t %.6f %u %.1f\n", now(), step, ms * 1e3);
            std::fflush(stdout);
            if (poll(&in, 1, 0) > 0) break;
        }
    }
    std::printf("done\n");
    return 0;
}
