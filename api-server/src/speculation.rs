//! What a kernel launch may read and write, for the C/R engine's hook while a concurrent
//! protocol runs (docs/architecture.md, "Concurrent checkpoint and restore").
//!
//! A launch's parameter buffer names memory: every aligned 8-byte word whose value falls in
//! a live allocation or module variable names it. The kernel's PTX narrows that
//! ([`phos_ptx::access`]): a word never used as an address names nothing, one only loaded
//! through is read, one stored through is written; the module variables the kernel uses are
//! read or written as its code says. What the PTX cannot attribute (a store through a
//! pointer loaded from memory) and what speculation gets wrong (an index past the end of the
//! allocation a pointer names) is caught by validation: while a window is armed the launch
//! runs the kernel's checked twin ([`phos_ptx::instrument`]), which flags a store outside the
//! speculated ranges. Where there is nothing to narrow with (no PTX in the module, a twin that
//! cannot be built or loaded, no room for its check context), the launch is taken to write all
//! of the session's memory: the conservative answer, which needs no validation.
//!
//! The same analysis says what an on-demand restore must load before a launch runs
//! (docs/architecture.md, "On-demand restore"): a kernel that loads or stores through an
//! address the PTX cannot derive from its parameters or its module's variables, or whose
//! module has no PTX, may touch any memory ([`EVERYTHING`] joins its speculation). The module
//! is analysed once, the first time a launch of one of its kernels runs under a C/R
//! protocol, and the answer kept until the module is unloaded.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use phos_protocol::spec::DeviceAccess;
use phos_ptx::access::{KernelAccess, kernel_accesses};
use phos_ptx::instrument::{CheckedModule, checked_twin};

use crate::backend::Raw;
use crate::backend::prelude::*;
use crate::on_demand::EVERYTHING;
use crate::registry::modules::Kernel;
use crate::service::Session;
use crate::window::{InFlight, ServerWindow};

/// What the server reads of a module's code, the first time a launch of one of its kernels
/// runs under a C/R protocol (never otherwise: outside a protocol no launch pays for it).
pub struct ModuleCode {
    image: Vec<u8>,
    code: OnceLock<Code>,
    /// The checked twin, loaded on the backend (once: later protocols reuse it).
    twin: Mutex<Option<Result<LoadedTwin, String>>>,
    /// Kernels the log has been told about (once each): taken to write everything, taken
    /// to touch anything.
    logged: Mutex<HashSet<String>>,
    reach_logged: Mutex<HashSet<String>>,
}

enum Code {
    /// Why the module gives no PTX to read.
    NoPtx(String),
    Ptx {
        accesses: HashMap<String, KernelAccess>,
        /// Bytes of parameters each kernel takes (its twin's context parameter follows them,
        /// 8-byte aligned).
        param_bytes: HashMap<String, u64>,
        /// The module, for its checked twin, made the first time a window asks for it (an
        /// on-demand restore reads only the accesses).
        module: phos_ptx::Module,
        twin: OnceLock<Result<CheckedModule, String>>,
    },
}

/// A checked twin module on the backend, and the twins looked up in it.
struct LoadedTwin {
    module: Raw,
    functions: HashMap<String, Raw>,
    /// The original module's variables its table lists, in order.
    variables: Vec<String>,
}

impl ModuleCode {
    pub fn new(image: &[u8]) -> Self {
        ModuleCode {
            image: image.to_vec(),
            code: OnceLock::new(),
            twin: Mutex::new(None),
            logged: Mutex::default(),
            reach_logged: Mutex::default(),
        }
    }

    fn code(&self) -> &Code {
        self.code.get_or_init(|| {
            let ptx = match crate::backend::emu::ptx_of(&self.image) {
                Ok(Some(ptx)) => ptx,
                Ok(None) => return Code::NoPtx("its image has no PTX".into()),
                Err(e) => return Code::NoPtx(format!("its image does not read: {e}")),
            };
            let module = match phos_ptx::parse(&ptx) {
                Ok(m) => m,
                Err(e) => return Code::NoPtx(format!("its PTX does not parse: {e}")),
            };
            let accesses = kernel_accesses(&module).into_iter().map(|a| (a.kernel.clone(), a)).collect();
            let param_bytes = module.functions().map(|f| (f.name.clone(), phos_ptx::signature_of(f).size)).collect();
            Code::Ptx { accesses, param_bytes, module, twin: OnceLock::new() }
        })
    }

