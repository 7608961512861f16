//! Every CUDA program of tests/cuda, built with nvcc, runs end to end through `phosctl run
//! --backend emu` (guest library, router, API server, PTX interpreter) and prints exactly
//! what it prints natively on a GPU (tests/cuda/expected, recorded on an H100 by
//! tests/scripts/gpu-suite.sh from the CUDA 11.8 builds).

use phos_tests::{TestRouter, build_program, cuda_dir, nvcc, phos_run_over, router_log};

/// nvcc flags of the CI builds: sm_70 machine code plus compute_70 PTX (what emu runs).
const ARCH: &[&str] = &["-arch=sm_70"];

fn expected(name: &str) -> String {
    std::fs::read_to_string(cuda_dir().join("expected").join(format!("{name}.out")))
        .unwrap_or_else(|e| panic!("tests/cuda/expected/{name}.out: {e}"))
}

/// Runs the built `exe` (tests/cuda/`name`) on emu over shared-memory rings, checks that it
/// succeeded and printed what it prints natively, and answers its log (standard error).
fn emu_run(exe: &std::path::Path, name: &str) -> String {
    let out = phos_run_over("emu", "shm", exe, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    // The loader found the symbol versions NVIDIA's libraries carry in Phos's.
    assert!(!stderr.contains("no version information"), "{stderr}");
    assert_eq!(stdout, expected(name), "output differs from the native run\nstderr:\n{stderr}");
    stderr
}

/// Runs `name` on emu (over shared-memory rings) and compares its output with the native
/// GPU's.
fn same_as_native(name: &str) {
    same_as_native_over(name, "shm");
}

/// The nvcc flags a program's source asks for (a line `// nvcc flags: --extended-lambda`), as
/// tests/scripts/cuda-link-flags.sh reads them for the GPU suite.
fn own_flags(name: &str) -> Vec<String> {
    let src = std::fs::read_to_string(cuda_dir().join(format!("{name}.cu"))).unwrap();
    src.lines()
        .filter_map(|l| l.strip_prefix("// nvcc flags:"))
        .flat_map(|f| f.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// [`build_program`] with `arch`'s flags and the program's own.
fn build_with_own_flags(nvcc: &std::path::Path, name: &str, arch: &[&str]) -> std::path::PathBuf {
    let own = own_flags(name);
    let flags: Vec<&str> = arch.iter().copied().chain(own.iter().map(String::as_str)).collect();
    build_program(nvcc, name, &flags)
}

fn same_as_native_over(name: &str, transport: &str) {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_with_own_flags(&nvcc, name, ARCH);
    let out = phos_run_over("emu", transport, &exe, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert!(stderr.contains("backend emu"), "phosctl names its backend first: {stderr}");
    assert!(!stderr.contains("no version information"), "{stderr}");
    assert_eq!(stdout, expected(name), "{name}: output differs from the native run\nstderr:\n{stderr}");
}

macro_rules! programs {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { same_as_native(stringify!($name)); })*
        const PROGRAMS: &[&str] = &[$(stringify!($name)),*];
    };
}

programs!(
    async_events,
    async_order,
    atomics_histogram,
    batch_and_graph_params,
    callbacks,
    capture_dependencies,
    capture_errors,
    capture_threads,
    copy_async,
    copy_settled,
    copy_sizes,
    cub_device,
    device_api,
    device_functions,
    device_numbers,
    device_query,
    dynamic_shared,
    errors,
    exec_api,
    faults,
    graphs,
    graph_kernel_attributes,
    graph_memory,
    graph_nodes,
    graph_updates,
    host_threads,
    host_register,
    ipc_memory,
    iterative,
    layered_mipmapped,
    library_api,
    managed_memory,
    math_fns,
    matmul_tiled,
    memory_2d3d,
    memory_ops,
    misc_api,
    pinned_mapped,
    pinned_small_copies,
    printf_kernel,
    shared_reduce,
    small_writes,
    stream_api,
    stream_attributes,
    stream_traffic,
    streams_events,
    struct_args,
    surface_objects,
    symbols,
    templates,
    texture_objects,
    thread_handoff,
    thrust_algorithms,
    vector_add,
    warp_ops,
);

/// Without a pinned arena (a channel on a Unix socket has none) registered memory stays the
/// process's own: its copies work, and its device pointer is refused, by name.
#[test]
fn registered_memory_without_the_arena_is_not_mapped() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "host_register", ARCH);
    let out = phos_run_over("emu", "unix", &exe, &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "registered memory without an arena:\n{stdout}\n{stderr}");
    assert!(stdout.contains("registered: contents kept yes, bytes around kept yes"), "{stdout}");
    assert!(stdout.contains("cudaHostGetDevicePointer") && stdout.contains("cudaErrorNotSupported"), "{stdout}");
    assert!(stderr.contains("cudaHostGetDevicePointer of page-locked memory outside the pinned arena"), "{stderr}");
}

/// With waiters spinning (as on machines of four CPUs or more; forced here), a synchronous
/// call returns on the answer the server posts in the staging region, and takes its frame in
/// later: programs whose answers must come with device output (printf), with the failures
/// of earlier async calls (sticky and launch errors), with the acknowledgements of other
/// threads' calls, and copies and events still print what they print natively. Each of them
/// took some answers as posted; with `PHOS_POSTED_ANSWERS=0` none.
#[test]
fn answers_posted_in_the_staging_region() {
    let Some(nvcc) = nvcc() else { return };
    let run = |name: &str, posted: &str| {
        let exe = build_program(&nvcc, name, ARCH);
        let out = std::process::Command::new(phos_tests::built("phosctl"))
            .args(["run", "--backend", "emu", "--transport", "shm", "--"])
            .arg(&exe)
            .env("PHOS_GUEST_LIB", phos_tests::built("libphos_guest.so"))
            .env("PHOS_PROFILE", "1")
            .env("PHOS_SPIN_US", "20")
            .env("PHOS_SYNC_SPIN_US", "2000")
            .env("PHOS_POSTED_ANSWERS", posted)
            .output()
            .expect("running phosctl");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{name} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
        assert_eq!(stdout, expected(name), "{name}: output differs from the native run\nstderr:\n{stderr}");
        let line = stderr.lines().find(|l| l.starts_with("answers taken as posted: ")).expect("the posted count");
        line["answers taken as posted: ".len()..].trim().parse::<u64>().unwrap()
    };
    for name in ["printf_kernel", "errors", "faults", "streams_events", "host_threads", "copy_settled", "callbacks"] {
        let taken = run(name, "1");
        assert!(taken > 0, "{name}: no answer taken as posted");
    }
    assert_eq!(run("streams_events", "0"), 0);
}

/// The Unix-socket transport carries the same programs: many threads, large copies, async
/// launches, device output.
#[test]
fn over_the_socket_transport() {
    for name in ["host_threads", "memory_ops", "async_order", "thread_handoff", "printf_kernel"] {
        same_as_native_over(name, "unix");
    }
}

/// With each channel's async launches submitted by a thread of their own (the default on a
/// GPU machine), programs that mix launches with copies, events, host functions, captures,
/// device output and threads handing work to each other print what they print natively:
/// nothing overtakes a queued launch.
#[test]
fn with_launches_submitted_by_their_own_thread() {
    let Some(nvcc) = nvcc() else { return };
    for name in [
        "async_events",
        "async_order",
        "thread_handoff",
        "host_threads",
        "callbacks",
        "capture_threads",
        "graphs",
        "printf_kernel",
        "copy_async",
        "streams_events",
        "stream_traffic",
    ] {
        let exe = build_program(&nvcc, name, ARCH);
        let out = std::process::Command::new(phos_tests::built("phosctl"))
            .args(["run", "--backend", "emu", "--transport", "shm", "--"])
            .arg(&exe)
            .env("PHOS_GUEST_LIB", phos_tests::built("libphos_guest.so"))
            .env("PHOS_LAUNCH_PIPELINE", "on")
            .env("PHOS_LOG", "info,phos_api_server::pipeline=debug")
            .output()
            .expect("running phosctl");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
        assert_eq!(stdout, expected(name), "{name}: output differs from the native run\nstderr:\n{stderr}");
        // (Captured launches, a printing kernel's and those whose shape is new, which the
        // guest waits for, are not queued: those programs check that the rest keeps order.)
        let queued = stderr.contains("the channel's launches go to a submitter thread");
        let waits = ["capture_threads", "printf_kernel", "streams_events"];
        assert!(queued || waits.contains(&name), "{name}: no launch was queued:\n{stderr}");
    }
}

#[test]
fn every_program_is_tested() {
    let mut on_disk: Vec<String> = std::fs::read_dir(cuda_dir())
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "cu").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    on_disk.sort();
    let newer = NEEDS_NEWER_CUDA.iter().map(|&(name, _)| name);
    let mut tested: Vec<&str> = PROGRAMS.iter().chain(TESTED_APART).copied().chain(newer).collect();
    tested.sort();
    assert_eq!(on_disk, tested, "add new programs of tests/cuda to the list above, with an expected output");
}

/// Programs of CUDA features newer than CI's nvcc (11.8), with the CUDA release each needs (its
/// first line says so too). The GPU suite builds them with its own nvcc and compares them with
/// their native runs like every program; here each runs on emu only where nvcc is new enough,
/// and is otherwise skipped, saying why.
const NEEDS_NEWER_CUDA: &[(&str, (u32, u32))] = &[("graph_node_params", (12, 2)), ("graph_node_get_params", (13, 1))];

