// NVML next to the runtime, as monitoring code in frameworks uses it: NVML is opened with
// dlopen("libnvidia-ml.so.1") (as PyTorch's c10 and torch.cuda do), the device the runtime
// uses is found by its PCI bus id, and its name, UUID, compute capability and PCI ids are
// compared with the runtime's; memory info is read before and after a 64 MiB cudaMalloc; the
// statuses NVML gives for short buffers, NULL outputs, a struct of the wrong version, a handle
// past the count and calls before init are checked.
//
// What it prints is the same natively and through Phos for one process on one GPU: NVML's
// view of the whole machine (other GPUs, other processes, the driver's own memory) is never
// printed, only what the program checked. With the argument `tenant` (the e2e test on emu)
// it also checks what a Phos tenant sees and NVML on a bare machine does not promise: exactly
// one device, the session's own memory (used grows by exactly what it allocated), itself as
// the only process, a setter refused with NVML_ERROR_NO_PERMISSION and an export Phos does not
// carry answering NVML_ERROR_NOT_SUPPORTED.

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nvml.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define NVML_FN(name) static decltype(&name) p_##name;
#define LOAD(name)                                                                  \
    do {                                                                            \
        p_##name = (decltype(&name))dlsym(lib, #name);                              \
        if (!p_##name) {                                                            \
            printf("libnvidia-ml.so.1 lacks %s\n", #name);                          \
            return 1;                                                               \
        }                                                                           \
    } while (0)

NVML_FN(nvmlInit_v2)
NVML_FN(nvmlShutdown)
NVML_FN(nvmlErrorString)
NVML_FN(nvmlDeviceGetCount_v2)
NVML_FN(nvmlDeviceGetHandleByIndex_v2)
NVML_FN(nvmlDeviceGetHandleByPciBusId_v2)
NVML_FN(nvmlDeviceGetName)
NVML_FN(nvmlDeviceGetUUID)
NVML_FN(nvmlDeviceGetIndex)
NVML_FN(nvmlDeviceGetPciInfo_v3)
NVML_FN(nvmlDeviceGetMemoryInfo)
NVML_FN(nvmlDeviceGetMemoryInfo_v2)
NVML_FN(nvmlDeviceGetCudaComputeCapability)
NVML_FN(nvmlDeviceGetComputeRunningProcesses_v3)
NVML_FN(nvmlDeviceSetPersistenceMode)
NVML_FN(nvmlDeviceGetEncoderUtilization)

// The status's name as nvml.h spells it, for the codes this program expects.
static const char *status_name(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "NVML_SUCCESS";
    case NVML_ERROR_UNINITIALIZED: return "NVML_ERROR_UNINITIALIZED";
    case NVML_ERROR_INVALID_ARGUMENT: return "NVML_ERROR_INVALID_ARGUMENT";
    case NVML_ERROR_NOT_SUPPORTED: return "NVML_ERROR_NOT_SUPPORTED";
    case NVML_ERROR_NO_PERMISSION: return "NVML_ERROR_NO_PERMISSION";
    case NVML_ERROR_NOT_FOUND: return "NVML_ERROR_NOT_FOUND";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "NVML_ERROR_INSUFFICIENT_SIZE";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "NVML_ERROR_ARGUMENT_VERSION_MISMATCH";
    default: return "another status";
    }
}

static int failures = 0;

// Prints `what: STATUS` and counts a failure when it is not `want`.
static void expect(const char *what, nvmlReturn_t got, nvmlReturn_t want) {
    printf("%s: %s\n", what, status_name(got));
    if (got != want) {
        printf("  FAIL: expected %s\n", status_name(want));
        failures++;
    }
}

// Prints `what: refused` when `got` is any error (NVIDIA's NVML and nvml.h's documentation
// do not agree on which, for some misuse), counting a failure for a success; the status goes to
// standard error.
static void refused(const char *what, nvmlReturn_t got) {
    printf("%s: %s\n", what, got == NVML_SUCCESS ? "accepted" : "refused");
    fprintf(stderr, "%s: status %d\n", what, (int)got);
    if (got == NVML_SUCCESS) failures++;
}

static void yes(const char *what, bool ok) {
    printf("%s: %s\n", what, ok ? "yes" : "no");
    if (!ok) failures++;
}

