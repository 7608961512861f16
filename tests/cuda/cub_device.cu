// CUB's device-wide algorithms as programs call them, each asked first for its temporary
// storage (a null pointer), which is then allocated: DeviceReduce (Sum, Max), DeviceScan
// (inclusive and exclusive sums), DeviceRadixSort (SortPairs, SortKeys descending with a
// double buffer), DeviceSelect::If, DeviceHistogram::HistogramEven, DeviceSegmentedReduce, and
// CUB's block primitives in a kernel of the program's own (BlockReduce, BlockScan,
// BlockRadixSort, WarpReduce). Results are checked against the host; then CUB's answer to
// temporary storage too small.
#include "check.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include <cub/cub.cuh>

static int failures = 0;

static void report(const char *what, bool ok) {
    std::printf("%-26s %s\n", what, ok ? "ok" : "WRONG");
    if (!ok) failures++;
}

static std::vector<int> pseudo_random(int n, int modulo, unsigned seed) {
    std::vector<int> v(n);
    unsigned x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (int)((x >> 8) % (unsigned)modulo);
    }
    return v;
}

template <typename T>
static T *to_device(const std::vector<T> &h) {
    T *d;
    CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 1));
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
static std::vector<T> to_host(const T *d, size_t n) {
    std::vector<T> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

struct greater_than {
    int bound;
    __host__ __device__ bool operator()(int x) const { return x > bound; }
};

static void reduce_and_scan(int n) {
    std::vector<int> h = pseudo_random(n, 1000, 11);
    int *in = to_device(h);
    int *out;
    CHECK(cudaMalloc(&out, n * sizeof(int)));

    void *temp = nullptr;
    size_t bytes = 0;
    CHECK(cub::DeviceReduce::Sum(temp, bytes, in, out, n));
    EXPECT(bytes > 0);
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceReduce::Sum(temp, bytes, in, out, n));
    int sum = to_host(out, 1)[0];
    report("DeviceReduce::Sum", sum == std::accumulate(h.begin(), h.end(), 0));
    CHECK(cudaFree(temp));

    temp = nullptr;
    CHECK(cub::DeviceReduce::Max(temp, bytes, in, out, n));
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceReduce::Max(temp, bytes, in, out, n));
    int max = to_host(out, 1)[0];
    report("DeviceReduce::Max", max == *std::max_element(h.begin(), h.end()));
    CHECK(cudaFree(temp));
    std::printf("  sum %d, max %d\n", sum, max);

    temp = nullptr;
    CHECK(cub::DeviceScan::InclusiveSum(temp, bytes, in, out, n));
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceScan::InclusiveSum(temp, bytes, in, out, n));
    std::vector<int> want(n);
    std::partial_sum(h.begin(), h.end(), want.begin());
    report("DeviceScan::InclusiveSum", to_host(out, n) == want);

    // Temporary storage one byte short: CUB answers cudaErrorInvalidValue and runs nothing.
    CHECK(cudaMemset(out, 0, n * sizeof(int)));
    size_t short_bytes = bytes - 1;
    cudaError_t err = cub::DeviceScan::InclusiveSum(temp, short_bytes, in, out, n);
    std::printf("  temporary storage short: %s\n", cudaGetErrorName(err));
    report("  output untouched", to_host(out, n) == std::vector<int>(n, 0));
    CHECK(cudaGetLastError());

    CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, n));
    int running = 0;
    for (int i = 0; i < n; i++) {
        want[i] = running;
        running += h[i];
    }
    report("DeviceScan::ExclusiveSum", to_host(out, n) == want);
    CHECK(cudaFree(temp));
    CHECK(cudaFree(in));
    CHECK(cudaFree(out));
}