/// nvcc's CUDA release (`release 11.8,` in its version text).
fn nvcc_release(nvcc: &std::path::Path) -> (u32, u32) {
    let out = std::process::Command::new(nvcc).arg("--version").output().expect("nvcc --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let release = text.split("release ").nth(1).and_then(|r| r.split(',').next()).expect("nvcc's release");
    let mut parts = release.trim().split('.').map(|p| p.parse::<u32>().expect("a release number"));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[test]
fn programs_of_newer_cuda() {
    let Some(nvcc) = nvcc() else { return };
    let (major, minor) = nvcc_release(&nvcc);
    for &(name, needs) in NEEDS_NEWER_CUDA {
        let first = std::fs::read_to_string(cuda_dir().join(format!("{name}.cu"))).unwrap();
        let says = format!("// Needs CUDA {}.{}", needs.0, needs.1);
        assert!(first.starts_with(&says), "tests/cuda/{name}.cu must start with `{says}`");
        if (major, minor) < needs {
            eprintln!(
                "skipped {name}: it needs CUDA {}.{} and nvcc here is {major}.{minor} (the GPU suite runs it)",
                needs.0, needs.1
            );
            continue;
        }
        let exe = build_program(&nvcc, name, &["-arch=sm_70", "-lcuda"]);
        emu_run(&exe, name);
    }
}

/// Conditional graph nodes: CUDA 12.4's and later nvcc builds the program as any other; older
/// ones (CI's 11.8) cannot link a kernel calling `cudaGraphSetConditional` into machine code, so
/// the program is PTX only there, which Phos runs (emu from the PTX, as always).
#[test]
fn graph_conditional() {
    let Some(nvcc) = nvcc() else { return };
    let flags: &[&str] =
        if nvcc_release(&nvcc) >= (12, 4) { ARCH } else { &["-gencode", "arch=compute_70,code=compute_70"] };
    let exe = build_program(&nvcc, "graph_conditional", flags);
    emu_run(&exe, "graph_conditional");
}

/// Thrust and CUB built for other architectures than CI's (CUDA 11.8's default, compute_52;
/// and compute_80, where CUB sorts with its one-sweep radix sort) print the same: the host
/// side picks each algorithm's tuning from the kernels' `ptxVersion`, which must be the
/// architecture their PTX was compiled for, as the device side was.
#[test]
fn thrust_and_cub_for_other_architectures() {
    let Some(nvcc) = nvcc() else { return };
    for arch in [&[][..], &["-arch=sm_80"][..]] {
        for name in ["cub_device", "thrust_algorithms"] {
            let exe = build_with_own_flags(&nvcc, name, arch);
            emu_run(&exe, name);
        }
    }
}

/// Programs with a test of their own below.
const TESTED_APART: &[&str] = &[
    "graph_conditional",
    "runtime_and_driver",
    "rewriter",
    "driver_api",
    "driver_arrays",
    "driver_graphs",
    "driver_rest",
    "driver_library",
    "driver_queries",
    "driver_link",
    "driver_stream_memops",
    "driver_tensor_map",
    "restore_on_demand",
    "restore_idle_thread",
    "restore_arrays",
    "cublas_blas",
    "cublas_async_gemms",
    "memset_math_mode",
    "curand_montecarlo",
    "cusolver_dense",
    "cusparse_cg",
    "cudnn_conv",
    "cudnn_batchnorm",
    "cudnn_mnist_layers",
    "cudnn_mnist_full",
    "cudnn_descriptor_pool",
    "cudnn_variant_packs",
    "cublaslt_matmul",
    "cublaslt_async_matmuls",
    "cublaslt_descriptor_reuse",
    "cufft_convolution",
    "graph_libraries",
    "sample_simple_cufft",
    "sample_cg",
    "sample_cg_precond",
    "sample_linear_solver",
    "sample_batch_cublas",
    "sample_mtgp_pi",
    "nvml_query",
];

/// A program of both the runtime and the driver API (linked with `-lcuda`, so the loader
/// reaches the guest library first as `libcuda.so.1`, then as `libcudart.so.11.0`): it prints
/// what it prints natively, in one session, presenting the runtime ABI it was built for.
#[test]
fn runtime_and_driver() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "runtime_and_driver", &["-arch=sm_70", "-lcuda"]);
    let router = TestRouter::start("emu");
    router_log();
    let out = std::process::Command::new(phos_tests::built("phosctl"))
        .arg("run")
        .arg("--endpoint")
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(&exe)
        .env("PHOS_GUEST_LIB", phos_tests::built("libphos_guest.so"))
        .output()
        .expect("running phosctl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, expected("runtime_and_driver"), "output differs from the native run\nstderr:\n{stderr}");
    let log = router_log();
    let sessions: Vec<&str> =
        log.lines().filter(|l| l.contains("session started") && l.contains("runtime_and_driver")).collect();
    assert_eq!(sessions.len(), 1, "one session for the program's two APIs:\n{log}");
    assert!(sessions[0].contains("abi=11"), "the runtime ABI it was built for: {}", sessions[0]);
}

/// The driver API as frameworks call it (entry points by name, the primary context and the
/// context stack, memory, memsets, a PTX module launched with both parameter forms, streams
/// and events shared with the runtime) prints what it prints natively, and the runtime's
/// `cudaGetDriverEntryPoint` answers with Phos's own function: its address lies in Phos's
/// library, never in NVIDIA's.
#[test]
fn driver_api() {
    if nvcc().is_none() {
        return;
    }
    let stderr = driver_program("driver_api");
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("cudaGetDriverEntryPoint(cuMemAlloc) lies in "))
        .unwrap_or_else(|| panic!("the program names where the entry point lies:\n{stderr}"));
    let lies_in = std::fs::canonicalize(line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let phos = std::fs::canonicalize(phos_tests::built("libphos_guest.so")).unwrap();
    assert_eq!(lies_in, phos, "the driver entry point must be Phos's own");
}

/// CUDA arrays, texture and surface objects through the driver API (`cuArrayCreate`,
/// `cuMemcpy2D`/`3D`, `cuTexObjectCreate`...) print what they print natively.
#[test]
fn driver_arrays() {
    driver_program("driver_arrays");
}

/// Graphs and stream capture through the driver API (`cuStreamBeginCapture`, `cuGraphAdd*Node`,
/// `cuGraphExecUpdate`...), over the runtime's graphs, print what they print natively.
#[test]
fn driver_graphs() {
    driver_program("driver_graphs");
}

/// Copy node parameters read and set, user objects shared with the runtime, the profiler, the
/// persisting L2 reset, GPUDirect RDMA flushes and execution affinity through the driver API
/// print what they print natively.
#[test]
fn driver_rest() {
    driver_program("driver_rest");
}

/// CUDA 12's libraries through the driver API (`cuLibraryLoadData`, `cuLibraryGetKernel`,
/// `cuKernelGetFunction`, a `CUkernel` launched as a `CUfunction`...) print what they print
/// natively.
#[test]
fn driver_library() {
    driver_program("driver_library");
}

/// The driver API's context, device, function, stream and memory calls beside the common ones
/// (`cuCtxGetLimit`, `cuCtxGetId`, `cuFuncGetParamInfo`, `cuOccupancyMaxPotentialBlockSize`,
/// `cuStreamGetAttribute`, `cuMemAllocAsync`, `cuMemPoolCreate`, `cuMemAllocManaged`,
/// `cuMemcpy3DPeer`...) print what they print natively, misuse included.
#[test]
fn driver_queries() {
    driver_program("driver_queries");
}

/// JIT linking (`cuLinkCreate`, `cuLinkAddData`, `cuLinkAddFile`, `cuLinkComplete`): one PTX
/// module, two with an extern function and variable resolved across them, a missing symbol
/// named in the error log, and misuse print what they print natively.
#[test]
fn driver_link() {
    driver_program("driver_link");
}

/// Stream memory operations (`cuStreamWriteValue*`, `cuStreamWaitValue*`,
/// `cuStreamBatchMemOp`) between two streams, on device and mapped host memory, print what
/// they print natively.
#[test]
fn driver_stream_memops() {
    driver_program("driver_stream_memops");
}

/// Tensor maps (`cuTensorMapEncodeTiled`, `...Im2col`, `cuTensorMapReplaceAddress`): valid
/// encodes succeed and each misuse answers what the driver answers.
#[test]
fn driver_tensor_map() {
    driver_program("driver_tensor_map");
}

/// Runs a program of the driver API (linked with `-lcuda`) on emu and compares its output
/// with the native GPU's; what it printed to standard error.
fn driver_program(name: &str) -> String {
    let Some(nvcc) = nvcc() else { return String::new() };
    let exe = build_program(&nvcc, name, &["-arch=sm_70", "-lcuda"]);
    let out = phos_run_over("emu", "shm", &exe, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{name} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert_eq!(stdout, expected(name), "{name}: output differs from the native run\nstderr:\n{stderr}");
    stderr
}

/// Builds `source` (a C program that loads `libcudart.so.13` by name, so no CUDA 13 toolkit
/// is needed) as `name`, runs it on emu, checks that it ran as a program of CUDA 13's ABI and
/// succeeded, and answers what it printed.
fn run_cuda_13_abi_program(name: &str, source: &str) -> String {
    let dir = phos_tests::target_dir().join("cuda-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    let cc = std::process::Command::new("cc").arg("-o").arg(&exe).arg(&src).arg("-ldl").output().unwrap();
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let out = phos_run_over("emu", "shm", &exe, &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name}: {stdout}\n{stderr}");
    assert!(stderr.contains("abi=13"), "{name}: {stderr}");
    stdout.into_owned()
}

/// CUDA 13's runtime exports `cudaStreamGetCaptureInfo` with seven parameters (edge data
/// before the count) and `cudaStreamUpdateCaptureDependencies` with five: a program of that ABI
/// (C, loading `libcudart.so.13` by name, so no CUDA 13 toolkit is needed) gets the graph being
/// captured, its dependency set and default edge data, and continues the capture after a node
/// it added itself.
#[test]
fn capture_info_of_the_cuda_13_abi() {
    assert_eq!(
        run_cuda_13_abi_program("capture_info_13", CAPTURE_INFO_13),
        "capturing: status 1, 1 dependency, default edge yes\n\
         after the update: 1 dependency, the added node yes\n\
         ended: the same graph yes, 3 nodes\n"
    );
}

const CAPTURE_INFO_13: &str = r#"#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
typedef int (*create_t)(void **, unsigned);
typedef int (*malloc_t)(void **, size_t);
typedef int (*begin_t)(void *, int);
typedef int (*memset_t)(void *, int, size_t, void *);
typedef int (*info_t)(void *, int *, unsigned long long *, void **, void *const **, const unsigned char **, size_t *);
typedef int (*empty_t)(void **, void *, void *const *, size_t);
typedef int (*update_t)(void *, void **, const void *, size_t, unsigned);
typedef int (*end_t)(void *, void **);
typedef int (*nodes_t)(void *, void **, size_t *);
#define CALL(x) do { int e_ = (x); if (e_) { printf("FAILED: %s -> %d\n", #x, e_); exit(1); } } while (0)
int main(void) {
    void *rt = dlopen("libcudart.so.13", RTLD_NOW);
    if (!rt) { printf("dlopen: %s\n", dlerror()); return 1; }
    create_t create = (create_t)dlsym(rt, "cudaStreamCreateWithFlags");
    malloc_t cmalloc = (malloc_t)dlsym(rt, "cudaMalloc");
    begin_t begin = (begin_t)dlsym(rt, "cudaStreamBeginCapture");
    memset_t cmemset = (memset_t)dlsym(rt, "cudaMemsetAsync");
    info_t info = (info_t)dlsym(rt, "cudaStreamGetCaptureInfo");
    empty_t empty = (empty_t)dlsym(rt, "cudaGraphAddEmptyNode");
    update_t update = (update_t)dlsym(rt, "cudaStreamUpdateCaptureDependencies");
    end_t end = (end_t)dlsym(rt, "cudaStreamEndCapture");
    nodes_t nodes = (nodes_t)dlsym(rt, "cudaGraphGetNodes");
    void *s, *buf, *graph = NULL, *ended = NULL, *added;
    void *const *deps = NULL;
    const unsigned char *edges = NULL;
    int status = -1;
    unsigned long long id = 0;
    size_t count = 0, n = 0;
    CALL(create(&s, 1));
    CALL(cmalloc(&buf, 4096));
    CALL(begin(s, 0));
    CALL(cmemset(buf, 0, 4096, s));
    CALL(info(s, &status, &id, &graph, &deps, &edges, &count));
    int zero = edges != NULL;
    for (int i = 0; zero && i < 8; i++) zero = edges[i] == 0;
    printf("capturing: status %d, %zu dependency, default edge %s\n", status, count, zero ? "yes" : "no");
    CALL(empty(&added, graph, deps, count));
    CALL(update(s, &added, NULL, 1, 1));
    CALL(info(s, &status, &id, &graph, &deps, NULL, &count));
    printf("after the update: %zu dependency, the added node %s\n", count, count == 1 && deps[0] == added ? "yes" : "no");
    CALL(cmemset(buf, 1, 4096, s));
    CALL(end(s, &ended));
    CALL(nodes(ended, NULL, &n));
    printf("ended: the same graph %s, %zu nodes\n", ended == graph ? "yes" : "no", n);
    return 0;
}
"#;

/// CUDA 13's runtime exports `cudaMemcpyBatchAsync` and `cudaMemcpy3DBatchAsync` without
/// CUDA 12.8's `failIdx` (the stream where it was): a program of that ABI (C, loading
/// `libcudart.so.13` by name) copies through both, and a bad batch and bad flags are refused.
#[test]
fn batch_copies_of_the_cuda_13_abi() {
    assert_eq!(
        run_cuda_13_abi_program("batch_13", BATCH_13),
        "batch: 0 1 1000 1063\n\
         3D batch: 0 rows of 8 yes\n\
         refused: null destination 1, legacy stream 1, 3D flags 1\n"
    );
}

const BATCH_13: &str = r#"#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int (*create_t)(void **, unsigned);
typedef int (*malloc_t)(void **, size_t);
typedef int (*sync_t)(void *);
typedef int (*copy_t)(void *, const void *, size_t, int);
typedef struct { int order; int src_type, src_id; int dst_type, dst_id; unsigned flags; } attrs_t;
typedef int (*batch_t)(void *const *, const void *const *, const size_t *, size_t, attrs_t *, size_t *, size_t, void *);
typedef struct { int type; unsigned long long words[4]; } operand_t;
typedef struct { operand_t src, dst; size_t w, h, d; int order; unsigned flags; } op_t;
typedef int (*batch3d_t)(size_t, op_t *, unsigned long long, void *);
#define CALL(x) do { int e_ = (x); if (e_) { printf("FAILED: %s -> %d\n", #x, e_); exit(1); } } while (0)
int main(void) {
    void *rt = dlopen("libcudart.so.13", RTLD_NOW);
    if (!rt) { printf("dlopen: %s\n", dlerror()); return 1; }
    create_t create = (create_t)dlsym(rt, "cudaStreamCreateWithFlags");
    malloc_t cmalloc = (malloc_t)dlsym(rt, "cudaMalloc");
    sync_t sync = (sync_t)dlsym(rt, "cudaStreamSynchronize");
    copy_t copy = (copy_t)dlsym(rt, "cudaMemcpy");
    batch_t batch = (batch_t)dlsym(rt, "cudaMemcpyBatchAsync");
    batch3d_t batch3d = (batch3d_t)dlsym(rt, "cudaMemcpy3DBatchAsync");
    static int a[64], b[64], back[128];
    for (int i = 0; i < 64; i++) { a[i] = i; b[i] = 1000 + i; }
    void *s, *d;
    CALL(create(&s, 1));
    CALL(cmalloc(&d, 128 * sizeof(int)));
    void *dsts[2] = {d, (char *)d + 64 * sizeof(int)};
    const void *srcs[2] = {a, b};
    size_t sizes[2] = {64 * sizeof(int), 64 * sizeof(int)};
    attrs_t attrs = {1, 0, 0, 0, 0, 0};
    size_t idx = 0;
    CALL(batch(dsts, srcs, sizes, 2, &attrs, &idx, 1, s));
    CALL(sync(s));
    CALL(copy(back, d, sizeof(back), 2));
    printf("batch: %d %d %d %d\n", back[0], back[1], back[64], back[127]);
    /* 8 rows of 16 bytes from the device buffer into a host image 32 bytes wide. */
    static unsigned char image[8][32];
    op_t op;
    memset(&op, 0, sizeof(op));
    op.src.type = 1;
    op.src.words[0] = (unsigned long long)(size_t)d;
    op.dst.type = 1;
    op.dst.words[0] = (unsigned long long)(size_t)image;
    op.dst.words[1] = 32;
    op.w = 16; op.h = 8; op.d = 1;
    op.order = 1;
    CALL(batch3d(1, &op, 0, s));
    CALL(sync(s));
    int rows = 1;
    for (int y = 0; y < 8; y++) rows = rows && memcmp(image[y], (unsigned char *)back + 16 * y, 16) == 0 && image[y][16] == 0;
    printf("3D batch: %d rows of 8 %s\n", image[0][0], rows ? "yes" : "no");
    void *bad[2] = {d, NULL};
    int null_dst = batch(bad, srcs, sizes, 2, &attrs, &idx, 1, s);
    int legacy = batch(dsts, srcs, sizes, 2, &attrs, &idx, 1, NULL);
    int flags = batch3d(1, &op, 1, s);
    printf("refused: null destination %d, legacy stream %d, 3D flags %d\n", null_dst, legacy, flags);
    return 0;
}
"#;

/// CUDA 13's single copies with attributes (`cudaMemcpyWithAttributesAsync`,
/// `cudaMemcpy3DWithAttributesAsync`: a batch of one) and batched hints on managed memory
/// (`cudaMemPrefetchBatchAsync`, `cudaMemDiscardBatchAsync`,
/// `cudaMemDiscardAndPrefetchBatchAsync`): a program of that ABI copies, prefetches and
/// discards, and each misuse is refused.
#[test]
fn copies_with_attributes_and_batched_hints_of_the_cuda_13_abi() {
    assert_eq!(
        run_cuda_13_abi_program("attributes_13", ATTRIBUTES_13),
        "copy with attributes: 0 63\n\
         3D copy with attributes: yes\n\
         prefetch batch: 0, last prefetch at device 0: yes\n\
         discard batch: 0, discard and prefetch: 0\n\
         refused: no attributes 1, 3D flags 1, unmanaged range 1, flags 1, first location index 1, bad device 101\n"
    );
}

const ATTRIBUTES_13: &str = r#"#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int (*create_t)(void **, unsigned);
typedef int (*malloc_t)(void **, size_t);
typedef int (*managed_t)(void **, size_t, unsigned);
typedef int (*sync_t)(void *);
typedef int (*copy_t)(void *, const void *, size_t, int);
typedef struct { int order; int src_type, src_id; int dst_type, dst_id; unsigned flags; } attrs_t;
typedef int (*with_t)(void *, const void *, size_t, attrs_t *, void *);
typedef struct { int type; unsigned long long words[4]; } operand_t;
typedef struct { operand_t src, dst; size_t w, h, d; int order; unsigned flags; } op_t;
typedef int (*with3d_t)(op_t *, unsigned long long, void *);
typedef struct { int type; int id; } loc_t;
typedef int (*prefetch_t)(void **, size_t *, size_t, loc_t *, size_t *, size_t, unsigned long long, void *);
typedef int (*discard_t)(void **, size_t *, size_t, unsigned long long, void *);
typedef int (*range_t)(void *, size_t, int, const void *, size_t);
#define CALL(x) do { int e_ = (x); if (e_) { printf("FAILED: %s -> %d\n", #x, e_); exit(1); } } while (0)
int main(void) {
    void *rt = dlopen("libcudart.so.13", RTLD_NOW);
    if (!rt) { printf("dlopen: %s\n", dlerror()); return 1; }
    create_t create = (create_t)dlsym(rt, "cudaStreamCreateWithFlags");
    malloc_t cmalloc = (malloc_t)dlsym(rt, "cudaMalloc");
    managed_t managed = (managed_t)dlsym(rt, "cudaMallocManaged");
    sync_t sync = (sync_t)dlsym(rt, "cudaStreamSynchronize");
    copy_t copy = (copy_t)dlsym(rt, "cudaMemcpy");
    with_t with = (with_t)dlsym(rt, "cudaMemcpyWithAttributesAsync");
    with3d_t with3d = (with3d_t)dlsym(rt, "cudaMemcpy3DWithAttributesAsync");
    prefetch_t prefetch = (prefetch_t)dlsym(rt, "cudaMemPrefetchBatchAsync");
    discard_t discard = (discard_t)dlsym(rt, "cudaMemDiscardBatchAsync");
    prefetch_t both = (prefetch_t)dlsym(rt, "cudaMemDiscardAndPrefetchBatchAsync");
    range_t range = (range_t)dlsym(rt, "cudaMemRangeGetAttribute");
    static int a[64], back[64];
    for (int i = 0; i < 64; i++) a[i] = i;
    void *s, *d;
    CALL(create(&s, 1));
    CALL(cmalloc(&d, sizeof(a)));
    attrs_t attrs = {1, 0, 0, 0, 0, 0};
    CALL(with(d, a, sizeof(a), &attrs, s));
    CALL(sync(s));
    CALL(copy(back, d, sizeof(back), 2));
    printf("copy with attributes: %d %d\n", back[0], back[63]);
    static unsigned char image[4][32];
    op_t op;
    memset(&op, 0, sizeof(op));
    op.src.type = 1;
    op.src.words[0] = (unsigned long long)(size_t)d;
    op.dst.type = 1;
    op.dst.words[0] = (unsigned long long)(size_t)image;
    op.dst.words[1] = 32;
    op.w = 16; op.h = 4; op.d = 1;
    op.order = 1;
    CALL(with3d(&op, 0, s));
    CALL(sync(s));
    int rows = 1;
    for (int y = 0; y < 4; y++) rows = rows && memcmp(image[y], (unsigned char *)a + 16 * y, 16) == 0;
    printf("3D copy with attributes: %s\n", rows ? "yes" : "no");
    void *m1, *m2;
    CALL(managed(&m1, 1 << 16, 1));
    CALL(managed(&m2, 1 << 16, 1));
    void *ptrs[2] = {m1, m2};
    size_t sizes[2] = {1 << 16, 1 << 12};
    loc_t dev0 = {1, 0};
    size_t first = 0;
    int p = prefetch(ptrs, sizes, 2, &dev0, &first, 1, 0, s);
    int last = -5;
    CALL(range(&last, sizeof(last), 4, m2, 1 << 12));
    printf("prefetch batch: %d, last prefetch at device 0: %s\n", p, last == 0 ? "yes" : "no");
    printf("discard batch: %d, discard and prefetch: %d\n", discard(ptrs, sizes, 2, 0, s),
           both(ptrs, sizes, 2, &dev0, &first, 1, 0, s));
    void *plain[2] = {m1, d};
    size_t one = 1;
    loc_t nowhere = {1, 1 << 20};
    printf("refused: no attributes %d, 3D flags %d, unmanaged range %d, flags %d, first location index %d, bad device %d\n",
           with(d, a, sizeof(a), NULL, s), with3d(&op, 1, s), discard(plain, sizes, 2, 0, s),
           discard(ptrs, sizes, 2, 1, s), prefetch(ptrs, sizes, 2, &dev0, &one, 1, 0, s),
           prefetch(ptrs, sizes, 2, &nowhere, &first, 1, 0, s));
    return 0;
}
"#;

#[test]
fn exit_code_is_the_programs() {
    let out = std::process::Command::new(phos_tests::built("phosctl"))
        .args(["run", "--backend", "emu", "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
}

/// `phosctl run --summary` says what the program did through Phos, as the router counted it:
/// vector_add copies two vectors of 2^20 floats in, one out, and launches one kernel.
#[test]
fn the_run_summary_has_the_routers_counts() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "vector_add", ARCH);
    let out = std::process::Command::new(phos_tests::built("phosctl"))
        .args(["run", "--backend", "emu", "--summary", "--"])
        .arg(&exe)
        .env("PHOS_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("PASS"));
    for line in [
        "exited with status 0",
        "backend emu, the CPU backend: Phos's PTX interpreter runs the kernels (--backend emu)",
        "1 kernel launch,",
        "8.0 MiB copied to the device, 4.0 MiB from it, 0 B within it",
        "0 calls delayed and 0 refused",
    ] {
        assert!(stderr.contains(line), "`{line}` not in the summary:\n{stderr}");
    }
    // Its 11 calls of its own, and those the guest library makes for it (registration).
    let calls: u64 = stderr
        .split_once(" CUDA calls")
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no call count in:\n{stderr}"));
    assert!(calls >= 11, "{calls} calls:\n{stderr}");
}

#[test]
fn the_run_summary_names_a_signal() {
    let out = std::process::Command::new(phos_tests::built("phosctl"))
        .args(["run", "--backend", "emu", "--summary", "--", "sh", "-c", "kill -9 $$"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9));
    assert!(stderr.contains("sh was killed by signal 9"), "{stderr}");
    assert!(stderr.contains("0 CUDA calls, 0 kernel launches"), "{stderr}");
}

/// Without a pinned arena (a channel on a Unix socket has none) no memory is reachable by both
/// the guest and the device: `cudaMallocManaged` refuses cleanly, and the log names it.
#[test]
fn managed_memory_needs_the_pinned_arena() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "managed_memory", ARCH);
    let out = phos_run_over("emu", "unix", &exe, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "managed memory without an arena:\n{stdout}\n{stderr}");
    assert!(stdout.contains("cudaMallocManaged") && stdout.contains("cudaErrorNotSupported"), "{stdout}");
    assert!(stderr.contains("cudaMallocManaged without the pinned arena"), "the refusal is logged by name: {stderr}");
}

/// A cuBLAS program (linked with `-lcublas`, so the loader reaches the guest library as
/// `libcublas.so.11` too): handles, level-1/2 BLAS, GEMMs of every form carried, both pointer
/// modes and a stream, on emu's CPU BLAS, printing what it prints natively.
#[test]
fn cublas_blas() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublas_blas", &["-arch=sm_70", "-lcublas"]);
    let stderr = emu_run(&exe, "cublas_blas");
    // The function it calls that Phos does not carry on emu is refused by name; its complex
    // GEMM is served.
    assert!(stderr.contains("cublasSgeam"), "the refusal names its function:\n{stderr}");
    assert!(!stderr.contains("cublasCgemm_v2"), "Cgemm is carried:\n{stderr}");
}

/// What a careless or hostile cuBLAS program gets: the library's own statuses for a bad
/// leading dimension, a matrix past its allocation, a pointer array that points outside the
/// session's memory and a destroyed handle, and a refusal (the capture invalidated) for a
/// cuBLAS result asked for the host in a stream capture; the server is unharmed and the handle
/// still works.
#[test]
fn cublas_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublas_blas", &["-arch=sm_70", "-lcublas"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: bad lda -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: matrix past its allocation -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: batched pointer outside memory -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: destroyed handle -> CUBLAS_STATUS_NOT_INITIALIZED",
        "hostile: a host result in a capture -> CUBLAS_STATUS_NOT_SUPPORTED, end of capture -> cudaErrorStreamCaptureInvalidated",
        "hostile: the handle still works",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    // The server logs what it refused, naming the call or what was wrong.
    for logged in
        ["cublasSgemm_v2: invalid device pointer `A`", "is not the session's memory", "is not a cuBLAS handle"]
    {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// An async GEMM (sent without waiting: its handle is live and the guest's checks passed)
/// that only the server can refuse (a matrix past its allocation, a pointer array pointing
/// outside the session's memory) returns success; the server logs the failure by name, and
/// the next synchronous call on the handle returns it, the guest logging which call it was.
#[test]
fn cublas_async_failure_comes_back_from_the_next_call() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublas_blas", &["-arch=sm_70", "-lcublas"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for logged in [
        "cublasSgemm_v2 (sent asynchronously) failed with CUBLAS_STATUS_INVALID_VALUE",
        "cublasSgemmBatched (sent asynchronously) failed with CUBLAS_STATUS_INVALID_VALUE",
        "cublasGetStream_v2 returns CUBLAS_STATUS_INVALID_VALUE of an earlier asynchronous cublasSgemm_v2",
        "cublasGetStream_v2 returns CUBLAS_STATUS_INVALID_VALUE of an earlier asynchronous cublasSgemmBatched",
    ] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// The guest's `PHOS_PROFILE` table of a run of `program` with argument `count` on emu, its
/// output checked against the native run's.
struct Profile(String);

impl Profile {
    fn of(exe: &std::path::Path, program: &str, count: u32) -> Profile {
        let out = std::process::Command::new(phos_tests::built("phosctl"))
            .args(["run", "--backend", "emu", "--transport", "shm", "--"])
            .arg(exe)
            .arg(count.to_string())
            .env("PHOS_GUEST_LIB", phos_tests::built("libphos_guest.so"))
            .env("PHOS_PROFILE", "1")
            .output()
            .expect("running phosctl");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
        assert_eq!(stdout, expected(program), "output differs from the native run\nstderr:\n{stderr}");
        Profile(stderr)
    }

    /// The number before `word` in the table's first line (" synchronous calls", " async calls").
    fn total(&self, word: &str) -> u64 {
        let head = self.0.lines().find(|l| l.starts_with("phos profile of process")).expect("the profile table");
        let at = head.find(word).unwrap_or_else(|| panic!("`{word}` in `{head}`"));
        head[..at].split_whitespace().last().unwrap().parse().unwrap()
    }

    /// A function's synchronous calls in the guest's table (its row: name, sync, sync ms,
    /// us/call, async...). The server's table, printed after it, has rows of the same names:
    /// a function the guest never waited for must not be read from there.
    fn sync_calls(&self, name: &str) -> u64 {
        self.0
            .lines()
            .skip_while(|l| !l.starts_with("phos profile of process"))
            .take_while(|l| !l.starts_with("phos server profile"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.first() == Some(&name))
            .map_or(0, |w| w[1].parse().unwrap())
    }
}

/// The synchronous calls of `cublas_async_gemms` with `gemms` GEMMs (PHOS_PROFILE's table):
/// (all of them, those of cublasSgemm_v2, those of the setters), and its async calls.
fn async_gemms_profile(exe: &std::path::Path, gemms: u32) -> (u64, u64, u64, u64) {
    let p = Profile::of(exe, "cublas_async_gemms", gemms);
    let setters: u64 =
        ["cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSetMathMode"].iter().map(|n| p.sync_calls(n)).sum();
    (p.total(" synchronous calls"), p.sync_calls("cublasSgemm_v2"), setters, p.total(" async calls"))
}

/// N GEMMs with the handle's settings set before each (as PyTorch does) make O(1)
/// synchronous calls: the GEMMs and the setters that change something go without waiting, the
/// setters that change nothing are answered by the guest; the results are right.
#[test]
fn cublas_gemms_make_a_constant_number_of_round_trips() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublas_async_gemms", &["-arch=sm_70", "-lcublas"]);
    let (few, few_sgemm, few_setters, few_async) = async_gemms_profile(&exe, 30);
    let (many, many_sgemm, many_setters, many_async) = async_gemms_profile(&exe, 300);
    assert_eq!(few, many, "synchronous calls grow with the GEMMs: {few} for 30, {many} for 300");
    assert!(many_sgemm <= 1 && many_setters <= 3, "{many_sgemm} sync sgemm, {many_setters} sync setters");
    assert!(few_sgemm <= 1 && few_setters <= 3, "{few_sgemm} sync sgemm, {few_setters} sync setters");
    // 300 GEMMs and, for each, the stream and the workspace (the stream resets the workspace).
    assert!(many_async >= 3 * 300 - 10, "{many_async} async calls for 300 GEMMs");
    assert!(few_async < many_async);
}

/// Capture status asked N times with no capture open (`capture_threads` N, before and after
/// its captures) makes O(1) synchronous calls: the guest answers None itself once the stream
/// is known, and asks the server while a capture may be open; the answers are CUDA's.
#[test]
fn capture_status_makes_a_constant_number_of_round_trips() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "capture_threads", ARCH);
    let queries = |n| {
        let p = Profile::of(&exe, "capture_threads", n);
        (p.sync_calls("cudaStreamIsCapturing"), p.sync_calls("phosStreamCaptureInfo"), p.total(" synchronous calls"))
    };
    let (few_is, few_info, few) = queries(10);
    let (many_is, many_info, many) = queries(200);
    assert_eq!((few_is, few_info, few), (many_is, many_info, many), "round trips grow with the queries");
    // Each stream once, and the queries while a capture may be open.
    assert!(many_is <= 16 && many_info <= 8, "{many_is} cudaStreamIsCapturing, {many_info} phosStreamCaptureInfo");
}

