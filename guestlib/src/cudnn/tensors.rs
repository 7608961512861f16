//! The process's legacy tensor descriptors as the guest knows them, and its pool of them.
//!
//! PyTorch makes, sets and destroys a handful of tensor descriptors around every batch
//! normalization (and other legacy cuDNN calls): each a round trip if it waits. The guest
//! keeps every tensor descriptor made by a call the server accepted (or taken from the pool)
//! and not destroyed since, with the shape its last setter gave it. So:
//!
//! - a setter of a known descriptor is checked here with the server's own rules
//!   (`phos_protocol::dnn`, one copy): a shape cuDNN refuses is refused here with cuDNN's
//!   status and nothing sent (the server would refuse it alike, and change nothing), a good
//!   one is sent without waiting (its async id) and kept. A failure only the server or
//!   NVIDIA's library finds is kept by the server for the next synchronous cuDNN call
//!   (`deferred::ANY`). A setter of a descriptor the guest does not know waits, as before;
//! - the getters of a known descriptor (`cudnnGetTensor4dDescriptor`,
//!   `cudnnGetTensorNdDescriptor`, `cudnnGetTensorSizeInBytes`) are answered here, as the
//!   server answers them from the same shape;
//! - a destruction puts the descriptor in the pool (at most [`POOL_MAX`]; beyond, it is
//!   destroyed without waiting) and tells the server, without waiting, that it is parked
//!   (`phosCudnnTensorDescriptorPark`: refused by every call until it is made again); a
//!   creation takes one from the pool and makes the server make it fresh under the same handle
//!   (`phosCudnnTensorDescriptorReinit`, without waiting), so nothing of the earlier one
//!   survives;
//! - a compute call's proof ([`super::known`]) names a known tensor descriptor by its shape,
//!   not its handle, so a fresh descriptor with the shape of a proven one is proven too.

use std::cell::Cell;
use std::ffi::c_void;

use phos_protocol::cudnn::{self as wire, CudnnStatus};
use phos_protocol::dnn::{self, TensorShape};

use super::pool::{Pool, Table};

/// Tensor descriptors the guest keeps for reuse at most.
pub const POOL_MAX: usize = 256;

/// Live descriptors, by handle: their shape, `None` until a setter gave one.
static TABLE: Pool<Option<TensorShape>> = Pool::new(POOL_MAX);

fn with<T>(f: impl FnOnce(&mut Table<Option<TensorShape>>) -> T) -> T {
    TABLE.with(f)
}

thread_local! {
    /// A creation this thread is making through the server: its out parameter, read once it
    /// succeeds.
    static CREATING: Cell<Option<*mut *mut c_void>> = const { Cell::new(None) };
}

/// What a known descriptor holds: `None` for one the guest does not know, `Some(None)` for a
/// known one with no shape yet.
pub fn shape(desc: u64) -> Option<Option<TensorShape>> {
    with(|t| t.known.get(&desc).cloned())
}

/// `cudnnCreateTensorDescriptor`: a descriptor from the pool (made fresh by the server without
/// waiting), or `None`: the creation goes to the server, and is noted.
pub fn create(out: *mut *mut c_void) -> Option<Result<(), CudnnStatus>> {
    let _ = CREATING.try_with(|c| c.set(None));
    if out.is_null() {
        // The generated path refuses it.
        return None;
    }
    TABLE.create(
        out,
        &CREATING,
        || None,
        |handle| crate::runtime::call_async(&wire::PhosCudnnTensorDescriptorReinitRequest { tensorDesc: handle }),
    )
}

/// A creation the server made has succeeded: its descriptor is known.
pub fn apply_create() {
    TABLE.apply_create(&CREATING, || None);
}

/// `cudnnDestroyTensorDescriptor` of a known descriptor: to the pool while it has room
/// (parked on the server, without waiting), else destroyed without waiting. `None` for one
/// the guest does not know (the server answers it).
pub fn destroy(desc: u64) -> Option<Result<(), CudnnStatus>> {
    TABLE.destroy(
        desc,
        |d| crate::runtime::call_async(&wire::PhosCudnnTensorDescriptorParkRequest { tensorDesc: d }),
        |d| crate::runtime::call_async(&wire::CudnnDestroyTensorDescriptorRequest { tensorDesc: d }),
    )
}

