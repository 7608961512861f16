// Calls, recursion, module variables, struct parameters, templates.
#include <cstdint>

__constant__ float coeffs[4] = {1.0f, -2.0f, 0.5f, 4.0f};
__device__ int counter = 42;
__device__ int table[3] = {7, 8, 9};
__device__ int *table_ptr = table + 1;

struct Params {
    int a;
    double b;
    char c[3];
    float d[5];
};

struct Big {
    int values[300];
    int count;
};

__device__ __noinline__ int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__device__ __noinline__ float poly(float x) {
    return coeffs[0] + x * (coeffs[1] + x * (coeffs[2] + x * coeffs[3]));
}

__device__ __noinline__ void swap_pair(int &a, int &b) {
    int t = a;
    a = b;
    b = t;
}

extern "C" __global__ void calls(int *out, float *fout) {
    int t = threadIdx.x;
    out[t] = fib(t % 12);
    fout[t] = poly((float)t * 0.25f);
    int a = t, b = -t;
    if (t & 1) swap_pair(a, b);
    out[64 + t] = a * 1000 + b;
}

extern "C" __global__ void globals(int *out) {
    if (threadIdx.x == 0) {
        out[0] = counter;
        out[1] = *table_ptr;
        out[2] = table[2];
        counter += 1;
        out[3] = (int)(coeffs[3] * 10.0f);
    }
}

extern "C" __global__ void struct_param(Params p, float *out) {
    out[0] = (float)p.a;
    out[1] = (float)p.b;
    out[2] = (float)(p.c[0] + p.c[1] + p.c[2]);
    float s = 0.0f;
    for (int i = 0; i < 5; ++i) s += p.d[i];
    out[3] = s;
}

extern "C" __global__ void big_param(Big big, int *out) {
    int t = threadIdx.x;
    if (t < big.count) out[t] = big.values[t % 300] * 2;
}

template <typename T, int N>
__global__ void scale(T *v, T f) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) v[i] = v[i] * f + (T)1;
}
template __global__ void scale<int, 100>(int *, int);
template __global__ void scale<double, 50>(double *, double);

// A per-thread array indexed dynamically lives in local memory.
extern "C" __global__ void local_array(const int *in, int *out) {
    int t = threadIdx.x;
    int arr[32];
    for (int i = 0; i < 32; ++i) arr[i] = in[(t + i) % 64] * i;
    int idx = in[t] & 31;
    out[t] = arr[idx] + arr[(idx * 7) & 31];
}

typedef int (*binop)(int, int);
__device__ int op_add(int a, int b) { return a + b; }
__device__ int op_mul(int a, int b) { return a * b; }
__device__ binop ops[2] = {op_add, op_mul};

extern "C" __global__ void indirect_calls(int *out) {
    int t = threadIdx.x;
    out[t] = ops[t & 1](t, 3);
}
