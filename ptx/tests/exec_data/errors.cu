#include <cassert>

extern "C" __global__ void oob_write(int *p, long long offset) { p[offset] = 1; }

extern "C" __global__ void oob_read(const int *p, int *out, long long offset) { out[0] = p[offset]; }

extern "C" __global__ void misaligned(char *p) { *(int *)(p + 1) = 5; }

extern "C" __global__ void traps(int x) {
    if (x == 3) __trap();
}

extern "C" __global__ void asserts(int x) {
    assert(x != threadIdx.x);
}

extern "C" __global__ void null_deref(int *out) { out[0] = *(volatile int *)0; }
