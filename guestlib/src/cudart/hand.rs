//! The pieces of the runtime the spec marks `implemented_by(guest)`, plus the utilities,
//! ABI writers and hooks its expressions name. Everything here is guest-local state or
//! hand-written glue; all remote calls go through the generated request types.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use phos_protocol::cudart::{self, consts};
use phos_protocol::types::{DeviceProperties, Dim3, IpcHandle};
use phos_protocol::{CudaError, cudart::FunctionId};

use phos_protocol::types::{ChannelFormatDesc, Extent, PitchedPtr};

use super::stubs::HandWritten;
use super::{
    arrays, attributes, batch, capture, copies, device, execution, graph_extra, graphs, ipc, launch, library, managed,
    memory, memsets, pools, proofs, user_objects,
};
use crate::abi::Abi;
use crate::{callbacks, hostmem, registry, runtime, soname};

/// The implementation of [`HandWritten`].
pub struct Hand;

/// A `_ptsz` entry point's stream: the null stream is the thread's default stream.
fn per_thread(stream: *mut c_void) -> *mut c_void {
    if stream.is_null() { consts::cudaStreamPerThread as usize as *mut c_void } else { stream }
}

fn code(r: Result<(), CudaError>) -> i32 {
    runtime::note_runtime_call();
    match r {
        Ok(()) => cudart::SUCCESS,
        Err(e) => {
            runtime::set_last_error(e);
            e.0
        }
    }
}

/// NUL-terminated error names and texts for this process's ABI, built once.
fn error_strings() -> &'static HashMap<i32, (CString, CString)> {
    static TABLE: OnceLock<HashMap<i32, (CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let major = soname::current_abi().major();
        cudart::ERRORS
            .iter()
            .map(|e| {
                let err = CudaError(e.code as i32);
                let text = if e.code == 0 { e.text } else { err.text(major) };
                (e.code as i32, (CString::new(e.name).unwrap(), CString::new(text).unwrap()))
            })
            .collect()
    })
}

/// nvcc's start-up code registers objects Phos does not carry; using them fails later.
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
unsafe fn registration_not_supported(what: &str, name: *const c_char) {
    crate::log::init();
    // SAFETY: null (not read) or a NUL-terminated string: this function's contract.
    let name = if name.is_null() { "?" } else { unsafe { runtime::c_str(name) }.unwrap_or("?") };
    tracing::warn!("{what} {name} is not supported by Phos; using it fails with cudaErrorNotSupported");
}

const UNRECOGNIZED: &std::ffi::CStr = c"unrecognized error code";

pub(crate) fn memcpy_kind_of(addr: u64) -> bool {
    runtime::session_if_open().is_some_and(|s| s.contains(addr))
        || registry::is_module_global(addr)
        || hostmem::managed(addr as usize).is_some()
}

#[allow(non_snake_case)]
/// `cudaMemcpy`/`cudaMemcpyAsync` fast paths: copies of pinned arena memory (allocated, or
/// registered and moved there) are DMAs of the guest's pages (`phosMemcpyPinned`); other
/// host<->device copies move through the channel's staging region (all but small async
/// host-to-device ones: [`runtime::staged_small_min`]); proven device-to-device copies and
/// small pageable host-to-device ones go without waiting (`copies.rs`), and a copy that
/// waited proves its device ranges. `stream` is `None` for `cudaMemcpy`.
unsafe fn fast_copy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: i32,
    stream: Option<u64>,
) -> Option<Result<(), CudaError>> {
    let direction =
        match <Hand as HandWritten>::resolve_memcpy_kind(kind as i128, dst as usize as i128, src as usize as i128) {
            Ok(d) => d as i32,
            Err(e) => return Some(Err(e)),
        };
    if direction == consts::cudaMemcpyDeviceToDevice {
        let (dst, src) = (dst as usize as u64, src as usize as u64);
        return Some(copies::device_to_device(dst, src, count, kind, stream));
    }
    let (dst_pinned, src_pinned) =
        (hostmem::pinned_address(dst as usize, count), hostmem::pinned_address(src as usize, count));
    if direction == consts::cudaMemcpyHostToDevice
        && (src_pinned.is_none() || stream.is_none())
        // SAFETY: this function's arguments: `src` is `count` readable bytes when not null
        // (this function's contract).
        && let Some(r) = unsafe { copies::host_to_device_small(dst as usize as u64, src, count, kind, stream) }
    {
        return Some(r);
    }
    let small_min = runtime::staged_small_min();
    if count < small_min.min(runtime::STAGED_MIN) && dst_pinned.is_none() && src_pinned.is_none() {
        return None;
    }
    let epoch = proofs::epoch();
    // A copy the server makes synchronously on the legacy stream (a `cudaMemcpy`, or a staged
    // copy on stream 0), which runs after the legacy stream's earlier work and returns once
    // done: its success tells that the kernels before it there have finished, which lets
    // later small copies return early (`runtime::work_settled`). Marked only while page-locked
    // memory, which those kernels could have written, exists.
    let mark = |legacy: bool| (legacy && count > 0 && hostmem::any_page_locked()).then(runtime::work_mark).flatten();
    let pinned = |device: *const c_void, host: u64| {
        let req = cudart::PhosMemcpyPinnedRequest {
            device: device as usize as u64,
            host,
            count: count as u64,
            direction,
            stream: stream.unwrap_or(0),
            ordered: stream.is_some() as i32,
        };
        let mark = mark(stream.is_none());
        let r = runtime::call(&req).map(|_| ());
        if stream.is_some() && direction == consts::cudaMemcpyDeviceToHost {
            // Queued: it writes page-locked memory, which the host reads without a call, later.
            runtime::note_work(None);
        }
        if r.is_ok() {
            copies::proved(epoch, device as usize as u64, count, stream);
            if let Some(mark) = mark {
                runtime::work_done(mark, false);
            }
        }
        Some(r)
    };
    match (direction, src_pinned, dst_pinned) {
        (consts::cudaMemcpyHostToDevice, Some(host), _) => return pinned(dst, host),
        (consts::cudaMemcpyDeviceToHost, _, Some(host)) => return pinned(src, host),
        _ if count < small_min => return None,
        // An async host-to-device copy of pageable memory returns once the driver has taken
        // the bytes, without waiting for the stream's earlier work: carried in its frame, the
        // server's driver takes them so; staged, the server waits for the stream.
        (consts::cudaMemcpyHostToDevice, ..) if stream.is_some() && count < runtime::STAGED_MIN => return None,
        _ => {}
    }
    let ordered_on = stream;
    let stream = stream.unwrap_or(0);
    let mark = mark(stream == 0);
    let (device, r) = match direction {
        // SAFETY: `src` is not null and points to `count` readable bytes: what `cudaMemcpy`
        // asks of its caller for a host source (this function's contract).
        consts::cudaMemcpyHostToDevice if !src.is_null() => (dst as usize as u64, unsafe {
            runtime::staged_copy(direction, dst as usize as u64, src as *mut u8, count, stream)
        }?),
        // SAFETY: `dst` is not null and points to `count` writable bytes: what `cudaMemcpy`
        // asks of its caller for a host destination (this function's contract).
        consts::cudaMemcpyDeviceToHost if !dst.is_null() => (src as usize as u64, unsafe {
            runtime::staged_copy(direction, src as usize as u64, dst as *mut u8, count, stream)
        }?),
        _ => return None,
    };
    if r.is_ok() {
        copies::proved(epoch, device, count, ordered_on);
        if let Some(mark) = mark {
            runtime::work_done(mark, false);
        }
    }
    Some(r.map_err(CudaError::from))
}

impl HandWritten for Hand {
    unsafe fn host_copy(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: i32,
    ) -> Option<Result<(), CudaError>> {
        // SAFETY: this export's arguments, passed on (at most retyped): `fast_copy` asks of them
        // what CUDA asks of this export's caller.
        unsafe { fast_copy(dst, src, count, kind, None) }
    }

    unsafe fn host_copy_async(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: i32,
        stream: *mut c_void,
    ) -> Option<Result<(), CudaError>> {
        // SAFETY: this export's arguments, passed on (at most retyped): `fast_copy` asks of them
        // what CUDA asks of this export's caller.
        unsafe { fast_copy(dst, src, count, kind, Some(stream as usize as u64)) }
    }

    unsafe fn cudaGetLastError() -> i32 {
        runtime::take_last_error()
    }

    unsafe fn cudaPeekAtLastError() -> i32 {
        runtime::peek_last_error()
    }

    unsafe fn cudaGetErrorString(error: i32) -> *const c_char {
        error_strings().get(&error).map_or(UNRECOGNIZED.as_ptr(), |(_, text)| text.as_ptr())
    }

    unsafe fn cudaGetErrorName(error: i32) -> *const c_char {
        error_strings().get(&error).map_or(UNRECOGNIZED.as_ptr(), |(name, _)| name.as_ptr())
    }

    unsafe fn cudaSetDevice(device: i32) -> i32 {
        code(runtime::session().map_err(CudaError::from).and_then(|s| {
            if device < 0 || device >= s.device_count {
                return Err(CudaError::InvalidDevice);
            }
            runtime::set_current_device(device);
            Ok(())
        }))
    }

    unsafe fn cudaGetDevice(device: *mut i32) -> i32 {
        if device.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: `device` is not null (checked above) and points to a writable value of its type:
        // what CUDA asks of this export's caller.
        unsafe { *device = runtime::current_device() };
        cudart::SUCCESS
    }

    unsafe fn cudaRuntimeGetVersion(runtime_version: *mut i32) -> i32 {
        if runtime_version.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: `runtime_version` is not null (checked above) and points to a writable value of
        // its type: what CUDA asks of this export's caller.
        unsafe { *runtime_version = soname::current_abi().runtime_version() };
        cudart::SUCCESS
    }

