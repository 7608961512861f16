//! Modules the program loads itself (`cuModuleLoadData`: PTX from NVRTC or Triton, a cubin, a
//! fat binary) and launches of their kernels. A module goes to the server through the
//! runtime's `phosModuleLoad` (the server checks the image's digest, loads it on its backend
//! and, on emu, interprets its PTX); `CUmodule` and `CUfunction` are the server's handles.
//! The guest keeps each function's parameter layout, read from the image (a cubin's
//! `.nv.info`, else the PTX `.entry` signature), to pack `kernelParams` the way the driver
//! does.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::{Arc, Mutex};

use phos_protocol::cuda::{
    CuError, PhosOccupancyMaxActiveClustersRequest, PhosOccupancyMaxPotentialClusterSizeRequest,
};
use phos_protocol::cudart::{
    PhosFuncGetAttributesRequest, PhosFuncSetAttributeRequest, PhosFuncSetCacheConfigRequest,
    PhosLaunchCooperativeKernelRequest, PhosModuleGetFunctionRequest, PhosModuleGetGlobalRequest,
    PhosModuleLoadRequest, PhosModuleUnloadRequest, PhosOccupancyAvailableDynamicSMemRequest,
    PhosOccupancyMaxActiveBlocksRequest,
};
use phos_protocol::types::Dim3;
use sha2::{Digest, Sha256};

use super::bridge::from_runtime;
use crate::registry::{self, ParamLayout};
use crate::runtime;

/// The largest module image accepted (a fat binary of every architecture is tens of MiB).
const MAX_IMAGE: usize = 1 << 30;
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// `CU_LAUNCH_PARAM_END`, `..._BUFFER_POINTER`, `..._BUFFER_SIZE` (`extra`'s keys).
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

#[derive(Default)]
struct Loaded {
    /// Kernel parameter layouts of each loaded module, and how many loads it stands for (the
    /// server loads an image once per content and hands out the same module again).
    modules: HashMap<u64, (Arc<HashMap<String, ParamLayout>>, u32)>,
    /// Each function handed out: its module and its layout.
    functions: HashMap<u64, (u64, Arc<ParamLayout>)>,
    /// The name of each function handed out (`cuFuncGetName` hands out a pointer that stays
    /// valid while the module is loaded; kept for the life of the process).
    names: HashMap<u64, Arc<CString>>,
}

static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Loaded) -> T) -> T {
    let mut g = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Loaded::default))
}

