// Atomics: a histogram with per-block shared-memory bins merged into global bins, and the
// other atomic operations on global and shared memory, over many blocks at once.
#include "check.h"
#include <vector>

constexpr int BINS = 256;

__global__ void histogram(const unsigned char *data, int n, unsigned *bins) {
    __shared__ unsigned local[BINS];
    for (int i = threadIdx.x; i < BINS; i += blockDim.x) local[i] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (int i = threadIdx.x; i < BINS; i += blockDim.x) atomicAdd(&bins[i], local[i]);
}

__global__ void others(int *imax, int *imin, unsigned *inc, int *cas_counter, float *fsum, double *dsum,
                       unsigned long long *exch, int *andor) {
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicMax(imax, (id * 7919) % 100003);
    atomicMin(imin, (id * 104729) % 99991 - 50000);
    atomicInc(inc, 1000);
    // A CAS loop that adds 3.
    int old = *cas_counter, assumed;
    do {
        assumed = old;
        old = atomicCAS(cas_counter, assumed, assumed + 3);
    } while (old != assumed);
    atomicAdd(fsum, 0.5f);
    atomicAdd(dsum, 0.25);
    atomicExch(exch, 42ull);
    atomicOr(&andor[0], 1 << (id % 31));
    atomicAnd(&andor[1], ~(1 << (id % 13)));
    atomicXor(&andor[2], id);
    __shared__ int block_sum;
    if (threadIdx.x == 0) block_sum = 0;
    __syncthreads();
    atomicSub(&block_sum, -2);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(&andor[3], block_sum);
}

int main() {
    const int n = 1 << 20;
    std::vector<unsigned char> data(n);
    std::vector<unsigned> expected(BINS, 0);
    unsigned x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (unsigned char)(x >> 16);
        expected[data[i]]++;
    }
    unsigned char *ddata;
    unsigned *dbins;
    CHECK(cudaMalloc(&ddata, n));
    CHECK(cudaMalloc(&dbins, BINS * sizeof(unsigned)));
    CHECK(cudaMemcpy(ddata, data.data(), n, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dbins, 0, BINS * sizeof(unsigned)));
    histogram<<<64, 256>>>(ddata, n, dbins);
    CHECK_LAUNCH();
    std::vector<unsigned> bins(BINS);
    CHECK(cudaMemcpy(bins.data(), dbins, BINS * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int i = 0; i < BINS; i++) EXPECT(bins[i] == expected[i]);
    std::printf("histogram bins[0]=%u bins[127]=%u bins[255]=%u\n", bins[0], bins[127], bins[255]);

    struct {
        int imax, imin;
        unsigned inc;
        int cas;
        float fsum;
        double dsum;
        unsigned long long exch;
        int andor[4];
    } init = {-1, 1 << 30, 0, 0, 0.0f, 0.0, 0, {0, -1, 0, 0}}, res;
    int *p;
    CHECK(cudaMalloc(&p, 256));
    char *base = (char *)p;
    CHECK(cudaMemcpy(base + 0, &init.imax, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(base + 4, &init.imin, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(base + 8, &init.inc, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(base + 12, &init.cas, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(base + 16, &init.fsum, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(base + 24, &init.dsum, 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(base + 32, &init.exch, 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(base + 40, init.andor, 16, cudaMemcpyHostToDevice));
    const int blocks = 40, threads = 128;
    others<<<blocks, threads>>>((int *)(base + 0), (int *)(base + 4), (unsigned *)(base + 8), (int *)(base + 12),
                                (float *)(base + 16), (double *)(base + 24), (unsigned long long *)(base + 32),
                                (int *)(base + 40));
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&res.imax, base + 0, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&res.imin, base + 4, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&res.inc, base + 8, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&res.cas, base + 12, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&res.fsum, base + 16, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&res.dsum, base + 24, 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&res.exch, base + 32, 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(res.andor, base + 40, 16, cudaMemcpyDeviceToHost));
    int total = blocks * threads;
    std::printf("max=%d min=%d inc=%u cas=%d fsum=%.1f dsum=%.2f exch=%llu or=%08x and=%08x xor=%d blocksum=%d\n",
                res.imax, res.imin, res.inc, res.cas, res.fsum, res.dsum, res.exch, res.andor[0], res.andor[1],
                res.andor[2], res.andor[3]);
    EXPECT(res.cas == 3 * total);
    EXPECT(res.fsum == 0.5f * total);
    EXPECT(res.andor[3] == 2 * total);
    CHECK(cudaFree(ddata));
    CHECK(cudaFree(dbins));
    CHECK(cudaFree(p));
    std::printf("PASS\n");
    return 0;
}
