// Micro-benchmarks of what remoting adds to a CUDA program: the round trip of a synchronous
// call, kernel launch throughput (empty kernels, and a launch-bound loop of small kernels),
// and host<->device copy bandwidth, pageable and pinned, 4 KiB to 1 GiB. Prints
// `metric value unit` lines; tests/scripts/gpu-bench.sh runs it natively and through Phos and
// compares. `remoting quick` skips the copies above 64 MiB, `remoting launches` all copies.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            std::printf("FAILED %s: %s\n", #call, cudaGetErrorString(e_));                   \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

__global__ void empty() {}

// A small kernel (a few microseconds of work): the loop below is bound by launches.
__global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

using Clock = std::chrono::steady_clock;

static double us_since(Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

static const char *size_name(size_t b, char *buf) {
    if (b >= (1u << 30)) std::snprintf(buf, 16, "%zuGiB", b >> 30);
    else if (b >= (1u << 20)) std::snprintf(buf, 16, "%zuMiB", b >> 20);
    else std::snprintf(buf, 16, "%zuKiB", b >> 10);
    return buf;
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && std::string(argv[1]) == "quick";
    bool launches_only = argc > 1 && std::string(argv[1]) == "launches";
    CHECK(cudaFree(0));
    // Synchronous round trip: cudaStreamQuery on an idle stream does no device work.
    const int calls = 20000;
    std::vector<double> lat(calls);
    for (int i = 0; i < 1000; i++) CHECK(cudaStreamQuery(0));
    for (int i = 0; i < calls; i++) {
        auto t = Clock::now();
        CHECK(cudaStreamQuery(0));
        lat[i] = us_since(t);
    }
    std::sort(lat.begin(), lat.end());
    std::printf("sync_call_p50 %.2f us\n", lat[calls / 2]);
    std::printf("sync_call_p99 %.2f us\n", lat[calls * 99 / 100]);

    // Launch throughput: empty kernels back to back, then one synchronisation. Each rate is
    // the median of five windows of 20000 (a window is under 0.1 s: one alone moves with the
    // GPU's clocks and where the threads land by as much as 20% between runs).
    const int windows = 5;
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    const int launches = 20000;
    for (int i = 0; i < 100; i++) empty<<<1, 1>>>();
    CHECK(cudaDeviceSynchronize());
    std::vector<double> rates;
    for (int w = 0; w < windows; w++) {
        auto t = Clock::now();
        for (int i = 0; i < launches; i++) empty<<<1, 32>>>();
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        rates.push_back(launches / (us_since(t) * 1e-6));
    }
    std::printf("launches_per_s %.0f 1/s\n", median(rates));

    // A launch-bound loop: 20000 small kernels over 64 K floats, synchronised every 100.
    {
        const int n = 1 << 16, iters = 20000;
        float *x, *y;
        CHECK(cudaMalloc(&x, n * sizeof(float)));
        CHECK(cudaMalloc(&y, n * sizeof(float)));
        CHECK(cudaMemset(x, 0, n * sizeof(float)));
        CHECK(cudaMemset(y, 0, n * sizeof(float)));
        for (int i = 0; i < 100; i++) axpy<<<n / 256, 256>>>(y, x, 0.5f, n);
        CHECK(cudaDeviceSynchronize());
        rates.clear();
        for (int w = 0; w < windows; w++) {
            auto t = Clock::now();
            for (int i = 0; i < iters; i++) {
                axpy<<<n / 256, 256>>>(y, x, 0.5f, n);
                if (i % 100 == 99) CHECK(cudaStreamSynchronize(0));
            }
            CHECK(cudaDeviceSynchronize());
            rates.push_back(iters / (us_since(t) * 1e-6));
        }
        std::printf("small_kernel_loop %.0f 1/s\n", median(rates));
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
    }

    if (launches_only) return 0;
    // Copies, pageable and pinned, each way, 4 KiB to 1 GiB: each size moves about 1 GiB
    // (at least 3 copies, at most 2000), after one copy to warm up.
    const size_t largest = quick ? (64u << 20) : (1u << 30);
    // Registered memory is page-locked like pinned memory but laid out by the application
    // (4 KiB pages): natively it tells the cost of the page layout apart from the copy path.
    char *dev, *pinned, *registered;
    CHECK(cudaMalloc(&dev, largest));
    CHECK(cudaMallocHost(&pinned, largest));
    registered = (char *)std::aligned_alloc(4096, largest);
    std::memset(registered, 1, largest);
    CHECK(cudaHostRegister(registered, largest, cudaHostRegisterDefault));
    std::vector<char> pageable(largest, 1);
    std::memset(pinned, 1, largest);
    const char *kinds[] = {"pageable", "pinned", "registered"};
    for (int kind = 0; kind < 3; kind++) {
        char *host = kind == 0 ? pageable.data() : kind == 1 ? pinned : registered;
        for (size_t bytes = 4096; bytes <= largest; bytes *= (bytes < (1u << 20) ? 16 : 4)) {
            int reps = (int)std::max<size_t>(3, std::min<size_t>(2000, (1u << 30) / bytes));
            for (int dir = 0; dir < 2; dir++) {
                auto copy = [&] {
                    if (dir == 0) CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
                    else CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
                };
                copy();
                auto t = Clock::now();
                for (int r = 0; r < reps; r++) copy();
                double gbs = reps * (double)bytes / (us_since(t) * 1e-6) / 1e9;
                char name[16];
                std::printf("%s_%s_%s %.2f GB/s\n", dir == 0 ? "h2d" : "d2h", size_name(bytes, name),
                            kinds[kind], gbs);
            }
        }
    }
    // Async pinned and registered copies back to back, one synchronisation: the copy path
    // without a wait per copy.
    for (int kind = 1; kind < 3; kind++) {
        char *host = kind == 1 ? pinned : registered;
        const size_t bytes = 64u << 20;
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        for (int dir = 0; dir < 2; dir++) {
            auto copy = [&] {
                if (dir == 0) CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
                else CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
            };
            copy();
            CHECK(cudaStreamSynchronize(s));
            auto t = Clock::now();
            for (int r = 0; r < 16; r++) copy();
            CHECK(cudaStreamSynchronize(s));
            double gbs = 16 * (double)bytes / (us_since(t) * 1e-6) / 1e9;
            std::printf("%s_64MiB_%s_async %.2f GB/s\n", dir == 0 ? "h2d" : "d2h", kinds[kind], gbs);
        }
        CHECK(cudaStreamDestroy(s));
    }
    CHECK(cudaHostUnregister(registered));
    std::free(registered);
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dev));
    return 0;
}
