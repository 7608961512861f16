//! Each target's seed corpus: valid inputs made by the code that writes the formats the
//! targets read (`phos_protocol`'s encoders, the API server itself, the checkpoint writer)
//! and by the real tools (nvcc for PTX, fat binaries and cubins from the project's CUDA test
//! programs; clang for the shipped and test policies), so that fuzzing starts deep inside
//! every format instead of at its first byte.
//!
//! nvcc and clang are optional (their seeds are then missing, with a notice), unless
//! `PHOS_REQUIRE_NVCC=1` or `PHOS_REQUIRE_CLANG=1`, as in the tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use phos_protocol::apis::Function;
use phos_protocol::cudart::{consts, *};
use phos_protocol::frame::{FLAG_ASYNC, FrameHeader, FrameKind, HANDSHAKE_VERSION};
use phos_protocol::handshake::{ApiVersion, Attach, Hello, LegacyHello, TransportKind, UsageReport, Welcome};
use phos_protocol::types::Dim3;
use phos_protocol::{Ptr, RemoteCall};

use crate::emu::{EmuServer, ScriptBuilder, append_call, function_index};
use crate::kernel::LaunchConfig;
use crate::reencode::FUNCTIONS;

/// Seeds: (file name, contents).
pub type Seeds = Vec<(String, Vec<u8>)>;

/// What makes a target's seeds.
pub type MakeSeeds = fn() -> Seeds;

/// Every target, with what makes its seeds.
pub const TARGETS: &[(&str, MakeSeeds)] = &[
    ("requests", requests),
    ("dispatch", dispatch),
    ("handshake", handshake),
    ("frames", frames),
    ("checkpoint_image", checkpoint_image),
    ("ptx_parse", ptx_parse),
    ("ptx_exec", ptx_exec),
    ("fatbin", fatbin),
    ("policy", policy),
    ("driver_inputs", driver_inputs),
];

/// `make()`, once per process (tools' outputs serve several targets).
fn once(cell: &'static std::sync::OnceLock<Seeds>, make: fn() -> Seeds) -> Seeds {
    cell.get_or_init(make).clone()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A tool on PATH; where `require` is set to 1 in the environment, its absence is fatal.
fn tool(name: &str, require: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        assert!(std::env::var(require).as_deref() != Ok("1"), "{name} is required ({require}=1) but not on PATH");
        eprintln!("notice: {name} is not on PATH; its seeds are left out");
    }
    found
}

