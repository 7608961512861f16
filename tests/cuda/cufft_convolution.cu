// cuFFT through Phos: the FFT convolution of NVIDIA's simpleCUFFT (a signal and a filter padded
// to the linear convolution's length, transformed, multiplied pointwise by a kernel of the
// program's, transformed back) with complex (C2C) and real (R2C/C2R) transforms, checked
// against the direct convolution on the host; 2D and 3D plans; batched plans with cuFFT's
// advanced layout (strided, interleaved input, outputs with gaps, padded rows) and the padded
// in-place real layout; double precision (Z2Z, D2Z/Z2D) on a plan made by cufftMakePlan1d with
// a work area of the program's; a plan on a stream; and the statuses cuFFT gives for misuse.
// Every transform is checked on the host against a direct DFT; what is printed (integers the
// convolutions give exactly, verdicts) is the same wherever the program runs. With `hostile`
// it also makes the calls a careless or hostile program makes and prints the status each gets;
// with `checkpoint` it makes plans, says so, waits three seconds (a checkpoint and restore
// happen then) and transforms with them afterwards.
#include <cmath>
#include <complex>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <cufft.h>
#include <cufftXt.h>

#include "check.h"

#define FFT(call)                                                                            \
    do {                                                                                     \
        cufftResult r_ = (call);                                                             \
        if (r_ != CUFFT_SUCCESS) {                                                           \
            std::printf("FAILED: %s -> %s at %s:%d\n", #call, result_name(r_), __FILE__,     \
                        __LINE__);                                                           \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static const char *result_name(cufftResult r) {
    switch (r) {
    case CUFFT_SUCCESS: return "CUFFT_SUCCESS";
    case CUFFT_INVALID_PLAN: return "CUFFT_INVALID_PLAN";
    case CUFFT_ALLOC_FAILED: return "CUFFT_ALLOC_FAILED";
    case CUFFT_INVALID_TYPE: return "CUFFT_INVALID_TYPE";
    case CUFFT_INVALID_VALUE: return "CUFFT_INVALID_VALUE";
    case CUFFT_INTERNAL_ERROR: return "CUFFT_INTERNAL_ERROR";
    case CUFFT_EXEC_FAILED: return "CUFFT_EXEC_FAILED";
    case CUFFT_SETUP_FAILED: return "CUFFT_SETUP_FAILED";
    case CUFFT_INVALID_SIZE: return "CUFFT_INVALID_SIZE";
    case CUFFT_NO_WORKSPACE: return "CUFFT_NO_WORKSPACE";
    case CUFFT_NOT_SUPPORTED: return "CUFFT_NOT_SUPPORTED";
    default: return "another status";
    }
}

typedef std::complex<double> cd;

template <typename T> static T *to_device(const std::vector<T> &v) {
    T *d = nullptr;
    CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T> static std::vector<T> from_device(const T *d, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// The direct multi-dimensional DFT (row-major sizes n), sign -1 forward, unnormalised.
static std::vector<cd> dft(const std::vector<cd> &x, const std::vector<int> &n, int sign = -1) {
    size_t total = x.size();
    std::vector<cd> y(total);
    for (size_t k = 0; k < total; ++k) {
        cd acc = 0;
        for (size_t j = 0; j < total; ++j) {
            double phase = 0;
            size_t kk = k, jj = j;
            for (int d = (int)n.size() - 1; d >= 0; --d) {
                phase += double((kk % n[d]) * (jj % n[d])) / n[d];
                kk /= n[d];
                jj /= n[d];
            }
            acc += x[j] * std::polar(1.0, sign * 2 * M_PI * phase);
        }
        y[k] = acc;
    }
    return y;
}

static double max_error(const std::vector<cd> &a, const std::vector<cd> &b) {
    double e = 0;
    for (size_t i = 0; i < a.size(); ++i) e = std::fmax(e, std::abs(a[i] - b[i]));
    return e;
}

static std::vector<cd> widen(const std::vector<cufftComplex> &v) {
    std::vector<cd> w;
    for (auto c : v) w.push_back(cd(c.x, c.y));
    return w;
}

// simpleCUFFT's pointwise product, scaled by 1/n (cuFFT's transforms are unnormalised).
__global__ void multiply_scale(cufftComplex *a, const cufftComplex *b, int count, float scale) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        cufftComplex p;
        p.x = (a[i].x * b[i].x - a[i].y * b[i].y) * scale;
        p.y = (a[i].x * b[i].y + a[i].y * b[i].x) * scale;
        a[i] = p;
    }
}

// A signal and a filter of small integers, and their direct linear convolution.
static const int SIGNAL = 50, FILTER = 11, CONV = SIGNAL + FILTER - 1;
static std::vector<float> signal_values() {
    std::vector<float> s(SIGNAL);
    for (int i = 0; i < SIGNAL; ++i) s[i] = float((i * 7) % 13) - 6;
    return s;
}
static std::vector<float> filter_values() {
    std::vector<float> f(FILTER);
    for (int i = 0; i < FILTER; ++i) f[i] = float((i * 5) % 7) - 3;
    return f;
}
static std::vector<double> direct_convolution() {
    std::vector<float> s = signal_values(), f = filter_values();
    std::vector<double> y(CONV, 0);
    for (int i = 0; i < SIGNAL; ++i)
        for (int j = 0; j < FILTER; ++j) y[i + j] += double(s[i]) * f[j];
    return y;
}

static void report_convolution(const char *what, const std::vector<float> &got) {
    std::vector<double> want = direct_convolution();
    double err = 0;
    for (int i = 0; i < CONV; ++i) err = std::fmax(err, std::fabs(got[i] - want[i]));
    EXPECT(err < 1e-3);
    std::printf("%s convolution of %d samples with %d taps: matches the direct one; y[0..5] =", what, SIGNAL,
                FILTER);
    for (int i = 0; i < 6; ++i) std::printf(" %.0f", std::round(got[i]) + 0.0);
    std::printf(", y[%d] = %.0f\n", CONV - 1, std::round(got[CONV - 1]) + 0.0);
}

// simpleCUFFT: complex transforms of the padded signal and filter (one batched plan), the
// product, the inverse.
static void c2c_convolution() {
    std::vector<cufftComplex> h(2 * CONV, cufftComplex{0, 0});
    std::vector<float> s = signal_values(), f = filter_values();
    for (int i = 0; i < SIGNAL; ++i) h[i].x = s[i];
    for (int i = 0; i < FILTER; ++i) h[CONV + i].x = f[i];
    cufftComplex *d = to_device(h);
    cufftHandle both, one;
    FFT(cufftPlan1d(&both, CONV, CUFFT_C2C, 2));
    FFT(cufftPlan1d(&one, CONV, CUFFT_C2C, 1));
    FFT(cufftExecC2C(both, d, d, CUFFT_FORWARD));
    multiply_scale<<<4, 32>>>(d, d + CONV, CONV, 1.0f / CONV);
    CHECK_LAUNCH();
    FFT(cufftExecC2C(one, d, d, CUFFT_INVERSE));
    std::vector<cufftComplex> y = from_device(d, CONV);
    std::vector<float> re;
    for (auto c : y) re.push_back(c.x);
    report_convolution("C2C", re);
    FFT(cufftDestroy(both));
    FFT(cufftDestroy(one));
    CHECK(cudaFree(d));
}

// The same with real transforms, out of place: N reals to N/2+1 complex values and back.
static void r2c_convolution() {
    const int N = 64, H = N / 2 + 1;
    std::vector<float> h(2 * N, 0);
    std::vector<float> s = signal_values(), f = filter_values();
    for (int i = 0; i < SIGNAL; ++i) h[i] = s[i];
    for (int i = 0; i < FILTER; ++i) h[N + i] = f[i];
    float *d_real = to_device(h);
    cufftComplex *d_spec;
    CHECK(cudaMalloc(&d_spec, 2 * H * sizeof(cufftComplex)));
    cufftHandle fwd, inv;
    FFT(cufftPlan1d(&fwd, N, CUFFT_R2C, 2));
    FFT(cufftPlan1d(&inv, N, CUFFT_C2R, 1));
    FFT(cufftExecR2C(fwd, d_real, d_spec));
    // The DC term of the signal's half spectrum is its sum.
    std::vector<cufftComplex> spec = from_device(d_spec, 2 * H);
    double sum = 0;
    for (float v : s) sum += v;
    EXPECT(std::fabs(spec[0].x - sum) < 1e-3 && std::fabs(spec[0].y) < 1e-3);
    multiply_scale<<<2, 32>>>(d_spec, d_spec + H, H, 1.0f / N);
    CHECK_LAUNCH();
    FFT(cufftExecC2R(inv, d_spec, d_real));
    report_convolution("R2C/C2R", from_device(d_real, CONV));
    FFT(cufftDestroy(fwd));
    FFT(cufftDestroy(inv));
    CHECK(cudaFree(d_real));
    CHECK(cudaFree(d_spec));
}

static std::vector<cufftComplex> test_signal(int count, int seed) {
    std::vector<cufftComplex> x(count);
    for (int i = 0; i < count; ++i) x[i] = cufftComplex{float((i * 3 + seed) % 7) - 3, float((i * 5 + seed) % 4) - 1.5f};
    return x;
}

// 2D: a C2C plan against the direct DFT, and a real round trip.
static void two_d() {
    const int NX = 8, NY = 6;
    std::vector<cufftComplex> x = test_signal(NX * NY, 1);
    cufftComplex *d = to_device(x), *e;
    CHECK(cudaMalloc(&e, NX * NY * sizeof(cufftComplex)));
    cufftHandle p;
    FFT(cufftPlan2d(&p, NX, NY, CUFFT_C2C));
    FFT(cufftExecC2C(p, d, e, CUFFT_FORWARD));
    EXPECT(max_error(widen(from_device(e, NX * NY)), dft(widen(x), {NX, NY})) < 1e-3);
    FFT(cufftExecC2C(p, e, e, CUFFT_INVERSE));
    std::vector<cufftComplex> back = from_device(e, NX * NY);
    for (int i = 0; i < NX * NY; ++i) EXPECT(std::fabs(back[i].x - NX * NY * x[i].x) < 1e-3);
    std::printf("2D C2C %dx%d: matches the direct DFT; the inverse gives %d x\n", NX, NY, NX * NY);
    FFT(cufftDestroy(p));
    CHECK(cudaFree(d));
    CHECK(cudaFree(e));

    const int RX = 6, RY = 8, RH = RY / 2 + 1;
    std::vector<float> r(RX * RY);
    double sum = 0;
    for (int i = 0; i < RX * RY; ++i) sum += r[i] = float((i * 11) % 9) - 4;
    float *dr = to_device(r);
    cufftComplex *ds;
    CHECK(cudaMalloc(&ds, RX * RH * sizeof(cufftComplex)));
    cufftHandle f, b;
    FFT(cufftPlan2d(&f, RX, RY, CUFFT_R2C));
    FFT(cufftPlan2d(&b, RX, RY, CUFFT_C2R));
    FFT(cufftExecR2C(f, dr, ds));
    std::vector<cufftComplex> half = from_device(ds, RX * RH);
    std::vector<cd> rc;
    for (float v : r) rc.push_back(v);
    std::vector<cd> full = dft(rc, {RX, RY});
    for (int i = 0; i < RX; ++i)
        for (int j = 0; j < RH; ++j) EXPECT(std::abs(cd(half[i * RH + j].x, half[i * RH + j].y) - full[i * RY + j]) < 1e-3);
    FFT(cufftExecC2R(b, ds, dr));
    std::vector<float> back2 = from_device(dr, RX * RY);
    for (int i = 0; i < RX * RY; ++i) EXPECT(std::fabs(back2[i] - RX * RY * r[i]) < 1e-3);
    std::printf("2D R2C/C2R %dx%d: DC %.0f, the half spectrum matches the direct DFT, round trip %d x\n", RX, RY,
                std::round(half[0].x) + 0.0, RX * RY);
    FFT(cufftDestroy(f));
    FFT(cufftDestroy(b));
    CHECK(cudaFree(dr));
    CHECK(cudaFree(ds));
}

// 3D: a C2C plan against the direct DFT.
static void three_d() {
    const int N = 4, M = 3, K = 5;
    std::vector<cufftComplex> x = test_signal(N * M * K, 2);
    cufftComplex *d = to_device(x);
    cufftHandle p;
    FFT(cufftPlan3d(&p, N, M, K, CUFFT_C2C));
    FFT(cufftExecC2C(p, d, d, CUFFT_FORWARD));
    EXPECT(max_error(widen(from_device(d, N * M * K)), dft(widen(x), {N, M, K})) < 1e-3);
    std::printf("3D C2C %dx%dx%d in place: matches the direct DFT\n", N, M, K);
    FFT(cufftDestroy(p));
    CHECK(cudaFree(d));
}

// Batched plans with the advanced layout.
static void advanced_layouts() {
    // Three signals of 16 interleaved (stride 3, distance 1), out to rows 20 apart; the four
    // values after each output row are the program's and stay as they were.
    {
        const int N = 16, B = 3, ODIST = 20;
        std::vector<cufftComplex> x = test_signal(N * B, 3);
        std::vector<cufftComplex> sentinel(ODIST * B, cufftComplex{1234.5f, -1234.5f});
        cufftComplex *din = to_device(x), *dout = to_device(sentinel);
        int n[1] = {N}, inembed[1] = {N}, onembed[1] = {ODIST};
        cufftHandle p;
        FFT(cufftPlanMany(&p, 1, n, inembed, B, 1, onembed, 1, ODIST, CUFFT_C2C, B));
        FFT(cufftExecC2C(p, din, dout, CUFFT_FORWARD));
        std::vector<cufftComplex> out = from_device(dout, ODIST * B);
        for (int b = 0; b < B; ++b) {
            std::vector<cd> sig, got;
            for (int i = 0; i < N; ++i) sig.push_back(cd(x[i * B + b].x, x[i * B + b].y));
            for (int i = 0; i < N; ++i) got.push_back(cd(out[b * ODIST + i].x, out[b * ODIST + i].y));
            EXPECT(max_error(got, dft(sig, {N})) < 1e-3);
            for (int i = N; i < ODIST; ++i) EXPECT(out[b * ODIST + i].x == 1234.5f && out[b * ODIST + i].y == -1234.5f);
        }
        std::printf("PlanMany rank 1, %d batches interleaved (istride %d, idist 1), odist %d: each matches the "
                    "direct DFT, the gaps untouched\n",
                    B, B, ODIST);
        FFT(cufftDestroy(p));
        CHECK(cudaFree(din));
        CHECK(cudaFree(dout));
    }
    // Two 4x5 transforms whose input rows are padded to 8 (inembed {4, 8}, idist 32), out to
    // the basic layout given as an embedding (cuFFT refuses one NULL embedding beside another).
    {
        const int R = 4, C = 5, PAD = 8, B = 2;
        std::vector<cufftComplex> x = test_signal(R * PAD * B, 4);
        cufftComplex *din = to_device(x), *dout;
        CHECK(cudaMalloc(&dout, R * C * B * sizeof(cufftComplex)));
        int n[2] = {R, C}, inembed[2] = {R, PAD}, onembed[2] = {R, C};
        cufftHandle p;
        FFT(cufftPlanMany(&p, 2, n, inembed, 1, R * PAD, onembed, 1, R * C, CUFFT_C2C, B));
        FFT(cufftExecC2C(p, din, dout, CUFFT_FORWARD));
        std::vector<cufftComplex> out = from_device(dout, R * C * B);
        for (int b = 0; b < B; ++b) {
            std::vector<cd> sig, got;
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < C; ++j) sig.push_back(cd(x[b * R * PAD + i * PAD + j].x, x[b * R * PAD + i * PAD + j].y));
            for (int i = 0; i < R * C; ++i) got.push_back(cd(out[b * R * C + i].x, out[b * R * C + i].y));
            EXPECT(max_error(got, dft(sig, {R, C})) < 1e-3);
        }
        std::printf("PlanMany rank 2, rows padded to %d, %d batches: each matches the direct DFT\n", PAD, B);
        FFT(cufftDestroy(p));
        CHECK(cudaFree(din));
        CHECK(cudaFree(dout));
    }
    // In-place real transforms: each batch's reals padded to 2 * (N/2 + 1).
    {
        const int N = 16, H = N / 2 + 1, B = 2;
        std::vector<float> x(2 * H * B, 0);
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < N; ++i) x[b * 2 * H + i] = float((i * 3 + b) % 5) - 2;
        float *d = to_device(x);
        cufftHandle p;
        FFT(cufftPlan1d(&p, N, CUFFT_R2C, B));
        FFT(cufftExecR2C(p, d, (cufftComplex *)d));
        std::vector<cufftComplex> out = from_device((cufftComplex *)d, H * B);
        for (int b = 0; b < B; ++b) {
            std::vector<cd> sig;
            for (int i = 0; i < N; ++i) sig.push_back(x[b * 2 * H + i]);
            std::vector<cd> full = dft(sig, {N});
            for (int k = 0; k < H; ++k) EXPECT(std::abs(cd(out[b * H + k].x, out[b * H + k].y) - full[k]) < 1e-3);
        }
        std::printf("R2C in place, %d batches of %d padded to %d reals: matches the direct DFT\n", B, N, 2 * H);
        FFT(cufftDestroy(p));
        CHECK(cudaFree(d));
    }
}

