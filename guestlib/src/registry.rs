//! The fat binary registry: what nvcc's static constructors register
//! (`__cudaRegisterFatBinary`, `__cudaRegisterFunction`, `__cudaRegisterVar`), and the lazy
//! work behind it: shipping a module to the server once (keyed by the SHA-256 of its fat
//! binary), resolving kernels and variables to server handles and device addresses, and
//! learning each kernel's parameter layout from the cubin's `.nv.info` or the PTX `.entry`.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use phos_protocol::CudaError;
use phos_protocol::cudart::{PhosModuleGetFunctionRequest, PhosModuleGetGlobalRequest, PhosModuleLoadRequest};
use sha2::{Digest, Sha256};

use crate::runtime;

/// Where and how large each kernel parameter is in the parameter buffer, in ordinal order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    pub buffer_size: usize,
    /// (offset, size) of each parameter.
    pub params: Vec<(usize, usize)>,
}

/// A server-side object, tagged with the session it belongs to (a forked child or a device
/// reset must not reuse its parent's handles).
#[derive(Debug, Clone, Copy)]
struct Remote<T: Copy> {
    session: u64,
    value: T,
}

/// One registered fat binary.
pub struct Module {
    /// The fat binary container, inside the application's image.
    container: &'static [u8],
    remote: Mutex<Option<Remote<u64>>>,
    layouts: OnceLock<Result<HashMap<String, ParamLayout>, String>>,
}

/// One registered `__global__` function.
pub struct Kernel {
    module: Arc<Module>,
    pub name: String,
    remote: Mutex<Option<Remote<u64>>>,
}

/// One registered `__device__`/`__constant__` variable.
pub struct Variable {
    module: Arc<Module>,
    pub name: String,
    pub size: usize,
    remote: Mutex<Option<Remote<(u64, u64)>>>,
}

#[derive(Default)]
struct Registry {
    modules: Vec<Arc<Module>>,
    kernels: HashMap<usize, Arc<Kernel>>,
    variables: HashMap<usize, Arc<Variable>>,
}

static REGISTRY: RwLock<Option<Registry>> = RwLock::new(None);

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut g = REGISTRY.write().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Registry::default))
}

/// `__cudaRegisterFatBinary`: returns the handle nvcc passes to the other registration calls
/// (a leaked cell holding the module's index + 1; 0 for a fat binary that could not be read).
///
/// # Safety
/// `wrapper` must be what nvcc passes: a `__fatBinC_Wrapper_t`.
pub unsafe fn register_fat_binary(wrapper: *const c_void) -> *mut *mut c_void {
    // SAFETY: `wrapper` is what nvcc passes (this function's contract), which is what
    // `container_from_wrapper` reads.
    let index = match unsafe { phos_fatbin::container_from_wrapper(wrapper) } {
        Ok(container) => with_registry(|r| {
            r.modules.push(Arc::new(Module { container, remote: Mutex::new(None), layouts: OnceLock::new() }));
            r.modules.len()
        }),
        Err(e) => {
            crate::log::init();
            tracing::error!("cannot read a fat binary registered by the application: {e}");
            0
        }
    };
    Box::into_raw(Box::new(index as *mut c_void))
}

/// The module a registration handle names.
///
/// # Safety
/// `handle` must be null or a handle [`register_fat_binary`] returned.
unsafe fn module_of(handle: *mut *mut c_void) -> Option<Arc<Module>> {
    if handle.is_null() {
        return None;
    }
    // SAFETY: a handle `register_fat_binary` returned: a leaked box, never freed, holding the
    // module's index + 1; nothing writes it after it is made.
    let index = unsafe { *handle } as usize;
    let g = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    g.as_ref()?.modules.get(index.checked_sub(1)?).cloned()
}

