//! The session's quiesce lock: every call holds it (shared) while it runs, and a checkpoint
//! takes it (exclusive) to see the session between calls. Taking it waits for the calls in
//! flight, holds new ones back meanwhile (so that a busy session cannot keep a checkpoint
//! out for ever), and gives up at a deadline or when told to, letting the held calls on: a
//! kernel that never ends must not stall the session's other threads, nor the operator, for
//! longer than they asked.
//!
//! (Host-function *gates*, [`crate::backend::Gate`], are another thing: points in a stream.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use phos_protocol::apis::Function;

#[derive(Default)]
pub struct QuiesceLock {
    lock: RwLock<()>,
    /// A checkpoint is trying to quiesce the session: new calls wait on `resumed`.
    quiescing: AtomicBool,
    /// Guards the waits below (and `quiescing`'s changes).
    state: Mutex<()>,
    /// Signalled when a call leaves while the session is quiescing.
    left: Condvar,
    /// Signalled when quiescing ends (quiesced, or given up).
    resumed: Condvar,
    /// Kernel launches checked by calls that have left, queued for their channels'
    /// submitters ([`crate::pipeline`]) and not yet submitted: the session is at rest only
    /// once they are.
    pub(crate) queued: AtomicU64,
}

/// A call in flight (the session cannot quiesce until it is dropped).
pub struct InFlight<'a> {
    guard: Option<RwLockReadGuard<'a, ()>>,
    lock: &'a QuiesceLock,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        if self.lock.quiescing.load(Ordering::SeqCst) {
            let _state = self.lock.state.lock();
            self.lock.left.notify_all();
        }
    }
}

/// The session at rest: no call runs or starts until this is dropped.
pub type Quiesced<'a> = RwLockWriteGuard<'a, ()>;

/// Why the session could not be quiesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotQuiesced {
    TimedOut,
    Cancelled,
}

impl QuiesceLock {
    /// Enter a call, waiting while the session is quiesced or quiescing.
    pub fn enter(&self) -> InFlight<'_> {
        if self.quiescing.load(Ordering::SeqCst) {
            let mut state = self.state.lock();
            while self.quiescing.load(Ordering::SeqCst) {
                self.resumed.wait(&mut state);
            }
        }
        InFlight { guard: Some(self.lock.read()), lock: self }
    }

    /// Quiesce once the calls in flight have left, holding new ones back meanwhile; give up
    /// at `deadline`, or when `cancelled()` says so (asked every 50 ms).
    pub fn quiesce(&self, deadline: Instant, cancelled: impl Fn() -> bool) -> Result<Quiesced<'_>, NotQuiesced> {
        let mut state = self.state.lock();
        self.quiescing.store(true, Ordering::SeqCst);
        let outcome = loop {
            if let Some(quiesced) = self.lock.try_write() {
                // No call runs or starts now; the launches they queued go on to the driver.
                match Self::wait_submitted(&self.queued, deadline, &cancelled) {
                    Ok(()) => break Ok(quiesced),
                    Err(e) => break Err(e),
                }
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(NotQuiesced::TimedOut);
            }
            if cancelled() {
                break Err(NotQuiesced::Cancelled);
            }
            let nap = (deadline - now).min(Duration::from_millis(50));
            self.left.wait_for(&mut state, nap);
        };
        // Quiesced (the write lock now holds new calls back) or given up: either way the
        // calls waiting on `quiescing` move on, to the lock.
        self.quiescing.store(false, Ordering::SeqCst);
        self.resumed.notify_all();
        drop(state);
        outcome
    }
}

impl QuiesceLock {
    /// Wait (spinning, then napping) until no launch is queued.
    fn wait_submitted(queued: &AtomicU64, deadline: Instant, cancelled: &impl Fn() -> bool) -> Result<(), NotQuiesced> {
        let mut spins = 0u32;
        while queued.load(Ordering::Acquire) != 0 {
            if spins < 1024 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if Instant::now() >= deadline {
                return Err(NotQuiesced::TimedOut);
            }
            if cancelled() {
                return Err(NotQuiesced::Cancelled);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }
}

/// What each channel runs now: what a quiesce that cannot complete waits for, to name it.
#[derive(Default)]
pub struct Activity {
    /// By channel: the function's `Function::policy_id` + 1 (0: nothing).
    busy: Mutex<BTreeMap<u64, Arc<AtomicU64>>>,
}

impl Activity {
    /// The word in which `channel` says what it runs (`Function::policy_id` + 1; 0: nothing),
    /// listed until [`closed`](Self::closed).
    pub fn channel(&self, channel: u64) -> Arc<AtomicU64> {
        let a = Arc::new(AtomicU64::new(0));
        self.busy.lock().insert(channel, a.clone());
        a
    }

    pub fn closed(&self, channel: u64) {
        self.busy.lock().remove(&channel);
    }

    /// The calls running now, as `function (channel N)`.
    pub fn calls(&self) -> Vec<String> {
        self.busy
            .lock()
            .iter()
            .filter_map(|(ch, a)| {
                let f = a.load(Ordering::Relaxed).checked_sub(1)?;
                let f = Function::from_wire((f >> 32) as u16, f as u32);
                Some(format!("{} (channel {ch})", f.map_or("?", |f| f.name())))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn quiesces_once_calls_leave_and_holds_new_ones() {
        let lock = Arc::new(QuiesceLock::default());
        let inside = lock.enter();
        let g = lock.clone();
        let closer = std::thread::spawn(move || {
            let start = Instant::now();
            let quiesced = g.quiesce(Instant::now() + Duration::from_secs(10), || false).is_ok();
            (quiesced, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        // A new call waits while the session is quiescing...
        let g = lock.clone();
        let newcomer = std::thread::spawn(move || {
            let _p = g.enter();
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!newcomer.is_finished(), "a new call got through a quiescing session");
        let left = Instant::now();
        drop(inside);
        let (quiesced, waited) = closer.join().unwrap();
        assert!(quiesced && waited >= Duration::from_millis(100));
        // ...and passes once the checkpoint (which holds the lock now) is done.
        assert!(newcomer.join().unwrap() >= left);
    }

    #[test]
    fn gives_up_at_the_deadline_or_when_cancelled_and_lets_calls_on() {
        let lock = Arc::new(QuiesceLock::default());
        let inside = lock.enter();
        let start = Instant::now();
        assert_eq!(
            lock.quiesce(Instant::now() + Duration::from_millis(200), || false).err(),
            Some(NotQuiesced::TimedOut)
        );
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(lock.quiesce(Instant::now() + Duration::from_secs(60), || true).err(), Some(NotQuiesced::Cancelled));
        // New calls pass again while the first is still inside.
        drop(lock.enter());
        drop(inside);
        assert!(lock.quiesce(Instant::now() + Duration::from_secs(1), || false).is_ok());
    }
}
