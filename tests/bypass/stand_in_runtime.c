// A stand-in for NVIDIA's CUDA runtime: built under its sonames where a program's run paths
// lead, it answers what no Phos session would (42 devices, runtime version 999), so a test
// can tell from a program's output whether its calls reached Phos or this.
int cudaGetDeviceCount(int *count) {
    *count = 42;
    return 0;
}

int cudaRuntimeGetVersion(int *version) {
    *version = 999;
    return 0;
}
