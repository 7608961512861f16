//! The pieces of cuRAND the spec marks `implemented_by(guest)`, its utility and its hooks.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock, PoisonError};

use phos_protocol::curand::{CurandCreateGeneratorHostRequest, CurandStatus};

use super::rt;
use super::stubs::HandWritten;
use crate::abi::Abi;
use crate::soname;

/// The generators made by curandCreateGeneratorHost: every generation on them sends
/// `on_host`, which makes the output a buffer of the reply instead of a device range.
/// (A std lock: the guest library does not take parking_lot; the set is updated in one step,
/// so a poisoned lock still holds a consistent set.)
fn host_generators() -> &'static Mutex<HashSet<u64>> {
    static HOST: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    HOST.get_or_init(Mutex::default)
}

/// cuRAND's version for the CUDA the program was built for: the cuRAND of CUDA 11.8 (10.3.0),
/// 12.9 (10.3.10) and 13.0 (10.4.0), as (major, minor, patch).
fn version(abi: Abi) -> (i32, i32, i32) {
    match abi {
        Abi::V11 => (10, 3, 0),
        Abi::V12 => (10, 3, 10),
        Abi::V13 => (10, 4, 0),
    }
}

/// Write `value` to the caller's out parameter `p`: `CURAND_STATUS_OUT_OF_RANGE` when null.
///
/// # Safety
/// `p` must be null or writable.
unsafe fn put(p: *mut i32, value: i32) -> Result<(), CurandStatus> {
    if p.is_null() {
        return Err(CurandStatus::OUT_OF_RANGE);
    }
    // SAFETY: not null, and writable (this function's contract).
    unsafe { p.write(value) };
    Ok(())
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    unsafe fn curandGetVersion(out: *mut i32) -> i32 {
        rt::api_call(phos_protocol::curand::FunctionId::CurandGetVersion, || {
            let (major, minor, patch) = version(soname::current_abi());
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(out, major * 1000 + minor * 100 + patch) }
        })
    }

    unsafe fn curandGetProperty(property: i32, value: *mut i32) -> i32 {
        rt::api_call(phos_protocol::curand::FunctionId::CurandGetProperty, || {
            let (major, minor, patch) = version(soname::current_abi());
            // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL of libraryPropertyType.
            let v = match property {
                0 => major,
                1 => minor,
                2 => patch,
                _ => return Err(CurandStatus::OUT_OF_RANGE),
            };
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(value, v) }
        })
    }

    fn generator_on_host(generator: i128) -> Result<i128, CurandStatus> {
        let generator = u64::try_from(generator).map_err(|_| CurandStatus::NOT_INITIALIZED)?;
        let host = host_generators().lock().unwrap_or_else(PoisonError::into_inner).contains(&generator);
        Ok(i128::from(host))
    }

    unsafe fn create_host_generator(generator: *mut *mut c_void, rng_type: i32) -> Option<Result<(), CurandStatus>> {
        if generator.is_null() {
            return Some(Err(CurandStatus::OUT_OF_RANGE));
        }
        Some(rt::call(&CurandCreateGeneratorHostRequest { rng_type }).map(|reply| {
            host_generators().lock().unwrap_or_else(PoisonError::into_inner).insert(reply.generator);
            // SAFETY: not null (checked above), and writable: cuRAND's contract with its caller.
            unsafe { *generator = reply.generator as usize as *mut c_void };
        }))
    }

    unsafe fn forget_generator(generator: *mut c_void) -> Option<Result<(), CurandStatus>> {
        // Forgotten before the server answers: a generator the server refuses to destroy is
        // not one of the session's anyway.
        host_generators().lock().unwrap_or_else(PoisonError::into_inner).remove(&(generator as u64));
        None
    }
}
