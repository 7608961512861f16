// Host program so the tests can link an executable from three translation units.
#include <cstdio>

extern "C" void launch_second(unsigned char *p);

__device__ int main_sink;

extern "C" __global__ void main_tu_kernel(int x) { main_sink = x; }

int main() {
    launch_second(nullptr);
    std::printf("ok\n");
    return 0;
}
