//! What a checkpoint or a restore did, as the API server's and the router's management
//! services answer it (`phos_control` carries these very types) and `phosctl` prints it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// What a checkpoint did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointSummary {
    /// Where the image went (set by whoever chose the place: the engine writes to a sink).
    pub dir: PathBuf,
    pub records: usize,
    pub regions: usize,
    /// Device memory covered and bytes stored for it.
    pub memory_bytes: u64,
    pub stored_bytes: u64,
    /// Time to stop the session's calls and synchronise the devices.
    pub quiesce_ms: f64,
    /// Time to copy memory out and write the image.
    pub copy_ms: f64,
    pub total_ms: f64,
    /// The session was frozen afterwards (its server is then ended).
    pub stopped: bool,
    /// How the memory was taken: `stop-the-world`, `copy-on-write` or `recopy`.
    pub mode: String,
    /// How long every call of the session was held: the quiesce and taking the host state
    /// (all of the copy too, stop-the-world; the last round, recopy).
    pub stall_ms: f64,
    /// The longest one call waited, while the session ran, for memory it writes to be
    /// copied first (copy-on-write: the reserve was full, or a chunk was being read);
    /// recopy: how long the last pass held the session (for a migration, until the target
    /// had restored it: its downtime).
    pub held_ms: f64,
    /// Bytes copied on the device ahead of a write (copy-on-write), or copied again after
    /// one (recopy).
    pub extra_bytes: u64,
    /// Copy-on-write: calls that waited before they could write (for copies aside, or for
    /// the copy), and the time they waited in all.
    pub waited_calls: u64,
    pub waited_ms: f64,
    /// Recopy rounds before the last, stopped one.
    pub rounds: u32,
    /// Why a concurrent checkpoint was given up and taken again stop-the-world, if it was.
    pub fallback: Option<String>,
    /// Recopy: blocks written since they were sent (as the dirty log names them) that were
    /// not sent again because the device still held what was sent (their hashes agreed;
    /// see [`crate::piece_hash`]), and their bytes, over every pass.
    #[serde(default)]
    pub skipped_pieces: u64,
    #[serde(default)]
    pub skipped_bytes: u64,
}

/// One pass of a recopy (the first, whole copy; a round; the last, held one): bytes the
/// session wrote since the pass before (as noted; the first pass counts all its memory, the
/// last its written regions), bytes copied, and how long the pass took; and the blocks
/// ([`HASH_BLOCK`](crate::piece_hash::HASH_BLOCK) bytes) of what was written that were not
/// copied because the device still held what had been sent (pieces skipped by hash), with
/// their bytes.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct RoundFigures {
    pub dirty_bytes: u64,
    pub copied_bytes: u64,
    pub ms: f64,
    #[serde(default)]
    pub skipped_pieces: u64,
    #[serde(default)]
    pub skipped_bytes: u64,
}

/// How a checkpoint takes the session's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointMode {
    /// While the session runs, copying memory ahead of writes: the image is the session at
    /// the start of the checkpoint (`phosctl checkpoint`'s default).
    #[default]
    CopyOnWrite,
    /// While the session runs, copying again what it writes, in rounds, then the rest with
    /// the session held: the image is the session at the end of the checkpoint.
    Recopy,
    /// Holding every call for the whole copy.
    StopTheWorld,
}

/// What a restore did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RestoreSummary {
    pub session: u64,
    pub records: usize,
    pub memory_bytes: u64,
    pub verify_ms: f64,
    pub replay_ms: f64,
    pub copy_ms: f64,
    /// The whole restore (the router's figure counts the server's start or pool hand-out too).
    pub total_ms: f64,
    /// The server came from the router's pool of pre-started servers.
    pub pooled: bool,
    /// The session was served before its memory was loaded (on-demand restore): `copy_ms` is
    /// 0 and `total_ms` the time until it was served; the load goes on behind it
    /// ([`LoadReport`]).
    pub on_demand: bool,
}

/// What a checkpoint was still waiting for when it gave up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Waiting {
    /// The session's calls in flight to end: those still running, each as its function and
    /// channel (`phosLaunchKernel (channel 1)`).
    Calls { functions: Vec<String> },
    /// A device to finish the work queued on it.
    Device { device: i32 },
    /// The session's on-demand restore to finish loading its memory (bytes loaded, in all).
    MemoryLoad { done: u64, total: u64 },
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waiting::Calls { functions } if functions.is_empty() => f.write_str("its calls in flight to finish"),
            Waiting::Calls { functions } => write!(f, "its calls in flight to finish: {}", functions.join(", ")),
            Waiting::Device { device } => {
                write!(f, "device {device} to finish the work queued on it (kernels, copies, host functions)")
            }
            Waiting::MemoryLoad { done, total } => {
                write!(f, "its restore to finish loading its memory ({done} of {total} bytes loaded)")
            }
        }
    }
}

/// How far a checkpoint or restore is, for progress bars: bytes of device memory done and
/// in all; for a recopy (a migration's), its pass and the session's dirty rate too.
#[derive(Debug, Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub total: AtomicU64,
    /// The recopy's pass under way: 0 the first copy, then its rounds, then the held one.
    pub pass: AtomicU32,
    /// Whether the pass under way holds the session's calls (the recopy's last).
    pub held: AtomicBool,
    /// Bytes a second the session wrote between the recopy's last two rounds.
    pub dirty_rate: AtomicU64,
}

impl Progress {
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub(crate) fn start(&self, total: u64) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.pass.store(0, Ordering::Relaxed);
        self.held.store(false, Ordering::Relaxed);
        self.dirty_rate.store(0, Ordering::Relaxed);
    }

    /// A recopy's next pass begins, `held` or not; `dirty_rate`: what the session wrote
    /// since the pass before, a second.
    pub(crate) fn next_pass(&self, held: bool, dirty_rate: f64) {
        self.pass.fetch_add(1, Ordering::Relaxed);
        self.held.store(held, Ordering::Relaxed);
        self.dirty_rate.store(dirty_rate as u64, Ordering::Relaxed);
    }

    pub(crate) fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

/// How the background load of an on-demand restore goes, or went. Times are from the start
/// of the restore in the server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub session: u64,
    /// Bytes of device memory loaded, and in all.
    pub done: u64,
    pub total: u64,
    /// When the session was served (its objects recreated, its memory not yet loaded).
    pub serving_ms: f64,
    /// When its first call was served: answered, or queued for an async one, after waiting
    /// for any memory it needed (`None`: no call came during the load).
    pub first_call_ms: Option<f64>,
    /// When every byte was loaded (`None`: still loading, or failed).
    pub loaded_ms: Option<f64>,
    /// Calls held for memory not yet loaded, and the time they waited in all.
    pub held_calls: u64,
    pub held_ms: f64,
    /// Why the load stopped, if it did: the session's calls then fail.
    pub failed: Option<String>,
    /// The session ended (its program exited) before all was loaded: the rest is not needed.
    pub session_ended: bool,
}

impl LoadReport {
    /// The load is over: loaded, failed, or no longer needed.
    pub fn finished(&self) -> bool {
        self.loaded_ms.is_some() || self.failed.is_some() || self.session_ended
    }
}
