//! What the guest knows of the process's cuDNN objects, so that compute calls go without
//! waiting (their `@async_id`) only where the server and cuDNN would accept what they name:
//!
//! - proven calls: a compute call goes without waiting once the same function with the same
//!   descriptors and the same modes, algorithms and sizes (its key) has succeeded
//!   synchronously, and none of those descriptors was set or destroyed since (their setters
//!   and destroys forget every key naming them, before they are sent). So what cuDNN checks
//!   of the shapes, types and modes comes back from the call itself, as on cuDNN, the first
//!   time a combination is used; what only the server or the library finds after (memory
//!   outside the session's, a failure of NVIDIA's library) fails the call after it returned,
//!   kept for the next synchronous call on the handle (`FLAG_DEFERRED`);
//! - a backend execution's variant pack: finalized by a call that succeeded, not set or
//!   destroyed since (a pack is made for each execution; its plan is the proven part);
//! - each tensor descriptor's data type, as its setter gave it (cudnnSetTensor's value is one
//!   element of it), and the stream each handle was last set to (a cudnnSetStream that sets
//!   it again is answered here).

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use phos_protocol::apis::Api;

/// A compute call's key: its function's wire id, then its values (modes, algorithms, sizes
/// and descriptors).
pub type Key = Vec<u64>;

#[derive(Default)]
struct Table {
    proven: HashSet<Key>,
    /// The proven keys naming each descriptor.
    naming: HashMap<u64, Vec<Key>>,
    /// Variant packs finalized, not set or destroyed since.
    finalized: HashSet<u64>,
    /// Tensor descriptors' data types (cudnnDataType_t).
    types: HashMap<u64, i32>,
    /// Handles' streams, as this process last set them.
    streams: HashMap<u64, u64>,
}

/// (A std lock: the guest library does not take parking_lot; every update is one step, so a
/// poisoned lock still holds a consistent table.)
static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<Table>> {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    f(table().get_or_insert_default())
}

/// Whether `key` was proven and each of `packs` is finalized.
pub fn proven(key: &Key, packs: &[u64]) -> bool {
    with(|t| t.proven.contains(key) && packs.iter().all(|p| t.finalized.contains(p)))
}

/// A synchronous call of `key` naming `descriptors` succeeded.
pub fn note_proven(key: Key, descriptors: &[u64]) {
    with(|t| {
        for &d in descriptors.iter().filter(|&&d| d != 0) {
            t.naming.entry(d).or_default().push(key.clone());
        }
        t.proven.insert(key);
    });
}

/// A descriptor is being set or destroyed: no key naming it is proven any more.
pub fn invalidate(desc: u64) {
    with(|t| {
        for key in t.naming.remove(&desc).unwrap_or_default() {
            t.proven.remove(&key);
        }
        t.finalized.remove(&desc);
    });
}

/// A descriptor is being destroyed.
pub fn forget(desc: u64) {
    invalidate(desc);
    with(|t| t.types.remove(&desc));
}

thread_local! {
    /// The backend descriptor this thread is finalizing.
    static FINALIZING: Cell<Option<u64>> = const { Cell::new(None) };
}

pub fn note_finalize(desc: u64) {
    invalidate(desc);
    let _ = FINALIZING.try_with(|f| f.set(Some(desc)));
}

pub fn apply_finalize() {
    if let Some(desc) = FINALIZING.try_with(Cell::take).ok().flatten() {
        with(|t| t.finalized.insert(desc));
    }
}

/// A handle is being destroyed: its calls wait again, and its stream is forgotten.
pub fn forget_handle(h: u64) {
    crate::runtime::forget_handle(Api::Cudnn, h);
    with(|t| t.streams.remove(&h));
}

/// Whether `handle` (live) has `stream` already, as this process set it.
pub fn stream_is(handle: u64, stream: u64) -> bool {
    crate::runtime::is_live(Api::Cudnn, handle) && with(|t| t.streams.get(&handle) == Some(&stream))
}

pub fn note_stream(handle: u64, stream: u64) {
    with(|t| t.streams.insert(handle, stream));
}

/// A tensor setter sent without waiting sets `desc`'s type (checked by the guest).
pub fn set_type(desc: u64, data_type: i32) {
    with(|t| t.types.insert(desc, data_type));
}

/// cudnnDataType_t: float, double, half, bfloat16.
const DATA_FLOAT: i32 = 0;
const DATA_DOUBLE: i32 = 1;
const DATA_HALF: i32 = 2;
const DATA_BFLOAT16: i32 = 9;

/// The bytes of cudnnSetTensor's value for `desc`: a double for a double tensor, a float
/// for every other (libcudnn 9 reads a float for half and bfloat16 tensors too: measured on
/// an H200, half bits given to a half tensor set it to zero); 4 where the type is not known
/// here (the server checks it).
pub fn value_bytes(desc: u64) -> i64 {
    match with(|t| t.types.get(&desc).copied()) {
        Some(DATA_DOUBLE) => 8,
        _ => 4,
    }
}

/// What a tensor setter is about to give its descriptor.
#[derive(Clone, Copy)]
enum TensorNote {
    Type(u64, i32),
    /// cudnnDeriveBNTensorDescriptor: the derived descriptor and the one it derives from.
    Derived(u64, u64),
}

thread_local! {
    /// The note of the tensor setter this thread is making (one at a time per thread).
    static PENDING: Cell<Option<TensorNote>> = const { Cell::new(None) };
}

/// Before a tensor setter is sent: what it sets, applied once it succeeds.
pub fn note_tensor_type(desc: u64, data_type: i32) {
    invalidate(desc);
    let _ = PENDING.try_with(|p| p.set(Some(TensorNote::Type(desc, data_type))));
}

pub fn note_derived(derived: u64, from: u64) {
    invalidate(derived);
    let _ = PENDING.try_with(|p| p.set(Some(TensorNote::Derived(derived, from))));
}

/// The setter succeeded: its descriptor is of the type it was given.
pub fn apply_tensor_note() {
    let Some(note) = PENDING.try_with(Cell::take).ok().flatten() else { return };
    with(|t| match note {
        TensorNote::Type(desc, data_type) => {
            t.types.insert(desc, data_type);
        }
        TensorNote::Derived(derived, from) => {
            // cuDNN derives float parameters for half, bfloat16 and float data, double for
            // double.
            match t.types.get(&from).copied() {
                Some(DATA_DOUBLE) => t.types.insert(derived, DATA_DOUBLE),
                Some(DATA_FLOAT | DATA_HALF | DATA_BFLOAT16) => t.types.insert(derived, DATA_FLOAT),
                _ => t.types.remove(&derived),
            };
        }
    });
}