static void radix_sort(int n) {
    std::vector<unsigned> keys(n);
    std::vector<int> k = pseudo_random(n, 1 << 24, 12);
    for (int i = 0; i < n; i++) keys[i] = (unsigned)k[i] * 97u;
    std::vector<int> values(n);
    std::iota(values.begin(), values.end(), 0);
    unsigned *keys_in = to_device(keys), *keys_out;
    int *values_in = to_device(values), *values_out;
    CHECK(cudaMalloc(&keys_out, n * sizeof(unsigned)));
    CHECK(cudaMalloc(&values_out, n * sizeof(int)));

    void *temp = nullptr;
    size_t bytes = 0;
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, values_in, values_out, n));
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, values_in, values_out, n));
    std::vector<std::pair<unsigned, int>> pairs(n);
    for (int i = 0; i < n; i++) pairs[i] = {keys[i], values[i]};
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const std::pair<unsigned, int> &a, const std::pair<unsigned, int> &b) { return a.first < b.first; });
    std::vector<unsigned> want_keys(n);
    std::vector<int> want_values(n);
    for (int i = 0; i < n; i++) {
        want_keys[i] = pairs[i].first;
        want_values[i] = pairs[i].second;
    }
    report("DeviceRadixSort::SortPairs",
           to_host(keys_out, n) == want_keys && to_host(values_out, n) == want_values);
    std::printf("  smallest key %u (from %d), largest %u (from %d)\n", want_keys[0], want_values[0], want_keys[n - 1],
                want_values[n - 1]);
    CHECK(cudaFree(temp));

    // Descending float keys in a double buffer: the sorted keys are in whichever half
    // Current() names.
    std::vector<float> fk(n);
    for (int i = 0; i < n; i++) fk[i] = (float)(k[i] % 2000) - 1000.0f;
    float *f0 = to_device(fk), *f1;
    CHECK(cudaMalloc(&f1, n * sizeof(float)));
    cub::DoubleBuffer<float> buffer(f0, f1);
    temp = nullptr;
    CHECK(cub::DeviceRadixSort::SortKeysDescending(temp, bytes, buffer, n));
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceRadixSort::SortKeysDescending(temp, bytes, buffer, n));
    std::sort(fk.begin(), fk.end(), std::greater<float>());
    report("SortKeysDescending", to_host(buffer.Current(), n) == fk);
    CHECK(cudaFree(temp));
    for (void *p : {(void *)keys_in, (void *)keys_out, (void *)values_in, (void *)values_out, (void *)f0, (void *)f1})
        CHECK(cudaFree(p));
}

static void select_and_histogram(int n) {
    std::vector<int> h = pseudo_random(n, 1000, 13);
    int *in = to_device(h), *out, *count;
    CHECK(cudaMalloc(&out, n * sizeof(int)));
    CHECK(cudaMalloc(&count, sizeof(int)));

    void *temp = nullptr;
    size_t bytes = 0;
    greater_than op{700};
    CHECK(cub::DeviceSelect::If(temp, bytes, in, out, count, n, op));
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceSelect::If(temp, bytes, in, out, count, n, op));
    int selected = to_host(count, 1)[0];
    std::vector<int> want;
    std::copy_if(h.begin(), h.end(), std::back_inserter(want), [](int x) { return x > 700; });
    report("DeviceSelect::If", selected == (int)want.size() && to_host(out, selected) == want);
    CHECK(cudaFree(temp));

    // 10 bins of width 100 over [0, 1000).
    float *samples;
    std::vector<float> hs(n);
    for (int i = 0; i < n; i++) hs[i] = (float)h[i] + 0.5f;
    samples = to_device(hs);
    int *histogram;
    CHECK(cudaMalloc(&histogram, 10 * sizeof(int)));
    temp = nullptr;
    CHECK(cub::DeviceHistogram::HistogramEven(temp, bytes, samples, histogram, 11, 0.0f, 1000.0f, n));
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceHistogram::HistogramEven(temp, bytes, samples, histogram, 11, 0.0f, 1000.0f, n));
    std::vector<int> want_bins(10, 0);
    for (int v : h) want_bins[v / 100]++;
    std::vector<int> bins = to_host(histogram, 10);
    report("DeviceHistogram", bins == want_bins);
    std::printf("  selected %d, bins %d %d ... %d\n", selected, bins[0], bins[1], bins[9]);
    CHECK(cudaFree(temp));

    // Sums of segments of varying lengths (one empty).
    std::vector<int> offsets = {0, 10, 10, 500, 1234, n};
    int *d_offsets = to_device(offsets), *sums;
    int segments = (int)offsets.size() - 1;
    CHECK(cudaMalloc(&sums, segments * sizeof(int)));
    temp = nullptr;
    CHECK(cub::DeviceSegmentedReduce::Sum(temp, bytes, in, sums, segments, d_offsets, d_offsets + 1));
    CHECK(cudaMalloc(&temp, bytes));
    CHECK(cub::DeviceSegmentedReduce::Sum(temp, bytes, in, sums, segments, d_offsets, d_offsets + 1));
    std::vector<int> want_sums(segments);
    for (int s = 0; s < segments; s++) want_sums[s] = std::accumulate(h.begin() + offsets[s], h.begin() + offsets[s + 1], 0);
    report("DeviceSegmentedReduce", to_host(sums, segments) == want_sums);
    CHECK(cudaFree(temp));
    for (void *p : {(void *)in, (void *)out, (void *)count, (void *)samples, (void *)histogram, (void *)d_offsets,
                    (void *)sums})
        CHECK(cudaFree(p));
}

