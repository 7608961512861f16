//! The PTX interpreter behind Phos's `emu` backend: runs kernels on the CPU with the GPU's results.
//!
//! # Overview
//!
//! [`Program::new`] lowers every function of a parsed [`crate::Module`] once into a compact IR (module `ir`); the
//! backend then binds the module's `.global`/`.const` variables to host addresses ([`Program::bind_variables`]) and
//! calls [`run`] for each launch. Lowering never fails as a whole: a function using something the interpreter does
//! not implement keeps a [`ExecError::Unsupported`] naming the instruction and its PTX line, reported when a kernel
//! that can reach it is launched, before any thread runs.
//!
//! # The IR
//!
//! Each instruction is an `Op` with its operands resolved: registers are dense indices into a function's register
//! file (`%r<100>` is 100 consecutive slots), immediates are bit patterns already converted to the operand type,
//! branch targets are instruction indices, and symbols become one of a few address kinds: a module variable (its
//! bound host address), a shared variable (its offset in the kernel's shared-memory layout, fixed per launch), a slot
//! of the current call frame (`.local` variables and the `.param` slots of call sequences), or a kernel parameter
//! (an address in the parameter window). Opcode plus modifiers select the op and its mode fields (rounding, `.ftz`,
//! `.sat`, comparison, shift or shuffle mode); every modifier must be understood, otherwise the instruction is
//! unsupported rather than silently approximated. Cache and memory-ordering qualifiers are the exception: they
//! cannot change what a thread reads here, so they are accepted and dropped.
//!
//! # Warps, divergence and scheduling
//!
//! Threads run in warps of 32 lanes. A warp's registers are stored structure-of-arrays, `regs[r * 32 + lane]`, as
//! 64-bit bit patterns, so an instruction is decoded once and applied to all lanes in a tight loop over arrays (the
//! lanes that are not active keep their old values). Narrow values are kept zero-extended (or sign-extended for
//! signed results) and every reader truncates to its operand width, which gives PTX's sub-word register semantics.
//!
//! Each lane has its own program counter. The warp always executes the lowest pc among its runnable lanes, for all
//! the lanes at that pc (the *group*); this min-pc rule makes lanes that diverged at a branch reconverge at the first
//! instruction they share, which for the structured code nvcc emits is the immediate post-dominator. The group's pc
//! is kept in one place while it runs straight-line code and lanes are only looked at again after a divergent
//! branch, a `ret`/`exit`, or when the group reaches the pc of another waiting lane (then they merge).
//!
//! Calls push a frame (the callee's register file, its per-lane pcs and its slice of local memory) holding just the
//! calling lanes; the frame pops when all of them have returned or exited, copying return values back. Warp
//! collectives (`shfl.sync`, `vote.sync`, `match.sync`, `redux.sync`, `bar.warp.sync`, `elect.sync`) execute only
//! once every non-exited lane of their member mask is at the same instruction: lanes that arrive early wait (are not
//! runnable) until the others catch up. If only waiting lanes remain, the lowest group runs with whoever is there,
//! so a wrong mask cannot hang the interpreter.
//!
//! # Blocks and barriers
//!
//! A block's warps run on one OS thread, round-robin: each warp runs until it blocks at a barrier, finishes, or uses
//! its time slice (slices keep spin-waiting warps from starving the others, and a warp yields after each `printf` so
//! output interleaves across warps as it does on the GPU). `bar.sync`/`barrier.sync` (with an optional thread count),
//! `bar.arrive` and `bar.red.{popc,and,or}` count arriving threads per barrier id; a barrier completes when the count
//! (or, without one, every thread of the block that has not exited) has arrived, and then releases its waiters. A
//! pass over all warps in which none can run is a deadlock and ends the launch with an error instead of hanging.
//! Blocks are independent and run in parallel on `workers` threads; each keeps its own printf buffer and the
//! buffers are appended in block-index order, so output does not depend on thread timing. [`run_with`] can bound the
//! work of a launch ([`RunOptions::max_warp_instructions`]), so that a kernel that never ends becomes an
//! [`ExecError::Timeout`] instead of a hung server thread.
//!
//! # Memory
//!
//! * `.global` and `.const` are host memory: the backend maps device memory at its device addresses. Every access is
//!   checked against [`GlobalMemory::region`] (the last region is cached per worker) and for natural alignment
//!   before it is performed, with relaxed atomic loads and stores (so concurrent blocks race like GPU threads, not
//!   like undefined Rust). Atomics use the host's atomic instructions, CAS loops where there is none (float add,
//!   `inc`/`dec`).
//! * `.shared` is a per-block buffer laid out per kernel: the static shared variables the kernel can reach, then the
//!   dynamic `extern .shared` area of [`Launch::dynamic_shared`] bytes. Shared addresses are offsets in it.
//! * `.local` is per thread: a stack of call frames in a per-warp buffer (one stride per lane). Local addresses are
//!   offsets in the thread's stack.
//! * `.param`: kernel parameters are the launch's parameter buffer (read-only); `.func` parameters and return
//!   values, and the `.param` slots of call sequences, live in the frames in local memory.
//! * Generic addresses: global addresses are themselves; shared, local and kernel-parameter addresses are placed in
//!   windows at `0xF1..`, `0xF2..` and `0xF3..` in the top byte, which no user-space host address can have, so a
//!   generic access dispatches on the top byte and `cvta`/`isspacep` are arithmetic.
//!
//! # Arithmetic
//!
//! Integer results are exact, including PTX's clamped shifts, `.hi`/`.wide` products, carry chains, `bfe`/`bfi`,
//! `prmt` modes and division by zero. Float add/sub/mul/fma/div/sqrt in round-to-nearest use the host FPU (IEEE 754,
//! as on the GPU); the directed modes and `f16`/`bf16` use an exact soft-float (`float`). `.ftz` flushes subnormal
//! inputs and results to sign-preserving zero, `.sat` clamps to [0, 1] with NaN to 0, and float-to-integer
//! conversions saturate.
//!
//! Where PTX leaves a result to the implementation, the interpreter does what an H100 does, as recorded by
//! `tests/exec_data/probe.cu` (one inline-PTX instruction per case, 16,000 cases of edge and random inputs, results in
//! `tests/exec_data/probe_h100.txt`, replayed by the tests):
//!
//! * f32 NaN results are always `0x7fffffff`; f64 NaN results propagate the operand's NaN (quietened, a quiet one
//!   preferred) and are `0xfff8000000000000` when generated; conversions between f32 and f64 keep the payload.
//! * Integer division by zero gives all ones (quotient of a negative signed dividend: 1); remainder by zero gives
//!   all ones.
//! * Float-to-integer conversion of NaN gives 0 for 8/16/32-bit results from f32, `0x80000000` for 32-bit results
//!   from f64, and `0x8000000000000000` for 64-bit results.
//! * `testp.normal` is true for zeros; `bfe.{s,u}64` reads whole position and length operands.
//!
//! The `.approx` instructions (`sin`, `cos`, `lg2`, `ex2`, `rsqrt`, `tanh`, `rcp.approx`, `div.approx`/`.full`,
//! `sqrt.approx`) are computed in double precision and rounded: on the probe's inputs 65-95% of the results are
//! bit-identical to the H100 and the rest are within 1-2 ulp (`lg2` 10, `tanh` 114). `sin`/`cos`.approx reduce the
//! argument in f32 as the GPU does (so sin(2^31) is 0 on both), but the GPU's result has an absolute error of about
//! 1e-6 that grows with the argument, so only 25-40% are bit-identical. `rcp.approx.ftz.f64` reproduces the
//! hardware's high-word-only result. Library functions built on these (`expf` uses `ex2.approx`, `rsqrtf` uses
//! `rsqrt.approx`) can differ in the last bit from a GPU; the full-precision math library (`sinf`, `logf`, `exp`,
//! `pow`, ...) is plain PTX arithmetic and matches bit for bit.
//!
//! # printf and assert
//!
//! `vprintf` is implemented (see `printf`), formatting like glibc into the block's buffer; as on the GPU it returns
//! the number of arguments, and a launch's output is capped ([`PRINTF_BUDGET`]). `__assertfail` prints the GPU's
//! assertion message and stops the launch with [`ExecError::Assert`] (CUDA error 710).
//!
//! # Textures and surfaces
//!
//! Texture and surface objects are 64-bit handles, resolved at each instruction through the [`Resources`] given to
//! [`run_with_resources`] ([`run`] and [`run_with`] give none, so every handle is invalid). A [`Texture`] is a
//! [`Resource`] (a CUDA array or mipmapped array, an [`ArrayDesc`] with a [`Level`] per mip level giving its base
//! address, extent and pitches; linear memory; pitched 2D memory) and a [`TextureDesc`] (CUDA's `cudaTextureDesc`); a
//! [`Surface`] is an array. Texels are read and written at the addresses the descriptors give, each access checked
//! against [`GlobalMemory`] like any global access, so a descriptor naming freed memory is an illegal address, not a
//! crash. A handle that is no object of its kind is [`ExecError::InvalidHandle`] (`cudaErrorIllegalAddress`).
//!
//! The instructions are `tex` (`.1d`, `.2d`, `.3d`, `.a1d`, `.a2d`, `.cube`, `.acube`; float or integer coordinates;
//! `.base`, `.level`, `.grad`; the `d|p` residency predicate is always true), `tld4` (`.r/.g/.b/.a` of `.2d`, `.a2d`,
//! `.cube`, `.acube`), `txq` (with `.level`), `suld.b`, `sust.b`, `sust.p` and `suq`: the forms nvcc emits for CUDA's
//! texture and surface functions, in unified mode. Sampling follows the CUDA Programming Guide's texture-fetching
//! appendix:
//!
//! * Normalized coordinates are multiplied by the level's size (in f32); a NaN coordinate reads as 0.
//! * Nearest point reads texel `floor(x)`. Linear filtering reads texels `i = floor(x - 0.5)` and `i + 1` with weight
//!   `a = frac(x - 0.5)` in 9-bit fixed point with 8 fractional bits (rounded to nearest, which reproduces published
//!   GPU results), per dimension; each corner's weight, the product of its fractions, is rounded to nearest in the
//!   same 8-bit fixed point (as an H100 does: it shows at border addressing, where the corners' weights do not
//!   cancel); the weighted sum is exact and rounded once to f32. Mipmapped textures blend two levels the same way.
//! * Addressing applies to texel indices, per dimension: clamp, border (the border colour), wrap, and mirror (period
//!   `2N`, OpenGL's mirrored repeat). CUDA supports wrap and mirror only with normalized coordinates; without them they
//!   clamp.
//! * Normalized-float reads map `n`-bit unsigned integers to `x / (2^n - 1)` and signed ones to `x / (2^(n-1) - 1)`
//!   clamped to -1; element-type reads sign- or zero-extend integers and widen f16. Channels the format lacks read
//!   (0, 0, 0, 1). sRGB converts R, G and B of 8-bit unsigned normalized formats by the sRGB formula. The border
//!   colour is returned whole (its bits, for textures returning integers).
//! * `tex1Dfetch` on linear memory, and integer coordinates, read one texel without filtering or addressing; outside
//!   the texture they read zero. Layer indices are unsigned and clamp to the last layer.
//! * Cubemaps: the major axis picks the face (ties: x, then y, then z) and the other two give face coordinates
//!   `(s / m + 1) / 2` per the Guide's table, sampled with the texture's addressing within the face (lookups do not
//!   filter across faces; `seamless_cubemap` is not implemented).
//! * Level of detail: the `tex.level` operand, 0 for plain `tex`, or for `tex.grad` the log2 of the longer derivative
//!   in texels (for cubemaps, the direction's derivatives times half the face size); plus the bias, clamped to the level clamps and the levels there are. A point mipmap filter takes the
//!   nearest level (halves round down). Anisotropy is not implemented (`max_anisotropy` is ignored).
//! * `tld4` gathers one component of the linear-filtering footprint, counter-clockwise from the lower left:
//!   `T[i, j+1], T[i+1, j+1], T[i+1, j], T[i, j]`.
//! * Surfaces: `x` is a byte offset (`sust.p`: an element index). Out of range, `.trap` fails the launch
//!   (`cudaErrorLaunchFailure`, naming the access), `.clamp` accesses the nearest element, `.zero` loads zero and
//!   drops stores. Misaligned offsets (undefined in PTX) are rounded down.
//! * `txq`/`suq` answer extents (beyond the last level, level 0's halved), OpenCL's channel type and order
//!   enumerations, and PTX's addressing-mode enumeration.
//!
//! Where CUDA does not define the result (NaN coordinates, wrap with unnormalized coordinates, the border colour of
//! integer textures, missing channels, out-of-range layers, cubemap ties, `txq` encodings, error codes), the choices
//! above are to be checked against `tests/exec_data/texture_probe.cu`, which records the same cases on a GPU for the
//! tests to replay bit for bit.
//!
//! # Not supported
//!
//! Reported as [`ExecError::Unsupported`]: texture, sampler and surface references (`.texref`, `.samplerref`,
//! `.surfref`, removed in CUDA 12) and the texture forms nvcc does not emit (a separate sampler, coordinate offsets,
//! depth comparison, `.f16`/`.f16x2` results, multisample textures, `sured`), `wmma`/`mma`/`wgmma`/`ldmatrix` (tensor
//! cores), `mbarrier`, bulk and tensor copies (`cp.async.bulk`, TMA), clusters of more than one block (the
//! `%cluster_*` registers describe single-block clusters and `barrier.cluster` is the block's barrier), packed f16x2
//! comparisons, `.approx` functions of f16 types, fp8 conversions, `malloc`/`free` in device code. `cp.async` is
//! supported as a synchronous copy.