    /// Why a launch of `kernel` may touch memory that its parameters and its module's
    /// variables do not name; `None` when it cannot.
    pub(crate) fn untracked(&self, kernel: &str) -> Option<String> {
        let accesses = match self.code() {
            Code::NoPtx(why) => return Some(why.clone()),
            Code::Ptx { accesses, .. } => accesses,
        };
        let Some(k) = accesses.get(kernel) else { return Some("its module's PTX has no body for it".into()) };
        let loads = k.untracked_loads.first().map(|u| ("loads", u));
        loads.or(k.untracked_stores.first().map(|u| ("stores", u))).map(|(what, u)| {
            format!(
                "it {what} through an address not derived from its parameters ({}, {} line {})",
                u.what, u.function, u.line
            )
        })
    }

    /// Say once per kernel that its launches may touch any memory, and why.
    fn log_reach_once(&self, session: u64, kernel: &str, why: &str) {
        if self.reach_logged.lock().insert(kernel.to_string()) {
            tracing::info!(
                session,
                "kernel {kernel}: {why}: its launches are taken to touch any memory (an on-demand restore loads all memory before it runs)"
            );
        }
    }

    /// Say once per kernel why its launches are taken to write everything.
    fn log_once(&self, session: u64, kernel: &str, why: &str) {
        if self.logged.lock().insert(kernel.to_string()) {
            crate::guest_warn!(
                session,
                "kernel {kernel}: {why}; while a checkpoint runs its launches are taken to write all of the session's memory"
            );
        }
    }

    /// The twin of `kernel`, loading the twin module on `device` the first time: the twin, the
    /// variables its table lists, and where its context parameter goes.
    fn twin_function(&self, backend: &dyn Backend, device: i32, kernel: &str) -> Result<Twin, String> {
        let Code::Ptx { twin, param_bytes, module, .. } = self.code() else { return Err("no PTX".into()) };
        let context_at = param_bytes.get(kernel).copied().unwrap_or(0).next_multiple_of(8) as usize;
        let twin = twin.get_or_init(|| checked_twin(module).map_err(|e| e.to_string()));
        let checked = twin.as_ref().map_err(|e| format!("no checked twin: {e}"))?;
        let mut slot = self.twin.lock();
        let loaded = slot.get_or_insert_with(|| {
            // Compiled away from the driver where the backend can, else by the driver
            // (cuModuleLoadData of PTX text); `emu` interprets it.
            let mut text = checked.module.to_string().into_bytes();
            text.push(0);
            let image = backend.compile_ptx(device, &text).unwrap_or(text);
            backend
                .module_load(device, &image)
                .map(|m| LoadedTwin { module: m.raw, functions: HashMap::new(), variables: checked.variables.clone() })
                .map_err(|e| format!("its checked twin does not load: {e:?}"))
        });
        let loaded = loaded.as_mut().map_err(|e| e.clone())?;
        let function = match loaded.functions.get(kernel) {
            Some(&f) => f,
            None => {
                let f = backend.module_function(loaded.module, kernel).map_err(|e| format!("no twin of it: {e:?}"))?;
                loaded.functions.insert(kernel.to_string(), f);
                f
            }
        };
        Ok(Twin { function, variables: loaded.variables.clone(), context_at })
    }

    /// Unload the twin module, if one was loaded (its module is being unloaded).
    pub fn unload_twin(&self, backend: &dyn Backend) {
        if let Some(Ok(t)) = self.twin.lock().take() {
            let _ = backend.module_unload(t.module);
        }
    }
}

/// A kernel's twin, as a launch needs it.
struct Twin {
    function: Raw,
    /// The original module's variables its table lists, in order.
    variables: Vec<String>,
    /// Offset of the context parameter in the twin's parameter buffer.
    context_at: usize,
}

