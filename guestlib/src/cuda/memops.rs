//! Stream memory operations (`cuStreamWaitValue32/64`, `cuStreamWriteValue32/64`,
//! `cuStreamBatchMemOp`): the flags and the device's support checked here, each operation sent
//! to the server (`phosStreamMemOp`), which checks the address and runs it in stream order on
//! its backend. The `_v2` functions are CUDA 12's defaults; the first forms (CUDA 11's) are
//! the same operations, which a CUDA 12 driver offers only where its
//! `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1` says so: both are answered as the device's
//! attributes say.

use std::ffi::c_void;
use std::sync::Mutex;

use phos_protocol::cuda::{CuDeviceGetAttributeRequest, CuError, PhosStreamMemOpRequest};

use super::context;
use crate::runtime;

/// `phosStreamMemOp`'s operations.
pub mod op {
    pub const WAIT_32: i32 = 1;
    pub const WRITE_32: i32 = 2;
    pub const WAIT_64: i32 = 3;
    pub const WRITE_64: i32 = 4;
    pub const FLUSH: i32 = 5;
}

/// `CUstreamWaitValue_flags` and `CUstreamWriteValue_flags`.
const WAIT_NOR: u32 = 3;
const WAIT_FLUSH: u32 = 1 << 30;
const WRITE_NO_MEMORY_BARRIER: u32 = 1;

/// `CUdevice_attribute`s of stream memory operations.
mod attr {
    pub const MEM_OPS_V1: i32 = 92;
    pub const MEM_OPS_64_V1: i32 = 93;
    pub const WAIT_NOR_V1: i32 = 94;
    pub const FLUSH_REMOTE_WRITES: i32 = 98;
    pub const MEM_OPS_64: i32 = 122;
    pub const WAIT_NOR: i32 = 123;
}

/// Which API form a call is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Form {
    V1,
    V2,
}

/// The attributes above of each device, asked once.
static SUPPORT: Mutex<Vec<(i32, i32, bool)>> = Mutex::new(Vec::new());

fn device_attribute(device: i32, attrib: i32) -> Result<bool, CuError> {
    if let Some(&(_, _, v)) =
        SUPPORT.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|(d, a, _)| *d == device && *a == attrib)
    {
        return Ok(v);
    }
    let v = runtime::call(&CuDeviceGetAttributeRequest { attrib, dev: device })?.pi != 0;
    SUPPORT.lock().unwrap_or_else(|p| p.into_inner()).push((device, attrib, v));
    Ok(v)
}

/// Whether the current device supports what the operation needs: `CUDA_ERROR_NOT_SUPPORTED`
/// where its attributes say it does not (the driver's answer).
fn require(form: Form, wide: bool, nor: bool, flush: bool) -> Result<(), CuError> {
    let device = context::current_device()?;
    let mut needed = Vec::new();
    match form {
        Form::V1 => {
            needed.push(attr::MEM_OPS_V1);
            if wide {
                needed.push(attr::MEM_OPS_64_V1);
            }
            if nor {
                needed.push(attr::WAIT_NOR_V1);
            }
        }
        Form::V2 => {
            if wide {
                needed.push(attr::MEM_OPS_64);
            }
            if nor {
                needed.push(attr::WAIT_NOR);
            }
        }
    }
    if flush {
        needed.push(attr::FLUSH_REMOTE_WRITES);
    }
    for a in needed {
        if !device_attribute(device, a)? {
            return Err(CuError::NOT_SUPPORTED);
        }
    }
    Ok(())
}

fn send(stream: *mut c_void, addr: u64, value: u64, op: i32, flags: u32) -> Result<(), CuError> {
    runtime::call(&PhosStreamMemOpRequest { stream: stream as u64, addr, value, op, flags })?;
    Ok(())
}

/// `cuStreamWaitValue32/64`: flags GEQ, EQ, AND or NOR, with FLUSH or not.
pub fn wait(form: Form, stream: *mut c_void, addr: u64, value: u64, flags: u32, wide: bool) -> Result<(), CuError> {
    check_wait(form, addr, flags, wide)?;
    send(stream, addr, value, if wide { op::WAIT_64 } else { op::WAIT_32 }, flags)
}

fn check_wait(form: Form, addr: u64, flags: u32, wide: bool) -> Result<(), CuError> {
    let size = if wide { 8 } else { 4 };
    if flags & !(3 | WAIT_FLUSH) != 0 || addr == 0 || !addr.is_multiple_of(size) {
        return Err(CuError::INVALID_VALUE);
    }
    require(form, wide, flags & 3 == WAIT_NOR, flags & WAIT_FLUSH != 0)
}

