// How fast can several threads put checkpoint chunks into an image file in host memory
// (/dev/shm)? The C/R engine's choice of how its workers write the memory file rests on this
// (docs/perf.md, "Checkpoint and restore"). Host only: no GPU.
//
//   cc -O2 -pthread -o image_write tests/bench/image_write.c && ./image_write DIR GIB THREADS
//
// Each method writes GIB GiB in 8 MiB chunks from THREADS threads, each chunk's bytes from a
// buffer of the thread's own, and prints GB/s:
//   mmap      one file, sized first, mapped shared; chunks copied in (page faults allocate)
//   populate  the same, each chunk's pages populated with MADV_POPULATE_WRITE before the copy
//   files     one file per thread, pwrite
//   pwrite    one file, pwrite at reserved offsets
//   pread     reading the one file back with pread (what a restore does)
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define CHUNK (8ul << 20)

static const char *dir;
static size_t total, chunks;
static int threads;
static atomic_size_t next;
static int method;
static char *map;
static int fd_one;
static int fds[64];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    long id = (long)arg;
    char *buf = aligned_alloc(4096, CHUNK);
    memset(buf, (int)id + 1, CHUNK);
    size_t mine = 0;
    for (;;) {
        size_t i = atomic_fetch_add(&next, 1);
        if (i >= chunks) break;
        size_t at = i * CHUNK;
        switch (method) {
        case 0: memcpy(map + at, buf, CHUNK); break;
        case 1:
            madvise(map + at, CHUNK, MADV_POPULATE_WRITE);
            memcpy(map + at, buf, CHUNK);
            break;
        case 2: if (pwrite(fds[id], buf, CHUNK, mine * CHUNK) != (ssize_t)CHUNK) perror("pwrite"); break;
        case 3: if (pwrite(fd_one, buf, CHUNK, at) != (ssize_t)CHUNK) perror("pwrite"); break;
        case 4: if (pread(fd_one, buf, CHUNK, at) != (ssize_t)CHUNK) perror("pread"); break;
        }
        mine++;
    }
    free(buf);
    return NULL;
}

static double run(void) {
    pthread_t t[64];
    atomic_store(&next, 0);
    double start = now();
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return total / (now() - start) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s DIR GIB THREADS\n", argv[0]); return 2; }
    dir = argv[1];
    total = strtoul(argv[2], NULL, 10) << 30;
    threads = atoi(argv[3]);
    if (threads < 1 || threads > 64) return 2;
    chunks = total / CHUNK;
    char path[4096];
    snprintf(path, sizeof path, "%s/image_write.one", dir);
    const char *names[] = {"mmap", "populate", "files", "pwrite", "pread"};
    fd_one = -1;
    for (method = 0; method < 5; method++) {
        // Every writing method starts from an empty file; pread reads what pwrite wrote.
        if (method != 4) {
            if (fd_one >= 0) close(fd_one);
            unlink(path);
            fd_one = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
            if (ftruncate(fd_one, total)) perror("ftruncate");
        }
        if (method <= 1) map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd_one, 0);
        if (method == 2) {
            for (int i = 0; i < threads; i++) {
                char p[4200];
                snprintf(p, sizeof p, "%s/image_write.%d", dir, i);
                fds[i] = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
            }
        }
        double gbs = run();
        printf("%-9s %zu GiB, %d threads: %.2f GB/s\n", names[method], total >> 30, threads, gbs);
        if (method <= 1) munmap(map, total);
        if (method == 2) {
            for (int i = 0; i < threads; i++) {
                char p[4200];
                snprintf(p, sizeof p, "%s/image_write.%d", dir, i);
                close(fds[i]);
                unlink(p);
            }
        }
    }
    close(fd_one);
    unlink(path);
    return 0;
}