/// The bytes of a module image at `image`: a fat binary (its header gives its size), an ELF
/// cubin (the furthest of its headers and sections), or NUL-terminated PTX.
///
/// # Safety
/// `image` must point to a whole image of one of those kinds (the driver's contract).
unsafe fn image_bytes<'a>(image: *const c_void) -> Result<&'a [u8], CuError> {
    let p = image as *const u8;
    // SAFETY: every image kind is at least 4 bytes (the caller's contract).
    let head = unsafe { std::slice::from_raw_parts(p, 4) };
    let len = if head == FATBIN_MAGIC.to_le_bytes() {
        // SAFETY: a fat binary has its 16-byte header (the caller's contract).
        let header = unsafe { std::slice::from_raw_parts(p, 16) };
        let header_size = u16::from_le_bytes([header[6], header[7]]) as usize;
        let body = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        usize::try_from(body).ok().and_then(|b| b.checked_add(header_size)).ok_or(CuError::INVALID_IMAGE)?
    } else if head == ELF_MAGIC {
        // SAFETY: an ELF image has its 64-byte header (the caller's contract).
        let header = unsafe { std::slice::from_raw_parts(p, 64) };
        // SAFETY: an ELF image holds its section and program headers where its header says
        // (the caller's contract: a whole image); `elf_len` reads only those.
        unsafe { elf_len(p, header) }?
    } else {
        // SAFETY: PTX is NUL-terminated text (the caller's contract).
        unsafe { CStr::from_ptr(image as *const c_char) }.to_bytes().len()
    };
    if len == 0 || len > MAX_IMAGE {
        return Err(CuError::INVALID_IMAGE);
    }
    // SAFETY: the image's `len` bytes, as worked out from its own headers (the caller's
    // contract that it is a whole image).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The length of an ELF64 image: the end of the furthest header table or section.
///
/// # Safety
/// `p` must be an ELF64 image whose header is `header`, its header tables where it says.
unsafe fn elf_len(p: *const u8, header: &[u8]) -> Result<usize, CuError> {
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as u64;
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default()) as u64;
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    if header[4] != 2 {
        return Err(CuError::INVALID_IMAGE); // not ELFCLASS64
    }
    let (phoff, shoff) = (u64_at(header, 0x20), u64_at(header, 0x28));
    let (phentsize, phnum) = (u16_at(header, 0x36), u16_at(header, 0x38));
    let (shentsize, shnum) = (u16_at(header, 0x3A), u16_at(header, 0x3C));
    let table_end = |off: u64, size: u64, n: u64| off.checked_add(size * n).ok_or(CuError::INVALID_IMAGE);
    let mut end = 64u64.max(table_end(phoff, phentsize, phnum)?).max(table_end(shoff, shentsize, shnum)?);
    if end > MAX_IMAGE as u64 || (shnum > 0 && shentsize < 64) || (phnum > 0 && phentsize < 56) {
        return Err(CuError::INVALID_IMAGE);
    }
    for i in 0..shnum {
        // SAFETY: section header `i` lies within the section header table (the caller's
        // contract), which ends within MAX_IMAGE (checked above).
        let sh = unsafe { std::slice::from_raw_parts(p.wrapping_add((shoff + i * shentsize) as usize), 64) };
        const SHT_NOBITS: u64 = 8;
        if u32_at(sh, 4) != SHT_NOBITS {
            end = end.max(u64_at(sh, 0x18).checked_add(u64_at(sh, 0x20)).ok_or(CuError::INVALID_IMAGE)?);
        }
    }
    for i in 0..phnum {
        // SAFETY: program header `i` lies within the program header table, as above.
        let ph = unsafe { std::slice::from_raw_parts(p.wrapping_add((phoff + i * phentsize) as usize), 56) };
        end = end.max(u64_at(ph, 0x08).checked_add(u64_at(ph, 0x20)).ok_or(CuError::INVALID_IMAGE)?);
    }
    usize::try_from(end).map_err(|_| CuError::INVALID_IMAGE)
}

/// Kernel parameter layouts of an image of any kind.
fn layouts(image: &[u8]) -> Result<HashMap<String, ParamLayout>, String> {
    if image.starts_with(&FATBIN_MAGIC.to_le_bytes()) {
        return registry::kernel_layouts(image);
    }
    let list = if image.starts_with(ELF_MAGIC) {
        registry::cubin_layouts(image)?
    } else {
        registry::ptx_layouts(std::str::from_utf8(image).map_err(|e| e.to_string())?)?
    };
    Ok(list.into_iter().collect())
}

/// `cuModuleLoadData`/`Ex`/`cuModuleLoadFatBinary`.
///
/// # Safety
/// `image` must be null or point to a whole image (see [`image_bytes`]).
pub unsafe fn load(image: *const c_void) -> Result<u64, CuError> {
    // SAFETY: as this function's contract gives it.
    unsafe { load_for("cuModuleLoadData", image) }
}