/// A directory of this process for tool outputs, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("phos-fuzz-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `f` over `items` on a few threads (the tools are mostly single-threaded), in order.
fn parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a seed worker panicked")).collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// The project's CUDA sources: the end-to-end test programs and the PTX and interpreter tests'.
fn cuda_sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["tests/cuda", "ptx/tests/data", "ptx/tests/exec_data"] {
        let dir = repo().join(dir);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut files: Vec<PathBuf> = entries
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "cu"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// What nvcc makes of each source with `args` (e.g. `-ptx`), named after the source.
fn nvcc_each(sources: &[PathBuf], args: &[&str], ext: &str) -> Seeds {
    let Some(nvcc) = tool("nvcc", "PHOS_REQUIRE_NVCC") else { return Vec::new() };
    let scratch = Scratch::new("nvcc");
    let built = parallel(sources, |src| {
        let name = format!(
            "{}-{}.{ext}",
            src.parent().and_then(Path::file_name).unwrap_or_default().to_string_lossy(),
            src.file_stem().unwrap_or_default().to_string_lossy()
        );
        let out = scratch.0.join(&name);
        let status = Command::new(&nvcc)
            .args(args)
            .arg("-I")
            .arg(repo().join("tests/cuda"))
            .arg("-o")
            .arg(&out)
            .arg(src)
            .output()
            .expect("running nvcc");
        if !status.status.success() {
            eprintln!("notice: nvcc {args:?} {} failed; no seed from it", src.display());
            return None;
        }
        Some((name, std::fs::read(&out).expect("nvcc's output")))
    });
    built.into_iter().flatten().collect()
}

/// A kernel module written for the seeds: loops, shared memory, atomics, a module variable,
/// a device function and printf.
pub const SEED_PTX: &str = r#".version 7.0
.target sm_70
.address_size 64

.extern .func (.param .b32 func_retval0) vprintf(.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);
.global .align 4 .u32 counter = 5;
.global .align 1 .b8 fmt[11] = {107, 101, 114, 110, 101, 108, 32, 37, 100, 10, 0};

.func (.param .b32 out) twice(.param .b32 x)
{
	.reg .b32 %r<3>;
	ld.param.u32 %r1, [x];
	shl.b32 %r2, %r1, 1;
	st.param.b32 [out], %r2;
	ret;
}

.visible .entry scale(.param .u64 data, .param .u32 n)
{
	.reg .pred %p<3>;
	.reg .b32 %r<12>;
	.reg .b64 %rd<8>;
	.shared .align 4 .b8 partial[512];
	ld.param.u64 %rd1, [data];
	ld.param.u32 %r1, [n];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u32 %r2, %tid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %ctaid.x;
	mad.lo.s32 %r5, %r4, %r3, %r2;
	ld.global.u32 %r6, [counter];
	mov.u32 %r7, %r5;
LOOP:
	setp.ge.u32 %p1, %r7, %r1;
	@%p1 bra DONE;
	mul.wide.u32 %rd3, %r7, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.u32 %r8, [%rd4];
	mul.lo.s32 %r9, %r8, %r6;
	{
	.param .b32 arg;
	.param .b32 ret;
	st.param.b32 [arg], %r9;
	call.uni (ret), twice, (arg);
	ld.param.b32 %r9, [ret];
	}
	st.global.u32 [%rd4], %r9;
	add.s32 %r7, %r7, %r3;
	bra.uni LOOP;
DONE:
	and.b32 %r10, %r2, 127;
	shl.b32 %r10, %r10, 2;
	mov.u32 %r11, partial;
	add.s32 %r10, %r11, %r10;
	st.shared.u32 [%r10], %r2;
	bar.sync 0;
	atom.global.add.u32 %r11, [counter], 1;
	setp.ne.u32 %p2, %r5, 0;
	@%p2 bra END;
	{
	.local .align 8 .b8 args[8];
	.reg .b64 %a<3>;
	st.local.u32 [args], %r1;
	mov.u64 %a1, fmt;
	cvta.global.u64 %a1, %a1;
	mov.u64 %a2, args;
	cvta.local.u64 %a2, %a2;
	.param .b64 p0;
	.param .b64 p1;
	.param .b32 rv;
	st.param.b64 [p0], %a1;
	st.param.b64 [p1], %a2;
	call.uni (rv), vprintf, (p0, p1);
	}
END:
	ret;
}

.visible .entry spin(.param .u64 data, .param .u32 n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [data];
	ld.param.u32 %r1, [n];
	mov.u32 %r2, 0;
AGAIN:
	add.s32 %r2, %r2, 1;
	setp.lt.u32 %p1, %r2, %r1;
	@%p1 bra AGAIN;
	cvta.to.global.u64 %rd2, %rd1;
	st.global.u32 [%rd2], %r2;
	ret;
}
"#;

const H2D: i32 = consts::cudaMemcpyHostToDevice;
const D2H: i32 = consts::cudaMemcpyDeviceToHost;
const D2D: i32 = consts::cudaMemcpyDeviceToDevice;

fn load_module(s: &mut ScriptBuilder, image: &[u8]) -> Result<u64, phos_protocol::CudaError> {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(image);
    Ok(s.call(&PhosModuleLoadRequest { image, size: image.len() as u64, digest: &digest })?.module)
}

fn launch(
    s: &mut ScriptBuilder,
    function: u64,
    grid: u32,
    block: u32,
    stream: u64,
    params: &[u8],
) -> Result<PhosLaunchKernelReply, phos_protocol::CudaError> {
    s.call(&PhosLaunchKernelRequest {
        function,
        grid: Dim3::new(grid, 1, 1),
        block: Dim3::new(block, 1, 1),
        sharedMem: 0,
        stream,
        params,
        paramSize: params.len() as u64,
    })
}

fn params(data: u64, n: u32) -> Vec<u8> {
    let mut p = data.to_le_bytes().to_vec();
    p.extend_from_slice(&n.to_le_bytes());
    p
}

fn device_script() -> Vec<u8> {
    let mut s = ScriptBuilder::new();
    s.ok(&CudaGetDeviceCountRequest {});
    s.ok(&CudaGetDevicePropertiesRequest { device: 0 });
    s.ok(&CudaGetDevicePropertiesV2Request { device: 0 });
    for attr in [1, 16, 75, 97] {
        s.ok(&CudaDeviceGetAttributeRequest { attr, device: 0 });
    }
    s.ok(&CudaDriverGetVersionRequest {});
    s.ok(&CudaDeviceSetLimitRequest { limit: 0, value: 4096 });
    s.ok(&CudaDeviceGetLimitRequest { limit: 0 });
    s.ok(&CudaDeviceSetCacheConfigRequest { cacheConfig: 1 });
    s.ok(&CudaDeviceGetCacheConfigRequest {});
    s.ok(&CudaDeviceSetSharedMemConfigRequest { config: 2 });
    s.ok(&CudaDeviceGetSharedMemConfigRequest {});
    s.ok(&CudaDeviceGetStreamPriorityRangeRequest {});
    s.ok(&CudaDeviceCanAccessPeerRequest { device: 0, peerDevice: 0 });
    let _ = s.call(&CudaDeviceEnablePeerAccessRequest { peerDevice: 0, flags: 0 });
    s.ok(&CudaCtxResetPersistingL2CacheRequest {});
    s.ok(&CudaMemGetInfoRequest {});
    s.ok(&CudaDeviceSynchronizeRequest {});
    s.ok(&CudaDeviceResetRequest {});
    s.script
}

fn memory_script() -> Vec<u8> {
    let mut s = ScriptBuilder::new();
    let a = s.ok(&CudaMallocRequest { size: 4096 }).devPtr;
    let b = s.ok(&CudaMallocRequest { size: 3 << 20 }).devPtr;
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    s.ok(&CudaMemcpyRequest { dst: Ptr::Device(a), src: Ptr::In(&data), count: 4096, kind: H2D, direction: H2D });
    s.ok(&CudaMemsetRequest { devPtr: b, value: 7, count: 3 << 20 });
    s.ok(&CudaMemcpyRequest { dst: Ptr::Device(b), src: Ptr::Device(a), count: 4096, kind: D2D, direction: D2D });
    s.ok(&CudaMemcpyRequest { dst: Ptr::Out(4096), src: Ptr::Device(b), count: 4096, kind: D2H, direction: D2H });
    s.ok(&CudaMemsetAsyncRequest { devPtr: a, value: 1, count: 100, stream: 0 });
    s.ok(&CudaMemcpyAsyncRequest {
        dst: Ptr::Out(64),
        src: Ptr::Device(a + 64),
        count: 64,
        kind: consts::cudaMemcpyDefault,
        stream: 0,
        direction: D2H,
    });
    s.ok(&PhosMemcpy3DRequest {
        dst: Ptr::Device(b),
        dpitch: 256,
        dslice: 1024,
        src: Ptr::In(&data[..1024]),
        spitch: 128,
        sslice: 512,
        width: 128,
        height: 4,
        depth: 2,
        direction: H2D,
        stream: 0,
        ordered: 1,
    });
    s.ok(&PhosMemcpy3DRequest {
        dst: Ptr::Out(400),
        dpitch: 100,
        dslice: 200,
        src: Ptr::Device(b),
        spitch: 256,
        sslice: 1024,
        width: 100,
        height: 2,
        depth: 2,
        direction: D2H,
        stream: 0,
        ordered: 0,
    });
    s.ok(&PhosMemset3DRequest {
        dst: b,
        pitch: 256,
        slice: 1024,
        value: 3,
        width: 100,
        height: 4,
        depth: 2,
        stream: 0,
        ordered: 1,
    });
    s.ok(&PhosPointerDeviceRequest { ptr: a + 10 });
    let _ = s.call(&PhosHostAllocRequest { size: 4096, flags: 0 });
    s.ok(&CudaFreeRequest { devPtr: a });
    s.ok(&CudaFreeRequest { devPtr: b });
    s.script
}

fn stream_script() -> Vec<u8> {
    let mut s = ScriptBuilder::new();
    let buf = s.ok(&CudaMallocRequest { size: 1 << 16 }).devPtr;
    let st = s.ok(&CudaStreamCreateWithFlagsRequest { flags: 1 }).pStream;
    let st2 = s.ok(&CudaStreamCreateWithPriorityRequest { flags: 0, priority: -1 }).pStream;
    let e1 = s.ok(&CudaEventCreateRequest {}).event;
    let e2 = s.ok(&CudaEventCreateWithFlagsRequest { flags: 0 }).event;
    s.ok(&CudaEventRecordRequest { event: e1, stream: st });
    s.ok(&CudaMemsetAsyncRequest { devPtr: buf, value: 9, count: 1 << 16, stream: st });
    s.ok(&CudaStreamWaitEventRequest { stream: st2, event: e1, flags: 0 });
    s.ok(&CudaEventRecordWithFlagsRequest { event: e2, stream: st2, flags: 0 });
    s.ok(&CudaEventSynchronizeRequest { event: e2 });
    s.ok(&CudaEventElapsedTimeRequest { start: e1, end: e2 });
    s.ok(&CudaEventQueryRequest { event: e1 });
    s.ok(&CudaStreamQueryRequest { stream: st });
    s.ok(&CudaStreamGetPriorityRequest { hStream: st2 });
    s.ok(&CudaStreamGetFlagsRequest { hStream: st });
    s.ok(&CudaStreamGetDeviceRequest { hStream: st });
    s.ok(&CudaStreamGetIdRequest { hStream: st });
    s.ok(&PhosHostFuncEnqueueRequest { stream: st, gate: 1 });
    s.ok(&PhosHostFuncWaitRequest { gate: 1 });
    s.ok(&PhosHostFuncDoneRequest { gate: 1 });
    s.ok(&PhosHostFuncEnqueueRequest { stream: st2, gate: 2 });
    s.ok(&CudaMemcpyAsyncRequest {
        dst: Ptr::Out(16),
        src: Ptr::Device(buf),
        count: 16,
        kind: D2H,
        stream: st2,
        direction: D2H,
    });
    s.ok(&CudaStreamSynchronizeRequest { stream: st });
    s.ok(&CudaEventDestroyRequest { event: e1 });
    s.ok(&CudaStreamDestroyRequest { stream: st });
    s.script
}

/// The driver API on the runtime's session: devices, names cut to a buffer, and a stream the
/// runtime created, synchronised by the driver.
fn driver_script() -> Vec<u8> {
    use phos_protocol::cuda::*;
    let mut s = ScriptBuilder::new();
    s.ok(&CuInitRequest { Flags: 0 });
    s.ok(&CuDriverGetVersionRequest {});
    s.ok(&CuDeviceGetCountRequest {});
    s.ok(&CuDeviceGetRequest { ordinal: 0 });
    s.ok(&CuDeviceGetNameRequest { len: 8, dev: 0 });
    s.ok(&CuDeviceGetAttributeRequest { attrib: 75, dev: 0 });
    s.ok(&CuDeviceTotalMemV2Request { dev: 0 });
    let st = s.ok(&CudaStreamCreateRequest {}).pStream;
    let buf = s.ok(&CudaMallocRequest { size: 4096 }).devPtr;
    s.ok(&CudaMemsetAsyncRequest { devPtr: buf, value: 1, count: 4096, stream: st });
    s.ok(&CuStreamSynchronizeRequest { hStream: st });
    s.ok(&CuStreamSynchronizeRequest { hStream: 0 });
    s.script
}

fn module_script() -> Vec<u8> {
    let mut s = ScriptBuilder::new();
    let mut image = SEED_PTX.as_bytes().to_vec();
    image.push(0);
    let module = load_module(&mut s, &image).expect("the seed module loads");
    let scale = s.ok(&PhosModuleGetFunctionRequest { module, name: "scale" }).function;
    let spin = s.ok(&PhosModuleGetFunctionRequest { module, name: "spin" }).function;
    let counter = s.ok(&PhosModuleGetGlobalRequest { module, name: "counter" });
    s.ok(&CudaMemcpyToSymbolRequest {
        src: Ptr::In(&3u32.to_le_bytes()),
        count: 4,
        offset: 0,
        kind: H2D,
        symbol_base: counter.address,
        symbol_size: counter.bytes,
        direction: H2D,
    });
    let data = s.ok(&CudaMallocRequest { size: 4096 }).devPtr;
    let ones: Vec<u8> = [1u32; 1024].iter().flat_map(|v| v.to_le_bytes()).collect();
    s.ok(&CudaMemcpyRequest { dst: Ptr::Device(data), src: Ptr::In(&ones), count: 4096, kind: H2D, direction: H2D });
    s.ok(&PhosFuncGetAttributesRequest { function: scale });
    s.ok(&PhosFuncSetAttributeRequest { function: scale, attr: 8, value: 1024 });
    s.ok(&PhosFuncSetCacheConfigRequest { function: scale, config: 1 });
    s.ok(&PhosOccupancyMaxActiveBlocksRequest { function: scale, blockSize: 128, dynamicSMemSize: 0, flags: 0 });
    s.ok(&PhosOccupancyAvailableDynamicSMemRequest { function: scale, numBlocks: 2, blockSize: 128 });
    launch(&mut s, scale, 2, 128, 0, &params(data, 1024)).expect("the seed kernel runs");
    launch(&mut s, spin, 1, 32, 0, &params(data, 100)).expect("the seed kernel runs");
    let p = params(data, 64);
    let _ = s.call(&PhosLaunchCooperativeKernelRequest {
        function: scale,
        grid: Dim3::new(2, 1, 1),
        block: Dim3::new(32, 1, 1),
        sharedMem: 0,
        stream: 0,
        params: &p,
        paramSize: p.len() as u64,
    });
    s.ok(&CudaMemcpyFromSymbolRequest {
        dst: Ptr::Out(4),
        count: 4,
        offset: 0,
        kind: D2H,
        symbol_base: counter.address,
        symbol_size: counter.bytes,
        direction: D2H,
    });
    s.ok(&CudaMemcpyRequest { dst: Ptr::Out(4096), src: Ptr::Device(data), count: 4096, kind: D2H, direction: D2H });
    s.ok(&CudaDeviceSynchronizeRequest {});
    s.ok(&PhosModuleUnloadRequest { module });
    s.script
}

fn graph_script() -> Vec<u8> {
    let mut s = ScriptBuilder::new();
    let mut image = SEED_PTX.as_bytes().to_vec();
    image.push(0);
    let module = load_module(&mut s, &image).expect("the seed module loads");
    let scale = s.ok(&PhosModuleGetFunctionRequest { module, name: "scale" }).function;
    let a = s.ok(&CudaMallocRequest { size: 4096 }).devPtr;
    let b = s.ok(&CudaMallocRequest { size: 4096 }).devPtr;
    let st = s.ok(&CudaStreamCreateRequest {}).pStream;
    s.ok(&CudaStreamBeginCaptureRequest { stream: st, mode: 0 });
    s.ok(&CudaStreamIsCapturingRequest { stream: st });
    s.ok(&PhosStreamCaptureInfoRequest { stream: st });
    s.ok(&PhosStreamCaptureGraphRequest { stream: st, max: 4 });
    s.ok(&PhosStreamUpdateCaptureDependenciesRequest { stream: st, deps: &[], count: 0, flags: 0 });
    s.ok(&CudaMemsetAsyncRequest { devPtr: a, value: 1, count: 4096, stream: st });
    launch(&mut s, scale, 1, 64, st, &params(a, 256)).expect("a launch is captured");
    s.ok(&CudaMemcpyAsyncRequest {
        dst: Ptr::Device(b),
        src: Ptr::Device(a),
        count: 4096,
        kind: D2D,
        stream: st,
        direction: D2D,
    });
    let captured = s.ok(&CudaStreamEndCaptureRequest { stream: st }).pGraph;
    let exec = s.ok(&PhosGraphInstantiateRequest { graph: captured }).pGraphExec;
    s.ok(&CudaGraphUploadRequest { graphExec: exec, stream: st });
    s.ok(&CudaGraphLaunchRequest { graphExec: exec, stream: st });
    s.ok(&CudaStreamSynchronizeRequest { stream: st });

    let g = s.ok(&CudaGraphCreateRequest { flags: 0 }).pGraph;
    let n1 = s.ok(&PhosGraphAddEmptyNodeRequest { graph: g, deps: &[], numDeps: 0 }).pGraphNode;
    let dep = n1.to_le_bytes();
    let n2 = s
        .ok(&PhosGraphAddSetNodeRequest {
            graph: g,
            deps: &dep,
            numDeps: 1,
            dst: a,
            pitch: 256,
            value: 2,
            width: 256,
            height: 4,
        })
        .pGraphNode;
    let data = [5u8; 512];
    let n3 = s
        .ok(&PhosGraphAddCopyNodeRequest {
            graph: g,
            deps: &[],
            numDeps: 0,
            dst: b,
            dpitch: 256,
            dslice: 512,
            src: Ptr::In(&data),
            spitch: 256,
            sslice: 512,
            width: 256,
            height: 2,
            depth: 1,
            direction: H2D,
        })
        .pGraphNode;
    let p = params(b, 128);
    let dep3 = n3.to_le_bytes();
    let n4 = s
        .ok(&PhosGraphAddKernelNodeRequest {
            graph: g,
            deps: &dep3,
            numDeps: 1,
            function: scale,
            grid: Dim3::new(1, 1, 1),
            block: Dim3::new(32, 1, 1),
            sharedMem: 0,
            params: &p,
            paramSize: p.len() as u64,
        })
        .pGraphNode;
    s.ok(&PhosGraphAddDependenciesRequest {
        graph: g,
        from: &n2.to_le_bytes(),
        to: &n4.to_le_bytes(),
        numDependencies: 1,
    });
    s.ok(&PhosGraphNodesRequest { graph: g, max: 8 });
    s.ok(&CudaGraphNodeGetTypeRequest { node: n4 });
    let exec2 = s.ok(&PhosGraphInstantiateRequest { graph: g }).pGraphExec;
    s.ok(&CudaGraphLaunchRequest { graphExec: exec2, stream: 0 });
    let _ = s.call(&PhosGraphExecUpdateRequest { hGraphExec: exec, hGraph: g });
    s.ok(&CudaGraphExecDestroyRequest { graphExec: exec });
    s.ok(&CudaGraphDestroyRequest { graph: captured });
    s.ok(&CudaDeviceSynchronizeRequest {});
    s.script
}

/// A script per real nvcc-built fat binary: load it, then launch each of its kernels once
/// on fresh buffers (pointer parameters) and small counts (the rest).
fn fatbin_scripts(fatbins: &Seeds) -> Seeds {
    let mut out = Vec::new();
    for (name, image) in fatbins {
        let Some(ptx) = newest_ptx(image) else { continue };
        let Ok(module_ptx) = phos_ptx::parse(&ptx) else { continue };
        let mut s = ScriptBuilder::new();
        let Ok(module) = load_module(&mut s, image) else { continue };
        for kernel in module_ptx.entries() {
            let Ok(f) = s.call(&PhosModuleGetFunctionRequest { module, name: &kernel.name }) else { continue };
            let sig = phos_ptx::signature_of(kernel);
            let mut p = vec![0u8; sig.size as usize];
            for param in &sig.params {
                let value = if param.size == 8 { s.ok(&CudaMallocRequest { size: 1 << 16 }).devPtr } else { 256 };
                let n = (param.size as usize).min(8);
                p[param.offset as usize..param.offset as usize + n].copy_from_slice(&value.to_le_bytes()[..n]);
            }
            let _ = launch(&mut s, f.function, 2, 64, 0, &p);
        }
        let _ = s.call(&CudaDeviceSynchronizeRequest {});
        out.push((format!("module-{name}"), s.script));
    }
    out
}

/// The PTX of the newest virtual architecture in a fat binary.
fn newest_ptx(image: &[u8]) -> Option<String> {
    let fatbin = phos_fatbin::FatBinary::parse(image).ok()?;
    fatbin
        .entries()
        .flatten()
        .filter(|e| e.kind == phos_fatbin::EntryKind::Ptx)
        .max_by_key(|e| e.sm_arch)
        .and_then(|e| e.ptx_text().ok().flatten())
}

/// The shortest request of all zero bytes that decodes, per remote function: every field
/// zero, every buffer empty, every pointer a null device pointer.
fn zero_requests() -> Vec<(Function, Vec<u8>)> {
    FUNCTIONS
        .iter()
        .filter_map(|&f| {
            (0..1024)
                .map(|n| vec![0u8; n])
                .find(|zeros| matches!(crate::reencode::reencode_request(f, zeros), Some(Ok(_))))
                .map(|zeros| (f, zeros))
        })
        .collect()
}

/// Real fat binaries: the project's test programs, compiled for two real architectures and a
/// virtual one, with and without compression.
fn fat_binaries() -> Seeds {
    static DONE: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    once(&DONE, build_fat_binaries)
}

fn build_fat_binaries() -> Seeds {
    let sources: Vec<PathBuf> = ["vector_add", "shared_reduce", "atomics_histogram", "matmul_tiled", "struct_args"]
        .iter()
        .map(|n| repo().join(format!("tests/cuda/{n}.cu")))
        .collect();
    let arches = ["-gencode", "arch=compute_70,code=sm_70", "-gencode", "arch=compute_80,code=[sm_80,compute_80]"];
    let mut plain = vec!["-fatbin", "-Xfatbin", "-compress=false"];
    plain.extend(arches);
    let mut compressed = vec!["-fatbin", "-Xfatbin", "-compress-all"];
    compressed.extend(arches);
    let mut out = nvcc_each(&sources, &plain, "fatbin");
    out.extend(nvcc_each(&sources[..2], &compressed, "lz4.fatbin"));
    out
}

/// Every script, named.
fn scripts() -> Seeds {
    static DONE: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    once(&DONE, build_scripts)
}

fn build_scripts() -> Seeds {
    let mut out = vec![
        ("device".to_string(), device_script()),
        ("memory".to_string(), memory_script()),
        ("streams".to_string(), stream_script()),
        ("driver".to_string(), driver_script()),
        ("module".to_string(), module_script()),
        ("graphs".to_string(), graph_script()),
    ];
    out.extend(fatbin_scripts(&fat_binaries()));
    out
}

pub fn dispatch() -> Seeds {
    let mut out = scripts();
    for (id, zeros) in zero_requests() {
        let mut script = Vec::new();
        append_call(&mut script, id, &zeros);
        out.push((format!("zero-{}", id.name()), script));
    }
    out
}

/// The `requests` input for a call: its function's index, then the request.
fn request_input(function: Function, payload: &[u8]) -> Vec<u8> {
    let mut input = function_index(function).to_le_bytes().to_vec();
    input.extend_from_slice(payload);
    input
}

pub fn requests() -> Seeds {
    let mut out: Seeds =
        zero_requests().iter().map(|(id, zeros)| (format!("zero-{}", id.name()), request_input(*id, zeros))).collect();
    for (name, script) in scripts() {
        for (i, call) in crate::emu::script(&script).enumerate() {
            out.push((format!("{name}-{i}-{}", call.function.name()), request_input(call.function, call.payload)));
        }
    }
    out
}

pub fn handshake() -> Seeds {
    let hello = Hello {
        apis: ApiVersion::of_this_build(),
        pid: 4242,
        abi_major: 12,
        token: Some([7; 16]),
        program: "vector_add".into(),
        transports: vec![TransportKind::Shm, TransportKind::Unix],
        tenant_token: Some("s3cret".into()),
        host_arena: Some(1 << 20),
    };
    let first = Hello { token: None, tenant_token: None, host_arena: None, transports: Vec::new(), ..hello.clone() };
    // A guest built before there were several APIs.
    let legacy = LegacyHello {
        spec_hash: LEGACY_TEXT_HASHES[0],
        pid: 4242,
        abi_major: 11,
        token: None,
        program: "vector_add".into(),
        transports: vec![TransportKind::Shm],
        tenant_token: None,
        host_arena: Some(1 << 20),
    };
    let attach = Attach {
        apis: ApiVersion::of_this_build(),
        session: 3,
        tenant: "uid:1000".into(),
        abi_major: 12,
        transport: TransportKind::Shm,
    };
    let welcome = Welcome {
        session: 3,
        token: [9; 16],
        backend: "emu".into(),
        device_base: 0x6000_0000_0000,
        device_size: 1 << 40,
        device_count: 1,
        epoch: 2,
        transport: TransportKind::Vsock,
        max_payload: 4 << 30,
    };
    let report = UsageReport {
        held: vec![(3, 4096), (6, 0)],
        measured: vec![(4, 123_456, 7)],
        refused: vec![(0, 2)],
        barrier: false,
    };
    let tagged = |tag: u8, bytes: Vec<u8>| [vec![tag], bytes].concat();
    vec![
        ("hello".into(), tagged(0, phos_protocol::encode(&hello))),
        ("hello-first".into(), tagged(0, phos_protocol::encode(&first))),
        ("attach".into(), tagged(1, phos_protocol::encode(&attach))),
        ("welcome".into(), tagged(2, phos_protocol::encode(&welcome))),
        ("report".into(), tagged(3, phos_protocol::encode(&report))),
        ("barrier".into(), tagged(3, phos_protocol::encode(&UsageReport { barrier: true, ..Default::default() }))),
        ("hello-legacy".into(), tagged(4, phos_protocol::encode(&legacy))),
    ]
}

/// A stream of frames: a handshake, calls of both APIs (one async), a barrier, a reply.
fn frame_stream() -> Vec<u8> {
    let mut out = Vec::new();
    let mut frame = |kind: FrameKind, flags: u16, function: Option<Function>, call_id: u64, payload: &[u8]| {
        let mut h = FrameHeader::new(kind);
        if kind == FrameKind::Hello {
            h.version = HANDSHAKE_VERSION;
        }
        h.flags = flags;
        if let Some(f) = function {
            h.api = f.api().id();
            h.function = f.id();
        }
        h.session = 3;
        h.call_id = call_id;
        h.payload_len = payload.len() as u64;
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(payload);
    };
    let hello = &handshake()[0].1[1..];
    frame(FrameKind::Hello, 0, None, 0, hello);
    let malloc = phos_protocol::encode(&CudaMallocRequest { size: 4096 });
    frame(FrameKind::Call, 0, Some(CudaMallocRequest::FUNCTION), 1, &malloc);
    let memset =
        phos_protocol::encode(&CudaMemsetAsyncRequest { devPtr: 0x6000_0000_0000, value: 1, count: 16, stream: 0 });
    frame(FrameKind::Call, FLAG_ASYNC, Some(CudaMemsetAsyncRequest::FUNCTION), 2, &memset);
    frame(FrameKind::Barrier, 0, None, 0, &2u64.to_le_bytes());
    frame(FrameKind::Withdrawn, 0, None, 2, &[]);
    frame(FrameKind::Reply, 0, Some(CudaMallocRequest::FUNCTION), 1, &0x6000_0000_0000u64.to_le_bytes());
    let sync = phos_protocol::encode(&phos_protocol::cuda::CuStreamSynchronizeRequest { hStream: 0 });
    frame(FrameKind::Call, 0, Some(phos_protocol::cuda::CuStreamSynchronizeRequest::FUNCTION), 3, &sync);
    frame(FrameKind::Reply, 0, Some(phos_protocol::cuda::CuStreamSynchronizeRequest::FUNCTION), 3, &[]);
    frame(FrameKind::Refused, 0, None, 0, b"spec mismatch");
    out
}

pub fn frames() -> Seeds {
    let stream = frame_stream();
    let ring = |mode: u8, head: u64, data: &[u8]| {
        let mut input = vec![mode, 0, 0];
        input.extend_from_slice(&head.to_le_bytes());
        input.extend_from_slice(data);
        input
    };
    vec![
        ("stream".into(), [vec![0], stream.clone()].concat()),
        ("stream-charged".into(), [vec![2], stream.clone()].concat()),
        // Three bytes per read, charged to a budget.
        ("stream-trickle".into(), [vec![130], stream.clone()].concat()),
        ("ring".into(), ring(1, 0, &stream)),
        // The data wraps around the end of the ring.
        ("ring-wrapped-charged".into(), ring(3, (1 << 40) + 4096 - 100, &stream)),
    ]
}

pub fn checkpoint_image() -> Seeds {
    use phos_checkpoint::{Compression, ImageApi, ImageWriter, Manifest, Record, RegionKind, SessionMeta};
    let scratch = Scratch::new("images");
    let mut out = Vec::new();
    // Images of a live session, taken by the API server.
    let scripts = [module_script(), memory_script()];
    for (name, compression) in [("session-raw", Compression::None), ("session-zstd", Compression::Zstd(1))] {
        let server = EmuServer::new();
        for script in &scripts {
            for call in crate::emu::script(script) {
                let _ = server.call(call.function, call.device, call.payload, &mut Vec::new());
            }
        }
        let dir = scratch.0.join(name);
        let meta = SessionMeta { token: [3; 16], tenant: "uid:1000".into(), abi_major: 12, ..Default::default() };
        server
            .session()
            .checkpoint(
                &dir,
                meta,
                compression,
                false,
                &phos_api_server::checkpoint::Progress::default(),
                &phos_api_server::checkpoint::Bounds::default(),
            )
            .expect("checkpointing the seed session");
        out.push((name.to_string(), crate::image::input_of(&dir)));
    }
    // One with every kind of chunk and region, written directly.
    let dir = scratch.0.join("writer");
    let mut w = ImageWriter::create(&dir, Compression::Zstd(3), 4096).expect("creating an image");
    w.begin_region(0x6000_0000_0000, 3 * 4096, 0, RegionKind::Allocation);
    w.add_chunk(&[0u8; 4096]).expect("a zero chunk");
    w.add_chunk(&[0x55u8; 4096]).expect("a compressible chunk");
    let noise: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    w.add_chunk(&noise).expect("a raw chunk");
    w.begin_region(0x7000_0000, 8, 0, RegionKind::ModuleVariable { module: 1, name: "counter".into() });
    w.add_chunk(&[1, 2, 3, 4, 5, 6, 7, 8]).expect("a small chunk");
    let manifest = Manifest {
        apis: ApiVersion::of_this_build()
            .into_iter()
            .map(|a| ImageApi { id: a.id, name: a.name, version: a.version, hash: a.hash })
            .collect(),
        created_ms: 1_700_000_000_000,
        session: SessionMeta {
            id: 5,
            token: [4; 16],
            tenant: "uid:1000".into(),
            program: "vector_add".into(),
            abi_major: 12,
            backend: "emu".into(),
            device_base: 0x6000_0000_0000,
            device_size: 1 << 30,
            devices: vec!["emu".into()],
            epoch: 1,
        },
        handle_counters: vec![("stream".into(), 3)],
        records: vec![Record {
            api: CudaMallocRequest::FUNCTION.api().id(),
            function: CudaMallocRequest::FUNCTION.id(),
            name: "cudaMalloc".into(),
            device: 0,
            payload: phos_protocol::encode(&CudaMallocRequest { size: 3 * 4096 }),
            creates: vec![("device_memory".into(), 0x6000_0000_0000)],
        }],
        ..Default::default()
    };
    w.finish(manifest).expect("finishing the image");
    out.push(("writer".to_string(), crate::image::input_of(&dir)));
    out
}

/// PTX texts: the module written for the seeds, and nvcc's PTX for every CUDA source.
fn ptx_texts() -> Seeds {
    static DONE: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    once(&DONE, build_ptx_texts)
}

fn build_ptx_texts() -> Seeds {
    let mut out = vec![("seed.ptx".to_string(), SEED_PTX.as_bytes().to_vec())];
    out.extend(nvcc_each(&cuda_sources(), &["-ptx", "-arch=compute_80"], "ptx"));
    out
}

pub fn ptx_parse() -> Seeds {
    ptx_texts()
}

pub fn ptx_exec() -> Seeds {
    let mut out = Vec::new();
    for (name, text) in ptx_texts() {
        let kernels = std::str::from_utf8(&text)
            .ok()
            .and_then(|t| phos_ptx::parse(t).ok())
            .map_or(1, |m| m.entries().count().clamp(1, 8));
        for kernel in 0..kernels as u8 {
            let config = LaunchConfig { kernel, grid: 1, block: [63, 0], shared: 0, value: 100 };
            out.push((format!("{name}-{kernel}"), [config.encode(), text.clone()].concat()));
        }
    }
    out
}

pub fn fatbin() -> Seeds {
    let mut out = fat_binaries();
    // Zstandard-compressed entries (CUDA 13's default), made from the uncompressed ones.
    let recompressed: Seeds = out
        .iter()
        .filter(|(name, _)| !name.contains("lz4"))
        .take(2)
        .filter_map(|(name, bytes)| Some((name.replace(".fatbin", ".zstd.fatbin"), zstd_fatbin(bytes)?)))
        .collect();
    out.extend(recompressed);
    let cubin_sources: Vec<PathBuf> =
        ["vector_add", "struct_args"].iter().map(|n| repo().join(format!("tests/cuda/{n}.cu"))).collect();
    out.extend(nvcc_each(&cubin_sources, &["-cubin", "-arch=sm_80"], "cubin"));
    out
}

/// A fat binary with every entry compressed as one Zstandard frame, as CUDA 13 writes them.
fn zstd_fatbin(plain: &[u8]) -> Option<Vec<u8>> {
    const HEADER: usize = 16;
    let total = u64::from_le_bytes(plain.get(8..16)?.try_into().ok()?) as usize;
    let mut entries = Vec::new();
    let mut at = HEADER;
    while at < HEADER + total {
        let header_size = u32::from_le_bytes(plain.get(at + 4..at + 8)?.try_into().ok()?) as usize;
        let payload_size = u64::from_le_bytes(plain.get(at + 8..at + 16)?.try_into().ok()?) as usize;
        let mut header = plain.get(at..at + header_size)?.to_vec();
        let payload = plain.get(at + header_size..at + header_size + payload_size)?;
        let mut compressed = zstd::bulk::compress(payload, 3).ok()?;
        let compressed_len = compressed.len();
        compressed.resize(compressed_len.next_multiple_of(8), 0);
        header[8..16].copy_from_slice(&(compressed.len() as u64).to_le_bytes());
        header[16..20].copy_from_slice(&(compressed_len as u32).to_le_bytes());
        let flags = u64::from_le_bytes(header[40..48].try_into().ok()?) | 0x8000;
        header[40..48].copy_from_slice(&flags.to_le_bytes());
        header[56..64].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        entries.extend_from_slice(&header);
        entries.extend_from_slice(&compressed);
        at += header_size + payload_size;
    }
    let mut out = plain[..8].to_vec();
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    out.extend_from_slice(&entries);
    Some(out)
}

pub fn policy() -> Seeds {
    let context = 0x0123_4567_89ab_cdefu64.to_le_bytes();
    let mut out: Seeds = phos_policy::shipped::SHIPPED
        .iter()
        .map(|(name, elf)| (format!("shipped-{name}.o"), [&context[..], elf].concat()))
        .collect();
    if tool("clang", "PHOS_REQUIRE_CLANG").is_some() {
        let mut sources = Vec::new();
        for dir in ["tests/policies", "ebpf-policy/tests/programs"] {
            let dir = repo().join(dir);
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            sources.extend(
                entries
                    .map(|e| e.expect("a directory entry").path())
                    .filter(|p| p.extension().is_some_and(|e| e == "c")),
            );
        }
        sources.sort();
        let scratch = Scratch::new("policies");
        let clang = std::env::var("PHOS_CLANG").unwrap_or_else(|_| "clang".into());
        for src in sources {
            let name = format!("{}.o", src.file_stem().unwrap_or_default().to_string_lossy());
            let obj = scratch.0.join(&name);
            match phos_policy::build(&src, &obj, &clang) {
                Ok(()) => out.push((name, [&context[..], &std::fs::read(&obj).expect("clang's output")].concat())),
                Err(e) => eprintln!("notice: {}: {e}; no seed from it", src.display()),
            }
        }
    }
    out
}

/// A link of one PTX module and of two inputs with options, and tensor map arguments of a
/// tiled and an im2col map (each after its selector byte).
pub fn driver_inputs() -> Seeds {
    use phos_protocol::jit_link::{Input, LinkInputs, input_type};
    use phos_protocol::tensor_map::{Kind, Params};
    let ptx = b".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry k() { ret; }\n";
    let one = LinkInputs {
        options: vec![],
        info_log: 256,
        error_log: 256,
        inputs: vec![Input { kind: input_type::PTX, name: b"a.ptx", options: vec![], data: ptx }],
    };
    let two = LinkInputs {
        options: vec![(0, 32), (7, 3)],
        info_log: 0,
        error_log: 1024,
        inputs: vec![
            Input { kind: input_type::PTX, name: b"a.ptx", options: vec![(7, 1)], data: ptx },
            Input { kind: input_type::FATBINARY, name: b"b.fatbin", options: vec![], data: &[0x50, 0xed, 0x55, 0xba] },
        ],
    };
    let tiled = Params {
        kind: Kind::Tiled,
        data_type: 7,
        rank: 2,
        address: 0x7000_0000_0100,
        dims: [64, 32, 0, 0, 0],
        strides: [256, 0, 0, 0],
        box_dim: [32, 8, 0, 0, 0],
        element_strides: [1, 1, 0, 0, 0],
        interleave: 0,
        swizzle: 0,
        l2_promotion: 0,
        oob_fill: 0,
        lower: [0; 3],
        upper: [0; 3],
        channels_per_pixel: 0,
        pixels_per_column: 0,
        mode: 0,
    };
    let im2col = Params {
        kind: Kind::Im2col,
        rank: 4,
        dims: [16, 8, 8, 2, 0],
        strides: [64, 512, 4096, 0],
        box_dim: [16, 0, 0, 0, 0],
        element_strides: [1, 1, 1, 1, 0],
        lower: [-1, -1, 0],
        upper: [1, 1, 0],
        channels_per_pixel: 16,
        pixels_per_column: 32,
        ..tiled
    };
    vec![
        ("link-one.bin".into(), [&[0u8][..], &one.encode()].concat()),
        ("link-two.bin".into(), [&[0u8][..], &two.encode()].concat()),
        ("map-tiled.bin".into(), [&[1u8][..], &tiled.encode()].concat()),
        ("map-im2col.bin".into(), [&[1u8][..], &im2col.encode()].concat()),
    ]
}
