// Conditional graph nodes (CUDA 12.4's if and while, 12.8's if/else and switch): handles set by
// kernels through cudaGraphSetConditional, an if node with one body and with an else body, a
// while loop counting down in its body's kernel, a switch with three bodies (and a value past
// the last: no body), a handle made with cudaGraphCondAssignDefault (its default restored at
// every launch), a conditional node added to a stream capture's graph with its body captured by
// cudaStreamBeginCaptureToGraph (CUDA's sample pattern), node queries, and the errors for
// misuse. Checks its own results; prints only what CUDA determines.
//
// Older headers (CUDA 11.8, CI's) lack conditional nodes: what this program uses of them is
// declared below as CUDA 12.4+ and 13 define it, the host functions found in the loaded runtime,
// and the program built as PTX only (a kernel calling cudaGraphSetConditional does not link
// into machine code there); Phos runs it from the PTX.
#include <dlfcn.h>
#include <cstring>
#include "check.h"

#if CUDART_VERSION < 12040
typedef unsigned long long cudaGraphConditionalHandle;
enum { cudaGraphCondAssignDefault = 1 };
enum cudaGraphConditionalNodeType { cudaGraphCondTypeIf = 0, cudaGraphCondTypeWhile = 1, cudaGraphCondTypeSwitch = 2 };
struct cudaConditionalNodeParams {
    cudaGraphConditionalHandle handle;
    enum cudaGraphConditionalNodeType type;
    unsigned int size;
    cudaGraph_t *phGraph_out;
};
static const int cudaGraphNodeTypeConditional = 13;
// cudaGraphNodeParams of CUDA 12.2+: the type, reserved words, a union of 29 words, a reserved word.
struct GraphNodeParams {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        struct cudaConditionalNodeParams conditional;
    };
    long long reserved2;
};
extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

template <typename F> static F runtime_fn(const char *name) {
    F f = (F)dlsym(RTLD_DEFAULT, name);
    if (!f) {
        std::printf("the CUDA runtime lacks %s\n", name);
        std::exit(1);
    }
    return f;
}
static cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle *h, cudaGraph_t g, unsigned int value,
                                                    unsigned int flags) {
    typedef cudaError_t (*Fn)(cudaGraphConditionalHandle *, cudaGraph_t, unsigned int, unsigned int);
    return runtime_fn<Fn>("cudaGraphConditionalHandleCreate")(h, g, value, flags);
}
static cudaError_t add_node(cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps, size_t count,
                            GraphNodeParams *p) {
    typedef cudaError_t (*Fn)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, const void *, size_t,
                              GraphNodeParams *);
    return runtime_fn<Fn>("cudaGraphAddNode_v2")(node, g, deps, nullptr, count, p);
}
static cudaError_t begin_capture_to_graph(cudaStream_t s, cudaGraph_t g) {
    typedef cudaError_t (*Fn)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *, const void *, size_t,
                              cudaStreamCaptureMode);
    return runtime_fn<Fn>("cudaStreamBeginCaptureToGraph")(s, g, nullptr, nullptr, 0, cudaStreamCaptureModeGlobal);
}
#else
typedef cudaGraphNodeParams GraphNodeParams;
static cudaError_t add_node(cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps, size_t count,
                            GraphNodeParams *p) {
#if CUDART_VERSION >= 13000
    return cudaGraphAddNode(node, g, deps, nullptr, count, p);
#else
    return cudaGraphAddNode_v2(node, g, deps, nullptr, count, p);
#endif
}
static cudaError_t begin_capture_to_graph(cudaStream_t s, cudaGraph_t g) {
    return cudaStreamBeginCaptureToGraph(s, g, nullptr, nullptr, 0, cudaStreamCaptureModeGlobal);
}
#endif

// The capture's graph and dependencies (CUDA 11.3's _v2 form; the plain name from CUDA 12, with
// edge data in CUDA 13).
static void capture_info(cudaStream_t s, cudaGraph_t *graph, const cudaGraphNode_t **deps, size_t *count) {
    cudaStreamCaptureStatus status;
#if CUDART_VERSION >= 13000
    CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, graph, deps, nullptr, count));
#elif CUDART_VERSION >= 12000
    CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, graph, deps, count));
#else
    CHECK(cudaStreamGetCaptureInfo_v2(s, &status, nullptr, graph, deps, count));
#endif
    EXPECT(status == cudaStreamCaptureStatusActive);
}