// Double precision: Z2Z against the direct DFT; D2Z/Z2D on a plan made with cufftCreate and
// cufftMakePlan1d, without auto-allocation, on a work area of the program's.
static void double_precision() {
    const int N = 12;
    std::vector<cufftDoubleComplex> x(N);
    for (int i = 0; i < N; ++i) x[i] = cufftDoubleComplex{std::sin(0.3 * i) + 0.25 * i, std::cos(0.7 * i)};
    cufftDoubleComplex *d = to_device(x);
    cufftHandle z;
    FFT(cufftPlan1d(&z, N, CUFFT_Z2Z, 1));
    FFT(cufftExecZ2Z(z, d, d, CUFFT_FORWARD));
    std::vector<cufftDoubleComplex> y = from_device(d, N);
    std::vector<cd> xs, ys;
    for (auto c : x) xs.push_back(cd(c.x, c.y));
    for (auto c : y) ys.push_back(cd(c.x, c.y));
    EXPECT(max_error(ys, dft(xs, {N})) < 1e-9);
    std::printf("Z2Z %d: matches the direct DFT to 1e-9\n", N);
    FFT(cufftDestroy(z));
    CHECK(cudaFree(d));

    const int R = 20, B = 3, H = R / 2 + 1;
    cufftHandle f, b;
    FFT(cufftCreate(&f));
    FFT(cufftCreate(&b));
    FFT(cufftSetAutoAllocation(f, 0));
    size_t work_f = 0, work_b = 0, asked = 0;
    FFT(cufftMakePlan1d(f, R, CUFFT_D2Z, B, &work_f));
    FFT(cufftMakePlan1d(b, R, CUFFT_Z2D, B, &work_b));
    FFT(cufftGetSize(f, &asked));
    EXPECT(asked == work_f);
    void *work = nullptr;
    CHECK(cudaMalloc(&work, work_f > 0 ? work_f : 1));
    FFT(cufftSetWorkArea(f, work));
    std::vector<double> r(R * B);
    for (int i = 0; i < R * B; ++i) r[i] = std::sin(0.37 * i) * 3 + (i % 4);
    double *dr = to_device(r);
    cufftDoubleComplex *ds;
    CHECK(cudaMalloc(&ds, H * B * sizeof(cufftDoubleComplex)));
    FFT(cufftExecD2Z(f, dr, ds));
    std::vector<cufftDoubleComplex> half = from_device(ds, H * B);
    for (int k = 0; k < B; ++k) {
        std::vector<cd> sig(r.begin() + k * R, r.begin() + (k + 1) * R);
        std::vector<cd> full = dft(sig, {R});
        for (int j = 0; j < H; ++j) EXPECT(std::abs(cd(half[k * H + j].x, half[k * H + j].y) - full[j]) < 1e-9);
    }
    FFT(cufftExecZ2D(b, ds, dr));
    std::vector<double> back = from_device(dr, R * B);
    for (int i = 0; i < R * B; ++i) EXPECT(std::fabs(back[i] - R * r[i]) < 1e-9);
    std::printf("D2Z/Z2D %d x %d on made plans, a work area of the program's: matches the direct DFT, round "
                "trip %d x\n",
                B, R, R);
    FFT(cufftDestroy(f));
    FFT(cufftDestroy(b));
    CHECK(cudaFree(work));
    CHECK(cudaFree(dr));
    CHECK(cudaFree(ds));
}

