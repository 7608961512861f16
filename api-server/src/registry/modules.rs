//! The session's modules and the functions looked up in them.
//!
//! Invariants: each module image is loaded once per device (`loaded` maps its digest to its
//! handle); a module's variables are device memory the session may use (registered in the
//! address space) for as long as the module is loaded; a function lives no longer than its
//! module. Locks are taken in the order `loaded`, `modules`, `functions`, never the other
//! way.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;
use sha2::{Digest, Sha256};

use super::handles::{HandleTable, NewHandle};
use super::memory::AddressSpace;
use crate::backend::Raw;
use crate::backend::prelude::*;
use crate::speculation::ModuleCode;

/// A module image whose kernels call `cudaGraphSetConditional` (a builtin of CUDA's device
/// runtime), as the backends load it: its PTX with each call made a store of the value to the
/// handle, which is the address of the handle's cell ([`phos_ptx::conditional`]), NUL-ended.
/// `None` for an image that does not name the function (nearly all: one byte search). An image
/// that names it without PTX to rewrite (machine code only), or whose calls cannot be
/// rewritten, is refused, by name.
fn lower_conditionals(image: &[u8]) -> Result<Option<Vec<u8>>, CudaError> {
    use phos_ptx::conditional::{SET_CONDITIONAL, calls_set_conditional, lower_set_conditional};
    if !names_set_conditional(image) {
        return Ok(None);
    }
    let refuse = |why: String| {
        tracing::warn!("a module calling {SET_CONDITIONAL} is refused: {why}");
        CudaError::NotSupported
    };
    let ptx = crate::backend::emu::ptx_of(image)
        .map_err(|e| refuse(format!("its image does not read ({e})")))?
        .ok_or_else(|| refuse("it has no PTX to rewrite (machine code only): build it with PTX".into()))?;
    let mut module = phos_ptx::parse(&ptx).map_err(|e| refuse(format!("its PTX does not parse ({e})")))?;
    if !calls_set_conditional(&module) {
        return Ok(None);
    }
    lower_set_conditional(&mut module).map_err(|e| refuse(e.to_string()))?;
    let mut text = module.to_string().into_bytes();
    text.push(0);
    Ok(Some(text))
}

/// Whether a module image names `cudaGraphSetConditional`: in its bytes, or in the text of a
/// compressed PTX entry of a fat binary (CUDA 13's zstd leaves no name readable in the bytes).
fn names_set_conditional(image: &[u8]) -> bool {
    let name = phos_ptx::conditional::SET_CONDITIONAL.as_bytes();
    let has = |bytes: &[u8]| bytes.windows(name.len()).any(|w| w == name);
    if has(image) {
        return true;
    }
    if !image.starts_with(&0xBA55_ED50u32.to_le_bytes()) {
        return false;
    }
    let Ok(fatbin) = phos_fatbin::FatBinary::parse(image) else { return false };
    fatbin
        .entries()
        .flatten()
        .any(|e| e.kind == phos_fatbin::EntryKind::Ptx && e.compressed && e.payload().is_ok_and(|p| has(&p)))
}

struct Module {
    raw: Raw,
    device: i32,
    digest: [u8; 32],
    /// Module variables registered as device memory the session may use: (name, address,
    /// size).
    globals: Vec<(String, u64, u64)>,
    /// What its PTX says its kernels touch, and its checked twin (read when a C/R protocol
    /// first launches one of its kernels).
    code: Arc<ModuleCode>,
}

struct Function {
    raw: Raw,
    module: u64,
    name: String,
    /// Launched at least once: a concurrent checkpoint makes its checked twin ready before
    /// it holds the session.
    launched: AtomicBool,
}

/// A kernel, for speculating what a launch of it touches.
pub struct Kernel {
    pub name: String,
    /// Its module: handle, backend module, device.
    pub module: u64,
    pub module_raw: Raw,
    pub device: i32,
    pub code: Arc<ModuleCode>,
    /// The module's variables the session knows: (name, address, size).
    pub globals: Vec<(String, u64, u64)>,
}

/// A module variable: its module's handle, its name, where it is and on which device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Variable {
    pub module: u64,
    pub name: String,
    pub addr: u64,
    pub size: u64,
    pub device: i32,
}

pub struct ModuleRegistry {
    /// Loaded modules by (device, content digest). Held while a module loads, so that two
    /// channels loading the same image load it once.
    loaded: Mutex<HashMap<(i32, [u8; 32]), u64>>,
    modules: Mutex<HandleTable<Module>>,
    functions: Mutex<HandleTable<Function>>,
}

impl ModuleRegistry {
    pub fn new(module_limit: u64, function_limit: u64) -> Self {
        ModuleRegistry {
            loaded: Mutex::default(),
            modules: Mutex::new(HandleTable::new(HandleKind::Module, module_limit)),
            functions: Mutex::new(HandleTable::new(HandleKind::Function, function_limit)),
        }
    }

