// A library that uses the CUDA runtime, as a framework's library does: linked against
// `libcudart.so.N` (DT_NEEDED) with a run path that leads to a runtime of its own.
int cudaGetDeviceCount(int *count);
int cudaRuntimeGetVersion(int *version);

int device_count(void) {
    int n = -1;
    return cudaGetDeviceCount(&n) == 0 ? n : -1;
}

int runtime_version(void) {
    int v = -1;
    return cudaRuntimeGetVersion(&v) == 0 ? v : -1;
}
