// A program whose library (uses_runtime.c) finds a CUDA runtime through its own DT_RPATH:
// prints the device count and runtime version its calls got, and whether a file of the
// directory given as argv[1] is mapped in the process.
#include <stdio.h>
#include <string.h>

int device_count(void);
int runtime_version(void);

int main(int argc, char **argv) {
    printf("devices %d\n", device_count());
    printf("runtime %d\n", runtime_version());
    int mapped = 0;
    char line[4096];
    FILE *maps = fopen("/proc/self/maps", "r");
    while (argc > 1 && maps && fgets(line, sizeof line, maps))
        if (strstr(line, argv[1])) mapped = 1;
    if (maps) fclose(maps);
    printf("stand-in mapped: %s\n", mapped ? "yes" : "no");
    return 0;
}
