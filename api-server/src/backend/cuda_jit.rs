//! The `cuda` backend's JIT linking (`cuLinkCreate` ... `cuLinkComplete`) and tensor maps
//! (`cuTensorMapEncode*`), through the driver's own functions. They are called with plain
//! integers for their enum arguments, looked up once in NVIDIA's `libcuda.so.1` (already
//! loaded by the backend): the values come from guests (checked, but newer than the bindings'
//! Rust enums may know), and a value outside a Rust enum would be undefined behaviour.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use phos_protocol::CudaError;
use phos_protocol::jit_link::{LinkInputs, MAX_LOG};
use phos_protocol::tensor_map::{Kind, Params, SIZE};

use super::LinkOutcome;

type LinkCreate = unsafe extern "C" fn(u32, *mut i32, *mut *mut c_void, *mut *mut c_void) -> i32;
type LinkAddData =
    unsafe extern "C" fn(*mut c_void, i32, *mut c_void, usize, *const c_char, u32, *mut i32, *mut *mut c_void) -> i32;
type LinkComplete = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> i32;
type LinkDestroy = unsafe extern "C" fn(*mut c_void) -> i32;
type EncodeTiled = unsafe extern "C" fn(
    *mut c_void,
    i32,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    i32,
    i32,
    i32,
    i32,
) -> i32;
type EncodeIm2col = unsafe extern "C" fn(
    *mut c_void,
    i32,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const i32,
    *const i32,
    u32,
    u32,
    *const u32,
    i32,
    i32,
    i32,
    i32,
) -> i32;
type EncodeIm2colWide = unsafe extern "C" fn(
    *mut c_void,
    i32,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    i32,
    i32,
    u32,
    u32,
    *const u32,
    i32,
    i32,
    i32,
    i32,
    i32,
) -> i32;
type ReplaceAddress = unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32;

struct Driver {
    link_create: Option<LinkCreate>,
    link_add_data: Option<LinkAddData>,
    link_complete: Option<LinkComplete>,
    link_destroy: Option<LinkDestroy>,
    tiled: Option<EncodeTiled>,
    im2col: Option<EncodeIm2col>,
    /// CUDA 12.9's; older drivers lack it.
    im2col_wide: Option<EncodeIm2colWide>,
    replace_address: Option<ReplaceAddress>,
    /// Keeps the functions above loaded.
    _library: Option<libloading::Library>,
}

fn driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    DRIVER.get_or_init(|| {
        // SAFETY: NVIDIA's driver, which the backend loaded already (its initialisers ran).
        let library = unsafe { libloading::Library::new("libcuda.so.1") }.ok();
        /// # Safety
        /// `T` is the C signature of `name` in cuda.h, enums as `i32`.
        unsafe fn get<T: Copy>(library: &Option<libloading::Library>, name: &[u8]) -> Option<T> {
            // SAFETY: the caller's promise on `T`.
            library.as_ref().and_then(|l| unsafe { l.get::<T>(name) }.ok().map(|s| *s))
        }
        // Each field's type is its function's signature in cuda.h (CUDA 12.9), enums as i32.
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let link_create = unsafe { get(&library, b"cuLinkCreate_v2\0") };
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let link_add_data = unsafe { get(&library, b"cuLinkAddData_v2\0") };
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let link_complete = unsafe { get(&library, b"cuLinkComplete\0") };
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let link_destroy = unsafe { get(&library, b"cuLinkDestroy\0") };
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let tiled = unsafe { get(&library, b"cuTensorMapEncodeTiled\0") };
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let im2col = unsafe { get(&library, b"cuTensorMapEncodeIm2col\0") };
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let im2col_wide = unsafe { get(&library, b"cuTensorMapEncodeIm2colWide\0") };
        // SAFETY: the type of the `Driver` field it fills is its signature in cuda.h.
        let replace_address = unsafe { get(&library, b"cuTensorMapReplaceAddress\0") };
        Driver {
            link_create,
            link_add_data,
            link_complete,
            link_destroy,
            tiled,
            im2col,
            im2col_wide,
            replace_address,
            _library: library,
        }
    })
}

/// `CU_JIT_INFO_LOG_BUFFER` and its size, `CU_JIT_ERROR_LOG_BUFFER` and its size.
const INFO_LOG_BUFFER: i32 = 3;
const INFO_LOG_SIZE: i32 = 4;
const ERROR_LOG_BUFFER: i32 = 5;
const ERROR_LOG_SIZE: i32 = 6;

/// What the driver wrote into a log buffer of the size it reports.
fn log_text(buffer: &[u8], used: *mut c_void) -> Vec<u8> {
    let used = (used as usize).min(buffer.len());
    let text = &buffer[..used];
    text.split(|&b| b == 0).next().unwrap_or_default().to_vec()
}

