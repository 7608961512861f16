//! Kernel launches: the `<<<...>>>` configuration stack nvcc pushes and pops around each
//! launch, and packing `void **args` into the kernel's parameter buffer.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex};

use phos_protocol::CudaError;
use phos_protocol::cudart::{PhosLaunchCooperativeKernelRequest, PhosLaunchKernelRequest};
use phos_protocol::types::Dim3;

use crate::{registry, runtime};

/// `cudaStreamPerThread`: what stream 0 means for code built with per-thread default streams.
pub const STREAM_PER_THREAD: u64 = 2;

#[derive(Clone, Copy)]
struct LaunchConfig {
    grid: Dim3,
    block: Dim3,
    shared_mem: usize,
    stream: *mut c_void,
}

thread_local! {
    static CONFIGS: RefCell<Vec<LaunchConfig>> = const { RefCell::new(Vec::new()) };
}

/// `__cudaPushCallConfiguration`.
pub fn push_config(grid: Dim3, block: Dim3, shared_mem: usize, stream: *mut c_void) {
    let _ = CONFIGS.try_with(|c| c.borrow_mut().push(LaunchConfig { grid, block, shared_mem, stream }));
}

/// `__cudaPopCallConfiguration`.
///
/// # Safety
/// Each out pointer must be writable (nvcc passes locals).
pub unsafe fn pop_config(
    grid: *mut Dim3,
    block: *mut Dim3,
    shared_mem: *mut usize,
    stream: *mut c_void,
) -> Result<(), CudaError> {
    let cfg = CONFIGS.try_with(|c| c.borrow_mut().pop()).ok().flatten().ok_or(CudaError::InvalidConfiguration)?;
    // Each pointer is written only when not null, and is then writable (this function's
    // contract; nvcc passes its own locals).
    if !grid.is_null() {
        // SAFETY: not null, so writable: see above.
        unsafe { *grid = cfg.grid };
    }
    if !block.is_null() {
        // SAFETY: as above.
        unsafe { *block = cfg.block };
    }
    if !shared_mem.is_null() {
        // SAFETY: as above.
        unsafe { *shared_mem = cfg.shared_mem };
    }
    if !stream.is_null() {
        // SAFETY: as above: a `cudaStream_t` of nvcc's.
        unsafe { *(stream as *mut *mut c_void) = cfg.stream };
    }
    Ok(())
}

/// Launch the kernel registered for host stub `func`.
///
/// CUDA 13 reports a launch configuration the device cannot run as `cudaErrorInvalidValue`
/// on every launch path, where CUDA 11 and 12 report `cudaErrorInvalidConfiguration`
/// (measured on an H100 with CUDA 13.0 and 11.8).
///
/// # Safety
/// `args` must hold one pointer per kernel parameter, each to a value of the parameter's size.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: *mut c_void,
    per_thread_default_stream: bool,
    cooperative: bool,
) -> Result<(), CudaError> {
    let r =
        // SAFETY: `args` as this function's contract gives it, what `launch_as_is` reads.
        unsafe { launch_as_is(func, grid, block, args, shared_mem, stream, per_thread_default_stream, cooperative) };
    match r {
        Err(CudaError::InvalidConfiguration) if crate::soname::current_abi().major() >= 13 => {
            Err(CudaError::InvalidValue)
        }
        r => r,
    }
}

/// [`launch`], with each CUDA version's own error for a configuration the device cannot run.
///
/// # Safety
/// As [`launch`].
#[allow(clippy::too_many_arguments)]
unsafe fn launch_as_is(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: *mut c_void,
    per_thread_default_stream: bool,
    cooperative: bool,
) -> Result<(), CudaError> {
    // SAFETY: `args` as this function's contract gives it, what `packed` reads.
    let (function, params) = unsafe { packed(func, args)? };
    // The kernel sees what the host wrote to __managed__ variables.
    super::managed::before_launch()?;
    let stream = match stream as u64 {
        0 if per_thread_default_stream => STREAM_PER_THREAD,
        s => s,
    };
    let shared_mem = u32::try_from(shared_mem).map_err(|_| CudaError::InvalidValue)?;
    if cooperative {
        // A grid too large to be resident at once fails at launch: wait for the answer.
        runtime::launch_on_legacy(stream);
        return runtime::call(&PhosLaunchCooperativeKernelRequest {
            function,
            grid,
            block,
            sharedMem: shared_mem,
            stream,
            params: &params,
            paramSize: params.len() as u64,
        })
        .map(|_| ());
    }
    send(function, grid, block, shared_mem, stream, &params)
}

