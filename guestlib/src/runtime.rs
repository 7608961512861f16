//! The guest core's runtime: the channel each host thread uses to reach the API server, the
//! call path the generated stubs of every API go through, and the per-thread state CUDA
//! defines (last error, current device). It speaks no API of its own: a call names its API and
//! function (`RemoteCall::FUNCTION`), and its failures are [`Failure`]s that each API's status
//! type turns into its own codes. What it needs of the server it asks through the runtime
//! spec's internal functions (`phos*`), the session's base protocol.
//!
//! A process is one **session**; each host thread that calls CUDA opens its own **channel**
//! (connection) to the router, so a thread blocked in `cudaStreamSynchronize` never holds up
//! another thread's calls. The first channel creates the session; the others join it with the
//! session token.

use std::cell::{Cell, RefCell};
use std::collections::{HashSet, VecDeque};
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use phos_protocol::DEFAULT_MAX_PAYLOAD;
use phos_protocol::apis::Function;
use phos_protocol::cudart;
use phos_protocol::frame::{
    FLAG_ASYNC, FLAG_DEFERRED, FLAG_REFUSED, FLAG_RESENT, FrameHeader, FrameKind, HANDSHAKE_VERSION, MAX_BARRIER_IDS,
    REFUSED_MOVED, REFUSED_PARKED,
};
use phos_protocol::handshake::{ApiVersion, Hello, TransportKind, Welcome};
use phos_protocol::shm::ShmTransport;
use phos_protocol::staging::{Count, Staging, StagingError};
use phos_protocol::transport::{Endpoint, TcpTransport, Transport, UnixTransport, VsockTransport};
use phos_protocol::{CudaError, Failure, RemoteCall};

/// What the process learned when its session was opened.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub token: [u8; 16],
    pub backend: String,
    /// Every device allocation of the session lies in `[device_base, device_base + device_size)`.
    pub device_base: u64,
    pub device_size: u64,
    pub device_count: i32,
    /// The largest request the router carries (see [`Welcome::max_payload`]).
    pub max_payload: u64,
    /// Restores so far (the router's count); see [`Welcome::epoch`].
    epoch: AtomicU64,
    pid: u32,
}

impl Session {
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.device_base && addr - self.device_base < self.device_size
    }
}

struct Channel {
    transport: Box<dyn Transport>,
    session: Arc<Session>,
    reply: Vec<u8>,
    /// This channel's entry in [`CHANNELS`] (its unanswered async calls are there).
    shared: Arc<ChannelShared>,
    /// Where large copies move their data (shared-memory channels).
    staging: Option<Arc<Staging>>,
    /// The other channels' async calls this channel's barriers have named, by channel (the
    /// address of its [`ChannelShared`]): the server ran each before this channel's later
    /// frames, so no barrier names it again.
    named: Vec<(usize, u64)>,
    /// [`PUBLISHED`] as of this channel's last look at the others (and its own publishes
    /// since, while no other channel published): equal to it now, nothing is new to name.
    seen: u64,
    /// The last of this thread's calls that another channel took over from its previous,
    /// lost connection (0: none): sent before anything this channel sends again, as a
    /// barrier, so the calls the thread sent after them still run after them.
    resend_after: u64,
    /// How many of the last unanswered calls [`Channel::unnamed_calls`] took over from lost
    /// channels and this channel has not sent yet (before the barrier it computed).
    unsent_adopted: usize,
    /// Synchronous calls that returned before their answers' frames came, whose frames are
    /// still to come (in this order): staged copies that returned on their counts (see
    /// [`staged_copy`]), and calls whose answers the server posted in the staging region
    /// (see [`Channel::spin_for_posted`]).
    detached: VecDeque<u64>,
}

/// Synchronous calls (staged copies, posted answers) a channel may have returned from before
/// their answers' frames came.
const MAX_DETACHED: usize = 64;

/// What spinning for a posted answer found ([`Channel::spin_for_posted`]).
enum Posted {
    /// The answer was posted: its payload is in the channel's `reply`.
    Taken,
    /// A frame came that `receive_one` leaves to the caller (the answer's, or a refusal).
    Frame(FrameHeader),
    Lost(String),
    /// Nothing within the spin.
    NotYet,
}

/// Whether a thread awaiting a synchronous answer returns on the answer the server posts in
/// the staging region (`PHOS_POSTED_ANSWERS`, on unless `0`; only where waiters spin).
fn takes_posted_answers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("PHOS_POSTED_ANSWERS").map_or(true, |v| v.trim() != "0"))
}

struct Unanswered {
    call_id: u64,
    function: Function,
    device: i32,
    request: Vec<u8>,
}

/// What other threads may know about a channel: the last async call it sent that has not
/// been answered (0: none). A synchronous call on another channel must not overtake it.
#[derive(Default)]
struct ChannelShared {
    last_unanswered: AtomicU64,
    /// The work this channel sent that may write what the host reads without a call (see
    /// [`work_settled`]), counted by its own thread once the work is sent (async) or answered.
    work: WorkCounts,
    /// The session's epoch (restores so far) when this channel connected. A channel of an
    /// earlier epoch than another's has lost its connection: its server is gone.
    epoch: u64,
    /// Async calls sent and not answered yet, oldest first: kept whole, so that if the
    /// connection is lost they can be sent again on the next one. Behind a lock (taken by its
    /// own thread, uncontended, but for the moment below) because another thread may have to
    /// send them again: after a restore, a thread that is idle (PyTorch's autograd thread,
    /// waiting for the main thread) reconnects only at its next call, while another thread's
    /// synchronising call names its last async call in a barrier and would wait for it
    /// forever. So the first channel of a newer epoch that meets a lost channel's calls takes
    /// them over (see [`Channel::adopt_lost`]).
    unanswered: Mutex<VecDeque<Unanswered>>,
    /// The last call another channel took over from this one (0: none).
    adopted_up_to: AtomicU64,
}

impl ChannelShared {
    fn unanswered(&self) -> std::sync::MutexGuard<'_, VecDeque<Unanswered>> {
        self.unanswered.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every channel of the process that may have async calls in flight.
static CHANNELS: Mutex<Vec<Arc<ChannelShared>>> = Mutex::new(Vec::new());
/// `CHANNELS.len()`, read without the lock: a process of one channel (one thread calling
/// CUDA) sends no barrier and takes no lock for one.
static CHANNEL_COUNT: AtomicUsize = AtomicUsize::new(0);

/// How many times a channel published a new async call (`last_unanswered`), bumped after
/// the store: a thread that launches while the process's other threads are idle (PyTorch's
/// main thread beside its autograd thread) reads it and finds nothing to name, instead of
/// taking [`CHANNELS`]' lock and scanning each call.
static PUBLISHED: AtomicU64 = AtomicU64::new(0);

/// Change the list of channels, keeping [`CHANNEL_COUNT`].
fn with_channels(f: impl FnOnce(&mut Vec<Arc<ChannelShared>>)) {
    let mut channels = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut channels);
    CHANNEL_COUNT.store(channels.len(), Ordering::Release);
}

/// Set when the router no longer knows this process's session: reconnecting is pointless.
static SESSION_GONE: AtomicBool = AtomicBool::new(false);

/// Set while the router says the session's process is being checkpointed (`phosctl
/// checkpoint --process`): calls wait for the session without a deadline (the process may
/// be dumped meanwhile and restored much later), holding no connection.
static PARKED: AtomicBool = AtomicBool::new(false);

/// How long a thread awaiting an answer spins (`PHOS_SYNC_SPIN_US`).
static SYNC_SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// Call ids, unique in the process (across channels), so the server can tell which async
/// calls a barrier names.
static NEXT_CALL_ID: AtomicU64 = AtomicU64::new(1);

/// Async calls a channel may have unanswered before the next one waits for an
/// acknowledgement: the depth of the launch queue, as on a GPU whose queue is full. The
/// server acknowledges at least every 256 async calls, so a few acknowledgement frames are
/// all that can be waiting for the guest to read them.
const MAX_UNANSWERED: usize = 1024;

impl Drop for Channel {
    fn drop(&mut self) {
        // The thread is ending: wait until its async calls have run (a synchronous call
        // brings their acknowledgement), so no other thread's synchronising call has to
        // name this channel's calls in a barrier.
        // (Not in a forked child: the connection is its parent's.)
        if !self.shared.unanswered().is_empty() && self.session.pid == std::process::id() {
            let mut request = Vec::new();
            phos_protocol::encode_reply(&cudart::CudaGetDeviceCountRequest {}, &mut request);
            let id = NEXT_CALL_ID.fetch_add(1, Ordering::Relaxed);
            let _ = attempt::<cudart::CudaGetDeviceCountRequest>(self, &request, id, false);
        }
        self.shared.last_unanswered.store(0, Ordering::Release);
        with_channels(|channels| {
            retire(&self.shared);
            channels.retain(|c| !Arc::ptr_eq(c, &self.shared));
        });
    }
}

impl Channel {
    /// Receive one frame that is not the answer to a synchronous call: device output is
    /// written, an async call's answer retires it (its error becomes the thread's last
    /// error, where CUDA would have put it). Returns the header of anything else.
    fn receive_one(&mut self) -> Result<Option<FrameHeader>, String> {
        let h = self.transport.recv(&mut self.reply).map_err(|e| e.to_string())?;
        if h.kind == FrameKind::Output {
            write_device_output(&self.reply);
            return Ok(None);
        }
        if h.kind == FrameKind::Reply && h.flags & FLAG_ASYNC != 0 {
            // An acknowledgement of every async call up to `call_id`, in the order they were
            // sent (ids grow along a channel, but calls taken over from a lost channel, sent
            // after this channel's own, may be older).
            let mut unanswered = self.shared.unanswered();
            if let Some(k) = unanswered.iter().position(|u| u.call_id == h.call_id) {
                unanswered.drain(..=k);
            } else {
                while unanswered.front().is_some_and(|u| u.call_id <= h.call_id) {
                    unanswered.pop_front();
                }
            }
            let last = unanswered.back().map_or(0, |u| u.call_id);
            drop(unanswered);
            if h.status != cudart::SUCCESS {
                tracing::debug!("an async call failed: {}", h.status);
                note_status(CudaError(h.status));
                set_last_error(CudaError(h.status));
            }
            self.shared.last_unanswered.store(last, Ordering::Release);
            return Ok(None);
        }
        // The answer of a call that returned before it came (a staged copy on its counts, an
        // answer posted in the staging region).
        if h.kind == FrameKind::Reply && h.flags == 0 && self.detached.front() == Some(&h.call_id) {
            self.detached.pop_front();
            if h.status != cudart::SUCCESS {
                // Never what a server does once the copy's last count is set, or after it
                // posted a call's answer (only successes are posted).
                tracing::error!("a call that had returned was answered {}", h.status);
                note_status(CudaError(h.status));
                set_last_error(CudaError(h.status));
            }
            return Ok(None);
        }
        // An async call the router refused (it answers each one it refuses).
        if h.kind == FrameKind::Reply && h.flags & FLAG_REFUSED != 0 {
            let mut unanswered = self.shared.unanswered();
            if let Some(i) = unanswered.iter().position(|u| u.call_id == h.call_id) {
                unanswered.remove(i);
            }
            let last = unanswered.back().map_or(0, |u| u.call_id);
            drop(unanswered);
            tracing::debug!("an async call was refused: {}", h.status);
            note_status(CudaError(h.status));
            set_last_error(CudaError(h.status));
            self.shared.last_unanswered.store(last, Ordering::Release);
            return Ok(None);
        }
        Ok(Some(h))
    }