// A plan on a stream of the program's: its work is ordered there.
static void on_a_stream() {
    const int N = 32;
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    std::vector<cufftComplex> x = test_signal(N, 5);
    cufftComplex *d = to_device(x);
    cufftHandle p;
    FFT(cufftPlan1d(&p, N, CUFFT_C2C, 1));
    FFT(cufftSetStream(p, stream));
    FFT(cufftExecC2C(p, d, d, CUFFT_FORWARD));
    FFT(cufftExecC2C(p, d, d, CUFFT_INVERSE));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<cufftComplex> back = from_device(d, N);
    for (int i = 0; i < N; ++i) EXPECT(std::fabs(back[i].x - N * x[i].x) < 1e-3 && std::fabs(back[i].y - N * x[i].y) < 1e-3);
    std::printf("a plan on a stream: forward and inverse give %d x\n", N);
    FFT(cufftDestroy(p));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(d));
}

// What cuFFT answers a program that misuses it.
static void misuse() {
    cufftHandle p;
    std::printf("misuse: cufftPlan1d of size 0 -> %s\n", result_name(cufftPlan1d(&p, 0, CUFFT_C2C, 1)));
    std::printf("misuse: cufftPlan1d of an unknown type -> %s\n",
                result_name(cufftPlan1d(&p, 16, (cufftType)0x55, 1)));
    cufftHandle gone;
    FFT(cufftPlan1d(&gone, 16, CUFFT_C2C, 1));
    FFT(cufftDestroy(gone));
    cufftComplex *d;
    CHECK(cudaMalloc(&d, 16 * sizeof(cufftComplex)));
    std::printf("misuse: exec on a destroyed plan -> %s\n",
                result_name(cufftExecC2C(gone, d, d, CUFFT_FORWARD)));
    std::printf("misuse: cufftSetStream on a made-up plan -> %s\n", result_name(cufftSetStream(4242, 0)));
    int version = 0;
    FFT(cufftGetVersion(&version));
    std::printf("cufftGetVersion: major %s the header's\n", version / 1000 == CUFFT_VER_MAJOR ? "is" : "is NOT");
    // The multi-GPU API: refused on one GPU, and by Phos everywhere.
    cufftHandle x;
    FFT(cufftCreate(&x));
    int gpus[2] = {0, 1};
    cufftResult r = cufftXtSetGPUs(x, 2, gpus);
    std::printf("cufftXtSetGPUs: %s\n", r != CUFFT_SUCCESS ? "refused" : "accepted");
    FFT(cufftDestroy(x));
    CHECK(cudaFree(d));
}

