// printf from device code: a vprintf prototype, calls, and format strings as .global byte arrays.
#include <cstdio>

__global__ void hello(int n, float f, double d, const char *s) {
    printf("hello from %d/%d: n=%d f=%f d=%g s=%s\n", blockIdx.x, threadIdx.x, n, f, d, s);
    if (threadIdx.x == 0) printf("done\n");
}

__global__ void assert_like(const int *p) {
    if (p[threadIdx.x] < 0) {
        printf("bad value %d at %u \"quoted\" \t tab\n", p[threadIdx.x], threadIdx.x);
    }
}