    /// Spin up to `spin` for call `call_id`'s answer: posted in the staging region
    /// ([`Staging::take_answer`], the payload then in `self.reply`), or arriving on the ring
    /// (the frames before it taken in as [`receive_one`](Self::receive_one) does).
    fn spin_for_posted(&mut self, call_id: u64, spin: Duration) -> Posted {
        let until = Instant::now() + spin;
        let mut turns = 0u32;
        loop {
            if self.staging.as_ref().is_some_and(|st| st.take_answer(call_id, &mut self.reply)) {
                return Posted::Taken;
            }
            if self.transport.readable() {
                match self.receive_one() {
                    Ok(None) => continue,
                    Ok(Some(h)) => return Posted::Frame(h),
                    Err(e) => return Posted::Lost(e),
                }
            }
            turns += 1;
            if turns.is_multiple_of(64) && Instant::now() >= until {
                return Posted::NotYet;
            }
            std::hint::spin_loop();
        }
    }

    /// Retire the answers that have already arrived, without waiting.
    fn collect_answers(&mut self) -> Result<(), String> {
        while !self.shared.unanswered().is_empty() && self.transport.readable() {
            if let Some(h) = self.receive_one()? {
                return Err(format!("unexpected {:?} frame for call {}", h.kind, h.call_id));
            }
        }
        Ok(())
    }

    /// Send a call frame.
    fn send_call(
        &mut self,
        function: Function,
        device: i32,
        call_id: u64,
        flags: u16,
        request: &[u8],
    ) -> Result<(), String> {
        let mut h = FrameHeader::new(FrameKind::Call);
        h.api = function.api().id();
        // A synchronous function sent without waiting goes under its async id.
        h.function = match function.info().async_id {
            Some(id) if flags & FLAG_ASYNC != 0 => id,
            _ => function.id(),
        };
        h.device = device;
        h.session = self.session.id;
        h.call_id = call_id;
        h.flags = flags;
        h.payload_len = request.len() as u64;
        self.transport.send(&h, &[request]).map_err(|e| e.to_string())
    }

    /// After a reconnect: send the async calls the lost connection never answered again,
    /// in their order, flagged as resent: some may have run (answered in a batch that never
    /// came), and the session, whose image says which, acknowledges those without running
    /// them twice.
    fn resend_unanswered(&mut self) -> Result<(), String> {
        // Calls of this thread that another channel sent again first: what follows runs
        // after them.
        let after = std::mem::take(&mut self.resend_after);
        if after != 0 {
            self.send_barrier_ids(&[after])?;
        }
        // With the calls of lost channels (threads that may not call again soon), all in call
        // order: ids are the process's issue order, so a call another thread made before one
        // of these, and synchronised with, is never behind it.
        let channels = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
        let adopted = self.adopt_lost(&channels);
        drop(channels);
        if !adopted.is_empty() {
            tracing::info!(
                count = adopted.len(),
                "sending again the async calls of threads whose connections the session's restore cut"
            );
        }
        let mut pending: Vec<Unanswered> =
            std::mem::take(&mut *self.shared.unanswered()).into_iter().chain(adopted).collect();
        pending.sort_by_key(|u| u.call_id);
        self.unsent_adopted = 0;
        if let (Some(first), Some(last)) = (pending.first(), pending.last()) {
            tracing::debug!(
                count = pending.len(),
                first = first.call_id,
                last = last.call_id,
                "resending unanswered async calls"
            );
        }
        let sent = pending
            .iter()
            .try_for_each(|u| self.send_call(u.function, u.device, u.call_id, FLAG_ASYNC | FLAG_RESENT, &u.request));
        // Kept whatever happened: a failure here is another lost connection.
        let last = pending.last().map_or(0, |u| u.call_id);
        *self.shared.unanswered() = pending.into();
        self.shared.last_unanswered.store(last, Ordering::Release);
        sent
    }

    /// Take over the unanswered async calls of the process's channels whose connections are
    /// gone (connected in an earlier epoch of the session than this one): their threads may
    /// not call again for a long time (idle, waiting for another thread), and another
    /// thread's barrier may name their calls. Each lost channel keeps the last id taken
    /// (`adopted_up_to`), which its own thread's next channel waits for before it sends
    /// anything again; no other thread names them in a barrier (its last unanswered call
    /// is none now: this channel's is).
    fn adopt_lost(&self, channels: &[Arc<ChannelShared>]) -> Vec<Unanswered> {
        let mut adopted = Vec::new();
        for c in channels.iter().filter(|c| c.epoch < self.shared.epoch) {
            let mut calls = c.unanswered();
            if let Some(last) = calls.back() {
                c.adopted_up_to.fetch_max(last.call_id, Ordering::AcqRel);
                adopted.extend(calls.drain(..));
                c.last_unanswered.store(0, Ordering::Release);
            }
        }
        adopted.sort_by_key(|u| u.call_id);
        adopted
    }

    /// Send the calls [`Channel::unnamed_calls`] took over from lost channels (the last
    /// `unsent_adopted` of this channel's unanswered calls), flagged as resent: the session
    /// acknowledges those that ran before its image without running them again. They were
    /// kept with this channel's calls when taken, so a lost connection sends them again too.
    fn send_adopted(&mut self) -> Result<(), String> {
        if self.unsent_adopted == 0 {
            return Ok(());
        }
        let shared = self.shared.clone();
        let unanswered = shared.unanswered();
        let from = unanswered.len().saturating_sub(self.unsent_adopted);
        tracing::info!(
            count = unanswered.len() - from,
            "sending again the async calls of threads whose connections the session's restore cut"
        );
        for u in unanswered.iter().skip(from) {
            self.send_call(u.function, u.device, u.call_id, FLAG_ASYNC | FLAG_RESENT, &u.request)?;
        }
        self.unsent_adopted = 0;
        Ok(())
    }

    /// The other channels' last unanswered async calls that this channel has not named in a
    /// barrier yet (none on the callback thread, see [`without_barriers`], and none while the
    /// process has one channel). Call it before this channel publishes a new async call of
    /// its own (`last_unanswered`): two threads sending async calls at once then cannot both
    /// name the other's new call, so barriers never wait in a circle (a barrier names only
    /// calls whose own barriers were taken before it).
    fn unnamed_calls(&mut self) -> Vec<u64> {
        if WITHOUT_BARRIERS.get() || CHANNEL_COUNT.load(Ordering::Acquire) <= 1 {
            return Vec::new();
        }
        // Read before the scan: a call published during it is looked at next time.
        let published = PUBLISHED.load(Ordering::Acquire);
        if published == self.seen {
            return Vec::new();
        }
        let channels = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
        let adopted = self.adopt_lost(&channels);
        if !adopted.is_empty() {
            // Kept at once, to be sent next (before the barrier): whatever happens to the
            // connection, they are not lost with this scan.
            self.unsent_adopted += adopted.len();
            let mut own = self.shared.unanswered();
            own.extend(adopted);
            let last = own.back().map_or(0, |u| u.call_id);
            drop(own);
            self.shared.last_unanswered.store(last, Ordering::Release);
        }
        let others = channels
            .iter()
            .filter(|c| !Arc::ptr_eq(c, &self.shared))
            .map(|c| (Arc::as_ptr(c) as usize, c.last_unanswered.load(Ordering::Acquire)));
        let ids = name_new(&mut self.named, others);
        if ids.len() < MAX_BARRIER_IDS {
            // Everything new was named (a full barrier may have left some for next time).
            self.seen = published;
        }
        if self.named.len() >= channels.len() {
            // Channels that ended (an address may come back for a new channel, whose call ids
            // are new: at worst one is named needlessly).
            self.named.retain(|(k, _)| channels.iter().any(|c| Arc::as_ptr(c) as usize == *k));
        }
        ids
    }

    /// Tell the server to run the async calls `ids` (of other channels) before this
    /// channel's next frame.
    fn send_barrier_for(&mut self, ids: &[u64]) -> Result<(), String> {
        // What the scan took over from lost channels goes first (the barrier's ids may be
        // among them).
        self.send_adopted()?;
        self.send_barrier_ids(ids)
    }

    /// A barrier frame naming `ids` (none: nothing sent).
    fn send_barrier_ids(&mut self, ids: &[u64]) -> Result<(), String> {
        if ids.is_empty() {
            return Ok(());
        }
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        let mut h = FrameHeader::new(FrameKind::Barrier);
        h.session = self.session.id;
        h.payload_len = bytes.len() as u64;
        self.transport.send(&h, &[&bytes]).map_err(|e| e.to_string())
    }

    /// Before a synchronous call: if other channels have async calls in flight that this
    /// channel has not waited for yet, tell the server to run them first.
    fn send_barrier(&mut self) -> Result<(), String> {
        let ids = self.unnamed_calls();
        self.send_barrier_for(&ids)
    }
}

/// The calls of `others` (each channel's key and last unanswered async call, 0: none) that
/// `named` (what this channel's barriers named, by channel) does not have yet, at most
/// [`MAX_BARRIER_IDS`]; `named` takes them.
fn name_new(named: &mut Vec<(usize, u64)>, others: impl Iterator<Item = (usize, u64)>) -> Vec<u64> {
    let mut ids = Vec::new();
    for (key, id) in others {
        if id == 0 || ids.len() >= MAX_BARRIER_IDS {
            continue;
        }
        match named.iter_mut().find(|(k, _)| *k == key) {
            Some((_, last)) if *last == id => {}
            Some((_, last)) => {
                *last = id;
                ids.push(id);
            }
            None => {
                named.push((key, id));
                ids.push(id);
            }
        }
    }
    ids
}

