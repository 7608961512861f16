//! The pieces of cuFFT the spec marks `implemented_by(guest)` (its versions) and its utility.

use phos_protocol::cufft::CufftResult;

use super::rt;
use super::stubs::HandWritten;
use crate::abi::Abi;
use crate::soname;

/// cuFFT's version for the CUDA the program was built for: the cuFFT of CUDA 11.8 (10.9.0),
/// 12.9 (11.4.1) and 13.0 (12.0.0), as (major, minor, patch).
fn version(abi: Abi) -> (i32, i32, i32) {
    match abi {
        Abi::V11 => (10, 9, 0),
        Abi::V12 => (11, 4, 1),
        Abi::V13 => (12, 0, 0),
    }
}

/// Write `value` to the caller's out parameter `p`: `CUFFT_INVALID_VALUE` when null.
///
/// # Safety
/// `p` must be null or writable.
unsafe fn put(p: *mut i32, value: i32) -> Result<(), CufftResult> {
    if p.is_null() {
        return Err(CufftResult::INVALID_VALUE);
    }
    // SAFETY: not null, and writable (this function's contract).
    unsafe { p.write(value) };
    Ok(())
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    fn embed_count(embed: i128, rank: i128) -> Result<i128, CufftResult> {
        Ok(if embed == 0 { 0 } else { rank })
    }

    unsafe fn cufftGetVersion(out: *mut i32) -> i32 {
        rt::api_call(phos_protocol::cufft::FunctionId::CufftGetVersion, || {
            let (major, minor, patch) = version(soname::current_abi());
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(out, major * 1000 + minor * 100 + patch) }
        })
    }

    unsafe fn cufftGetProperty(property: i32, value: *mut i32) -> i32 {
        rt::api_call(phos_protocol::cufft::FunctionId::CufftGetProperty, || {
            let (major, minor, patch) = version(soname::current_abi());
            // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL of libraryPropertyType.
            let v = match property {
                0 => major,
                1 => minor,
                2 => patch,
                _ => return Err(CufftResult::INVALID_TYPE),
            };
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(value, v) }
        })
    }
}
