// One tenant's GPU load for the fairness benchmark (tests/scripts/gpu-fairness.sh).
//
//   tenant_load calibrate MICROSECONDS
//       find the work per thread that makes one kernel take MICROSECONDS on an idle GPU;
//       prints "iters N kernel_ns T" (T: the measured time of one such kernel)
//   tenant_load run ITERS SECONDS LOG
//       launch kernels of ITERS work back to back for SECONDS, keeping about 2 ms of work
//       queued, and write LOG: one line "MONOTONIC_NS KERNELS_DONE" per completed batch,
//       the first line being the start of the loop
//
// The kernels fill every SM and do a fixed amount of arithmetic, so a kernel's share of the
// GPU is its work, whatever else runs beside it: the benchmark counts device time as kernels
// completed times the calibrated kernel time, not as wall time between events (which, when
// two contexts time-slice the GPU, includes the other's slices).
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string_view>
#include <vector>

#define CHECK(x)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

__global__ void spin(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; i++) a = a * b + 1e-7f;
    // Never true, but the compiler cannot know: the loop stays.
    if (a == -1.0f) out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}

static long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct Launcher {
    int blocks = 0;
    float *out = nullptr;
    Launcher() {
        int sms = 0;
        CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        blocks = sms * 4;
        CHECK(cudaMalloc(&out, blocks * 256 * sizeof(float)));
    }
    void launch(int iters, cudaStream_t s) {
        spin<<<blocks, 256, 0, s>>>(out, iters);
        CHECK(cudaGetLastError());
    }
};

// Mean time of one kernel of `iters`, over enough kernels to last about 50 ms.
static double kernel_ns(Launcher &l, int iters) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    int n = 1;
    float ms = 0;
    for (;;) {
        CHECK(cudaEventRecord(a));
        for (int i = 0; i < n; i++) l.launch(iters, 0);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (ms >= 50 || n >= 4096) break;
        n *= 2;
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return ms * 1e6 / n;
}

static int calibrate(double target_us) {
    Launcher l;
    l.launch(1, 0);
    CHECK(cudaDeviceSynchronize());
    // Kernel time is affine in the work: fit it from two sizes, then refine.
    int lo = 1000, hi = 100000;
    double tlo = kernel_ns(l, lo), thi = kernel_ns(l, hi);
    double per_iter = (thi - tlo) / (hi - lo), fixed = tlo - per_iter * lo;
    int iters = 1;
    double t = 0;
    for (int round = 0; round < 3; round++) {
        double want = target_us * 1e3 - fixed;
        iters = want > per_iter ? (int)(want / per_iter) : 1;
        t = kernel_ns(l, iters);
        per_iter = (t - fixed) / iters > 0 ? (t - fixed) / iters : per_iter;
    }
    std::printf("iters %d kernel_ns %.0f\n", iters, t);
    return 0;
}

static int run(int iters, double seconds, const char *log_path) {
    Launcher l;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    l.launch(1, s);
    CHECK(cudaStreamSynchronize(s));
    double one = kernel_ns(l, iters);
    // Batches of about 1 ms (at least one kernel), two in flight.
    int batch = one >= 1e6 ? 1 : (int)(1e6 / one);
    cudaEvent_t done[2];
    CHECK(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming));
    std::vector<std::pair<long long, long long>> log;
    log.reserve(1 << 20);
    long long start = now_ns(), end = start + (long long)(seconds * 1e9);
    log.push_back({start, 0});
    long long launched = 0, completed = 0;
    int k = 0;
    bool in_flight[2] = {false, false};
    for (;;) {
        if (in_flight[k]) {
            CHECK(cudaEventSynchronize(done[k]));
            completed += batch;
            in_flight[k] = false;
            log.push_back({now_ns(), completed});
        }
        if (now_ns() >= end) break;
        for (int i = 0; i < batch; i++) l.launch(iters, s);
        launched += batch;
        CHECK(cudaEventRecord(done[k], s));
        in_flight[k] = true;
        k ^= 1;
    }
    // The loop stopped right after draining slot k: the newer batch is in slot k ^ 1.
    if (in_flight[k ^ 1]) {
        CHECK(cudaEventSynchronize(done[k ^ 1]));
        completed += batch;
        log.push_back({now_ns(), completed});
    }
    FILE *f = std::fopen(log_path, "w");
    if (!f) {
        std::perror(log_path);
        return 1;
    }
    for (auto &p : log) std::fprintf(f, "%lld %lld\n", p.first, p.second);
    std::fclose(f);
    std::printf("kernels %lld batch %d\n", completed, batch);
    return completed == launched ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && std::string_view(argv[1]) == "calibrate") return calibrate(std::atof(argv[2]));
    if (argc == 5 && std::string_view(argv[1]) == "run") return run(std::atoi(argv[2]), std::atof(argv[3]), argv[4]);
    std::fprintf(stderr, "usage: %s calibrate MICROSECONDS | run ITERS SECONDS LOG\n", argv[0]);
    return 2;
}