thread_local! {
    static CHANNEL: RefCell<Option<Channel>> = const { RefCell::new(None) };
    static LAST_ERROR: Cell<i32> = const { Cell::new(0) };
    static CURRENT_DEVICE: Cell<i32> = const { Cell::new(0) };
    static WITHOUT_BARRIERS: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread has called the runtime API (not counting the driver API's own use
    /// of it), and whether a driver API call is using it right now.
    static RUNTIME_HERE: Cell<bool> = const { Cell::new(false) };
    static BRIDGING: Cell<bool> = const { Cell::new(false) };
}

/// This thread's synchronous calls do not wait for other threads' async calls (no barrier).
/// For the callback thread: its calls concern host-function gates only, and other threads'
/// work may itself be waiting at a gate it is to open.
pub fn without_barriers() {
    WITHOUT_BARRIERS.set(true);
}

/// The session of this process (`None` until the first call, or after a fork).
static SESSION: Mutex<Option<Arc<Session>>> = Mutex::new(None);
/// Calls made by this process (for diagnostics).
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Where the session moved (a live migration to another router): the router it was on
/// said so when a channel reconnected, and every channel reconnects there from then on.
static MOVED_TO: Mutex<Option<String>> = Mutex::new(None);

/// Set while the session has moved beyond the VM's reach and the VM is to follow it (phosctl
/// vm-migrate): a router then answers a handshake at once (the session moved, or here it is),
/// so one over TCP that gets no answer within [`FOLLOWING_HANDSHAKE`] was cut by the VM's
/// switch (its answer stayed in the source QEMU's user network) and is given up.
static FOLLOWING_VM: AtomicBool = AtomicBool::new(false);

/// How long a TCP handshake waits for its answer while [`FOLLOWING_VM`].
const FOLLOWING_HANDSHAKE: Duration = Duration::from_millis(500);

/// How many times in a row a channel follows a router's word that its session moved.
const MAX_MOVES: usize = 8;

/// Where channels are opened, in the order they are tried: where the session moved, else
/// `PHOS_ENDPOINT`, a comma-separated list (`vsock:2:7070,tcp:10.0.2.100:7000` in a VM whose
/// vsock device may be away while it migrates: the second leads to the same router through
/// QEMU's user networking).
fn endpoints() -> Result<Vec<Endpoint>, Failure> {
    let moved = MOVED_TO.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let text = moved.unwrap_or_else(|| std::env::var("PHOS_ENDPOINT").unwrap_or_else(|_| default_endpoint()));
    parse_endpoints(&text).map_err(|e| {
        tracing::error!("PHOS_ENDPOINT: {e}");
        Failure::NoDevice
    })
}

fn parse_endpoints(text: &str) -> Result<Vec<Endpoint>, String> {
    let list =
        text.split(',').map(str::trim).filter(|e| !e.is_empty()).map(Endpoint::parse).collect::<Result<Vec<_>, _>>()?;
    if list.is_empty() {
        return Err("no endpoint given".into());
    }
    Ok(list)
}

/// Where `phosctl serve` listens by default.
pub fn default_endpoint() -> String {
    match std::env::var("XDG_RUNTIME_DIR") {
        Ok(dir) => format!("unix:{dir}/phos/router.sock"),
        Err(_) => "unix:/run/phos/router.sock".to_string(),
    }
}

/// `PHOS_TRANSPORT`: which transport a channel uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TransportChoice {
    /// Shared memory when the router offers it, else the socket (the default).
    Auto,
    Unix,
    /// Shared memory or nothing.
    Shm,
}

fn wanted_transport() -> Result<TransportChoice, Failure> {
    match std::env::var("PHOS_TRANSPORT").as_deref() {
        Err(_) | Ok("") | Ok("auto") => Ok(TransportChoice::Auto),
        Ok("unix") => Ok(TransportChoice::Unix),
        Ok("shm") => Ok(TransportChoice::Shm),
        Ok(other) => {
            tracing::error!("PHOS_TRANSPORT={other}: expected auto, unix or shm");
            Err(Failure::NoDevice)
        }
    }
}

fn program_name() -> String {
    std::env::args().next().unwrap_or_default()
}

/// Open a channel: the first one of the process creates the session. A router whose
/// session moved away names where it went; the channel is opened there.
fn open_channel() -> Result<Channel, Failure> {
    for _ in 0..MAX_MOVES {
        match open_channel_once() {
            Err(Opened::Moved(to)) if in_a_vm() && !to.starts_with("vsock:") => {
                // Inside a VM the host's sockets are out of reach: the VM moves with its
                // session (phosctl vm-migrate), and this endpoint leads to the session's
                // router once it has. The caller retries here.
                tracing::info!("the session moved to {to}, beyond this VM's reach; waiting for the VM to follow");
                FOLLOWING_VM.store(true, Ordering::Relaxed);
                return Err(Failure::NoDevice);
            }
            Err(Opened::Moved(to)) => {
                tracing::info!("the session moved to {to}; reconnecting there");
                *MOVED_TO.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
            }
            Err(Opened::Failed(f)) => return Err(f),
            Ok(c) => return Ok(c),
        }
    }
    tracing::error!("the session moved {MAX_MOVES} times while this channel reconnected");
    Err(Failure::NoDevice)
}

/// Whether this process reaches Phos over vsock (it runs in a VM): any of its endpoints is
/// one, whichever its channels use now.
fn in_a_vm() -> bool {
    endpoints().is_ok_and(|list| list.iter().any(|e| matches!(e, Endpoint::Vsock { .. })))
}

/// Why a channel did not open.
enum Opened {
    Failed(Failure),
    /// The router said the session moved there.
    Moved(String),
}

impl From<Failure> for Opened {
    fn from(f: Failure) -> Self {
        Opened::Failed(f)
    }
}

/// What a channel's opening says of a `REFUSED_PARKED` answer.
const PARKED_REFUSAL: &str = "the session's process is being checkpointed";

/// Connect to the first endpoint of `list` that answers (a vsock device that is away, a
/// network that is down: the next is tried); the endpoint and its transport.
fn connect_first(
    list: &[Endpoint],
    socket: &mut Option<std::os::unix::net::UnixStream>,
    tcp: &mut Option<std::net::TcpStream>,
) -> Result<(Endpoint, Box<dyn Transport>), Failure> {
    let mut failures = Vec::new();
    let in_vm = list.iter().any(|e| matches!(e, Endpoint::Vsock { .. }));
    for endpoint in list {
        let connected: std::io::Result<Box<dyn Transport>> = match endpoint {
            Endpoint::Unix(path) => std::os::unix::net::UnixStream::connect(path).and_then(|s| {
                *socket = Some(s.try_clone()?);
                Ok(Box::new(UnixTransport::new(s)) as Box<dyn Transport>)
            }),
            Endpoint::Tcp(addr) => connect_tcp(addr, in_vm, tcp).map(|t| Box::new(t) as Box<dyn Transport>),
            // Inside a VM: the hypervisor's vmm-device carries the stream to the router. Like
            // TCP, no shared memory crosses it (the pinned arena stays the guest's own).
            Endpoint::Vsock { cid, port } => {
                VsockTransport::connect(*cid, *port).map(|t| Box::new(t) as Box<dyn Transport>)
            }
        };
        match connected {
            Ok(t) => {
                if !failures.is_empty() {
                    tracing::info!("reached the Phos router at {endpoint} (not at {})", failures.join(", "));
                }
                return Ok((endpoint.clone(), t));
            }
            Err(e) => failures.push(format!("{endpoint}: {e}")),
        }
    }
    tracing::error!("cannot reach the Phos router at {}", failures.join(", "));
    Err(Failure::NoDevice)
}

/// A TCP channel. In a VM (its TCP endpoint is QEMU's user network, whose connections do
/// not move with the VM), with keep-alive probes after a second of silence: a connection
/// the VM's migration cut while the guest waited for an answer (a handshake in flight when
/// the VM stopped) is answered with a reset by the destination's user network, and found
/// dead, instead of being waited on for ever.
/// `handle`: the stream again, to lift a handshake's deadline ([`FOLLOWING_VM`]) once it is
/// done.
fn connect_tcp(addr: &str, in_vm: bool, handle: &mut Option<std::net::TcpStream>) -> std::io::Result<TcpTransport> {
    let stream = std::net::TcpStream::connect(addr)?;
    // Calls are small and answered at once: no Nagle delay.
    stream.set_nodelay(true)?;
    if in_vm {
        let probes = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(1))
            .with_interval(Duration::from_secs(1))
            .with_retries(2);
        socket2::SockRef::from(&stream).set_tcp_keepalive(&probes)?;
        if FOLLOWING_VM.load(Ordering::Relaxed) {
            stream.set_read_timeout(Some(FOLLOWING_HANDSHAKE))?;
            *handle = Some(stream.try_clone()?);
        }
    }
    Ok(TcpTransport::new(stream))
}

