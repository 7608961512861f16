//! JIT linking (`cuLinkCreate`, `cuLinkAddData`/`File`, `cuLinkComplete`, `cuLinkDestroy`):
//! numba, CuPy and CUDA's ptxjit sample link PTX and device code at run time. The link state
//! lives here: its options and the inputs added, copied (the driver copies them too, so the
//! caller may free its buffers). `cuLinkComplete` sends everything to the server in one call
//! (`phosLinkRun`, [`phos_protocol::jit_link`]'s encoding), which links on its backend; the
//! image and logs come back with `phosLinkTake`. The image is the link state's until
//! `cuLinkDestroy`, as the driver says, and loads with `cuModuleLoadData` like any other.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use phos_protocol::cuda::{CuError, PhosLinkRunRequest, PhosLinkTakeRequest};
use phos_protocol::jit_link::{self, Input, LinkInputs, input_type};

use crate::runtime;

/// `CUjit_option`s the guest itself answers.
mod option {
    pub const WALL_TIME: i32 = 2;
    pub const INFO_LOG_BUFFER: i32 = 3;
    pub const INFO_LOG_BUFFER_SIZE_BYTES: i32 = 4;
    pub const ERROR_LOG_BUFFER: i32 = 5;
    pub const ERROR_LOG_BUFFER_SIZE_BYTES: i32 = 6;
    pub const TARGET_FROM_CUCONTEXT: i32 = 8;
    pub const GLOBAL_SYMBOL_COUNT: i32 = 19;
    pub const REFERENCED_KERNEL_COUNT: i32 = 26;
    pub const REFERENCED_VARIABLE_COUNT: i32 = 28;
    /// The options of CUDA 12.8 (`CU_JIT_NUM_OPTIONS`).
    pub const COUNT: i32 = 34;
}

/// The options of a link or of one input, as the caller gave them: where the driver writes
/// back what it reports (log sizes, wall time), and the numbers carried to the server.
#[derive(Default)]
struct Options {
    /// (log buffer address, its size) of the info and error logs.
    info_log: Option<(usize, u32)>,
    error_log: Option<(usize, u32)>,
    /// Where the size options' values are, to write back the sizes used.
    info_size_at: Option<usize>,
    error_size_at: Option<usize>,
    wall_time_at: Option<usize>,
    carried: Vec<(i32, u64)>,
}

/// Reads `count` options: each known option's value, refusing unknown ones.
///
/// # Safety
/// `options` and `values` must hold `count` entries (either may be null when `count` is 0),
/// and the buffers and places they name must stay valid while the link state is used (the
/// driver's contract for `cuLinkCreate`'s options).
unsafe fn read_options(count: u32, options: *const i32, values: *mut *mut c_void) -> Result<Options, CuError> {
    let mut o = Options::default();
    if count == 0 {
        return Ok(o);
    }
    if options.is_null() || values.is_null() || count as usize > jit_link::MAX_OPTIONS {
        return Err(CuError::INVALID_VALUE);
    }
    let (mut info, mut info_size, mut error, mut error_size) = (None, None, None, None);
    for i in 0..count as usize {
        // SAFETY: `i < count`, the length of both lists (this function's contract).
        let (option, slot) = (unsafe { options.wrapping_add(i).read() }, values.wrapping_add(i));
        // SAFETY: the option's value, in its list (this function's contract).
        let value = unsafe { slot.read() } as usize;
        match option {
            option::INFO_LOG_BUFFER => info = Some(value),
            option::ERROR_LOG_BUFFER => error = Some(value),
            option::INFO_LOG_BUFFER_SIZE_BYTES => {
                info_size = Some(value as u32);
                o.info_size_at = Some(slot as usize);
            }
            option::ERROR_LOG_BUFFER_SIZE_BYTES => {
                error_size = Some(value as u32);
                o.error_size_at = Some(slot as usize);
            }
            option::WALL_TIME => o.wall_time_at = Some(slot as usize),
            // Symbols the program resolves to host addresses of its own, and the kernels and
            // variables to keep: lists of host pointers the server could not follow.
            option::GLOBAL_SYMBOL_COUNT | option::REFERENCED_KERNEL_COUNT | option::REFERENCED_VARIABLE_COUNT
                if value != 0 =>
            {
                return Err(not_supported("cuLinkCreate", &format!("JIT option {option} (symbol lists)")));
            }
            17..=19 | 25..=28 => {}
            option::TARGET_FROM_CUCONTEXT => o.carried.push((option, 0)),
            o2 if jit_link::carried_option(o2) => o.carried.push((o2, value as u64)),
            _ => return Err(CuError::INVALID_VALUE),
        }
        debug_assert!(option < option::COUNT || !jit_link::carried_option(option));
    }
    o.info_log = info.filter(|&b| b != 0).map(|b| (b, info_size.unwrap_or(0)));
    o.error_log = error.filter(|&b| b != 0).map(|b| (b, error_size.unwrap_or(0)));
    Ok(o)
}

fn not_supported(function: &str, what: &str) -> CuError {
    if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(function) {
        tracing::warn!(
            "{function}: {what} is not supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED ({dropped} earlier lines dropped)"
        );
    }
    CuError::NOT_SUPPORTED
}

