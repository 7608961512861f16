//! The process's variant packs as the guest knows them, and its pool of them.
//!
//! cudnn-frontend (PyTorch's convolutions and attention) makes a variant pack for every
//! execution of a cached plan: a creation, three settings (the unique ids, the data pointers,
//! the workspace), a finalization, the execution and a destruction; each a round trip if it
//! waits. The guest keeps every variant pack made by a creation the server accepted (or taken
//! from the pool) and not destroyed since, with what its settings set ([`PackContents`]). So:
//!
//! - a setting of a known pack not finalized, of an attribute cuDNN documents for a pack with
//!   its type and count (`phos_protocol::dnn::variant_pack_attribute`, the rule the server
//!   applies too), goes without waiting (its async id): only its values (device pointers) are
//!   left for the server to refuse, and such a failure is kept for the next synchronous cuDNN
//!   call (`deferred::ANY`). Any other setting waits, as before, and gets its status from the
//!   call;
//! - a finalization of a known pack whose required attributes are set (a unique id for each
//!   data pointer, the workspace) goes without waiting: cuDNN documents no failure for it;
//! - a destruction puts the pack in the pool (at most [`POOL_MAX`]; beyond, it is destroyed
//!   without waiting) and tells the server, without waiting, that it is parked
//!   (`phosCudnnVariantPackPark`: forgotten and refused by every call until it is made again);
//!   a creation of a variant pack takes one from the pool and makes the server make it fresh
//!   under the same handle (`phosCudnnVariantPackReinit`, without waiting).
//!
//! A pack that another descriptor's attribute names is forgotten here (its calls wait, its
//! destruction goes to the server), since the server keeps what is referred to.

use std::cell::Cell;
use std::ffi::c_void;

use phos_protocol::Ptr;
use phos_protocol::cudnn::{self as wire, CudnnStatus};
use phos_protocol::dnn::{self, PackContents};

use super::pool::{Pool, Table};

/// Variant packs the guest keeps for reuse at most (a framework holds a few at once).
pub const POOL_MAX: usize = 64;

use phos_protocol::cudnn::consts::CUDNN_TYPE_BACKEND_DESCRIPTOR as TYPE_BACKEND_DESCRIPTOR;

#[derive(Default, Clone, Copy)]
struct Pack {
    contents: PackContents,
    finalized: bool,
}

/// Live variant packs, by handle.
static TABLE: Pool<Pack> = Pool::new(POOL_MAX);

fn with<T>(f: impl FnOnce(&mut Table<Pack>) -> T) -> T {
    TABLE.with(f)
}

thread_local! {
    /// A variant pack this thread is making through the server: its out parameter, read once
    /// the creation succeeds.
    static CREATING: Cell<Option<*mut *mut c_void>> = const { Cell::new(None) };
    /// A known pack this thread is finalizing through the server.
    static FINALIZING: Cell<Option<u64>> = const { Cell::new(None) };
}

/// `cudnnBackendCreateDescriptor`: a variant pack from the pool (made fresh by the server
/// without waiting), or noted and left to the server; other types are left to the server.
pub fn create(descriptor_type: i32, out: *mut *mut c_void) -> Option<Result<(), CudnnStatus>> {
    let _ = CREATING.try_with(|c| c.set(None));
    if descriptor_type != dnn::VARIANT_PACK_DESCRIPTOR || out.is_null() {
        return None;
    }
    TABLE.create(out, &CREATING, Pack::default, |handle| {
        crate::runtime::call_async(&wire::PhosCudnnVariantPackReinitRequest { variantPack: handle })
    })
}

/// A creation the server made has succeeded: a variant pack it made is known.
pub fn apply_create() {
    TABLE.apply_create(&CREATING, Pack::default);
}

/// `cudnnBackendDestroyDescriptor` of a known pack: to the pool while it has room (parked on
/// the server, without waiting), else destroyed without waiting. `None` for a descriptor the
/// guest does not know as a pack (the server answers it).
pub fn destroy(desc: u64) -> Option<Result<(), CudnnStatus>> {
    TABLE.destroy(
        desc,
        |d| crate::runtime::call_async(&wire::PhosCudnnVariantPackParkRequest { variantPack: d }),
        |d| crate::runtime::call_async(&wire::CudnnBackendDestroyDescriptorRequest { descriptor: d }),
    )
}

