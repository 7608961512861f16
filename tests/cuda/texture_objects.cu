// CUDA arrays and texture objects in the style of NVIDIA's simpleTexture: a 2D float array
// sampled with point and linear filtering (8-bit fixed-point weights), clamp, wrap, mirror and
// border addressing, normalized coordinates; integer textures read as elements and as
// normalized floats; linear and pitched memory; copies to, from and between arrays;
// descriptor queries; and the errors CUDA answers for misuse. Every result is checked
// against a host reference written from the CUDA Programming Guide's texture-fetching rules.
#include "check.h"
#include <cmath>
#include <cstring>
#include <vector>

const int W = 8, H = 6;

__global__ void sample2d(cudaTextureObject_t t, const float2 *coords, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex2D<float>(t, coords[i].x, coords[i].y);
}

__global__ void sample_uchar4(cudaTextureObject_t t, uchar4 *out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<uchar4>(t, x + 0.5f, y + 0.5f);
}

__global__ void sample_norm4(cudaTextureObject_t t, float4 *out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float4>(t, x + 0.5f, y + 0.5f);
}

__global__ void fetch1d(cudaTextureObject_t t, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<int>(t, i);
}

static float texel(int x, int y) { return (float)(y * 10 + x); }

// CUDA's addressing of texel index i in a dimension of n texels.
static int address(int i, int n, cudaTextureAddressMode mode, bool *border) {
    switch (mode) {
    case cudaAddressModeWrap: return ((i % n) + n) % n;
    case cudaAddressModeMirror: {
        int p = ((i % (2 * n)) + 2 * n) % (2 * n);
        return p < n ? p : 2 * n - 1 - p;
    }
    case cudaAddressModeBorder:
        if (i < 0 || i >= n) *border = true;
        return i < 0 ? 0 : (i >= n ? n - 1 : i);
    default: return i < 0 ? 0 : (i >= n ? n - 1 : i);
    }
}

static float fetch(int x, int y, cudaTextureAddressMode mode) {
    bool border = false;
    int ax = address(x, W, mode, &border), ay = address(y, H, mode, &border);
    return border ? 0.0f : texel(ax, ay);
}

// The Guide's linear filtering: weights are fractions in 9-bit fixed point, 8 bits after the point.
static float reference(float x, float y, bool linear, bool normalized, cudaTextureAddressMode mode) {
    if (normalized) {
        x *= W;
        y *= H;
    }
    if (!linear) return fetch((int)floorf(x), (int)floorf(y), mode);
    float xb = x - 0.5f, yb = y - 0.5f;
    int i = (int)floorf(xb), j = (int)floorf(yb);
    double a = std::round((double)(xb - floorf(xb)) * 256.0) / 256.0;
    double b = std::round((double)(yb - floorf(yb)) * 256.0) / 256.0;
    // Each corner's weight, the product of its fractions, is itself rounded to 8 fractional bits (it shows at the
    // border, where the corners' weights do not cancel out as they do over this texture's linear texels).
    auto q = [](double w) { return std::floor(w * 256.0 + 0.5) / 256.0; };
    double r = q((1 - a) * (1 - b)) * fetch(i, j, mode) + q(a * (1 - b)) * fetch(i + 1, j, mode) +
               q((1 - a) * b) * fetch(i, j + 1, mode) + q(a * b) * fetch(i + 1, j + 1, mode);
    return (float)r;
}