/// A launch of a checked twin in place of the kernel.
pub(crate) struct CheckedLaunch {
    pub function: Raw,
    /// The kernel's parameters, then the check context's address.
    pub params: Vec<u8>,
    /// The window waits for this launch before it reads the flags.
    _in_flight: InFlight,
}

/// What a launch of `function` with `params` will read and write (what the hook is shown),
/// and, while a window is armed, the checked twin to run instead. A kernel that may touch
/// memory its launch does not name has [`EVERYTHING`] among its accesses too.
pub(crate) fn plan_launch(
    session: &Session,
    function: u64,
    params: &[u8],
    window: Option<&Arc<ServerWindow>>,
) -> (Vec<DeviceAccess>, Option<CheckedLaunch>) {
    let Some(kernel) = session.objects.modules.kernel(function) else {
        let mut all = writes_everything(session);
        all.push(EVERYTHING);
        return (all, None);
    };
    let (mut access, checked) = plan_kernel(session, &kernel, params, window);
    if let Some(why) = kernel.code.untracked(&kernel.name) {
        kernel.code.log_reach_once(session.id, &kernel.name, &why);
        access.push(EVERYTHING);
    }
    (access, checked)
}

/// Every region of the session's memory, written.
fn writes_everything(session: &Session) -> Vec<DeviceAccess> {
    session.objects.memory.regions().into_iter().map(|(addr, len)| DeviceAccess { addr, len, writes: true }).collect()
}

/// [`plan_launch`] of a known kernel, but for what it may touch unnamed.
fn plan_kernel(
    session: &Session,
    kernel: &Kernel,
    params: &[u8],
    window: Option<&Arc<ServerWindow>>,
) -> (Vec<DeviceAccess>, Option<CheckedLaunch>) {
    let everything = || writes_everything(session);
    let access = match kernel.code.code() {
        Code::NoPtx(why) => {
            kernel.code.log_once(session.id, &kernel.name, why);
            return (everything(), None);
        }
        Code::Ptx { accesses, .. } => match accesses.get(&kernel.name) {
            Some(a) => a,
            None => {
                kernel.code.log_once(session.id, &kernel.name, "its module's PTX has no such kernel");
                return (everything(), None);
            }
        },
    };
    let speculated = speculate(session, kernel, access, params);
    let Some(window) = window.filter(|w| w.armed()) else {
        // Nothing checks the launch: what speculation cannot attribute makes it write
        // everything.
        if !access.stores_are_tracked() {
            return (everything(), None);
        }
        return (speculated, None);
    };
    match checked_launch(session, window, kernel, &speculated, params) {
        Ok(Some(c)) => (speculated, Some(c)),
        // The window was finished meanwhile: nothing is checked any more.
        Ok(None) if access.stores_are_tracked() => (speculated, None),
        Ok(None) => (everything(), None),
        Err(why) => {
            kernel.code.log_once(session.id, &kernel.name, &why);
            (everything(), None)
        }
    }
}

/// The memory the parameter words and the variables of `kernel` name, as `access` says it
/// is used.
fn speculate(session: &Session, kernel: &Kernel, access: &KernelAccess, params: &[u8]) -> Vec<DeviceAccess> {
    let memory = &session.objects.memory;
    let mut out: Vec<DeviceAccess> = Vec::new();
    for (i, word) in params.chunks_exact(8).enumerate() {
        let used = access.word(8 * i as u64);
        if !used.read && !used.written {
            continue;
        }
        let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        if let Some((addr, len)) = memory.region_of(value) {
            out.push(DeviceAccess { addr, len, writes: used.written });
        }
    }
    for (name, addr, len) in &kernel.globals {
        let written = access.variables_written.contains(name);
        if written || access.variables_read.contains(name) {
            out.push(DeviceAccess { addr: *addr, len: *len, writes: written });
        }
    }
    // A load the PTX cannot attribute may read anything: `plan_launch` adds `EVERYTHING`.
    // One entry a range, written if any word writes it.
    out.sort_by_key(|d| (d.addr, !d.writes));
    out.dedup_by(|later, first| later.addr == first.addr);
    out
}