    unsafe fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `Self::cudaHostAlloc` asks
        // of them what CUDA asks of this export's caller.
        unsafe { Self::cudaHostAlloc(ptr, size, 0) }
    }

    unsafe fn cudaHostAlloc(p_host: *mut *mut c_void, size: usize, flags: u32) -> i32 {
        if p_host.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: `p_host` is not null (checked above) and points to a writable value of its type:
        // what CUDA asks of this export's caller.
        code(hostmem::alloc(size, flags).map(|p| unsafe { *p_host = p }))
    }

    unsafe fn cudaFreeHost(ptr: *mut c_void) -> i32 {
        proofs::forget();
        // SAFETY: this export's arguments, passed on (at most retyped): `hostmem::free` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { hostmem::free(ptr) })
    }

    unsafe fn cudaLaunchKernel(
        func: *const c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `launch::launch` asks of
        // them what CUDA asks of this export's caller.
        super::rt::api_call(FunctionId::CudaLaunchKernel, || unsafe {
            launch::launch(func, grid, block, args, shared_mem, stream, false, false)
        })
    }

    unsafe fn cudaLaunchKernel_ptsz(
        func: *const c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `launch::launch` asks of
        // them what CUDA asks of this export's caller.
        super::rt::api_call(FunctionId::CudaLaunchKernelPtsz, || unsafe {
            launch::launch(func, grid, block, args, shared_mem, stream, true, false)
        })
    }

    unsafe fn __cudaGetKernel(kernel: *mut *mut c_void, func: *const c_void) -> i32 {
        // The kernel handle is the host stub's address: it names the registered kernel.
        if kernel.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        match registry::kernel(func) {
            Some(_) => {
                // SAFETY: `kernel` is not null (checked above) and points to a writable value of
                // its type: what CUDA asks of this export's caller.
                unsafe { *kernel = func as *mut c_void };
                cudart::SUCCESS
            }
            None => code(Err(CudaError::InvalidDeviceFunction)),
        }
    }

    unsafe fn __cudaLaunchKernel(
        kernel: *mut c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `launch::launch` asks of
        // them what CUDA asks of this export's caller.
        super::rt::api_call(FunctionId::PrivCudaLaunchKernel, || unsafe {
            launch::launch(kernel, grid, block, args, shared_mem, stream, false, false)
        })
    }

    unsafe fn __cudaLaunchKernel_ptsz(
        kernel: *mut c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `launch::launch` asks of
        // them what CUDA asks of this export's caller.
        super::rt::api_call(FunctionId::PrivCudaLaunchKernelPtsz, || unsafe {
            launch::launch(kernel, grid, block, args, shared_mem, stream, true, false)
        })
    }

    unsafe fn __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `registry::register_fat_binary` asks of them what CUDA asks of this export's caller.
        unsafe { registry::register_fat_binary(fat_cubin) }
    }

    unsafe fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

    unsafe fn __cudaUnregisterFatBinary(_handle: *mut *mut c_void) {
        // Runs from exit handlers. The session ends with the process and the server drops
        // every module then; but device printf output still pending is printed at exit, as
        // CUDA does when its context is torn down, so one synchronising call fetches it.
        // Thread-local storage is gone by now, and `tracing`'s subscriber panics on it: a call
        // that would have to reconnect (and log) to a session that has ended is not made, and
        // a panic anyway (the router gone) must not abort the exiting program.
        static FLUSHED: std::sync::Once = std::sync::Once::new();
        FLUSHED.call_once(|| {
            if runtime::session_if_open().is_some() && !runtime::session_ended() {
                let _ = std::panic::catch_unwind(|| runtime::call(&cudart::CudaDeviceSynchronizeRequest {}));
            }
        });
    }

    unsafe fn __cudaRegisterFunction(
        handle: *mut *mut c_void,
        host_fun: *const c_char,
        _device_fun: *mut c_char,
        device_name: *const c_char,
        _thread_limit: i32,
        _tid: *mut Dim3,
        _bid: *mut Dim3,
        _b_dim: *mut Dim3,
        _g_dim: *mut Dim3,
        _w_size: *mut i32,
    ) {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `registry::register_function` asks of them what CUDA asks of this export's caller.
        unsafe { registry::register_function(handle, host_fun, device_name) }
    }

    unsafe fn __cudaRegisterVar(
        handle: *mut *mut c_void,
        host_var: *mut c_char,
        _device_address: *mut c_char,
        device_name: *const c_char,
        _ext: i32,
        size: usize,
        _constant: i32,
        _global: i32,
    ) {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `registry::register_variable` asks of them what CUDA asks of this export's caller.
        unsafe { registry::register_variable(handle, host_var, device_name, size) }
    }

    unsafe fn __cudaRegisterManagedVar(
        handle: *mut *mut c_void,
        host_var_ptr_address: *mut *mut c_void,
        _device_address: *mut c_char,
        device_name: *const c_char,
        _ext: i32,
        size: usize,
        _constant: i32,
        _global: i32,
    ) {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `managed::register_var` asks of them what CUDA asks of this export's caller.
        unsafe { managed::register_var(handle, host_var_ptr_address, device_name, size) }
    }

    unsafe fn __cudaPushCallConfiguration(grid: Dim3, block: Dim3, shared_mem: usize, stream: *mut c_void) -> u32 {
        launch::push_config(grid, block, shared_mem, stream);
        0
    }

    unsafe fn __cudaPopCallConfiguration(
        grid: *mut Dim3,
        block: *mut Dim3,
        shared_mem: *mut usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `launch::pop_config` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { launch::pop_config(grid, block, shared_mem, stream) })
    }

    unsafe fn __cudaInitModule(handle: *mut *mut c_void) -> c_char {
        managed::init_module(handle)
    }

    // ---- Stream attributes (attributes.rs)

    unsafe fn cudaStreamSetAttribute(stream: *mut c_void, attr: i32, value: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `attributes::stream_set`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { attributes::stream_set(stream, attr, value) })
    }

    unsafe fn cudaStreamSetAttribute_ptsz(stream: *mut c_void, attr: i32, value: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on with the per-thread stream named:
        // `attributes::stream_set` asks of them what CUDA asks of this export's caller.
        code(unsafe { attributes::stream_set(per_thread(stream), attr, value) })
    }

    unsafe fn cudaStreamGetAttribute(stream: *mut c_void, attr: i32, value_out: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `attributes::stream_get`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { attributes::stream_get(stream, attr, value_out) })
    }

    unsafe fn cudaStreamGetAttribute_ptsz(stream: *mut c_void, attr: i32, value_out: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on with the per-thread stream named:
        // `attributes::stream_get` asks of them what CUDA asks of this export's caller.
        code(unsafe { attributes::stream_get(per_thread(stream), attr, value_out) })
    }

    unsafe fn cudaStreamCopyAttributes(dst: *mut c_void, src: *mut c_void) -> i32 {
        code(attributes::stream_copy(dst, src))
    }

    unsafe fn cudaStreamCopyAttributes_ptsz(dst: *mut c_void, src: *mut c_void) -> i32 {
        code(attributes::stream_copy(per_thread(dst), per_thread(src)))
    }

    // ---- Managed memory (managed.rs)

    unsafe fn cudaMallocManaged(dev_ptr: *mut *mut c_void, size: usize, flags: u32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `managed::malloc_managed`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { managed::malloc_managed(dev_ptr, size, flags) })
    }

    unsafe fn free_managed(dev_ptr: *mut c_void) -> Option<Result<(), CudaError>> {
        managed::free_managed(dev_ptr)
    }

    // ---- IPC events (ipc.rs)

    unsafe fn note_ipc_event(_handle: *mut IpcHandle, event: *mut c_void) -> Option<Result<(), CudaError>> {
        ipc::note_exported(event)
    }

    unsafe fn open_ipc_event(event: *mut *mut c_void, handle: IpcHandle) -> Option<Result<(), CudaError>> {
        // SAFETY: this export's `event`, null or writable by its contract.
        unsafe { ipc::open(event, handle) }
    }

    unsafe fn ipc_record(event: *mut c_void, stream: *mut c_void) -> Option<Result<(), CudaError>> {
        ipc::record(event, stream)
    }

    unsafe fn ipc_record_with_flags(
        event: *mut c_void,
        stream: *mut c_void,
        flags: u32,
    ) -> Option<Result<(), CudaError>> {
        ipc::record_with_flags(event, stream, flags)
    }

    unsafe fn cudaMemAdvise(dev_ptr: *const c_void, count: usize, advice: i32, location: u64) -> i32 {
        code(managed::advise_abi(dev_ptr, count, advice, location))
    }

    unsafe fn cudaMemAdvise_v2(dev_ptr: *const c_void, count: usize, advice: i32, location: u64) -> i32 {
        code(managed::advise(dev_ptr, count, advice, location, true))
    }

    unsafe fn cudaMemPrefetchAsync(
        dev_ptr: *const c_void,
        count: usize,
        location: u64,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        code(managed::prefetch_abi(dev_ptr, count, location, flags))
    }

    unsafe fn cudaMemPrefetchAsync_ptsz(
        dev_ptr: *const c_void,
        count: usize,
        location: u64,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        code(managed::prefetch_abi(dev_ptr, count, location, flags))
    }

    unsafe fn cudaMemPrefetchAsync_v2(
        dev_ptr: *const c_void,
        count: usize,
        location: u64,
        flags: u32,
        _stream: *mut c_void,
    ) -> i32 {
        code(managed::prefetch(dev_ptr, count, location, u64::from(flags), true))
    }

    unsafe fn cudaMemPrefetchAsync_v2_ptsz(
        dev_ptr: *const c_void,
        count: usize,
        location: u64,
        flags: u32,
        _stream: *mut c_void,
    ) -> i32 {
        code(managed::prefetch(dev_ptr, count, location, u64::from(flags), true))
    }

    unsafe fn cudaStreamAttachMemAsync(_stream: *mut c_void, dev_ptr: *mut c_void, length: usize, flags: u32) -> i32 {
        code(managed::attach(dev_ptr, length, flags))
    }

    unsafe fn cudaStreamAttachMemAsync_ptsz(
        _stream: *mut c_void,
        dev_ptr: *mut c_void,
        length: usize,
        flags: u32,
    ) -> i32 {
        code(managed::attach(dev_ptr, length, flags))
    }

    unsafe fn cudaMemRangeGetAttribute(
        data: *mut c_void,
        data_size: usize,
        attribute: i32,
        dev_ptr: *const c_void,
        count: usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `managed::range_get_attribute` asks of them what CUDA asks of this export's caller.
        code(unsafe { managed::range_get_attribute(data, data_size, attribute, dev_ptr, count) })
    }

    unsafe fn cudaMemRangeGetAttributes(
        data: *mut *mut c_void,
        data_sizes: *mut usize,
        attributes: *mut i32,
        num_attributes: usize,
        dev_ptr: *const c_void,
        count: usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `managed::range_get_attributes` asks of them what CUDA asks of this export's caller.
        code(unsafe { managed::range_get_attributes(data, data_sizes, attributes, num_attributes, dev_ptr, count) })
    }

    // ---- Device management (device.rs)

    unsafe fn cudaSetDeviceFlags(flags: u32) -> i32 {
        code(device::set_device_flags(flags))
    }

    unsafe fn cudaGetDeviceFlags(flags: *mut u32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `device::get_device_flags`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { device::get_device_flags(flags) })
    }

    unsafe fn cudaInitDevice(device: i32, device_flags: u32, flags: u32) -> i32 {
        code(device::init_device(device, device_flags, flags))
    }

    unsafe fn cudaSetValidDevices(device_arr: *mut i32, len: i32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `device::set_valid_devices`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { device::set_valid_devices(device_arr, len) })
    }

    unsafe fn cudaChooseDevice(device: *mut i32, prop: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `device::choose_device`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { device::choose_device(device, prop) })
    }

    unsafe fn cudaDeviceGetPCIBusId(pci_bus_id: *mut c_char, len: i32, device: i32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `device::get_pci_bus_id`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { device::get_pci_bus_id(pci_bus_id, len, device) })
    }

    unsafe fn cudaDeviceGetByPCIBusId(device: *mut i32, pci_bus_id: *const c_char) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `device::get_by_pci_bus_id`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { device::get_by_pci_bus_id(device, pci_bus_id) })
    }

    unsafe fn cudaGetDriverEntryPoint(
        symbol: *const c_char,
        func_ptr: *mut *mut c_void,
        flags: u64,
        driver_status: *mut i32,
    ) -> i32 {
        // CUDA 11's entry point has no status parameter: its register is not ours to read.
        let abi = soname::current_abi();
        let has_status = abi.major() >= 12;
        let version = abi.runtime_version() as u32;
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `device::driver_entry_point` asks of them what CUDA asks of this export's caller.
        code(unsafe { device::driver_entry_point(symbol, func_ptr, version, flags, driver_status, has_status) })
    }

    unsafe fn cudaGetDriverEntryPointByVersion(
        symbol: *const c_char,
        func_ptr: *mut *mut c_void,
        cuda_version: u32,
        flags: u64,
        driver_status: *mut i32,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `device::driver_entry_point` asks of them what CUDA asks of this export's caller.
        code(unsafe { device::driver_entry_point(symbol, func_ptr, cuda_version, flags, driver_status, true) })
    }

    unsafe fn cudaSetDoubleForDevice(d: *mut f64) -> i32 {
        code(if d.is_null() { Err(CudaError::InvalidValue) } else { Ok(()) })
    }

    unsafe fn cudaSetDoubleForHost(d: *mut f64) -> i32 {
        code(if d.is_null() { Err(CudaError::InvalidValue) } else { Ok(()) })
    }

    unsafe fn cudaDeviceGetP2PAttribute(value: *mut i32, attr: i32, src_device: i32, dst_device: i32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `device::p2p_attribute`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { device::p2p_attribute(value, attr, src_device, dst_device) })
    }

    unsafe fn cudaDeviceFlushGPUDirectRDMAWrites(target: i32, scope: i32) -> i32 {
        // cudaFlushGPUDirectRDMAWritesTargetCurrentDevice; scopes ToOwner and ToAllDevices.
        code(if target == 0 && (scope == 100 || scope == 200) { Ok(()) } else { Err(CudaError::InvalidValue) })
    }

    unsafe fn cudaDeviceGetGraphMemAttribute(device: i32, attr: i32, value: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on: `graphs::get_mem_attribute` asks of them
        // what CUDA asks of this export's caller.
        code(device::check_device(device).and_then(|_| unsafe { graphs::get_mem_attribute(device, attr, value) }))
    }

    unsafe fn cudaDeviceSetGraphMemAttribute(device: i32, attr: i32, value: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on: `graphs::set_mem_attribute` asks of them
        // what CUDA asks of this export's caller.
        code(device::check_device(device).and_then(|_| unsafe { graphs::set_mem_attribute(device, attr, value) }))
    }

    unsafe fn cudaDeviceGraphMemTrim(device: i32) -> i32 {
        proofs::forget();
        code(device::check_device(device).and_then(|_| graphs::mem_trim(device)))
    }

    unsafe fn cudaProfilerStart() -> i32 {
        cudart::SUCCESS
    }

    unsafe fn cudaProfilerStop() -> i32 {
        cudart::SUCCESS
    }

    // ---- Memory (memory.rs, pools.rs)

    unsafe fn cudaMallocPitch(dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `memory::malloc_pitch` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { memory::malloc_pitch(dev_ptr, pitch, width, height) })
    }

    unsafe fn cudaMalloc3D(pitched_dev_ptr: *mut PitchedPtr, extent: Extent) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `memory::malloc_3d` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { memory::malloc_3d(pitched_dev_ptr, extent) })
    }

    unsafe fn cudaMemcpy2D(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: i32,
    ) -> i32 {
        // SAFETY: this export's arguments, unchanged: `memcpy_2d` asks of its host sides what
        // CUDA asks of this export's caller.
        code(unsafe { memory::memcpy_2d(dst, dpitch, src, spitch, width, height, kind, None) })
    }

    unsafe fn cudaMemcpy2DAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: i32,
        stream: *mut c_void,
    ) -> i32 {
        let stream = Some(stream as usize as u64);
        // SAFETY: as in `cudaMemcpy2D`.
        code(unsafe { memory::memcpy_2d(dst, dpitch, src, spitch, width, height, kind, stream) })
    }

    unsafe fn cudaMemcpy3D(p: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `memory::memcpy_3d` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { memory::memcpy_3d(p, None) })
    }

    unsafe fn cudaMemcpy3DAsync(p: *const c_void, stream: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `memory::memcpy_3d` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { memory::memcpy_3d(p, Some(stream as usize as u64)) })
    }

    unsafe fn cudaMemset2D(dev_ptr: *mut c_void, pitch: usize, value: i32, width: usize, height: usize) -> i32 {
        code(memory::memset_3d(dev_ptr as usize as u64, pitch, 0, value, (width, height, 1), None))
    }

    unsafe fn cudaMemset2DAsync(
        dev_ptr: *mut c_void,
        pitch: usize,
        value: i32,
        width: usize,
        height: usize,
        stream: *mut c_void,
    ) -> i32 {
        let stream = Some(stream as usize as u64);
        code(memory::memset_3d(dev_ptr as usize as u64, pitch, 0, value, (width, height, 1), stream))
    }

    unsafe fn cudaMemset3D(p: PitchedPtr, value: i32, extent: Extent) -> i32 {
        let dims = (extent.width, extent.height, extent.depth);
        code(memory::memset_3d(p.ptr, p.pitch, p.pitch.saturating_mul(p.ysize), value, dims, None))
    }

    unsafe fn cudaMemset3DAsync(p: PitchedPtr, value: i32, extent: Extent, stream: *mut c_void) -> i32 {
        let dims = (extent.width, extent.height, extent.depth);
        let stream = Some(stream as usize as u64);
        code(memory::memset_3d(p.ptr, p.pitch, p.pitch.saturating_mul(p.ysize), value, dims, stream))
    }

    unsafe fn cudaMemcpyPeer(
        dst: *mut c_void,
        dst_device: i32,
        src: *const c_void,
        src_device: i32,
        count: usize,
    ) -> i32 {
        code(memory::memcpy_peer(dst, dst_device, src, src_device, count, None))
    }

    unsafe fn cudaMemcpyPeerAsync(
        dst: *mut c_void,
        dst_device: i32,
        src: *const c_void,
        src_device: i32,
        count: usize,
        stream: *mut c_void,
    ) -> i32 {
        code(memory::memcpy_peer(dst, dst_device, src, src_device, count, Some(stream)))
    }

    unsafe fn cudaHostGetDevicePointer(p_device: *mut *mut c_void, p_host: *mut c_void, flags: u32) -> i32 {
        if p_device.is_null() || p_host.is_null() || flags != 0 {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: `p_device` is not null (checked above) and points to a writable value of its
        // type: what CUDA asks of this export's caller.
        code(hostmem::device_pointer(p_host as usize).map(|d| unsafe { *p_device = d as usize as *mut c_void }))
    }

    unsafe fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: u32) -> i32 {
        code(hostmem::register(ptr as usize, size, flags, runtime::current_device()))
    }

    unsafe fn cudaHostUnregister(ptr: *mut c_void) -> i32 {
        proofs::forget();
        code(hostmem::unregister(ptr as usize))
    }

    unsafe fn cudaHostGetFlags(p_flags: *mut u32, p_host: *mut c_void) -> i32 {
        if p_flags.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        match hostmem::lookup_any(p_host as usize) {
            Some((_, _, flags, _)) => {
                // SAFETY: `p_flags` is not null (checked above) and points to a writable value of
                // its type: what CUDA asks of this export's caller.
                unsafe { *p_flags = flags };
                cudart::SUCCESS
            }
            None => code(Err(CudaError::InvalidValue)),
        }
    }

    unsafe fn cudaPointerGetAttributes(attributes: *mut c_void, ptr: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `memory::pointer_attributes` asks of them what CUDA asks of this export's caller.
        code(unsafe { memory::pointer_attributes(attributes, ptr) })
    }

    unsafe fn cudaMemcpy3DPeer(p: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `memory::memcpy_3d_peer`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { memory::memcpy_3d_peer(p, None) })
    }

    unsafe fn cudaMemcpy3DPeerAsync(p: *const c_void, stream: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `memory::memcpy_3d_peer`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { memory::memcpy_3d_peer(p, Some(stream as usize as u64)) })
    }

    unsafe fn cudaMemGetDefaultMemPool(mem_pool: *mut u64, location: *mut c_void, r#type: i32) -> i32 {
        code(
            // SAFETY: this export's arguments, passed on (at most retyped):
            // `pools::location_device` asks of them what CUDA asks of this export's caller.
            unsafe { pools::location_device(location, r#type) }
                // SAFETY: this export's arguments, passed on (at most retyped):
                // `pools::device_default_pool` asks of them what CUDA asks of this export's caller.
                .and_then(|d| unsafe { pools::device_default_pool(mem_pool, d) }),
        )
    }

    unsafe fn cudaMemGetMemPool(mem_pool: *mut u64, location: *mut c_void, r#type: i32) -> i32 {
        code(
            // SAFETY: this export's arguments, passed on (at most retyped):
            // `pools::location_device` asks of them what CUDA asks of this export's caller.
            unsafe { pools::location_device(location, r#type) }
                // SAFETY: this export's arguments, passed on (at most retyped):
                // `pools::device_current_pool` asks of them what CUDA asks of this export's caller.
                .and_then(|d| unsafe { pools::device_current_pool(mem_pool, d) }),
        )
    }

    unsafe fn cudaMemSetMemPool(location: *mut c_void, r#type: i32, mem_pool: u64) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::location_device`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { pools::location_device(location, r#type) }.and_then(|d| pools::set_device_pool(d, mem_pool)))
    }

    unsafe fn cudaMallocAsync(dev_ptr: *mut *mut c_void, size: usize, stream: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::malloc_async` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { pools::malloc_async(dev_ptr, size, None, stream) })
    }

    unsafe fn cudaFreeAsync(dev_ptr: *mut c_void, stream: *mut c_void) -> i32 {
        proofs::forget();
        code(pools::free_async(dev_ptr, stream))
    }

    unsafe fn cudaMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, mem_pool: u64, stream: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::malloc_async` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { pools::malloc_async(ptr, size, Some(mem_pool), stream) })
    }

    unsafe fn cudaDeviceGetDefaultMemPool(mem_pool: *mut u64, device: i32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `pools::device_default_pool` asks of them what CUDA asks of this export's caller.
        code(unsafe { pools::device_default_pool(mem_pool, device) })
    }

    unsafe fn cudaDeviceGetMemPool(mem_pool: *mut u64, device: i32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `pools::device_current_pool` asks of them what CUDA asks of this export's caller.
        code(unsafe { pools::device_current_pool(mem_pool, device) })
    }

    unsafe fn cudaDeviceSetMemPool(device: i32, mem_pool: u64) -> i32 {
        code(pools::set_device_pool(device, mem_pool))
    }

    unsafe fn cudaMemPoolCreate(mem_pool: *mut u64, pool_props: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::create_pool` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { pools::create_pool(mem_pool, pool_props) })
    }

    unsafe fn cudaMemPoolDestroy(mem_pool: u64) -> i32 {
        code(pools::destroy_pool(mem_pool))
    }

    unsafe fn cudaMemPoolSetAttribute(mem_pool: u64, attr: i32, value: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::set_attribute` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { pools::set_attribute(mem_pool, attr, value) })
    }

    unsafe fn cudaMemPoolGetAttribute(mem_pool: u64, attr: i32, value: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::get_attribute` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { pools::get_attribute(mem_pool, attr, value) })
    }

    unsafe fn cudaMemPoolTrimTo(mem_pool: u64, _min_bytes_to_keep: usize) -> i32 {
        proofs::forget();
        code(pools::trim(mem_pool))
    }

    unsafe fn cudaMemPoolSetAccess(mem_pool: u64, desc_list: *const c_void, count: usize) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::set_access` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { pools::set_access(mem_pool, desc_list, count) })
    }

    unsafe fn cudaMemPoolGetAccess(flags: *mut i32, mem_pool: u64, location: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `pools::get_access` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { pools::get_access(flags, mem_pool, location) })
    }

    unsafe fn cudaGetSymbolAddress(dev_ptr: *mut *mut c_void, symbol: *const c_void) -> i32 {
        if dev_ptr.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        code(
            Self::device_symbol_address(symbol as usize as i128)
                // SAFETY: `dev_ptr` is not null (checked above) and points to a writable value of
                // its type: what CUDA asks of this export's caller.
                .map(|a| unsafe { *dev_ptr = a as usize as *mut c_void }),
        )
    }

    unsafe fn cudaGetSymbolSize(size: *mut usize, symbol: *const c_void) -> i32 {
        if size.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: `size` is not null (checked above) and points to a writable value of its type:
        // what CUDA asks of this export's caller.
        code(Self::device_symbol_size(symbol as usize as i128).map(|n| unsafe { *size = n as usize }))
    }

    // ---- Host functions (callbacks.rs)

    unsafe fn cudaLaunchHostFunc(stream: *mut c_void, r#fn: u64, user_data: *mut c_void) -> i32 {
        // SAFETY: `fn` is the application's host function (null refused), which CUDA may run
        // on a thread of its own: this export's contract.
        code(unsafe { callbacks::launch_host_func(stream, r#fn, user_data) })
    }

    unsafe fn cudaStreamAddCallback(stream: *mut c_void, callback: u64, user_data: *mut c_void, flags: u32) -> i32 {
        // SAFETY: `callback` is the application's stream callback (null refused), which CUDA
        // may run on a thread of its own: this export's contract.
        code(unsafe { callbacks::add_callback(stream, callback, user_data, flags) })
    }

    // ---- Stream capture and graphs (graphs.rs)

    unsafe fn cudaStreamGetCaptureInfo(
        stream: *mut c_void,
        status: *mut i32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut c_void,
        edges_or_count: *mut c_void,
        count_13: *mut usize,
    ) -> i32 {
        let none = std::ptr::null_mut::<u64>();
        // CUDA 11 and 12 export the status and id only under this name (their headers map it
        // to `_v2` when they mean more); CUDA 13's is `_v3`'s.
        let r = if soname::current_abi().major() >= 13 {
            // SAFETY: this export's arguments as CUDA 13 places them: `graphs::capture_info`
            // asks of them what CUDA asks of this export's caller.
            unsafe {
                graphs::capture_info(stream, status, id, graph.cast(), deps.cast(), edges_or_count.cast(), count_13)
            }
        } else {
            // SAFETY: the status and id, as CUDA 11 and 12 pass them.
            unsafe { graphs::capture_info(stream, status, id, none, none.cast(), none.cast(), none.cast()) }
        };
        code(r)
    }

    unsafe fn cudaStreamGetCaptureInfo_v2(
        stream: *mut c_void,
        status: *mut i32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        let none = std::ptr::null_mut::<*const u8>();
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::capture_info`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::capture_info(stream, status, id, graph.cast(), deps.cast(), none, count) })
    }

    unsafe fn cudaStreamGetCaptureInfo_v3(
        stream: *mut c_void,
        status: *mut i32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut c_void,
        edges: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::capture_info`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::capture_info(stream, status, id, graph.cast(), deps.cast(), edges.cast(), count) })
    }

    unsafe fn cudaStreamUpdateCaptureDependencies(
        stream: *mut c_void,
        deps: *mut *mut c_void,
        edges_or_count: *mut c_void,
        count_or_flags: usize,
        flags_13: u32,
    ) -> i32 {
        // CUDA 11 and 12: (stream, dependencies, count, flags); CUDA 13 put edge data before
        // the count. An `unsigned int` argument's upper register bits are undefined.
        let (edges, count, flags) = if soname::current_abi().major() >= 13 {
            (edges_or_count as *const u8, count_or_flags, flags_13)
        } else {
            (std::ptr::null(), edges_or_count as usize, count_or_flags as u32)
        };
        // SAFETY: this export's arguments as its ABI places them:
        // `graphs::update_capture_dependencies` asks of them what CUDA asks of this export's
        // caller.
        code(unsafe { graphs::update_capture_dependencies(stream, deps.cast(), edges, count, flags) })
    }

    unsafe fn cudaStreamBeginCaptureToGraph(
        stream: *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const c_void,
        count: usize,
        mode: i32,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::begin_capture_to_graph` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::begin_capture_to_graph(stream, graph, deps.cast(), edges.cast(), count, mode) })
    }

    unsafe fn cudaStreamBeginCaptureToGraph_ptsz(
        stream: *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const c_void,
        count: usize,
        mode: i32,
    ) -> i32 {
        // SAFETY: as `cudaStreamBeginCaptureToGraph`'s, on the thread's default stream for null.
        code(unsafe {
            graphs::begin_capture_to_graph(per_thread(stream), graph, deps.cast(), edges.cast(), count, mode)
        })
    }

    unsafe fn cudaStreamUpdateCaptureDependencies_v2(
        stream: *mut c_void,
        deps: *mut *mut c_void,
        edges: *const c_void,
        count: usize,
        flags: u32,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::update_capture_dependencies` asks of them what CUDA asks of this export's
        // caller.
        code(unsafe { graphs::update_capture_dependencies(stream, deps.cast(), edges.cast(), count, flags) })
    }

    unsafe fn cudaGraphInstantiate(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> i32 {
        // CUDA 11's third parameter is an error-node pointer, not flags.
        let flags = if soname::current_abi().major() >= 12 { flags } else { 0 };
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::instantiate` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { graphs::instantiate(exec, graph, flags) })
    }

    unsafe fn cudaGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::instantiate` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { graphs::instantiate(exec, graph, flags) })
    }

    unsafe fn cudaGraphAddKernelNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_kernel_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_kernel_node(node.cast(), graph as usize as u64, deps.cast(), count, params) })
    }

    unsafe fn cudaGraphAddMemcpyNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_memcpy_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_memcpy_node(node.cast(), graph as usize as u64, deps.cast(), count, params) })
    }

    unsafe fn cudaGraphAddMemcpyNode1D(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: i32,
    ) -> i32 {
        let g = graph as usize as u64;
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::add_memcpy_node_1d` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_memcpy_node_1d(node.cast(), g, deps.cast(), count, dst, src, bytes, kind) })
    }

    unsafe fn cudaGraphAddMemsetNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_memset_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_memset_node(node.cast(), graph as usize as u64, deps.cast(), count, params) })
    }

    unsafe fn cudaGraphAddEmptyNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_empty_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_empty_node(node.cast(), graph as usize as u64, deps.cast(), count) })
    }

    unsafe fn cudaGraphAddHostNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_host_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_host_node(node.cast(), graph as usize as u64, deps.cast(), count, params) })
    }

    unsafe fn cudaGraphAddEventRecordNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        event: *mut c_void,
    ) -> i32 {
        let (g, e) = (graph as usize as u64, event as usize as u64);
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_event_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_event_node(node.cast(), g, deps.cast(), count, e, false) })
    }

    unsafe fn cudaGraphAddEventWaitNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        event: *mut c_void,
    ) -> i32 {
        let (g, e) = (graph as usize as u64, event as usize as u64);
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_event_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_event_node(node.cast(), g, deps.cast(), count, e, true) })
    }

    unsafe fn cudaGraphAddMemAllocNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::add_mem_alloc_node` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_mem_alloc_node(node.cast(), graph as usize as u64, deps.cast(), count, params) })
    }

    unsafe fn cudaGraphAddMemFreeNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        dptr: *mut c_void,
    ) -> i32 {
        let (g, d) = (graph as usize as u64, dptr as usize as u64);
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::add_mem_free_node` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_mem_free_node(node.cast(), g, deps.cast(), count, d) })
    }

    unsafe fn cudaGraphMemAllocNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: a writable `cudaMemAllocNodeParams` where CUDA asks for one.
        code(unsafe { graphs::mem_alloc_params(node as usize as u64, params) })
    }

    unsafe fn cudaGraphMemFreeNodeGetParams(node: *mut c_void, dptr: *mut c_void) -> i32 {
        // SAFETY: a writable `void *` where CUDA asks for one.
        code(unsafe { graphs::mem_free_params(node as usize as u64, dptr) })
    }

    unsafe fn cudaGraphAddChildGraphNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        child: *mut c_void,
    ) -> i32 {
        let (g, c) = (graph as usize as u64, child as usize as u64);
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_child_node`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_child_node(node.cast(), g, deps.cast(), count, c) })
    }

    unsafe fn cudaGraphAddMemcpyNodeToSymbol(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        symbol: *const c_void,
        src: *const c_void,
        bytes: usize,
        offset: usize,
        kind: i32,
    ) -> i32 {
        let g = graph as usize as u64;
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::add_memcpy_node_to_symbol` asks of them what CUDA asks of this export's caller.
        code(unsafe {
            graphs::add_memcpy_node_to_symbol(node.cast(), g, deps.cast(), count, symbol, src, bytes, offset, kind)
        })
    }

    unsafe fn cudaGraphAddMemcpyNodeFromSymbol(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        dst: *mut c_void,
        symbol: *const c_void,
        bytes: usize,
        offset: usize,
        kind: i32,
    ) -> i32 {
        let g = graph as usize as u64;
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::add_memcpy_node_from_symbol` asks of them what CUDA asks of this export's
        // caller.
        code(unsafe {
            graphs::add_memcpy_node_from_symbol(node.cast(), g, deps.cast(), count, dst, symbol, bytes, offset, kind)
        })
    }

    unsafe fn cudaGraphAddNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges_or_count: *const c_void,
        count_or_params: usize,
        params: *mut c_void,
    ) -> i32 {
        let g = graph as usize as u64;
        // CUDA 12: (node, graph, deps, count, params); CUDA 13 put edge data before the count.
        let (edges, count, params) = if soname::current_abi().major() >= 13 {
            (edges_or_count as *const u8, count_or_params, params)
        } else {
            (std::ptr::null(), edges_or_count as usize, count_or_params as *mut c_void)
        };
        // SAFETY: this export's arguments as its ABI places them (at most retyped):
        // `graphs::add_node_with_params` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_node_with_params(node.cast(), g, deps.cast(), edges, count, params) })
    }

    unsafe fn cudaGraphAddNode_v2(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const c_void,
        count: usize,
        params: *mut c_void,
    ) -> i32 {
        let g = graph as usize as u64;
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::add_node_with_params` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_node_with_params(node.cast(), g, deps.cast(), edges.cast(), count, params) })
    }

    unsafe fn graph_launch_host(exec: *mut c_void, stream: *mut c_void) -> Option<Result<(), CudaError>> {
        user_objects::note_launch(exec as usize as u64, stream as usize as u64);
        graphs::launch_with_host_nodes(exec as usize as u64, stream as usize as u64)
    }

    unsafe fn graph_destroy_references(graph: *mut c_void) -> Option<Result<(), CudaError>> {
        user_objects::graph_destroyed(graph as usize as u64);
        None
    }

    unsafe fn exec_destroy_references(exec: *mut c_void) -> Option<Result<(), CudaError>> {
        user_objects::exec_destroyed(exec as usize as u64);
        None
    }

    unsafe fn cudaUserObjectCreate(object: *mut u64, ptr: *mut c_void, destroy: u64, initial: u32, flags: u32) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `user_objects::create`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { user_objects::create(object, ptr as usize as u64, destroy, initial, flags) })
    }

    unsafe fn cudaUserObjectRetain(object: u64, count: u32) -> i32 {
        code(user_objects::retain(object, count))
    }

    unsafe fn cudaUserObjectRelease(object: u64, count: u32) -> i32 {
        code(user_objects::release(object, count))
    }

    unsafe fn cudaGraphRetainUserObject(graph: *mut c_void, object: u64, count: u32, flags: u32) -> i32 {
        code(user_objects::graph_retain(graph as usize as u64, object, count, flags))
    }

    unsafe fn cudaGraphReleaseUserObject(graph: *mut c_void, object: u64, count: u32) -> i32 {
        code(user_objects::graph_release(graph as usize as u64, object, count))
    }

    unsafe fn cudaGraphAddDependencies(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        edge_data_or_count: *mut c_void,
        count_13: usize,
    ) -> i32 {
        let g = graph as usize as u64;
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_dependencies`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::add_dependencies(g, from.cast(), to.cast(), edge_data_or_count as usize, count_13) })
    }

    unsafe fn cudaGraphGetNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::get_nodes` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { graphs::get_nodes(graph as usize as u64, nodes.cast(), count) })
    }

    unsafe fn cudaGraphGetRootNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::get_root_nodes`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::get_root_nodes(graph as usize as u64, nodes.cast(), count) })
    }

    unsafe fn cudaGraphGetEdges(
        graph: *mut c_void,
        from: *mut *mut c_void,
        to: *mut *mut c_void,
        edges_or_count: *mut c_void,
        count_13: *mut usize,
    ) -> i32 {
        // CUDA 11 and 12: (graph, from, to, numEdges); CUDA 13 put edge data before the count.
        let (edges, count) = if soname::current_abi().major() >= 13 {
            (edges_or_count as *mut u8, count_13)
        } else {
            (std::ptr::null_mut(), edges_or_count as *mut usize)
        };
        // SAFETY: this export's arguments as its ABI places them: `graphs::get_edges` asks of
        // them what CUDA asks of this export's caller.
        code(unsafe { graphs::get_edges(graph as usize as u64, from.cast(), to.cast(), edges, count) })
    }

    unsafe fn cudaGraphGetEdges_v2(
        graph: *mut c_void,
        from: *mut *mut c_void,
        to: *mut *mut c_void,
        edges: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::get_edges` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { graphs::get_edges(graph as usize as u64, from.cast(), to.cast(), edges.cast(), count) })
    }

    unsafe fn cudaGraphNodeGetDependencies(
        node: *mut c_void,
        out: *mut *mut c_void,
        edges_or_count: *mut c_void,
        count_13: *mut usize,
    ) -> i32 {
        // SAFETY: this export's arguments as its ABI places them (see `node_edges_abi`).
        code(unsafe { node_edges_abi(node, false, out, edges_or_count, count_13) })
    }

    unsafe fn cudaGraphNodeGetDependencies_v2(
        node: *mut c_void,
        out: *mut *mut c_void,
        edges: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::node_edges`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::node_edges(node as usize as u64, false, out.cast(), edges.cast(), count) })
    }

    unsafe fn cudaGraphNodeGetDependentNodes(
        node: *mut c_void,
        out: *mut *mut c_void,
        edges_or_count: *mut c_void,
        count_13: *mut usize,
    ) -> i32 {
        // SAFETY: this export's arguments as its ABI places them (see `node_edges_abi`).
        code(unsafe { node_edges_abi(node, true, out, edges_or_count, count_13) })
    }

    unsafe fn cudaGraphNodeGetDependentNodes_v2(
        node: *mut c_void,
        out: *mut *mut c_void,
        edges: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::node_edges`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::node_edges(node as usize as u64, true, out.cast(), edges.cast(), count) })
    }

    unsafe fn cudaGraphRemoveDependencies(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        edges_or_count: *const c_void,
        count_13: usize,
    ) -> i32 {
        // CUDA 11 and 12: (graph, from, to, numDependencies); CUDA 13 put edge data first.
        let (edges, count) = if soname::current_abi().major() >= 13 {
            (edges_or_count as *const u8, count_13)
        } else {
            (std::ptr::null(), edges_or_count as usize)
        };
        let g = graph as usize as u64;
        // SAFETY: this export's arguments as its ABI places them:
        // `graphs::remove_dependencies` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::remove_dependencies(g, from.cast(), to.cast(), edges, count) })
    }

    unsafe fn cudaGraphRemoveDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        edges: *const c_void,
        count: usize,
    ) -> i32 {
        let g = graph as usize as u64;
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::remove_dependencies` asks of them what CUDA asks of this export's caller.
        code(unsafe { graphs::remove_dependencies(g, from.cast(), to.cast(), edges.cast(), count) })
    }

    unsafe fn cudaGraphAddDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        edges: *const c_void,
        count: usize,
    ) -> i32 {
        let g = graph as usize as u64;
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `graphs::add_dependencies_with_edges` asks of them what CUDA asks of this export's
        // caller.
        code(unsafe { graphs::add_dependencies_with_edges(g, from.cast(), to.cast(), edges.cast(), count) })
    }

    unsafe fn cudaGraphDestroyNode(node: *mut c_void) -> i32 {
        code(graphs::destroy_node(node as usize as u64))
    }

    unsafe fn cudaGraphConditionalHandleCreate(out: *mut u64, graph: *mut c_void, default: u32, flags: u32) -> i32 {
        // SAFETY: a writable handle where CUDA asks for one.
        code(unsafe { graphs::conditional_handle_create(out, graph as usize as u64, default, flags) })
    }

    unsafe fn cudaGraphConditionalHandleCreate_v2(
        out: *mut u64,
        graph: *mut c_void,
        _ctx: u64,
        default: u32,
        flags: u32,
    ) -> i32 {
        // The execution context is the calling device's: Phos keeps no others.
        // SAFETY: a writable handle where CUDA asks for one.
        code(unsafe { graphs::conditional_handle_create(out, graph as usize as u64, default, flags) })
    }

    unsafe fn cudaGraphClone(out: *mut *mut c_void, graph: *mut c_void) -> i32 {
        // SAFETY: a writable graph handle where CUDA asks for one.
        code(unsafe { graphs::clone_graph(out.cast(), graph as usize as u64) })
    }

    unsafe fn cudaGraphNodeFindInClone(out: *mut *mut c_void, node: *mut c_void, clone: *mut c_void) -> i32 {
        // SAFETY: a writable node handle where CUDA asks for one.
        code(unsafe { graphs::find_in_clone(out.cast(), node as usize as u64, clone as usize as u64) })
    }

    unsafe fn cudaGraphChildGraphNodeGetGraph(node: *mut c_void, out: *mut *mut c_void) -> i32 {
        // SAFETY: a writable graph handle where CUDA asks for one.
        code(unsafe { graphs::child_graph(node as usize as u64, out.cast()) })
    }

    unsafe fn cudaGraphNodeGetContainingGraph(node: *mut c_void, out: *mut *mut c_void) -> i32 {
        // SAFETY: a writable graph handle where CUDA asks for one.
        code(unsafe { graphs::containing_graph(node as usize as u64, out.cast()) })
    }

    unsafe fn cudaGraphEventRecordNodeGetEvent(node: *mut c_void, out: *mut *mut c_void) -> i32 {
        // SAFETY: a writable event handle where CUDA asks for one.
        code(unsafe { graphs::node_event(node as usize as u64, false, out.cast()) })
    }

    unsafe fn cudaGraphEventWaitNodeGetEvent(node: *mut c_void, out: *mut *mut c_void) -> i32 {
        // SAFETY: a writable event handle where CUDA asks for one.
        code(unsafe { graphs::node_event(node as usize as u64, true, out.cast()) })
    }

    unsafe fn cudaGraphEventRecordNodeSetEvent(node: *mut c_void, event: *mut c_void) -> i32 {
        code(graphs::set_event(0, node as usize as u64, false, event as usize as u64))
    }

    unsafe fn cudaGraphEventWaitNodeSetEvent(node: *mut c_void, event: *mut c_void) -> i32 {
        code(graphs::set_event(0, node as usize as u64, true, event as usize as u64))
    }

    unsafe fn cudaGraphExecEventRecordNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: *mut c_void) -> i32 {
        code(exec_set(exec, |e| graphs::set_event(e, node as usize as u64, false, event as usize as u64)))
    }

    unsafe fn cudaGraphExecEventWaitNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: *mut c_void) -> i32 {
        code(exec_set(exec, |e| graphs::set_event(e, node as usize as u64, true, event as usize as u64)))
    }

    unsafe fn cudaGraphKernelNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: a writable `cudaKernelNodeParams` where CUDA asks for one.
        code(unsafe { graphs::kernel_params(node as usize as u64, params) })
    }

    unsafe fn cudaGraphKernelNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddKernelNode` takes them.
        code(unsafe { graphs::set_kernel(0, node as usize as u64, params) })
    }

    unsafe fn cudaGraphExecKernelNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddKernelNode` takes them.
        code(exec_set(exec, |e| unsafe { graphs::set_kernel(e, node as usize as u64, params) }))
    }

    unsafe fn cudaGraphMemcpyNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: a writable `cudaMemcpy3DParms` where CUDA asks for one.
        code(unsafe { graphs::memcpy_params(node as usize as u64, params) })
    }

    unsafe fn cudaGraphMemcpyNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemcpyNode` takes them.
        code(unsafe { graphs::set_memcpy(0, node as usize as u64, params) })
    }

    unsafe fn cudaGraphExecMemcpyNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemcpyNode` takes them.
        code(exec_set(exec, |e| unsafe { graphs::set_memcpy(e, node as usize as u64, params) }))
    }

    unsafe fn cudaGraphMemcpyNodeSetParams1D(
        node: *mut c_void,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: i32,
    ) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemcpyNode1D` takes them.
        code(unsafe { graphs::set_memcpy_1d(0, node as usize as u64, dst, src, bytes, kind) })
    }

    unsafe fn cudaGraphExecMemcpyNodeSetParams1D(
        exec: *mut c_void,
        node: *mut c_void,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: i32,
    ) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemcpyNode1D` takes them.
        code(exec_set(exec, |e| unsafe { graphs::set_memcpy_1d(e, node as usize as u64, dst, src, bytes, kind) }))
    }

    unsafe fn cudaGraphMemsetNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: a writable `cudaMemsetParams` where CUDA asks for one.
        code(unsafe { graphs::memset_params(node as usize as u64, params) })
    }

    unsafe fn cudaGraphMemsetNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemsetNode` takes them.
        code(unsafe { graphs::set_memset(0, node as usize as u64, params) })
    }

    unsafe fn cudaGraphExecMemsetNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemsetNode` takes them.
        code(exec_set(exec, |e| unsafe { graphs::set_memset(e, node as usize as u64, params) }))
    }

    unsafe fn cudaGraphHostNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: a writable `cudaHostNodeParams` where CUDA asks for one.
        code(unsafe { graphs::host_params(node as usize as u64, params) })
    }

    unsafe fn cudaGraphHostNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddHostNode` takes them.
        code(unsafe { graphs::set_host(0, node as usize as u64, params) })
    }

    unsafe fn cudaGraphExecHostNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddHostNode` takes them.
        code(exec_set(exec, |e| unsafe { graphs::set_host(e, node as usize as u64, params) }))
    }

    unsafe fn cudaGraphExecChildGraphNodeSetParams(exec: *mut c_void, node: *mut c_void, child: *mut c_void) -> i32 {
        code(exec_set(exec, |e| graphs::set_exec_child(e, node as usize as u64, child as usize as u64)))
    }

    unsafe fn cudaGraphNodeSetEnabled(exec: *mut c_void, node: *mut c_void, enabled: u32) -> i32 {
        code(graphs::set_enabled(exec as usize as u64, node as usize as u64, enabled))
    }

    unsafe fn cudaGraphNodeGetEnabled(exec: *mut c_void, node: *mut c_void, enabled: *mut u32) -> i32 {
        // SAFETY: a writable `unsigned int` where CUDA asks for one.
        code(unsafe { graphs::get_enabled(exec as usize as u64, node as usize as u64, enabled) })
    }

    unsafe fn cudaGraphExecGetFlags(exec: *mut c_void, flags: *mut u64) -> i32 {
        // SAFETY: a writable `unsigned long long` where CUDA asks for one.
        code(unsafe { graphs::exec_flags(exec as usize as u64, flags) })
    }

    unsafe fn cudaGraphDebugDotPrint(graph: *mut c_void, path: *const c_char, _flags: u32) -> i32 {
        // SAFETY: a NUL-terminated path where CUDA asks for one.
        code(unsafe { graphs::debug_dot_print(graph as usize as u64, path) })
    }

    unsafe fn cudaGraphNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: a writable `cudaGraphNodeParams` where CUDA asks for one.
        code(unsafe { graphs::node_params(node as usize as u64, params) })
    }

    unsafe fn cudaGraphKernelNodeSetAttribute(node: *mut c_void, attr: i32, value: *const c_void) -> i32 {
        // SAFETY: a readable `cudaLaunchAttributeValue` where CUDA asks for one.
        code(unsafe { attributes::node_set(node as usize as u64, attr, value) })
    }

    unsafe fn cudaGraphKernelNodeGetAttribute(node: *mut c_void, attr: i32, value_out: *mut c_void) -> i32 {
        // SAFETY: a writable `cudaLaunchAttributeValue` where CUDA asks for one.
        code(unsafe { attributes::node_get(node as usize as u64, attr, value_out) })
    }

    unsafe fn cudaGraphKernelNodeCopyAttributes(dst: *mut c_void, src: *mut c_void) -> i32 {
        code(attributes::node_copy(dst as usize as u64, src as usize as u64))
    }

    unsafe fn cudaGraphNodeSetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddNode` takes them.
        code(unsafe { graphs::set_with_params(0, node as usize as u64, params) })
    }

    unsafe fn cudaGraphExecNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddNode` takes them.
        code(exec_set(exec, |e| unsafe { graphs::set_with_params(e, node as usize as u64, params) }))
    }

    unsafe fn cudaGraphExecUpdate(
        exec: *mut c_void,
        graph: *mut c_void,
        result_info: *mut c_void,
        update_result_out: *mut i32,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::exec_update` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { graphs::exec_update(exec, graph, result_info, update_result_out) })
    }

    unsafe fn cudaThreadExchangeStreamCaptureMode(mode: *mut i32) -> i32 {
        thread_local! {
            // cudaStreamCaptureModeGlobal
            static MODE: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
        }
        // SAFETY: read only when not null: a `cudaStreamCaptureMode` the caller passes in and
        // out (what CUDA asks of it).
        if mode.is_null() || !(0..=2).contains(&unsafe { *mode }) {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: as above: not null, read and then written.
        let wanted = unsafe { *mode };
        // SAFETY: as above.
        unsafe { *mode = MODE.replace(wanted) };
        cudart::SUCCESS
    }

    // ---- Execution control (execution.rs)

    unsafe fn cudaLaunchCooperativeKernel(
        func: *const c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `launch::launch` asks of
        // them what CUDA asks of this export's caller.
        super::rt::api_call(FunctionId::CudaLaunchCooperativeKernel, || unsafe {
            launch::launch(func, grid, block, args, shared_mem, stream, false, true)
        })
    }

    unsafe fn cudaLaunchKernelExC(config: *const c_void, func: *const c_void, args: *mut *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::launch_ex` asks
        // of them what CUDA asks of this export's caller.
        super::rt::api_call(FunctionId::CudaLaunchKernelExC, || unsafe {
            execution::launch_ex(config, func, args, false)
        })
    }

    unsafe fn cudaLaunchKernelExC_ptsz(config: *const c_void, func: *const c_void, args: *mut *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::launch_ex` asks
        // of them what CUDA asks of this export's caller.
        super::rt::api_call(FunctionId::CudaLaunchKernelExCPtsz, || unsafe {
            execution::launch_ex(config, func, args, true)
        })
    }

    unsafe fn cudaFuncGetAttributes(attr: *mut c_void, func: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::get_attributes`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { execution::get_attributes(attr, func) })
    }

    unsafe fn cudaFuncSetAttribute(func: *const c_void, attr: i32, value: i32) -> i32 {
        code(execution::set_attribute(func, attr, value))
    }

    unsafe fn cudaFuncSetCacheConfig(func: *const c_void, cache_config: i32) -> i32 {
        code(execution::set_cache_config(func, cache_config))
    }

    unsafe fn cudaFuncSetSharedMemConfig(func: *const c_void, config: i32) -> i32 {
        code(execution::set_shared_mem_config(func, config))
    }

    unsafe fn cudaFuncGetName(name: *mut *const c_char, func: *const c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::get_name` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { execution::get_name(name, func) })
    }

    unsafe fn cudaFuncGetParamInfo(
        func: *const c_void,
        param_index: usize,
        param_offset: *mut usize,
        param_size: *mut usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::param_info`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { execution::param_info(func, param_index, param_offset, param_size) })
    }

    unsafe fn cudaFuncGetParamCount(func: *const c_void, param_count: *mut usize) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::param_count`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { execution::param_count(func, param_count) })
    }

    unsafe fn cudaKernelSetAttributeForDevice(kernel: *mut c_void, attr: i32, value: i32, device: i32) -> i32 {
        let devices = runtime::session().map(|s| s.device_count).map_err(CudaError::from);
        code(devices.and_then(|n| {
            if !(0..n).contains(&device) {
                return Err(CudaError::InvalidDevice);
            }
            execution::set_attribute(kernel, attr, value)
        }))
    }

    unsafe fn cudaGetFuncBySymbol(function_ptr: *mut u64, symbol_ptr: *const c_void) -> i32 {
        if function_ptr.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        match registry::kernel(symbol_ptr) {
            Some(_) => {
                // SAFETY: `function_ptr` is not null (checked above) and points to a writable value
                // of its type: what CUDA asks of this export's caller.
                unsafe { *function_ptr = symbol_ptr as usize as u64 };
                cudart::SUCCESS
            }
            None => code(Err(CudaError::InvalidDeviceFunction)),
        }
    }

    unsafe fn cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        num_blocks: *mut i32,
        func: *const c_void,
        block_size: i32,
        dynamic_s_mem_size: usize,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::occupancy` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { execution::occupancy(num_blocks, func, block_size, dynamic_s_mem_size, 0) })
    }

    unsafe fn cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        num_blocks: *mut i32,
        func: *const c_void,
        block_size: i32,
        dynamic_s_mem_size: usize,
        flags: u32,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `execution::occupancy` asks
        // of them what CUDA asks of this export's caller.
        code(unsafe { execution::occupancy(num_blocks, func, block_size, dynamic_s_mem_size, flags) })
    }

    unsafe fn cudaOccupancyAvailableDynamicSMemPerBlock(
        dynamic_smem_size: *mut usize,
        func: *const c_void,
        num_blocks: i32,
        block_size: i32,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `execution::available_dynamic_smem` asks of them what CUDA asks of this export's caller.
        code(unsafe { execution::available_dynamic_smem(dynamic_smem_size, func, num_blocks, block_size) })
    }

    unsafe fn cudaOccupancyMaxActiveClusters(num: *mut i32, func: *const c_void, config: *const c_void) -> i32 {
        if num.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: `config` null or a `cudaLaunchConfig_t` (this export's contract); the
        // driver's query reads it in the runtime's layout.
        let n = unsafe { crate::cuda::modules::max_active_clusters(func as u64, config, true) };
        // SAFETY: not null (checked above), writable (this export's contract).
        code(n.map(|n| unsafe { num.write(n) }).map_err(|e| CudaError(e.0)))
    }

    unsafe fn cudaOccupancyMaxPotentialClusterSize(size: *mut i32, func: *const c_void, config: *const c_void) -> i32 {
        if size.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: as in `cudaOccupancyMaxActiveClusters`.
        let n = unsafe { crate::cuda::modules::max_potential_cluster_size(func as u64, config, true) };
        // SAFETY: not null (checked above), writable (this export's contract).
        code(n.map(|n| unsafe { size.write(n) }).map_err(|e| CudaError(e.0)))
    }

    unsafe fn cudaMallocArray(
        array: *mut *mut c_void,
        desc: *const ChannelFormatDesc,
        width: usize,
        height: usize,
        flags: u32,
    ) -> i32 {
        // SAFETY: this export's arguments: `malloc_array` asks of them what CUDA asks.
        code(unsafe { arrays::malloc_array(array, desc, [width, height, 0], flags, None) })
    }

    unsafe fn cudaMalloc3DArray(
        array: *mut *mut c_void,
        desc: *const ChannelFormatDesc,
        extent: Extent,
        flags: u32,
    ) -> i32 {
        let e = [extent.width, extent.height, extent.depth];
        // SAFETY: as in `cudaMallocArray`.
        code(unsafe { arrays::malloc_array(array, desc, e, flags, None) })
    }

    unsafe fn cudaMallocMipmappedArray(
        mipmap: *mut *mut c_void,
        desc: *const ChannelFormatDesc,
        extent: Extent,
        levels: u32,
        flags: u32,
    ) -> i32 {
        let e = [extent.width, extent.height, extent.depth];
        // SAFETY: as in `cudaMallocArray`.
        code(unsafe { arrays::malloc_array(mipmap, desc, e, flags, Some(levels)) })
    }

    unsafe fn cudaArrayGetInfo(
        desc: *mut ChannelFormatDesc,
        extent: *mut Extent,
        flags: *mut u32,
        array: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's outputs, null or writable as CUDA asks.
        code(unsafe { arrays::array_get_info(desc, extent, flags, array) })
    }

    unsafe fn cudaGetChannelDesc(desc: *mut ChannelFormatDesc, array: *mut c_void) -> i32 {
        if desc.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        // SAFETY: as in `cudaArrayGetInfo`.
        code(unsafe { arrays::array_get_info(desc, std::ptr::null_mut(), std::ptr::null_mut(), array) })
    }

    unsafe fn cudaMemcpy2DToArray(
        dst: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: i32,
    ) -> i32 {
        let side = memory::Side { addr: src as u64, pitch: spitch as u64, slice: 0 };
        let corner = [w_offset as u64, h_offset as u64, 0];
        // SAFETY: this export's source, readable for its rows as CUDA asks.
        code(unsafe { arrays::copy_to_array(dst as u64, corner, side, (width as u64, height as u64, 1), kind, None) })
    }

    unsafe fn cudaMemcpy2DToArrayAsync(
        dst: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: i32,
        stream: *mut c_void,
    ) -> i32 {
        let side = memory::Side { addr: src as u64, pitch: spitch as u64, slice: 0 };
        let corner = [w_offset as u64, h_offset as u64, 0];
        let (extent, stream) = ((width as u64, height as u64, 1), Some(stream as u64));
        // SAFETY: as in `cudaMemcpy2DToArray`.
        code(unsafe { arrays::copy_to_array(dst as u64, corner, side, extent, kind, stream) })
    }

    unsafe fn cudaMemcpy2DFromArray(
        dst: *mut c_void,
        dpitch: usize,
        src: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        width: usize,
        height: usize,
        kind: i32,
    ) -> i32 {
        let side = memory::Side { addr: dst as u64, pitch: dpitch as u64, slice: 0 };
        let corner = [w_offset as u64, h_offset as u64, 0];
        // SAFETY: this export's destination, writable for its rows as CUDA asks.
        code(unsafe { arrays::copy_from_array(side, src as u64, corner, (width as u64, height as u64, 1), kind, None) })
    }

    unsafe fn cudaMemcpy2DFromArrayAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        width: usize,
        height: usize,
        kind: i32,
        stream: *mut c_void,
    ) -> i32 {
        let side = memory::Side { addr: dst as u64, pitch: dpitch as u64, slice: 0 };
        let corner = [w_offset as u64, h_offset as u64, 0];
        let (extent, stream) = ((width as u64, height as u64, 1), Some(stream as u64));
        // SAFETY: as in `cudaMemcpy2DFromArray`.
        code(unsafe { arrays::copy_from_array(side, src as u64, corner, extent, kind, stream) })
    }

    unsafe fn cudaMemcpyToArray(
        dst: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        src: *const c_void,
        count: usize,
        kind: i32,
    ) -> i32 {
        // SAFETY: this export's source, `count` readable bytes as CUDA asks.
        code(unsafe { arrays::memcpy_to_array(dst, w_offset, h_offset, src, count, kind, None) })
    }

    unsafe fn cudaMemcpyToArrayAsync(
        dst: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        src: *const c_void,
        count: usize,
        kind: i32,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cudaMemcpyToArray`.
        code(unsafe { arrays::memcpy_to_array(dst, w_offset, h_offset, src, count, kind, Some(stream as u64)) })
    }

    unsafe fn cudaMemcpyFromArray(
        dst: *mut c_void,
        src: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        count: usize,
        kind: i32,
    ) -> i32 {
        // SAFETY: this export's destination, `count` writable bytes as CUDA asks.
        code(unsafe { arrays::memcpy_from_array(dst, src, w_offset, h_offset, count, kind, None) })
    }

    unsafe fn cudaMemcpyFromArrayAsync(
        dst: *mut c_void,
        src: *mut c_void,
        w_offset: usize,
        h_offset: usize,
        count: usize,
        kind: i32,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cudaMemcpyFromArray`.
        code(unsafe { arrays::memcpy_from_array(dst, src, w_offset, h_offset, count, kind, Some(stream as u64)) })
    }

    unsafe fn cudaMemcpyArrayToArray(
        dst: *mut c_void,
        w_offset_dst: usize,
        h_offset_dst: usize,
        src: *mut c_void,
        w_offset_src: usize,
        h_offset_src: usize,
        count: usize,
        kind: i32,
    ) -> i32 {
        let (d, s) = ((w_offset_dst, h_offset_dst), (w_offset_src, h_offset_src));
        code(arrays::memcpy_array_to_array(dst, d, src, s, count, kind))
    }

    unsafe fn cudaMemcpy2DArrayToArray(
        dst: *mut c_void,
        w_offset_dst: usize,
        h_offset_dst: usize,
        src: *mut c_void,
        w_offset_src: usize,
        h_offset_src: usize,
        width: usize,
        height: usize,
        kind: i32,
    ) -> i32 {
        let d = [w_offset_dst as u64, h_offset_dst as u64, 0];
        let s = [w_offset_src as u64, h_offset_src as u64, 0];
        let extent = (width as u64, height as u64, 1);
        code(arrays::copy_array_to_array(dst as u64, d, src as u64, s, extent, kind, None))
    }

    unsafe fn cudaCreateTextureObject(
        tex: *mut u64,
        res: *const c_void,
        desc: *const c_void,
        view: *const c_void,
    ) -> i32 {
        // CUDA 11's plain entry point takes the description without `seamlessCubemap`.
        let with_seamless = soname::current_abi().major() >= 12;
        // SAFETY: this export's arguments, as CUDA asks of them.
        code(unsafe { arrays::create_texture(tex, res, desc, view, with_seamless) })
    }

    unsafe fn cudaCreateTextureObject_v2(
        tex: *mut u64,
        res: *const c_void,
        desc: *const c_void,
        view: *const c_void,
    ) -> i32 {
        // SAFETY: as in `cudaCreateTextureObject`.
        code(unsafe { arrays::create_texture(tex, res, desc, view, true) })
    }

    unsafe fn cudaGetTextureObjectResourceDesc(res: *mut c_void, tex: u64) -> i32 {
        // SAFETY: this export's output, as CUDA asks of it.
        code(unsafe { arrays::texture_query(res, tex, arrays::TextureQuery::Resource) })
    }

    unsafe fn cudaGetTextureObjectTextureDesc(desc: *mut c_void, tex: u64) -> i32 {
        let query = arrays::TextureQuery::Texture { with_seamless: soname::current_abi().major() >= 12 };
        // SAFETY: as in `cudaGetTextureObjectResourceDesc`.
        code(unsafe { arrays::texture_query(desc, tex, query) })
    }

    unsafe fn cudaGetTextureObjectTextureDesc_v2(desc: *mut c_void, tex: u64) -> i32 {
        let query = arrays::TextureQuery::Texture { with_seamless: true };
        // SAFETY: as in `cudaGetTextureObjectResourceDesc`.
        code(unsafe { arrays::texture_query(desc, tex, query) })
    }

    unsafe fn cudaGetTextureObjectResourceViewDesc(view: *mut c_void, tex: u64) -> i32 {
        // SAFETY: as in `cudaGetTextureObjectResourceDesc`.
        code(unsafe { arrays::texture_query(view, tex, arrays::TextureQuery::View) })
    }

    unsafe fn cudaCreateSurfaceObject(surf: *mut u64, res: *const c_void) -> i32 {
        // SAFETY: this export's arguments, as CUDA asks of them.
        code(unsafe { arrays::create_surface(surf, res) })
    }

    unsafe fn cudaGetSurfaceObjectResourceDesc(res: *mut c_void, surf: u64) -> i32 {
        // SAFETY: this export's output, as CUDA asks of it.
        code(unsafe { arrays::surface_resource(res, surf) })
    }

    unsafe fn cudaCreateChannelDesc(x: i32, y: i32, z: i32, w: i32, f: i32) -> ChannelFormatDesc {
        ChannelFormatDesc { x, y, z, w, f }
    }

    unsafe fn __cudaRegisterTexture(
        _handle: *mut *mut c_void,
        _host_var: *const c_void,
        _device_address: *mut *const c_void,
        device_name: *const c_char,
        _dim: i32,
        _norm: i32,
        _ext: i32,
    ) {
        // SAFETY: nvcc passes the texture's name as a NUL-terminated string.
        unsafe { registration_not_supported("texture reference", device_name) };
    }

    unsafe fn __cudaRegisterSurface(
        _handle: *mut *mut c_void,
        _host_var: *const c_void,
        _device_address: *mut *const c_void,
        device_name: *const c_char,
        _dim: i32,
        _ext: i32,
    ) {
        // SAFETY: nvcc passes the surface's name as a NUL-terminated string.
        unsafe { registration_not_supported("surface reference", device_name) };
    }

    unsafe fn __cudaRegisterHostVar(
        _handle: *mut *mut c_void,
        device_name: *const c_char,
        _host_var: *mut c_char,
        _size: usize,
    ) {
        // SAFETY: nvcc passes the variable's name as a NUL-terminated string.
        unsafe { registration_not_supported("host variable", device_name) };
    }

    fn device_symbol_address(symbol: i128) -> Result<i128, CudaError> {
        let var = registry::variable(symbol as usize as *const c_void).ok_or(CudaError::InvalidSymbol)?;
        Ok(i128::from(var.remote()?.0))
    }

    fn device_symbol_size(symbol: i128) -> Result<i128, CudaError> {
        let var = registry::variable(symbol as usize as *const c_void).ok_or(CudaError::InvalidSymbol)?;
        Ok(i128::from(var.remote()?.1))
    }

    fn resolve_memcpy_kind(kind: i128, dst: i128, src: i128) -> Result<i128, CudaError> {
        let kind = i32::try_from(kind).map_err(|_| CudaError::InvalidMemcpyDirection)?;
        match kind {
            consts::cudaMemcpyHostToHost
            | consts::cudaMemcpyHostToDevice
            | consts::cudaMemcpyDeviceToHost
            | consts::cudaMemcpyDeviceToDevice => Ok(i128::from(kind)),
            consts::cudaMemcpyDefault => {
                runtime::session()?;
                let on_device = |p: i128| u64::try_from(p).is_ok_and(memcpy_kind_of);
                Ok(i128::from(match (on_device(dst), on_device(src)) {
                    (false, false) => consts::cudaMemcpyHostToHost,
                    (true, false) => consts::cudaMemcpyHostToDevice,
                    (false, true) => consts::cudaMemcpyDeviceToHost,
                    (true, true) => consts::cudaMemcpyDeviceToDevice,
                }))
            }
            _ => Err(CudaError::InvalidMemcpyDirection),
        }
    }

    unsafe fn write_cudaDeviceProp(dst: *mut c_void, value: &DeviceProperties) {
        // The plain entry point of libcudart.so.12 kept the CUDA 11 layout.
        let layout = match soname::current_abi() {
            Abi::V11 | Abi::V12 => Abi::V11,
            Abi::V13 => Abi::V13,
        };
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `crate::abi::write_device_prop` asks of them what CUDA asks of this export's caller.
        unsafe { crate::abi::write_device_prop(layout, dst, value) }
    }

    unsafe fn write_cudaDeviceProp_v2(dst: *mut c_void, value: &DeviceProperties) {
        // SAFETY: this export's arguments, passed on (at most retyped):
        // `crate::abi::write_device_prop` asks of them what CUDA asks of this export's caller.
        unsafe { crate::abi::write_device_prop(soname::current_abi(), dst, value) }
    }

    fn forget_device_state() {
        registry::forget_remote_state();
        capture::forget_streams();
        crate::live::forget_all();
    }

    unsafe fn memset_async(
        dev_ptr: *mut c_void,
        value: i32,
        count: usize,
        stream: *mut c_void,
    ) -> Option<Result<(), CudaError>> {
        Some(memsets::memset_async(dev_ptr, value, count, stream))
    }

    unsafe fn malloc_proving(dev_ptr: *mut *mut c_void, size: usize) -> Option<Result<(), CudaError>> {
        // SAFETY: this export's arguments, passed on: `copies::malloc` asks of `dev_ptr` what
        // CUDA asks of this export's caller.
        Some(unsafe { copies::malloc(dev_ptr, size) })
    }

    unsafe fn forget_stream(stream: *mut c_void) -> Option<Result<(), CudaError>> {
        // Before the call: no query of another thread is answered here for it from now on.
        capture::forget_stream(stream as usize as u64);
        None
    }

    unsafe fn begin_capture(stream: *mut c_void, mode: i32) -> Option<Result<(), CudaError>> {
        Some(capture::begin(stream as usize as u64, mode))
    }

    unsafe fn end_capture(stream: *mut c_void, graph: *mut *mut c_void) -> Option<Result<(), CudaError>> {
        // SAFETY: this export's arguments, passed on: `capture::end` asks of `graph` what CUDA
        // asks of this export's caller.
        Some(unsafe { capture::end(stream as usize as u64, graph) })
    }

    unsafe fn is_capturing(stream: *mut c_void, status: *mut i32) -> Option<Result<(), CudaError>> {
        // SAFETY: this export's arguments, passed on: `capture::is_capturing` asks of `status`
        // what CUDA asks of this export's caller.
        unsafe { capture::is_capturing(stream as usize as u64, status) }
    }

    // ---- Instantiation with parameters, symbol copy-node setters, ids (graph_extra.rs)

    unsafe fn cudaGraphInstantiateWithParams(exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on: `instantiate_with_params` asks of them
        // what CUDA asks of this export's caller.
        code(unsafe { graph_extra::instantiate_with_params(exec, graph, params, false) })
    }

    unsafe fn cudaGraphInstantiateWithParams_ptsz(
        exec: *mut *mut c_void,
        graph: *mut c_void,
        params: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cudaGraphInstantiateWithParams`.
        code(unsafe { graph_extra::instantiate_with_params(exec, graph, params, true) })
    }

    unsafe fn cudaGraphMemcpyNodeSetParamsToSymbol(
        node: *mut c_void,
        symbol: *const c_void,
        src: *const c_void,
        bytes: usize,
        offset: usize,
        kind: i32,
    ) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemcpyNodeToSymbol` takes them.
        code(unsafe { graph_extra::set_memcpy_to_symbol(0, node as usize as u64, symbol, src, bytes, offset, kind) })
    }

    unsafe fn cudaGraphMemcpyNodeSetParamsFromSymbol(
        node: *mut c_void,
        dst: *mut c_void,
        symbol: *const c_void,
        bytes: usize,
        offset: usize,
        kind: i32,
    ) -> i32 {
        // SAFETY: the parameters as `cudaGraphAddMemcpyNodeFromSymbol` takes them.
        code(unsafe { graph_extra::set_memcpy_from_symbol(0, node as usize as u64, dst, symbol, bytes, offset, kind) })
    }

    unsafe fn cudaGraphExecMemcpyNodeSetParamsToSymbol(
        exec: *mut c_void,
        node: *mut c_void,
        symbol: *const c_void,
        src: *const c_void,
        bytes: usize,
        offset: usize,
        kind: i32,
    ) -> i32 {
        let node = node as usize as u64;
        // SAFETY: the parameters as `cudaGraphAddMemcpyNodeToSymbol` takes them.
        code(exec_set(exec, |e| unsafe {
            graph_extra::set_memcpy_to_symbol(e, node, symbol, src, bytes, offset, kind)
        }))
    }

    unsafe fn cudaGraphExecMemcpyNodeSetParamsFromSymbol(
        exec: *mut c_void,
        node: *mut c_void,
        dst: *mut c_void,
        symbol: *const c_void,
        bytes: usize,
        offset: usize,
        kind: i32,
    ) -> i32 {
        let node = node as usize as u64;
        // SAFETY: the parameters as `cudaGraphAddMemcpyNodeFromSymbol` takes them.
        code(exec_set(exec, |e| unsafe {
            graph_extra::set_memcpy_from_symbol(e, node, dst, symbol, bytes, offset, kind)
        }))
    }

    unsafe fn cudaGraphGetId(graph: *mut c_void, id: *mut u32) -> i32 {
        // SAFETY: a writable `unsigned int` where CUDA asks for one.
        code(unsafe { graph_extra::graph_id(graph as usize as u64, id) })
    }

    unsafe fn cudaGraphExecGetId(exec: *mut c_void, id: *mut u32) -> i32 {
        // SAFETY: a writable `unsigned int` where CUDA asks for one.
        code(unsafe { graph_extra::exec_id(exec as usize as u64, id) })
    }

    unsafe fn cudaGraphNodeGetLocalId(node: *mut c_void, id: *mut u32) -> i32 {
        // SAFETY: a writable `unsigned int` where CUDA asks for one.
        code(unsafe { graph_extra::node_local_id(node as usize as u64, id) })
    }

    unsafe fn cudaGraphNodeGetToolsId(node: *mut c_void, id: *mut u64) -> i32 {
        // SAFETY: a writable `unsigned long long` where CUDA asks for one.
        code(unsafe { graph_extra::node_tools_id(node as usize as u64, id) })
    }

    // ---- Batched copies (batch.rs)

    unsafe fn cudaMemcpyBatchAsync(
        dsts: *mut *mut c_void,
        srcs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        attrs: *mut c_void,
        attrs_idxs: *mut usize,
        num_attrs: usize,
        fail_idx_or_stream: *mut c_void,
        stream_12: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, as the application's ABI passes them.
        code(unsafe {
            memcpy_batch_abi(
                dsts,
                srcs,
                sizes,
                count,
                attrs,
                attrs_idxs,
                num_attrs,
                fail_idx_or_stream,
                stream_12,
                false,
            )
        })
    }

    unsafe fn cudaMemcpyBatchAsync_ptsz(
        dsts: *mut *mut c_void,
        srcs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        attrs: *mut c_void,
        attrs_idxs: *mut usize,
        num_attrs: usize,
        fail_idx_or_stream: *mut c_void,
        stream_12: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, as the application's ABI passes them.
        code(unsafe {
            memcpy_batch_abi(
                dsts,
                srcs,
                sizes,
                count,
                attrs,
                attrs_idxs,
                num_attrs,
                fail_idx_or_stream,
                stream_12,
                true,
            )
        })
    }

    unsafe fn cudaMemcpy3DBatchAsync(
        num_ops: usize,
        ops: *mut c_void,
        fail_idx_or_flags: *mut c_void,
        flags_or_stream: u64,
        stream_12: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, as the application's ABI passes them.
        code(unsafe { memcpy_3d_batch_abi(num_ops, ops, fail_idx_or_flags, flags_or_stream, stream_12, false) })
    }

    unsafe fn cudaMemcpy3DBatchAsync_ptsz(
        num_ops: usize,
        ops: *mut c_void,
        fail_idx_or_flags: *mut c_void,
        flags_or_stream: u64,
        stream_12: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, as the application's ABI passes them.
        code(unsafe { memcpy_3d_batch_abi(num_ops, ops, fail_idx_or_flags, flags_or_stream, stream_12, true) })
    }

    unsafe fn cudaMemcpyWithAttributesAsync(
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
        attr: *mut c_void,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `batch` asks of them
        // what CUDA asks of this export's caller.
        code(unsafe { batch::memcpy_with_attributes(dst as u64, src as u64, size, attr.cast(), stream as u64, false) })
    }

    unsafe fn cudaMemcpyWithAttributesAsync_ptsz(
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
        attr: *mut c_void,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cudaMemcpyWithAttributesAsync`.
        code(unsafe { batch::memcpy_with_attributes(dst as u64, src as u64, size, attr.cast(), stream as u64, true) })
    }

    unsafe fn cudaMemcpy3DWithAttributesAsync(op: *mut c_void, flags: u64, stream: *mut c_void) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `batch` asks of them
        // what CUDA asks of this export's caller.
        code(unsafe { batch::memcpy_3d_with_attributes(op.cast(), flags, stream as u64, false) })
    }

    unsafe fn cudaMemcpy3DWithAttributesAsync_ptsz(op: *mut c_void, flags: u64, stream: *mut c_void) -> i32 {
        // SAFETY: as in `cudaMemcpy3DWithAttributesAsync`.
        code(unsafe { batch::memcpy_3d_with_attributes(op.cast(), flags, stream as u64, true) })
    }

    // ---- Batched managed memory hints of CUDA 13 (managed.rs): the stream orders nothing,
    // as for `cudaMemPrefetchAsync`.

    unsafe fn cudaMemPrefetchBatchAsync(
        dptrs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        locations: *mut c_void,
        idxs: *mut usize,
        num: usize,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `managed::batch_hints`
        // asks of them what CUDA asks of this export's caller.
        code(unsafe { managed::batch_hints(dptrs.cast(), sizes, count, locations.cast(), idxs, num, true, flags) })
    }

    unsafe fn cudaMemPrefetchBatchAsync_ptsz(
        dptrs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        locations: *mut c_void,
        idxs: *mut usize,
        num: usize,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        // SAFETY: the same export (the stream orders nothing), the same contract.
        unsafe { Self::cudaMemPrefetchBatchAsync(dptrs, sizes, count, locations, idxs, num, flags, _stream) }
    }

    unsafe fn cudaMemDiscardBatchAsync(
        dptrs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        let none = std::ptr::null();
        // SAFETY: as in `cudaMemPrefetchBatchAsync`, without locations.
        code(unsafe { managed::batch_hints(dptrs.cast(), sizes, count, none, none.cast(), 0, false, flags) })
    }

    unsafe fn cudaMemDiscardBatchAsync_ptsz(
        dptrs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        // SAFETY: the same export (the stream orders nothing), the same contract.
        unsafe { Self::cudaMemDiscardBatchAsync(dptrs, sizes, count, flags, _stream) }
    }

    unsafe fn cudaMemDiscardAndPrefetchBatchAsync(
        dptrs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        locations: *mut c_void,
        idxs: *mut usize,
        num: usize,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cudaMemPrefetchBatchAsync`.
        code(unsafe { managed::batch_hints(dptrs.cast(), sizes, count, locations.cast(), idxs, num, true, flags) })
    }

    unsafe fn cudaMemDiscardAndPrefetchBatchAsync_ptsz(
        dptrs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        locations: *mut c_void,
        idxs: *mut usize,
        num: usize,
        flags: u64,
        _stream: *mut c_void,
    ) -> i32 {
        // SAFETY: the same export (the stream orders nothing), the same contract.
        unsafe { Self::cudaMemDiscardAndPrefetchBatchAsync(dptrs, sizes, count, locations, idxs, num, flags, _stream) }
    }

    // ---- Texture widths and host functions of CUDA 13

    unsafe fn cudaDeviceGetTexture1DLinearMaxWidth(
        width: *mut usize,
        desc: *const ChannelFormatDesc,
        device: i32,
    ) -> i32 {
        // SAFETY: a writable `size_t` and a readable `cudaChannelFormatDesc` where CUDA asks
        // for them.
        code(unsafe { device::texture_1d_linear_max_width(width, desc, device) })
    }

    unsafe fn cudaLaunchHostFunc_v2(stream: *mut c_void, r#fn: u64, user_data: *mut c_void, sync_mode: u32) -> i32 {
        // SAFETY: as in `cudaLaunchHostFunc`.
        code(unsafe { launch_host_func_v2(stream, r#fn, user_data, sync_mode) })
    }

    unsafe fn cudaLaunchHostFunc_v2_ptsz(
        stream: *mut c_void,
        r#fn: u64,
        user_data: *mut c_void,
        sync_mode: u32,
    ) -> i32 {
        // SAFETY: as in `cudaLaunchHostFunc`.
        code(unsafe { launch_host_func_v2(per_thread(stream), r#fn, user_data, sync_mode) })
    }

    // ---- Libraries (library.rs)

    unsafe fn cudaLibraryLoadData(
        out: *mut *mut c_void,
        image: *const c_void,
        jit: *mut i32,
        jit_values: *mut *mut c_void,
        jit_count: u32,
        lib: *mut i32,
        lib_values: *mut *mut c_void,
        lib_count: u32,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on: `library::load_data` asks of them what
        // CUDA asks of this export's caller.
        code(unsafe { library::load_data(out, image, jit, jit_values, jit_count, lib, lib_values, lib_count) })
    }

    unsafe fn cudaLibraryLoadFromFile(
        out: *mut *mut c_void,
        path: *const c_char,
        jit: *mut i32,
        jit_values: *mut *mut c_void,
        jit_count: u32,
        lib: *mut i32,
        lib_values: *mut *mut c_void,
        lib_count: u32,
    ) -> i32 {
        // SAFETY: as in `cudaLibraryLoadData`.
        code(unsafe { library::load_from_file(out, path, jit, jit_values, jit_count, lib, lib_values, lib_count) })
    }

    unsafe fn cudaLibraryUnload(lib: *mut c_void) -> i32 {
        code(library::unload(lib as usize as u64))
    }

    unsafe fn cudaLibraryGetKernel(out: *mut *mut c_void, lib: *mut c_void, name: *const c_char) -> i32 {
        // SAFETY: a writable kernel handle and a NUL-terminated name where CUDA asks for them.
        code(unsafe { library::get_kernel(out, lib as usize as u64, name) })
    }

    unsafe fn cudaLibraryGetKernelCount(count: *mut u32, lib: *mut c_void) -> i32 {
        // SAFETY: a writable `unsigned int` where CUDA asks for one.
        code(unsafe { library::kernel_count(count, lib as usize as u64) })
    }

    unsafe fn cudaLibraryEnumerateKernels(kernels: *mut *mut c_void, max: u32, lib: *mut c_void) -> i32 {
        // SAFETY: room for `max` kernel handles where CUDA asks for it.
        code(unsafe { library::enumerate_kernels(kernels, max, lib as usize as u64) })
    }

    unsafe fn cudaLibraryGetGlobal(
        dptr: *mut *mut c_void,
        bytes: *mut usize,
        lib: *mut c_void,
        name: *const c_char,
    ) -> i32 {
        // SAFETY: writable out parameters (or null) and a NUL-terminated name where CUDA asks
        // for them.
        code(unsafe { library::get_global(dptr, bytes, lib as usize as u64, name) })
    }

    unsafe fn cudaLibraryGetManaged(
        _dptr: *mut *mut c_void,
        _bytes: *mut usize,
        _lib: *mut c_void,
        _name: *const c_char,
    ) -> i32 {
        code(library::get_managed())
    }

    unsafe fn cudaLibraryGetUnifiedFunction(_fptr: *mut *mut c_void, _lib: *mut c_void, _symbol: *const c_char) -> i32 {
        code(library::get_unified_function())
    }
}

/// `cudaLaunchHostFunc_v2`: `syncMode` (`cudaHostTaskBlocking` 0, `cudaHostTaskSpinWait` 1)
/// says how CUDA's worker waits for the function; Phos's callback thread runs it the same way
/// whichever is asked.
///
/// # Safety
/// As `cudaLaunchHostFunc`.
unsafe fn launch_host_func_v2(stream: *mut c_void, f: u64, data: *mut c_void, sync_mode: u32) -> Result<(), CudaError> {
    if sync_mode > 1 {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: as this function's contract gives them.
    unsafe { callbacks::launch_host_func(stream, f, data) }
}

/// `cudaMemcpyBatchAsync` as each ABI passes it: CUDA 12.8 and 12.9 with `failIdx` before the
/// stream, CUDA 13 without (its stream where 12's `failIdx` is).
///
/// # Safety
/// The arguments as the ABI's function takes them.
#[allow(clippy::too_many_arguments)]
unsafe fn memcpy_batch_abi(
    dsts: *mut *mut c_void,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    count: usize,
    attrs: *mut c_void,
    idxs: *mut usize,
    num_attrs: usize,
    fail_idx_or_stream: *mut c_void,
    stream_12: *mut c_void,
    per_thread: bool,
) -> Result<(), CudaError> {
    let (fail_idx, stream) = if soname::current_abi().major() >= 13 {
        (std::ptr::null_mut(), fail_idx_or_stream as usize as u64)
    } else {
        (fail_idx_or_stream as *mut usize, stream_12 as usize as u64)
    };
    // SAFETY: the arrays and `failIdx` as the ABI's function takes them.
    unsafe {
        batch::memcpy_batch(
            dsts.cast(),
            srcs.cast(),
            sizes,
            count,
            attrs.cast(),
            idxs,
            num_attrs,
            fail_idx,
            stream,
            per_thread,
        )
    }
}

/// `cudaMemcpy3DBatchAsync` as each ABI passes it: CUDA 12.8 and 12.9's (numOps, opList,
/// failIdx, flags, stream), CUDA 13's (numOps, opList, flags, stream).
///
/// # Safety
/// The arguments as the ABI's function takes them.
unsafe fn memcpy_3d_batch_abi(
    num_ops: usize,
    ops: *mut c_void,
    fail_idx_or_flags: *mut c_void,
    flags_or_stream: u64,
    stream_12: *mut c_void,
    per_thread: bool,
) -> Result<(), CudaError> {
    let (fail_idx, flags, stream) = if soname::current_abi().major() >= 13 {
        (std::ptr::null_mut(), fail_idx_or_flags as usize as u64, flags_or_stream)
    } else {
        (fail_idx_or_flags as *mut usize, flags_or_stream, stream_12 as usize as u64)
    };
    // SAFETY: the operations and `failIdx` as the ABI's function takes them.
    unsafe { batch::memcpy_3d_batch(num_ops, ops.cast(), fail_idx, flags, stream, per_thread) }
}

/// A `cudaGraphExec*SetParams` call: a null executable graph is `cudaErrorInvalidValue`.
fn exec_set(exec: *mut c_void, f: impl FnOnce(u64) -> Result<(), CudaError>) -> Result<(), CudaError> {
    if exec.is_null() {
        return Err(CudaError::InvalidValue);
    }
    f(exec as usize as u64)
}

/// `cudaGraphNodeGetDependencies` / `GetDependentNodes`: CUDA 11 and 12 have no edge data
/// (the count third); CUDA 13 has.
///
/// # Safety
/// The arguments as the ABI's function takes them.
unsafe fn node_edges_abi(
    node: *mut c_void,
    dependents: bool,
    out: *mut *mut c_void,
    edges_or_count: *mut c_void,
    count_13: *mut usize,
) -> Result<(), CudaError> {
    let (edges, count) = if soname::current_abi().major() >= 13 {
        (edges_or_count as *mut u8, count_13)
    } else {
        (std::ptr::null_mut(), edges_or_count as *mut usize)
    };
    // SAFETY: the arguments as the ABI places them (this function's contract).
    unsafe { graphs::node_edges(node as usize as u64, dependents, out.cast(), edges, count) }
}