/// Memsets as PyTorch issues them (a few bytes to a MiB, on stream 0 and a created stream)
/// and cuBLAS math mode queries around setters (tests/cuda/memset_math_mode.cu) make O(1)
/// synchronous calls: a memset waits only until a memset has proven its range and stream,
/// the guest knows the handle's math mode; the results are right, and a memset of freed
/// memory still fails at the call.
#[test]
fn memsets_and_math_mode_queries_make_a_constant_number_of_round_trips() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "memset_math_mode", &["-arch=sm_70", "-lcublas"]);
    let calls = |n| {
        let p = Profile::of(&exe, "memset_math_mode", n);
        (p.total(" synchronous calls"), p.sync_calls("cudaMemsetAsync"), p.sync_calls("cublasGetMathMode"))
    };
    let (few, few_memset, few_mode) = calls(5);
    let (many, many_memset, many_mode) = calls(100);
    assert_eq!((few, few_memset, few_mode), (many, many_memset, many_mode), "round trips grow with the rounds");
    // The first memset of each range and stream, and the one of freed memory; the query
    // before the handle is live.
    assert!(
        many_memset <= 5 && many_mode <= 1,
        "{many_memset} sync cudaMemsetAsync, {many_mode} sync cublasGetMathMode"
    );
}

/// Small pageable host-to-device copies (synchronous and async) and device-to-device copies
/// (async ones chained across streams with events, synchronous ones) of
/// tests/cuda/copy_async.cu make O(1) synchronous calls: once an allocation, or a copy that
/// waited, has proven a copy's device ranges (and its stream) it goes without waiting; the
/// results are right, and copies of freed memory still fail at the call.
#[test]
fn small_and_device_to_device_copies_make_a_constant_number_of_round_trips() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "copy_async", ARCH);
    let calls = |n| {
        let p = Profile::of(&exe, "copy_async", n);
        let copies = ["cudaMemcpy", "cudaMemcpyAsync", "phosMemcpyStaged"].map(|f| p.sync_calls(f));
        // The host function's hand-over with the callback thread waits as the two threads
        // meet (one call more or less under load): not a copy's round trip.
        let host_function: u64 =
            ["phosHostFuncEnqueue", "phosHostFuncWait", "phosHostFuncDone"].iter().map(|f| p.sync_calls(f)).sum();
        (p.total(" synchronous calls") - host_function, copies, p.total(" async calls"))
    };
    let (few, few_copies, few_async) = calls(3);
    let (many, many_copies, many_async) = calls(30);
    assert_eq!((few, few_copies), (many, many_copies), "round trips grow with the rounds");
    // 27 more rounds: 5 pageable copies, an async one and 4 device-to-device ones each.
    assert!(many_async >= few_async + 27 * 10, "{few_async} async calls for 3 rounds, {many_async} for 30");
}

