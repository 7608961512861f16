// Structures passed by value as kernel parameters.
struct Mixed {
    int i;
    double d;
    char c;
};

struct __align__(16) Aligned16 {
    float v[3];
};

struct Big {
    float coeffs[300];
    int count;
};

struct Small {
    short a;
    char b;
};

__global__ void with_mixed(const float *in, float *out, int n, Mixed m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * (float)m.d + (float)m.i + (float)m.c;
}

__global__ void with_aligned(Aligned16 a, char tag, Aligned16 b, float *out) {
    out[threadIdx.x] = a.v[threadIdx.x % 3] + b.v[0] + tag;
}

__global__ void with_big(Big big, float *out) {
    int i = threadIdx.x;
    if (i < big.count) out[i] = big.coeffs[i % 300];
}

__global__ void with_small(char c, Small s, short h, double d, Small t, long long *out) {
    out[0] = c + s.a + s.b + h + (long long)d + t.a + t.b;
}

__global__ void with_array_struct(float4 f, int2 i2, double2 d2, char3 c3, float *out) {
    out[0] = f.x + f.w + i2.y + d2.x + d2.y + c3.z;
}
