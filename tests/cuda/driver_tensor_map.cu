// Tensor maps (Hopper's TMA descriptors, which Triton builds on H100): valid tiled and im2col
// encodes succeed and an address is replaced; each argument the driver's reference constrains
// is then broken, one at a time, and the driver's answer printed (never the 128 bytes, which
// are the driver's own). The functions are found in the driver the program runs on, under
// names of this program's (CUDA 11.8's cuda.h has none of them).
#include "driver_check.h"

#include <cstdint>
#include <dlfcn.h>

struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

typedef CUresult (*tiled_t)(TensorMap *, int, unsigned, void *, const unsigned long long *, const unsigned long long *,
                            const unsigned *, const unsigned *, int, int, int, int);
typedef CUresult (*im2col_t)(TensorMap *, int, unsigned, void *, const unsigned long long *,
                             const unsigned long long *, const int *, const int *, unsigned, unsigned,
                             const unsigned *, int, int, int, int);
typedef CUresult (*replace_t)(TensorMap *, void *);

// CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill.
enum { UINT8 = 0, FLOAT16 = 6, INT32 = 3, FLOAT32 = 7 };
enum { SWIZZLE_NONE = 0, SWIZZLE_32B = 1, SWIZZLE_128B = 3 };
enum { L2_NONE = 0, L2_128B = 2 };
enum { OOB_NONE = 0, OOB_NAN = 1 };

static tiled_t tiled;
static im2col_t im2col;
static replace_t replace;

// A valid rank-2 float32 tile: 64 x 32 elements, rows of 256 bytes, boxes of 32 x 8.
struct Tiled {
    int type = FLOAT32;
    unsigned rank = 2;
    uintptr_t address;
    unsigned long long dims[5] = {64, 32, 1, 1, 1};
    unsigned long long strides[4] = {256, 0, 0, 0};
    unsigned box[5] = {32, 8, 1, 1, 1};
    unsigned element_strides[5] = {1, 1, 1, 1, 1};
    int swizzle = SWIZZLE_128B;
    int oob = OOB_NONE;
    CUresult encode(TensorMap *map) const {
        return tiled(map, type, rank, (void *)address, dims, strides, box, element_strides, 0, swizzle, L2_128B,
                     oob);
    }
};

// A valid rank-4 (NHWC) half im2col map: 64 channels, 8 x 8 pixels, 2 images.
struct Im2col {
    unsigned rank = 4;
    uintptr_t address;
    unsigned long long dims[5] = {64, 8, 8, 2, 1};
    unsigned long long strides[4] = {128, 1024, 8192, 0};
    int lower[3] = {-1, -1, 0};
    int upper[3] = {-1, -1, 0};
    unsigned channels = 64, pixels = 64;
    unsigned element_strides[5] = {1, 1, 1, 1, 1};
    CUresult encode(TensorMap *map) const {
        return im2col(map, FLOAT16, rank, (void *)address, dims, strides, lower, upper, channels, pixels,
                      element_strides, 0, SWIZZLE_128B, L2_NONE, OOB_NONE);
    }
};

int main() {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    tiled = (tiled_t)dlsym(RTLD_DEFAULT, "cuTensorMapEncodeTiled");
    im2col = (im2col_t)dlsym(RTLD_DEFAULT, "cuTensorMapEncodeIm2col");
    replace = (replace_t)dlsym(RTLD_DEFAULT, "cuTensorMapReplaceAddress");
    if (!tiled || !im2col || !replace) {
        printf("the driver has no tensor maps\n");
        return 1;
    }

    CUdeviceptr memory;
    CU(cuMemAlloc(&memory, 1 << 20));
    TensorMap map;
    Tiled t;
    t.address = memory;
    printf("tiled, rank 2, 128-byte swizzle: %s\n", name_of(t.encode(&map)));
    Tiled one;
    one.address = memory;
    one.type = UINT8;
    one.rank = 1;
    one.dims[0] = 256;
    one.box[0] = 16;
    one.swizzle = SWIZZLE_NONE;
    printf("tiled, rank 1: %s\n", name_of(one.encode(&map)));
    Tiled five = t;
    five.rank = 5;
    five.strides[1] = 256 * 32;
    five.strides[2] = 256 * 32;
    five.strides[3] = 256 * 32;
    printf("tiled, rank 5: %s\n", name_of(five.encode(&map)));
    Im2col i;
    i.address = memory;
    printf("im2col, rank 4: %s\n", name_of(i.encode(&map)));
    CU(t.encode(&map));
    printf("replace the address: %s\n", name_of(replace(&map, (void *)(uintptr_t)(memory + 4096))));
    printf("replace with a misaligned address: %s\n", name_of(replace(&map, (void *)(uintptr_t)(memory + 8))));

    // Each rule broken once.
#define BROKEN(what, change)                                                                 \
    do {                                                                                     \
        Tiled b = t;                                                                         \
        change;                                                                              \
        printf("tiled, %s: %s\n", what, name_of(b.encode(&map)));                            \
    } while (0)
    BROKEN("rank 0", b.rank = 0);
    BROKEN("rank 6", b.rank = 6);
    BROKEN("address not 16-byte aligned", b.address += 8);
    BROKEN("stride not a multiple of 16", b.strides[0] = 260);
    BROKEN("stride of 2^40", b.strides[0] = 1ull << 40);
    BROKEN("dimension 0", b.dims[1] = 0);
    BROKEN("dimension over 2^32", b.dims[1] = (1ull << 32) + 1);
    BROKEN("box dimension 0", b.box[1] = 0);
    BROKEN("box dimension 257", b.box[1] = 257);
    BROKEN("element stride 0", b.element_strides[0] = 0);
    BROKEN("element stride 9", b.element_strides[1] = 9);
    BROKEN("inner box of 12 bytes", (b.box[0] = 3, b.swizzle = SWIZZLE_NONE));
    BROKEN("inner box wider than the swizzle", b.swizzle = SWIZZLE_32B);
    BROKEN("NaN fill of integers", (b.type = INT32, b.oob = OOB_NAN));
    BROKEN("unknown data type", b.type = 99);
    printf("tiled, no map: %s\n", name_of(tiled(nullptr, FLOAT32, 2, (void *)(uintptr_t)memory, t.dims, t.strides,
                                                     t.box, t.element_strides, 0, SWIZZLE_128B, L2_128B, OOB_NONE)));
#define BROKEN_IM2COL(what, change)                                                          \
    do {                                                                                     \
        Im2col b = i;                                                                        \
        change;                                                                              \
        printf("im2col, %s: %s\n", what, name_of(b.encode(&map)));                           \
    } while (0)
    BROKEN_IM2COL("rank 2", b.rank = 2);
    BROKEN_IM2COL("0 channels per pixel", b.channels = 0);
    BROKEN_IM2COL("1025 pixels per column", b.pixels = 1025);
    BROKEN_IM2COL("corner beyond rank 4's range", b.lower[0] = -129);

    CU(cuMemFree(memory));
    return 0;
}