// The calls a careless or hostile program makes (their results are Phos's checks; natively
// most of them are undefined behaviour).
static void hostile() {
    const int N = 1024;
    cufftHandle p;
    FFT(cufftPlan1d(&p, N, CUFFT_C2C, 1));
    cufftComplex *small, *big;
    CHECK(cudaMalloc(&small, 64 * sizeof(cufftComplex)));
    CHECK(cudaMalloc(&big, N * sizeof(cufftComplex)));
    std::printf("hostile: output past its allocation -> %s\n",
                result_name(cufftExecC2C(p, big, small, CUFFT_FORWARD)));
    std::printf("hostile: input past its allocation -> %s\n", result_name(cufftExecC2C(p, small, big, CUFFT_FORWARD)));
    std::printf("hostile: direction 7 -> %s\n", result_name(cufftExecC2C(p, big, big, 7)));
    std::printf("hostile: R2C exec on a C2C plan -> %s\n", result_name(cufftExecR2C(p, (float *)big, big)));
    std::printf("hostile: made-up plan -> %s\n", result_name(cufftExecC2C(777, big, big, CUFFT_FORWARD)));
    cufftHandle m;
    FFT(cufftCreate(&m));
    FFT(cufftSetAutoAllocation(m, 0));
    size_t work = 0;
    FFT(cufftMakePlan1d(m, N, CUFFT_C2C, 4, &work));
    void *tiny;
    CHECK(cudaMalloc(&tiny, 16));
    std::printf("hostile: work area smaller than the plan's -> %s\n", result_name(cufftSetWorkArea(m, tiny)));
    std::vector<cufftComplex> x = test_signal(N, 6);
    CHECK(cudaMemcpy(big, x.data(), N * sizeof(cufftComplex), cudaMemcpyHostToDevice));
    FFT(cufftExecC2C(p, big, big, CUFFT_FORWARD));
    FFT(cufftExecC2C(p, big, big, CUFFT_INVERSE));
    std::vector<cufftComplex> back = from_device(big, N);
    for (int i = 0; i < N; ++i) EXPECT(std::fabs(back[i].x - N * x[i].x) < 1e-2);
    std::printf("hostile: the plan still works\n");
    FFT(cufftDestroy(p));
    FFT(cufftDestroy(m));
    CHECK(cudaFree(small));
    CHECK(cudaFree(big));
    CHECK(cudaFree(tiny));
}