/// Small synchronous pageable copies in a process whose kernels write page-locked memory
/// (tests/cuda/copy_settled.cu): a copy after a kernel not known finished waits, and the host
/// then reads what the kernel wrote; the copies after a device synchronisation, or after a
/// synchronous device-to-host copy that followed the legacy stream's kernels, go without
/// waiting. A copy that waits goes through the staging slots (`phosMemcpyStaged`), one that
/// does not as an async `cudaMemcpy`. Per round, the copies that wait: after the legacy
/// stream's kernel one host-to-device copy, after the next the device-to-host one, after the
/// blocking stream's kernel the device-to-host copy and two more, and in the threads' part the
/// one after the threads and at most the copier's 8; 26 waited before (every copy after the
/// first kernel). Fewer wait where the guest already knows a kernel finished (on a loaded
/// machine the emu backend's kernels often have by the copy: 5.9 a round was seen), so the
/// lower bound only shows the copies are counted and some still wait.
#[test]
fn copies_after_finished_kernels_go_without_waiting() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "copy_settled", ARCH);
    let calls = |n| {
        let p = Profile::of(&exe, "copy_settled", n);
        p.sync_calls("cudaMemcpy") + p.sync_calls("phosMemcpyStaged")
    };
    let (few, many) = (calls(2), calls(12));
    let per_round = (many - few) as f64 / 10.0;
    assert!((3.0..=14.0).contains(&per_round), "{few} waited copies for 2 rounds, {many} for 12");
}