/// Links `inputs` with the driver, in the calling thread's current context (the device's).
pub(super) fn link(inputs: &LinkInputs<'_>) -> LinkOutcome {
    let d = driver();
    let (Some(create), Some(add), Some(complete), Some(destroy)) =
        (d.link_create, d.link_add_data, d.link_complete, d.link_destroy)
    else {
        return LinkOutcome::failed(super::LINK_NOT_SUPPORTED, "the driver has no JIT linker");
    };
    // The logs in buffers of the server's (as large as the program asked for, bounded); the
    // program's own buffers are the guest's to fill.
    let mut info = vec![0u8; inputs.info_log.clamp(1, MAX_LOG) as usize];
    let mut error = vec![0u8; inputs.error_log.clamp(4096, MAX_LOG) as usize];
    let mut options: Vec<i32> = vec![INFO_LOG_BUFFER, INFO_LOG_SIZE, ERROR_LOG_BUFFER, ERROR_LOG_SIZE];
    let mut values: Vec<*mut c_void> = vec![
        info.as_mut_ptr() as *mut c_void,
        info.len() as *mut c_void,
        error.as_mut_ptr() as *mut c_void,
        error.len() as *mut c_void,
    ];
    for &(o, v) in &inputs.options {
        options.push(o);
        values.push(v as usize as *mut c_void);
    }
    let mut state: *mut c_void = std::ptr::null_mut();
    // SAFETY: as many options as values; the log buffers outlive the state (destroyed below).
    let r = unsafe { create(options.len() as u32, options.as_mut_ptr(), values.as_mut_ptr(), &mut state) };
    if r != 0 {
        return LinkOutcome::failed(r, "cuLinkCreate failed");
    }
    let mut outcome = LinkOutcome::default();
    for input in &inputs.inputs {
        let mut name = input.name.to_vec();
        name.push(0);
        let mut own: Vec<i32> = input.options.iter().map(|&(o, _)| o).collect();
        let mut own_values: Vec<*mut c_void> = input.options.iter().map(|&(_, v)| v as usize as *mut c_void).collect();
        // A copy the driver may read as it likes (it copies what it keeps); PTX terminated.
        let mut data = input.data.to_vec();
        data.push(0);
        // SAFETY: the input's bytes (its size without the terminator, which PTX gets besides),
        // a terminated name, as many options as values; all outlive the call.
        let r = unsafe {
            add(
                state,
                input.kind as i32,
                data.as_mut_ptr() as *mut c_void,
                input.data.len(),
                name.as_ptr() as *const c_char,
                own.len() as u32,
                own.as_mut_ptr(),
                own_values.as_mut_ptr(),
            )
        };
        if r != 0 {
            outcome.status = r;
            break;
        }
    }
    if outcome.status == 0 {
        let (mut cubin, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: a live state; writes the image's address and size.
        let r = unsafe { complete(state, &mut cubin, &mut size) };
        if r == 0 && !cubin.is_null() {
            // SAFETY: the image the driver made, `size` bytes, alive until the state is
            // destroyed below.
            outcome.image = unsafe { std::slice::from_raw_parts(cubin as *const u8, size) }.to_vec();
        }
        outcome.status = r;
    }
    outcome.info_log = log_text(&info, values[1]);
    outcome.error_log = log_text(&error, values[3]);
    // SAFETY: the state created above, destroyed once.
    unsafe { destroy(state) };
    outcome
}

/// The driver's tensor map for `params` (checked by the service).
pub(super) fn tensor_map_encode(p: &Params) -> Result<[u8; SIZE], CudaError> {
    let d = driver();
    #[repr(C, align(64))]
    struct Map([u8; SIZE]);
    let mut map = Map([0; SIZE]);
    let out = map.0.as_mut_ptr() as *mut c_void;
    let (dt, rank, addr) = (p.data_type as i32, p.rank, p.address as usize as *mut c_void);
    let (il, sw, l2, oob) = (p.interleave as i32, p.swizzle as i32, p.l2_promotion as i32, p.oob_fill as i32);
    let r = match p.kind {
        Kind::Tiled => {
            let f = d.tiled.ok_or(CudaError::NotSupported)?;
            // SAFETY: a 64-byte aligned map of 128 bytes; arrays of the rank's length (the
            // service checked the rank), alive for the call.
            unsafe {
                f(
                    out,
                    dt,
                    rank,
                    addr,
                    p.dims.as_ptr(),
                    p.strides.as_ptr(),
                    p.box_dim.as_ptr(),
                    p.element_strides.as_ptr(),
                    il,
                    sw,
                    l2,
                    oob,
                )
            }
        }
        Kind::Im2col => {
            let f = d.im2col.ok_or(CudaError::NotSupported)?;
            // SAFETY: as above; the corners hold rank - 2 values each.
            unsafe {
                f(
                    out,
                    dt,
                    rank,
                    addr,
                    p.dims.as_ptr(),
                    p.strides.as_ptr(),
                    p.lower.as_ptr(),
                    p.upper.as_ptr(),
                    p.channels_per_pixel,
                    p.pixels_per_column,
                    p.element_strides.as_ptr(),
                    il,
                    sw,
                    l2,
                    oob,
                )
            }
        }
        Kind::Im2colWide => {
            let f = d.im2col_wide.ok_or(CudaError::NotSupported)?;
            // SAFETY: as above.
            unsafe {
                f(
                    out,
                    dt,
                    rank,
                    addr,
                    p.dims.as_ptr(),
                    p.strides.as_ptr(),
                    p.lower[0],
                    p.upper[0],
                    p.channels_per_pixel,
                    p.pixels_per_column,
                    p.element_strides.as_ptr(),
                    il,
                    p.mode as i32,
                    sw,
                    l2,
                    oob,
                )
            }
        }
    };
    if r != 0 {
        return Err(CudaError(r));
    }
    Ok(map.0)
}

/// `cuTensorMapReplaceAddress` by the driver.
pub(super) fn tensor_map_replace_address(map: &mut [u8; SIZE], address: u64) -> Result<(), CudaError> {
    let f = driver().replace_address.ok_or(CudaError::NotSupported)?;
    #[repr(C, align(64))]
    struct Map([u8; SIZE]);
    let mut aligned = Map(*map);
    // SAFETY: a 64-byte aligned tensor map of 128 bytes.
    let r = unsafe { f(aligned.0.as_mut_ptr() as *mut c_void, address as usize as *mut c_void) };
    if r != 0 {
        return Err(CudaError(r));
    }
    *map = aligned.0;
    Ok(())
}