/// Make the checked twins of the kernels `session` has launched ready (their PTX read,
/// rewritten, compiled and loaded), so that the first checked launch of each finds its twin:
/// done before a concurrent checkpoint holds the session. A kernel whose twin cannot be made
/// is left to its first launch, which logs why.
pub(crate) fn prepare_twins(session: &Session) {
    let backend = session.backend();
    for kernel in session.objects.modules.launched_kernels() {
        let _ = crate::timing::timed(
            || format!("making the checked twin of {} ready", kernel.name),
            || kernel.code.twin_function(backend, kernel.device, &kernel.name),
        );
    }
}

/// The twin of `kernel` with a check context that holds the ranges `speculated` writes.
/// `Ok(None)`: the window is no longer armed.
fn checked_launch(
    session: &Session,
    window: &Arc<ServerWindow>,
    kernel: &Kernel,
    speculated: &[DeviceAccess],
    params: &[u8],
) -> Result<Option<CheckedLaunch>, String> {
    let backend = session.backend();
    let twin = crate::timing::timed(
        || format!("finding the checked twin of {}", kernel.name),
        || kernel.code.twin_function(backend, kernel.device, &kernel.name),
    )?;
    let mut ranges: Vec<(u64, u64)> =
        speculated.iter().filter(|d| d.writes).map(|d| (d.addr, d.addr + d.len)).collect();
    ranges.sort_unstable();
    let Some(in_flight) = window.begin_launch() else { return Ok(None) };
    let table = window.variable_table(kernel.device, kernel.module, || {
        twin.variables.iter().map(|v| backend.module_global(kernel.module_raw, v).map(|(addr, _)| addr)).collect()
    })?;
    let context = window.context(kernel.device, &ranges, table)?;
    // The kernel's parameters (what the guest sent past them is never read), then the
    // context's address.
    let mut with_context = params.to_vec();
    with_context.resize(twin.context_at, 0);
    with_context.extend_from_slice(&context.to_le_bytes());
    Ok(Some(CheckedLaunch { function: twin.function, params: with_context, _in_flight: in_flight }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry direct(.param .u64 a, .param .u64 b)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [a];
    ld.param.u64 %rd2, [b];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    ld.global.u32 %r1, [%rd1];
    st.global.u32 [%rd2], %r1;
    ret;
}

.visible .entry chase(.param .u64 table, .param .u64 out)
{
    .reg .b64 %rd<5>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [table];
    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    ld.global.u64 %rd3, [%rd1];
    ld.global.u32 %r1, [%rd3];
    st.global.u32 [%rd2], %r1;
    ret;
}

.visible .entry scatter(.param .u64 table, .param .u32 v)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [table];
    ld.param.u32 %r1, [v];
    cvta.to.global.u64 %rd1, %rd1;
    ld.global.u64 %rd2, [%rd1];
    st.global.u32 [%rd2], %r1;
    ret;
}
"#;

    /// A kernel that reads and writes only through its parameters reaches nothing else; one
    /// that loads or stores through a pointer loaded from memory may touch anything, and
    /// says why; so may a kernel of a module without PTX, and one its PTX has no body for.
    #[test]
    fn kernels_touching_memory_through_loaded_pointers_are_untracked() {
        let code = ModuleCode::new(PTX.as_bytes());
        assert_eq!(code.untracked("direct"), None);
        let why = code.untracked("chase").expect("chase reads through a loaded pointer");
        assert!(why.contains("loads through an address not derived"), "{why}");
        let why = code.untracked("scatter").expect("scatter writes through a loaded pointer");
        assert!(why.contains("stores through an address not derived"), "{why}");
        assert!(code.untracked("absent").is_some_and(|w| w.contains("no body")));
        let opaque = ModuleCode::new(b"\x7fELF not ptx");
        assert!(opaque.untracked("k").is_some_and(|w| w.contains("PTX")));
    }
}