/// Small synchronous copies from page-locked memory (tests/cuda/pinned_small_copies.cu) go in
/// their frames without waiting once their device range is proven and no earlier work may
/// write their source: per round only the copy right after the kernel that writes its source
/// waits (`phosMemcpyPinned`, a DMA of the arena's pages); 21 a round waited before.
#[test]
fn small_pinned_copies_go_without_waiting() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "pinned_small_copies", ARCH);
    let calls = |n| Profile::of(&exe, "pinned_small_copies", n).sync_calls("phosMemcpyPinned");
    let (few, many) = (calls(2), calls(12));
    let per_round = (many - few) as f64 / 10.0;
    assert!((0.5..=2.0).contains(&per_round), "{few} waited pinned copies for 2 rounds, {many} for 12");
}

/// The synchronous calls of `cublaslt_async_matmuls` with `matmuls` matmuls (PHOS_PROFILE's
/// table): (all of them, those of cublasLtMatmul), and its async calls.
fn async_lt_profile(exe: &std::path::Path, matmuls: u32) -> (u64, u64, u64) {
    let p = Profile::of(exe, "cublaslt_async_matmuls", matmuls);
    (p.total(" synchronous calls"), p.sync_calls("cublasLtMatmul"), p.total(" async calls"))
}

/// N cuBLASLt matmuls on a cuBLAS handle cast to a cuBLASLt one (as PyTorch makes them) make
/// O(1) synchronous calls: after the first, which proves the handle, they go without waiting;
/// the result is right.
#[test]
fn cublaslt_matmuls_make_a_constant_number_of_round_trips() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublaslt_async_matmuls", &["-arch=sm_70", "-lcublasLt", "-lcublas"]);
    let (few, few_matmul, few_async) = async_lt_profile(&exe, 30);
    let (many, many_matmul, many_async) = async_lt_profile(&exe, 300);
    assert_eq!(few, many, "synchronous calls grow with the matmuls: {few} for 30, {many} for 300");
    assert!(few_matmul <= 1 && many_matmul <= 1, "{few_matmul} and {many_matmul} sync cublasLtMatmul");
    assert!(many_async >= 300 - 2, "{many_async} async calls for 300 matmuls");
    assert!(few_async < many_async);
}

/// A cuRAND program (linked with `-lcurand`, so the loader reaches the guest library as
/// `libcurand.so.10` too): a Monte Carlo estimate of pi and the moments of every distribution
/// from every pseudo-random generator type, device and host generators, seeds, offsets,
/// orderings and a stream, on emu's CPU generator, printing what it prints natively.
#[test]
fn curand_montecarlo() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "curand_montecarlo", &["-arch=sm_70", "-lcurand"]);
    let stderr = emu_run(&exe, "curand_montecarlo");
    // emu serves SOBOL32 (the program checks its 2D sequence's mean): nothing is refused.
    assert!(!stderr.contains("generator type 201"), "SOBOL32 is served on emu:\n{stderr}");
}

/// What a careless or hostile cuRAND program gets: the library's own statuses for a generator
/// it never made, a destroyed one, an output past its allocation, an absurd count and a stream
/// it does not have, and the not-supported status (logged by name) for a function Phos does
/// not carry; the server is unharmed and the generator still works.
#[test]
fn curand_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "curand_montecarlo", &["-arch=sm_70", "-lcurand"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: a generator never made -> CURAND_STATUS_NOT_INITIALIZED",
        "hostile: a destroyed generator -> CURAND_STATUS_NOT_INITIALIZED",
        "hostile: output past its allocation -> CURAND_STATUS_OUT_OF_RANGE",
        "hostile: an absurd count -> CURAND_STATUS_OUT_OF_RANGE",
        "hostile: a stream it does not have -> CURAND_STATUS_OUT_OF_RANGE",
        "hostile: direction vectors -> CURAND_STATUS_ARCH_MISMATCH",
        "hostile: the generator still works: PASS",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "is not a cuRAND generator of the session",
        "curandGenerateUniform: invalid device pointer `outputPtr`",
        "curandSetStream: 0x777 is not a stream of the session",
        "curandGetDirectionVectors32",
    ] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// A cuSOLVER program (linked with `-lcusolver`, so the loader reaches the guest library as
/// `libcusolver.so.11` too): an LU solve, a QR least-squares solve, Cholesky, syevd and gesvd
/// in both precisions on emu's CPU LAPACK, printing what it prints natively (pivots, info,
/// rounded solutions and spectra).
#[test]
fn cusolver_dense() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cusolver_dense", &["-arch=sm_70", "-lcusolver"]);
    let stderr = emu_run(&exe, "cusolver_dense");
    assert!(stderr.contains("cusolverDnCgetrf_bufferSize"), "the refusal names its function:\n{stderr}");
}

/// What a careless or hostile cuSOLVER program gets: the library's own statuses for a bad
/// leading dimension, a matrix or a workspace past its allocation, pivots naming rows the
/// matrix lacks, a made-up and a destroyed handle, and a refusal by name (the capture
/// invalidated) for a factorisation in a stream capture; the server logs each and the handle
/// still works.
#[test]
fn cusolver_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cusolver_dense", &["-arch=sm_70", "-lcusolver"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: bad lda -> CUSOLVER_STATUS_INVALID_VALUE",
        "hostile: matrix past its allocation -> CUSOLVER_STATUS_INVALID_VALUE",
        "hostile: workspace past its allocation -> CUSOLVER_STATUS_INVALID_VALUE",
        "hostile: pivots out of range -> CUSOLVER_STATUS_INVALID_VALUE",
        "hostile: made-up handle -> CUSOLVER_STATUS_NOT_INITIALIZED",
        "hostile: destroyed handle -> CUSOLVER_STATUS_NOT_INITIALIZED",
        "hostile: getrf in a capture -> CUSOLVER_STATUS_NOT_SUPPORTED, end of capture -> cudaErrorStreamCaptureInvalidated",
        "hostile: the handle still works",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "cusolverDnDgetrf: invalid device pointer `A`",
        "cusolverDnDgetrf on a stream being captured: cuSOLVER's routines are not carried in graphs",
        "cusolverDnDpotrf: invalid device pointer `work`",
        "ipiv[1] is 99, outside 1..=4",
        "is not a cuSOLVER handle",
    ] {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// A cuSPARSE program (linked with `-lcusparse -lcublas`, so the loader reaches the guest
/// library as `libcusparse.so.11` and `libcublas.so.11` too): a conjugate gradient solve with
/// SpMV and cuBLAS in both precisions, SpMV of a transposed COO matrix, SpMM, SpGEMM, the
/// sparse/dense conversions and misuse cuSPARSE refuses, on emu's CPU implementation,
/// printing what it prints natively.
#[test]
fn cusparse_cg() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cusparse_cg", &["-arch=sm_70", "-lcusparse", "-lcublas"]);
    let stderr = emu_run(&exe, "cusparse_cg");
    assert!(stderr.contains("cusparseSpMatSetStridedBatch"), "the refusal names its function:\n{stderr}");
}

/// What a careless or hostile cuSPARSE program gets: arrays past their allocation (at
/// creation and through a setter), a column index outside the matrix, a made-up descriptor and
/// handle, a destroyed descriptor; the server logs each and the handle and descriptors still
/// work.
#[test]
fn cusparse_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cusparse_cg", &["-arch=sm_70", "-lcusparse", "-lcublas"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: vector past its allocation -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: arrays past their allocation -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: column index outside the matrix -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: CsrSetPointers with a short index array -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: made-up descriptor -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: made-up handle -> CUSPARSE_STATUS_NOT_INITIALIZED",
        "hostile: destroyed descriptor -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: the handle and descriptors still work",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "cusparseCreateDnVec: invalid device pointer `values`",
        "cusparseCreateCsr: invalid device pointer `csrColInd`",
        "index 1 is 7, outside [0, 2)",
        "the second index array at",
        "is not a sparse matrix descriptor of the session",
        "is not a cuSPARSE handle of the session",
        "is not a dense vector descriptor of the session",
    ] {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// A convolution through cuDNN's backend API (tests/cuda/cudnn_conv.cu, linked against
/// `libcudnn.so.9` as against NVIDIA's): on emu, which has no cuDNN, every descriptor is made,
/// set, read back and finalized, the heuristics offer emu's one engine config (filled into the
/// program's descriptor; the program asks for one more), the heuristics, configs, graph and
/// operation are destroyed while the plan lives on (hidden in the server), and the plan's one
/// convolution forward runs on the CPU: the output is the native run's.
#[test]
fn cudnn_conv_on_emu_matches_the_host() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_conv", &["-arch=sm_70", &link[0], &link[1]]);
    emu_run(&exe, "cudnn_conv");
}