mod alu;
mod float;
mod ir;
mod lower;
mod machine;
mod printf;
mod texture;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use crate::ast::{Module, StateSpace};
use ir::Func;
use lower::{LowerError, RelocTarget, SharedVar};
use machine::{Ctx, Fault, Worker};
pub use texture::{
    AddressMode, ArrayDesc, ArrayKind, ChannelFormat, ChannelType, FilterMode, Level, NoResources, ReadMode, Resource,
    ResourceTable, Resources, Surface, Texture, TextureDesc, TextureError,
};

/// Generic-address window of shared memory (top byte 0xF1).
pub const SHARED_WINDOW: u64 = 0xF100_0000_0000_0000;
/// Generic-address window of local memory (top byte 0xF2).
pub const LOCAL_WINDOW: u64 = 0xF200_0000_0000_0000;
/// Addresses of kernel parameters (top byte 0xF3); both their `.param` and generic addresses.
pub const PARAM_WINDOW: u64 = 0xF300_0000_0000_0000;
/// "Addresses" of functions, for indirect calls (top byte 0xF4).
pub const FUNC_WINDOW: u64 = 0xF400_0000_0000_0000;

/// Bytes of printf output one launch may produce; later output is dropped (the GPU's printf FIFO is 1 MiB of
/// records by default, which holds several MiB of text).
pub const PRINTF_BUDGET: i64 = 8 << 20;

