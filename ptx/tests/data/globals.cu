// Module-scope variables with initializers: __constant__, __device__, pointers to globals.
__constant__ float c_coeffs[8] = {1.0f, 0.5f, 0.25f, 0.125f, -1.0f, 3.5f, 1e-3f, 65504.0f};
__constant__ int c_table[2][3] = {{1, 2, 3}, {-4, -5, -6}};
__constant__ double c_pi = 3.14159265358979;
__constant__ float c_uninit[16];

__device__ int d_counter = 42;
__device__ unsigned long long d_big = 0xfedcba9876543210ull;
__device__ float d_buffer[64];
__device__ int d_target[4] = {10, 20, 30, 40};
__device__ int *d_ptr = &d_target[2];
__device__ int *d_ptrs[2] = {&d_counter, &d_target[1]};
__device__ const char *d_name = "phos";

struct Pair {
    int a;
    float b;
};
__device__ Pair d_pairs[2] = {{1, 2.0f}, {3, 4.0f}};
__device__ __managed__ int m_value = 7;

__global__ void use_globals(float *out) {
    int i = threadIdx.x;
    out[i] = c_coeffs[i & 7] * d_buffer[i] + c_table[i & 1][i % 3] + (float)c_pi + c_uninit[i & 15];
    d_buffer[i] = (float)(d_counter + *d_ptr + *d_ptrs[i & 1] + d_name[i & 3]);
    out[i + 64] = (float)d_big + d_pairs[i & 1].b + d_pairs[0].a + m_value;
    atomicAdd(&d_counter, 1);
}
