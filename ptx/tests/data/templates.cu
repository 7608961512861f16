// Templated kernels instantiated for several element types, plus dynamic shared memory.
template <typename T>
__global__ void axpby(T a, const T *x, T b, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b * y[i];
}

template <typename T, int BLOCK>
__global__ void block_scan(const T *in, T *out, int n) {
    extern __shared__ unsigned char dyn_smem[];
    T *buf = reinterpret_cast<T *>(dyn_smem);
    int i = blockIdx.x * BLOCK + threadIdx.x;
    buf[threadIdx.x] = i < n ? in[i] : T(0);
    __syncthreads();
    for (int off = 1; off < BLOCK; off <<= 1) {
        T v = threadIdx.x >= off ? buf[threadIdx.x - off] : T(0);
        __syncthreads();
        buf[threadIdx.x] += v;
        __syncthreads();
    }
    if (i < n) out[i] = buf[threadIdx.x];
}

template __global__ void axpby<float>(float, const float *, float, float *, int);
template __global__ void axpby<double>(double, const double *, double, double *, int);
template __global__ void axpby<int>(int, const int *, int, int *, int);
template __global__ void block_scan<float, 128>(const float *, float *, int);
template __global__ void block_scan<int, 256>(const int *, int *, int);
template __global__ void block_scan<double, 64>(const double *, double *, int);

extern "C" __global__ void dynamic_smem_reverse(int *d, int n) {
    extern __shared__ int s[];
    int t = threadIdx.x;
    int tr = n - t - 1;
    s[t] = d[t];
    __syncthreads();
    d[t] = s[tr];
}
