// A program that maps a CUDA runtime that is not Phos's by its full path (argv[1]) before
// using Phos's runtime, loaded by name: prints the device count Phos's gave, says "ready",
// and waits for a line on standard input before it exits (while its session is alive, a
// test looks at the router).
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2 || !dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) {
        printf("cannot load the stand-in: %s\n", dlerror());
        return 2;
    }
    void *runtime = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    int (*count)(int *) = runtime ? (int (*)(int *))dlsym(runtime, "cudaGetDeviceCount") : 0;
    if (!count) {
        printf("no CUDA runtime: %s\n", dlerror());
        return 2;
    }
    int n = -1;
    int status = count(&n);
    printf("devices %d (status %d)\nready\n", n, status);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 0;
    return 0;
}
