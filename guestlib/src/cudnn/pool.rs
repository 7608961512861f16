//! What the guest's pools of cuDNN objects share: a table of the live objects the guest knows
//! (by handle, with what it keeps of each) and of the ones the program destroyed that the
//! server keeps parked, with the three moves every pool makes.
//!
//! - a creation takes a parked handle and has the server make it fresh under that handle,
//!   without waiting (with an empty pool the creation waits, and [`Pool::apply_create`]
//!   notes the handle the server made);
//! - a destruction parks the handle on the server, without waiting, while the pool has room,
//!   and destroys it without waiting beyond;
//! - a handle the guest does not know is left to the server.
//!
//! (A std lock: the guest library does not take parking_lot; every update is one step, so a
//! poisoned lock still holds a consistent table.)

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};
use std::thread::LocalKey;

use phos_protocol::cudnn::CudnnStatus;

/// The live objects the guest knows and the parked ones.
pub(super) struct Table<T> {
    /// Live objects, by handle, with what the guest keeps of each.
    pub known: HashMap<u64, T>,
    /// Objects the program destroyed that the server keeps, parked.
    pub pool: Vec<u64>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table { known: HashMap::new(), pool: Vec::new() }
    }
}

/// A creation this thread is making through the server: its out parameter, read once it
/// succeeds (one per pool, as each pool's creations are told apart by their function).
pub(super) type Creating = LocalKey<Cell<Option<*mut *mut c_void>>>;

/// One pool: at most `most` parked objects.
pub(super) struct Pool<T> {
    table: Mutex<Option<Table<T>>>,
    most: usize,
}

impl<T> Pool<T> {
    pub const fn new(most: usize) -> Self {
        Pool { table: Mutex::new(None), most }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Table<T>) -> R) -> R {
        f(self.table.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_default())
    }

    /// Forget every object (tests).
    #[cfg(test)]
    pub fn reset(&self) {
        *self.table.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// A creation into `out`: from the pool, `reinit` sent for the handle taken (without
    /// waiting) and the handle known as `fresh()`; `None` where the pool is empty (the
    /// creation goes to the server, and `creating` keeps `out` for [`Self::apply_create`]).
    pub fn create(
        &self,
        out: *mut *mut c_void,
        creating: &'static Creating,
        fresh: impl FnOnce() -> T,
        reinit: impl FnOnce(u64) -> Result<(), CudnnStatus>,
    ) -> Option<Result<(), CudnnStatus>> {
        let Some(handle) = self.with(|t| t.pool.pop()) else {
            let _ = creating.try_with(|c| c.set(Some(out)));
            return None;
        };
        Some(reinit(handle).map(|()| {
            self.with(|t| t.known.insert(handle, fresh()));
            // SAFETY: `out` is the caller's out parameter (cuDNN's contract), checked for
            // null by the caller before it came here.
            unsafe { out.write(handle as *mut c_void) };
        }))
    }

    /// A creation the server made has succeeded: the handle written to the out parameter
    /// `creating` kept is known as `fresh()`.
    pub fn apply_create(&self, creating: &'static Creating, fresh: impl FnOnce() -> T) {
        if let Some(out) = creating.try_with(Cell::take).ok().flatten() {
            // SAFETY: the out parameter the generated stub has just written the new handle to
            // (checked for null before the call was sent).
            let handle = unsafe { out.read() } as u64;
            self.with(|t| t.known.insert(handle, fresh()));
        }
    }

    /// A destruction of `desc`: parked (`park`, without waiting) while the pool has room,
    /// else `destroy`ed (without waiting). `None` for a handle the guest does not know.
    pub fn destroy(
        &self,
        desc: u64,
        park: impl FnOnce(u64) -> Result<(), CudnnStatus>,
        destroy: impl FnOnce(u64) -> Result<(), CudnnStatus>,
    ) -> Option<Result<(), CudnnStatus>> {
        let room = self.with(|t| {
            // Gone for the program's other threads from now on.
            t.known.remove(&desc).map(|_| t.pool.len() < self.most)
        })?;
        if !room {
            return Some(destroy(desc));
        }
        Some(park(desc).map(|()| self.with(|t| t.pool.push(desc))))
    }
}