fn open_channel_once() -> Result<Channel, Opened> {
    crate::log::init();
    let pid = crate::pid::current();
    // Holding the lock while the first channel handshakes makes concurrent first calls from
    // several threads join one session instead of opening several.
    let mut guard = SESSION.lock().unwrap_or_else(|p| p.into_inner());
    if guard.as_ref().is_some_and(|s| s.pid != pid) {
        // A forked child does not share its parent's session, nor its channels' async calls.
        *guard = None;
        with_channels(|channels| {
            channels.iter().for_each(|c| retire(c));
            channels.clear();
        });
    }
    let wanted = wanted_transport()?;
    // The socket of a Unix channel is kept aside: the pinned arena goes over it after the Hello.
    let mut socket = None;
    let mut tcp = None;
    let (endpoint, mut transport) = connect_first(&endpoints()?, &mut socket, &mut tcp)?;
    let local = matches!(endpoint, Endpoint::Unix(_));
    if !local && wanted == TransportChoice::Shm {
        tracing::error!("PHOS_TRANSPORT=shm needs a router on this host (a unix: endpoint), not {endpoint}");
        return Err(Failure::NoDevice.into());
    }
    let shm_wanted = local && matches!(wanted, TransportChoice::Auto | TransportChoice::Shm);
    let arena = if shm_wanted { crate::hostmem::arena_for_channel() } else { None };
    let hello = Hello {
        apis: ApiVersion::of_this_build(),
        pid,
        abi_major: crate::soname::current_abi().major(),
        token: guard.as_ref().map(|s| s.token),
        program: program_name(),
        transports: if shm_wanted { vec![TransportKind::Shm] } else { Vec::new() },
        tenant_token: std::env::var("PHOS_TENANT_TOKEN").ok().filter(|t| !t.is_empty()),
        host_arena: arena.map(|(_, len)| len),
    };
    let payload = phos_protocol::encode(&hello);
    let mut h = FrameHeader::new(FrameKind::Hello);
    h.version = HANDSHAKE_VERSION;
    h.payload_len = payload.len() as u64;
    let mut reply = Vec::new();
    // A refusal carries the error the call gets (a limit of the router's: devices busy), or
    // none (no device for this process).
    let mut refused_with = Failure::NoDevice;
    // Where the session went, if the router says it moved.
    let mut moved = None;
    // A router that refuses the Hello closes the connection, so sending the arena after it
    // can fail: its refusal, still there to be read, says why.
    let mut arena_sent = Ok(());
    let welcome = transport
        .send(&h, &[&payload])
        .map(|_| {
            if let (Some((fd, _)), Some(s)) = (arena, &socket) {
                arena_sent = phos_protocol::shm::send_fd(s, fd);
            }
        })
        .map_err(|e| e.to_string())
        .and_then(|_| transport.recv(&mut reply).map_err(|e| e.to_string()))
        .and_then(|rh| match arena_sent {
            Err(e) if rh.kind != FrameKind::Refused => Err(format!("sending the pinned arena: {e}")),
            _ => Ok(rh),
        })
        .and_then(|rh| match rh.kind {
            FrameKind::Welcome => phos_protocol::decode::<Welcome>(&reply).map_err(|e| e.to_string()),
            FrameKind::Refused if rh.status == REFUSED_MOVED => {
                moved = Some(String::from_utf8_lossy(&reply).into_owned());
                Err("the session moved".into())
            }
            FrameKind::Refused if rh.status == REFUSED_PARKED => Err(PARKED_REFUSAL.into()),
            FrameKind::Refused => {
                if rh.status != 0 {
                    refused_with = Failure::Status(rh.status);
                }
                Err(phos_protocol::text::printable(&String::from_utf8_lossy(&reply)))
            }
            other => Err(format!("unexpected {other:?} frame")),
        })
        .map_err(|e| {
            if let Some(to) = moved.take().filter(|to| Endpoint::parse(to).is_ok()) {
                return Opened::Moved(to);
            }
            if e == PARKED_REFUSAL {
                if !PARKED.swap(true, Ordering::Relaxed) {
                    tracing::info!("the session's process is being checkpointed; its calls wait for the session");
                }
                return Opened::Failed(Failure::NoDevice);
            }
            tracing::error!("the Phos router at {endpoint} refused the session: {e}");
            if e == "unknown session" {
                // The router has ended the session (its API server is gone): no restore
                // will bring it back, so calls stop waiting for one.
                SESSION_GONE.store(true, Ordering::Relaxed);
            }
            Opened::Failed(refused_with)
        })?;
    if let Some(t) = tcp {
        // Welcomed: from here an answer may take as long as its call.
        t.set_read_timeout(None).map_err(|e| {
            tracing::error!("lifting the handshake's deadline: {e}");
            Failure::NoDevice
        })?;
    }
    FOLLOWING_VM.store(false, Ordering::Relaxed);
    if PARKED.swap(false, Ordering::Relaxed) {
        tracing::info!("the session is back after its process's checkpoint");
    }
    let mut staging = None;
    let transport: Box<dyn Transport> = match welcome.transport {
        TransportKind::Shm => {
            let stream = transport.into_unix().map_err(|e| {
                tracing::error!("the router offered shared memory over a {endpoint} channel: {e}");
                Failure::NoDevice
            })?;
            let (shm, files) = ShmTransport::attach(stream, DEFAULT_MAX_PAYLOAD).map_err(|e| {
                tracing::error!("cannot map the shared region the router sent: {e}");
                Failure::NoDevice
            })?;
            staging = files.staging.map(Arc::new);
            Box::new(shm)
        }
        TransportKind::Unix if wanted == TransportChoice::Shm => {
            tracing::error!("PHOS_TRANSPORT=shm, but the router at {endpoint} does not offer shared memory");
            return Err(Failure::NoDevice.into());
        }
        TransportKind::Unix | TransportKind::Tcp | TransportKind::Vsock => transport,
    };
    let session = match guard.as_ref() {
        Some(s) if s.id == welcome.session => {
            if s.epoch.swap(welcome.epoch, Ordering::Relaxed) != welcome.epoch {
                // The session was restored: values cached from the old server may be stale.
                tracing::info!(session = s.id, epoch = welcome.epoch, "session restored; carrying on");
                crate::registry::forget_variable_addresses();
            }
            s.clone()
        }
        _ => {
            let s = Arc::new(Session {
                id: welcome.session,
                token: welcome.token,
                backend: welcome.backend,
                device_base: welcome.device_base,
                device_size: welcome.device_size,
                device_count: welcome.device_count,
                max_payload: welcome.max_payload,
                epoch: AtomicU64::new(welcome.epoch),
                pid,
            });
            tracing::debug!(session = s.id, backend = %s.backend, transport = welcome.transport.name(), "session opened");
            *guard = Some(s.clone());
            s
        }
    };
    let shared = Arc::new(ChannelShared { epoch: welcome.epoch, ..ChannelShared::default() });
    with_channels(|channels| channels.push(shared.clone()));
    // A thread starting to call CUDA (or a forked child's first) is a moment to look for
    // foreign CUDA libraries again.
    crate::bypass::look_soon();
    Ok(Channel {
        transport,
        session,
        reply,
        shared,
        staging,
        named: Vec::new(),
        seen: 0,
        resend_after: 0,
        unsent_adopted: 0,
        detached: VecDeque::new(),
    })
}

/// Run `f` with this thread's channel, opening it first if needed.
fn with_channel<T>(f: impl FnOnce(&mut Channel) -> Result<T, Failure>) -> Result<T, Failure> {
    let mut f = Some(f);
    let on_thread = CHANNEL.try_with(|cell| {
        let mut slot = cell.borrow_mut();
        let pid = crate::pid::current();
        if slot.as_ref().is_some_and(|c| c.session.pid != pid) {
            // Inherited across fork: the socket belongs to the parent's session.
            slot.take();
        }
        if slot.is_none() {
            *slot = Some(open_channel()?);
        }
        (f.take().expect("called once"))(slot.as_mut().expect("just opened"))
    });
    match on_thread {
        Ok(r) => r,
        // The thread's storage is already torn down (calls from exit handlers): use a
        // channel for this call only.
        Err(_) => (f.take().expect("not called"))(&mut open_channel()?),
    }
}

/// The session, opening it if this is the first call of the process. Only the runtime API
/// asks for it, and its first use initialises the driver API too, as NVIDIA's runtime does.
pub fn session() -> Result<Arc<Session>, Failure> {
    set_driver_initialized();
    if let Some(s) = SESSION.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
        && s.pid == crate::pid::current()
    {
        return Ok(s.clone());
    }
    with_channel(|c| Ok(c.session.clone()))
}

/// Whether the router has said the session ended (its API server is gone): no call will be
/// served again.
pub fn session_ended() -> bool {
    SESSION_GONE.load(Ordering::Relaxed)
}

/// The session if one is open (never connects).
pub fn session_if_open() -> Option<Arc<Session>> {
    SESSION.lock().unwrap_or_else(|p| p.into_inner()).as_ref().filter(|s| s.pid == crate::pid::current()).cloned()
}

/// Why a call did not complete on the channel it was sent on.
enum Attempt<T> {
    Done(Result<T, Failure>),
    /// The connection is gone (the server ended, or the session moved): the call was not
    /// answered and can be sent again on a new channel.
    Lost(String),
}

/// Send a synchronous call and wait for its answer. `resend`: the call goes again, with the
/// id it had, after a lost connection: the async calls left unanswered go first, and the call
/// is flagged as resent, so that a server that ran it already (its answer was lost with the
/// connection) answers with the reply it kept instead of running it twice.
fn attempt<R: RemoteCall>(ch: &mut Channel, request: &[u8], call_id: u64, resend: bool) -> Attempt<R::Reply> {
    let device = current_device();
    let sent = if resend { ch.resend_unanswered() } else { Ok(()) }
        .and_then(|_| ch.send_barrier())
        .and_then(|_| ch.send_call(R::FUNCTION, device, call_id, if resend { FLAG_RESENT } else { 0 }, request));
    if let Err(e) = sent {
        return Attempt::Lost(e);
    }
    // This thread waits for the answer: spin through a call of a millisecond or two.
    let spin = *SYNC_SPIN.get_or_init(phos_protocol::shm::default_sync_spin);
    // First on the answer the server may post in the staging region too, one hop sooner
    // than its frame (taken in later, as a detached answer).
    let mut arrived = None;
    if !spin.is_zero() && ch.staging.is_some() && ch.detached.len() < MAX_DETACHED && takes_posted_answers() {
        match ch.spin_for_posted(call_id, spin) {
            Posted::Taken => {
                ch.detached.push_back(call_id);
                crate::profile::posted_answer();
                return Attempt::Done(phos_protocol::decode::<R::Reply>(&ch.reply).map_err(|e| {
                    tracing::error!("undecodable posted answer to {}: {e}", R::FUNCTION.name());
                    Failure::Internal
                }));
            }
            Posted::Frame(rh) => arrived = Some(rh),
            Posted::Lost(e) => return Attempt::Lost(e),
            Posted::NotYet => {}
        }
    }
    ch.transport.expect_frame_within(spin);
    // Answers to this channel's earlier async calls come first, in order.
    let rh = match arrived {
        Some(rh) => rh,
        None => loop {
            match ch.receive_one() {
                Ok(None) => continue,
                Ok(Some(rh)) => break rh,
                Err(e) => return Attempt::Lost(e),
            }
        },
    };
    if rh.kind != FrameKind::Reply || rh.call_id != call_id {
        return Attempt::Lost(format!("unexpected {:?} frame for call {}", rh.kind, rh.call_id));
    }
    if rh.status != 0 {
        if matches!(R::FUNCTION.api(), phos_protocol::apis::Api::Cudart | phos_protocol::apis::Api::Cuda) {
            note_status(CudaError(rh.status));
        }
        if rh.flags & FLAG_DEFERRED != 0 {
            let failed = String::from_utf8_lossy(&ch.reply);
            tracing::error!(
                "{} returns {} of an earlier asynchronous {failed} on the same handle, which failed when it ran (see the API server's log)",
                R::FUNCTION.name(),
                R::FUNCTION.api().status_name(rh.status)
            );
        }
        return Attempt::Done(Err(Failure::Status(rh.status)));
    }
    Attempt::Done(phos_protocol::decode::<R::Reply>(&ch.reply).map_err(|e| {
        tracing::error!("undecodable reply to {}: {e}", R::FUNCTION.name());
        Failure::Internal
    }))
}