static cudaTextureObject_t make_texture(cudaArray_t a, cudaTextureAddressMode mode, cudaTextureFilterMode filter,
                                        cudaTextureReadMode read, bool normalized) {
    cudaResourceDesc res;
    std::memset(&res, 0, sizeof res);
    res.resType = cudaResourceTypeArray;
    res.res.array.array = a;
    cudaTextureDesc td;
    std::memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = mode;
    td.filterMode = filter;
    td.readMode = read;
    td.normalizedCoords = normalized;
    cudaTextureObject_t t = 0;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

int main() {
    // --- A 2D float array, filled from pitched host rows.
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &desc, W, H));
    const int HP = W + 3;  // host pitch in floats
    std::vector<float> host(HP * H, -1.0f);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) host[y * HP + x] = texel(x, y);
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, host.data(), HP * sizeof(float), W * sizeof(float), H,
                              cudaMemcpyHostToDevice));
    cudaChannelFormatDesc got;
    cudaExtent extent;
    unsigned int flags = 99;
    CHECK(cudaArrayGetInfo(&got, &extent, &flags, arr));
    std::printf("array: %d-bit kind %d, extent %zux%zux%zu, flags %u\n", got.x, (int)got.f, extent.width, extent.height,
                extent.depth, flags);
    CHECK(cudaGetChannelDesc(&got, arr));
    EXPECT(got.x == 32 && got.y == 0 && got.f == cudaChannelFormatKindFloat);

    // --- Lookups: texel centres, edges, outside the texture, fractions that 8-bit weights round.
    std::vector<float2> coords;
    for (int k = 0; k < 64; k++) coords.push_back(make_float2(-2.3f + 0.37f * k, -1.1f + 0.29f * k));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) coords.push_back(make_float2(x + 0.5f, y + 0.5f));
    coords.push_back(make_float2(0.0f, 0.0f));
    coords.push_back(make_float2((float)W, (float)H));
    coords.push_back(make_float2(1.3f, 2.7f));
    const int n = (int)coords.size();
    float2 *dcoords, *dnorm;
    float *dout;
    CHECK(cudaMalloc(&dcoords, n * sizeof(float2)));
    CHECK(cudaMalloc(&dnorm, n * sizeof(float2)));
    CHECK(cudaMalloc(&dout, n * sizeof(float)));
    std::vector<float2> norm(n);
    for (int i = 0; i < n; i++) norm[i] = make_float2(coords[i].x / W, coords[i].y / H);
    CHECK(cudaMemcpy(dcoords, coords.data(), n * sizeof(float2), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dnorm, norm.data(), n * sizeof(float2), cudaMemcpyHostToDevice));
    std::vector<float> out(n);
    bool rounding_seen = false;
    const cudaTextureAddressMode modes[] = {cudaAddressModeClamp, cudaAddressModeBorder, cudaAddressModeWrap,
                                            cudaAddressModeMirror};
    const char *mode_names[] = {"clamp", "border", "wrap", "mirror"};
    for (int m = 0; m < 4; m++)
        for (int linear = 0; linear < 2; linear++)
            for (int normalized = 0; normalized < 2; normalized++) {
                // Wrap and mirror apply to normalized coordinates only.
                if (m >= 2 && !normalized) continue;
                cudaTextureObject_t t = make_texture(arr, modes[m], linear ? cudaFilterModeLinear : cudaFilterModePoint,
                                                     cudaReadModeElementType, normalized);
                sample2d<<<(n + 63) / 64, 64>>>(t, normalized ? dnorm : dcoords, dout, n);
                CHECK_LAUNCH();
                CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
                for (int i = 0; i < n; i++) {
                    float2 c = normalized ? norm[i] : coords[i];
                    float want = reference(c.x, c.y, linear, normalized, modes[m]);
                    if (out[i] != want) {
                        std::printf("FAILED: %s %s %s at (%g, %g): %.9g, expected %.9g\n", mode_names[m],
                                    linear ? "linear" : "point", normalized ? "normalized" : "texels", c.x, c.y,
                                    out[i], want);
                        return 1;
                    }
                    if (linear && !normalized && m == 0) {
                        // Exact weights would give another value here: the 8-bit weights are what is checked.
                        float xb = c.x - 0.5f, a = xb - floorf(xb);
                        if (fabsf(a * 256.0f - roundf(a * 256.0f)) > 0.05f) rounding_seen = true;
                    }
                }
                std::printf("%s %s %s ok\n", mode_names[m], linear ? "linear" : "point",
                            normalized ? "normalized" : "texels");
                CHECK(cudaDestroyTextureObject(t));
            }
    EXPECT(rounding_seen);

    // --- Queries give back what the texture was made of.
    cudaTextureObject_t t = make_texture(arr, cudaAddressModeBorder, cudaFilterModeLinear, cudaReadModeElementType, true);
    cudaResourceDesc rq;
    CHECK(cudaGetTextureObjectResourceDesc(&rq, t));
    EXPECT(rq.resType == cudaResourceTypeArray && rq.res.array.array == arr);
    cudaTextureDesc tq;
    CHECK(cudaGetTextureObjectTextureDesc(&tq, t));
    EXPECT(tq.addressMode[0] == cudaAddressModeBorder && tq.filterMode == cudaFilterModeLinear && tq.normalizedCoords);
    CHECK(cudaDestroyTextureObject(t));
    std::printf("queries ok\n");

    // --- An 8-bit RGBA array read as elements and as normalized floats.
    const int CW = 5, CH = 3;
    cudaChannelFormatDesc c4 = cudaCreateChannelDesc<uchar4>();
    cudaArray_t carr;
    CHECK(cudaMallocArray(&carr, &c4, CW, CH));
    std::vector<uchar4> pix(CW * CH);
    for (int i = 0; i < CW * CH; i++) pix[i] = make_uchar4(i * 17, 255 - i, i * 3, 128);
    CHECK(cudaMemcpy2DToArray(carr, 0, 0, pix.data(), CW * sizeof(uchar4), CW * sizeof(uchar4), CH,
                              cudaMemcpyHostToDevice));
    uchar4 *dpix;
    float4 *dnf;
    CHECK(cudaMalloc(&dpix, CW * CH * sizeof(uchar4)));
    CHECK(cudaMalloc(&dnf, CW * CH * sizeof(float4)));
    cudaTextureObject_t te = make_texture(carr, cudaAddressModeClamp, cudaFilterModePoint, cudaReadModeElementType, false);
    cudaTextureObject_t tn =
        make_texture(carr, cudaAddressModeClamp, cudaFilterModePoint, cudaReadModeNormalizedFloat, false);
    sample_uchar4<<<1, dim3(CW, CH)>>>(te, dpix, CW, CH);
    sample_norm4<<<1, dim3(CW, CH)>>>(tn, dnf, CW, CH);
    CHECK_LAUNCH();
    std::vector<uchar4> gotpix(CW * CH);
    std::vector<float4> gotnf(CW * CH);
    CHECK(cudaMemcpy(gotpix.data(), dpix, CW * CH * sizeof(uchar4), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(gotnf.data(), dnf, CW * CH * sizeof(float4), cudaMemcpyDeviceToHost));
    for (int i = 0; i < CW * CH; i++) {
        EXPECT(std::memcmp(&gotpix[i], &pix[i], 4) == 0);
        EXPECT(gotnf[i].x == pix[i].x / 255.0f && gotnf[i].y == pix[i].y / 255.0f && gotnf[i].w == 128 / 255.0f);
    }
    std::printf("uchar4 element and normalized reads ok\n");
    CHECK(cudaDestroyTextureObject(te));
    CHECK(cudaDestroyTextureObject(tn));

    // --- Linear memory read by tex1Dfetch, and pitched memory read by tex2D.
    const int N = 100;
    int *dlin, *dres;
    CHECK(cudaMalloc(&dlin, N * sizeof(int)));
    CHECK(cudaMalloc(&dres, N * sizeof(int)));
    std::vector<int> lin(N);
    for (int i = 0; i < N; i++) lin[i] = i * i - 50;
    CHECK(cudaMemcpy(dlin, lin.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    cudaResourceDesc lres;
    std::memset(&lres, 0, sizeof lres);
    lres.resType = cudaResourceTypeLinear;
    lres.res.linear.devPtr = dlin;
    lres.res.linear.desc = cudaCreateChannelDesc<int>();
    lres.res.linear.sizeInBytes = N * sizeof(int);
    cudaTextureDesc ltd;
    std::memset(&ltd, 0, sizeof ltd);
    cudaTextureObject_t tl;
    CHECK(cudaCreateTextureObject(&tl, &lres, &ltd, nullptr));
    fetch1d<<<2, 64>>>(tl, dres, N);
    CHECK_LAUNCH();
    std::vector<int> gotlin(N);
    CHECK(cudaMemcpy(gotlin.data(), dres, N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++) EXPECT(gotlin[i] == lin[i]);
    CHECK(cudaDestroyTextureObject(tl));
    std::printf("linear memory ok\n");

    float *dpitched;
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&dpitched, &pitch, W * sizeof(float), H));
    CHECK(cudaMemcpy2D(dpitched, pitch, host.data(), HP * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice));
    cudaResourceDesc pres;
    std::memset(&pres, 0, sizeof pres);
    pres.resType = cudaResourceTypePitch2D;
    pres.res.pitch2D.devPtr = dpitched;
    pres.res.pitch2D.desc = desc;
    pres.res.pitch2D.width = W;
    pres.res.pitch2D.height = H;
    pres.res.pitch2D.pitchInBytes = pitch;
    cudaTextureDesc ptd;
    std::memset(&ptd, 0, sizeof ptd);
    ptd.addressMode[0] = ptd.addressMode[1] = cudaAddressModeClamp;
    ptd.filterMode = cudaFilterModeLinear;
    cudaTextureObject_t tp;
    CHECK(cudaCreateTextureObject(&tp, &pres, &ptd, nullptr));
    sample2d<<<(n + 63) / 64, 64>>>(tp, dcoords, dout, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT(out[i] == reference(coords[i].x, coords[i].y, true, false, cudaAddressModeClamp));
    CHECK(cudaDestroyTextureObject(tp));
    std::printf("pitched memory ok\n");

    // --- Copies out of, between and into arrays.
    std::vector<float> back(W * H, 0.0f);
    CHECK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), arr, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) EXPECT(back[y * W + x] == texel(x, y));
    cudaArray_t arr2;
    CHECK(cudaMallocArray(&arr2, &desc, W, H));
    CHECK(cudaMemcpy2DArrayToArray(arr2, 0, 0, arr, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToDevice));
    // A sub-rectangle: 3x2 texels from (2, 1) of the first array to (4, 3) of the second.
    CHECK(cudaMemcpy2DArrayToArray(arr2, 4 * sizeof(float), 3, arr, 2 * sizeof(float), 1, 3 * sizeof(float), 2,
                                   cudaMemcpyDeviceToDevice));
    float *dback;
    CHECK(cudaMalloc(&dback, W * H * sizeof(float)));
    CHECK(cudaMemcpy2DFromArray(dback, W * sizeof(float), arr2, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(back.data(), dback, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            bool moved = x >= 4 && x < 7 && y >= 3 && y < 5;
            EXPECT(back[y * W + x] == (moved ? texel(x - 2, y - 2) : texel(x, y)));
        }
    // The deprecated linear copies run on into the next rows.
    std::vector<float> row(W + 3);
    for (int i = 0; i < W + 3; i++) row[i] = 1000.0f + i;
    CHECK(cudaMemcpyToArray(arr2, 5 * sizeof(float), 1, row.data(), row.size() * sizeof(float), cudaMemcpyHostToDevice));
    std::vector<float> lin2(W * 2);
    CHECK(cudaMemcpyFromArray(lin2.data(), arr2, 0, 1, lin2.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < W * 2; i++) EXPECT(lin2[i] == (i < 5 ? texel(i, 1) : 1000.0f + (i - 5)));
    std::printf("array copies ok\n");

    // --- Misuse.
    cudaError_t e = cudaMemcpy2DToArray(arr, 4 * sizeof(float), 0, host.data(), HP * sizeof(float), 5 * sizeof(float), 1,
                                        cudaMemcpyHostToDevice);
    std::printf("copy past the row: %s\n", cudaGetErrorName(e));
    e = cudaMemcpy2DToArray(arr, 0, 5, host.data(), HP * sizeof(float), W * sizeof(float), 2, cudaMemcpyHostToDevice);
    std::printf("copy past the rows: %s\n", cudaGetErrorName(e));
    e = cudaMemcpy2DToArray(arr, 0, 0, host.data(), HP * sizeof(float), W * sizeof(float), H, cudaMemcpyDeviceToHost);
    std::printf("copy to an array from the device to the host: %s\n", cudaGetErrorName(e));
    e = cudaMemcpy2DFromArray(back.data(), 4, arr, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToHost);
    std::printf("destination pitch below the width: %s\n", cudaGetErrorName(e));
    cudaTextureDesc plain;
    std::memset(&plain, 0, sizeof plain);
    e = cudaCreateTextureObject(&t, nullptr, &plain, nullptr);
    std::printf("texture without a resource: %s\n", cudaGetErrorName(e));
    std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    // The array is untouched by the refused copies.
    CHECK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), arr, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) EXPECT(back[y * W + x] == texel(x, y));

    CHECK(cudaFreeArray(arr));
    CHECK(cudaFreeArray(arr2));
    CHECK(cudaFreeArray(carr));
    CHECK(cudaFreeArray(nullptr));
    CHECK(cudaFree(dcoords));
    CHECK(cudaFree(dnorm));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(dpix));
    CHECK(cudaFree(dnf));
    CHECK(cudaFree(dlin));
    CHECK(cudaFree(dres));
    CHECK(cudaFree(dpitched));
    CHECK(cudaFree(dback));
    std::printf("done\n");
    return 0;
}