/// Largest shared memory a block may use (H100: 227 KiB).
pub const MAX_SHARED: u64 = 227 * 1024;

/// A module-scope variable that needs device storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariableInfo {
    pub name: String,
    pub space: StateSpace,
    pub size: u64,
    pub align: u64,
}

/// What the backend needs to know about a kernel before launching it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    /// Bytes of the parameter buffer.
    pub param_size: u64,
    /// Bytes of static shared memory (variables the kernel can reach).
    pub static_shared: u64,
    /// Bytes of local memory per thread of the kernel's own frame.
    pub local_size: u64,
    /// Why the kernel cannot run, if it cannot.
    pub error: Option<ExecError>,
}

/// Launch geometry and arguments.
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared: u32,
    pub params: &'a [u8],
}

/// Global memory the kernel may touch.
///
/// Accesses are performed through raw pointers at the address itself (the emu backend maps device memory at its
/// device addresses in this process), but only after the interpreter has checked that the access lies inside a
/// region returned here: an access outside every region is an [`ExecError::IllegalAddress`], never a segfault.
pub trait GlobalMemory: Sync {
    /// The region containing `addr` (an allocation or a module variable), if any.
    fn region(&self, addr: u64) -> Option<std::ops::Range<u64>>;
}

/// Statistics of a completed launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instructions executed, counted once per thread of the executing group (predicated-off threads included).
    pub thread_instructions: u64,
    pub blocks: u64,
}