/// What a careless or hostile cuDNN program gets: CUDNN_STATUS_BAD_PARAM for made-up and
/// destroyed descriptors and handles, impossible counts and types, descriptor elements that
/// are not the session's, pointers where no pointer belongs or outside the session's memory;
/// CUDNN_STATUS_NOT_SUPPORTED for the legacy API Phos does not carry, named by
/// cudnnGetLastErrorString. The server
/// logs each, and the handle and descriptors still work.
#[test]
fn cudnn_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_conv", &["-arch=sm_70", &link[0], &link[1]]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: made-up descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: negative element count -> CUDNN_STATUS_BAD_PARAM",
        "hostile: unknown attribute type -> CUDNN_STATUS_BAD_PARAM",
        "hostile: descriptor element made up -> CUDNN_STATUS_BAD_PARAM",
        "hostile: pointer on a tensor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: host pointer in a variant pack -> CUDNN_STATUS_BAD_PARAM",
        "hostile: destroyed descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: made-up handle -> CUDNN_STATUS_BAD_PARAM",
        "hostile: legacy RNN descriptor -> CUDNN_STATUS_NOT_SUPPORTED",
        "hostile: last error names the call",
        "hostile: the handle and descriptors still work",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "is not a backend descriptor of the session",
        "only variant packs hold pointers",
        "is not device memory of the session",
        "is not a cuDNN handle of the session",
        "cudnnCreateRNNDescriptor",
    ] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// Convolutions through cuDNN's backend API as cudnn-frontend runs them
/// (tests/cuda/cudnn_variant_packs.cu): one plan, executed N times, each time with a variant
/// pack made, set, finalized and destroyed for it; every output matches the host's, a pack
/// attribute of the wrong type and an execution with a pack not finalized are refused. Through
/// Phos the packs come from the guest's pool and their settings, finalization and destruction
/// go without waiting, as the executions do once the plan is proven: no synchronous call grows
/// with the executions.
#[test]
fn cudnn_variant_packs_cost_no_round_trip() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_variant_packs", &["-arch=sm_70", &link[0], &link[1]]);
    emu_run(&exe, "cudnn_variant_packs");
    let (few, many) = (Profile::of(&exe, "cudnn_variant_packs", 4), Profile::of(&exe, "cudnn_variant_packs", 40));
    assert_eq!(
        few.total(" synchronous calls"),
        many.total(" synchronous calls"),
        "synchronous calls grow with the executions:\n{}\n{}",
        few.0,
        many.0
    );
    for f in [
        "cudnnBackendCreateDescriptor",
        "cudnnBackendSetAttribute",
        "cudnnBackendFinalize",
        "cudnnBackendDestroyDescriptor",
        "cudnnBackendExecute",
    ] {
        assert_eq!(many.sync_calls(f), few.sync_calls(f), "{f} waits more with more executions\n{}", many.0);
    }
    // 40 executions, each a creation, three settings, a finalization, the execution and a
    // destruction without waiting.
    assert!(many.total(" async calls") >= few.total(" async calls") + 36 * 7, "{}", many.0);
}

/// What careless or hostile calls on variant packs get through Phos: the statuses cuDNN
/// documents for a wrong type or count, an execution or a second finalization of a pack not
/// finalized or finalized, a setting of a finalized pack, a second destruction and made-up
/// handles (`CUDNN_STATUS_BAD_PARAM`, its kinds), a pointer outside the session's memory
/// refused by the server and returned by the next synchronous call; the plan and fresh packs
/// still work.
#[test]
fn cudnn_variant_pack_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_variant_packs", &["-arch=sm_70", &link[0], &link[1]]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: unique ids as pointers -> CUDNN_STATUS_NOT_SUPPORTED",
        "hostile: two workspaces -> CUDNN_STATUS_BAD_PARAM",
        "hostile: execute a pack not finalized -> CUDNN_STATUS_SUCCESS",
        "hostile: finalize twice -> CUDNN_STATUS_BAD_PARAM",
        "hostile: set a finalized pack -> CUDNN_STATUS_BAD_PARAM",
        "hostile: destroy twice -> CUDNN_STATUS_BAD_PARAM",
        "hostile: execute a destroyed pack -> CUDNN_STATUS_BAD_PARAM",
        "hostile: destroy a made-up pack -> CUDNN_STATUS_BAD_PARAM",
        "hostile: host pointer in a pack -> CUDNN_STATUS_SUCCESS, the next synchronous call -> CUDNN_STATUS_BAD_PARAM",
        "hostile: the plan and fresh packs still work",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
}

/// Batch normalization through cuDNN's legacy API (tests/cuda/cudnn_batchnorm.cu, linked
/// against `libcudnn.so.9` as against NVIDIA's): tensor descriptors from every setter and
/// derived, read back; forward training, inference and backward on NCHW and NHWC, float and
/// half, and the plain calls per activation with blending, each checked by the program against
/// its host reference; on emu's CPU implementation it prints what it prints natively.
#[test]
fn cudnn_batchnorm_on_emu_matches_the_host() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_batchnorm", &["-arch=sm_70", &link[0], &link[1]]);
    emu_run(&exe, "cudnn_batchnorm");
}

/// cuDNN tensor descriptors made, set, read back and destroyed around every batch
/// normalization as PyTorch makes them (tests/cuda/cudnn_descriptor_pool.cu): every step's
/// result matches the host's, and the shapes cuDNN refuses are refused with its status on a
/// new descriptor and on one made after many were destroyed, leaving it as it was. Through
/// Phos the descriptors come from the guest's pool, their setters go without waiting, their
/// getters are answered by the guest, and the normalization on fresh descriptors of a proven
/// call's shapes goes without waiting: no synchronous call grows with the steps.
#[test]
fn cudnn_descriptor_pool() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_descriptor_pool", &["-arch=sm_70", &link[0], &link[1]]);
    emu_run(&exe, "cudnn_descriptor_pool");
    let (few, many) = (Profile::of(&exe, "cudnn_descriptor_pool", 4), Profile::of(&exe, "cudnn_descriptor_pool", 40));
    for f in [
        "cudnnCreateTensorDescriptor",
        "cudnnDestroyTensorDescriptor",
        "cudnnSetTensor4dDescriptor",
        "cudnnSetTensor4dDescriptorEx",
        "cudnnSetTensorNdDescriptor",
        "cudnnSetTensorNdDescriptorEx",
        "cudnnDeriveBNTensorDescriptor",
        "cudnnGetTensor4dDescriptor",
        "cudnnGetTensorNdDescriptor",
        "cudnnGetTensorSizeInBytes",
        "cudnnBatchNormalizationForwardTraining",
        "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
        "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
    ] {
        assert!(
            many.sync_calls(f) <= few.sync_calls(f),
            "{f} waits more with more steps: {} for 4, {} for 40\n{}",
            few.sync_calls(f),
            many.sync_calls(f),
            many.0
        );
    }
    assert_eq!(many.sync_calls("cudnnGetTensorNdDescriptor"), 0, "answered by the guest:\n{}", many.0);
}

/// What a careless or hostile program gets from the legacy API: CUDNN_STATUS_BAD_PARAM for bad
/// dimensions, strides, types and formats, made-up, destroyed and wrong-kind descriptors, device
/// ranges outside the session's memory (data, host pointers, a workspace larger than its
/// allocation), a scale descriptor of the wrong shape, a negative epsilon, an unknown mode and
/// a lone running statistic; CUDNN_STATUS_NOT_SUPPORTED for nine dimensions, the fused
/// activation and the legacy API Phos does not carry. The server logs each, and the handle and
/// descriptors still work.
#[test]
fn cudnn_batchnorm_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_batchnorm", &["-arch=sm_70", &link[0], &link[1]]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: zero batch -> CUDNN_STATUS_BAD_PARAM",
        "hostile: negative stride -> CUDNN_STATUS_BAD_PARAM",
        "hostile: unknown data type -> CUDNN_STATUS_BAD_PARAM",
        "hostile: unknown format -> CUDNN_STATUS_BAD_PARAM",
        "hostile: nine dimensions -> CUDNN_STATUS_NOT_SUPPORTED",
        "hostile: a descriptor never set -> CUDNN_STATUS_BAD_PARAM",
        "hostile: made-up descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: a handle as a descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: x past its allocation -> CUDNN_STATUS_BAD_PARAM",
        "hostile: y on the host -> CUDNN_STATUS_BAD_PARAM",
        "hostile: workspace larger than its allocation -> CUDNN_STATUS_BAD_PARAM",
        "hostile: data descriptor as the scale's -> CUDNN_STATUS_BAD_PARAM",
        "hostile: fused activation -> CUDNN_STATUS_NOT_SUPPORTED",
        "hostile: negative epsilon -> CUDNN_STATUS_BAD_PARAM",
        "hostile: unknown mode -> CUDNN_STATUS_BAD_PARAM",
        "hostile: one running statistic -> CUDNN_STATUS_BAD_PARAM",
        "hostile: destroyed descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: legacy RNN descriptor -> CUDNN_STATUS_NOT_SUPPORTED",
        "hostile: last error names the call",
        "hostile: the handle and descriptors still work (480 bytes)",
        "hostile: x past its allocation, once proven -> CUDNN_STATUS_SUCCESS",
        "hostile: the next call on the handle -> CUDNN_STATUS_BAD_PARAM",
        "hostile: the call after it -> CUDNN_STATUS_SUCCESS",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "dimension 0",
        "stride -1",
        "data type 99",
        "tensor format 9",
        "was never given a shape",
        "is not a tensor descriptor of the session",
        "`x` at",
        "`workspace` at",
        "the scale/bias descriptor is",
        "bnOps 1",
        "epsilon -1",
        "batch normalization mode 7",
        "one is NULL and the other is not",
        "cudnnCreateRNNDescriptor",
        "cudnnBatchNormalizationForwardTrainingEx (sent asynchronously) failed with CUDNN_STATUS_BAD_PARAM",
        "cudnnGetStream returns CUDNN_STATUS_BAD_PARAM of an earlier asynchronous cudnnBatchNormalizationForwardTrainingEx",
    ] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// cuDNN calls repeated (`cudnn_batchnorm` N: the stream set again and a tensor set N more
