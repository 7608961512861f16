// A program for on-demand restore (tests/e2e/checkpoint.rs): fills BUFFERS buffers of 8 MiB
// with a pattern and keeps a table of pointers to them in device memory, prints "ready",
// waits for a line on stdin (the session is checkpointed, stopped and restored meanwhile),
// then, first thing, runs a kernel that reads the last buffer (whose memory a restore loads
// last in image order), and then one that reads every buffer through the table (pointers
// loaded from device memory: accesses no analysis of its parameters can follow). Each result
// is checked against the host's; "PASS" at the end.
#include <cstdio>
#include <cstring>
#include "check.h"

const int BUFFERS = 6;
const unsigned long long WORDS = (8ull << 20) / 4;
// The kernels sample one word in STRIDE, across the whole buffer (the interpreter of the
// emu backend is slow).
const unsigned long long STRIDE = 4096;

__host__ __device__ unsigned value(int buffer, unsigned long long i) {
    return (unsigned)(buffer + 1) * 1000003u + (unsigned)(i * 2654435761ull >> 7) + 1;
}

// Only the words the kernels read; the rest of each buffer is the memset's.
__global__ void fill(unsigned *p, int buffer) {
    for (unsigned long long i = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) * STRIDE; i < WORDS;
         i += (unsigned long long)gridDim.x * blockDim.x * STRIDE)
        p[i] = value(buffer, i);
}

__global__ void sum_direct(const unsigned *p, unsigned long long *out) {
    unsigned long long s = 0;
    for (unsigned long long i = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) * STRIDE; i < WORDS;
         i += (unsigned long long)gridDim.x * blockDim.x * STRIDE)
        s += p[i];
    atomicAdd(out, s);
}

__global__ void sum_through_table(unsigned *const *table, unsigned long long *out) {
    for (int b = 0; b < BUFFERS; b++) {
        const unsigned *p = table[b];
        unsigned long long s = 0;
        for (unsigned long long i = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) * STRIDE; i < WORDS;
             i += (unsigned long long)gridDim.x * blockDim.x * STRIDE)
            s += p[i];
        atomicAdd(&out[b], s);
    }
}

static unsigned long long expected_sum(int buffer) {
    unsigned long long s = 0;
    for (unsigned long long i = 0; i < WORDS; i += STRIDE) s += value(buffer, i);
    return s;
}

int main() {
    unsigned *buffers[BUFFERS];
    for (int b = 0; b < BUFFERS; b++) {
        CHECK(cudaMalloc(&buffers[b], WORDS * 4));
        // Whole buffers, so that every chunk of the image holds data.
        CHECK(cudaMemset(buffers[b], 0x5a, WORDS * 4));
        fill<<<16, 256>>>(buffers[b], b);
        CHECK_LAUNCH();
    }
    unsigned **table;
    CHECK(cudaMalloc(&table, sizeof buffers));
    CHECK(cudaMemcpy(table, buffers, sizeof buffers, cudaMemcpyHostToDevice));
    unsigned long long *sums;
    CHECK(cudaMalloc(&sums, (BUFFERS + 1) * sizeof(unsigned long long)));
    CHECK(cudaMemset(sums, 0, (BUFFERS + 1) * sizeof(unsigned long long)));
    // An event recorded before the pause stays a recorded event after a restore.
    cudaEvent_t before, after;
    CHECK(cudaEventCreate(&before));
    CHECK(cudaEventCreate(&after));
    CHECK(cudaEventRecord(before));
    CHECK(cudaDeviceSynchronize());
    std::printf("ready\n");
    std::fflush(stdout);
    char line[16];
    if (!std::fgets(line, sizeof line, stdin)) return 2;

    // The first call after the restore.
    sum_direct<<<4, 128>>>(buffers[BUFFERS - 1], &sums[BUFFERS]);
    CHECK_LAUNCH();
    sum_through_table<<<4, 128>>>(table, sums);
    CHECK_LAUNCH();
    unsigned long long got[BUFFERS + 1];
    CHECK(cudaMemcpy(got, sums, sizeof got, cudaMemcpyDeviceToHost));
    bool ok = true;
    if (got[BUFFERS] != expected_sum(BUFFERS - 1)) {
        std::printf("direct: buffer %d sums to %llu, expected %llu\n", BUFFERS - 1, got[BUFFERS], expected_sum(BUFFERS - 1));
        ok = false;
    } else {
        std::printf("direct: ok\n");
    }
    for (int b = 0; b < BUFFERS; b++) {
        if (got[b] != expected_sum(b)) {
            std::printf("through the table: buffer %d sums to %llu, expected %llu\n", b, got[b], expected_sum(b));
            ok = false;
        }
    }
    if (ok) std::printf("through the table: ok\n");
    CHECK(cudaEventRecord(after));
    CHECK(cudaEventSynchronize(after));
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, before, after));
    std::printf(ms >= 0 ? "events: timed across the pause\n" : "events: negative time %f\n", ms);
    std::printf(ok ? "PASS\n" : "FAIL\n");
    return ok ? 0 : 1;
}