/// Why a launch failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("no kernel named `{0}`")]
    NotFound(String),
    #[error("kernel `{kernel}` uses an unsupported instruction at PTX line {line}: {instruction}")]
    Unsupported { kernel: String, instruction: String, line: u32 },
    #[error("kernel `{kernel}`: illegal address {address:#x} at PTX line {line}")]
    IllegalAddress { kernel: String, line: u32, address: u64 },
    #[error("kernel `{kernel}`: {handle:#x} is not a {} object (PTX line {line})", if *surface { "surface" } else { "texture" })]
    InvalidHandle { kernel: String, line: u32, handle: u64, surface: bool },
    #[error("kernel `{kernel}`: misaligned address {address:#x} at PTX line {line}")]
    MisalignedAddress { kernel: String, line: u32, address: u64 },
    #[error("kernel `{kernel}`: trap at PTX line {line}")]
    Trap { kernel: String, line: u32 },
    #[error("kernel `{kernel}`: assertion `{message}` failed (PTX line {line})")]
    Assert { kernel: String, line: u32, message: String },
    #[error("kernel `{kernel}`: call stack overflow at PTX line {line}")]
    StackOverflow { kernel: String, line: u32 },
    #[error("kernel `{kernel}`: threads can never leave the barrier or warp-sync at PTX line {line}")]
    Deadlock { kernel: String, line: u32 },
    #[error("kernel `{kernel}`: launch failure at PTX line {line}: {reason}")]
    LaunchFailure { kernel: String, line: u32, reason: String },
    #[error("kernel `{kernel}` ran past its limit of {limit} warp-instructions per worker (PTX line {line})")]
    Timeout { kernel: String, line: u32, limit: u64 },
    #[error("invalid launch configuration: {0}")]
    InvalidConfiguration(String),
}

