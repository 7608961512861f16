// cuRAND's host API next to the runtime: a Monte Carlo estimate of pi from device uniforms,
// and the moments of every distribution (uniform, normal, log-normal, Poisson, their double
// forms, raw bits) from every pseudo-random generator type, on device and host generators,
// with seeds, offsets, orderings and a stream. Every figure is checked against its expected
// value within a tolerance of several standard errors, and only the verdicts are printed, so
// the output is the same on a GPU and through Phos's CPU generator (whose numbers differ).
// With the argument `hostile` it also makes the calls a careless or hostile program makes (a
// generator it never made, a destroyed one, an output past its allocation, a stream it does
// not have) and prints the status each gets. With `checkpoint` it draws from a device and a
// host generator, prints "curand ready", sleeps (a checkpoint and restore happen then) and
// draws again.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <curand.h>
#include <unistd.h>
#include <vector>

#include "check.h"

#define RAND(call)                                                                           \
    do {                                                                                     \
        curandStatus_t st_ = (call);                                                         \
        if (st_ != CURAND_STATUS_SUCCESS) {                                                  \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, status_name(st_), __FILE__,    \
                        __LINE__);                                                           \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static const char *status_name(curandStatus_t s) {
    switch (s) {
    case CURAND_STATUS_SUCCESS: return "CURAND_STATUS_SUCCESS";
    case CURAND_STATUS_VERSION_MISMATCH: return "CURAND_STATUS_VERSION_MISMATCH";
    case CURAND_STATUS_NOT_INITIALIZED: return "CURAND_STATUS_NOT_INITIALIZED";
    case CURAND_STATUS_ALLOCATION_FAILED: return "CURAND_STATUS_ALLOCATION_FAILED";
    case CURAND_STATUS_TYPE_ERROR: return "CURAND_STATUS_TYPE_ERROR";
    case CURAND_STATUS_OUT_OF_RANGE: return "CURAND_STATUS_OUT_OF_RANGE";
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE: return "CURAND_STATUS_LENGTH_NOT_MULTIPLE";
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED: return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case CURAND_STATUS_LAUNCH_FAILURE: return "CURAND_STATUS_LAUNCH_FAILURE";
    case CURAND_STATUS_PREEXISTING_FAILURE: return "CURAND_STATUS_PREEXISTING_FAILURE";
    case CURAND_STATUS_INITIALIZATION_FAILED: return "CURAND_STATUS_INITIALIZATION_FAILED";
    case CURAND_STATUS_ARCH_MISMATCH: return "CURAND_STATUS_ARCH_MISMATCH";
    case CURAND_STATUS_INTERNAL_ERROR: return "CURAND_STATUS_INTERNAL_ERROR";
    }
    return "unknown status";
}

static const char *verdict(bool ok) { return ok ? "PASS" : "FAIL"; }

// Points of (x[i], y[i]) inside the quarter circle.
__global__ void count_inside(const float *x, const float *y, int n, unsigned int *inside) {
    unsigned int mine = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        mine += x[i] * x[i] + y[i] * y[i] <= 1.0f;
    atomicAdd(inside, mine);
}

struct Moments {
    double mean, var, min, max;
};

template <typename T> static Moments moments(const std::vector<T> &v) {
    double sum = 0, lo = v[0], hi = v[0];
    for (T x : v) {
        sum += x;
        lo = std::fmin(lo, (double)x);
        hi = std::fmax(hi, (double)x);
    }
    double mean = sum / v.size(), sq = 0;
    for (T x : v) sq += ((double)x - mean) * ((double)x - mean);
    return {mean, sq / v.size(), lo, hi};
}

template <typename T> static std::vector<T> from_device(const T *d, size_t n) {
    std::vector<T> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

static bool near(double got, double want, double tolerance) { return std::fabs(got - want) <= tolerance; }

static const size_t N = 1 << 20;

// pi from 2N device uniforms of the default generator (XORWOW).
static void monte_carlo_pi() {
    curandGenerator_t g;
    RAND(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_DEFAULT));
    RAND(curandSetPseudoRandomGeneratorSeed(g, 1234ULL));
    float *xy;
    unsigned int *inside;
    CHECK(cudaMalloc(&xy, 2 * N * sizeof(float)));
    CHECK(cudaMalloc(&inside, sizeof(unsigned int)));
    CHECK(cudaMemset(inside, 0, sizeof(unsigned int)));
    RAND(curandGenerateUniform(g, xy, 2 * N));
    count_inside<<<64, 256>>>(xy, xy + N, (int)N, inside);
    CHECK_LAUNCH();
    unsigned int hits;
    CHECK(cudaMemcpy(&hits, inside, sizeof hits, cudaMemcpyDeviceToHost));
    double pi = 4.0 * hits / N;
    // One standard error is 4 sqrt(p(1-p)/N), about 0.0016.
    std::printf("monte carlo: pi within 0.01 of %.2f: %s\n", M_PI, verdict(near(pi, M_PI, 0.01)));
    CHECK(cudaFree(xy));
    CHECK(cudaFree(inside));
    RAND(curandDestroyGenerator(g));
}

// Every distribution from a device generator of each pseudo-random type.
static void distributions() {
    float *df;
    double *dd;
    unsigned int *du;
    CHECK(cudaMalloc(&df, N * sizeof(float)));
    CHECK(cudaMalloc(&dd, N * sizeof(double)));
    CHECK(cudaMalloc(&du, N * sizeof(unsigned int)));
    curandGenerator_t philox, mrg, mtgp, mt, xorwow;
    RAND(curandCreateGenerator(&philox, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND(curandCreateGenerator(&mrg, CURAND_RNG_PSEUDO_MRG32K3A));
    RAND(curandCreateGenerator(&mtgp, CURAND_RNG_PSEUDO_MTGP32));
    RAND(curandCreateGenerator(&mt, CURAND_RNG_PSEUDO_MT19937));
    RAND(curandCreateGenerator(&xorwow, CURAND_RNG_PSEUDO_XORWOW));
    RAND(curandSetPseudoRandomGeneratorSeed(philox, 11ULL));
    RAND(curandSetPseudoRandomGeneratorSeed(mrg, 12ULL));
    RAND(curandSetPseudoRandomGeneratorSeed(mtgp, 13ULL));
    RAND(curandSetPseudoRandomGeneratorSeed(mt, 14ULL));
    RAND(curandSetPseudoRandomGeneratorSeed(xorwow, 15ULL));
    RAND(curandGenerateSeeds(xorwow));

    RAND(curandGenerateNormal(philox, df, N, 2.0f, 3.0f));
    Moments m = moments(from_device(df, N));
    std::printf("normal (philox): mean 2 and variance 9: %s\n",
                verdict(near(m.mean, 2.0, 0.02) && near(m.var, 9.0, 0.1)));

    RAND(curandGenerateNormalDouble(mrg, dd, N, -1.0, 0.5));
    m = moments(from_device(dd, N));
    std::printf("normal double (mrg32k3a): mean -1 and variance 0.25: %s\n",
                verdict(near(m.mean, -1.0, 0.005) && near(m.var, 0.25, 0.003)));

    RAND(curandGenerateLogNormal(mtgp, df, N, 0.0f, 0.5f));
    m = moments(from_device(df, N));
    std::printf("log-normal (mtgp32): mean exp(1/8), all positive: %s\n",
                verdict(near(m.mean, std::exp(0.125), 0.005) && m.min > 0));

    RAND(curandGenerateLogNormalDouble(mt, dd, N, 1.0, 0.25));
    m = moments(from_device(dd, N));
    std::printf("log-normal double (mt19937): mean exp(1 + 1/32): %s\n",
                verdict(near(m.mean, std::exp(1.03125), 0.01) && m.min > 0));

    RAND(curandGenerateUniformDouble(xorwow, dd, N));
    m = moments(from_device(dd, N));
    std::printf("uniform double (xorwow): in (0, 1], mean 1/2, variance 1/12: %s\n",
                verdict(m.min > 0 && m.max <= 1 && near(m.mean, 0.5, 0.003) && near(m.var, 1.0 / 12, 0.001)));

    RAND(curandGeneratePoisson(xorwow, du, N, 4.5));
    m = moments(from_device(du, N));
    std::printf("poisson (xorwow, lambda 4.5): mean and variance 4.5: %s\n",
                verdict(near(m.mean, 4.5, 0.02) && near(m.var, 4.5, 0.1)));

    RAND(curandGeneratePoisson(philox, du, N, 600.0));
    m = moments(from_device(du, N));
    std::printf("poisson (philox, lambda 600): mean and variance 600: %s\n",
                verdict(near(m.mean, 600.0, 0.2) && near(m.var, 600.0, 15.0)));

    RAND(curandGenerate(philox, du, N));
    std::vector<unsigned int> bits = from_device(du, N);
    size_t top = 0, low = 0;
    for (unsigned int b : bits) {
        top += b >> 31;
        low += b & 1;
    }
    std::printf("bits (philox): top and low bits set half the time: %s\n",
                verdict(near((double)top / N, 0.5, 0.005) && near((double)low / N, 0.5, 0.005)));

    // An odd count of normals from Philox4x32-10 (served, though cuRAND documents pairs for
    // pseudo-random generators), and what cuRAND refuses: a negative Poisson mean, 64-bit
    // integers from a 32-bit generator.
    std::printf("odd normal count: %s\n", status_name(curandGenerateNormal(philox, df, 7, 0.0f, 1.0f)));
    std::printf("poisson of lambda -1: %s\n", status_name(curandGeneratePoisson(philox, du, 16, -1.0)));
    std::printf("long long from philox: %s\n",
                status_name(curandGenerateLongLong(philox, (unsigned long long *)dd, 16)));

    RAND(curandDestroyGenerator(philox));
    RAND(curandDestroyGenerator(mrg));
    RAND(curandDestroyGenerator(mtgp));
    RAND(curandDestroyGenerator(mt));
    RAND(curandDestroyGenerator(xorwow));
    CHECK(cudaFree(df));
    CHECK(cudaFree(dd));
    CHECK(cudaFree(du));
}

// Seeds make sequences, an offset and an ordering are accepted, a stream carries the work.
static void settings() {
    const size_t n = 4096;
    float *a, *b;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    CHECK(cudaMalloc(&b, n * sizeof(float)));
    curandGenerator_t g1, g2;
    RAND(curandCreateGenerator(&g1, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND(curandCreateGenerator(&g2, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND(curandSetPseudoRandomGeneratorSeed(g1, 99ULL));
    RAND(curandSetPseudoRandomGeneratorSeed(g2, 99ULL));
    RAND(curandGenerateUniform(g1, a, n));
    RAND(curandGenerateUniform(g2, b, n));
    bool same = from_device(a, n) == from_device(b, n);
    RAND(curandSetPseudoRandomGeneratorSeed(g2, 100ULL));
    RAND(curandGenerateUniform(g2, b, n));
    bool differ = from_device(a, n) != from_device(b, n);
    std::printf("seeds: the same seed draws the same numbers, another seed others: %s\n", verdict(same && differ));

    RAND(curandSetGeneratorOffset(g1, 1000ULL));
    RAND(curandGenerateUniform(g1, a, n));
    Moments m = moments(from_device(a, n));
    std::printf("offset: accepted, uniforms in (0, 1]: %s\n", verdict(m.min > 0 && m.max <= 1));

    curandGenerator_t x;
    RAND(curandCreateGenerator(&x, CURAND_RNG_PSEUDO_XORWOW));
    RAND(curandSetGeneratorOrdering(x, CURAND_ORDERING_PSEUDO_BEST));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    RAND(curandSetStream(x, stream));
    RAND(curandGenerateUniform(x, a, n));
    CHECK(cudaStreamSynchronize(stream));
    m = moments(from_device(a, n));
    std::printf("ordering and stream: uniforms on the stream, mean 1/2: %s\n", verdict(near(m.mean, 0.5, 0.03)));
    RAND(curandDestroyGenerator(x));
    CHECK(cudaStreamDestroy(stream));
    RAND(curandDestroyGenerator(g1));
    RAND(curandDestroyGenerator(g2));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

// A host generator draws into the program's own memory.
static void host_generator() {
    curandGenerator_t h;
    RAND(curandCreateGeneratorHost(&h, CURAND_RNG_PSEUDO_XORWOW));
    RAND(curandSetPseudoRandomGeneratorSeed(h, 5ULL));
    std::vector<float> u(N);
    RAND(curandGenerateUniform(h, u.data(), N));
    Moments m = moments(u);
    std::vector<double> z(N);
    RAND(curandGenerateNormalDouble(h, z.data(), N, 0.0, 1.0));
    Moments mz = moments(z);
    std::printf("host generator: uniforms mean 1/2, normals variance 1, in host memory: %s\n",
                verdict(near(m.mean, 0.5, 0.003) && m.min > 0 && near(mz.var, 1.0, 0.01)));
    RAND(curandDestroyGenerator(h));
}

// A quasi-random generator: served on a GPU; a backend that lacks them answers its type.
static void quasi() {
    curandGenerator_t q;
    curandStatus_t st = curandCreateGenerator(&q, CURAND_RNG_QUASI_SOBOL32);
    if (st == CURAND_STATUS_SUCCESS) {
        float *d;
        CHECK(cudaMalloc(&d, 2 * N * sizeof(float)));
        RAND(curandSetQuasiRandomGeneratorDimensions(q, 2));
        RAND(curandGenerateUniform(q, d, 2 * N));
        Moments m = moments(from_device(d, 2 * N));
        EXPECT(near(m.mean, 0.5, 0.001));
        CHECK(cudaFree(d));
        RAND(curandDestroyGenerator(q));
    } else {
        EXPECT(st == CURAND_STATUS_TYPE_ERROR);
    }
    std::printf("quasi-random sobol32: answered\n");
}

static void hostile() {
    float *d;
    CHECK(cudaMalloc(&d, 1024));
    curandGenerator_t g;
    RAND(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    std::printf("hostile: a generator never made -> %s\n",
                status_name(curandGenerateUniform((curandGenerator_t)0x5eed, d, 16)));
    curandGenerator_t gone;
    RAND(curandCreateGenerator(&gone, CURAND_RNG_PSEUDO_XORWOW));
    RAND(curandDestroyGenerator(gone));
    std::printf("hostile: a destroyed generator -> %s\n", status_name(curandGenerateUniform(gone, d, 16)));
    std::printf("hostile: output past its allocation -> %s\n", status_name(curandGenerateUniform(g, d, 1 << 20)));
    std::printf("hostile: an absurd count -> %s\n", status_name(curandGenerateUniform(g, d, (size_t)1 << 62)));
    std::printf("hostile: a stream it does not have -> %s\n", status_name(curandSetStream(g, (cudaStream_t)0x777)));
    curandDirectionVectors32_t *vectors;
    std::printf("hostile: direction vectors -> %s\n",
                status_name(curandGetDirectionVectors32(&vectors, CURAND_DIRECTION_VECTORS_32_JOEKUO6)));
    RAND(curandGenerateUniform(g, d, 256));
    Moments m = moments(from_device(d, 256));
    std::printf("hostile: the generator still works: %s\n", verdict(m.min > 0 && m.max <= 1));
    RAND(curandDestroyGenerator(g));
    CHECK(cudaFree(d));
}

// Generators set up and drawn from before a checkpoint go on after the restore where they
// were: the next numbers are the ones a fresh generator of the same seed draws at that offset
// (on Phos's CPU generator; NVIDIA's XORWOW and MRG orderings continue statistically only).
static int across_a_restore() {
    const size_t n = 4096;
    float *d, *ref;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMalloc(&ref, n * sizeof(float)));
    curandGenerator_t g, h;
    RAND(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND(curandCreateGeneratorHost(&h, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    RAND(curandSetStream(g, stream));
    RAND(curandSetPseudoRandomGeneratorSeed(g, 2024ULL));
    RAND(curandSetPseudoRandomGeneratorSeed(h, 2025ULL));
    RAND(curandGenerateUniform(g, d, n));
    std::vector<float> host(n);
    RAND(curandGenerateUniform(h, host.data(), n));
    CHECK(cudaStreamSynchronize(stream));
    std::printf("curand ready\n");
    std::fflush(stdout);
    sleep(3);
    RAND(curandGenerateUniform(g, d, n));
    RAND(curandGenerateUniform(h, host.data(), n));
    CHECK(cudaStreamSynchronize(stream));
    curandGenerator_t fresh;
    RAND(curandCreateGenerator(&fresh, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND(curandSetPseudoRandomGeneratorSeed(fresh, 2024ULL));
    RAND(curandSetGeneratorOffset(fresh, n));
    RAND(curandGenerateUniform(fresh, ref, n));
    bool same = from_device(d, n) == from_device(ref, n);
    curandGenerator_t fresh_host;
    RAND(curandCreateGeneratorHost(&fresh_host, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND(curandSetPseudoRandomGeneratorSeed(fresh_host, 2025ULL));
    RAND(curandSetGeneratorOffset(fresh_host, n));
    std::vector<float> host_ref(n);
    RAND(curandGenerateUniform(fresh_host, host_ref.data(), n));
    std::printf("after the restore: both generators draw on%s\n",
                same && host == host_ref ? " from where they were" : " (other numbers)");
    RAND(curandDestroyGenerator(g));
    RAND(curandDestroyGenerator(h));
    RAND(curandDestroyGenerator(fresh));
    RAND(curandDestroyGenerator(fresh_host));
    CHECK(cudaStreamDestroy(stream));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "checkpoint") == 0) return across_a_restore();
    int version, major;
    RAND(curandGetVersion(&version));
    RAND(curandGetProperty(MAJOR_VERSION, &major));
    std::printf("version: cuRAND %d (property %d)\n", version / 1000, major);
    monte_carlo_pi();
    distributions();
    settings();
    host_generator();
    quasi();
    if (argc > 1 && std::strcmp(argv[1], "hostile") == 0) hostile();
    std::printf("done\n");
    return 0;
}
