//! A channel's kernel launches, submitted to the backend by a thread of their own.
//!
//! The API server runs a channel's calls one after another on the channel's thread. For a
//! launch-bound program that thread is the pipeline's slowest stage: it reads the frame,
//! decodes and checks the launch, and then spends most of its time in the driver's
//! `cuLaunchKernel`. A native process spends only the driver's part. So an async launch
//! (the guest did not wait for it) is checked on the channel's thread, as before, and handed
//! to the channel's *submitter*, a thread that does nothing but call the backend's launch;
//! the channel's thread goes on to the next frame meanwhile. The launch rate is then the
//! driver's, not the driver's plus Phos's.
//!
//! **Order.** CUDA orders a thread's calls as it made them, so nothing may overtake a
//! queued launch:
//! - on its own channel, every call but another queued launch [`drain`](LaunchQueue::drain)s
//!   the queue first (a copy, a synchronisation, an event record, a free);
//! - across channels, a barrier waits for the other channel's calls to be noted in the
//!   session's async ledger, and the submitter notes a launch there only once it has been
//!   submitted;
//! - a checkpoint's quiesce waits for every queued launch to be submitted
//!   ([`crate::quiesce::QuiesceLock::queued`]).
//!
//! A launch is queued only when nothing else depends on its being submitted by the channel's
//! thread: not cooperative, not on the per-thread default stream (the driver's is per host
//! thread), not measured for the router, no C/R hook (checked twins are planned per launch),
//! not being captured. A failure of a queued launch comes back with the channel's next
//! acknowledgement of async calls, as any async launch's failure does.
//!
//! On by default with the `cuda` backend where the machine has four CPUs or more (a
//! submitter spins a while before it sleeps, as the shared-memory channel's reader does);
//! the server's `--launch-pipeline on|off` (`PHOS_LAUNCH_PIPELINE`) decides for any backend
//! (the tests run `emu` with it on as well).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use phos_protocol::CudaError;
use phos_protocol::types::Dim3;

use crate::backend::{Raw, StreamRef};
use crate::service::Session;

/// Launches queued on one channel at most; a full queue makes the channel's thread wait, as
/// a full launch queue makes a CUDA application's.
const DEPTH: usize = 1024;

/// The server's `--launch-pipeline` (`PHOS_LAUNCH_PIPELINE`), once set.
static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();

/// Decide for every session of this server: `Some(on)`, or `None` for the default.
pub fn configure(on: Option<bool>) {
    let _ = FORCED.set(on);
}

/// Whether channels of a session on this backend queue their launches.
pub fn enabled(backend: &str) -> bool {
    FORCED
        .get()
        .copied()
        .flatten()
        .unwrap_or_else(|| backend == "cuda" && !phos_protocol::shm::default_spin().is_zero())
}

/// One launch, checked, as the backend takes it.
pub struct QueuedLaunch {
    /// The guest's id of the async call (noted in the ledger once submitted).
    pub call_id: u64,
    pub device: i32,
    pub function: Raw,
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_mem: u32,
    pub stream: StreamRef,
    pub params: Params,
}

/// A launch's parameter buffer: inline up to [`Params::INLINE`] bytes (nearly every kernel's),
/// so that queueing a launch allocates nothing (an allocation freed on the submitter's
/// thread costs the allocator more than the copy).
#[allow(clippy::large_enum_variant, reason = "inline on purpose: the queue's slots are made once")]
pub enum Params {
    Inline { len: u16, bytes: [u8; Params::INLINE] },
    Heap(Vec<u8>),
}

impl Params {
    pub const INLINE: usize = 512;

    pub fn new(params: &[u8]) -> Self {
        if params.len() <= Self::INLINE {
            let mut bytes = [0; Self::INLINE];
            bytes[..params.len()].copy_from_slice(params);
            Params::Inline { len: params.len() as u16, bytes }
        } else {
            Params::Heap(params.to_vec())
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            Params::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Params::Heap(v) => v,
        }
    }
}

/// What the channel's thread and the submitter share.
#[derive(Default)]
struct Shared {
    /// Queued and not yet submitted.
    pending: AtomicU64,
    /// Queued launches that failed since the channel last looked, and the last failure.
    failed: AtomicU64,
    last_error: AtomicI32,
}

/// The channel's end: queue launches, wait for them, collect their failures.
pub struct LaunchQueue {
    tx: Option<SyncSender<QueuedLaunch>>,
    shared: Arc<Shared>,
    session: Arc<Session>,
    submitter: Option<std::thread::JoinHandle<()>>,
}

impl LaunchQueue {
    /// A queue and its submitter for a channel of `session`; `None` if no thread can be had
    /// (the channel's thread then launches itself).
    pub fn start(session: Arc<Session>, channel: u64) -> Option<Self> {
        let (tx, rx) = sync_channel(DEPTH);
        let shared = Arc::new(Shared::default());
        let (s, sh) = (session.clone(), shared.clone());
        tracing::debug!(session = session.id, channel, "the channel's launches go to a submitter thread");
        let submitter = std::thread::Builder::new()
            .name(format!("phos-launch-{channel}"))
            .spawn(move || submit_all(&s, &sh, rx))
            .map_err(|e| tracing::warn!(session = session.id, channel, "launches stay on the channel's thread: {e}"))
            .ok()?;
        Some(LaunchQueue { tx: Some(tx), shared, session, submitter: Some(submitter) })
    }