impl ExecError {
    /// The `cudaError_t` a GPU would report.
    pub fn cuda_error(&self) -> i32 {
        match self {
            ExecError::NotFound(_) => 500,
            ExecError::Unsupported { .. } => 801,
            ExecError::IllegalAddress { .. } | ExecError::InvalidHandle { .. } => 700,
            ExecError::MisalignedAddress { .. } => 716,
            ExecError::Trap { .. } | ExecError::StackOverflow { .. } | ExecError::LaunchFailure { .. } => 719,
            ExecError::Assert { .. } => 710,
            ExecError::Deadlock { .. } | ExecError::Timeout { .. } => 702,
            ExecError::InvalidConfiguration(_) => 9,
        }
    }
}

/// A module prepared for execution.
pub struct Program {
    /// Lowered functions; those that failed to lower are empty stand-ins with an entry in `errors`.
    pub(crate) funcs_ok: Vec<Func>,
    errors: Vec<Option<LowerError>>,
    func_index: HashMap<String, u32>,
    vars: Vec<VariableInfo>,
    var_bytes: Vec<Vec<u8>>,
    var_relocs: Vec<Vec<lower::Reloc>>,
    pub(crate) var_addrs: Vec<u64>,
    shared: Vec<SharedVar>,
    address_taken: Vec<u32>,
}

/// A kernel's shared-memory layout and the functions it can reach.
struct Layout {
    offsets: Vec<u32>,
    static_size: u64,
    dyn_base: u64,
    error: Option<LowerError>,
}