/// `cuStreamWriteValue32/64`: flags DEFAULT, or NO_MEMORY_BARRIER in the first form.
pub fn write(form: Form, stream: *mut c_void, addr: u64, value: u64, flags: u32, wide: bool) -> Result<(), CuError> {
    check_write(form, addr, flags, wide)?;
    send(stream, addr, value, if wide { op::WRITE_64 } else { op::WRITE_32 }, flags)
}

fn check_write(form: Form, addr: u64, flags: u32, wide: bool) -> Result<(), CuError> {
    let size = if wide { 8 } else { 4 };
    if flags & !WRITE_NO_MEMORY_BARRIER != 0 || addr == 0 || !addr.is_multiple_of(size) {
        return Err(CuError::INVALID_VALUE);
    }
    // "This flag is not supported in the v2 API" (CUstreamWriteValue_flags): CUDA 13 on an
    // H100 answers CUDA_ERROR_INVALID_VALUE.
    if form == Form::V2 && flags & WRITE_NO_MEMORY_BARRIER != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    require(form, wide, false, false)
}

/// `CUstreamBatchMemOpType`.
mod batch {
    pub const WAIT_VALUE_32: u32 = 1;
    pub const WRITE_VALUE_32: u32 = 2;
    pub const FLUSH_REMOTE_WRITES: u32 = 3;
    pub const WAIT_VALUE_64: u32 = 4;
    pub const WRITE_VALUE_64: u32 = 5;
    pub const BARRIER: u32 = 6;
    /// `sizeof(CUstreamBatchMemOpParams)`.
    pub const SIZE: usize = 48;
    /// The most operations of one batch (the driver's limit).
    pub const MAX: u32 = 256;
}

/// `cuStreamBatchMemOp`: the operations one after another, in order on the stream (a
/// barrier orders nothing more here: each operation is done before the next starts).
///
/// # Safety
/// `params` must hold `count` `CUstreamBatchMemOpParams`.
pub unsafe fn batch(
    form: Form,
    stream: *mut c_void,
    count: u32,
    params: *const c_void,
    flags: u32,
) -> Result<(), CuError> {
    if flags != 0 || count == 0 || count > batch::MAX || params.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let ops: Vec<[u8; batch::SIZE]> = (0..count as usize)
        // SAFETY: operation `i` of `count` (this function's contract).
        .map(|i| unsafe { (params as *const [u8; batch::SIZE]).wrapping_add(i).read_unaligned() })
        .collect();
    let u32_at = |b: &[u8; batch::SIZE], at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let u64_at = |b: &[u8; batch::SIZE], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap_or_default());
    // Every operation checked before any is sent, as the driver refuses a batch whole.
    for o in &ops {
        let (addr, flags) = (u64_at(o, 8), u32_at(o, 24));
        match u32_at(o, 0) {
            batch::WAIT_VALUE_32 => check_wait(form, addr, flags, false)?,
            batch::WAIT_VALUE_64 => check_wait(form, addr, flags, true)?,
            batch::WRITE_VALUE_32 => check_write(form, addr, flags, false)?,
            batch::WRITE_VALUE_64 => check_write(form, addr, flags, true)?,
            batch::FLUSH_REMOTE_WRITES => require(form, false, false, true)?,
            // A barrier operation is the v2 API's.
            batch::BARRIER if form == Form::V2 => {}
            _ => return Err(CuError::INVALID_VALUE),
        }
    }
    for o in &ops {
        // { operation; address @8; value or value64 @16; flags @24; alias @32 }
        let (addr, flags) = (u64_at(o, 8), u32_at(o, 24));
        match u32_at(o, 0) {
            batch::WAIT_VALUE_32 => wait(form, stream, addr, u32_at(o, 16) as u64, flags, false)?,
            batch::WAIT_VALUE_64 => wait(form, stream, addr, u64_at(o, 16), flags, true)?,
            batch::WRITE_VALUE_32 => write(form, stream, addr, u32_at(o, 16) as u64, flags, false)?,
            batch::WRITE_VALUE_64 => write(form, stream, addr, u64_at(o, 16), flags, true)?,
            batch::FLUSH_REMOTE_WRITES => {
                require(form, false, false, true)?;
                send(stream, 0, 0, op::FLUSH, 0)?;
            }
            _ => {} // a barrier
        }
    }
    Ok(())
}