static void set_dependencies(cudaStream_t s, cudaGraphNode_t *deps, size_t count) {
#if CUDART_VERSION >= 13000
    CHECK(cudaStreamUpdateCaptureDependencies(s, deps, nullptr, count, cudaStreamSetCaptureDependencies));
#else
    CHECK(cudaStreamUpdateCaptureDependencies(s, deps, count, cudaStreamSetCaptureDependencies));
#endif
}

__global__ void set_handle(cudaGraphConditionalHandle handle, const unsigned int *value) {
    cudaGraphSetConditional(handle, *value);
}

__global__ void add(int *data, int value) { *data += value; }

// A while loop's body: one step counted down; the loop goes on while steps remain.
__global__ void count_down(int *steps, int *done, cudaGraphConditionalHandle handle) {
    *steps -= 1;
    *done += 1;
    cudaGraphSetConditional(handle, *steps > 0 ? 1 : 0);
}

// Runs once per launch if the handle's default brings it back: clears the handle.
__global__ void once(int *data, cudaGraphConditionalHandle handle) {
    *data += 1;
    cudaGraphSetConditional(handle, 0);
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t count, void *func, void **args) {
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = dim3(1);
    p.blockDim = dim3(1);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, deps, count, &p));
    return node;
}

static GraphNodeParams conditional(cudaGraphConditionalHandle handle, cudaGraphConditionalNodeType type,
                                   unsigned int size) {
    // Aggregate-initialised: CUDA 13's struct has no default constructor (its union does not).
    GraphNodeParams p = {(decltype(GraphNodeParams::type))cudaGraphNodeTypeConditional};
    memset((void *)&p, 0, sizeof p);
    p.type = (decltype(p.type))cudaGraphNodeTypeConditional;
    p.conditional.handle = handle;
    p.conditional.type = type;
    p.conditional.size = size;
    return p;
}

static int read(const int *d) {
    int h;
    CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    return h;
}

static void write(int *d, int value) { CHECK(cudaMemcpy(d, &value, sizeof value, cudaMemcpyHostToDevice)); }