impl Program {
    /// Lowers every function of `module`.
    pub fn new(module: &Module) -> Program {
        let l = lower::lower_module(module);
        let mut funcs_ok = Vec::new();
        let mut errors = Vec::new();
        let names: Vec<String> = {
            let mut v = vec![String::new(); l.funcs.len()];
            for (n, i) in &l.func_index {
                v[*i as usize] = n.clone();
            }
            v
        };
        for (i, f) in l.funcs.into_iter().enumerate() {
            match f {
                Ok(f) => {
                    funcs_ok.push(f);
                    errors.push(None);
                }
                Err(e) => {
                    funcs_ok.push(Func {
                        name: names[i].clone(),
                        is_entry: module.function(&names[i]).is_some_and(|f| f.kind == crate::FunctionKind::Entry),
                        code: Vec::new(),
                        nregs: 1,
                        frame_size: 0,
                        frame_align: 16,
                        params: Vec::new(),
                        rets: Vec::new(),
                        param_size: module.function(&names[i]).map_or(0, |f| crate::signature_of(f).size),
                        shared_refs: Vec::new(),
                        callees: Vec::new(),
                        indirect_calls: false,
                    });
                    errors.push(Some(e));
                }
            }
        }
        let nvars = l.vars.len();
        Program {
            funcs_ok,
            errors,
            func_index: l.func_index,
            vars: l.vars,
            var_bytes: l.var_bytes,
            var_relocs: l.var_relocs,
            var_addrs: vec![0; nvars],
            shared: l.shared,
            address_taken: l.address_taken,
        }
    }

    /// Module-scope variables that need device storage (`.global` and `.const`, including printf format strings),
    /// in declaration order.
    pub fn variables(&self) -> &[VariableInfo] {
        &self.vars
    }

    /// Records where each variable of [`Program::variables`] lives, and returns each variable's initial contents with
    /// address initializers (`generic(x)`, `x+4`, function addresses) resolved: the initialized prefix of each, which
    /// may be shorter than the variable (or empty); the rest starts as zeros.
    pub fn bind_variables(&mut self, addresses: &[u64]) -> Vec<Vec<u8>> {
        for (i, a) in self.var_addrs.iter_mut().enumerate() {
            *a = addresses.get(i).copied().unwrap_or(0);
        }
        let mut out = self.var_bytes.clone();
        for (bytes, relocs) in out.iter_mut().zip(&self.var_relocs) {
            for r in relocs {
                let base = match r.target {
                    RelocTarget::Var(v) => self.var_addrs.get(v as usize).copied().unwrap_or(0),
                    RelocTarget::Func(f) => FUNC_WINDOW + f as u64,
                    RelocTarget::Unknown => 0,
                };
                let v = base.wrapping_add(r.addend as u64).to_le_bytes();
                let (o, n) = (r.offset as usize, (r.size as usize).min(8));
                if let Some(dst) = bytes.get_mut(o..o + n) {
                    dst.copy_from_slice(&v[..n]);
                }
            }
        }
        out
    }

    pub(crate) fn func_ok(&self, i: u32) -> bool {
        self.errors.get(i as usize).is_some_and(|e| e.is_none())
    }

    fn entry(&self, name: &str) -> Option<u32> {
        self.func_index.get(name).copied().filter(|&i| self.funcs_ok[i as usize].is_entry)
    }

    /// Information about kernel `name`, if the module defines it.
    pub fn kernel(&self, name: &str) -> Option<KernelInfo> {
        let k = self.entry(name)?;
        let layout = self.layout(k);
        let f = &self.funcs_ok[k as usize];
        Some(KernelInfo {
            name: name.to_string(),
            param_size: f.param_size,
            static_shared: layout.static_size,
            local_size: f.frame_size as u64,
            error: layout.error.map(|e| unsupported(name, e)),
        })
    }

