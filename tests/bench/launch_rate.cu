// Native launch cost: the runtime's <<<>>>, cuLaunchKernel with kernelParams, and with the packed
// buffer (extra), on a non-blocking stream; through Phos the driver API launches a runtime kernel.
// Build: nvcc -O2 -cudart shared -arch=sm_90 -o launch_rate tests/bench/launch_rate.cu -lcuda
#include <cstdio>
#include <chrono>
#include <cuda.h>
#include <cuda_runtime.h>
struct P { float *p; int n; float v; };
__global__ void k(float *p, int n, float v) { if (p && threadIdx.x < n) p[threadIdx.x] += v; }
static double now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
  float *d; cudaMalloc(&d, 4096);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaFunction_t f; cudaGetFuncBySymbol(&f, (const void *)k);
  CUfunction cf = (CUfunction)f;
  const int N = 20000; int n = 0; float v = 1;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now();
    for (int i = 0; i < N; i++) k<<<1, 32, 0, s>>>(nullptr, n, v);
    double t1 = now(); cudaStreamSynchronize(s); double t2 = now();
    printf("runtime <<<>>>: %.3f us enqueue, %.3f us with sync\n", (t1-t0)/N, (t2-t0)/N);
    float *np = nullptr; void *args[] = {&np, &n, &v};
    t0 = now();
    for (int i = 0; i < N; i++) cuLaunchKernel(cf, 1,1,1, 32,1,1, 0, (CUstream)s, args, nullptr);
    t1 = now(); cudaStreamSynchronize(s); t2 = now();
    printf("cuLaunchKernel kernelParams: %.3f us enqueue, %.3f us with sync\n", (t1-t0)/N, (t2-t0)/N);
    P buf = {nullptr, n, v}; size_t size = sizeof(buf);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    t0 = now();
    for (int i = 0; i < N; i++) cuLaunchKernel(cf, 1,1,1, 32,1,1, 0, (CUstream)s, nullptr, extra);
    t1 = now(); cudaStreamSynchronize(s); t2 = now();
    printf("cuLaunchKernel extra: %.3f us enqueue, %.3f us with sync\n", (t1-t0)/N, (t2-t0)/N);
  }
  return 0;
}