    /// Queue a checked launch. The session's quiesce counts it until it is submitted.
    pub fn push(&self, launch: QueuedLaunch) {
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        self.session.quiesce.queued.fetch_add(1, Ordering::AcqRel);
        let Some(tx) = &self.tx else {
            // Only while the queue is being dropped: launched here (which counts it submitted).
            submit(&self.session, &self.shared, launch);
            return;
        };
        // A full queue is waited out spinning, not sleeping: a sleeping sender would cost the
        // submitter a wake-up call per launch taken, while the queue is full (the submitter
        // is the slower stage of a launch-bound program), on the very thread that bounds it.
        let mut launch = launch;
        let mut spins = 0u32;
        loop {
            match tx.try_send(launch) {
                Ok(()) => return,
                Err(TrySendError::Full(l)) => {
                    launch = l;
                    if spins < 4096 {
                        spins += 1;
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                Err(TrySendError::Disconnected(l)) => {
                    // The submitter is gone (it only ends when the queue is dropped): run it here.
                    submit(&self.session, &self.shared, l);
                    return;
                }
            }
        }
    }

    /// Wait until every queued launch has been submitted.
    pub fn drain(&self) {
        let mut spins = 0u32;
        while self.shared.pending.load(Ordering::Acquire) != 0 {
            if spins < 4096 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Failures of queued launches since the last call: (how many, the last one's status).
    pub fn take_failures(&self) -> Option<(u64, i32)> {
        if self.shared.failed.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let status = self.shared.last_error.load(Ordering::Relaxed);
        let n = self.shared.failed.swap(0, Ordering::AcqRel);
        (n > 0).then_some((n, status))
    }
}

impl Drop for LaunchQueue {
    fn drop(&mut self) {
        // The submitter submits what is queued, sees the channel closed, and ends.
        drop(self.tx.take());
        if let Some(t) = self.submitter.take() {
            let _ = t.join();
        }
    }
}

/// The submitter's loop: spin a while on an empty queue, then sleep until a launch comes or
/// the channel closes. It spins as long as a reader awaiting a synchronous answer does (2 ms
/// by default): a launch-bound loop that synchronises now and then (every 100 launches,
/// say) would otherwise find the submitter asleep after each synchronisation and pay a
/// wake-up, tens of microseconds, for the first launch after it.
fn submit_all(session: &Session, shared: &Shared, rx: Receiver<QueuedLaunch>) {
    use phos_protocol::shm::{default_spin, default_sync_spin};
    let spin = default_sync_spin().max(default_spin()).max(Duration::from_micros(20));
    loop {
        let launch = match rx.try_recv() {
            Ok(l) => l,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {
                let until = Instant::now() + spin;
                let mut got = None;
                'spin: while Instant::now() < until {
                    for _ in 0..64 {
                        match rx.try_recv() {
                            Ok(l) => {
                                got = Some(l);
                                break 'spin;
                            }
                            Err(TryRecvError::Empty) => std::hint::spin_loop(),
                            Err(TryRecvError::Disconnected) => return,
                        }
                    }
                }
                match got {
                    Some(l) => l,
                    None => match rx.recv() {
                        Ok(l) => l,
                        Err(_) => return,
                    },
                }
            }
        };
        submit(session, shared, launch);
    }
}

/// Submit one queued launch, as the channel's thread would have, and say it ran.
fn submit(session: &Session, shared: &Shared, l: QueuedLaunch) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let b = session.backend();
        b.bind(l.device)?;
        let mut printed = Vec::new();
        let view = session.objects.memory.view();
        let r = b.launch(
            l.function,
            l.grid,
            l.block,
            l.shared_mem,
            l.stream,
            l.params.as_slice(),
            &view,
            &mut printed,
            false,
            false,
        );
        drop(view);
        session.output.push(&printed);
        r
    }))
    .unwrap_or_else(|_| {
        tracing::error!(session = session.id, "a queued kernel launch: internal error (panic)");
        Err(CudaError::Unknown)
    });
    match r {
        Ok(()) => {}
        // A fault while the kernel ran (a backend that runs kernels at launch) corrupts the
        // context and surfaces at the next call, as a GPU's does.
        Err(e) if e.is_sticky() => session.note_error(e),
        Err(e) => {
            tracing::debug!(session = session.id, call = l.call_id, "a queued kernel launch failed: {e:?}");
            shared.last_error.store(e.0, Ordering::Relaxed);
            shared.failed.fetch_add(1, Ordering::AcqRel);
        }
    }
    session.async_calls.ran(l.call_id);
    shared.pending.fetch_sub(1, Ordering::AcqRel);
    session.quiesce.queued.fetch_sub(1, Ordering::AcqRel);
}
