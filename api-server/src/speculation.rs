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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use phos_protocol::spec::DeviceAccess;
use phos_ptx::access::{KernelAccess, kernel_accesses};
use phos_ptx::instrument::{CheckedModule, checked_twin};

use crate::backend::Raw;
use crate::backend::prelude::*;
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
    /// Kernels the log has been told about (once each).
    logged: Mutex<HashSet<String>>,
}

enum Code {
    /// Why the module gives no PTX to read.
    NoPtx(String),
    Ptx {
        accesses: HashMap<String, KernelAccess>,
        /// Bytes of parameters each kernel takes (its twin's context parameter follows them,
        /// 8-byte aligned).
        param_bytes: HashMap<String, u64>,
        twin: Result<CheckedModule, String>,
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
        ModuleCode { image: image.to_vec(), code: OnceLock::new(), twin: Mutex::new(None), logged: Mutex::default() }
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
            let twin = checked_twin(&module).map_err(|e| e.to_string());
            Code::Ptx { accesses, param_bytes, twin }
        })
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
        let Code::Ptx { twin, param_bytes, .. } = self.code() else { return Err("no PTX".into()) };
        let context_at = param_bytes.get(kernel).copied().unwrap_or(0).next_multiple_of(8) as usize;
        let checked = twin.as_ref().map_err(|e| format!("no checked twin: {e}"))?;
        let mut slot = self.twin.lock();
        let loaded = slot.get_or_insert_with(|| {
            // The driver JIT-compiles it (cuModuleLoadData of PTX text); `emu` interprets it.
            let mut text = checked.module.to_string().into_bytes();
            text.push(0);
            backend
                .module_load(device, &text)
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
/// and, while a window is armed, the checked twin to run instead.
pub(crate) fn plan_launch(
    session: &Session,
    function: u64,
    params: &[u8],
    window: Option<&Arc<ServerWindow>>,
) -> (Vec<DeviceAccess>, Option<CheckedLaunch>) {
    let memory = &session.objects.memory;
    let everything =
        || memory.regions().into_iter().map(|(addr, len)| DeviceAccess { addr, len, writes: true }).collect();
    let Some(kernel) = session.objects.modules.kernel(function) else { return (everything(), None) };
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
    let speculated = speculate(session, &kernel, access, params);
    let Some(window) = window.filter(|w| w.armed()) else {
        // Nothing checks the launch: what speculation cannot attribute makes it write
        // everything.
        if !access.stores_are_tracked() {
            return (everything(), None);
        }
        return (speculated, None);
    };
    match checked_launch(session, window, &kernel, &speculated, params) {
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
    // A load the PTX cannot attribute may read anything (what a restore that loads memory on
    // demand must know; validation checks stores only).
    if !access.untracked_loads.is_empty() {
        out.extend(memory.regions().into_iter().map(|(addr, len)| DeviceAccess { addr, len, writes: false }));
    }
    // One entry a range, written if any word writes it.
    out.sort_by_key(|d| (d.addr, !d.writes));
    out.dedup_by(|later, first| later.addr == first.addr);
    out
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
    let twin = kernel.code.twin_function(backend, kernel.device, &kernel.name)?;
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
