//! Ordering across a session's channels.
//!
//! Each guest thread has its own channel, served by its own thread here, so calls from two
//! guest threads run in whatever order their channel threads reach them. For synchronous
//! calls that is CUDA's order too: a call returned before the other thread's began. Async
//! calls return to the guest before they run, so a guest thread that synchronises after
//! another thread enqueued work first sends a barrier naming the other threads' last
//! unanswered async calls (call ids are unique in the guest process), and its channel waits
//! here until those have run.
//!
//! The same record answers a guest that sends async calls again after its channels were cut
//! (see [`phos_checkpoint::AsyncCallsRun`]): an image carries it, and a restored session
//! acknowledges a resent call that ran before the image without running it twice.

use parking_lot::{Condvar, Mutex};
use phos_checkpoint::AsyncCallsRun;
use std::time::{Duration, Instant};

/// Call ids kept, counting back from the newest that ran; older ones count as run. A guest
/// has at most a few thousand async calls unanswered, far fewer than this.
const REMEMBERED: u64 = 1 << 17;

/// How long a barrier waits for a call that never arrives (a guest bug or a hostile guest;
/// it only ever holds up the guest's own channel).
const BARRIER_TIMEOUT: Duration = Duration::from_secs(30);

/// The async calls of a session that have run.
#[derive(Default)]
pub struct AsyncLedger {
    state: Mutex<Ledger>,
    changed: Condvar,
}

/// An image's [`AsyncCallsRun`] that does not fit the ledger.
#[derive(Debug, thiserror::Error)]
#[error("its record of async calls run has {words} words, over the {max} the window holds")]
pub struct TooManyCalls {
    words: usize,
    max: usize,
}

/// A bitmap of the ids in `[base, base + REMEMBERED)` that ran (a launch storm marks one
/// per launch: a bit, where a tree of ids cost a few cache misses each).
struct Ledger {
    /// Every id below this counts as run (forgotten to bound the map).
    base: u64,
    bits: Vec<u64>,
    waiters: usize,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger { base: 0, bits: vec![0; (REMEMBERED / 64) as usize], waiters: 0 }
    }
}

impl Ledger {
    fn slot(id: u64) -> (usize, u64) {
        let i = id % REMEMBERED;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn has_run(&self, id: u64) -> bool {
        if id < self.base {
            return true;
        }
        if id >= self.base + REMEMBERED {
            return false;
        }
        let (w, bit) = Self::slot(id);
        self.bits[w] & bit != 0
    }

    fn mark(&mut self, id: u64) {
        if id < self.base {
            return;
        }
        let end = self.base + REMEMBERED;
        if id >= end {
            // Slide the window so `id` is its newest; what falls out counts as run.
            // (A guest's ids are its own: one near u64::MAX only forgets its own calls.)
            let new_base = id.saturating_add(1) - REMEMBERED;
            if new_base - self.base >= REMEMBERED {
                self.bits.fill(0);
            } else {
                for old in self.base..new_base {
                    let (w, bit) = Self::slot(old);
                    self.bits[w] &= !bit;
                }
            }
            self.base = new_base;
        }
        let (w, bit) = Self::slot(id);
        self.bits[w] |= bit;
    }
}

impl AsyncLedger {
    /// Whether the async call `call_id` has run (ids older than the window count as run).
    pub fn has_run(&self, call_id: u64) -> bool {
        self.state.lock().has_run(call_id)
    }

    /// What an image keeps of the ledger.
    pub fn snapshot(&self) -> AsyncCallsRun {
        let s = self.state.lock();
        let mut ran = vec![0u64; s.bits.len()];
        for k in 0..REMEMBERED {
            if s.has_run(s.base + k) {
                ran[(k / 64) as usize] |= 1 << (k % 64);
            }
        }
        while ran.last() == Some(&0) {
            ran.pop();
        }
        AsyncCallsRun { below: s.base, ran }
    }