/// A setter of `desc` with what it sets (`shape`: the shape, or cuDNN's status for it) and
/// how to send it without waiting: `None` where the guest does not know the descriptor (the
/// setter waits, as before).
pub fn set(
    name: &str,
    desc: u64,
    shape: Result<TensorShape, (CudnnStatus, String)>,
    send: impl FnOnce() -> Result<(), CudnnStatus>,
) -> Option<Result<(), CudnnStatus>> {
    shape_known(desc)?;
    let shape = match shape {
        Ok(s) => s,
        // Refused as the server refuses it (and logged, as it logs it): nothing changes.
        Err((status, why)) => return Some(Err(refuse(name, desc, status, &why))),
    };
    super::known::invalidate(desc);
    super::known::set_type(desc, shape.data_type);
    let r = send();
    if r.is_ok() {
        with(|t| {
            if let Some(s) = t.known.get_mut(&desc) {
                *s = Some(shape);
            }
        });
    }
    Some(r)
}

/// A refusal of the guest's, logged as the server logs its own.
pub fn refuse(name: &str, desc: u64, status: CudnnStatus, why: &str) -> CudnnStatus {
    crate::log::init();
    tracing::warn!("{name}: {why} ({desc:#x}): {}", status.name());
    status
}

/// A known descriptor's shape, or the refusal of one never given a shape (as the server
/// refuses it); `None` for a descriptor the guest does not know.
pub fn shape_or_refuse(name: &str, what: &str, desc: u64) -> Option<Result<TensorShape, CudnnStatus>> {
    Some(
        shape(desc)?
            .ok_or_else(|| refuse(name, desc, CudnnStatus::BAD_PARAM, &format!("{what} was never given a shape"))),
    )
}

fn shape_known(desc: u64) -> Option<()> {
    with(|t| t.known.contains_key(&desc)).then_some(())
}

/// What a proof key holds for `desc`: a known tensor descriptor with a shape is its shape
/// (a tag, the number of dimensions, the type, the dimensions, the strides), so descriptors
/// of the same contents count as the same; `None` for any other (named by its handle).
pub fn content_key(desc: u64) -> Option<Vec<u64>> {
    let shape = with(|t| t.known.get(&desc).cloned())??;
    let mut key = Vec::with_capacity(2 + 2 * shape.dims.len());
    // No handle has these bits (a handle's tag is in its low byte, its counter above).
    key.push(CONTENT_TAG | shape.dims.len() as u64);
    key.push(u64::from(shape.data_type as u32));
    key.extend(shape.dims.iter().chain(&shape.strides).map(|&v| u64::from(v as u32)));
    Some(key)
}

/// The answers of cuDNN's size queries (the batch normalization's workspace and reserve)
/// this process got, by question: the function, the handle, the modes and each tensor
/// descriptor's contents. cuDNN's answer depends on nothing else than the device and library
/// of the handle, so a question asked again on the same live handle has the same answer.
/// Only questions whose tensor descriptors are all known by their contents (or NULL) and that
/// name no activation descriptor are kept; bounded, emptied when full.
pub mod sizes {
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError};

    use phos_protocol::apis::Api;
    use phos_protocol::cudnn::CudnnStatus;

    const MAX_KEPT: usize = 1024;

    static KEPT: Mutex<Option<HashMap<Vec<u64>, usize>>> = Mutex::new(None);

    thread_local! {
        /// A question this thread is asking the server: kept once answered.
        static ASKING: Cell<Option<(Vec<u64>, *mut usize)>> = const { Cell::new(None) };
    }

    /// A size query: answered here when the same question was answered before; else noted,
    /// to keep the server's answer (`keep`). `None` leaves it to the server.
    pub fn ask(
        function: u64,
        handle: u64,
        modes: [i32; 2],
        tensors: &[u64],
        activation: u64,
        out: *mut usize,
    ) -> Option<Result<(), CudnnStatus>> {
        let _ = ASKING.try_with(|a| a.set(None));
        if out.is_null() || activation != 0 || !crate::runtime::is_live(Api::Cudnn, handle) {
            return None;
        }
        let mut key = vec![function, handle, u64::from(modes[0] as u32), u64::from(modes[1] as u32)];
        for &t in tensors {
            if t == 0 {
                key.push(0);
            } else {
                key.extend(super::content_key(t)?);
            }
        }
        let kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|k| k.get(&key).copied());
        if let Some(size) = kept {
            // SAFETY: the caller's out parameter (cuDNN's contract), checked for null.
            unsafe { out.write_unaligned(size) };
            return Some(Ok(()));
        }
        let _ = ASKING.try_with(|a| a.set(Some((key, out))));
        None
    }

    /// The server answered the question this thread asked: kept.
    pub fn keep() {
        let Some((key, out)) = ASKING.try_with(Cell::take).ok().flatten() else { return };
        // SAFETY: the out parameter the generated stub has just written the answer to
        // (checked for null before the call was sent).
        let size = unsafe { out.read_unaligned() };
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = kept.get_or_insert_default();
        if kept.len() >= MAX_KEPT {
            kept.clear();
        }
        kept.insert(key, size);
    }
}