    fn layout(&self, k: u32) -> Layout {
        let mut seen = vec![false; self.funcs_ok.len()];
        let mut stack = vec![k];
        let mut indirect = false;
        let mut order = Vec::new();
        while let Some(f) = stack.pop() {
            if std::mem::replace(&mut seen[f as usize], true) {
                continue;
            }
            order.push(f);
            let func = &self.funcs_ok[f as usize];
            stack.extend(func.callees.iter().copied());
            if func.indirect_calls && !indirect {
                indirect = true;
                stack.extend(self.address_taken.iter().copied());
            }
        }
        let error = order.iter().find_map(|&f| self.errors[f as usize].clone());
        let mut used = vec![false; self.shared.len()];
        for &f in &order {
            for &s in &self.funcs_ok[f as usize].shared_refs {
                if let Some(u) = used.get_mut(s as usize) {
                    *u = true;
                }
            }
        }
        let mut offsets = vec![u32::MAX; self.shared.len()];
        let mut off = 0u64;
        let mut dyn_align = 16u64;
        for (i, s) in self.shared.iter().enumerate() {
            if !used[i] {
                continue;
            }
            if s.dynamic {
                dyn_align = dyn_align.max(s.align.min(4096));
                continue;
            }
            let a = s.align.clamp(1, 4096);
            off = off.div_ceil(a) * a;
            offsets[i] = off.min(u32::MAX as u64) as u32;
            off = off.saturating_add(s.size);
        }
        let static_size = off;
        let dyn_base = off.div_ceil(dyn_align) * dyn_align;
        for (i, s) in self.shared.iter().enumerate() {
            if used[i] && s.dynamic {
                offsets[i] = dyn_base.min(u32::MAX as u64) as u32;
            }
        }
        Layout { offsets, static_size, dyn_base, error }
    }
}

fn unsupported(kernel: &str, e: LowerError) -> ExecError {
    ExecError::Unsupported { kernel: kernel.to_string(), instruction: e.instruction, line: e.line }
}

fn fault_error(kernel: &str, f: Fault, line: u32, limit: u64) -> ExecError {
    let kernel = kernel.to_string();
    match f {
        Fault::Illegal(address) => ExecError::IllegalAddress { kernel, line, address },
        Fault::Misaligned(address) => ExecError::MisalignedAddress { kernel, line, address },
        Fault::Trap => ExecError::Trap { kernel, line },
        Fault::Assert(message) => ExecError::Assert { kernel, line, message },
        Fault::StackOverflow => ExecError::StackOverflow { kernel, line },
        Fault::Deadlock => ExecError::Deadlock { kernel, line },
        Fault::BadCall(reason) => ExecError::LaunchFailure { kernel, line, reason },
        Fault::Timeout => ExecError::Timeout { kernel, line, limit },
        Fault::BadHandle { handle, surface } => ExecError::InvalidHandle { kernel, line, handle, surface },
        Fault::SurfaceTrap(reason) => ExecError::LaunchFailure { kernel, line, reason },
    }
}

/// Options of [`run_with`].
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// OS threads running blocks in parallel.
    pub workers: usize,
    /// Stop with [`ExecError::Timeout`] once a worker has executed this many warp-instructions (a watchdog for
    /// kernels that never finish).
    pub max_warp_instructions: Option<u64>,
}

/// Runs `kernel` to completion.
///
/// Blocks run in parallel on `workers` OS threads. Device `printf` output is appended to `printf_out` block by block
/// in block-index order. On failure the first error (of the lowest-numbered failing block) is returned; the output of
/// blocks that ran is still appended.
pub fn run(
    program: &Program,
    kernel: &str,
    launch: &Launch,
    memory: &dyn GlobalMemory,
    printf_out: &mut Vec<u8>,
    workers: usize,
) -> Result<Stats, ExecError> {
    run_with(program, kernel, launch, memory, printf_out, &RunOptions { workers, max_warp_instructions: None })
}

/// [`run`] with options.
pub fn run_with(
    program: &Program,
    kernel: &str,
    launch: &Launch,
    memory: &dyn GlobalMemory,
    printf_out: &mut Vec<u8>,
    options: &RunOptions,
) -> Result<Stats, ExecError> {
    run_with_resources(program, kernel, launch, memory, &NoResources, printf_out, options)
}

