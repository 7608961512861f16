// Rewrites its device memory as fast as it can, for concurrent checkpoints. Usage:
//
//   rewriter run        steps until a line arrives on stdin ("running" after step 8)
//   rewriter pause N    takes steps 1..N, prints "paused at N", waits for a line on stdin
//   rewriter indirect   like run, but each step also stores through a pointer it keeps in
//                       device memory
//
// Sixteen 8 MiB buffers, set to known bytes at the start, and a step counter. Step c is one
// kernel launch: it stamps a window of buffer 15 - c % 16 with values made from c and writes
// c to the counter. The memory after step c is therefore a function of c alone: a checkpoint
// taken between two steps holds the counter c and exactly what `pause c` leaves. `indirect`
// also stores c into a word whose address the kernel loads from device memory (nothing in
// its parameters names that word).
#include "check.h"
#include <cstring>
#include <poll.h>
#include <unistd.h>

const int BUFFERS = 16;
const unsigned WORDS = (8u << 20) / 4;
const unsigned WINDOW = 1u << 14;

__global__ void stamp(unsigned *buf, unsigned long long *counter, unsigned c) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < WINDOW) buf[(c * 4099u + i) % WORDS] = c * 2654435761u + i;
    if (i == 0) *counter = c;
}

__global__ void stamp_through(unsigned *buf, unsigned long long *counter, unsigned **slot, unsigned c) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < WINDOW) buf[(c * 4099u + i) % WORDS] = c * 2654435761u + i;
    if (i == 0) {
        *counter = c;
        **slot = c;
    }
}

static bool line_waiting() {
    pollfd p = {0, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

static void wait_for_line() {
    char line[64];
    if (!std::fgets(line, sizeof line, stdin)) std::exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        std::printf("usage: rewriter run | pause N | indirect\n");
        return 2;
    }
    const bool pause = std::strcmp(argv[1], "pause") == 0;
    const bool indirect = std::strcmp(argv[1], "indirect") == 0;
    const unsigned stop_at = pause && argc > 2 ? (unsigned)std::atoi(argv[2]) : 0;
    unsigned *buf[BUFFERS];
    for (int b = 0; b < BUFFERS; b++) {
        CHECK(cudaMalloc(&buf[b], WORDS * 4));
        CHECK(cudaMemset(buf[b], 0x10 + b, WORDS * 4));
    }
    unsigned long long *counter;
    CHECK(cudaMalloc(&counter, sizeof *counter));
    CHECK(cudaMemset(counter, 0, sizeof *counter));
    unsigned *target, **slot;
    CHECK(cudaMalloc(&target, 4096));
    CHECK(cudaMemset(target, 0, 4096));
    CHECK(cudaMalloc(&slot, sizeof *slot));
    CHECK(cudaMemcpy(slot, &target, sizeof target, cudaMemcpyHostToDevice));
    for (unsigned c = 1;; c++) {
        unsigned *b = buf[BUFFERS - 1 - c % BUFFERS];
        if (indirect) {
            stamp_through<<<WINDOW / 256, 256>>>(b, counter, slot, c);
        } else {
            stamp<<<WINDOW / 256, 256>>>(b, counter, c);
        }
        CHECK_LAUNCH();
        if (pause && c == stop_at) {
            CHECK(cudaDeviceSynchronize());
            std::printf("paused at %u\n", c);
            std::fflush(stdout);
            wait_for_line();
            break;
        }
        if (!pause && c == 8) {
            CHECK(cudaDeviceSynchronize());
            std::printf("running\n");
            std::fflush(stdout);
        }
        if (!pause && c % 4 == 0 && line_waiting()) {
            CHECK(cudaDeviceSynchronize());
            std::printf("stopped after step %u\n", c);
            break;
        }
    }
    unsigned long long last;
    CHECK(cudaMemcpy(&last, counter, sizeof last, cudaMemcpyDeviceToHost));
    if (indirect) {
        unsigned seen;
        CHECK(cudaMemcpy(&seen, target, sizeof seen, cudaMemcpyDeviceToHost));
        EXPECT(seen == (unsigned)last);
    }
    std::printf("PASS\n");
    return 0;
}
