// IPC between two processes, as CUDA's simpleIPC sample does it: the program forks before
// any CUDA call; the parent exports device memory and an interprocess event and passes the
// handles through a pipe; the child opens them, writes the memory with kernels and records
// the event; the parent waits for the event and checks. Misuse answers CUDA's errors.
#include "check.h"
#include <sys/wait.h>
#include <unistd.h>

__global__ void add_index(int *p, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += base + i;
}

struct Handles {
    cudaIpcMemHandle_t big;
    cudaIpcMemHandle_t interior;
    cudaIpcMemHandle_t small;
    cudaIpcEventHandle_t event;
};

// What the child tells the parent.
struct Report {
    int opened;             // every handle opened
    int interior_is_base;   // the interior pointer's handle opened the allocation's base
    int small_before;       // the small allocation's first value, as the child read it
    int recorded;           // the event was recorded after the kernels
};

static const int BIG = 1 << 20;  // 4 MiB: memory of its own
static const int SMALL = 64;     // 256 bytes: shares its memory with others

static void write_all(int fd, const void *p, size_t n) {
    const char *c = (const char *)p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) std::exit(3);
        c += w;
        n -= (size_t)w;
    }
}

static void read_all(int fd, void *p, size_t n) {
    char *c = (char *)p;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) std::exit(3);
        c += r;
        n -= (size_t)r;
    }
}

static int child(int from_parent, int to_parent) {
    Handles h;
    read_all(from_parent, &h, sizeof h);
    CHECK(cudaSetDevice(0));
    Report r = {};
    int *big = nullptr, *interior = nullptr, *small = nullptr;
    // The handle of an interior pointer opens the allocation, at its base.
    CHECK(cudaIpcOpenMemHandle((void **)&interior, h.interior, cudaIpcMemLazyEnablePeerAccess));
    int first = 0;
    CHECK(cudaMemcpy(&first, interior, sizeof(int), cudaMemcpyDeviceToHost));
    r.interior_is_base = first == 7;
    CHECK(cudaIpcCloseMemHandle(interior));
    CHECK(cudaIpcOpenMemHandle((void **)&big, h.big, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenMemHandle((void **)&small, h.small, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t done;
    CHECK(cudaIpcOpenEventHandle(&done, h.event));
    r.opened = 1;
    CHECK(cudaMemcpy(&r.small_before, small, sizeof(int), cudaMemcpyDeviceToHost));
    add_index<<<(BIG + 255) / 256, 256>>>(big, BIG, 1000);
    CHECK_LAUNCH();
    add_index<<<1, SMALL>>>(small, SMALL, 50);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(done, 0));
    r.recorded = 1;
    write_all(to_parent, &r, sizeof r);
    // Keep everything open until the parent has checked.
    char go;
    read_all(from_parent, &go, 1);
    CHECK(cudaEventDestroy(done));
    CHECK(cudaIpcCloseMemHandle(small));
    CHECK(cudaIpcCloseMemHandle(big));
    return 0;
}

int main() {
    int down[2], up[2];
    EXPECT(pipe(down) == 0 && pipe(up) == 0);
    std::fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        std::exit(child(down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);

    CHECK(cudaSetDevice(0));
    int *big, *small, *other;
    CHECK(cudaMalloc(&big, BIG * sizeof(int)));
    CHECK(cudaMalloc(&small, SMALL * sizeof(int)));
    CHECK(cudaMalloc(&other, SMALL * sizeof(int)));
    CHECK(cudaMemset(big, 0, BIG * sizeof(int)));
    int seven = 7;
    CHECK(cudaMemcpy(big, &seven, sizeof seven, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(small, 0, SMALL * sizeof(int)));
    CHECK(cudaMemcpy(small, &seven, sizeof seven, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(other, 0, SMALL * sizeof(int)));

    // Events for IPC must be interprocess and untimed.
    cudaEvent_t timed, plain, shared;
    cudaError_t e = cudaEventCreateWithFlags(&timed, cudaEventInterprocess);
    std::printf("interprocess event with timing: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
    Handles h;
    e = cudaIpcGetEventHandle(&h.event, plain);
    std::printf("handle of an event that is not interprocess: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaEventCreateWithFlags(&shared, cudaEventInterprocess | cudaEventDisableTiming));
    CHECK(cudaIpcGetEventHandle(&h.event, shared));

    CHECK(cudaIpcGetMemHandle(&h.big, big));
    CHECK(cudaIpcGetMemHandle(&h.interior, big + 1000));
    CHECK(cudaIpcGetMemHandle(&h.small, small));

    // A process cannot open its own memory.
    int *mine = nullptr;
    e = cudaIpcOpenMemHandle((void **)&mine, h.big, cudaIpcMemLazyEnablePeerAccess);
    std::printf("opening in the exporting process: %s\n", cudaGetErrorName(e));
    cudaGetLastError();

    write_all(down[1], &h, sizeof h);
    Report r;
    read_all(up[0], &r, sizeof r);
    std::printf("child opened the handles: %s\n", r.opened ? "yes" : "no");
    std::printf("the interior pointer's handle opens the allocation's base: %s\n", r.interior_is_base ? "yes" : "no");
    std::printf("child read the small allocation: %d\n", r.small_before);
    std::printf("child recorded the event: %s\n", r.recorded ? "yes" : "no");

    // The child's kernels are done once its record of the shared event is.
    CHECK(cudaStreamWaitEvent(0, shared, 0));
    CHECK(cudaEventSynchronize(shared));
    int *host = (int *)std::malloc(BIG * sizeof(int));
    CHECK(cudaMemcpy(host, big, BIG * sizeof(int), cudaMemcpyDeviceToHost));
    int good = 0;
    for (int i = 0; i < BIG; i++) good += host[i] == (i == 0 ? 7 : 0) + 1000 + i;
    std::printf("parent sees the child's writes: %d of %d\n", good, BIG);
    int s[SMALL];
    CHECK(cudaMemcpy(s, small, sizeof s, cudaMemcpyDeviceToHost));
    good = 0;
    for (int i = 0; i < SMALL; i++) good += s[i] == (i == 0 ? 7 : 0) + 50 + i;
    std::printf("small allocation: %d of %d\n", good, SMALL);
    int o[SMALL];
    CHECK(cudaMemcpy(o, other, sizeof o, cudaMemcpyDeviceToHost));
    good = 0;
    for (int i = 0; i < SMALL; i++) good += o[i] == 0;
    std::printf("the allocation beside it is untouched: %d of %d\n", good, SMALL);

    write_all(down[1], "g", 1);
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    std::printf("child exit: %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(cudaFree(other));
    CHECK(cudaFree(small));
    CHECK(cudaFree(big));
    CHECK(cudaEventDestroy(shared));
    CHECK(cudaEventDestroy(plain));
    std::free(host);
    std::printf("done\n");
    return 0;
}