/// # Safety
/// `p` must be null or a NUL-terminated string.
unsafe fn string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: not null, so a NUL-terminated string (this function's contract).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `__cudaRegisterFunction`.
///
/// # Safety
/// Arguments as nvcc passes them.
pub unsafe fn register_function(handle: *mut *mut c_void, host_fun: *const c_char, device_name: *const c_char) {
    // SAFETY: nvcc passes the handle `__cudaRegisterFatBinary` returned (this function's
    // contract).
    let module = unsafe { module_of(handle) };
    // SAFETY: nvcc passes the kernel's name as a NUL-terminated string.
    let (Some(module), Some(name)) = (module, unsafe { string(device_name) }) else {
        return;
    };
    with_registry(|r| {
        r.kernels.insert(host_fun as usize, Arc::new(Kernel { module, name, remote: Mutex::new(None) }));
    });
}

/// `__cudaRegisterVar`.
///
/// # Safety
/// Arguments as nvcc passes them.
pub unsafe fn register_variable(
    handle: *mut *mut c_void,
    host_var: *const c_char,
    device_name: *const c_char,
    size: usize,
) {
    // SAFETY: nvcc passes the handle `__cudaRegisterFatBinary` returned (this function's
    // contract).
    let module = unsafe { module_of(handle) };
    // SAFETY: nvcc passes the variable's name as a NUL-terminated string.
    let (Some(module), Some(name)) = (module, unsafe { string(device_name) }) else {
        return;
    };
    with_registry(|r| {
        r.variables.insert(host_var as usize, Arc::new(Variable { module, name, size, remote: Mutex::new(None) }));
    });
}

/// The host function and kernel whose server handle is `function` (one this process has
/// used: a kernel node's or a launch's).
pub fn kernel_of_remote(function: u64) -> Option<(usize, Arc<Kernel>)> {
    let g = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    g.as_ref()?
        .kernels
        .iter()
        .find(|(_, k)| k.remote.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|r| r.value) == Some(function))
        .map(|(h, k)| (*h, k.clone()))
}

pub fn kernel(host_fun: *const c_void) -> Option<Arc<Kernel>> {
    let g = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    g.as_ref()?.kernels.get(&(host_fun as usize)).cloned()
}

pub fn variable(host_var: *const c_void) -> Option<Arc<Variable>> {
    let g = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    g.as_ref()?.variables.get(&(host_var as usize)).cloned()
}

/// Also find `var` under `key` (a managed variable under its host copy's address, which is
/// what the program passes as the symbol).
pub fn alias_variable(key: usize, var: Arc<Variable>) {
    with_registry(|r| {
        r.variables.insert(key, var);
    });
}