/// How long a call waits for its session to come back (restored after a checkpoint, moved
/// to another server) before it fails.
fn reconnect_timeout() -> Duration {
    let secs = std::env::var("PHOS_RECONNECT_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    Duration::from_secs(secs)
}

/// Send one call and wait for its reply. If the connection is lost, reconnect to the
/// session (with its token: the router holds the channel until the session is back) and
/// send the call again, after the async calls the lost connection left unanswered; the
/// application does not notice. A failure is in the call's API's status codes.
pub fn call<R: RemoteCall>(req: &R) -> Result<R::Reply, R::Status> {
    let started = crate::profile::start();
    let r = call_carried(req).map_err(R::Status::from);
    crate::profile::sync_call(R::FUNCTION, started);
    // Counted once answered, failed or not: see `work_totals` for why not before.
    note_work_of(R::FUNCTION);
    r
}

fn call_carried<R: RemoteCall>(req: &R) -> Result<R::Reply, Failure> {
    crate::bypass::before_call(CALLS.fetch_add(1, Ordering::Relaxed));
    let mut request = Vec::new();
    phos_protocol::encode_reply(req, &mut request);
    if request.len() > (1 << 20) {
        // The router would refuse the frame and close the channel; a retry would meet the
        // same. Fail the call, as CUDA fails a request it cannot take.
        let limit = session()?.max_payload;
        if request.len() as u64 > limit {
            tracing::error!(
                "{}: a request of {} bytes is over the router's limit of {limit} (its max_payload)",
                R::FUNCTION.name(),
                request.len()
            );
            return Err(Failure::InvalidValue);
        }
    }
    let call_id = NEXT_CALL_ID.fetch_add(1, Ordering::Relaxed);
    // A synchronous call is a round trip of microseconds at least: a clock read is cheap
    // beside it, and says how long a call that had to reconnect waited in all.
    let started = Instant::now();
    let mut carried = VecDeque::new();
    let mut carried_after = 0;
    let mut lost = match with_channel(|ch| Ok(attempt::<R>(ch, &request, call_id, false))) {
        Ok(Attempt::Done(r)) => return r,
        Ok(Attempt::Lost(why)) => why,
        // A thread's first call while the process is being checkpointed waits like the rest.
        Err(_) if PARKED.load(Ordering::Relaxed) => PARKED_REFUSAL.to_string(),
        Err(f) => return Err(f),
    };
    let mut deadline = Instant::now() + reconnect_timeout();
    let mut pause = Duration::from_millis(20);
    // In a VM the wait is for the VM's switch to another host (phosctl vm-migrate), after
    // which the next attempt succeeds: retried often, so the call does not sleep long past it.
    let longest_pause = if in_a_vm() { Duration::from_millis(100) } else { Duration::from_secs(1) };
    let mut attempts = 0u32;
    loop {
        tracing::info!("connection to the API server lost during {} ({lost}); reconnecting", R::FUNCTION.name());
        let (calls, after) = drop_channel();
        carried.extend(calls);
        carried_after = carried_after.max(after);
        if PARKED.load(Ordering::Relaxed) {
            // Dumped and restored meanwhile, perhaps: the clock says nothing of how long the
            // session has been away.
            deadline = Instant::now() + reconnect_timeout();
        }
        if Instant::now() >= deadline {
            tracing::error!("the session did not come back; {} fails", R::FUNCTION.name());
            return Err(Failure::SessionLost);
        }
        // The first attempt goes at once: a router holds a channel of a suspended session
        // until its restore, so waiting here only adds to the time to the first served call
        // (20 ms of the 22 ms a restore's first call took). Later attempts back off.
        if attempts > 0 {
            std::thread::sleep(pause);
            pause = (pause * 2).min(longest_pause);
        }
        attempts += 1;
        let attempted = with_channel(|ch| {
            ch.shared.unanswered().extend(carried.drain(..));
            ch.resend_after = ch.resend_after.max(std::mem::take(&mut carried_after));
            Ok(attempt::<R>(ch, &request, call_id, true))
        });
        match attempted {
            Ok(Attempt::Done(r)) => {
                tracing::info!(
                    "{} waited {:.1} ms for its session ({attempts} reconnection attempt(s))",
                    R::FUNCTION.name(),
                    started.elapsed().as_secs_f64() * 1e3
                );
                return r;
            }
            Ok(Attempt::Lost(why)) => lost = why,
            Err(_) if SESSION_GONE.load(Ordering::Relaxed) => {
                tracing::error!("the session has ended at the router; {} fails", R::FUNCTION.name());
                return Err(Failure::SessionLost);
            }
            Err(_) => lost = "the router refused the session".to_string(),
        }
    }
}

/// Send a call the spec marks `async` without waiting for its reply: it returns once the
/// call is on its way (CUDA's "enqueued"). Its answer is collected later, by this thread's
/// next synchronous call or the next async one that finds it arrived; a failure becomes the
/// thread's last error then. Only for calls whose reply carries nothing (`R::Reply` is
/// empty) and whose arguments the caller has vouched for, so that the errors CUDA would
/// return from the call itself cannot happen.
pub fn call_async<R: RemoteCall>(req: &R) -> Result<(), R::Status> {
    crate::profile::async_call(R::FUNCTION);
    let r = call_async_carried(req).map_err(R::Status::from);
    // Counted once sent and published to other threads' barriers: see `work_totals`.
    note_work_of(R::FUNCTION);
    r
}

fn call_async_carried<R: RemoteCall>(req: &R) -> Result<(), Failure> {
    crate::bypass::before_call(CALLS.fetch_add(1, Ordering::Relaxed));
    let mut request = Vec::new();
    phos_protocol::encode_reply(req, &mut request);
    let call_id = NEXT_CALL_ID.fetch_add(1, Ordering::Relaxed);
    let device = current_device();
    let sent = with_channel(|ch| {
        let ready = ch.collect_answers().and_then(|_| {
            while ch.shared.unanswered().len() >= MAX_UNANSWERED {
                if let Some(h) = ch.receive_one()? {
                    return Err(format!("unexpected {:?} frame for call {}", h.kind, h.call_id));
                }
            }
            Ok(())
        });
        // Ordered after the async calls other threads sent before it, as CUDA orders work
        // enqueued on a stream by one thread after work another thread enqueued before (a
        // hand-off through a lock, a queue, a join): the server runs those first. Looked at
        // before this call is published below (see `unnamed_calls`).
        let barrier = ch.unnamed_calls();
        // What the scan took over from lost channels goes first (its lock is not held below).
        let ready = ready.and_then(|_| ch.send_adopted());
        // Kept until it is answered, whatever happens to the connection; kept before it is
        // published, so that a channel taking over this one's calls (after a restore) finds
        // every call another thread's barrier may name.
        let shared = ch.shared.clone();
        let mut own = shared.unanswered();
        own.push_back(Unanswered { call_id, function: R::FUNCTION, device, request });
        // Visible to other threads' barriers before it can reach the server.
        ch.shared.last_unanswered.store(call_id, Ordering::Release);
        let before = PUBLISHED.fetch_add(1, Ordering::AcqRel);
        if before == ch.seen {
            // Nobody else published since this channel last looked: its own call is no news.
            ch.seen = before + 1;
        }
        let request = &own.back().expect("just pushed").request;
        let sent = ready
            .and_then(|_| ch.send_barrier_ids(&barrier))
            .and_then(|_| ch.send_call(R::FUNCTION, device, call_id, FLAG_ASYNC, request));
        Ok(sent)
    })?;
    if let Err(why) = sent {
        // The connection is gone: reconnect now, sending everything unanswered again (a
        // synchronous no-op call carries them).
        tracing::info!("connection lost while sending {} ({why})", R::FUNCTION.name());
        call_carried(&cudart::CudaGetDeviceCountRequest {})?;
    }
    Ok(())
}

/// Library handles (API id, handle) a synchronous call has succeeded on and that were not
/// destroyed since: the calls of their functions that have an async id (`@async_id`) go
/// without waiting.
fn live_handles() -> &'static Mutex<HashSet<(u16, u64)>> {
    static LIVE: OnceLock<Mutex<HashSet<(u16, u64)>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

/// A library call whose only result is its status and whose function has an async id: sent
/// without waiting when its handle is known live here (what the server could refuse that the
/// guest can check, the generated stub has checked: preconditions, pointer mode), else sent
/// synchronously, which proves the handle. A failure of an async one (the vendor library's,
/// or a check only the server can make) is logged by the server and returned by the next
/// synchronous call of the API on the handle (`FLAG_DEFERRED`).
pub fn call_deferred<R: RemoteCall>(req: &R, handle: u64) -> Result<(), R::Status> {
    let key = (R::FUNCTION.api().id(), handle);
    if live_handles().lock().unwrap_or_else(PoisonError::into_inner).contains(&key) {
        return call_async(req);
    }
    call(req)?;
    live_handles().lock().unwrap_or_else(PoisonError::into_inner).insert(key);
    Ok(())
}

/// A call with an async id sent synchronously whatever its handle (what else it names is
/// not known live): its success proves the handle as `call_deferred`'s does.
pub fn call_proving<R: RemoteCall>(req: &R, handle: u64) -> Result<(), R::Status> {
    call(req)?;
    live_handles().lock().unwrap_or_else(PoisonError::into_inner).insert((R::FUNCTION.api().id(), handle));
    Ok(())
}

/// Whether a synchronous call on `handle` of `api` has succeeded and it was not destroyed.
pub fn is_live(api: phos_protocol::apis::Api, handle: u64) -> bool {
    live_handles().lock().unwrap_or_else(PoisonError::into_inner).contains(&(api.id(), handle))
}

/// A handle is being destroyed: its calls wait for their answers again.
pub fn forget_handle(api: phos_protocol::apis::Api, handle: u64) {
    live_handles().lock().unwrap_or_else(PoisonError::into_inner).remove(&(api.id(), handle));
}

/// Why a staged copy stopped moving data before its last chunk.
enum Stopped {
    Staging(StagingError),
    /// Its call was answered (refused) first.
    Answered(FrameHeader),
    Lost(String),
}

/// Host-to-device `cudaMemcpyAsync` copies smaller than this travel in their call's frame:
/// the driver stages pageable memory and returns without waiting for the stream, where a
/// staged copy waits for it.
pub const STAGED_MIN: usize = 256 << 10;

/// Synchronous copies (and device-to-host async ones, which wait for their data anyway) of at
/// least this many bytes move through the staging slots (`PHOS_STAGED_MIN`, bytes; 1 by
/// default: every copy that moves data). Below 256 KiB a copy's bytes used to travel in its
/// call's frame and reply, copied at each ring, through the router both ways and into and out
/// of the server's buffers, which cost as much as the copy itself; through a slot they are
/// copied once by the guest and moved by a DMA of the registered slot.
pub fn staged_small_min() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("PHOS_STAGED_MIN").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(1).max(1)
    })
}

