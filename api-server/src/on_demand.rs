//! On-demand restore in this server: the session is served as soon as its objects are
//! recreated, its memory loads behind it, and a hook holds every call that reads or writes
//! memory not yet loaded (docs/architecture.md, "On-demand restore").
//!
//! The engine's [`PendingMemory`] holds calls by the device ranges they touch; what the
//! generated dispatch and the services show it is what the spec and the kernel analysis say
//! a call reads and writes. [`OnDemandHook`] adds what a call does to memory without naming
//! a range: freeing an allocation (the loader would write into memory that is gone, or that a
//! later allocation reuses), unloading a module (its variables go with it), resetting the
//! device. A call that may touch any memory (a kernel whose accesses the analysis cannot
//! follow, [`EVERYTHING`]) waits for the whole load.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use phos_checkpoint::CrError;
use phos_checkpoint::engine::{CallHook, PendingMemory};
use phos_checkpoint::report::{LoadReport, Progress, Waiting};
use phos_protocol::CudaError;
use phos_protocol::spec::{CallAccess, DeviceAccess, ObjectEffect};

use crate::checkpoint::Bounds;
use crate::registry::memory::AddressSpace;

/// What a call touches when it may touch any memory: every address. Only read, as far as the
/// hook is told: a protocol that copies ahead of writes learns of untracked stores from
/// validation, not from this.
pub const EVERYTHING: DeviceAccess = DeviceAccess { addr: 0, len: u64::MAX, writes: false };

/// The environment variable (and hidden server option `--restore-load-pace-ms`) a test sets
/// to slow the background load down: milliseconds waited before each chunk, so that calls
/// really arrive before their memory.
pub const LOAD_PACE_VAR: &str = "PHOS_TEST_RESTORE_LOAD_PACE_MS";

/// The figures of one on-demand restore, kept while the session lives (the management
/// service answers them, `phosctl restore` prints them).
pub struct LoadStatus {
    session: u64,
    /// When the restore started in this server.
    started: Instant,
    progress: Arc<Progress>,
    serving_ms: Mutex<f64>,
    first_call_ms: Mutex<Option<f64>>,
    /// `Ok(ms)`: all loaded then; `Err(why)`: the load failed.
    ended: Mutex<Option<Result<f64, String>>>,
    /// Signalled when `ended` is set, and when the hook is gone.
    over: Condvar,
    /// The load's hook is uninstalled (after `ended` is set): another protocol may install
    /// its own.
    released: std::sync::atomic::AtomicBool,
    held_calls: AtomicU64,
    held_ns: AtomicU64,
}

impl LoadStatus {
    pub fn new(session: u64, started: Instant, progress: Arc<Progress>) -> Self {
        LoadStatus {
            session,
            started,
            progress,
            serving_ms: Mutex::new(0.0),
            first_call_ms: Mutex::new(None),
            ended: Mutex::new(None),
            over: Condvar::new(),
            released: std::sync::atomic::AtomicBool::new(false),
            held_calls: AtomicU64::new(0),
            held_ns: AtomicU64::new(0),
        }
    }

    fn since_start(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e3
    }

    /// The session is served from now on.
    pub fn serving(&self) {
        *self.serving_ms.lock() = self.since_start();
    }

    /// Every byte is loaded (the first time this is said).
    pub fn loaded(&self) {
        self.ended.lock().get_or_insert_with(|| Ok(self.since_start()));
        self.over.notify_all();
    }

    /// The load stopped: `why`.
    pub fn failed(&self, why: String) {
        *self.ended.lock() = Some(Err(why));
        self.over.notify_all();
    }

    /// The load's hook is uninstalled.
    pub fn hook_released(&self) {
        let _ended = self.ended.lock();
        self.released.store(true, Ordering::Release);
        self.over.notify_all();
    }

