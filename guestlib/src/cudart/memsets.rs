//! `cudaMemsetAsync` without waiting (and so `cudaMemsetAsync_ptsz` and the driver's
//! `cuMemsetD8/D16/D32Async`, which end here).
//!
//! CUDA returns a memset's argument errors from the call itself: a pointer range outside
//! device memory, an unknown stream. The server checks both; the guest cannot. So a memset
//! waits for its answer until it is proven: its device range lies inside the range of a
//! memset that succeeded on the same device, and its stream took a memset that succeeded on
//! the same device. A proven memset is sent without waiting (`runtime::call_async`) and can
//! fail only where the server finds what the guest could not know (it becomes the thread's
//! last error, as for a launch). Whatever may end memory or a stream (a free, a stream's
//! destruction, an unmap, a device reset, a graph launch, which may run free nodes) forgets
//! every proof before it is sent, and a memset that was in flight meanwhile proves nothing.
//! While a stream capture may be open, or after a sticky error, every memset waits: a capture
//! can refuse it (an implicit dependence on the legacy stream), a sticky error fails it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use phos_protocol::CudaError;
use phos_protocol::cudart::CudaMemsetAsyncRequest;

use crate::runtime;

/// Proven ranges and streams are kept up to this many per device; past it they start again.
const MOST_KEPT: usize = 4096;

#[derive(Default)]
struct Proven {
    /// Per device: start -> end (exclusive) of ranges a memset succeeded on.
    ranges: HashMap<i32, BTreeMap<u64, u64>>,
    /// (device, stream) a memset succeeded on.
    streams: HashSet<(i32, u64)>,
}

impl Proven {
    fn covers(&self, device: i32, start: u64, end: u64, stream: u64) -> bool {
        self.streams.contains(&(device, stream)) && self.range_covers(device, start, end)
    }

    /// Whether the proven range starting last at or before `start` reaches `end`. (A range
    /// inside one already proven is not kept, so it cannot hide the wider one.)
    fn range_covers(&self, device: i32, start: u64, end: u64) -> bool {
        self.ranges.get(&device).and_then(|r| r.range(..=start).next_back()).is_some_and(|(_, &e)| e >= end)
    }

    fn note(&mut self, device: i32, start: u64, end: u64, stream: u64) {
        if self.streams.len() >= MOST_KEPT {
            self.streams.clear();
        }
        self.streams.insert((device, stream));
        if self.range_covers(device, start, end) {
            return;
        }
        let r = self.ranges.entry(device).or_default();
        if r.len() >= MOST_KEPT {
            r.clear();
        }
        let e = r.entry(start).or_insert(end);
        *e = (*e).max(end);
    }
}

static PROVEN: Mutex<Option<Proven>> = Mutex::new(None);
/// Bumped by every forgetting, so that a memset in flight meanwhile proves nothing.
static FORGOTTEN: AtomicU64 = AtomicU64::new(0);

fn proven() -> MutexGuard<'static, Option<Proven>> {
    PROVEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Memory or a stream may end: no memset goes without waiting until proven again.
pub fn forget() {
    let mut p = proven();
    FORGOTTEN.fetch_add(1, Ordering::SeqCst);
    *p = None;
}

/// `cudaMemsetAsync`: sent without waiting when proven (see the module), else sent
/// synchronously, whose success proves its range and stream.
pub fn memset_async(dev_ptr: *mut c_void, value: i32, count: usize, stream: *mut c_void) -> Result<(), CudaError> {
    let req = CudaMemsetAsyncRequest {
        devPtr: dev_ptr as usize as u64,
        value,
        count: count as u64,
        stream: stream as usize as u64,
    };
    let device = runtime::current_device();
    // An overflowing range is the server's to refuse.
    let end = req.devPtr.checked_add(req.count);
    let quiet = super::capture::none_open() && !runtime::sticky_error_seen();
    if let Some(end) = end
        && quiet
        && proven().as_ref().is_some_and(|p| p.covers(device, req.devPtr, end, req.stream))
    {
        return runtime::call_async(&req);
    }
    let epoch = FORGOTTEN.load(Ordering::SeqCst);
    runtime::call(&req)?;
    if let Some(end) = end
        && req.count > 0
    {
        let mut p = proven();
        if FORGOTTEN.load(Ordering::SeqCst) == epoch {
            p.get_or_insert_default().note(device, req.devPtr, end, req.stream);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proven_range_covers_its_subranges_on_proven_streams_of_its_device() {
        let mut p = Proven::default();
        p.note(0, 0x1000, 0x2000, 7);
        assert!(p.covers(0, 0x1000, 0x2000, 7));
        assert!(p.covers(0, 0x1800, 0x1900, 7));
        assert!(!p.covers(0, 0x1800, 0x2001, 7), "past its end");
        assert!(!p.covers(0, 0x0fff, 0x1800, 7), "before its start");
        assert!(!p.covers(0, 0x1800, 0x1900, 8), "another stream");
        assert!(!p.covers(1, 0x1800, 0x1900, 7), "another device");
        p.note(0, 0x4000, 0x5000, 8);
        assert!(p.covers(0, 0x1800, 0x1900, 8), "ranges and streams are proven apart");
        assert!(!p.covers(0, 0x1800, 0x4800, 8), "two ranges do not join");
        // A range inside a proven one, proven again on another stream, hides nothing.
        p.note(0, 0x1100, 0x1200, 9);
        assert!(p.covers(0, 0x1300, 0x1f00, 9));
    }
}