/// `cudnnBackendSetAttribute` after its preconditions: without waiting where `desc` is a
/// known pack, not finalized, and the setting is one cuDNN documents for a pack (`None`
/// leaves it to the server, waiting).
///
/// # Safety
/// `array` must hold `count` elements of `ty` (cuDNN's contract for the caller), or be null.
pub unsafe fn set(desc: u64, name: i32, ty: i32, count: i64, array: *const c_void) -> Option<Result<(), CudnnStatus>> {
    if ty == TYPE_BACKEND_DESCRIPTOR && count > 0 && !array.is_null() {
        // SAFETY: `array` holds `count` descriptors (this function's contract), checked for
        // null; the count was bounded by the generated preconditions.
        unsafe { forget_named(array, count) };
    }
    if ty == TYPE_BACKEND_DESCRIPTOR {
        // The pack would refer to other descriptors: the server keeps it as such, so it is
        // not pooled and its calls wait.
        with(|t| t.known.remove(&desc));
        return None;
    }
    let pack = with(|t| t.known.get(&desc).copied())?;
    let rule = dnn::variant_pack_attribute(name, ty, count);
    let attribute = match rule {
        Ok(Some(a)) if !pack.finalized && !array.is_null() => a,
        _ => {
            // Waits: the server (cuDNN) answers it. What it held of the attribute is no
            // longer known to be set.
            with(|t| t.known.get_mut(&desc).map(|p| p.contents.unset(name)));
            return None;
        }
    };
    // 8 bytes an element (INT64 or VOID_PTR), `count` bounded by the preconditions.
    let len = usize::try_from(count).ok()?.checked_mul(8)?;
    // SAFETY: `array` holds `count` 8-byte elements (this function's contract), checked for
    // null; read as bytes, since the program's array need not be aligned.
    let bytes = unsafe { std::slice::from_raw_parts(array.cast::<u8>(), len) };
    let req = wire::CudnnBackendSetAttributeRequest {
        descriptor: desc,
        attributeName: name,
        attributeType: ty,
        elementCount: count,
        arrayOfElements: Ptr::In(bytes),
    };
    let r = crate::runtime::call_async(&req);
    if r.is_ok() {
        with(|t| t.known.get_mut(&desc).map(|p| p.contents.set(attribute, count)));
    }
    Some(r)
}

/// Known packs that a descriptor element array names are forgotten: the server keeps what
/// another descriptor refers to, so such a pack is not pooled and its calls wait.
///
/// # Safety
/// `array` must hold `count` 8-byte elements.
unsafe fn forget_named(array: *const c_void, count: i64) {
    let Ok(n) = usize::try_from(count) else { return };
    // SAFETY: `array` holds `count` 8-byte elements (this function's contract); as bytes,
    // since the program's array need not be aligned.
    let bytes = unsafe { std::slice::from_raw_parts(array.cast::<[u8; 8]>(), n) };
    with(|t| {
        if t.known.is_empty() {
            return;
        }
        for b in bytes {
            t.known.remove(&u64::from_ne_bytes(*b));
        }
    });
}

/// `cudnnBackendFinalize`: without waiting where `desc` is a known pack, not finalized, whose
/// required attributes are set; `None` leaves it to the server (noted, so a success marks the
/// pack finalized).
pub fn finalize(desc: u64) -> Option<Result<(), CudnnStatus>> {
    let _ = FINALIZING.try_with(|f| f.set(None));
    let pack = with(|t| t.known.get(&desc).copied())?;
    if pack.finalized || !pack.contents.finalizes() {
        let _ = FINALIZING.try_with(|f| f.set(Some(desc)));
        return None;
    }
    let r = crate::runtime::call_async(&wire::CudnnBackendFinalizeRequest { descriptor: desc });
    if r.is_ok() {
        with(|t| t.known.get_mut(&desc).map(|p| p.finalized = true));
    }
    Some(r)
}

/// A finalization the server made has succeeded.
pub fn apply_finalize() {
    if let Some(desc) = FINALIZING.try_with(Cell::take).ok().flatten() {
        with(|t| t.known.get_mut(&desc).map(|p| p.finalized = true));
    }
}

#[cfg(test)]
pub(crate) fn reset() {
    TABLE.reset();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_pack_is_forgotten_and_a_finalized_one_waits() {
        reset();
        with(|t| {
            t.known.insert(0x1125, Pack::default());
            t.known.insert(0x2125, Pack { contents: PackContents::default(), finalized: true });
        });
        // Not sent (no router here): what waits answers None before anything is sent.
        let ids = [1i64, 2];
        // SAFETY: two 8-byte elements.
        let r = unsafe { set(0x2125, dnn::PACK_UNIQUE_IDS, 3, 2, ids.as_ptr().cast()) };
        assert!(r.is_none(), "finalized: the server answers");
        // SAFETY: `ids` holds two 8-byte elements, the count given; `set` only reads them.
        let r = unsafe { set(0x1125, dnn::PACK_UNIQUE_IDS, 6, 2, ids.as_ptr().cast()) };
        assert!(r.is_none(), "a wrong type: the server answers");
        assert_eq!(finalize(0x1125), None, "nothing set: the server answers");
        let named = [0x1125u64];
        // SAFETY: one 8-byte element.
        let r = unsafe { set(0x3125, 801, TYPE_BACKEND_DESCRIPTOR, 1, named.as_ptr().cast()) };
        assert!(r.is_none());
        assert!(with(|t| !t.known.contains_key(&0x1125)), "named by a descriptor: forgotten");
        assert_eq!(destroy(0x1125), None, "a forgotten pack's destruction goes to the server");
        reset();
    }
}