/// [`run_with`] for a kernel that may use texture and surface objects: `resources` resolves their handles. Texels
/// are read and written at the addresses the descriptors give, checked against `memory` like any global access.
pub fn run_with_resources(
    program: &Program,
    kernel: &str,
    launch: &Launch,
    memory: &dyn GlobalMemory,
    resources: &dyn Resources,
    printf_out: &mut Vec<u8>,
    options: &RunOptions,
) -> Result<Stats, ExecError> {
    let workers = options.workers;
    let limit = options.max_warp_instructions.unwrap_or(u64::MAX);
    let k = program.entry(kernel).ok_or_else(|| ExecError::NotFound(kernel.to_string()))?;
    let layout = program.layout(k);
    if let Some(e) = layout.error {
        return Err(unsupported(kernel, e));
    }
    let func = &program.funcs_ok[k as usize];
    let [gx, gy, gz] = launch.grid;
    let [bx, by, bz] = launch.block;
    let bad = |m: String| Err(ExecError::InvalidConfiguration(m));
    if launch.grid.contains(&0) || launch.block.contains(&0) {
        return bad(format!("zero-sized grid {:?} or block {:?}", launch.grid, launch.block));
    }
    let nthreads = bx as u64 * by as u64 * bz as u64;
    if nthreads > 1024 || bx > 1024 || by > 1024 || bz > 64 {
        return bad(format!("block {:?} has more than 1024 threads or exceeds a dimension limit", launch.block));
    }
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
        return bad(format!("grid {:?} exceeds a dimension limit", launch.grid));
    }
    let shared_total = layout.dyn_base + launch.dynamic_shared as u64;
    if shared_total.max(layout.static_size) > MAX_SHARED {
        return bad(format!("{shared_total} bytes of shared memory per block (at most {MAX_SHARED})"));
    }
    if (launch.params.len() as u64) < func.param_size {
        return bad(format!(
            "{} bytes of parameters, kernel `{kernel}` takes {}",
            launch.params.len(),
            func.param_size
        ));
    }
    let total_blocks = gx as u64 * gy as u64 * gz as u64;
    let ctx = Ctx {
        prog: program,
        kernel: k,
        grid: launch.grid,
        block: launch.block,
        nthreads: nthreads as u32,
        nwarps: (nthreads as u32).div_ceil(32),
        params: launch.params[..func.param_size as usize].to_vec(),
        shared_off: layout.offsets,
        shared_size: shared_total.max(layout.static_size) as u32,
        dyn_smem: launch.dynamic_shared,
        memory,
        resources,
        workers: workers.max(1) as u32,
        abort: AtomicBool::new(false),
        limit,
        printf_budget: AtomicI64::new(PRINTF_BUDGET),
    };
    let workers = workers.clamp(1, 256).min(total_blocks.min(256) as usize);
    let next = AtomicU64::new(0);
    let failure: Mutex<Option<(u64, Fault, u32, u32)>> = Mutex::new(None);
    let outputs: Mutex<Vec<(u64, Vec<u8>)>> = Mutex::new(Vec::new());
    let instrs = AtomicU64::new(0);
    let work = |smid: u32| {
        let mut w = Worker::new(&ctx, smid);
        let mut mine = Vec::new();
        loop {
            if ctx.abort.load(Ordering::Relaxed) {
                break;
            }
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= total_blocks {
                break;
            }
            let (out, fault) = w.run_block(b);
            if !out.is_empty() {
                mine.push((b, out));
            }
            if let Some((f, line, _func)) = fault {
                let mut g = failure.lock().unwrap_or_else(|e| e.into_inner());
                if g.as_ref().is_none_or(|x| b < x.0) {
                    *g = Some((b, f, line, _func));
                }
                ctx.abort.store(true, Ordering::Relaxed);
                break;
            }
        }
        instrs.fetch_add(w.instrs, Ordering::Relaxed);
        outputs.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
    };
    if workers <= 1 {
        work(0);
    } else {
        std::thread::scope(|s| {
            for i in 1..workers {
                let work = &work;
                s.spawn(move || work(i as u32));
            }
            work(0);
        });
    }
    let mut outs = outputs.into_inner().unwrap_or_else(|e| e.into_inner());
    outs.sort_by_key(|(b, _)| *b);
    for (_, o) in outs {
        printf_out.extend_from_slice(&o);
    }
    if let Some((_, f, line, _)) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(fault_error(kernel, f, line, limit));
    }
    Ok(Stats { thread_instructions: instrs.load(Ordering::Relaxed), blocks: total_blocks })
}