static void run(cudaGraph_t g, cudaStream_t s, int launches) {
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    for (int i = 0; i < launches; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(exec));
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *data, *steps, *done;
    unsigned int *value;
    CHECK(cudaMalloc(&data, sizeof(int)));
    CHECK(cudaMalloc(&steps, sizeof(int)));
    CHECK(cudaMalloc(&done, sizeof(int)));
    CHECK(cudaMalloc(&value, sizeof(unsigned int)));

    // if, and if with an else body: a kernel sets the handle from memory.
    for (unsigned int size = 1; size <= 2; size++) {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        void *set_args[] = {&h, &value};
        cudaGraphNode_t setter = kernel_node(g, nullptr, 0, (void *)set_handle, set_args);
        GraphNodeParams p = conditional(h, cudaGraphCondTypeIf, size);
        cudaGraphNode_t node;
        CHECK(add_node(&node, g, &setter, 1, &p));
        cudaGraphNodeType type;
        CHECK(cudaGraphNodeGetType(node, &type));
        EXPECT((int)type == (int)cudaGraphNodeTypeConditional);
        int then_value = 1, else_value = 100;
        void *then_args[] = {&data, &then_value};
        kernel_node(p.conditional.phGraph_out[0], nullptr, 0, (void *)add, then_args);
        if (size == 2) {
            void *else_args[] = {&data, &else_value};
            kernel_node(p.conditional.phGraph_out[1], nullptr, 0, (void *)add, else_args);
        }
        for (unsigned int v = 0; v <= 2; v++) {
            write(data, 0);
            CHECK(cudaMemcpy(value, &v, sizeof v, cudaMemcpyHostToDevice));
            run(g, s, 1);
            std::printf("if (%s) with value %u: %d\n", size == 1 ? "no else" : "else", v, read(data));
        }
        CHECK(cudaGraphDestroy(g));
    }

    // while: the body's kernel counts down and says whether to go on; the default (1, assigned
    // at each launch) enters the loop.
    {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        GraphNodeParams p = conditional(h, cudaGraphCondTypeWhile, 1);
        cudaGraphNode_t node;
        CHECK(add_node(&node, g, nullptr, 0, &p));
        void *args[] = {&steps, &done, &h};
        kernel_node(p.conditional.phGraph_out[0], nullptr, 0, (void *)count_down, args);
        write(steps, 5);
        write(done, 0);
        run(g, s, 1);
        std::printf("while: %d steps done, %d left\n", read(done), read(steps));
        write(steps, 3);
        run(g, s, 1);
        std::printf("while again: %d steps done, %d left\n", read(done), read(steps));
        CHECK(cudaGraphDestroy(g));
    }

    // switch: three bodies; a value past the last runs none.
    {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        void *set_args[] = {&h, &value};
        cudaGraphNode_t setter = kernel_node(g, nullptr, 0, (void *)set_handle, set_args);
        GraphNodeParams p = conditional(h, cudaGraphCondTypeSwitch, 3);
        cudaGraphNode_t node;
        CHECK(add_node(&node, g, &setter, 1, &p));
        int adds[3] = {10, 20, 30};
        for (int i = 0; i < 3; i++) {
            void *args[] = {&data, &adds[i]};
            kernel_node(p.conditional.phGraph_out[i], nullptr, 0, (void *)add, args);
        }
        for (unsigned int v = 0; v <= 3; v++) {
            write(data, 0);
            CHECK(cudaMemcpy(value, &v, sizeof v, cudaMemcpyHostToDevice));
            run(g, s, 1);
            std::printf("switch with value %u: %d\n", v, read(data));
        }
        CHECK(cudaGraphDestroy(g));
    }

    // cudaGraphCondAssignDefault: the body clears the handle, and each launch sets it back.
    {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        GraphNodeParams p = conditional(h, cudaGraphCondTypeIf, 1);
        cudaGraphNode_t node;
        CHECK(add_node(&node, g, nullptr, 0, &p));
        void *args[] = {&data, &h};
        kernel_node(p.conditional.phGraph_out[0], nullptr, 0, (void *)once, args);
        write(data, 0);
        run(g, s, 3);
        std::printf("default assigned at each of 3 launches: %d\n", read(data));
        CHECK(cudaGraphDestroy(g));
    }

    // In a capture: the handle made for the capture's graph, a kernel that sets it captured, the
    // conditional node added to the graph after it and made the stream's dependency, a kernel
    // captured after the node; the body captured into its graph afterwards.
    {
        write(data, 0);
        write(steps, 4);
        write(done, 0);
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        cudaGraph_t g;
        const cudaGraphNode_t *deps;
        size_t count;
        capture_info(s, &g, &deps, &count);
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        add<<<1, 1, 0, s>>>(data, 1000);
        CHECK_LAUNCH();
        capture_info(s, &g, &deps, &count);
        GraphNodeParams p = conditional(h, cudaGraphCondTypeWhile, 1);
        cudaGraphNode_t node;
        CHECK(add_node(&node, g, deps, count, &p));
        cudaGraph_t body = p.conditional.phGraph_out[0];
        set_dependencies(s, &node, 1);
        add<<<1, 1, 0, s>>>(data, 1);
        CHECK_LAUNCH();
        cudaGraph_t captured;
        CHECK(cudaStreamEndCapture(s, &captured));
        EXPECT(captured == g);
        cudaStream_t body_stream;
        CHECK(cudaStreamCreate(&body_stream));
        CHECK(begin_capture_to_graph(body_stream, body));
        count_down<<<1, 1, 0, body_stream>>>(steps, done, h);
        CHECK_LAUNCH();
        CHECK(cudaStreamEndCapture(body_stream, nullptr));
        size_t nodes = 0;
        CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
        run(g, s, 1);
        std::printf("captured: %zu nodes, data %d, %d steps done, %d left\n", nodes, read(data), read(done),
                    read(steps));
        CHECK(cudaStreamDestroy(body_stream));
        CHECK(cudaGraphDestroy(g));
    }

    // Misuse: flags other than cudaGraphCondAssignDefault, sizes a type does not take.
    {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        cudaError_t err = cudaGraphConditionalHandleCreate(&h, g, 0, 2);
        std::printf("handle with flags 2: %s\n", cudaGetErrorName(err));
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        cudaGraphNode_t node;
        GraphNodeParams p = conditional(h, cudaGraphCondTypeWhile, 2);
        err = add_node(&node, g, nullptr, 0, &p);
        std::printf("while with 2 bodies: %s\n", cudaGetErrorName(err));
        p = conditional(h, cudaGraphCondTypeIf, 3);
        err = add_node(&node, g, nullptr, 0, &p);
        std::printf("if with 3 bodies: %s\n", cudaGetErrorName(err));
        p = conditional(h, cudaGraphCondTypeSwitch, 0);
        err = add_node(&node, g, nullptr, 0, &p);
        std::printf("switch with no body: %s\n", cudaGetErrorName(err));
        CHECK(cudaGraphDestroy(g));
    }

    CHECK(cudaFree(data));
    CHECK(cudaFree(steps));
    CHECK(cudaFree(done));
    CHECK(cudaFree(value));
    CHECK(cudaStreamDestroy(s));
    std::printf("done\n");
    return 0;
}