/// A host<->device copy of `count` bytes through the channel's staging region
/// (`phosMemcpyStaged`): the data moves in chunks through two shared slots while the call
/// runs, so neither the frames nor the router carry it. `None` when the channel has no
/// staging region, or its connection was lost (the caller then takes the ordinary path,
/// which reconnects and sends the whole copy).
///
/// Host to device, the first chunk is in its slot and counted filled before the call is
/// sent, so the server finds it there (a small copy is then one round trip and no wait on
/// a count). Device to host, the guest waits for each chunk's count. The server sets the last
/// count once every chunk's copy succeeded, so where waiters spin the copy returns on it when
/// its answer can say nothing more (no device output can come with it, no capture, no sticky
/// error), the answer taken in later (`Channel::detached`). Elsewhere it waits for the answer,
/// and a copy of one chunk device to host on a channel whose waiters do not spin (a small
/// machine) waits for the answer instead of the count, which the server sends after counting
/// the chunk filled: one wake-up rather than two.
///
/// # Safety
/// `host` must point to `count` bytes, readable for host-to-device and writable for
/// device-to-host (the caller's contract with CUDA).
pub unsafe fn staged_copy(
    direction: i32,
    device: u64,
    host: *mut u8,
    count: usize,
    stream: u64,
) -> Option<Result<(), Failure>> {
    let h2d = match direction {
        cudart::consts::cudaMemcpyHostToDevice => true,
        cudart::consts::cudaMemcpyDeviceToHost => false,
        _ => return None,
    };
    let host = host as usize;
    let started = crate::profile::start();
    let outcome = with_channel(|ch| {
        let Some(st) = ch.staging.clone() else { return Ok(None) };
        // Start where the last copy ended; after a copy that was given up, even the counts.
        let (filled, drained) = (st.count(Count::Filled), st.count(Count::Drained));
        if filled != drained {
            let top = if filled.wrapping_sub(drained) < u32::MAX / 2 { filled } else { drained };
            st.set(Count::Filled, top);
            st.set(Count::Drained, top);
        }
        st.clear_abort();
        let seq = st.count(Count::Filled);
        let req =
            cudart::PhosMemcpyStagedRequest { device, count: count as u64, direction, stream, seq: u64::from(seq) };
        CALLS.fetch_add(1, Ordering::Relaxed);
        let mut request = Vec::new();
        phos_protocol::encode_reply(&req, &mut request);
        let call_id = NEXT_CALL_ID.fetch_add(1, Ordering::Relaxed);
        let slot = st.slot_bytes();
        // This thread waits for the call either way: it spins on the counts as it would on
        // the answer (PHOS_SYNC_SPIN_US), rather than sleep after PHOS_SPIN_US while the
        // server moves a chunk and be woken for each.
        let spin = *SYNC_SPIN.get_or_init(phos_protocol::shm::default_sync_spin);
        let n = phos_protocol::staging::chunks(count as u64, slot) as u32;
        // Whether the copy may return on its last count, without its answer (below): only
        // where waiters spin, since a waiter asleep on a count is woken late (it also looks
        // for frames), where one asleep on the ring is woken at once.
        let may_detach = !phos_protocol::shm::default_spin().is_zero()
            && ch.detached.len() < MAX_DETACHED
            && !device_output_seen()
            && crate::cudart::proofs::quiet()
            && work_settled(current_device());
        // Device to host in one chunk without spinning waiters, where the answer is needed:
        // the answer first, then the data.
        let answer_first = !h2d && n == 1 && phos_protocol::shm::default_spin().is_zero() && !may_detach;
        // Wait for the other side's count; a frame arriving meanwhile is looked at: the
        // answers to earlier async calls are taken in, and this call's own answer (the
        // server or the router refused the copy) ends the copy at once.
        let wait = |ch: &mut Channel, c: Count, target: u32| -> Result<(), Stopped> {
            loop {
                match st.wait_or(c, seq, target, spin, || ch.transport.readable()) {
                    Ok(()) => return Ok(()),
                    Err(StagingError::Answered) => match ch.receive_one() {
                        Ok(None) => continue,
                        Ok(Some(rh)) => return Err(Stopped::Answered(rh)),
                        Err(why) => return Err(Stopped::Lost(why)),
                    },
                    Err(e) => return Err(Stopped::Staging(e)),
                }
            }
        };
        // Chunk `k` into or out of its slot.
        let chunk = |ch: &mut Channel, k: u32| -> Result<(), Stopped> {
            let at = k as usize * slot;
            let len = slot.min(count - at);
            let user = (host + at) as *mut u8;
            let slot = st.slot(k);
            let slot = slot.subslice(0, len).expect("a chunk fits its slot");
            if h2d {
                if k >= 2 {
                    wait(ch, Count::Drained, seq.wrapping_add(k - 1))?;
                }
                // SAFETY: `user` is `len` readable bytes of the copy's source (this function's
                // contract); the slot's `len` bytes are mapped while `st` lives (bounds checked
                // by `subslice`). A raw copy, as `vm-memory`'s bulk copies: no reference is
                // made to the slot, which the server may write (by the protocol, not before
                // this chunk is counted filled).
                unsafe { crate::copier::copy(slot.ptr_guard_mut().as_ptr(), user as *const u8, len) };
                st.set(Count::Filled, seq.wrapping_add(k + 1));
            } else {
                if !answer_first {
                    wait(ch, Count::Filled, seq.wrapping_add(k + 1))?;
                }
                // SAFETY: `user` is `len` writable bytes of the copy's destination (this
                // function's contract), apart from the slot; the slot as above (the server
                // leaves it alone until this chunk is counted drained).
                unsafe { crate::copier::copy(user, slot.ptr_guard().as_ptr(), len) };
                st.set(Count::Drained, seq.wrapping_add(k + 1));
            }
            Ok(())
        };
        // Host to device, the first chunk goes before the call (no wait precedes it).
        let first = if h2d && n > 0 { chunk(ch, 0).map(|_| 1) } else { Ok(0) };
        let sent = ch.send_barrier().and_then(|_| {
            let staged = <cudart::PhosMemcpyStagedRequest as RemoteCall>::FUNCTION;
            ch.send_call(staged, current_device(), call_id, 0, &request)
        });
        if let Err(why) = sent {
            tracing::info!("connection lost before a staged copy ({why})");
            return Ok(Some(Err(())));
        }
        // This thread waits for the answer: spin through it, as for any synchronous call.
        ch.transport.expect_frame_within(*SYNC_SPIN.get_or_init(phos_protocol::shm::default_sync_spin));
        let moved = if answer_first { Ok(()) } else { first.and_then(|from| (from..n).try_for_each(|k| chunk(ch, k))) };
        // The server sets a copy's last count only once every chunk's driver copy succeeded,
        // and answers success right after: with the last count seen, the copy is done, and
        // this thread may return without waiting for the answer's way back through the router
        // (half the round trip). Not where the answer may bring device output that the
        // program's own output must follow (kernels not known finished, output seen before),
        // nor while a capture may be open or a sticky error is known (the call's answer then
        // says more than the counts).
        if may_detach && !answer_first && moved.is_ok() {
            // Host to device, the last count is the server's, after the last chunk's copy.
            let done = match (h2d && n > 0).then(|| wait(ch, Count::Drained, seq.wrapping_add(n))) {
                None | Some(Ok(())) => true,
                // The answer came before the count was seen: it is the call's outcome.
                Some(Err(Stopped::Answered(rh))) => {
                    return Ok(Some(match (rh.kind, rh.call_id == call_id, rh.status) {
                        (FrameKind::Reply, true, cudart::SUCCESS) => Ok(Ok(())),
                        (FrameKind::Reply, true, status) => Ok(Err(Failure::Status(status))),
                        _ => Err(()),
                    }));
                }
                Some(Err(Stopped::Lost(why))) => {
                    tracing::info!("connection lost during a staged copy ({why})");
                    return Ok(Some(Err(())));
                }
                // Stopped (the server gave up, or stalled): its answer says why.
                Some(Err(Stopped::Staging(e))) => {
                    tracing::debug!("staged copy stopped: {e}");
                    st.abort();
                    false
                }
            };
            if done {
                ch.detached.push_back(call_id);
                return Ok(Some(Ok(Ok(()))));
            }
        }
        let early = match moved {
            Ok(()) => None,
            Err(stopped) => {
                st.abort();
                match stopped {
                    Stopped::Staging(e) => {
                        tracing::debug!("staged copy stopped: {e}");
                        None
                    }
                    Stopped::Answered(rh) => Some(rh),
                    Stopped::Lost(why) => {
                        tracing::info!("connection lost during a staged copy ({why})");
                        return Ok(Some(Err(())));
                    }
                }
            }
        };
        // The reply comes after the answers to this channel's earlier async calls; where the
        // server posts it in the region too, the copy returns on that (it is done: only a
        // success is posted, after the last count).
        let mut arrived = None;
        if early.is_none()
            && !answer_first
            && !spin.is_zero()
            && ch.detached.len() < MAX_DETACHED
            && takes_posted_answers()
        {
            match ch.spin_for_posted(call_id, spin) {
                Posted::Taken => {
                    ch.detached.push_back(call_id);
                    crate::profile::posted_answer();
                    return Ok(Some(Ok(Ok(()))));
                }
                Posted::Frame(rh) => arrived = Some(rh),
                Posted::Lost(why) => {
                    tracing::info!("connection lost during a staged copy ({why})");
                    return Ok(Some(Err(())));
                }
                Posted::NotYet => {}
            }
        }
        let rh = match early.or(arrived) {
            Some(rh) => rh,
            None => loop {
                match ch.receive_one() {
                    Ok(None) => continue,
                    Ok(Some(rh)) => break rh,
                    Err(why) => {
                        tracing::info!("connection lost during a staged copy ({why})");
                        return Ok(Some(Err(())));
                    }
                }
            },
        };
        if rh.kind != FrameKind::Reply || rh.call_id != call_id {
            return Ok(Some(Err(())));
        }
        if early.is_some() && rh.status == cudart::SUCCESS {
            // Answered as done while data was still to move: never what a server does.
            tracing::error!("a staged copy was answered as done before its data moved");
            return Ok(Some(Ok(Err(Failure::Internal))));
        }
        if rh.status != cudart::SUCCESS {
            return Ok(Some(Ok(Err(Failure::Status(rh.status)))));
        }
        if answer_first {
            // The server counts the chunk filled before it answers (and the answer's way
            // through the rings orders the two), so the count is there.
            if st.count(Count::Filled) != seq.wrapping_add(1) {
                tracing::error!("a staged copy was answered as done before its data was ready");
                st.abort();
                return Ok(Some(Ok(Err(Failure::Internal))));
            }
            // No wait precedes the chunk's copy here, so it cannot stop.
            chunk(ch, 0).ok();
        }
        Ok(Some(Ok(Ok(()))))
    });
    if matches!(outcome, Ok(Some(Ok(_)))) {
        crate::profile::sync_call(<cudart::PhosMemcpyStagedRequest as RemoteCall>::FUNCTION, started);
    }
    match outcome {
        Err(e) => Some(Err(e)),
        Ok(None) => None,
        Ok(Some(Ok(r))) => Some(r),
        // Lost: the ordinary path finds the connection gone too, reconnects, resends the
        // async calls it left unanswered, then the whole copy.
        Ok(Some(Err(()))) => None,
    }
}

