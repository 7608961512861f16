//! The session's call gate: every call passes through it, and a checkpoint closes it to see
//! the session between calls. Closing waits for the calls in flight, holds new ones back
//! meanwhile (so that a busy session cannot keep a checkpoint out for ever), and gives up at
//! a deadline or when told to, letting the held calls on: a kernel that never ends must
//! not stall the session's other threads, nor the operator, for longer than they asked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct CallGate {
    lock: RwLock<()>,
    /// A checkpoint is trying to close the gate: new calls wait on `reopened`.
    closing: AtomicBool,
    /// Guards the waits below (and `closing`'s changes).
    state: Mutex<()>,
    /// Signalled when a call leaves while the gate is closing.
    left: Condvar,
    /// Signalled when closing ends (closed, or given up).
    reopened: Condvar,
}

/// A call passing through the gate (the gate cannot close until it is dropped).
pub struct Passing<'a> {
    guard: Option<RwLockReadGuard<'a, ()>>,
    gate: &'a CallGate,
}

impl Drop for Passing<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        if self.gate.closing.load(Ordering::SeqCst) {
            let _state = self.gate.state.lock().unwrap_or_else(|p| p.into_inner());
            self.gate.left.notify_all();
        }
    }
}

/// Why the gate could not be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotClosed {
    TimedOut,
    Cancelled,
}

impl CallGate {
    /// Pass through the gate, waiting while it is closed or closing.
    pub fn pass(&self) -> Passing<'_> {
        if self.closing.load(Ordering::SeqCst) {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            while self.closing.load(Ordering::SeqCst) {
                state = self.reopened.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        }
        Passing { guard: Some(self.lock.read().unwrap_or_else(|p| p.into_inner())), gate: self }
    }

    /// Close the gate once the calls in flight have left, holding new ones back meanwhile;
    /// give up at `deadline`, or when `cancelled()` says so (asked every 50 ms).
    pub fn close(
        &self,
        deadline: Instant,
        cancelled: impl Fn() -> bool,
    ) -> Result<RwLockWriteGuard<'_, ()>, NotClosed> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.closing.store(true, Ordering::SeqCst);
        let outcome = loop {
            match self.lock.try_write() {
                Ok(closed) => break Ok(closed),
                Err(std::sync::TryLockError::Poisoned(p)) => break Ok(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(NotClosed::TimedOut);
            }
            if cancelled() {
                break Err(NotClosed::Cancelled);
            }
            let nap = (deadline - now).min(Duration::from_millis(50));
            state = self.left.wait_timeout(state, nap).unwrap_or_else(|p| p.into_inner()).0;
        };
        // Closed (the write lock now holds new calls back) or given up: either way the
        // calls waiting on `closing` move on, to the lock.
        self.closing.store(false, Ordering::SeqCst);
        self.reopened.notify_all();
        drop(state);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn closes_once_calls_leave_and_holds_new_ones() {
        let gate = Arc::new(CallGate::default());
        let inside = gate.pass();
        let g = gate.clone();
        let closer = std::thread::spawn(move || {
            let start = Instant::now();
            let closed = g.close(Instant::now() + Duration::from_secs(10), || false).is_ok();
            (closed, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        // A new call waits while the gate is closing...
        let g = gate.clone();
        let newcomer = std::thread::spawn(move || {
            let _p = g.pass();
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!newcomer.is_finished(), "a new call got through a closing gate");
        let left = Instant::now();
        drop(inside);
        let (closed, waited) = closer.join().unwrap();
        assert!(closed && waited >= Duration::from_millis(100));
        // ...and passes once the checkpoint (which has the gate now) is done.
        assert!(newcomer.join().unwrap() >= left);
    }

    #[test]
    fn gives_up_at_the_deadline_or_when_cancelled_and_lets_calls_on() {
        let gate = Arc::new(CallGate::default());
        let inside = gate.pass();
        let start = Instant::now();
        assert_eq!(gate.close(Instant::now() + Duration::from_millis(200), || false).err(), Some(NotClosed::TimedOut));
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(gate.close(Instant::now() + Duration::from_secs(60), || true).err(), Some(NotClosed::Cancelled));
        // New calls pass again while the first is still inside.
        drop(gate.pass());
        drop(inside);
        assert!(gate.close(Instant::now() + Duration::from_secs(1), || false).is_ok());
    }
}