    /// Wait until the load is over (loaded or failed) and its hook gone, within `bounds`: a
    /// checkpoint must not copy memory that is not loaded yet (nor share the progress
    /// counters with the load), and installs a hook of its own.
    pub fn wait_over(&self, bounds: &Bounds) -> Result<(), CrError> {
        let start = Instant::now();
        let deadline = start + bounds.quiesce_timeout;
        let mut ended = self.ended.lock();
        while ended.is_none() || !self.released.load(Ordering::Acquire) {
            let timed_out = Instant::now() >= deadline;
            if timed_out || bounds.cancel.is_cancelled() {
                let waiting_for = Waiting::MemoryLoad { done: self.progress.done(), total: self.progress.total() };
                return Err(if timed_out {
                    CrError::TimedOut { session: self.session, waited: start.elapsed(), waiting_for }
                } else {
                    CrError::Abandoned { session: self.session, what: format!("waiting for {waiting_for}") }
                });
            }
            self.over.wait_for(&mut ended, Duration::from_millis(50));
        }
        Ok(())
    }

    pub fn report(&self) -> LoadReport {
        let ended = self.ended.lock().clone();
        LoadReport {
            session: self.session,
            done: self.progress.done(),
            total: self.progress.total(),
            serving_ms: *self.serving_ms.lock(),
            first_call_ms: *self.first_call_ms.lock(),
            loaded_ms: ended.as_ref().and_then(|e| e.as_ref().ok().copied()),
            held_calls: self.held_calls.load(Ordering::Relaxed),
            held_ms: self.held_ns.load(Ordering::Relaxed) as f64 / 1e6,
            failed: ended.and_then(Result::err),
            session_ended: false,
        }
    }
}

/// The session's hook while its memory loads: [`PendingMemory`], shown also the ranges a
/// call frees, and counting what it holds.
pub struct OnDemandHook {
    pub pending: Arc<PendingMemory>,
    pub memory: Arc<AddressSpace>,
    pub status: Arc<LoadStatus>,
    /// The device memory the session's texture objects of linear and pitched memory read
    /// (start, length): a kernel reaches it through an object, which its parameters do not
    /// show as an address.
    pub texture_memory: Box<dyn Fn() -> Vec<(u64, u64)> + Send + Sync>,
}

impl OnDemandHook {
    /// Memory the call affects without naming it as a range.
    fn implied(&self, access: &CallAccess<'_>) -> Vec<DeviceAccess> {
        if access.function == "cudaDeviceReset" {
            return vec![EVERYTHING];
        }
        let mut out = Vec::new();
        for o in access.objects.iter().filter(|o| o.effect == ObjectEffect::Destroys) {
            match o.kind {
                "device_memory" => {
                    if let Some(a) = self.memory.allocation_at(o.value) {
                        out.push(DeviceAccess { addr: a.addr, len: a.size, writes: true });
                    }
                }
                "module" => out.push(EVERYTHING),
                _ => {}
            }
        }
        // Any call may launch a kernel sampling them (a launch, a graph's, a library's).
        out.extend((self.texture_memory)().into_iter().map(|(addr, len)| DeviceAccess { addr, len, writes: false }));
        out
    }
}

impl CallHook for OnDemandHook {
    fn before_call(&self, access: &CallAccess<'_>) -> Result<(), CudaError> {
        let implied = self.implied(access);
        let device: Vec<DeviceAccess>;
        let access = if implied.is_empty() {
            *access
        } else {
            device = access.device.iter().copied().chain(implied).collect();
            CallAccess { device: &device, ..*access }
        };
        let waits = access.device.iter().any(|d| self.pending.is_pending(d.addr, d.len));
        let start = Instant::now();
        let r = self.pending.before_call(&access);
        if waits {
            self.status.held_calls.fetch_add(1, Ordering::Relaxed);
            self.status.held_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        r
    }

    fn after_call(&self) {
        let mut first = self.status.first_call_ms.lock();
        if first.is_none() {
            *first = Some(self.status.since_start());
        }
    }
}