/// Forget every server handle (after `cudaDeviceReset` the server has none of them).
pub fn forget_remote_state() {
    let g = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = g.as_ref() {
        for m in &r.modules {
            *m.remote.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        for k in r.kernels.values() {
            *k.remote.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        for v in r.variables.values() {
            *v.remote.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// Forget the addresses of module variables: after a restore, the reloaded modules may have
/// them elsewhere (the driver places module variables), so they are asked for again.
pub fn forget_variable_addresses() {
    let g = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = g.as_ref() {
        for v in r.variables.values() {
            *v.remote.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// True when `addr` lies in a module variable this process has resolved (module globals live
/// outside the session's allocation range on the `cuda` backend).
pub fn is_module_global(addr: u64) -> bool {
    let session = runtime::session_if_open().map(|s| s.id);
    let g = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    g.as_ref().is_some_and(|r| {
        r.variables.values().any(|v| {
            let remote = *v.remote.lock().unwrap_or_else(|p| p.into_inner());
            remote.is_some_and(|rm| Some(rm.session) == session && addr >= rm.value.0 && addr - rm.value.0 < rm.value.1)
        })
    })
}

impl Module {
    /// The server's handle for this module, shipping it on first use.
    pub fn remote(&self) -> Result<u64, CudaError> {
        let session = runtime::session()?.id;
        let mut g = self.remote.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = *g
            && r.session == session
        {
            return Ok(r.value);
        }
        let digest = Sha256::digest(self.container);
        let reply = runtime::call(&PhosModuleLoadRequest {
            image: self.container,
            size: self.container.len() as u64,
            digest: digest.as_slice(),
        })?;
        *g = Some(Remote { session, value: reply.module });
        Ok(reply.module)
    }

    /// Parameter layouts of every kernel in the module: from any cubin's `.nv.info`, else from
    /// the PTX `.entry` signatures.
    fn layouts(&self) -> Result<&HashMap<String, ParamLayout>, CudaError> {
        self.layouts.get_or_init(|| kernel_layouts(self.container)).as_ref().map_err(|e| {
            tracing::error!("cannot read kernel parameter layouts: {e}");
            CudaError::InvalidKernelImage
        })
    }
}

pub(crate) fn kernel_layouts(container: &[u8]) -> Result<HashMap<String, ParamLayout>, String> {
    let fatbin = phos_fatbin::FatBinary::parse(container).map_err(|e| e.to_string())?;
    let mut out: HashMap<String, ParamLayout> = HashMap::new();
    let mut ptx_texts = Vec::new();
    for entry in fatbin.entries() {
        let entry = entry.map_err(|e| e.to_string())?;
        match entry.kind {
            phos_fatbin::EntryKind::Cubin => {
                let elf = entry.payload().map_err(|e| e.to_string())?;
                for (name, layout) in cubin_layouts(&elf)? {
                    out.entry(name).or_insert(layout);
                }
            }
            phos_fatbin::EntryKind::Ptx => {
                if let Some(text) = entry.ptx_text().map_err(|e| e.to_string())? {
                    ptx_texts.push(text);
                }
            }
            phos_fatbin::EntryKind::Other(_) => {}
        }
    }
    for text in ptx_texts {
        for (name, layout) in ptx_layouts(&text)? {
            out.entry(name).or_insert(layout);
        }
    }
    Ok(out)
}

/// Parameter layouts from a cubin's `.nv.info`.
pub(crate) fn cubin_layouts(elf: &[u8]) -> Result<Vec<(String, ParamLayout)>, String> {
    Ok(phos_fatbin::cubin::kernels(elf)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|k| {
            let layout = ParamLayout {
                buffer_size: k.buffer_size as usize,
                params: k.params.iter().map(|p| (usize::from(p.offset), usize::from(p.size))).collect(),
            };
            (k.name, layout)
        })
        .collect())
}

/// Parameter layouts from PTX `.entry` signatures.
pub(crate) fn ptx_layouts(text: &str) -> Result<Vec<(String, ParamLayout)>, String> {
    Ok(phos_ptx::parse_signatures(text)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|s| {
            let layout = ParamLayout {
                buffer_size: s.size as usize,
                params: s.params.iter().map(|p| (p.offset as usize, p.size as usize)).collect(),
            };
            (s.name, layout)
        })
        .collect())
}

impl Kernel {
    /// The server's handle for this kernel.
    pub fn remote(&self) -> Result<u64, CudaError> {
        let module = self.module.remote()?;
        let session = runtime::session()?.id;
        let mut g = self.remote.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = *g
            && r.session == session
        {
            return Ok(r.value);
        }
        let reply = runtime::call(&PhosModuleGetFunctionRequest { module, name: &self.name })?;
        *g = Some(Remote { session, value: reply.function });
        Ok(reply.function)
    }

    pub fn layout(&self) -> Result<ParamLayout, CudaError> {
        self.module.layouts()?.get(&self.name).cloned().ok_or_else(|| {
            tracing::error!("no parameter layout for kernel {} in its fat binary", self.name);
            CudaError::InvalidDeviceFunction
        })
    }
}

impl Variable {
    /// Device address and size of the variable.
    pub fn remote(&self) -> Result<(u64, u64), CudaError> {
        let module = self.module.remote()?;
        let session = runtime::session()?.id;
        let mut g = self.remote.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = *g
            && r.session == session
        {
            return Ok(r.value);
        }
        let reply = runtime::call(&PhosModuleGetGlobalRequest { module, name: &self.name })?;
        let value = (reply.address, reply.bytes);
        *g = Some(Remote { session, value });
        Ok(value)
    }
}
