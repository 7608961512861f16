//! What the guest knows the server will accept, so that a call whose errors CUDA returns from
//! the call itself can go without waiting for its answer (`runtime::call_async`): memsets
//! (`memsets.rs`) and copies (`copies.rs`).
//!
//! CUDA returns a memset's or a copy's argument errors from the call: a pointer range outside
//! device memory, an unknown stream. The server checks both; the guest cannot. A device range
//! is proven by a call that succeeded on it on the same device: an allocation's own result
//! (`cudaMalloc`: the whole allocation), a memset of it, a copy into or out of it. A stream is
//! proven by a memset or a copy that succeeded on it on the same device. Whatever may end
//! memory or a stream (a free, a stream's destruction, an unmap, a device reset, a module's
//! unloading, a graph launch, which may run free nodes) forgets every proof before it is sent,
//! and a call that was in flight meanwhile proves nothing. While a stream capture may be open,
//! or after a sticky error, nothing goes without waiting ([`quiet`]): a capture can refuse a
//! call (an implicit dependence on the legacy stream), a sticky error fails it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::runtime;

/// Proven ranges and streams are kept up to this many per device; past it they start again.
const MOST_KEPT: usize = 4096;

#[derive(Default)]
struct Proven {
    /// Per device: start -> end (exclusive) of proven ranges.
    ranges: HashMap<i32, BTreeMap<u64, u64>>,
    /// (device, stream) proven.
    streams: HashSet<(i32, u64)>,
}

impl Proven {
    fn covers(&self, device: i32, ranges: &[(u64, u64)], stream: Option<u64>) -> bool {
        stream.is_none_or(|s| self.streams.contains(&(device, s)))
            && ranges.iter().all(|&(start, end)| self.range_covers(device, start, end))
    }

    /// Whether the proven range starting last at or before `start` reaches `end`. (A range
    /// inside one already proven is not kept, so it cannot hide the wider one.)
    fn range_covers(&self, device: i32, start: u64, end: u64) -> bool {
        self.ranges.get(&device).and_then(|r| r.range(..=start).next_back()).is_some_and(|(_, &e)| e >= end)
    }

    fn note(&mut self, device: i32, ranges: &[(u64, u64)], stream: Option<u64>) {
        if let Some(stream) = stream {
            if self.streams.len() >= MOST_KEPT {
                self.streams.clear();
            }
            self.streams.insert((device, stream));
        }
        for &(start, end) in ranges {
            if start >= end || self.range_covers(device, start, end) {
                continue;
            }
            let r = self.ranges.entry(device).or_default();
            if r.len() >= MOST_KEPT {
                r.clear();
            }
            let e = r.entry(start).or_insert(end);
            *e = (*e).max(end);
        }
    }
}

static PROVEN: Mutex<Option<Proven>> = Mutex::new(None);
/// Bumped by every forgetting, so that a call in flight meanwhile proves nothing.
static FORGOTTEN: AtomicU64 = AtomicU64::new(0);

fn proven() -> MutexGuard<'static, Option<Proven>> {
    PROVEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `[ptr, ptr + count)`, or `None` where it overflows (the server's to refuse).
pub fn range(ptr: u64, count: u64) -> Option<(u64, u64)> {
    ptr.checked_add(count).map(|end| (ptr, end))
}

/// Memory or a stream may end: nothing goes without waiting until proven again.
pub fn forget() {
    let mut p = proven();
    FORGOTTEN.fetch_add(1, Ordering::SeqCst);
    *p = None;
}

/// No stream capture may be open and no sticky error is known: what a proven call needs too.
pub fn quiet() -> bool {
    super::capture::none_open() && !runtime::sticky_error_seen()
}

/// Whether every range lies inside a range proven on `device` and `stream` (if any) was proven
/// on it.
pub fn covers(device: i32, ranges: &[(u64, u64)], stream: Option<u64>) -> bool {
    proven().as_ref().is_some_and(|p| p.covers(device, ranges, stream))
}

/// Taken before a call is sent; the call's success proves what it names only if nothing was
/// forgotten meanwhile ([`note`]).
#[derive(Clone, Copy)]
pub struct Epoch(u64);

pub fn epoch() -> Epoch {
    Epoch(FORGOTTEN.load(Ordering::SeqCst))
}

/// A call sent at `epoch` succeeded on `ranges` (and `stream`) of `device`.
pub fn note(epoch: Epoch, device: i32, ranges: &[(u64, u64)], stream: Option<u64>) {
    let mut p = proven();
    if FORGOTTEN.load(Ordering::SeqCst) == epoch.0 {
        p.get_or_insert_default().note(device, ranges, stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proven_range_covers_its_subranges_on_proven_streams_of_its_device() {
        let mut p = Proven::default();
        p.note(0, &[(0x1000, 0x2000)], Some(7));
        assert!(p.covers(0, &[(0x1000, 0x2000)], Some(7)));
        assert!(p.covers(0, &[(0x1800, 0x1900)], Some(7)));
        assert!(!p.covers(0, &[(0x1800, 0x2001)], Some(7)), "past its end");
        assert!(!p.covers(0, &[(0x0fff, 0x1800)], Some(7)), "before its start");
        assert!(!p.covers(0, &[(0x1800, 0x1900)], Some(8)), "another stream");
        assert!(!p.covers(1, &[(0x1800, 0x1900)], Some(7)), "another device");
        p.note(0, &[(0x4000, 0x5000)], Some(8));
        assert!(p.covers(0, &[(0x1800, 0x1900)], Some(8)), "ranges and streams are proven apart");
        assert!(!p.covers(0, &[(0x1800, 0x4800)], Some(8)), "two ranges do not join");
        // A range inside a proven one, proven again on another stream, hides nothing.
        p.note(0, &[(0x1100, 0x1200)], Some(9));
        assert!(p.covers(0, &[(0x1300, 0x1f00)], Some(9)));
    }

    #[test]
    fn a_copy_needs_both_its_ranges_and_an_allocation_proves_no_stream() {
        let mut p = Proven::default();
        // An allocation: its range, no stream.
        p.note(0, &[(0x1000, 0x2000)], None);
        assert!(p.covers(0, &[(0x1000, 0x2000)], None));
        assert!(!p.covers(0, &[(0x1000, 0x2000)], Some(0)), "no stream proven yet");
        p.note(0, &[(0x8000, 0x9000), (0x1000, 0x1100)], Some(3));
        assert!(p.covers(0, &[(0x1000, 0x1800), (0x8100, 0x8200)], Some(3)));
        assert!(!p.covers(0, &[(0x1000, 0x1800), (0x9100, 0x9200)], Some(3)), "the second range is not proven");
        // An empty range proves nothing.
        p.note(0, &[(0x20000, 0x20000)], None);
        assert!(!p.covers(0, &[(0x20000, 0x20001)], None));
    }
}