    /// Take an image's record as this (fresh) ledger's.
    pub fn load(&self, image: &AsyncCallsRun) -> Result<(), TooManyCalls> {
        let max = (REMEMBERED / 64) as usize;
        if image.ran.len() > max {
            return Err(TooManyCalls { words: image.ran.len(), max });
        }
        let mut s = self.state.lock();
        *s = Ledger { base: image.below, ..Ledger::default() };
        for (w, word) in image.ran.iter().enumerate() {
            for k in (0..64).filter(|k| word & (1 << k) != 0) {
                let (i, bit) = Ledger::slot(image.below + w as u64 * 64 + k);
                s.bits[i] |= bit;
            }
        }
        Ok(())
    }

    /// An async call has run (successfully or not).
    pub fn ran(&self, call_id: u64) {
        let mut s = self.state.lock();
        s.mark(call_id);
        if s.waiters > 0 {
            self.changed.notify_all();
        }
    }

    /// Wait until every call in `ids` has run. Returns the ids still missing after the
    /// timeout (empty when all ran).
    pub fn wait_for(&self, ids: &[u64]) -> Vec<u64> {
        self.wait_for_at_most(ids, BARRIER_TIMEOUT)
    }

    fn wait_for_at_most(&self, ids: &[u64], timeout: Duration) -> Vec<u64> {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock();
        loop {
            let missing: Vec<u64> = ids.iter().copied().filter(|&id| !s.has_run(id)).collect();
            let now = Instant::now();
            if missing.is_empty() || now >= deadline {
                return missing;
            }
            s.waiters += 1;
            self.changed.wait_for(&mut s, deadline - now);
            s.waiters -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_until_named_calls_ran() {
        let ledger = Arc::new(AsyncLedger::default());
        ledger.ran(3);
        assert!(ledger.wait_for_at_most(&[3], Duration::ZERO).is_empty());
        let l = ledger.clone();
        let waiter = std::thread::spawn(move || l.wait_for_at_most(&[5, 7], Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        ledger.ran(7);
        ledger.ran(5);
        assert!(waiter.join().unwrap().is_empty());
    }

    #[test]
    fn an_image_of_the_ledger_restores_what_ran() {
        let ledger = AsyncLedger::default();
        for id in [3, 64, 65, 200] {
            ledger.ran(id);
        }
        ledger.ran(REMEMBERED + 50);
        let image = ledger.snapshot();
        assert_eq!(image.below, 51);
        let restored = AsyncLedger::default();
        restored.load(&image).unwrap();
        for id in [3, 50, 64, 65, 200, REMEMBERED + 50] {
            assert!(restored.has_run(id), "{id}");
        }
        for id in [66, 199, 201, REMEMBERED + 49, REMEMBERED + 51] {
            assert!(!restored.has_run(id), "{id}");
        }
        assert_eq!(restored.snapshot(), image);
        let too_long = AsyncCallsRun { below: 0, ran: vec![1; (REMEMBERED / 64) as usize + 1] };
        assert!(AsyncLedger::default().load(&too_long).is_err());
    }

    #[test]
    fn a_call_that_never_comes_times_out() {
        let ledger = AsyncLedger::default();
        assert_eq!(ledger.wait_for_at_most(&[1, 9], Duration::from_millis(10)), vec![1, 9]);
    }

    #[test]
    fn forgotten_ids_count_as_run() {
        let ledger = AsyncLedger::default();
        for id in (1..=REMEMBERED + 10).step_by(3) {
            ledger.ran(id);
        }
        // Ran, forgotten (counted as run), remembered as not run, and not yet seen.
        let newest = 1 + (REMEMBERED + 9) / 3 * 3;
        assert!(ledger.wait_for_at_most(&[4, 5, newest], Duration::ZERO).is_empty());
        assert_eq!(ledger.wait_for_at_most(&[newest - 1, newest + 1], Duration::ZERO), vec![newest - 1, newest + 1]);
        // A jump far ahead forgets everything before the new window.
        ledger.ran(10 * REMEMBERED);
        AsyncLedger::default().ran(u64::MAX);
        assert!(ledger.wait_for_at_most(&[newest - 1, 9 * REMEMBERED], Duration::ZERO).is_empty());
        assert_eq!(ledger.wait_for_at_most(&[9 * REMEMBERED + 2], Duration::ZERO), vec![9 * REMEMBERED + 2]);
    }
}