/// Send a launch of server function `function` with its packed parameter buffer: without
/// waiting when its shape has launched before (see [`LaunchShape`]), else waiting for the
/// answer. The driver API's launches end here too.
pub fn send(
    function: u64,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    stream: u64,
    params: &[u8],
) -> Result<(), CudaError> {
    let request = PhosLaunchKernelRequest {
        function,
        grid,
        block,
        sharedMem: shared_mem,
        stream,
        params,
        paramSize: params.len() as u64,
    };
    let shape = LaunchShape { function, device: runtime::current_device(), block, shared_mem, stream };
    let proven = grid_in_limits(grid) && proven_shapes().contains(&shape);
    runtime::launch_on_legacy(stream);
    if proven {
        return runtime::call_async(&request);
    }
    runtime::call(&request)?;
    proven_shapes().insert(shape);
    Ok(())
}

/// The function handle of the kernel registered for host stub `func` (or of the loaded
/// library's kernel `func` is, CUDA 12's `cudaKernel_t`), and `args` packed into its parameter
/// buffer.
///
/// # Safety
/// `args` must hold one pointer per kernel parameter, each to a value of the parameter's size.
pub unsafe fn packed(func: *const c_void, args: *mut *mut c_void) -> Result<(u64, Vec<u8>), CudaError> {
    let Some(kernel) = registry::kernel(func) else {
        let layout = crate::cuda::modules::loaded_function(func as u64).ok_or(CudaError::InvalidDeviceFunction)?;
        // SAFETY: `args` as this function's contract gives it.
        return Ok((func as u64, unsafe { pack(&layout, args)? }));
    };
    let function = kernel.remote()?;
    // SAFETY: `args` as this function's contract gives it.
    Ok((function, unsafe { pack(&kernel.layout()?, args)? }))
}

/// `args` packed into a parameter buffer of `layout`.
///
/// # Safety
/// As [`packed`].
unsafe fn pack(layout: &registry::ParamLayout, args: *mut *mut c_void) -> Result<Vec<u8>, CudaError> {
    let mut params = vec![0u8; layout.buffer_size];
    if !layout.params.is_empty() && args.is_null() {
        return Err(CudaError::InvalidValue);
    }
    for (i, &(offset, size)) in layout.params.iter().enumerate() {
        // SAFETY: `i` is below the kernel's parameter count, and `args` (not null, checked
        // above) holds one pointer per parameter (this function's contract).
        let at = unsafe { args.add(i) };
        // SAFETY: that pointer's place, readable.
        let src = unsafe { *at } as *const u8;
        if src.is_null() || offset + size > params.len() {
            return Err(CudaError::InvalidValue);
        }
        // SAFETY: `src` points to the parameter's `size` bytes (this function's contract);
        // `offset + size` is within `params` (checked just above).
        unsafe { std::ptr::copy_nonoverlapping(src, params[offset..offset + size].as_mut_ptr(), size) };
    }
    Ok(params)
}

/// What decides whether a launch can fail at launch time: CUDA checks the block shape and
/// dynamic shared memory against the kernel and the device, the stream handle, and the grid
/// against the device's limits. A launch whose shape has launched successfully before (and
/// whose grid is within the limits every CUDA device has) cannot fail those checks, so it is
/// sent without waiting; any other launch waits for its answer, so its error comes back from
/// the launch itself, as on CUDA.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct LaunchShape {
    function: u64,
    device: i32,
    block: Dim3,
    shared_mem: u32,
    stream: u64,
}

fn proven_shapes() -> std::sync::MutexGuard<'static, HashSet<LaunchShape>> {
    static SHAPES: LazyLock<Mutex<HashSet<LaunchShape>>> = LazyLock::new(Default::default);
    SHAPES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Grid dimensions every device since compute capability 3.0 accepts.
fn grid_in_limits(grid: Dim3) -> bool {
    (1..=i32::MAX as u32).contains(&grid.x) && (1..=65535).contains(&grid.y) && (1..=65535).contains(&grid.z)
}