// Plans made before a checkpoint transform after the restore: a batched many-plan on a
// stream, and a made plan on a work area of the program's.
static int checkpointed() {
    const int N = 24, B = 2;
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int n[1] = {N};
    cufftHandle many, made;
    FFT(cufftPlanMany(&many, 1, n, nullptr, 1, 0, nullptr, 1, 0, CUFFT_C2C, B));
    FFT(cufftSetStream(many, stream));
    FFT(cufftCreate(&made));
    FFT(cufftSetAutoAllocation(made, 0));
    size_t work = 0;
    FFT(cufftMakePlan1d(made, N, CUFFT_C2C, B, &work));
    void *area;
    CHECK(cudaMalloc(&area, work > 0 ? work : 1));
    FFT(cufftSetWorkArea(made, area));
    std::vector<cufftComplex> x = test_signal(N * B, 7);
    cufftComplex *d = to_device(x);
    FFT(cufftExecC2C(many, d, d, CUFFT_FORWARD));
    CHECK(cudaStreamSynchronize(stream));
    std::printf("cufft ready\n");
    std::fflush(stdout);
    sleep(3);
    // The spectrum left in device memory goes back through both plans.
    FFT(cufftExecC2C(many, d, d, CUFFT_INVERSE));
    CHECK(cudaStreamSynchronize(stream));
    FFT(cufftExecC2C(made, d, d, CUFFT_FORWARD));
    FFT(cufftExecC2C(made, d, d, CUFFT_INVERSE));
    size_t asked = 0;
    FFT(cufftGetSize(made, &asked));
    EXPECT(asked == work);
    std::vector<cufftComplex> back = from_device(d, N * B);
    for (int i = 0; i < N * B; ++i)
        EXPECT(std::fabs(back[i].x - N * N * x[i].x) < 1e-2 && std::fabs(back[i].y - N * N * x[i].y) < 1e-2);
    std::printf("after the restore: the plans kept their layout, stream and work area\n");
    FFT(cufftDestroy(many));
    FFT(cufftDestroy(made));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "checkpoint") == 0) return checkpointed();
    c2c_convolution();
    r2c_convolution();
    two_d();
    three_d();
    advanced_layouts();
    double_precision();
    on_a_stream();
    misuse();
    if (argc > 1 && std::strcmp(argv[1], "hostile") == 0) hostile();
    std::printf("done\n");
    return 0;
}
