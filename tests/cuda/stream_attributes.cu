// Stream attributes set and read back (access policy window, synchronisation policy), copied
// between streams, and kernels launched with cudaLaunchKernelEx and hint attributes
// (priority, access policy window, programmatic stream serialisation) that change no result.
#include "check.h"
#include <cstring>
#include <vector>

__global__ void scale(float *x, float k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= k;
}

int main() {
    const int n = 1 << 14;
    float *d;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    std::vector<float> h(n);
    for (int i = 0; i < n; i++) h[i] = (float)i;
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));

    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s, t;
    CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    CHECK(cudaStreamCreate(&t));

    // An L2 access policy window over part of the buffer, read back as set.
    cudaStreamAttrValue v;
    std::memset(&v, 0, sizeof(v));
    v.accessPolicyWindow.base_ptr = d;
    v.accessPolicyWindow.num_bytes = 4096 * sizeof(float);
    v.accessPolicyWindow.hitRatio = 0.5f;
    v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
    cudaStreamAttrValue got;
    std::memset(&got, 0, sizeof(got));
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &got));
    std::printf("window: base ok %s, bytes %zu, hit ratio %.2f, hit %d, miss %d\n",
                got.accessPolicyWindow.base_ptr == (void *)d ? "yes" : "no", got.accessPolicyWindow.num_bytes,
                got.accessPolicyWindow.hitRatio, (int)got.accessPolicyWindow.hitProp,
                (int)got.accessPolicyWindow.missProp);

    // How a thread waits for the stream.
    std::memset(&v, 0, sizeof(v));
    v.syncPolicy = cudaSyncPolicyBlockingSync;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v));
    std::memset(&got, 0, sizeof(got));
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &got));
    std::printf("sync policy: %d\n", (int)got.syncPolicy);

    // Copied to another stream.
    CHECK(cudaStreamCopyAttributes(t, s));
    std::memset(&got, 0, sizeof(got));
    CHECK(cudaStreamGetAttribute(t, cudaStreamAttributeSynchronizationPolicy, &got));
    std::printf("copied sync policy: %d\n", (int)got.syncPolicy);

    int priority = 0;
    CHECK(cudaStreamGetPriority(s, &priority));
    std::printf("stream priority is the greatest: %s\n", priority == greatest ? "yes" : "no");

    // Work on the stream with its attributes, then a launch with hint attributes.
    scale<<<n / 256, 256, 0, s>>>(d, 2.0f, n);
    CHECK_LAUNCH();
    cudaLaunchConfig_t config;
    std::memset(&config, 0, sizeof(config));
    config.gridDim = dim3(n / 256);
    config.blockDim = dim3(256);
    config.stream = s;
    cudaLaunchAttribute attrs[3];
    std::memset(attrs, 0, sizeof(attrs));
    attrs[0].id = cudaLaunchAttributePriority;
    attrs[0].val.priority = least;
    attrs[1].id = cudaLaunchAttributeAccessPolicyWindow;
    attrs[1].val.accessPolicyWindow = v.accessPolicyWindow;
    attrs[1].val.accessPolicyWindow.base_ptr = d;
    attrs[1].val.accessPolicyWindow.num_bytes = 4096 * sizeof(float);
    attrs[1].val.accessPolicyWindow.hitRatio = 1.0f;
    attrs[1].val.accessPolicyWindow.hitProp = cudaAccessPropertyNormal;
    attrs[1].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    attrs[2].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[2].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attrs;
    config.numAttrs = 3;
    CHECK(cudaLaunchKernelEx(&config, scale, d, 0.5f, n));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT(h[i] == (float)i);
    std::printf("kernels with attributes ok\n");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(t));
    CHECK(cudaFree(d));
    std::printf("done\n");
    return 0;
}