    /// Load a module image on `device`, once: an image loaded already answers its handle
    /// again. `digest` names the image for sharing, so it must be the image's: the guest's
    /// word is checked.
    pub fn load(
        &self,
        backend: &dyn Backend,
        memory: &AddressSpace,
        device: i32,
        image: &[u8],
        digest: &[u8],
        new: &NewHandle<'_>,
    ) -> Result<u64, CudaError> {
        let actual: [u8; 32] = Sha256::digest(image).into();
        if actual.as_slice() != digest {
            return Err(CudaError::InvalidValue);
        }
        let mut loaded = self.loaded.lock();
        if let Some(&h) = loaded.get(&(device, actual)) {
            return Ok(h);
        }
        let lowered = lower_conditionals(image)?;
        let image = lowered.as_deref().unwrap_or(image);
        let module = backend.module_load(device, image)?;
        for &(_, addr, size) in &module.variables {
            memory.add_external(addr, size);
        }
        let raw = module.raw;
        let globals = module.variables;
        let unregister = |globals: &[(String, u64, u64)]| {
            for &(_, addr, _) in globals {
                memory.remove_external(addr);
            }
        };
        let h = self
            .modules
            .lock()
            .add(
                Module {
                    raw,
                    device,
                    digest: actual,
                    globals: globals.clone(),
                    code: Arc::new(ModuleCode::new(image)),
                },
                new,
            )
            .inspect_err(|_| {
                unregister(&globals);
                let _ = backend.module_unload(raw);
            })?;
        loaded.insert((device, actual), h);
        Ok(h)
    }

    /// Unload a module: its functions go with it, and its variables stop being the session's
    /// memory.
    pub fn unload(&self, backend: &dyn Backend, memory: &AddressSpace, handle: u64) -> Result<(), CudaError> {
        let mut loaded = self.loaded.lock();
        let m = self.modules.lock().remove(handle)?;
        loaded.remove(&(m.device, m.digest));
        drop(loaded);
        self.functions.lock().retain(|f| f.module != handle);
        for (_, addr, _) in &m.globals {
            memory.remove_external(*addr);
        }
        m.code.unload_twin(backend);
        backend.module_unload(m.raw)
    }

    /// Look up function `name` in a module.
    pub fn function(
        &self,
        backend: &dyn Backend,
        module: u64,
        name: &str,
        new: &NewHandle<'_>,
    ) -> Result<u64, CudaError> {
        let module_raw = self.modules.lock().get(module)?.raw;
        let raw = backend.module_function(module_raw, name)?;
        let f = Function { raw, module, name: name.to_string(), launched: AtomicBool::new(false) };
        let h = self.functions.lock().add(f, new)?;
        Ok(h)
    }

    /// The kernel behind a function handle, with its module's code.
    pub fn kernel(&self, function: u64) -> Option<Kernel> {
        let (module, name) = self.functions.lock().get(function).map(|f| (f.module, f.name.clone())).ok()?;
        let modules = self.modules.lock();
        let m = modules.get(module).ok()?;
        Some(Kernel {
            name,
            module,
            module_raw: m.raw,
            device: m.device,
            code: m.code.clone(),
            globals: m.globals.clone(),
        })
    }

    /// The backend's function behind a handle, for a launch.
    pub fn resolve_function(&self, handle: u64) -> Result<Raw, CudaError> {
        let functions = self.functions.lock();
        let f = functions.get(handle)?;
        // Read first: the flag is set once, and launches after that only read it.
        if !f.launched.load(Ordering::Relaxed) {
            f.launched.store(true, Ordering::Relaxed);
        }
        Ok(f.raw)
    }

    /// The kernels launched so far.
    pub fn launched_kernels(&self) -> Vec<Kernel> {
        let handles: Vec<u64> =
            self.functions.lock().iter().filter(|(_, f)| f.launched.load(Ordering::Relaxed)).map(|(h, _)| h).collect();
        handles.into_iter().filter_map(|h| self.kernel(h)).collect()
    }

    /// Address and size of a variable of a loaded module, which becomes memory the session
    /// may use (and part of its checkpoints) from now on.
    pub fn variable(
        &self,
        backend: &dyn Backend,
        memory: &AddressSpace,
        module: u64,
        name: &str,
    ) -> Result<(u64, u64), CudaError> {
        let mut modules = self.modules.lock();
        let m = modules.get_mut(module)?;
        if let Some((_, addr, size)) = m.globals.iter().find(|(n, _, _)| n == name) {
            return Ok((*addr, *size));
        }
        let (addr, size) = backend.module_global(m.raw, name)?;
        memory.add_external(addr, size);
        m.globals.push((name.to_string(), addr, size));
        Ok((addr, size))
    }

    /// Every module variable the session can use, in order.
    pub fn variables(&self) -> Vec<Variable> {
        let modules = self.modules.lock();
        let mut out: Vec<Variable> = modules
            .iter()
            .flat_map(|(h, m)| {
                m.globals.iter().map(move |(name, addr, size)| Variable {
                    module: h,
                    name: name.clone(),
                    addr: *addr,
                    size: *size,
                    device: m.device,
                })
            })
            .collect();
        out.sort();
        out
    }

    /// Next handle numbers of modules and functions.
    pub fn next_counters(&self) -> (u64, u64) {
        (self.modules.lock().next_counter(), self.functions.lock().next_counter())
    }

    pub fn set_next_counters(&self, modules: Option<u64>, functions: Option<u64>) {
        if let Some(n) = modules {
            self.modules.lock().set_next_counter(n);
        }
        if let Some(n) = functions {
            self.functions.lock().set_next_counter(n);
        }
    }

    /// Unload everything.
    pub fn release_all(&self, backend: &dyn Backend, memory: &AddressSpace) {
        let mut loaded = self.loaded.lock();
        self.functions.lock().drain();
        for (_, m) in self.modules.lock().drain() {
            for (_, addr, _) in m.globals {
                memory.remove_external(addr);
            }
            m.code.unload_twin(backend);
            let _ = backend.module_unload(m.raw);
        }
        loaded.clear();
    }
}