/// Forget this thread's channel (its connection is gone); returns the async calls it left
/// unanswered, and the last of its calls another channel took over (0: none).
fn drop_channel() -> (VecDeque<Unanswered>, u64) {
    CHANNEL
        .try_with(|c| c.borrow_mut().take())
        .ok()
        .flatten()
        .map(|mut ch| {
            // Acknowledgements the old server sent before it went (a session frozen for a
            // migration answers what ran first) retire their calls: those must not run twice.
            for _ in 0..MAX_UNANSWERED {
                if ch.shared.unanswered().is_empty()
                    || !ch.transport.wait_readable(Duration::ZERO)
                    || ch.receive_one().is_err()
                {
                    break;
                }
            }
            let mut unanswered = ch.shared.unanswered();
            if let Some(first) = unanswered.front() {
                tracing::debug!(
                    count = unanswered.len(),
                    first = first.call_id,
                    "async calls left unanswered by the lost connection"
                );
            }
            let calls = std::mem::take(&mut *unanswered);
            drop(unanswered);
            (calls, ch.shared.adopted_up_to.load(Ordering::Acquire))
        })
        .unwrap_or_default()
}

unsafe extern "C" {
    /// The C library's `stdout` stream.
    static mut stdout: *mut libc::FILE;
}

/// Device slots of the work counts ([`work_settled`]): devices below `WORK_SLOTS - 1` have
/// their own, the rest share the last, which no synchronisation settles.
const WORK_SLOTS: usize = 16;
/// The two counts a slot keeps: kernels on the legacy default stream of its device, and the
/// rest, counted on every slot.
const ON_LEGACY: usize = 0;
const ELSEWHERE: usize = 1;

/// One channel's work counts: kernels on each device's legacy stream, and all other work that
/// may write what the host reads without a call (kernels on other streams, graphs, library
/// calls, async copies into page-locked memory and memsets of it), whatever its device: a stream or a library
/// handle may be another device's than the thread's. Only the channel's own thread writes
/// them.
#[derive(Default)]
struct WorkCounts {
    on_legacy: [AtomicU64; WORK_SLOTS],
    elsewhere: AtomicU64,
}

impl WorkCounts {
    const fn new() -> Self {
        WorkCounts { on_legacy: [const { AtomicU64::new(0) }; WORK_SLOTS], elsewhere: AtomicU64::new(0) }
    }

    fn of(&self, slot: usize) -> [u64; 2] {
        [self.on_legacy[slot].load(Ordering::Acquire), self.elsewhere.load(Ordering::Acquire)]
    }
}

/// Add one to a count that has one writer at a time (its channel's thread, or a holder of
/// [`CHANNELS`]' lock): no read-modify-write on the launch path.
fn bump(count: &AtomicU64, by: u64) {
    count.store(count.load(Ordering::Relaxed).wrapping_add(by), Ordering::Release);
}

/// The counts of channels that ended, each added (under [`CHANNELS`]' lock) as its channel
/// leaves the list, so that a total never goes back.
static RETIRED: WorkCounts = WorkCounts::new();

/// Per slot, the totals ([`work_totals`]: on the legacy stream, elsewhere) as of the latest
/// synchronisation that settled them: all of that work had finished when it returned.
static SETTLED: [[AtomicU64; 2]; WORK_SLOTS] = [const { [const { AtomicU64::new(0) }; 2] }; WORK_SLOTS];

thread_local! {
    /// The launch this thread is sending is on the legacy default stream ([`launch_on_legacy`]).
    static LAUNCH_ON_LEGACY: Cell<bool> = const { Cell::new(false) };
}

fn work_slot(device: i32) -> usize {
    usize::try_from(device).map_or(WORK_SLOTS - 1, |d| d.min(WORK_SLOTS - 1))
}

/// Add a channel's counts to [`RETIRED`], as it leaves [`CHANNELS`] (under its lock).
fn retire(shared: &ChannelShared) {
    for (r, c) in RETIRED.on_legacy.iter().zip(&shared.work.on_legacy) {
        bump(r, c.load(Ordering::Acquire));
    }
    bump(&RETIRED.elsewhere, shared.work.elsewhere.load(Ordering::Acquire));
}

/// The process's work counts of `slot` (on its legacy stream, elsewhere), totalled over every
/// channel, past and present. Each piece of work is counted after its call was sent and
/// published to other threads' barriers (async), or answered (synchronous): so a
/// synchronisation whose total, read before it was sent, counts a piece of work is ordered
/// after it at the server (its barrier names the async call, or the call had been answered),
/// and one that was in flight meanwhile counts it only later, when the total has grown past
/// what the synchronisation settles.
fn work_totals(slot: usize) -> [u64; 2] {
    let channels = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
    channels.iter().fold(RETIRED.of(slot), |[l, e], c| {
        let [cl, ce] = c.work.of(slot);
        [l.wrapping_add(cl), e.wrapping_add(ce)]
    })
}

/// The kernel launch this thread sends next is on `stream`: counted as the legacy stream's of
/// its device when that is stream 0 (else as work elsewhere).
pub fn launch_on_legacy(stream: u64) {
    let _ = LAUNCH_ON_LEGACY.try_with(|l| l.set(stream == 0));
}

/// A call of `function` was sent (async) or answered: count it if its work may write what the
/// host reads without a call.
fn note_work_of(function: Function) {
    use cudart::FunctionId as F;
    match function {
        Function::Cudart(F::PhosLaunchKernel | F::PhosLaunchCooperativeKernel) => {
            let legacy = LAUNCH_ON_LEGACY.try_with(|l| l.replace(false)).unwrap_or(false);
            note_work(legacy.then(current_device));
        }
        Function::Cudart(F::CudaGraphLaunch | F::PhosGraphLaunchHost) => note_work(None),
        Function::Cudart(_) | Function::Cuda(_) | Function::Nvml(_) => {}
        // A library's call may launch kernels.
        _ => note_work(None),
    }
}

/// Work that may write what the host reads without a call (page-locked memory) was sent: a
/// kernel on the legacy stream of device `Some(d)`, or other work (`None`). Counted on this
/// thread's channel; without one (its thread-local storage is gone, and the call used a
/// channel of its own, ended since), on the retired counts.
pub fn note_work(on_legacy_of: Option<i32>) {
    let count = |w: &WorkCounts| match on_legacy_of {
        Some(device) => bump(&w.on_legacy[work_slot(device)], 1),
        None => bump(&w.elsewhere, 1),
    };
    let counted = CHANNEL
        .try_with(|c| c.try_borrow().ok().and_then(|c| c.as_ref().map(|ch| count(&ch.shared.work))))
        .ok()
        .flatten();
    if counted.is_none() {
        let _channels = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
        count(&RETIRED);
    }
}

/// The work totals of the current device, read before a synchronisation is sent.
#[derive(Clone, Copy)]
pub struct WorkMark {
    slot: usize,
    totals: [u64; 2],
}

/// Before a synchronisation: what it may settle. `None` where it cannot settle anything: on
/// a device without a slot of its own, or on a thread whose calls carry no barrier (the
/// callback thread), which are not ordered after other threads' work.
pub fn work_mark() -> Option<WorkMark> {
    let slot = work_slot(current_device());
    if slot == WORK_SLOTS - 1 || WITHOUT_BARRIERS.try_with(Cell::get).unwrap_or(true) {
        return None;
    }
    Some(WorkMark { slot, totals: work_totals(slot) })
}

/// The synchronisation marked by `mark` succeeded: the work it counted on its device has
/// finished, all of it (`everything`: `cudaDeviceSynchronize`), or that on the legacy stream
/// (a synchronous copy, which CUDA runs on the legacy stream, after its earlier work).
pub fn work_done(mark: WorkMark, everything: bool) {
    let settled = &SETTLED[mark.slot];
    settled[ON_LEGACY].fetch_max(mark.totals[ON_LEGACY], Ordering::AcqRel);
    if everything {
        settled[ELSEWHERE].fetch_max(mark.totals[ELSEWHERE], Ordering::AcqRel);
    }
}

/// Whether every kernel, graph, library call or async copy into page-locked memory sent so
/// far that a synchronous copy on `device` would wait for (CUDA's waits for the work before it
/// on the legacy stream, and so on every blocking stream) is known to have finished: no such
/// work was sent since a synchronisation that covered it returned. A synchronous copy that
/// would not wait for its answer waits where the process has page-locked memory and this is
/// not so (`cudart/copies.rs`).
pub fn work_settled(device: i32) -> bool {
    let slot = work_slot(device);
    let totals = work_totals(slot);
    let settled = &SETTLED[slot];
    totals[ON_LEGACY] == settled[ON_LEGACY].load(Ordering::Acquire)
        && totals[ELSEWHERE] == settled[ELSEWHERE].load(Ordering::Acquire)
}

/// Set once the server sent device `printf` output: see [`device_output_seen`].
static DEVICE_OUTPUT_SEEN: AtomicBool = AtomicBool::new(false);

/// Whether the process's kernels have printed (device `printf` output arrived): a synchronous
/// copy that would not wait for its answer waits then (`cudart/copies.rs`).
pub fn device_output_seen() -> bool {
    DEVICE_OUTPUT_SEEN.load(Ordering::Relaxed)
}

/// Device `printf` output goes through the program's own `stdout` stream, so it interleaves
/// with the program's printf output the way the CUDA runtime's does.
fn write_device_output(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    if !DEVICE_OUTPUT_SEEN.load(Ordering::Relaxed) {
        DEVICE_OUTPUT_SEEN.store(true, Ordering::Relaxed);
    }
    // SAFETY: reading the C library's `stdout` pointer, set before `main`; the program
    // changes it, if ever, only to another stream.
    let out = unsafe { stdout };
    // SAFETY: fwrite reads `bytes.len()` bytes of `bytes` and writes them to the program's
    // own stdout stream, as its own `printf` would.
    unsafe { libc::fwrite(bytes.as_ptr() as *const libc::c_void, 1, bytes.len(), out) };
}

