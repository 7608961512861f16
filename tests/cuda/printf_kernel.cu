// Device printf: formats of every kind, from one warp (so the order is the lane order on a
// GPU too), interleaved with host output around synchronisation points.
#include "check.h"

__global__ void hello(int base, float scale, const char *tag) {
    int t = threadIdx.x;
    printf("thread %d: base+t=%d hex=%#x scaled=%.3f e=%e tag=%s char=%c\n", t, base + t, base * (t + 1),
           scale * t, scale / (t + 1), tag, 'a' + t);
}

__global__ void numbers() {
    if (threadIdx.x == 0) {
        long long big = 1234567890123LL;
        unsigned long long ubig = 18446744073709551615ull;
        double d = 3.141592653589793;
        printf("ll=%lld ull=%llu d=%.10f g=%g G=%G w=[%8.2f] l=[%-6d] z=%05d pct=%%\n", big, ubig, d, d * 1e-5,
               d * 1e20, d, 42, 7);
        printf("neg=%d oct=%o u=%u short=%hd\n", -17, 8 * 8, 4000000000u, (short)-2);
    }
}

__global__ void strings(const char *s) {
    if (threadIdx.x == 0) printf("device string: [%s] [%.3s] [%10s]\n", s, s, "right");
}

int main() {
    std::printf("host before\n");
    char *tag;
    CHECK(cudaMalloc(&tag, 16));
    CHECK(cudaMemcpy(tag, "phos", 5, cudaMemcpyHostToDevice));
    hello<<<1, 8>>>(100, 0.5f, tag);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::printf("host between\n");
    numbers<<<1, 32>>>();
    strings<<<1, 1>>>(tag);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::printf("host after\n");
    CHECK(cudaFree(tag));
    std::printf("PASS\n");
    return 0;
}
