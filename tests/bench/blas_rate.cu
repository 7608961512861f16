// Host time per cuBLAS call, PyTorch-style (stream, workspace, math mode set before each GEMM),
// and per empty launch; run natively and through `phosctl run`. Usage: blas_rate [N] (N x N GEMMs).
// Build: nvcc -O2 -cudart shared -arch=sm_90 -o blas_rate tests/bench/blas_rate.cu -lcublas
#include <cstdio>
#include <chrono>
#include <cuda_runtime.h>
#include <cublas_v2.h>
__global__ void tiny(float *p) { if (p) p[threadIdx.x] += 1.0f; }
static double now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 64, iters = 2000;
  float *a, *b, *c, *ws; cudaMalloc(&a, n*n*4); cudaMalloc(&b, n*n*4); cudaMalloc(&c, n*n*4); cudaMalloc(&ws, 4<<20);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cublasHandle_t h; cublasCreate(&h); cublasSetStream(h, s);
  float one = 1, zero = 0;
  for (int i = 0; i < 50; i++) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
  cudaDeviceSynchronize();
  double t0 = now();
  for (int i = 0; i < iters; i++) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
  double t1 = now(); cudaDeviceSynchronize(); double t2 = now();
  printf("sgemm n=%d: %.2f us/call enqueue, %.2f us/call with sync\n", n, (t1-t0)/iters, (t2-t0)/iters);
  t0 = now();
  for (int i = 0; i < iters; i++) {
    cublasSetStream(h, s); cublasSetWorkspace(h, ws, 4<<20); cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
  }
  t1 = now(); cudaDeviceSynchronize(); t2 = now();
  printf("setters+sgemm n=%d: %.2f us/iter enqueue, %.2f us/iter with sync\n", n, (t1-t0)/iters, (t2-t0)/iters);
  t0 = now();
  for (int i = 0; i < iters; i++) tiny<<<1, 32, 0, s>>>(c);
  t1 = now(); cudaDeviceSynchronize(); t2 = now();
  printf("launch: %.2f us/call enqueue, %.2f us/call with sync\n", (t1-t0)/iters, (t2-t0)/iters);
  return 0;
}