impl Options {
    /// Write `text` into a log buffer the caller gave (cut to its size, NUL-terminated) and
    /// the size used back into its size option.
    fn write_log(buffer: Option<(usize, u32)>, size_at: Option<usize>, text: &[u8]) {
        let mut used = 0usize;
        if let Some((at, room)) = buffer
            && room > 0
        {
            let n = text.len().min(room as usize - 1);
            // SAFETY: the caller's log buffer of `room` bytes, valid while its link state is
            // (the driver's contract); `n + 1 <= room` bytes are written.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), at as *mut u8, n);
            }
            // SAFETY: byte `n` of the same buffer, `n < room`.
            unsafe { (at as *mut u8).wrapping_add(n).write(0) };
            used = if n > 0 { n + 1 } else { 0 };
        }
        if let Some(at) = size_at {
            // SAFETY: the size option's place in the caller's value list (the contract above);
            // the driver writes the size used there as the pointer-sized value.
            unsafe { (at as *mut *mut c_void).write(used as *mut c_void) };
        }
    }

    fn logs(&self, info: &[u8], error: &[u8]) {
        Self::write_log(self.info_log, self.info_size_at, info);
        Self::write_log(self.error_log, self.error_size_at, error);
    }

    fn wall_time(&self, ms: f32) {
        if let Some(at) = self.wall_time_at {
            // SAFETY: the option's place in the caller's value list (the contract above): the
            // driver writes the float into the value's first four bytes.
            unsafe { (at as *mut f32).write_unaligned(ms) };
        }
    }
}

struct OwnedInput {
    kind: u32,
    name: Vec<u8>,
    options: Vec<(i32, u64)>,
    data: Vec<u8>,
}

struct LinkState {
    options: Options,
    inputs: Vec<OwnedInput>,
    total: u64,
    /// The linked image, the state's until it is destroyed.
    image: Option<Box<[u8]>>,
}

static STATES: Mutex<Option<HashMap<u64, LinkState>>> = Mutex::new(None);
/// Link state handles: addresses no allocation has (the program may print or compare them).
static NEXT: AtomicU64 = AtomicU64::new(0x7f1c_0000_1000);

fn with<T>(f: impl FnOnce(&mut HashMap<u64, LinkState>) -> T) -> T {
    let mut g = STATES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// `cuLinkCreate`.
///
/// # Safety
/// As [`read_options`]; `state_out` null or writable.
pub unsafe fn create(count: u32, options: *const i32, values: *mut *mut c_void) -> Result<u64, CuError> {
    // SAFETY: this function's contract.
    let options = unsafe { read_options(count, options, values) }?;
    let handle = NEXT.fetch_add(0x40, Ordering::Relaxed);
    with(|s| s.insert(handle, LinkState { options, inputs: Vec::new(), total: 0, image: None }));
    Ok(handle)
}

pub fn destroy(state: u64) -> Result<(), CuError> {
    with(|s| s.remove(&state)).map(|_| ()).ok_or(CuError::INVALID_HANDLE)
}

/// `cuLinkAddData`: the input copied into the state. PTX is checked now (the driver compiles
/// it here, and reports a bad one here): its error goes to the link's error log.
///
/// # Safety
/// `data` null or `size` readable bytes; `name` null or NUL-terminated; the options as
/// [`read_options`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_data(
    state: u64,
    kind: i32,
    data: *const c_void,
    size: usize,
    name: *const c_char,
    count: u32,
    options: *const i32,
    values: *mut *mut c_void,
) -> Result<(), CuError> {
    if data.is_null() || size == 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `size` readable bytes (this function's contract).
    let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, size) };
    // SAFETY: as this function's contract.
    unsafe { add(state, kind, bytes.to_vec(), name, count, options, values) }
}