/// [`load`] for `function`, which a failure's log line names.
///
/// # Safety
/// As [`load`].
pub(crate) unsafe fn load_for(function: &str, image: *const c_void) -> Result<u64, CuError> {
    if image.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `image` is not null and a whole image (this function's contract).
    let bytes = unsafe { image_bytes(image)? };
    let kernels = layouts(bytes).map_err(|e| {
        if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(function) {
            tracing::warn!("{function}: cannot read the image's kernels: {e} ({dropped} earlier lines dropped)");
        }
        if bytes.starts_with(ELF_MAGIC) || bytes.starts_with(&FATBIN_MAGIC.to_le_bytes()) {
            CuError::INVALID_IMAGE
        } else {
            CuError::INVALID_PTX
        }
    })?;
    let digest = Sha256::digest(bytes);
    let module = from_runtime(runtime::call(&PhosModuleLoadRequest {
        image: bytes,
        size: bytes.len() as u64,
        digest: digest.as_slice(),
    }))?
    .module;
    with(|l| l.modules.entry(module).or_insert_with(|| (Arc::new(kernels), 0)).1 += 1);
    Ok(module)
}

pub fn unload(module: u64) -> Result<(), CuError> {
    // The same image loaded twice is one module: it goes with its last unload.
    let last = with(|l| match l.modules.get_mut(&module) {
        None => Err(CuError::INVALID_HANDLE),
        Some((_, loads)) if *loads > 1 => {
            *loads -= 1;
            Ok(false)
        }
        Some(_) => {
            l.modules.remove(&module);
            Ok(true)
        }
    })?;
    if !last {
        return Ok(());
    }
    with(|l| l.functions.retain(|_, (m, _)| *m != module));
    // Before the call is sent: the module's variables end with it.
    crate::cudart::proofs::forget();
    from_runtime(runtime::call(&PhosModuleUnloadRequest { module })).map(|_| ())
}

pub fn function(module: u64, name: &str) -> Result<u64, CuError> {
    let layouts =
        with(|l| l.modules.get(&module).map(|(layouts, _)| layouts.clone())).ok_or(CuError::INVALID_HANDLE)?;
    let layout = layouts.get(name).cloned().ok_or(CuError::NOT_FOUND)?;
    let function = from_runtime(runtime::call(&PhosModuleGetFunctionRequest { module, name }))?.function;
    let c_name = Arc::new(CString::new(name).map_err(|_| CuError::INVALID_VALUE)?);
    with(|l| {
        l.functions.insert(function, (module, Arc::new(layout)));
        l.names.entry(function).or_insert(c_name);
    });
    Ok(function)
}

pub fn global(module: u64, name: &str) -> Result<(u64, u64), CuError> {
    if with(|l| !l.modules.contains_key(&module)) {
        return Err(CuError::INVALID_HANDLE);
    }
    let r = from_runtime(runtime::call(&PhosModuleGetGlobalRequest { module, name }))?;
    Ok((r.address, r.bytes))
}

/// The names of the kernels of a loaded module, sorted (the library API's count and
/// enumeration).
pub(crate) fn kernel_names(module: u64) -> Result<Vec<String>, CuError> {
    let layouts =
        with(|l| l.modules.get(&module).map(|(layouts, _)| layouts.clone())).ok_or(CuError::INVALID_HANDLE)?;
    let mut names: Vec<String> = layouts.keys().cloned().collect();
    names.sort();
    Ok(names)
}

/// A function of a loaded module handed out (`cuModuleGetFunction`, the library API's
/// kernels): its layout, or `None` for any other value.
pub(crate) fn loaded_function(function: u64) -> Option<Arc<ParamLayout>> {
    with(|l| l.functions.get(&function).map(|(_, layout)| layout.clone()))
}

/// The module a function handed out belongs to (`cuKernelGetLibrary`).
pub(crate) fn module_of(function: u64) -> Option<u64> {
    with(|l| l.functions.get(&function).map(|(module, _)| *module))
}

/// The server's handle and the layout of a function handed out (the layout shared: a launch
/// takes no copy of it): one of `cuModuleGetFunction`'s, or the runtime's `cudaFunction_t` of
/// a registered kernel (`cudaGetFuncBySymbol`, `cudaGetKernel`), which on CUDA is a
/// `CUfunction` the driver API takes as well; in Phos it is the kernel's host stub.
pub(crate) fn known(function: u64) -> Result<(u64, Arc<ParamLayout>), CuError> {
    if let Some(layout) = with(|l| l.functions.get(&function).map(|(_, layout)| layout.clone())) {
        return Ok((function, layout));
    }
    let kernel = registry::kernel(function as usize as *const c_void).ok_or(CuError::INVALID_HANDLE)?;
    Ok((from_runtime(kernel.remote())?, Arc::new(from_runtime(kernel.layout())?)))
}

/// The other way: the handle a program knows the server's function `function` by (a module's
/// function is the server's handle, a registered kernel its host stub) and its layout.
pub(crate) fn of_server(function: u64) -> Result<(u64, Arc<ParamLayout>), CuError> {
    if let Some(layout) = with(|l| l.functions.get(&function).map(|(_, layout)| layout.clone())) {
        return Ok((function, layout));
    }
    let (host_fun, kernel) = registry::kernel_of_remote(function).ok_or(CuError::INVALID_VALUE)?;
    Ok((host_fun as u64, Arc::new(from_runtime(kernel.layout())?)))
}

/// The name of a module's function handed out, NUL-terminated, valid for the life of the
/// process; `None` for any other value (a registered kernel's name is the runtime's).
pub(crate) fn name_of(function: u64) -> Option<*const c_char> {
    with(|l| l.names.get(&function).map(|n| n.as_ptr()))
}

/// `cuFuncGetParamInfo`: the offset and size of parameter `index` of a function (a module's
/// or a registered kernel): `CUDA_ERROR_INVALID_VALUE` past its last parameter.
pub fn param_info(function: u64, index: usize) -> Result<(usize, usize), CuError> {
    let (_, layout) = known(function)?;
    layout.params.get(index).copied().ok_or(CuError::INVALID_VALUE)
}

/// `cuOccupancyAvailableDynamicSMemPerBlock`: the dynamic shared memory a block may have
/// with `num_blocks` blocks of `block_size` threads on a multiprocessor.
pub fn available_dynamic_smem(function: u64, num_blocks: i32, block_size: i32) -> Result<u64, CuError> {
    let (function, _) = known(function)?;
    let r = from_runtime(runtime::call(&PhosOccupancyAvailableDynamicSMemRequest {
        function,
        numBlocks: num_blocks,
        blockSize: block_size,
    }))?;
    Ok(r.dynamicSmemSize)
}

/// The device limits the occupancy calculator works within.
pub struct OccupancyLimits {
    /// The device's and the function's largest block (the smaller of the two).
    pub max_block: i32,
    pub warp_size: i32,
    pub max_threads_per_sm: i32,
    pub sm_count: i32,
}

/// `cuOccupancyMaxPotentialBlockSize`: the block size that gives the most resident threads
/// per multiprocessor, and the grid that fills the device at it, as CUDA's occupancy
/// calculator (`cuda_occupancy.h`) finds them: block sizes from the limit down by warps, the
/// dynamic shared memory of each from `smem_of`, the first best kept, stopping at full
/// occupancy.
pub fn potential_block_size(
    function: u64,
    limits: &OccupancyLimits,
    block_size_limit: i32,
    flags: u32,
    mut smem_of: impl FnMut(i32) -> usize,
) -> Result<(i32, i32), CuError> {
    if limits.warp_size <= 0 || limits.max_block <= 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let limit =
        if block_size_limit <= 0 || block_size_limit > limits.max_block { limits.max_block } else { block_size_limit };
    let granularity = limits.warp_size;
    let mut aligned = (limit + granularity - 1) / granularity * granularity;
    let (mut best_block, mut best_blocks, mut best_threads) = (0, 0, 0);
    while aligned > 0 {
        let block = aligned.min(limit);
        let blocks = occupancy(function, block, smem_of(block), flags)?;
        let threads = block.saturating_mul(blocks);
        if threads > best_threads {
            (best_block, best_blocks, best_threads) = (block, blocks, threads);
        }
        if threads >= limits.max_threads_per_sm {
            break;
        }
        aligned -= granularity;
    }
    Ok((best_blocks * limits.sm_count, best_block))
}

/// `cuFuncGetAttribute`: `CUfunction_attribute` 0..=9 (the runtime's `cudaFuncAttributes`).
pub fn attribute(function: u64, which: i32) -> Result<i32, CuError> {
    let (function, _) = known(function)?;
    let a = from_runtime(runtime::call(&PhosFuncGetAttributesRequest { function }))?.attr;
    let clamp = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
    Ok(match which {
        0 => a.max_threads_per_block,
        1 => clamp(a.shared_size_bytes),
        2 => clamp(a.const_size_bytes),
        3 => clamp(a.local_size_bytes),
        4 => a.num_regs,
        5 => a.ptx_version,
        6 => a.binary_version,
        7 => a.cache_mode_ca,
        8 => a.max_dynamic_shared_size_bytes,
        9 => a.preferred_shmem_carveout,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// `cuFuncSetAttribute`: the attributes the runtime's `cudaFuncSetAttribute` takes (same
/// numbers).
pub fn set_attribute(function: u64, attr: i32, value: i32) -> Result<(), CuError> {
    let (function, _) = known(function)?;
    from_runtime(runtime::call(&PhosFuncSetAttributeRequest { function, attr, value })).map(|_| ())
}

pub fn set_cache_config(function: u64, config: i32) -> Result<(), CuError> {
    let (function, _) = known(function)?;
    from_runtime(runtime::call(&PhosFuncSetCacheConfigRequest { function, config })).map(|_| ())
}

pub fn occupancy(function: u64, block_size: i32, dynamic_smem: usize, flags: u32) -> Result<i32, CuError> {
    let (function, _) = known(function)?;
    let r = from_runtime(runtime::call(&PhosOccupancyMaxActiveBlocksRequest {
        function,
        blockSize: block_size,
        dynamicSMemSize: dynamic_smem as u64,
        flags,
    }))?;
    Ok(r.numBlocks)
}

/// The parameter buffer of a launch: `kernel_params` (one pointer per parameter, each to a
/// value of the parameter's size) packed by the function's layout, or the buffer `extra`
/// names (`CU_LAUNCH_PARAM_BUFFER_POINTER`/`_SIZE`, whose size must be the layout's).
///
/// # Safety
/// `kernel_params` and `extra` must be what the driver's contract says (either may be null).
pub(crate) unsafe fn parameters(
    layout: &ParamLayout,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<Vec<u8>, CuError> {
    if !kernel_params.is_null() && !extra.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    if !extra.is_null() {
        let (mut buffer, mut size) = (std::ptr::null::<u8>(), None::<usize>);
        for i in (0..64).step_by(2) {
            // SAFETY: `extra` is a list of key/value pairs ended by CU_LAUNCH_PARAM_END (the
            // driver's contract); at most 32 pairs are read.
            let key = unsafe { extra.wrapping_add(i).read() } as usize;
            if key == PARAM_END {
                break;
            }
            // SAFETY: a key other than END has its value next.
            let value = unsafe { extra.wrapping_add(i + 1).read() };
            match key {
                PARAM_BUFFER_POINTER => buffer = value as *const u8,
                PARAM_BUFFER_SIZE if !value.is_null() => {
                    // SAFETY: the value of BUFFER_SIZE points to a `size_t` (the contract).
                    size = Some(unsafe { (value as *const usize).read_unaligned() });
                }
                _ => return Err(CuError::INVALID_VALUE),
            }
        }
        let size = size.ok_or(CuError::INVALID_VALUE)?;
        if size != layout.buffer_size || (buffer.is_null() && size > 0) {
            return Err(CuError::INVALID_VALUE);
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: `buffer` holds `size` bytes (the contract), checked against the layout.
        return Ok(unsafe { std::slice::from_raw_parts(buffer, size) }.to_vec());
    }
    let mut params = vec![0u8; layout.buffer_size];
    if layout.params.is_empty() {
        return Ok(params);
    }
    if kernel_params.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    for (i, &(offset, size)) in layout.params.iter().enumerate() {
        // SAFETY: `i` is below the function's parameter count, the length of `kernel_params`
        // (the contract).
        let src = unsafe { kernel_params.wrapping_add(i).read() } as *const u8;
        if src.is_null() || offset + size > params.len() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: `src` points to the parameter's `size` bytes (the contract); the range is
        // within `params` (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src, params[offset..offset + size].as_mut_ptr(), size) };
    }
    Ok(params)
}

/// `cuLaunchKernel`; a cooperative launch (all blocks resident at once) waits for its answer,
/// since a grid too large fails at launch.
///
/// # Safety
/// As [`parameters`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    function: u64,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    stream: u64,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> Result<(), CuError> {
    let (function, layout) = known(function)?;
    if [grid.x, grid.y, grid.z, block.x, block.y, block.z].contains(&0) {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract.
    let params = unsafe { parameters(&layout, kernel_params, extra)? };
    if cooperative {
        let request = PhosLaunchCooperativeKernelRequest {
            function,
            grid,
            block,
            sharedMem: shared_mem,
            stream,
            params: &params,
            paramSize: params.len() as u64,
        };
        return from_runtime(runtime::call(&request)).map(|_| ());
    }
    from_runtime(crate::cudart::launch::send(function, grid, block, shared_mem, stream, &params))
}

/// `CUlaunchConfig` (CUDA 12): grid, block, dynamic shared memory, stream, attributes.
#[repr(C)]
struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: u64,
    attrs: *const c_void,
    num_attrs: u32,
}

/// `CU_LAUNCH_ATTRIBUTE_*` that a launch may carry here, and the size of a
/// `CUlaunchAttribute` (an id padded to 8 bytes, a 64-byte value).
mod launch_attr {
    pub const IGNORE: u32 = 0;
    pub const COOPERATIVE: u32 = 2;
    pub const CLUSTER_DIMENSION: u32 = 4;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
    pub const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
    pub const PRIORITY: u32 = 8;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: u32 = 14;
    pub const SIZE: usize = 72;
}

/// Whether a launch's attributes ask for a cooperative launch. Hints a launch may ignore
/// without changing what it computes (scheduling preferences, priority, carveout, leave to
/// overlap with the previous kernel) are ignored; a cluster of one block is no cluster;
/// anything else is not carried.
///
/// # Safety
/// `attrs` must hold `count` `CUlaunchAttribute`s.
unsafe fn cooperative(attrs: *const c_void, count: u32) -> Result<bool, CuError> {
    use launch_attr::*;
    if count > 0 && attrs.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let mut cooperative = false;
    for i in 0..count.min(64) as usize {
        let at = (attrs as *const u8).wrapping_add(i * SIZE);
        // SAFETY: attribute `i` of `count` (this function's contract).
        let raw = unsafe { (at as *const [u8; SIZE]).read_unaligned() };
        let word = |k: usize| u32::from_ne_bytes([raw[8 + 4 * k], raw[9 + 4 * k], raw[10 + 4 * k], raw[11 + 4 * k]]);
        match u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]) {
            IGNORE
            | CLUSTER_SCHEDULING_POLICY_PREFERENCE
            | PROGRAMMATIC_STREAM_SERIALIZATION
            | PRIORITY
            | PREFERRED_SHARED_MEMORY_CARVEOUT => {}
            COOPERATIVE => cooperative = word(0) != 0,
            CLUSTER_DIMENSION if (0..3).all(|k| word(k) <= 1) => {}
            other => {
                if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit("cuLaunchKernelEx") {
                    tracing::warn!(
                        "cuLaunchKernelEx: launch attribute {other} is not supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED ({dropped} earlier lines dropped)"
                    );
                }
                return Err(CuError::NOT_SUPPORTED);
            }
        }
    }
    Ok(cooperative)
}

/// What an occupancy query of clusters reads of a launch configuration: a `CUlaunchConfig`
/// (`runtime`: a `cudaLaunchConfig_t`, whose dynamic shared memory is a `size_t`; the rest is
/// laid out alike) and the cluster dimension among its attributes (zeros: none given).
///
/// # Safety
/// `config` must be null or a configuration of that kind, its attributes readable.
unsafe fn cluster_query(config: *const c_void, runtime: bool) -> Result<(Dim3, Dim3, u32, Dim3), CuError> {
    if config.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a configuration, 56 bytes (this function's contract).
    let raw = unsafe { (config as *const [u8; 56]).read_unaligned() };
    let word = |at: usize| u32::from_ne_bytes(raw[at..at + 4].try_into().unwrap_or_default());
    let long = |at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().unwrap_or_default());
    let dim = |at: usize| Dim3 { x: word(at), y: word(at + 4), z: word(at + 8) };
    let smem = if runtime { u32::try_from(long(24)).map_err(|_| CuError::INVALID_VALUE)? } else { word(24) };
    let (attrs, count) = (long(40) as usize as *const u8, word(48));
    if count > 0 && attrs.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let mut cluster = Dim3 { x: 0, y: 0, z: 0 };
    for i in 0..count as usize {
        // SAFETY: attribute `i` of `count` (this function's contract).
        let a =
            unsafe { (attrs.wrapping_add(i * launch_attr::SIZE) as *const [u8; launch_attr::SIZE]).read_unaligned() };
        let at = |k: usize| u32::from_ne_bytes(a[k..k + 4].try_into().unwrap_or_default());
        if at(0) == launch_attr::CLUSTER_DIMENSION {
            cluster = Dim3 { x: at(8), y: at(12), z: at(16) };
        }
    }
    Ok((dim(0), dim(12), smem, cluster))
}

/// `cuOccupancyMaxActiveClusters` (`runtime`: `cudaOccupancyMaxActiveClusters`): the
/// server's answer (its driver's, on a GPU).
///
/// # Safety
/// As [`cluster_query`].
pub(crate) unsafe fn max_active_clusters(function: u64, config: *const c_void, runtime: bool) -> Result<i32, CuError> {
    let (function, _) = known(function)?;
    // SAFETY: as this function's contract.
    let (grid, block, smem, cluster) = unsafe { cluster_query(config, runtime) }?;
    let r = runtime::call(&PhosOccupancyMaxActiveClustersRequest {
        func: function,
        grid,
        block,
        sharedMem: smem,
        cluster,
    })?;
    Ok(r.numClusters)
}

/// `cuOccupancyMaxPotentialClusterSize` (`runtime`: the runtime's).
///
/// # Safety
/// As [`cluster_query`].
pub(crate) unsafe fn max_potential_cluster_size(
    function: u64,
    config: *const c_void,
    runtime: bool,
) -> Result<i32, CuError> {
    let (function, _) = known(function)?;
    // SAFETY: as this function's contract.
    let (grid, block, smem, _) = unsafe { cluster_query(config, runtime) }?;
    let r =
        runtime::call(&PhosOccupancyMaxPotentialClusterSizeRequest { func: function, grid, block, sharedMem: smem })?;
    Ok(r.clusterSize)
}

/// `cuLaunchKernelEx`: its configuration, with the attributes [`cooperative`] takes
/// (`per_thread`: `cuLaunchKernelEx_ptsz`, whose null stream is the calling thread's).
///
/// # Safety
/// `config` must be null or a `CUlaunchConfig`; as [`parameters`] for the rest.
pub unsafe fn launch_ex(
    config: *const c_void,
    function: u64,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> Result<(), CuError> {
    /// `CU_STREAM_PER_THREAD`.
    const PER_THREAD_STREAM: u64 = 2;
    if config.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `config` is a `CUlaunchConfig` (this function's contract).
    let mut c = unsafe { (config as *const LaunchConfig).read_unaligned() };
    if per_thread && c.stream == 0 {
        c.stream = PER_THREAD_STREAM;
    }
    // SAFETY: the configuration's attributes (this function's contract).
    let cooperative = unsafe { cooperative(c.attrs, c.num_attrs) }?;
    let dim = |d: [u32; 3]| Dim3 { x: d[0], y: d[1], z: d[2] };
    // SAFETY: as this function's contract.
    unsafe { launch(function, dim(c.grid), dim(c.block), c.shared_mem, c.stream, kernel_params, extra, cooperative) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
        .visible .entry scale(.param .u64 p, .param .f32 f, .param .u32 n)\n{\n ret;\n}\n";

    fn attribute(id: u32, words: [u32; 3]) -> [u8; launch_attr::SIZE] {
        let mut a = [0u8; launch_attr::SIZE];
        a[0..4].copy_from_slice(&id.to_ne_bytes());
        for (k, w) in words.iter().enumerate() {
            a[8 + 4 * k..12 + 4 * k].copy_from_slice(&w.to_ne_bytes());
        }
        a
    }

    #[test]
    fn launch_attributes_carried_hinted_or_refused() {
        let list = |attrs: &[[u8; launch_attr::SIZE]]| {
            // SAFETY: `attrs.len()` attributes of the driver's layout.
            unsafe { cooperative(attrs.as_ptr() as *const c_void, attrs.len() as u32) }
        };
        assert_eq!(list(&[]), Ok(false));
        assert_eq!(list(&[attribute(launch_attr::COOPERATIVE, [1, 0, 0])]), Ok(true));
        assert_eq!(list(&[attribute(launch_attr::CLUSTER_DIMENSION, [1, 1, 1]), attribute(8, [3, 0, 0])]), Ok(false));
        assert_eq!(list(&[attribute(launch_attr::CLUSTER_DIMENSION, [2, 1, 1])]), Err(CuError::NOT_SUPPORTED));
        assert_eq!(list(&[attribute(1, [0, 0, 0])]), Err(CuError::NOT_SUPPORTED), "an access policy window");
    }

    #[test]
    fn ptx_images_give_their_layouts() {
        let l = layouts(PTX.as_bytes()).unwrap();
        let scale = &l["scale"];
        assert_eq!(scale.params, vec![(0, 8), (8, 4), (12, 4)]);
        assert_eq!(scale.buffer_size, 16);
    }

    #[test]
    fn both_parameter_forms_pack_the_same_buffer() {
        let layout = ParamLayout { buffer_size: 16, params: vec![(0, 8), (8, 4), (12, 4)] };
        let (mut p, mut f, mut n) = (0x1234_5678u64, 2.5f32, 7u32);
        let mut args =
            [&mut p as *mut u64 as *mut c_void, &mut f as *mut f32 as *mut c_void, &mut n as *mut u32 as *mut c_void];
        // SAFETY: one pointer per parameter, each to a value of its size.
        let packed = unsafe { parameters(&layout, args.as_mut_ptr(), std::ptr::null_mut()) }.unwrap();
        let mut size = packed.len();
        let mut extra = [
            PARAM_BUFFER_POINTER as *mut c_void,
            packed.as_ptr() as *mut c_void,
            PARAM_BUFFER_SIZE as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            PARAM_END as *mut c_void,
        ];
        // SAFETY: a buffer of the layout's size, ended by END.
        let from_extra = unsafe { parameters(&layout, std::ptr::null_mut(), extra.as_mut_ptr()) }.unwrap();
        assert_eq!(packed, from_extra);
        assert_eq!(&packed[8..12], &2.5f32.to_ne_bytes());
        let mut wrong = 8usize;
        extra[3] = &mut wrong as *mut usize as *mut c_void;
        // SAFETY: `extra` is the same END-terminated list, now naming a buffer size that is not
        // the layout's; `parameters` refuses it before reading the buffer.
        let refused = unsafe { parameters(&layout, std::ptr::null_mut(), extra.as_mut_ptr()) };
        assert_eq!(refused, Err(CuError::INVALID_VALUE));
    }
}