int main(int argc, char **argv) {
    bool tenant = argc > 1 && strcmp(argv[1], "tenant") == 0;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("no libnvidia-ml.so.1: %s\n", dlerror());
        return 1;
    }
    LOAD(nvmlInit_v2);
    LOAD(nvmlShutdown);
    LOAD(nvmlErrorString);
    LOAD(nvmlDeviceGetCount_v2);
    LOAD(nvmlDeviceGetHandleByIndex_v2);
    LOAD(nvmlDeviceGetHandleByPciBusId_v2);
    LOAD(nvmlDeviceGetName);
    LOAD(nvmlDeviceGetUUID);
    LOAD(nvmlDeviceGetIndex);
    LOAD(nvmlDeviceGetPciInfo_v3);
    LOAD(nvmlDeviceGetMemoryInfo);
    LOAD(nvmlDeviceGetMemoryInfo_v2);
    LOAD(nvmlDeviceGetCudaComputeCapability);
    LOAD(nvmlDeviceGetComputeRunningProcesses_v3);
    LOAD(nvmlDeviceSetPersistenceMode);
    LOAD(nvmlDeviceGetEncoderUtilization);

    unsigned int count = 0;
    expect("count before init", p_nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    expect("init", p_nvmlInit_v2(), NVML_SUCCESS);
    expect("count", p_nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    yes("at least one device", count >= 1);
    expect("count into NULL", p_nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
    nvmlDevice_t past;
    expect("handle past the count", p_nvmlDeviceGetHandleByIndex_v2(count, &past), NVML_ERROR_INVALID_ARGUMENT);
    printf("error string: %s\n", p_nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE));

    // The runtime's device 0, found in NVML by its PCI bus id.
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    char bus_id[32];
    CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0));
    nvmlDevice_t dev;
    expect("handle by PCI bus id", p_nvmlDeviceGetHandleByPciBusId_v2(bus_id, &dev), NVML_SUCCESS);

    char name[NVML_DEVICE_NAME_BUFFER_SIZE];
    expect("name", p_nvmlDeviceGetName(dev, name, sizeof name), NVML_SUCCESS);
    yes("name is the runtime's", strcmp(name, prop.name) == 0);
    expect("name into 1 byte", p_nvmlDeviceGetName(dev, name, 1), NVML_ERROR_INSUFFICIENT_SIZE);
    expect("name into NULL", p_nvmlDeviceGetName(dev, NULL, 64), NVML_ERROR_INVALID_ARGUMENT);

    char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
    expect("uuid", p_nvmlDeviceGetUUID(dev, uuid, sizeof uuid), NVML_SUCCESS);
    char want_uuid[64];
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(want_uuid, sizeof want_uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
             u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    yes("uuid is the runtime's", strcmp(uuid, want_uuid) == 0);
    expect("uuid into 10 bytes", p_nvmlDeviceGetUUID(dev, uuid, 10), NVML_ERROR_INSUFFICIENT_SIZE);

    unsigned int index = 12345;
    expect("index", p_nvmlDeviceGetIndex(dev, &index), NVML_SUCCESS);
    nvmlDevice_t again;
    expect("handle by index", p_nvmlDeviceGetHandleByIndex_v2(index, &again), NVML_SUCCESS);
    yes("the same handle", again == dev);

    nvmlPciInfo_t pci;
    expect("pci info", p_nvmlDeviceGetPciInfo_v3(dev, &pci), NVML_SUCCESS);
    yes("pci ids are the runtime's", (int)pci.domain == prop.pciDomainID && (int)pci.bus == prop.pciBusID &&
                                         (int)pci.device == prop.pciDeviceID);

    int major = 0, minor = 0;
    expect("compute capability", p_nvmlDeviceGetCudaComputeCapability(dev, &major, &minor), NVML_SUCCESS);
    yes("compute capability is the runtime's", major == prop.major && minor == prop.minor);

    nvmlMemory_t before, after;
    expect("memory", p_nvmlDeviceGetMemoryInfo(dev, &before), NVML_SUCCESS);
    const size_t size = 64u << 20;
    void *d = NULL;
    CHECK(cudaMalloc(&d, size));
    CHECK(cudaMemset(d, 1, size));
    CHECK(cudaDeviceSynchronize());
    expect("memory after cudaMalloc", p_nvmlDeviceGetMemoryInfo(dev, &after), NVML_SUCCESS);
    yes("used grew by the allocation", after.used >= before.used + size);
    yes("used and free within total", after.used <= after.total && after.free <= after.total);
    nvmlMemory_v2_t v2;
    v2.version = 1;
    refused("memory v2 of another version", p_nvmlDeviceGetMemoryInfo_v2(dev, &v2));
    v2.version = nvmlMemory_v2;
    expect("memory v2", p_nvmlDeviceGetMemoryInfo_v2(dev, &v2), NVML_SUCCESS);
    yes("memory v2 total is v1's", v2.total == after.total);

    unsigned int n = 0;
    expect("processes with no room", p_nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
    yes("processes counted", n >= 1);
    nvmlProcessInfo_t infos[64];
    n = 64;
    expect("processes", p_nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, infos), NVML_SUCCESS);

    if (tenant) {
        // What a Phos tenant sees: its own devices, memory and process only.
        printf("tenant: devices %u\n", count);
        yes("tenant: used is exactly the allocation", after.used - before.used == size);
        yes("tenant: free is total less used", after.free == after.total - after.used);
        yes("tenant: total is the runtime's", after.total == prop.totalGlobalMem);
        yes("tenant: the only process is this one", n == 1 && infos[0].pid == (unsigned int)getpid());
        yes("tenant: its memory is the session's", n == 1 && infos[0].usedGpuMemory == after.used);
        expect("tenant: a setter", p_nvmlDeviceSetPersistenceMode(dev, NVML_FEATURE_ENABLED), NVML_ERROR_NO_PERMISSION);
        unsigned int util = 0, period = 0;
        expect("tenant: an export Phos does not carry", p_nvmlDeviceGetEncoderUtilization(dev, &util, &period),
               NVML_ERROR_NOT_SUPPORTED);
        nvmlDevice_t made_up = (nvmlDevice_t)0x7e3000000000ffffull;
        expect("tenant: a made-up handle", p_nvmlDeviceGetName(made_up, name, sizeof name), NVML_ERROR_INVALID_ARGUMENT);
    }

    CHECK(cudaFree(d));
    expect("shutdown", p_nvmlShutdown(), NVML_SUCCESS);
    expect("count after shutdown", p_nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    expect("shutdown again", p_nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    printf("%s\n", failures == 0 ? "PASS" : "FAIL");
    return failures == 0 ? 0 : 1;
}