struct max_of {
    __host__ __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

constexpr int kThreads = 128;
constexpr int kItems = 4;

// Per block: its sum (BlockReduce), its exclusive prefix sums (BlockScan), its items sorted
// (BlockRadixSort) and each warp's maximum (WarpReduce).
__global__ void block_primitives(const int *in, int *block_sums, int *prefix, int *sorted, int *warp_max) {
    using Reduce = cub::BlockReduce<int, kThreads>;
    using Scan = cub::BlockScan<int, kThreads>;
    using Sort = cub::BlockRadixSort<int, kThreads, kItems>;
    using Warp = cub::WarpReduce<int>;
    __shared__ union {
        typename Reduce::TempStorage reduce;
        typename Scan::TempStorage scan;
        typename Sort::TempStorage sort;
    } temp;
    __shared__ typename Warp::TempStorage warp[kThreads / 32];

    int base = blockIdx.x * kThreads * kItems;
    int items[kItems];
    for (int i = 0; i < kItems; i++) items[i] = in[base + threadIdx.x * kItems + i];

    int mine = 0;
    for (int i = 0; i < kItems; i++) mine += items[i];
    int total = Reduce(temp.reduce).Sum(mine);
    if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
    __syncthreads();

    int before;
    Scan(temp.scan).ExclusiveSum(mine, before);
    prefix[blockIdx.x * kThreads + threadIdx.x] = before;
    __syncthreads();

    int top = Warp(warp[threadIdx.x / 32]).Reduce(items[0], max_of());
    if (threadIdx.x % 32 == 0) warp_max[blockIdx.x * (kThreads / 32) + threadIdx.x / 32] = top;

    Sort(temp.sort).Sort(items);
    for (int i = 0; i < kItems; i++) sorted[base + threadIdx.x * kItems + i] = items[i];
}

static void block_level() {
    const int blocks = 6, per_block = kThreads * kItems, n = blocks * per_block;
    std::vector<int> h = pseudo_random(n, 100000, 14);
    for (int i = 0; i < n; i += 5) h[i] = -h[i];
    int *in = to_device(h), *block_sums, *prefix, *sorted, *warp_max;
    CHECK(cudaMalloc(&block_sums, blocks * sizeof(int)));
    CHECK(cudaMalloc(&prefix, blocks * kThreads * sizeof(int)));
    CHECK(cudaMalloc(&sorted, n * sizeof(int)));
    CHECK(cudaMalloc(&warp_max, blocks * (kThreads / 32) * sizeof(int)));
    block_primitives<<<blocks, kThreads>>>(in, block_sums, prefix, sorted, warp_max);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());

    std::vector<int> want_sums(blocks), want_prefix(blocks * kThreads), want_sorted = h,
                                        want_max(blocks * (kThreads / 32));
    for (int b = 0; b < blocks; b++) {
        int running = 0;
        for (int t = 0; t < kThreads; t++) {
            want_prefix[b * kThreads + t] = running;
            for (int i = 0; i < kItems; i++) running += h[b * per_block + t * kItems + i];
        }
        want_sums[b] = running;
        std::sort(want_sorted.begin() + b * per_block, want_sorted.begin() + (b + 1) * per_block);
        for (int w = 0; w < kThreads / 32; w++) {
            int m = h[b * per_block + w * 32 * kItems];
            for (int t = 0; t < 32; t++) m = std::max(m, h[b * per_block + (w * 32 + t) * kItems]);
            want_max[b * (kThreads / 32) + w] = m;
        }
    }
    report("BlockReduce", to_host(block_sums, blocks) == want_sums);
    report("BlockScan", to_host(prefix, blocks * kThreads) == want_prefix);
    report("BlockRadixSort", to_host(sorted, n) == want_sorted);
    report("WarpReduce", to_host(warp_max, blocks * (kThreads / 32)) == want_max);
    std::printf("  block sums %d ... %d, first sorted %d\n", want_sums[0], want_sums[blocks - 1], want_sorted[0]);
    for (void *p : {(void *)in, (void *)block_sums, (void *)prefix, (void *)sorted, (void *)warp_max}) CHECK(cudaFree(p));
}

int main() {
    reduce_and_scan(20000);
    radix_sort(5000);
    select_and_histogram(8000);
    block_level();
    CHECK(cudaDeviceSynchronize());
    std::printf(failures == 0 ? "PASS\n" : "FAILED: %d wrong\n", failures);
    return failures == 0 ? 0 : 1;
}
