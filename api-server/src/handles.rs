//! Virtual handles: what the guest holds instead of the backend's own objects. A handle
//! carries its kind in its top 16 bits, so a stream handle passed where an event is expected is
//! refused, and its value does not depend on the backend, so it stays the same when the
//! session is restored elsewhere.

use std::collections::HashMap;

use phos_protocol::CudaError;
use phos_protocol::cudart::HandleKind;

/// Marks the high bits of every handle (`0x7e00 | kind`), far from the special stream values
/// 0, 1 and 2 and from the session's device addresses.
const TAG_BASE: u64 = 0x7e00;

pub struct HandleTable<T> {
    tag: u64,
    next: u64,
    objects: HashMap<u64, T>,
}

impl<T> HandleTable<T> {
    pub fn new(kind: HandleKind) -> Self {
        let index = HandleKind::ALL.iter().position(|k| *k == kind).expect("known kind") as u64;
        HandleTable { tag: (TAG_BASE | index) << 48, next: 1, objects: HashMap::new() }
    }

    /// Put an object back under the handle it had (restore). Refuses handles of another
    /// kind and handles in use.
    pub fn insert_at(&mut self, handle: u64, object: T) -> Result<u64, CudaError> {
        if handle & !((1 << 48) - 1) != self.tag || self.objects.contains_key(&handle) {
            return Err(CudaError::InvalidResourceHandle);
        }
        self.next = self.next.max((handle & ((1 << 48) - 1)) + 1);
        self.objects.insert(handle, object);
        Ok(handle)
    }

    /// The counter the next handle comes from (kept in images, so that a restored session
    /// never hands out a handle it had before).
    pub fn next_counter(&self) -> u64 {
        self.next
    }

    pub fn set_next_counter(&mut self, next: u64) {
        self.next = self.next.max(next);
    }

    pub fn insert(&mut self, object: T) -> u64 {
        let h = self.tag | self.next;
        self.next += 1;
        self.objects.insert(h, object);
        h
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
        let mut streams = HandleTable::new(HandleKind::Stream);
        let mut events = HandleTable::new(HandleKind::Event);
        let s = streams.insert("s");
        let e = events.insert("e");
        assert_ne!(s, e);
        assert!(s > 2, "never a special stream value");
        assert_eq!(streams.get(s), Ok(&"s"));
        assert_eq!(streams.get(e), Err(CudaError::InvalidResourceHandle));
        assert_eq!(events.remove(e), Ok("e"));
        assert_eq!(events.get(e), Err(CudaError::InvalidResourceHandle));
        assert_eq!(streams.get(0xdead_beef), Err(CudaError::InvalidResourceHandle));
    }
}
