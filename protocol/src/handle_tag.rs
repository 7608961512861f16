//! How a virtual handle is made of its kind and number: the kind's tag in the top 16 bits
//! (`0x7e00 | kind`), far from the special stream values 0, 1 and 2 and from the session's
//! device addresses, and the number below it. The server hands handles out; the guest needs
//! the layout only for handles the C API passes as an `int` (cuFFT's `cufftHandle`), whose
//! value is the number alone.

use crate::apis::HandleKind;

/// Marks the high bits of every handle.
pub const TAG_BASE: u64 = 0x7e00;

/// The bits of a handle below its tag: its number within its kind.
pub const NUMBER_BITS: u32 = 48;

/// The mask of a handle's number.
pub const NUMBER_MASK: u64 = (1 << NUMBER_BITS) - 1;

/// The tag (top 16 bits) of `kind`'s handles: the kind's id from the specs, one for every API
/// (so the driver API's `CUstream` is the runtime's stream handle).
pub fn tag_of(kind: HandleKind) -> u64 {
    (TAG_BASE | u64::from(kind.id())) << NUMBER_BITS
}

/// The handle an `int` handle stands for: its number under `kind`'s tag. Any int maps to one
/// (a negative one to a number above `i32::MAX`, which no table hands out), so the server,
/// not the guest, says whether it is one of the session's.
pub fn wire_of_int(kind: HandleKind, value: i32) -> u64 {
    tag_of(kind) | u64::from(value as u32)
}

/// The `int` a handle of `kind` is passed as: its number, when it is of that kind and fits.
pub fn int_of_wire(kind: HandleKind, handle: u64) -> Option<i32> {
    if handle & !NUMBER_MASK != tag_of(kind) {
        return None;
    }
    i32::try_from(handle & NUMBER_MASK).ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_int_handle_is_its_number_under_the_kinds_tag() {
        let kind = HandleKind::CufftPlan;
        let wire = wire_of_int(kind, 5);
        assert_eq!(wire, tag_of(kind) | 5);
        assert_eq!(int_of_wire(kind, wire), Some(5));
        // Another kind's handle, a number past an int and the number 0 are no int handle.
        assert_eq!(int_of_wire(HandleKind::Stream, wire), None);
        assert_eq!(int_of_wire(kind, tag_of(kind) | (1 << 31)), None);
        assert_eq!(int_of_wire(kind, tag_of(kind)), None);
        // A negative int maps to a number no table hands out.
        assert!(wire_of_int(kind, -1) & NUMBER_MASK > i32::MAX as u64);
    }
}
