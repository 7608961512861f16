//! Virtual handles: what the guest holds instead of the backend's own objects. A handle
//! carries its kind in its top 16 bits, so a stream handle passed where an event is expected is
//! refused, and its value does not depend on the backend, so it stays the same when the
//! session is restored elsewhere.

use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use phos_protocol::handle_tag::NUMBER_MASK;
pub use phos_protocol::handle_tag::{NUMBER_BITS, tag_of};

use crate::fast_hash::FastMap;

/// Why an object could not be put in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The table holds as many objects as its limit allows.
    Full,
    /// Every number of the kind has been handed out (2^48 of them).
    Exhausted,
    /// A handle to put back is of another kind, or in use.
    BadHandle,
}

impl From<Refused> for CudaError {
    fn from(r: Refused) -> CudaError {
        match r {
            Refused::Full | Refused::Exhausted => CudaError::MemoryAllocation,
            Refused::BadHandle => CudaError::InvalidResourceHandle,
        }
    }
}

/// How a new object gets its handle: the one a restore's replay must produce again, or a
/// fresh one; and what a table at its limit answers (the session counts and logs the
/// refusal, and answers what CUDA answers when it cannot create a resource).
pub struct NewHandle<'a> {
    pub forced: Option<u64>,
    pub full: &'a dyn Fn() -> CudaError,
}

pub struct HandleTable<T> {
    tag: u64,
    next: u64,
    /// Objects held at most.
    limit: usize,
    /// By handle: values the table gave out, hashed fast (see [`crate::fast_hash`]).
    objects: FastMap<u64, T>,
}

/// Whether `handle` is one of `kind`'s: its tag, and a number a table could have handed out.
pub fn is_handle_of(kind: HandleKind, handle: u64) -> bool {
    handle & !NUMBER_MASK == tag_of(kind) && handle & NUMBER_MASK != 0
}

impl<T> HandleTable<T> {
    /// A table of `kind`'s handles holding at most `limit` objects at once.
    pub fn new(kind: HandleKind, limit: u64) -> Self {
        HandleTable {
            tag: tag_of(kind),
            next: 1,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            objects: FastMap::default(),
        }
    }

    /// Put an object back under the handle it had (restore). Refuses handles of another
    /// kind and handles in use.
    pub fn insert_at(&mut self, handle: u64, object: T) -> Result<u64, Refused> {
        if handle & !NUMBER_MASK != self.tag || handle & NUMBER_MASK == 0 || self.objects.contains_key(&handle) {
            return Err(Refused::BadHandle);
        }
        if self.objects.len() >= self.limit {
            return Err(Refused::Full);
        }
        self.next = self.next.max((handle & NUMBER_MASK) + 1);
        self.objects.insert(handle, object);
        Ok(handle)
    }

    /// The counter the next handle comes from (kept in images, so that a restored session
    /// never hands out a handle it had before).
    pub fn next_counter(&self) -> u64 {
        self.next
    }

    /// Carry on a counter from an image; only a number the kind can have (at most 2^48).
    pub fn set_next_counter(&mut self, next: u64) {
        self.next = self.next.max(next.min(NUMBER_MASK + 1));
    }

    pub fn insert(&mut self, object: T) -> Result<u64, Refused> {
        if self.objects.len() >= self.limit {
            return Err(Refused::Full);
        }
        // A number past 2^48 would run into the tag, and collide with another kind's handle.
        if self.next > NUMBER_MASK {
            return Err(Refused::Exhausted);
        }
        let h = self.tag | self.next;
        self.next += 1;
        self.objects.insert(h, object);
        Ok(h)
    }

    /// Insert an object under the handle `new` says.
    pub fn add(&mut self, object: T, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        match new.forced {
            Some(h) => self.insert_at(h, object),
            None => self.insert(object),
        }
        .map_err(|r| match r {
            Refused::Full => (new.full)(),
            other => other.into(),
        })
    }

    /// The object behind `handle`, or `cudaErrorInvalidResourceHandle`.
    pub fn get(&self, handle: u64) -> Result<&T, CudaError> {
        self.objects.get(&handle).ok_or(CudaError::InvalidResourceHandle)
    }

    pub fn get_mut(&mut self, handle: u64) -> Result<&mut T, CudaError> {
        self.objects.get_mut(&handle).ok_or(CudaError::InvalidResourceHandle)
    }

    /// Keep only the objects `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.objects.retain(|_, o| keep(o));
    }

    pub fn remove(&mut self, handle: u64) -> Result<T, CudaError> {
        self.objects.remove(&handle).ok_or(CudaError::InvalidResourceHandle)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.objects.iter().map(|(h, o)| (*h, o))
    }

    pub fn drain(&mut self) -> Vec<(u64, T)> {
        self.objects.drain().collect()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_do_not_mix() {
        let mut streams = HandleTable::new(HandleKind::Stream, 10);
        let mut events = HandleTable::new(HandleKind::Event, 10);
        let s = streams.insert("s").unwrap();
        let e = events.insert("e").unwrap();
        assert_ne!(s, e);
        assert!(s > 2, "never a special stream value");
        assert!(is_handle_of(HandleKind::Stream, s) && !is_handle_of(HandleKind::Event, s));
        assert_eq!(streams.get(s), Ok(&"s"));
        assert_eq!(streams.get(e), Err(CudaError::InvalidResourceHandle));
        assert_eq!(events.remove(e), Ok("e"));
        assert_eq!(events.get(e), Err(CudaError::InvalidResourceHandle));
        assert_eq!(streams.get(0xdead_beef), Err(CudaError::InvalidResourceHandle));
        assert_eq!(streams.insert_at(e, "x"), Err(Refused::BadHandle), "another kind's handle");
        assert_eq!(streams.insert_at(s, "x"), Err(Refused::BadHandle), "a handle in use");
        assert_eq!(streams.insert_at(tag_of(HandleKind::Stream), "x"), Err(Refused::BadHandle), "number 0");
    }

    #[test]
    fn a_full_table_refuses_until_something_goes() {
        let mut t = HandleTable::new(HandleKind::Event, 2);
        let a = t.insert(1).unwrap();
        t.insert(2).unwrap();
        assert_eq!(t.insert(3), Err(Refused::Full));
        assert_eq!(t.insert_at(tag_of(HandleKind::Event) | 77, 3), Err(Refused::Full));
        t.remove(a).unwrap();
        t.insert(3).unwrap();
    }

    /// A counter carried in from an image can never make the next handle leave its kind.
    #[test]
    fn counters_stay_within_the_kind() {
        let mut t = HandleTable::new(HandleKind::Stream, 10);
        t.set_next_counter(u64::MAX - 1);
        assert_eq!(t.insert("s"), Err(Refused::Exhausted));
        let mut t = HandleTable::new(HandleKind::Stream, 10);
        t.set_next_counter(NUMBER_MASK);
        let h = t.insert("last").unwrap();
        assert!(is_handle_of(HandleKind::Stream, h));
        assert_eq!(t.insert("s"), Err(Refused::Exhausted));
    }
}
