/* The driver's own checkpoint of a CUDA process (cuCheckpointProcess*, driver 570+), timed
 * for comparison with Phos: usage: driver_checkpoint PID. Locks the process's CUDA state,
 * checkpoints it (device memory to host memory), restores it and unlocks it, printing the
 * time of each step in milliseconds. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

#define STEP(name, call)                                                                     \
    do {                                                                                     \
        double t0 = now_ms();                                                                \
        CUresult r = (call);                                                                 \
        double t1 = now_ms();                                                                \
        if (r != CUDA_SUCCESS) {                                                             \
            const char *s = "?";                                                             \
            cuGetErrorString(r, &s);                                                         \
            printf("%s failed: %d %s\n", name, (int)r, s);                                   \
            return 1;                                                                        \
        }                                                                                    \
        printf("%s_ms %.1f\n", name, t1 - t0);                                               \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int pid = atoi(argv[1]);
    cuInit(0);
    STEP("lock", cuCheckpointProcessLock(pid, NULL));
    STEP("checkpoint", cuCheckpointProcessCheckpoint(pid, NULL));
    STEP("restore", cuCheckpointProcessRestore(pid, NULL));
    STEP("unlock", cuCheckpointProcessUnlock(pid, NULL));
    return 0;
}
