// Stream memory operations (CUDA 12's _v2 forms, which CUDA 11.8's cuda.h declares too):
// a value written by one stream and waited for by another, in 32 and 64 bits, then read by a
// kernel of the waiting stream; the wait conditions (GEQ, EQ, AND, NOR); page-locked host
// memory mapped to the device, written by a stream and waited on after the host wrote it;
// a batch of operations; and the driver's answers to flags it does not know (or, for the
// v2 forms, no longer takes).
#include "driver_check.h"

#include <cstring>

// The _v2 functions: named so in CUDA 11.8's cuda.h, the plain names' meaning since CUDA 12.
#if CUDA_VERSION >= 12000
#define WAIT32 cuStreamWaitValue32
#define WAIT64 cuStreamWaitValue64
#define WRITE32 cuStreamWriteValue32
#define WRITE64 cuStreamWriteValue64
#define BATCH cuStreamBatchMemOp
#else
#define WAIT32 cuStreamWaitValue32_v2
#define WAIT64 cuStreamWaitValue64_v2
#define WRITE32 cuStreamWriteValue32_v2
#define WRITE64 cuStreamWriteValue64_v2
#define BATCH cuStreamBatchMemOp_v2
#endif

// out[0] = *flag32 + 100, out[1] = low word of *flag64.
__global__ void read_flags(const unsigned *flag32, const unsigned long long *flag64, unsigned *out) {
    out[0] = *flag32 + 100;
    out[1] = (unsigned)(*flag64 & 0xffffffffu);
}

static const char *yes(bool b) { return b ? "yes" : "no"; }

int main() {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));

    // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS(_V2) and ..._STREAM_WAIT_VALUE_NOR(_V2).
    int wide = 0, nor = 0;
    CU(cuDeviceGetAttribute(&wide, (CUdevice_attribute)122, dev));
    CU(cuDeviceGetAttribute(&nor, (CUdevice_attribute)123, dev));
    printf("64-bit operations %s, NOR waits %s\n", yes(wide != 0), yes(nor != 0));

    CUdeviceptr flags, out;
    CU(cuMemAlloc(&flags, 16));
    CU(cuMemAlloc(&out, 8));
    CU(cuMemsetD32(flags, 0, 4));
    CUdeviceptr flag32 = flags, flag64 = flags + 8;
    CUstream writer, waiter;
    CU(cuStreamCreate(&writer, CU_STREAM_NON_BLOCKING));
    CU(cuStreamCreate(&waiter, CU_STREAM_NON_BLOCKING));

    // Written by one stream, waited for by the other, read by the waiting stream's kernel.
    CU(WRITE32(writer, flag32, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
    CU(WRITE64(writer, flag64, 0x100000005ull, CU_STREAM_WRITE_VALUE_DEFAULT));
    CU(WAIT32(waiter, flag32, 7, CU_STREAM_WAIT_VALUE_EQ));
    CU(WAIT64(waiter, flag64, 0x100000000ull, CU_STREAM_WAIT_VALUE_GEQ));
    read_flags<<<1, 1, 0, waiter>>>((const unsigned *)flag32, (const unsigned long long *)flag64, (unsigned *)out);
    CHECK(cudaGetLastError());
    CU(cuStreamSynchronize(waiter));
    unsigned seen[2] = {};
    CU(cuMemcpyDtoH(seen, out, sizeof(seen)));
    printf("the waiting stream's kernel read %u and %u\n", seen[0], seen[1]);

    // The other conditions, each already true.
    CU(WAIT32(waiter, flag32, 0x6, CU_STREAM_WAIT_VALUE_AND));  // 7 & 6 != 0
    CU(WAIT32(waiter, flag32, 3, CU_STREAM_WAIT_VALUE_GEQ));
    CU(WAIT32(waiter, flag32, 0xfffffff0u, CU_STREAM_WAIT_VALUE_NOR));  // ~(7 | ~15) != 0
    CU(cuStreamSynchronize(waiter));
    printf("AND, GEQ and NOR waits passed\n");

    // Page-locked host memory mapped to the device.
    unsigned *host = nullptr;
    CU(cuMemHostAlloc((void **)&host, 8, CU_MEMHOSTALLOC_DEVICEMAP));
    host[0] = 0;
    host[1] = 9;
    CUdeviceptr mapped;
    CU(cuMemHostGetDevicePointer(&mapped, host, 0));
    CU(WRITE32(writer, mapped, 42, CU_STREAM_WRITE_VALUE_DEFAULT));
    CU(cuStreamSynchronize(writer));
    CU(WAIT32(waiter, mapped + 4, 9, CU_STREAM_WAIT_VALUE_EQ));
    CU(cuStreamSynchronize(waiter));
    printf("mapped host memory: written %u, waited for the host's %u\n", host[0], host[1]);

    // A batch: two writes, then a wait for the first.
    CUstreamBatchMemOpParams ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = flag32;
    ops[0].writeValue.value = 11;
    ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    ops[1].writeValue.address = flag64;
    ops[1].writeValue.value64 = 0x200000002ull;
    ops[2].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[2].waitValue.address = flag32;
    ops[2].waitValue.value = 11;
    ops[2].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    CU(BATCH(writer, 3, ops, 0));
    CU(cuStreamSynchronize(writer));
    unsigned long long values[2] = {};
    CU(cuMemcpyDtoH(values, flags, sizeof(values)));
    printf("batch: %llu and 0x%llx\n", values[0] & 0xffffffffull, values[1]);

    // Misuse.
    printf("unknown wait flags: %s\n", name_of(WAIT32(waiter, flag32, 1, 0x10)));
    printf("unknown write flags: %s\n", name_of(WRITE32(writer, flag32, 1, 0x10)));
    // "Not supported in the v2 API".
    printf("write without a memory barrier: %s\n",
           name_of(WRITE64(writer, flag64, 1, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)));
    printf("batch flags: %s\n", name_of(BATCH(writer, 1, ops, 1)));

    CU(cuStreamDestroy(writer));
    CU(cuStreamDestroy(waiter));
    CU(cuMemFreeHost(host));
    CU(cuMemFree(flags));
    CU(cuMemFree(out));
    return 0;
}