/// times) make O(1) synchronous calls: the setter that changes nothing is answered by the
/// guest, and a compute call goes without waiting once the same call has succeeded.
#[test]
fn cudnn_calls_make_a_constant_number_of_round_trips() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_batchnorm", &["-arch=sm_70", &link[0], &link[1]]);
    let calls = |n| {
        let p = Profile::of(&exe, "cudnn_batchnorm", n);
        (p.total(" synchronous calls"), p.sync_calls("cudnnSetTensor"), p.sync_calls("cudnnSetStream"))
    };
    let (few, few_set, few_stream) = calls(5);
    let (many, many_set, many_stream) = calls(100);
    assert_eq!((few, few_set, few_stream), (many, many_set, many_stream), "round trips grow with the calls");
    // The half, the double and the float tensor's first set; the stream's first set.
    assert!(many_set <= 3 && many_stream <= 1, "{many_set} sync cudnnSetTensor, {many_stream} sync cudnnSetStream");
}

/// The layers of an mnistCUDNN-shaped network through cuDNN's legacy API
/// (tests/cuda/cudnn_mnist_layers.cu, linked against `libcudnn.so.9` and `-lcublas`): filter,
/// convolution and activation descriptors read back, output dimensions, the algorithm queries
/// and workspace sizes, convolution forward (fused with bias and RELU, grouped and strided with
/// blending), tanh, the fully connected layer through cuBLAS, convolution backward data, filter
/// and bias and tanh backward, each checked by the program against its host reference, and the
/// misuse cuDNN refuses itself; on emu's CPU implementation it prints what it prints natively.
#[test]
fn cudnn_mnist_layers_on_emu_match_the_host() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_mnist_layers", &["-arch=sm_70", &link[0], &link[1], "-lcublas"]);
    let stderr = emu_run(&exe, "cudnn_mnist_layers");
    for logged in ["dimension -1", "stride or dilation 0", "group count 0", "where the convolution makes"] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// The rest of an mnistCUDNN-shaped network through cuDNN's legacy API
/// (tests/cuda/cudnn_mnist_full.cu, linked against `libcudnn.so.9`): convolution, the bias
/// through cudnnAddTensor, RELU, max pooling, cross-channel LRN and softmax (instance and
/// channel, accurate and log) with their backward passes, average pooling with and without the
/// padding counted (blended), the tensor operations (set, scale, transform to NHWC, op-tensor's
/// six operations with broadcasting), descriptors read back and the algorithm counts, each
/// checked by the program against its host reference, and the misuse cuDNN refuses itself; on
/// emu's CPU implementation it prints what it prints natively.
#[test]
fn cudnn_mnist_full_on_emu_matches_the_host() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_mnist_full", &["-arch=sm_70", &link[0], &link[1]]);
    let stderr = emu_run(&exe, "cudnn_mnist_full");
    for logged in ["does not broadcast over", "window or stride 0", "LRN window 17", "softmax algorithm 7"] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// What a careless or hostile program gets from the legacy pooling, softmax, LRN and tensor
/// operations: CUDNN_STATUS_BAD_PARAM for outputs past their allocation and data on the host,
/// made-up, wrong-kind and destroyed descriptors, reduction indices smaller than asked or on
/// the host; CUDNN_STATUS_NOT_SUPPORTED for double data. The server logs each, and the
/// descriptors still work.
#[test]
fn cudnn_mnist_full_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_mnist_full", &["-arch=sm_70", &link[0], &link[1]]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: y past its allocation -> CUDNN_STATUS_BAD_PARAM",
        "hostile: x on the host -> CUDNN_STATUS_BAD_PARAM",
        "hostile: a made-up tensor descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: a pooling descriptor as the LRN descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: indices smaller than asked -> CUDNN_STATUS_BAD_PARAM",
        "hostile: indices on the host -> CUDNN_STATUS_BAD_PARAM",
        "hostile: a destroyed op-tensor descriptor -> CUDNN_STATUS_BAD_PARAM",
        "hostile: double data -> CUDNN_STATUS_NOT_SUPPORTED",
        "done",
    ] {
        assert!(stdout.contains(line), "missing `{line}`:\n{stdout}\nstderr:\n{stderr}");
    }
    assert!(stdout.contains("hostile: the descriptors still work"), "{stdout}");
    for logged in ["is not 800 bytes of the session's device memory", "is not a cudnn lrn descriptor", "indices of"] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// What a careless or hostile program gets from the legacy convolutions: CUDNN_STATUS_BAD_PARAM
/// for data, outputs and workspaces outside the session's memory, an unknown algorithm,
/// made-up, wrong-kind, unset and destroyed descriptors, FindEx on a buffer past its allocation
/// and an unknown activation mode; CUDNN_STATUS_NOT_SUPPORTED for double data. The server logs
/// each, and the descriptors still work.
#[test]
fn cudnn_mnist_layers_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let link = phos_tests::cudnn_link_flags();
    let exe = build_program(&nvcc, "cudnn_mnist_layers", &["-arch=sm_70", &link[0], &link[1], "-lcublas"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: x past its allocation -> CUDNN_STATUS_BAD_PARAM",
        "hostile: y on the host -> CUDNN_STATUS_BAD_PARAM",
        "hostile: a host workspace -> CUDNN_STATUS_BAD_PARAM",
        "hostile: unknown algorithm -> CUDNN_STATUS_BAD_PARAM",
        "hostile: made-up filter -> CUDNN_STATUS_BAD_PARAM",
        "hostile: a filter as the convolution -> CUDNN_STATUS_BAD_PARAM",
        "hostile: a convolution never set -> CUDNN_STATUS_BAD_PARAM",
        "hostile: destroyed filter -> CUDNN_STATUS_BAD_PARAM",
        "hostile: double data -> CUDNN_STATUS_NOT_SUPPORTED",
        "hostile: FindEx with y past its allocation -> CUDNN_STATUS_BAD_PARAM",
        "hostile: unknown activation mode -> CUDNN_STATUS_BAD_PARAM",
        "hostile: an activation never set -> CUDNN_STATUS_BAD_PARAM",
        "hostile: the descriptors still work (sum 324.0)",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "`x` at",
        "invalid device pointer `y`",
        "invalid device pointer `workSpace`",
        "algorithm 99",
        "was never set",
        "double data",
        "`y` at",
    ] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
}

/// A cuBLASLt program (linked with `-lcublasLt`, so the loader reaches the guest library as
/// `libcublasLt.so.11` too): fp32 matmuls with the bias, RELU and GELU epilogues, a transposed
/// A with a row-major B, a strided batch, device-side scalars, GELU_AUX, the heuristic query,
/// attributes read back and a matrix transform, on emu's CPU GEMM, each checked against the
/// host, printing what it prints natively.
#[test]
fn cublaslt_matmul() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublaslt_matmul", &["-arch=sm_70", "-lcublasLt", "-lcublas"]);
    emu_run(&exe, "cublaslt_matmul");
}

/// cuBLASLt descriptors made, set, used and destroyed around every matmul as PyTorch makes
/// them (tests/cuda/cublaslt_descriptor_reuse.cu): every result matches the host's, and a
/// descriptor made after others were destroyed starts from cuBLASLt's defaults. Through Phos
/// the settings go without waiting, and the heuristic questions asked again (the same
/// descriptors' contents) are answered by the guest, so neither grows with the cycles.
#[test]
fn cublaslt_descriptor_reuse() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublaslt_descriptor_reuse", &["-arch=sm_70", "-lcublasLt"]);
    emu_run(&exe, "cublaslt_descriptor_reuse");
    let (few, many) =
        (Profile::of(&exe, "cublaslt_descriptor_reuse", 12), Profile::of(&exe, "cublaslt_descriptor_reuse", 60));
    for setter in
        ["cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutSetAttribute", "cublasLtMatmulPreferenceSetAttribute"]
    {
        assert_eq!(many.sync_calls(setter), 0, "{setter} waited:\n{}", many.0);
    }
    let asked = |p: &Profile| p.sync_calls("cublasLtMatmulAlgoGetHeuristic");
    assert!(
        asked(&many) <= asked(&few) + 6,
        "heuristic queries grow with the cycles: {} for 12, {} for 60",
        asked(&few),
        asked(&many)
    );
}

/// What a careless or hostile cuBLASLt program gets: a layout larger than the memory behind
/// it, a bias pointer that is not the program's, a workspace past its allocation, an attribute
/// of the wrong size, layouts that do not agree, a made-up handle and a destroyed descriptor
/// each get cuBLASLt's status (a matmul's failure that only the server finds through the next
/// synchronous call on the handle, the matmul going without waiting); the server logs each by
/// name and the handle still works.
#[test]
fn cublaslt_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cublaslt_matmul", &["-arch=sm_70", "-lcublasLt", "-lcublas"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: matrix past its allocation -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: bias pointer not the program's -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: workspace past its allocation -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: attribute of the wrong size -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: layouts that do not agree -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: made-up handle -> CUBLAS_STATUS_NOT_INITIALIZED",
        "hostile: destroyed descriptor -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: the handle still works",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "cublasLtMatmul: `A` at",
        "cublasLtMatmul: `bias` at 0x1000",
        "cublasLtMatmulDescSetAttribute: attribute 8 takes 8 bytes, not 4",
        "cublasLtMatmul: the layouts do not agree",
        "is not a cuBLASLt handle of the session",
        "is not a cublaslt_matmul_desc of the session",
        // On a live handle with descriptors the guest knows, a matmul goes without waiting:
        // its failure comes back from the next synchronous call on the handle.
        "cublasLtMatmul (sent asynchronously) failed with CUBLAS_STATUS_INVALID_VALUE",
        "cublasLtMatmulAlgoGetHeuristic returns CUBLAS_STATUS_INVALID_VALUE of an earlier asynchronous cublasLtMatmul",
    ] {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// A cuFFT program (linked with `-lcufft`, so the loader reaches the guest library as
/// `libcufft.so.10` too): simpleCUFFT's convolution with complex and real transforms, 2D and 3D
/// plans, batched plans with the advanced layout and the padded in-place layout, double
/// precision on made plans with a work area of the program's, a plan on a stream and cuFFT's
/// statuses for misuse, on emu's CPU transforms, printing what it prints natively.
#[test]
fn cufft_convolution() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cufft_convolution", &["-arch=sm_70", "-lcufft"]);
    let stderr = emu_run(&exe, "cufft_convolution");
    assert!(stderr.contains("cufftXtSetGPUs"), "the refusal names its function:\n{stderr}");
}