/// Whether the process has initialised the driver API: `cuInit`, or the runtime API, which
/// initialises the driver on its first call as NVIDIA's does.
static DRIVER_INITIALIZED: AtomicBool = AtomicBool::new(false);

pub fn driver_initialized() -> bool {
    DRIVER_INITIALIZED.load(Ordering::Relaxed)
}

pub fn set_driver_initialized() {
    DRIVER_INITIALIZED.store(true, Ordering::Relaxed);
}

/// Whether the process has called the runtime API, which keeps the primary context of its
/// device, as NVIDIA's runtime does.
static RUNTIME_USED: AtomicBool = AtomicBool::new(false);

/// A runtime API call: the thread has its device's primary context current from now on,
/// unless it set a context of its own (driver API). Calls the driver API makes through the
/// runtime's functions ([`bridged`]) do not count.
pub fn note_runtime_call() {
    if BRIDGING.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    let _ = RUNTIME_HERE.try_with(|r| r.set(true));
    if !RUNTIME_USED.load(Ordering::Relaxed) {
        RUNTIME_USED.store(true, Ordering::Relaxed);
    }
}

pub fn runtime_used() -> bool {
    RUNTIME_USED.load(Ordering::Relaxed)
}

pub fn runtime_used_on_this_thread() -> bool {
    RUNTIME_HERE.try_with(Cell::get).unwrap_or(false)
}

/// Run `f`, a driver API function's use of the runtime's, with the thread's last runtime
/// error left as it was (the driver API does not touch it).
pub fn bridged<T>(f: impl FnOnce() -> T) -> T {
    let saved = peek_last_error();
    let was = BRIDGING.try_with(|b| b.replace(true)).unwrap_or(false);
    let r = f();
    let _ = BRIDGING.try_with(|b| b.set(was));
    let _ = LAST_ERROR.try_with(|l| l.set(saved));
    r
}

/// Run one exported function: a panic becomes `internal` (it must never unwind into C).
pub fn catch_panic<S: phos_protocol::ApiStatus>(name: &str, f: impl FnOnce() -> Result<(), S>) -> Result<(), S> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!("internal error in {name}");
        Err(S::INTERNAL_ERROR)
    })
}

/// A function Phos does not support: logged once per function (by name, with the code it
/// answers), for every API.
pub fn log_unsupported_once(function: Function, answer: &str) {
    static LOGGED: Mutex<Vec<Function>> = Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if !logged.contains(&function) {
        logged.push(function);
        crate::log::init();
        tracing::warn!("{} is not supported by Phos; returning {answer}", function.name());
    }
}

/// A function that refused one use of it (a case Phos does not carry): logged once per
/// function, so that every refusal names its function.
pub fn log_refusal_once(function: Function, answer: &str) {
    static LOGGED: Mutex<Vec<Function>> = Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if !logged.contains(&function) {
        logged.push(function);
        crate::log::init();
        tracing::warn!("{} answered {answer}: this use of it is not supported by Phos", function.name());
    }
}

/// Whether a call of the process has been answered with a sticky error (the context is
/// unusable: the server fails every later call with it).
static STICKY_SEEN: AtomicBool = AtomicBool::new(false);

/// A runtime or driver status the server answered: a sticky one is remembered.
fn note_status(e: CudaError) {
    if e.is_sticky() {
        STICKY_SEEN.store(true, Ordering::SeqCst);
    }
}

/// Whether the guest knows of a sticky error: answers it could give itself are left to the
/// server, which returns the error.
pub fn sticky_error_seen() -> bool {
    STICKY_SEEN.load(Ordering::SeqCst)
}

pub fn set_last_error(e: CudaError) {
    let _ = LAST_ERROR.try_with(|l| l.set(e.0));
}

/// `cudaGetLastError`: the last error of this thread, reset to success. Even a sticky error
/// is reset here (as measured on an H100 with CUDA 11.8 and 13.0); it comes back with the next
/// call, which the server fails with it.
pub fn take_last_error() -> i32 {
    LAST_ERROR.try_with(|l| l.replace(0)).unwrap_or(0)
}

/// `cudaPeekAtLastError`.
pub fn peek_last_error() -> i32 {
    LAST_ERROR.try_with(|l| l.get()).unwrap_or(0)
}

pub fn current_device() -> i32 {
    CURRENT_DEVICE.try_with(|d| d.get()).unwrap_or(0)
}

pub fn set_current_device(device: i32) {
    let _ = CURRENT_DEVICE.try_with(|d| d.set(device));
}

// ---------------------------------------------------------------------------------------------
// Helpers the generated stubs call.
// ---------------------------------------------------------------------------------------------

/// Bytes of `count` elements of `elem_size` bytes.
pub fn byte_len(count: i128, elem_size: u64) -> Result<usize, Failure> {
    let n = phos_protocol::eval::byte_len(count, elem_size)?;
    usize::try_from(n).ok().filter(|&n| n <= isize::MAX as usize).ok_or(Failure::InvalidValue)
}

/// Host input data. A null pointer is an error unless the buffer is empty or allowed null.
///
/// # Safety
/// `p` must point to `n` readable bytes (the caller's contract with CUDA).
pub unsafe fn in_bytes<'a>(p: *const u8, n: usize, null_ok: bool) -> Result<&'a [u8], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return if null_ok { Ok(&[]) } else { Err(Failure::InvalidValue) };
    }
    // SAFETY: not null, and `n` readable bytes (this function's contract); the application
    // leaves them alone while its call runs, as CUDA asks of it.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Checks an output buffer before the call is sent (only the pointer's value: nothing is
/// read or written).
pub fn check_out(p: *mut u8, n: usize, null_ok: bool) -> Result<(), Failure> {
    if n > 0 && p.is_null() && !null_ok { Err(Failure::InvalidValue) } else { Ok(()) }
}

/// Copies a reply buffer into the caller's memory.
///
/// # Safety
/// `p` must point to `n` writable bytes.
pub unsafe fn copy_out(p: *mut u8, data: Option<&[u8]>, n: usize) -> Result<(), Failure> {
    match data {
        Some(d) if d.len() == n => {
            if n > 0 && !p.is_null() {
                // SAFETY: `p` is not null and points to `n` writable bytes (this function's
                // contract); `d` is the reply's buffer, not the application's memory.
                unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), p, n) };
            }
            Ok(())
        }
        _ => {
            tracing::error!("the API server answered with a buffer of the wrong size");
            Err(Failure::Internal)
        }
    }
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string.
pub unsafe fn c_str<'a>(p: *const c_char) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::InvalidValue);
    }
    // SAFETY: not null, so a NUL-terminated string (this function's contract).
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| Failure::InvalidValue)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread without a channel (the counts go to the retired ones), on device 3, which
    /// no other test uses: work counted after a synchronisation's mark is not settled by it; a
    /// synchronous copy settles the legacy stream's kernels only, a device synchronisation
    /// everything.
    #[test]
    fn work_is_settled_by_what_covers_it_and_only_when_counted_before() {
        std::thread::spawn(|| {
            set_current_device(3);
            let mark = work_mark().expect("device 3 has a slot");
            work_done(mark, true);
            assert!(work_settled(3), "nothing counted since the mark");
            let early = work_mark().expect("a slot");
            note_work(Some(3));
            assert!(!work_settled(3));
            work_done(early, true);
            assert!(!work_settled(3), "a kernel counted after the mark is not settled by it");
            let copy = work_mark().expect("a slot");
            work_done(copy, false);
            assert!(work_settled(3), "a synchronous copy settles the legacy stream's kernel");
            note_work(Some(5));
            assert!(work_settled(3), "another device's legacy stream");
            note_work(None);
            let copy = work_mark().expect("a slot");
            work_done(copy, false);
            assert!(!work_settled(3), "a copy on the legacy stream does not settle other work");
            let sync = work_mark().expect("a slot");
            work_done(sync, true);
            assert!(work_settled(3), "a device synchronisation settles everything");
            set_current_device(WORK_SLOTS as i32 + 2);
            assert!(work_mark().is_none(), "a device past the slots settles nothing");
            without_barriers();
            set_current_device(3);
            assert!(work_mark().is_none(), "nor does a thread whose calls carry no barrier");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_barrier_names_each_call_of_another_channel_once() {
        let mut named = Vec::new();
        assert_eq!(name_new(&mut named, [(1, 0), (2, 0)].into_iter()), Vec::<u64>::new(), "nothing unanswered");
        assert_eq!(name_new(&mut named, [(1, 5), (2, 0)].into_iter()), vec![5]);
        assert_eq!(name_new(&mut named, [(1, 5), (2, 0)].into_iter()), Vec::<u64>::new(), "named already");
        assert_eq!(name_new(&mut named, [(1, 9), (2, 7)].into_iter()), vec![9, 7], "newer calls");
        assert_eq!(name_new(&mut named, [(1, 9), (2, 8)].into_iter()), vec![8]);
        // Answered (0), then a new call: named again.
        assert_eq!(name_new(&mut named, [(1, 0)].into_iter()), Vec::<u64>::new());
        assert_eq!(name_new(&mut named, [(1, 12)].into_iter()), vec![12]);
        let many = (0..MAX_BARRIER_IDS + 5).map(|k| (100 + k, 1000 + k as u64));
        assert_eq!(name_new(&mut named, many).len(), MAX_BARRIER_IDS, "a barrier's limit");
    }

    #[test]
    fn endpoint_lists_are_tried_in_order() {
        let list = parse_endpoints("vsock:2:7070, tcp:10.0.2.100:7000").unwrap();
        assert_eq!(list, vec![Endpoint::Vsock { cid: 2, port: 7070 }, Endpoint::Tcp("10.0.2.100:7000".into())]);
        assert_eq!(parse_endpoints("unix:/run/phos/router.sock").unwrap().len(), 1);
        assert!(parse_endpoints("vsock:2:7070,tcp:nowhere").is_err(), "a bad entry is refused");
        assert!(parse_endpoints(" , ").is_err(), "an empty list is refused");
    }

    #[test]
    fn the_next_endpoint_is_used_when_the_first_cannot_be_reached() {
        let dir = std::env::temp_dir().join(format!("phos-endpoints-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let live = dir.join("live.sock");
        let _ = std::fs::remove_file(&live);
        let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let list = vec![Endpoint::Unix(dir.join("absent.sock")), Endpoint::Unix(live.clone())];
        let mut socket = None;
        let Ok((used, _)) = connect_first(&list, &mut socket, &mut None) else { panic!("the second endpoint answers") };
        assert_eq!(used, Endpoint::Unix(live));
        assert!(socket.is_some());
        assert!(connect_first(&list[..1], &mut None, &mut None).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
