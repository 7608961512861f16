// Out-of-line device functions: .func definitions, calls with parameters and returns.
struct Vec3 {
    float x, y, z;
};

__device__ __noinline__ int add_one(int x) { return x + 1; }

__device__ __noinline__ float dot3(Vec3 a, Vec3 b) { return a.x * b.x + a.y * b.y + a.z * b.z; }

__device__ __noinline__ Vec3 cross(Vec3 a, Vec3 b) {
    return Vec3{a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x};
}

__device__ __noinline__ void store_pair(int *p, int a, long long b) {
    p[0] = a;
    p[1] = (int)b;
}

__device__ __noinline__ unsigned fib(unsigned n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

typedef float (*unary_fn)(float);
__device__ __noinline__ float twice(float x) { return 2.0f * x; }
__device__ __noinline__ float square(float x) { return x * x; }
__device__ unary_fn fn_table[2] = {twice, square};

__global__ void call_kernel(int *ip, float *fp, const Vec3 *vs, int which) {
    int t = threadIdx.x;
    ip[t] = add_one(ip[t]);
    Vec3 c = cross(vs[0], vs[1]);
    fp[t] = dot3(c, vs[2]);
    store_pair(ip + 64, t, (long long)t << 33);
    ip[128 + t] = fib(t & 7);
    fp[64 + t] = fn_table[which & 1](fp[t]);
}

__device__ __noinline__ void never_returns() { __trap(); }

__global__ void trap_kernel(int flag) {
    if (flag == 123) never_returns();
}
