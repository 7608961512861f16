// A second translation unit: the host binary then carries two fat binary containers.
extern "C" __global__ void second_tu(short s, long long ll, float2 v, unsigned char *p) {
    p[threadIdx.x] = (unsigned char)(s + ll + v.x + v.y);
}

extern "C" void launch_second(unsigned char *p) {
    second_tu<<<1, 1>>>(1, 2, make_float2(3.f, 4.f), p);
}
