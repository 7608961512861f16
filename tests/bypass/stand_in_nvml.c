// A stand-in for NVIDIA's NVML: built as libnvidia-ml.so.1 where a program's library path
// leads, it answers what no Phos session would (42 devices), so a test can tell from a
// program's output whether its NVML calls reached Phos or this.
int nvmlInit(void) { return 0; }

int nvmlInit_v2(void) { return 0; }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = 42;
    return 0;
}