/// What a careless or hostile cuFFT program gets: arrays and a work area that do not hold what
/// the plan's layout gives them, a direction that is neither, an exec of another type than the
/// plan's and a made-up plan each get cuFFT's own status; the server logs each and the plan
/// still works.
#[test]
fn cufft_hostile_calls() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "cufft_convolution", &["-arch=sm_70", "-lcufft"]);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: output past its allocation -> CUFFT_INVALID_VALUE",
        "hostile: input past its allocation -> CUFFT_INVALID_VALUE",
        "hostile: direction 7 -> CUFFT_INVALID_VALUE",
        "hostile: R2C exec on a C2C plan -> CUFFT_INVALID_VALUE",
        "hostile: made-up plan -> CUFFT_INVALID_PLAN",
        "hostile: work area smaller than the plan's -> CUFFT_INVALID_VALUE",
        "hostile: the plan still works",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "cufftExecC2C: the output at",
        "cufftExecC2C: the input at",
        "direction 7 is neither CUFFT_FORWARD nor CUFFT_INVERSE",
        "is a C2C plan: CUFFT_INVALID_VALUE",
        "is not a cuFFT plan of the session",
        "cufftSetWorkArea: the work area at",
    ] {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// The link flags of tests/cuda/graph_libraries.cu.
const GRAPH_LIBRARIES_LINK: &[&str] = &["-arch=sm_70", "-lcublas", "-lcusparse", "-lcufft", "-lcurand"];

/// Library calls inside stream capture (tests/cuda/graph_libraries.cu): a graph holding a
/// cuBLAS GEMM with host scalars, a dot product and an axpy in device pointer mode, a cuSPARSE
/// SpMV and a cuFFT transform, launched three times on another stream with new inputs, each
/// result checked against the host's; and a conjugate gradient solve whose iteration (kernels,
/// cuBLAS and cuSPARSE calls, memsets, copies) is captured once and launched until it
/// converges. On emu's CPU implementations, printing what it prints natively.
#[test]
fn graph_libraries() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "graph_libraries", GRAPH_LIBRARIES_LINK);
    emu_run(&exe, "graph_libraries");
}

/// What CUDA cannot capture either is refused by name: a cuBLAS dot product with its result on
/// the host, in a capture, answers CUBLAS_STATUS_NOT_SUPPORTED, the capture ends invalidated,
/// and the handle still works outside it.
#[test]
fn graph_libraries_refusals() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "graph_libraries", GRAPH_LIBRARIES_LINK);
    let out = phos_run_over("emu", "shm", &exe, &["refusals"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "refusals: dot with a host result in a capture -> refused",
        "refusals: the capture ends -> cudaErrorStreamCaptureInvalidated",
        "refusals: the handle still works",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    let logged = "cublasSdot_v2 on a stream being captured: its result goes to the host";
    assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    assert!(stderr.contains("CUBLAS_STATUS_NOT_SUPPORTED"), "{stderr}");
}

/// A hostile or careless program destroys the cuBLAS handle a captured GEMM uses, then
/// launches the graph: the launch's checks find the handle gone, the launch answers
/// cudaErrorInvalidValue and the log names the call; a new handle works afterwards.
#[test]
fn graph_libraries_hostile() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "graph_libraries", GRAPH_LIBRARIES_LINK);
    let out = phos_run_over("emu", "shm", &exe, &["hostile"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for line in [
        "hostile: launch after the handle was destroyed -> cudaErrorInvalidValue",
        "hostile: a new handle works",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in ["is not a cuBLAS handle of the session", "cudaGraphLaunch: the captured cublasSgemm_v2 failed"] {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// A program shaped like one of NVIDIA's library samples, built as the GPU suite builds it
/// (linked with the libraries its headers name, tests/scripts/cuda-link-flags.sh), run on emu
/// with `args`: its stdout and stderr, the run asserted successful.
fn library_sample(name: &str, libs: &[&str], args: &[&str]) -> (String, String) {
    let nvcc = nvcc().expect("the callers return first without nvcc");
    let mut flags = vec!["-arch=sm_70"];
    flags.extend_from_slice(libs);
    let exe = build_program(&nvcc, name, &flags);
    let out = phos_run_over("emu", "shm", &exe, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{name} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert!(!stderr.contains("no version information"), "{stderr}");
    (stdout, stderr)
}

/// The same, compared with the native run.
fn library_sample_as_native(name: &str, libs: &[&str]) -> String {
    let (stdout, stderr) = library_sample(name, libs, &[]);
    assert_eq!(stdout, expected(name), "{name}: output differs from the native run\nstderr:\n{stderr}");
    stderr
}

/// simpleCUFFT's shape (a batched 1D C2C convolution with a pointwise kernel of the program's)
/// and a batched 2D R2C/C2R pair from cufftPlanMany; one NULL embedding beside one is refused.
#[test]
fn sample_simple_cufft() {
    if nvcc().is_none() {
        return;
    }
    library_sample_as_native("sample_simple_cufft", &["-lcufft"]);
}

/// conjugateGradient's shape: CG with cuSPARSE's SpMV on CSR and cuBLAS level 1, through the
/// const descriptors of CUDA 12 (found at run time in a CUDA 11 build: Phos exports them).
#[test]
fn sample_cg() {
    if nvcc().is_none() {
        return;
    }
    library_sample_as_native("sample_cg", &["-lcusparse", "-lcublas"]);
}

/// conjugateGradientPrecond's shape: ILU(0)-preconditioned CG with two SpSV solves on one CSR
/// matrix's triangles, chosen by attributes; the legacy csrilu02 API is refused by name.
#[test]
fn sample_cg_precond() {
    if nvcc().is_none() {
        return;
    }
    let stderr = library_sample_as_native("sample_cg_precond", &["-lcusparse", "-lcublas"]);
    assert!(stderr.contains("cusparseCreateCsrilu02Info"), "the refusal names its function:\n{stderr}");
}

/// What a careless or hostile program gets from SpSV and the matrix attributes: a bad value,
/// size or attribute, a matrix that is not square, a vector of the wrong size, a made-up and
/// a destroyed SpSV descriptor; the server logs each, and the handle and descriptors still
/// solve.
#[test]
fn sample_cg_precond_hostile_calls() {
    if nvcc().is_none() {
        return;
    }
    let (stdout, stderr) = library_sample("sample_cg_precond", &["-lcusparse", "-lcublas"], &["hostile"]);
    for line in [
        "hostile: fill mode 7 -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: attribute of 8 bytes -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: attribute 9 -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: SpSV of a 3 x 2 matrix -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: SpSV into a short vector -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: made-up SpSV descriptor -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: destroyed SpSV descriptor -> CUSPARSE_STATUS_INVALID_VALUE",
        "hostile: the handle and descriptors still work",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in ["set to 7, not 0 or 1", "SpSV needs it square", "is not a SpSV descriptor of the session"] {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// cuSolverDn_LinearSolver's shape: Cholesky, LU and QR (with cublasDtrsm) solves, residuals by
/// cublasDgemv and cublasDnrm2.
#[test]
fn sample_linear_solver() {
    if nvcc().is_none() {
        return;
    }
    library_sample_as_native("sample_linear_solver", &["-lcusolver", "-lcublas"]);
}

/// A program linking cuSOLVER's sparse API and cublasXt loads, and their calls answer each
/// library's not-supported status, logged by name.
#[test]
fn sparse_solver_and_cublasxt_are_refused_cleanly() {
    if nvcc().is_none() {
        return;
    }
    let (stdout, stderr) = library_sample("sample_linear_solver", &["-lcusolver", "-lcublas"], &["unsupported"]);
    assert_eq!(
        stdout,
        "cusolverSpCreate -> CUSOLVER_STATUS_NOT_SUPPORTED\ncublasXtCreate -> CUBLAS_STATUS_NOT_SUPPORTED\ndone\n",
        "stderr:\n{stderr}"
    );
    for name in ["cusolverSpCreate", "cublasXtCreate"] {
        assert!(stderr.contains(name), "the refusal names {name}:\n{stderr}");
    }
}

/// batchCUBLAS's shape: GEMMs on several streams through cublasSetStream, batched and strided
/// batched GEMMs.
#[test]
fn sample_batch_cublas() {
    if nvcc().is_none() {
        return;
    }
    library_sample_as_native("sample_batch_cublas", &["-lcublas"]);
}

/// What a careless or hostile program gets from the batched LU and trsm: a matrix past its
/// allocation, a leading dimension below the size, pivots naming rows the matrix lacks; the
/// server logs each and the handle still inverts.
#[test]
fn sample_batch_cublas_hostile_calls() {
    if nvcc().is_none() {
        return;
    }
    let (stdout, stderr) = library_sample("sample_batch_cublas", &["-lcublas"], &["hostile"]);
    for line in [
        "hostile: matrix past its allocation -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: lda below n -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: pivots out of range -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: trsm lda below m -> CUBLAS_STATUS_INVALID_VALUE",
        "hostile: the handle still works",
        "done",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in ["is not the session's memory", "pivot 0 is 99, outside 1..=2"] {
        assert!(stderr.contains(logged), "the server's log lacks `{logged}`:\n{stderr}");
    }
}

/// MersenneTwisterGP11213's and MC_EstimatePiQ's shapes: an MTGP32 device generator against a
/// host generator of the same seed, and pi from a 2D SOBOL32 sequence.
#[test]
fn sample_mtgp_pi() {
    if nvcc().is_none() {
        return;
    }
    library_sample_as_native("sample_mtgp_pi", &["-lcurand"]);
}

/// NVML next to the runtime (tests/cuda/nvml_query.cu opens `libnvidia-ml.so.1` with dlopen, as
/// PyTorch does): through `phosctl run` on emu it gets Phos's NVML, prints what it prints
/// natively (names, UUID, PCI ids and compute capability agree with the runtime's; memory grows
/// by what it allocated; NVML's statuses for short buffers, NULL, another struct version, a
/// handle past the count and calls outside init), and, as a tenant, sees one device, its own
/// memory and process only, a setter refused and an export Phos does not carry not supported
/// (both logged by name).
#[test]
fn nvml_query() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "nvml_query", ARCH);
    let out = phos_run_over("emu", "shm", &exe, &["tenant"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let common: String = stdout.lines().filter(|l| !l.starts_with("tenant:")).map(|l| format!("{l}\n")).collect();
    assert_eq!(common, expected("nvml_query"), "output differs from the native run\nstderr:\n{stderr}");
    for line in [
        "tenant: devices 1",
        "tenant: used is exactly the allocation: yes",
        "tenant: the only process is this one: yes",
        "tenant: its memory is the session's: yes",
        "tenant: a setter: NVML_ERROR_NO_PERMISSION",
        "tenant: an export Phos does not carry: NVML_ERROR_NOT_SUPPORTED",
        "tenant: a made-up handle: NVML_ERROR_INVALID_ARGUMENT",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    for logged in [
        "nvmlDeviceSetPersistenceMode is not supported by Phos; returning NVML_ERROR_NO_PERMISSION",
        "nvmlDeviceGetEncoderUtilization is not supported by Phos; returning NVML_ERROR_NOT_SUPPORTED",
        "is not a device handle of the session",
    ] {
        assert!(stderr.contains(logged), "the log lacks `{logged}`:\n{stderr}");
    }
    assert!(!stderr.contains("bypass"), "NVML is Phos's: nothing to report\n{stderr}");
}
