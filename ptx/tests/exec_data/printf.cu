#include <cstdio>

extern "C" __global__ void print_formats(int i, unsigned u, long long ll, float f, double d, const char *s) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        printf("int %d %i %5d|%-5d|%05d %+d %x %X %#x %o\n", i, i, i, i, i, i, u, u, u, u);
        printf("long %lld %llu %llx\n", ll, (unsigned long long)ll, ll);
        printf("float %f %.2f %e %.3E %g %G %a\n", f, f, f, f, f, f, f);
        printf("double %f %.10f %e %g %.0f %10.3f|%-10.3f|\n", d, d, d, d, d, d, d);
        printf("str %s|%10s|%-10s|%.3s\n", s, s, s, s);
        printf("char %c%c%c pct %% ptr-null %p\n", 'a', 'b', 'c', (void *)0);
        printf("special %f %f %f %e\n", 1.0 / 0.0, -1.0 / 0.0, 0.0 / 0.0, 1e-320);
        printf("star %*d|%-*d|%.*f\n", 6, i, 6, i, 3, d);
    }
}

extern "C" __global__ void print_threads() {
    printf("block %d thread %d\n", blockIdx.x, threadIdx.x);
}

extern "C" __global__ void print_return(int *out) {
    out[0] = printf("two %d %d\n", 1, 2);
    out[1] = printf("none\n");
}
