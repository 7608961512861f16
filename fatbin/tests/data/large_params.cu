// CUDA 12.1+ only: by-value parameters beyond the former 4 KiB limit. The cubin describes this
// kernel's parameters with EIATTR_KPARAM_INFO_V2 because 20000 does not fit the 14-bit size of
// EIATTR_KPARAM_INFO.
struct Huge {
    char bytes[20000];
};

struct Mid {
    double x;
    char y;  // sizeof(Mid) == 16
};

extern "C" __global__ void huge_param(char c, Huge h, double d, int *p, short s, Mid m) {
    p[0] = h.bytes[threadIdx.x] + c + d + s + m.y;
}