/// `cuLinkAddFile`: the file read here, in the guest.
///
/// # Safety
/// `path` null or NUL-terminated; `name` as the path; the options as [`read_options`].
pub unsafe fn add_file(
    state: u64,
    kind: i32,
    path: *const c_char,
    count: u32,
    options: *const i32,
    values: *mut *mut c_void,
) -> Result<(), CuError> {
    if path.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: not null and NUL-terminated (this function's contract).
    let p = unsafe { CStr::from_ptr(path) }.to_str().map_err(|_| CuError::INVALID_VALUE)?;
    if !with(|s| s.contains_key(&state)) {
        return Err(CuError::INVALID_HANDLE);
    }
    let data = std::fs::read(p).map_err(|e| {
        if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit("cuLinkAddFile") {
            tracing::warn!("cuLinkAddFile: cannot read {p}: {e} ({dropped} earlier lines dropped)");
        }
        CuError::FILE_NOT_FOUND
    })?;
    if data.is_empty() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract (the input is named by its path).
    unsafe { add(state, kind, data, path, count, options, values) }
}

/// # Safety
/// As [`add_data`].
unsafe fn add(
    state: u64,
    kind: i32,
    mut data: Vec<u8>,
    name: *const c_char,
    count: u32,
    options: *const i32,
    values: *mut *mut c_void,
) -> Result<(), CuError> {
    let kind = u32::try_from(kind).ok().filter(|&k| k <= input_type::NVVM).ok_or(CuError::INVALID_VALUE)?;
    let name = if name.is_null() {
        Vec::new()
    } else {
        // SAFETY: not null and NUL-terminated (this function's contract).
        unsafe { CStr::from_ptr(name) }.to_bytes().iter().copied().take(jit_link::MAX_NAME).collect()
    };
    // SAFETY: as this function's contract.
    let own = unsafe { read_options(count, options, values) }?;
    if kind == input_type::PTX {
        // PTX is text up to its terminator, whatever size was given.
        if let Some(end) = data.iter().position(|&b| b == 0) {
            data.truncate(end);
        }
        // What can be told here without compiling (the server compiles): PTX has its header,
        // and its kernels' signatures read. Text with no PTX header is not an image at all
        // (the driver answers CUDA_ERROR_INVALID_IMAGE, as CUDA 13 does on an H100), PTX
        // that does not read is invalid PTX.
        let checked = match std::str::from_utf8(&data) {
            Ok(text) if text.contains(".version") && text.contains(".target") => {
                crate::registry::ptx_layouts(text).map_err(|e| (e, CuError::INVALID_PTX))
            }
            _ => Err(("no .version and .target: not PTX".to_string(), CuError::INVALID_IMAGE)),
        };
        if let Err((e, status)) = checked {
            let message = format!("ptxas application ptx input, {}: {e}", String::from_utf8_lossy(&name));
            own.logs(b"", message.as_bytes());
            with(|s| s.get(&state).map(|l| l.options.logs(b"", message.as_bytes())));
            return Err(status);
        }
    }
    own.logs(b"", b"");
    with(|s| {
        let l = s.get_mut(&state).ok_or(CuError::INVALID_HANDLE)?;
        let total = l.total.saturating_add(data.len() as u64);
        if total > jit_link::MAX_INPUT_BYTES || l.inputs.len() >= jit_link::MAX_INPUTS {
            return Err(CuError::OUT_OF_MEMORY);
        }
        l.total = total;
        l.inputs.push(OwnedInput { kind, name, options: own.carried, data });
        Ok(())
    })
}

/// `cuLinkComplete`: the inputs linked at the server; the image, which the state owns.
pub fn complete(state: u64) -> Result<(*const u8, usize), CuError> {
    // The inputs stay in the state (the program may complete again); encoded under the lock.
    let encoded = with(|s| {
        let l = s.get(&state).ok_or(CuError::INVALID_HANDLE)?;
        if l.inputs.is_empty() {
            return Err(CuError::INVALID_VALUE);
        }
        let room = |log: Option<(usize, u32)>| log.map_or(0, |(_, n)| n);
        let request = LinkInputs {
            options: l.options.carried.clone(),
            info_log: room(l.options.info_log),
            error_log: room(l.options.error_log),
            inputs: l
                .inputs
                .iter()
                .map(|i| Input { kind: i.kind, name: &i.name, options: i.options.clone(), data: &i.data })
                .collect(),
        };
        Ok(request.encode())
    })?;
    let started = std::time::Instant::now();
    let run = runtime::call(&PhosLinkRunRequest { inputs: &encoded, inputsSize: encoded.len() as u64 })?;
    let taken = runtime::call(&PhosLinkTakeRequest {
        link: run.link,
        imageSize: run.imageSize,
        infoSize: run.infoSize,
        errorSize: run.errorSize,
    })?;
    let ms = started.elapsed().as_secs_f32() * 1e3;
    with(|s| {
        let l = s.get_mut(&state).ok_or(CuError::INVALID_HANDLE)?;
        l.options.logs(&taken.infoLog, &taken.errorLog);
        l.options.wall_time(ms);
        if run.status != 0 {
            return Err(CuError(run.status));
        }
        let image = l.image.insert(taken.image.into_boxed_slice());
        Ok((image.as_ptr(), image.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_are_cut_terminated_and_their_sizes_written_back() {
        let mut buffer = [0xAAu8; 8];
        let mut options = [option::ERROR_LOG_BUFFER, option::ERROR_LOG_BUFFER_SIZE_BYTES, 7];
        let mut values = [buffer.as_mut_ptr() as *mut c_void, 8usize as *mut c_void, 3usize as *mut c_void];
        // SAFETY: three options and values; the buffer outlives the options.
        let o = unsafe { read_options(3, options.as_mut_ptr(), values.as_mut_ptr()) }.unwrap();
        assert_eq!(o.carried, vec![(7, 3)]);
        o.logs(b"", b"undefined reference to 'f'");
        assert_eq!(&buffer, b"undefin\0");
        assert_eq!(values[1] as usize, 8, "the size used, terminator included");
        options[2] = 99; // not an option
        // SAFETY: as above.
        let refused = unsafe { read_options(3, options.as_mut_ptr(), values.as_mut_ptr()) };
        assert_eq!(refused.err(), Some(CuError::INVALID_VALUE));
    }
}
