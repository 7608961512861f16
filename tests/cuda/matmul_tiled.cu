// Tiled matrix product with shared memory and __syncthreads, on sizes that are not multiples
// of the tile. Inputs are small integers, so every product and sum is exact in float and the
// result can be compared exactly with the host.
#include "check.h"
#include <vector>

constexpr int TILE = 16;

__global__ void matmul(const float *a, const float *b, float *c, int m, int n, int k) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (k + TILE - 1) / TILE; t++) {
        int ka = t * TILE + threadIdx.x;
        int kb = t * TILE + threadIdx.y;
        ta[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? a[row * k + ka] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = (kb < k && col < n) ? b[kb * n + col] : 0.0f;
        __syncthreads();
        for (int i = 0; i < TILE; i++) acc += ta[threadIdx.y][i] * tb[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[row * n + col] = acc;
}

int main() {
    const int m = 200, n = 136, k = 152;
    std::vector<float> a(m * k), b(k * n), c(m * n), ref(m * n, 0.0f);
    for (int i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 11 - 5);
    for (int i = 0; i < k * n; i++) b[i] = (float)((i * 5) % 9 - 4);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0;
            for (int p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
            ref[i * n + j] = s;
        }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, a.size() * sizeof(float)));
    CHECK(cudaMalloc(&db, b.size() * sizeof(float)));
    CHECK(cudaMalloc(&dc, c.size() * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
    dim3 block(TILE, TILE);
    dim3 grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE);
    matmul<<<grid, block>>>(da, db, dc, m, n, k);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < m * n; i++) {
        EXPECT(c[i] == ref[i]);
        sum += c[i];
    }
    std::printf("matmul %dx%dx%d grid=%dx%d sum=%.1f c[0]=%.1f c[last]=%.1f\n", m, n, k, grid.x, grid.y, sum, c[0],
                c[m * n - 1]);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    std::printf("PASS\n");
    return 0;
}