/// Marks a key's descriptor given by contents.
const CONTENT_TAG: u64 = 0xc0de_0000_0000_0000;

/// The shape `cudnnDeriveBNTensorDescriptor` gives, from `x`'s known shape: `None` where the
/// guest does not know both descriptors (the call waits, as before).
pub fn derived(derived: u64, x: u64, mode: i32) -> Option<Result<TensorShape, (CudnnStatus, String)>> {
    shape_known(derived)?;
    let Some(x) = shape(x)? else {
        // The server refuses a descriptor never given a shape.
        return Some(Err((CudnnStatus::BAD_PARAM, "xDesc was never given a shape".to_string())));
    };
    Some(dnn::bn_param_shape(&x, mode).and_then(|p| dnn::checked_shape(p.data_type, &p.dims, &p.strides)))
}

/// Write `values` to `out`, `room` ints, zero beyond the values (as the server's reply).
///
/// # Safety
/// `out` must be null or hold `room` ints.
pub unsafe fn write_ints(out: *mut i32, values: &[i32], room: usize) {
    if out.is_null() {
        return;
    }
    // SAFETY: `out` holds `room` ints (this function's contract), checked for null; as bytes,
    // since the program's ints need not be aligned.
    let bytes = unsafe { std::slice::from_raw_parts_mut(out.cast::<[u8; 4]>(), room) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = values.get(i).copied().unwrap_or(0).to_ne_bytes();
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
    fn contents_name_a_known_shape() {
        reset();
        with(|t| {
            t.known.insert(0x1126, None);
            t.known.insert(0x2126, None);
        });
        assert_eq!(content_key(0x1126), None, "no shape yet");
        let shape = dnn::checked_format_shape(0, 0, &[2, 3, 4, 5]).unwrap();
        for h in [0x1126, 0x2126] {
            let r = set("t", h, Ok(shape.clone()), || Ok(()));
            assert_eq!(r, Some(Ok(())));
        }
        assert_eq!(content_key(0x1126), content_key(0x2126), "same contents, same key");
        assert!(content_key(0x1126).unwrap()[0] & CONTENT_TAG == CONTENT_TAG);
        let other = dnn::checked_format_shape(1, 0, &[2, 3, 4, 5]).unwrap();
        set("t", 0x2126, Ok(other), || Ok(()));
        assert_ne!(content_key(0x1126), content_key(0x2126), "NHWC strides differ");
        // A refused shape changes nothing and sends nothing.
        let refused = set("t", 0x1126, Err((CudnnStatus::BAD_PARAM, "why".into())), || panic!("sent"));
        assert_eq!(refused, Some(Err(CudnnStatus::BAD_PARAM)));
        assert_eq!(shape_known(0x3126), None);
        assert_eq!(set("t", 0x3126, Ok(shape), || panic!("sent")), None, "unknown: the server answers");
        // Derived parameters: 1xCx1x1 float for spatial.
        let d = derived(0x2126, 0x1126, 1).unwrap().unwrap();
        assert_eq!((d.data_type, d.dims), (0, vec![1, 3, 1, 1]));
        assert_eq!(derived(0x2126, 0x1126, 9).unwrap().unwrap_err().0, CudnnStatus::BAD_PARAM);
        with(|t| t.known.insert(0x4126, None));
        assert_eq!(derived(0x2126, 0x4126, 1).unwrap().unwrap_err().0, CudnnStatus::BAD_PARAM, "x has no shape");
        reset();
    }
}
