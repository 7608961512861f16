//! Channels: each guest thread's connection (through the router) is served by a thread of
//! its own that decodes frames, runs calls through the generated dispatch and answers.
//! Anything a guest sends that is not a valid call of the spec gets an error reply and a log
//! line; a frame that cannot even be framed ends that channel only. The server keeps serving.

use std::os::unix::net::UnixListener;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use phos_protocol::apis::{Api, Function};
use phos_protocol::cudart::{self, FunctionId};
use phos_protocol::frame::{
    FLAG_ASYNC, FLAG_DEFERRED, FLAG_MEASURE, FLAG_RESENT, FrameHeader, FrameKind, MAX_BARRIER_IDS,
};
use phos_protocol::handshake::TransportKind;
use phos_protocol::handshake::{Attach, UsageReport, Welcome, check_apis};
use phos_protocol::log_limit::GUEST_LINES;
use phos_protocol::shm::ShmTransport;
use phos_protocol::staging::Staging;
use phos_protocol::transport::{Transport, TransportError, UnixTransport};
use phos_protocol::{ApiStatus, CudaError, Rejection};

use crate::dispatch;
use crate::pipeline::LaunchQueue;
use crate::service::{CallCx, Session};

/// The session a server serves: set once, when the server is started for a session, or
/// later for a server started ahead of need (from the router's pool).
#[derive(Default)]
pub struct SessionSlot {
    session: OnceLock<Arc<Session>>,
    lock: Mutex<()>,
    ready: Condvar,
}

impl SessionSlot {
    pub fn set(&self, session: Arc<Session>) -> Result<(), Arc<Session>> {
        let _g = self.lock.lock();
        self.session.set(session)?;
        self.ready.notify_all();
        Ok(())
    }

    pub fn get(&self) -> Option<&Arc<Session>> {
        self.session.get()
    }

    /// Wait until the session is set.
    pub fn wait(&self) -> &Arc<Session> {
        let mut g = self.lock.lock();
        loop {
            if let Some(s) = self.session.get() {
                return s;
            }
            self.ready.wait(&mut g);
        }
    }
}

/// Async calls run since the last acknowledgement sent on a channel. They are answered
/// together, with one frame (a `Reply` flagged [`FLAG_ASYNC`]: call id the last one run,
/// status the last failure among them, payload the number that failed), before the next
/// synchronous call's reply or after [`ACK_EVERY`] of them: one small frame per call would
/// fill the socket buffers while the guest is not reading.
#[derive(Default)]
struct AckWindow {
    last: u64,
    calls: u64,
    failed: u64,
    last_error: i32,
    /// An acknowledgement naming failed calls went since the last synchronous answer (see
    /// [`AnswerPosting`]).
    failures_sent: bool,
}

/// Whether a synchronous call's successful answer may also be posted in the channel's
/// staging region ([`Staging::post_answer`]), so that the guest's thread, spinning for it,
/// returns one hop (the router's) sooner and takes the answer's frame in at a later call.
/// The guest then reads the frames sent before the answer late too, so none may be one it
/// must see before the call returns: device output (the program's own output follows it),
/// an acknowledgement naming failed async calls (their error is the call's or the thread's
/// last), an async call the router refused (the refusal the router sent the guest, likewise).
/// Nor may a usage report have gone to the router since the guest last read its answers: the
/// router could still hold an allocation's reservation, released as its answer passes, when
/// the guest's next call is admitted, and count the memory twice against the quota.
#[derive(Default)]
struct AnswerPosting {
    /// A frame the guest must read, or a usage report, went since the last synchronous
    /// answer.
    must_read: bool,
}

/// How often a quiet channel reports device time while kernels are being measured.
/// Short, because the router takes a tenant to have work on the GPU until its kernels are
/// reported: a late report makes a tenant whose queue is empty look busy, and keeps a
/// policy that lets a tenant have one kernel queued at a time waiting.
const REPORT_INTERVAL: Duration = Duration::from_micros(100);

/// How often an unmeasured async call looks at the session's usage figures.
const USAGE_CHECK_GAP: Duration = Duration::from_micros(50);

/// How often device time and kernel counts are reported while no policy needs them.
const UNPOLICED_REPORT_GAP: Duration = Duration::from_millis(1);

/// Async calls answered by one acknowledgement at most.
const ACK_EVERY: u64 = 256;

/// What [`ApiServer::run`] answers for a call of a frozen session (never sent to a guest).
const FROZEN: i32 = i32::MIN;

/// What [`ApiServer::call_on`] answers for a call of a session frozen for a parked checkpoint
/// (never sent to a guest): the call did not run, and its channel closes.
const CUT: i32 = i32::MIN + 1;

impl AckWindow {
    fn ran(&mut self, call_id: u64, status: i32) {
        self.last = call_id;
        self.calls += 1;
        if status != cudart::SUCCESS {
            self.failed += 1;
            self.last_error = status;
        }
    }

    fn full(&self) -> bool {
        self.calls >= ACK_EVERY
    }

    /// Failures of queued launches (answered with the next acknowledgement: a queued
    /// launch may fail after the one that counted it was sent).
    fn failed_later(&mut self, launches: Option<&Arc<LaunchQueue>>) {
        if let Some((n, status)) = launches.and_then(|q| q.take_failures()) {
            self.failed += n;
            self.last_error = status;
        }
    }

    fn send(&mut self, t: &mut dyn Transport, session: u64) -> std::io::Result<()> {
        if self.calls == 0 && self.failed == 0 {
            return Ok(());
        }
        let mut a = FrameHeader::new(FrameKind::Reply);
        a.flags = FLAG_ASYNC;
        a.session = session;
        a.call_id = self.last;
        a.status = self.last_error;
        let failed = self.failed.to_le_bytes();
        a.payload_len = failed.len() as u64;
        // The last id stays: failures that come later are answered under it again.
        let failures_sent = self.failures_sent || self.failed > 0;
        *self = AckWindow { last: self.last, failures_sent, ..AckWindow::default() };
        t.send(&a, &[&failed])
    }
}

/// How a call from a channel runs.
#[derive(Default)]
struct Running<'a> {
    /// The channel's staging region.
    staging: Option<&'a Arc<Staging>>,
    /// The router asks for its device time.
    measure: bool,
    /// An async call's id: noted as run (for barriers and images) once it has.
    async_id: Option<u64>,
    /// A synchronous call's id and its channel's slot: its reply is kept there once it has
    /// run (see [`crate::kept`]).
    keep: Option<(u64, &'a crate::kept::ChannelReply)>,
    /// An async launch's channel queue ([`crate::pipeline`]).
    launches: Option<&'a Arc<LaunchQueue>>,
    /// Set when the launch was queued: its submitter notes it in the ledger.
    queued: std::cell::Cell<bool>,
}

/// Why a channel's handshake is refused (said to the router in a `Refused` frame).
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("{0}")]
    Transport(TransportError),
    #[error("{0}")]
    Decode(bincode::error::DecodeError),
    #[error("expected a Hello frame, got {0:?}")]
    NotHello(FrameKind),
    #[error("{0}")]
    Apis(phos_protocol::handshake::ApiMismatch),
    #[error("channel for session {asked} reached session {this}")]
    Session { asked: u64, this: u64 },
}

pub struct ApiServer {
    slot: Arc<SessionSlot>,
    channels: AtomicU64,
}

impl ApiServer {
    pub fn new(slot: Arc<SessionSlot>) -> Arc<Self> {
        Arc::new(ApiServer { slot, channels: AtomicU64::new(0) })
    }

    /// A server for an existing session.
    pub fn for_session(session: Arc<Session>) -> Arc<Self> {
        let slot = Arc::new(SessionSlot::default());
        let _ = slot.set(session);
        Self::new(slot)
    }

    pub fn session(&self) -> &Arc<Session> {
        self.slot.wait()
    }

    /// Accept channels until the listener fails. Only the router connects here; a channel
    /// the process has no thread or descriptor for is closed (the guest's call that opened
    /// it fails) and the session goes on.
    pub fn listen(self: &Arc<Self>, listener: UnixListener) {
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    let me = self.clone();
                    let spawned = std::thread::Builder::new()
                        .name("phos-channel".into())
                        .spawn(move || me.serve_channel(UnixTransport::new(stream)));
                    if let Err(e) = spawned {
                        tracing::error!("no thread for a new channel ({e}): the channel is closed");
                    }
                }
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)) =>
                {
                    // The router holds the connection in its handshake with a deadline;
                    // wait for descriptors rather than spin.
                    tracing::error!("accept: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::EINTR)) => {}
                Err(e) => {
                    tracing::error!("accept: {e}");
                    break;
                }
            }
        }
    }

    fn refuse(t: &mut dyn Transport, reason: &str) {
        let mut h = FrameHeader::new(FrameKind::Refused);
        h.payload_len = reason.len() as u64;
        let _ = t.send(&h, &[reason.as_bytes()]);
    }

    /// Serve one channel until it closes. It opens on the socket; the router may move it to
    /// shared-memory rings after the handshake.
    pub fn serve_channel(&self, socket: UnixTransport) {
        let mut t: Box<dyn Transport> = Box::new(socket);
        let channel = self.channels.fetch_add(1, Ordering::Relaxed) + 1;
        let session = self.session();
        let mut payload = Vec::new();
        // Handshake: the router attaches the channel to this session.
        let attach = match t.recv(&mut payload) {
            Ok(h) if h.kind == FrameKind::Hello => {
                phos_protocol::decode::<Attach>(&payload).map_err(HandshakeError::Decode)
            }
            Ok(h) => Err(HandshakeError::NotHello(h.kind)),
            Err(e) => Err(HandshakeError::Transport(e)),
        };
        let attach = match attach {
            Ok(a) if let Err(e) = check_apis(&a.apis, "the guest library") => Err(HandshakeError::Apis(e)),
            Ok(a) if a.session != session.id => Err(HandshakeError::Session { asked: a.session, this: session.id }),
            other => other,
        };
        let attach = match attach {
            Ok(a) => a,
            Err(reason) => {
                crate::guest_warn!(session.id, "channel {channel}: refused: {reason}");
                Self::refuse(t.as_mut(), &reason.to_string());
                return;
            }
        };
        tracing::debug!(session = session.id, channel, tenant = %attach.tenant, abi = attach.abi_major, "channel open");
        let welcome = Welcome {
            session: session.id,
            token: [0; 16],
            backend: session.backend().name().to_string(),
            device_base: session.objects.memory.base(),
            device_size: session.objects.memory.size(),
            device_count: session.backend().device_count(),
            epoch: 0,
            transport: attach.transport,
            max_payload: phos_protocol::DEFAULT_MAX_PAYLOAD,
        };
        let w = phos_protocol::encode(&welcome);
        let mut h = FrameHeader::new(FrameKind::Welcome);
        h.session = session.id;
        h.payload_len = w.len() as u64;
        if t.send(&h, &[&w]).is_err() {
            return;
        }
        let mut staging: Option<Arc<Staging>> = None;
        if attach.transport == TransportKind::Shm {
            // The router sends the region next; the socket stays open to tell us it lives.
            let Ok(stream) = t.into_unix() else { return };
            match ShmTransport::attach(stream, phos_protocol::DEFAULT_MAX_PAYLOAD) {
                Ok((shm, files)) => {
                    t = Box::new(shm);
                    staging = files.staging.map(Arc::new);
                    // Without it the guest's pinned memory stays its own (phosHostAlloc fails).
                    if let Some(fd) = files.host_arena
                        && let Err(e) = session.attach_host_arena(fd)
                    {
                        crate::guest_warn!(session.id, "channel {channel}: pinned arena not used: {e}");
                    }
                }
                Err(e) => {
                    crate::guest_warn!(session.id, "channel {channel}: cannot use the shared region: {e}");
                    return;
                }
            }
        }

        // What this channel runs, for a checkpoint that has to say what it waited for.
        let activity = session.activity.channel(channel);
        // The last synchronous call it answered, kept for the guest sending it again.
        let kept = session.sync_replies.channel();
        let mut out = Vec::new();
        let mut acks = AckWindow::default();
        let mut posting = AnswerPosting::default();
        // Async launches go to a submitter thread of the channel's (started at the first).
        let pipelining = crate::pipeline::enabled(session.backend().name());
        let mut launches: Option<Arc<LaunchQueue>> = None;
        let mut usage_checked = Instant::now();
        // Calls whose effect on usage has not been looked at yet.
        let mut unchecked_calls = 0u32;
        // Async calls sent again that had run already (acknowledged, not run twice).
        let mut resent_run = 0u64;
        loop {
            // While kernels are still to be measured and the guest is quiet (waiting, or
            // held back by the router), report their device time as they finish, so that
            // the router's books do not wait for the guest's next call.
            while (unchecked_calls > 0 || session.backend().measuring() || session.usage_unreported())
                && !t.wait_readable(REPORT_INTERVAL)
            {
                unchecked_calls = 0;
                if let Some(report) = session.usage_if_changed(Duration::ZERO) {
                    posting.must_read = true;
                    if Self::report(t.as_mut(), session.id, 0, &report).is_err() {
                        break;
                    }
                }
            }
            let mut h = match t.recv(&mut payload) {
                Ok(h) => h,
                Err(TransportError::Closed) => break,
                Err(e) => {
                    // The stream cannot be re-synchronised after a bad frame: end this channel.
                    crate::guest_warn!(session.id, "channel {channel}: malformed frame, closing the channel: {e}");
                    Self::refuse(t.as_mut(), &format!("malformed frame: {e}"));
                    break;
                }
            };
            out.clear();
            if h.kind == FrameKind::Call
                && let Some((function, request)) = crate::service::cudnn::retired_call(h.api, h.function, &payload)
            {
                // A deployed guest's call of a retired id that a carried function serves: it
                // runs (and is recorded, kept, deferred) as that function's.
                h.function = function;
                payload = request;
            }
            if h.kind == FrameKind::Withdrawn {
                // The router refused this async call: barriers stop waiting for it (and the
                // guest must read the refusal the router sent it).
                posting.must_read = true;
                session.async_calls.ran(h.call_id);
                continue;
            }
            if h.kind == FrameKind::Barrier {
                self.barrier(channel, &payload);
                let passed = UsageReport { barrier: true, ..Default::default() };
                if Self::report(t.as_mut(), session.id, 0, &passed).is_err() {
                    break;
                }
                continue;
            }
            let is_async = h.flags & FLAG_ASYNC != 0;
            // The frame's function, read once for the checks below and the dispatch.
            let function = Function::from_wire(h.api, h.function);
            let queueable = is_async
                && h.kind == FrameKind::Call
                && h.flags & FLAG_MEASURE == 0
                && function == Some(Function::Cudart(FunctionId::PhosLaunchKernel));
            if queueable {
                if pipelining && launches.is_none() {
                    launches = LaunchQueue::start(session.clone(), channel).map(Arc::new);
                }
            } else if let Some(q) = &launches {
                // Nothing overtakes the launches queued before it.
                q.drain();
            }
            let resent = h.flags & FLAG_RESENT != 0 && h.session == session.id && h.kind == FrameKind::Call;
            let already_ran = is_async && resent && session.async_calls.has_run(h.call_id);
            if !already_ran && resent_run > 0 {
                Self::log_resent_run(session.id, channel, std::mem::take(&mut resent_run));
            }
            if !is_async {
                acks.failed_later(launches.as_ref());
                if acks.send(t.as_mut(), session.id).is_err() {
                    break;
                }
            }
            // Whether the ledger has this async call already (it ran, or had run before).
            let mut noted = false;
            // A synchronous call sent again that had run: answered with its kept reply.
            // (Only a resent frame looks: the common call pays nothing here.)
            let kept_answer = match function.filter(|_| resent && !is_async) {
                Some(f) => match session.sync_replies.resent(&kept, h.call_id, f) {
                    crate::kept::Resent::Ran(status) => Some((f, status)),
                    crate::kept::Resent::NotKept => None,
                },
                None => None,
            };
            // Whether the reply to send is the one the channel kept (the call ran, or had).
            let mut from_kept = kept_answer.is_some();
            // A failure of an earlier async library call that this synchronous call returns:
            // instead of running, or, where the call destroys the handle, once it has.
            let waiting = if !is_async
                && kept_answer.is_none()
                && h.kind == FrameKind::Call
                && h.session == session.id
                && h.api > Api::Cuda.id()
            {
                session.deferred.take(h.api, &payload)
            } else {
                None
            };
            let destroys = waiting.is_some() && function.is_some_and(|f| !f.info().objects.destroys.is_empty());
            let mut deferred = None;
            let status = if h.kind != FrameKind::Call {
                crate::guest_warn!(session.id, "channel {channel}: unexpected {:?} frame", h.kind);
                CudaError::InvalidValue.0
            } else if h.session != session.id {
                crate::guest_warn!(session.id, "channel {channel}: call for session {} on this channel", h.session);
                CudaError::InvalidValue.0
            } else if let Some((f, status)) = kept_answer {
                if let Some(dropped) = GUEST_LINES.admit(&session.id.to_string()) {
                    tracing::info!(
                        session = session.id,
                        channel,
                        call = h.call_id,
                        dropped,
                        "a resent {} had run before: answered with its kept reply, not run again",
                        f.name()
                    );
                }
                status
            } else if already_ran {
                // Sent again after a cut channel, but it ran before the image this session
                // was restored from (or before the cut, here): acknowledged, not run twice.
                tracing::debug!(session = session.id, channel, call = h.call_id, "a resent async call had run");
                resent_run += 1;
                noted = true;
                cudart::SUCCESS
            } else if let Some(failed) = waiting.filter(|_| !destroys) {
                // The call does not run: it returns the failure, as CUDA returns an
                // asynchronous error from a later call.
                deferred = Some(failed.function);
                failed.status
            } else {
                match function {
                    None => Self::unknown_function(session.id, channel, h.api, h.function),
                    Some(id) => {
                        // `run` notes an async call in the ledger once it has run.
                        noted = true;
                        // Device printf output rides with the calls that flush it: a
                        // synchronising call delivers what the work before it printed, an
                        // async one (a launch) only what earlier work printed, and only if
                        // the guest waits for it (an answer the guest collects later must
                        // stay small, so it never fills the socket buffers).
                        let info = id.info();
                        // Counted before what it delivers is taken: a call that may start
                        // device code makes the next synchronising calls drain the captured
                        // stdout (`output::Quiet`).
                        let starts_code = session.output.captures() && crate::output::may_start_device_code(id);
                        if starts_code {
                            session.output.quiet.starting();
                        }
                        // A synchronisation of the only device may find the output complete.
                        let quiet_mark = (session.output.captures()
                            && crate::output::synchronises_the_device(id)
                            && session.backend().device_count() == 1)
                            .then(|| session.output.quiet.mark(&session.quiesce.queued))
                            .flatten();
                        let mut printed = Vec::new();
                        if info.device_output && info.is_async && !is_async {
                            printed = session.output.take();
                        }
                        activity.store(id.policy_id() + 1, Ordering::Relaxed);
                        if !is_async {
                            kept.begin(h.call_id);
                            from_kept = true;
                        }
                        let mut answer_ran = || {
                            tracing::debug!(
                                session = session.id,
                                channel,
                                up_to = acks.last,
                                call = h.call_id,
                                "frozen: answering the async calls that ran"
                            );
                            acks.failed_later(launches.as_ref());
                            let _ = acks.send(t.as_mut(), session.id);
                        };
                        let status = match self.call_on(
                            id,
                            h.device,
                            &payload,
                            &mut out,
                            Running {
                                staging: staging.as_ref(),
                                measure: h.flags & FLAG_MEASURE != 0,
                                async_id: is_async.then_some(h.call_id),
                                keep: (!is_async).then_some((h.call_id, &*kept)),
                                launches: launches.as_ref().filter(|_| queueable),
                                queued: Default::default(),
                            },
                            &mut answer_ran,
                        ) {
                            Ok(()) => 0,
                            Err(code) => {
                                out.clear();
                                code
                            }
                        };
                        if starts_code {
                            session.output.quiet.ended();
                        }
                        activity.store(0, Ordering::Relaxed);
                        kept.end();
                        if status == CUT {
                            tracing::debug!(session = session.id, channel, call = h.call_id, "parked: channel cut");
                            break;
                        }
                        if info.device_output && !info.is_async {
                            printed = session.output.take();
                        }
                        if let Some(mark) = quiet_mark.filter(|_| status == 0) {
                            session.output.quiet.settled(mark, &session.quiesce.queued);
                        }
                        if !printed.is_empty() {
                            posting.must_read = true;
                            let mut o = FrameHeader::new(FrameKind::Output);
                            o.session = session.id;
                            o.call_id = h.call_id;
                            o.payload_len = printed.len() as u64;
                            if t.send(&o, &[&printed]).is_err() {
                                break;
                            }
                        }
                        status
                    }
                }
            };
            if is_async {
                // A call refused before it reached the dispatch counts as run too: a barrier
                // no longer waits for it.
                if !noted {
                    session.async_calls.ran(h.call_id);
                }
                acks.ran(h.call_id, status);
            }
            // What the call changed in the session's usage goes to the router first, so its
            // accounting is current when the guest's next call is decided.
            // Without a policy (no call marked for measuring) only `phosctl top` and the
            // metrics read device time: a report a millisecond is plenty.
            // An unmeasured async call (a launch storm) looks at the figures at most every
            // USAGE_CHECK_GAP: reading them takes locks, and a launch costs little more.
            // (The clock itself is read once in eight such calls.)
            let measured = h.flags & FLAG_MEASURE != 0;
            unchecked_calls += 1;
            if !is_async
                || measured
                || (unchecked_calls.is_multiple_of(8) && usage_checked.elapsed() >= USAGE_CHECK_GAP)
            {
                usage_checked = Instant::now();
                unchecked_calls = 0;
                let kernel_gap = if measured { Duration::ZERO } else { UNPOLICED_REPORT_GAP };
                if let Some(report) = session.usage_if_changed(kernel_gap) {
                    posting.must_read = true;
                    if Self::report(t.as_mut(), session.id, h.call_id, &report).is_err() {
                        break;
                    }
                }
            }
            if is_async {
                if acks.full() {
                    acks.failed_later(launches.as_ref());
                    if acks.send(t.as_mut(), session.id).is_err() {
                        break;
                    }
                }
                continue;
            }
            let mut r = FrameHeader::new(FrameKind::Reply);
            r.api = h.api;
            r.function = h.function;
            r.session = session.id;
            r.call_id = h.call_id;
            r.status = status;
            if let Some(failed) = waiting.filter(|_| destroys && status == 0) {
                r.status = failed.status;
                deferred = Some(failed.function);
            }
            // Posted as well where the guest may take it without the frames before it.
            let must_read = std::mem::take(&mut posting.must_read) || std::mem::take(&mut acks.failures_sent);
            let post = staging
                .as_ref()
                .filter(|_| !must_read && r.status == 0 && h.flags & FLAG_MEASURE == 0 && deferred.is_none());
            let mut send = |r: &FrameHeader, payload: &[u8]| {
                if let Some(st) = post {
                    st.post_answer(r.call_id, payload);
                }
                t.send(r, &[payload])
            };
            let sent = if let Some(function) = deferred {
                // The earlier call's failure, naming it (not what the channel kept).
                r.flags = FLAG_DEFERRED;
                out.clear();
                out.extend_from_slice(function.as_bytes());
                r.payload_len = out.len() as u64;
                send(&r, &out)
            } else {
                // A call that ran (or had) sends the reply its channel kept; one refused
                // before it ran, what it answered.
                from_kept
                    .then(|| {
                        kept.with_kept(h.call_id, |k| {
                            r.payload_len = k.payload.len() as u64;
                            send(&r, &k.payload)
                        })
                    })
                    .flatten()
                    .unwrap_or_else(|| {
                        r.payload_len = out.len() as u64;
                        send(&r, &out)
                    })
            };
            if let Err(e) = sent {
                tracing::debug!(session = session.id, channel, "channel closed while replying: {e}");
                break;
            }
        }
        if resent_run > 0 {
            Self::log_resent_run(session.id, channel, resent_run);
        }
        // The launches still queued are submitted (a cut channel's guest does not send
        // acknowledged calls again).
        drop(launches);
        session.activity.closed(channel);
        session.sync_replies.closed(&kept);
        if let Some(st) = staging
            && st.registered.load(Ordering::Relaxed)
        {
            session.backend().unpin_shared(st.slots_range().0);
        }
        tracing::debug!(session = session.id, channel, "channel closed");
    }

    /// A run of resent async calls that had run already ended (one line for them all).
    fn log_resent_run(session: u64, channel: u64, calls: u64) {
        if let Some(dropped) = GUEST_LINES.admit(&session.to_string()) {
            tracing::info!(
                session,
                channel,
                dropped,
                "{calls} resent async calls had run before: acknowledged without running them again"
            );
        }
    }

    fn report(t: &mut dyn Transport, session: u64, call_id: u64, report: &UsageReport) -> std::io::Result<()> {
        let bytes = phos_protocol::encode(report);
        let mut u = FrameHeader::new(FrameKind::Report);
        u.session = session;
        u.call_id = call_id;
        u.payload_len = bytes.len() as u64;
        t.send(&u, &[&bytes])
    }

    /// A barrier: wait until the async calls it names (from the session's other channels)
    /// have run.
    fn barrier(&self, channel: u64, payload: &[u8]) {
        let session = self.session().id;
        if !payload.len().is_multiple_of(8) || payload.len() / 8 > MAX_BARRIER_IDS {
            crate::guest_warn!(session, "channel {channel}: malformed barrier of {} bytes ignored", payload.len());
            return;
        }
        let ids: Vec<u64> =
            payload.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let missing = self.session().async_calls.wait_for(&ids);
        if !missing.is_empty() {
            crate::guest_warn!(session, "channel {channel}: barrier gave up waiting for async calls {missing:?}");
        }
    }

    /// A call of a function this build does not have: a retired one (named, answered as
    /// not supported by its API), one of an API it does not serve, or a made-up id.
    fn unknown_function(session: u64, channel: u64, api: u16, function: u32) -> i32 {
        let Some(known) = Api::from_id(api) else {
            crate::guest_warn!(session, "channel {channel}: a call of API id {api}, which this server does not serve");
            return CudaError::InvalidValue.0;
        };
        match known.retired().iter().find(|(id, _)| *id == function) {
            Some((_, name)) => {
                crate::guest_warn!(session, "channel {channel}: {name} (`{}` id {function}) is retired", known.name());
                known.not_supported()
            }
            None => {
                crate::guest_warn!(session, "channel {channel}: unknown `{}` function id {function}", known.name());
                known.invalid_value()
            }
        }
    }

    /// Run one call on this session. The error is a status of the function's API.
    pub fn call(
        &self,
        id: impl Into<Function>,
        device: i32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CudaError> {
        self.call_on(id.into(), device, payload, out, Running::default(), &mut || {}).map_err(CudaError)
    }

    /// Run one call that came on a channel with this staging region; the error is a status of
    /// the function's API.
    ///
    /// A frozen session's call runs `on_frozen` (the channel answers the async calls that
    /// ran before it, so that the guest does not send them again to the session's next
    /// server) and waits for a thaw, which never comes if the server ends.
    fn call_on(
        &self,
        id: Function,
        device: i32,
        payload: &[u8],
        out: &mut Vec<u8>,
        how: Running<'_>,
        on_frozen: &mut dyn FnMut(),
    ) -> Result<(), i32> {
        let mut result = self.run(id, device, payload, out, &how);
        while result == Err(FROZEN) {
            on_frozen();
            if self.session().is_cutting() {
                // Its process is being dumped and runs on: the call is sent again once the
                // session is back, on a channel opened then.
                result = Err(CUT);
                break;
            }
            self.session().wait_thawed();
            result = self.run(id, device, payload, out, &how);
        }
        if result.is_err()
            && id == Function::Cudart(FunctionId::PhosMemcpyStaged)
            && let Some(st) = how.staging
        {
            // Refused before (or while) its data moved: the guest is waiting on the slots,
            // and must learn now, not when it gives up on a stalled copy.
            st.abort();
        }
        result
    }

    /// Run a call. The checks before its API's dispatch answer codes that the runtime and the
    /// driver API share (a sticky error, an invalid device), as the backends' errors do.
    fn run(&self, id: Function, device: i32, payload: &[u8], out: &mut Vec<u8>, how: &Running<'_>) -> Result<(), i32> {
        let session = self.session();
        // The clock is read only while a C/R hook is timed: two reads a call cost the
        // launch path measurably where reading it is slow.
        let timed = session.hooks.active() && crate::timing::on();
        let start = timed.then(std::time::Instant::now);
        let in_flight = session.quiesce.enter();
        let entered = start.map(|s| s.elapsed());
        if session.is_frozen() {
            // Checkpointed and stopped (or handed over to another server): this call belongs
            // to the restored session, unless the session is thawed.
            drop(in_flight);
            return Err(FROZEN);
        }
        let profiled = session.profile.as_ref().and_then(|_| phos_protocol::call_profile::start());
        let result = self.run_entered(id, device, payload, out, how);
        if let Some(p) = &session.profile {
            p.ended(id, how.async_id.is_some(), profiled);
        }
        if let Some((call_id, slot)) = how.keep {
            // Kept while the call still holds the quiesce lock, so that an image taken once
            // it has left keeps its reply (the guest may send it again to the restored
            // session). A rejection answers no payload.
            if result.is_err() {
                out.clear();
            }
            slot.keep(call_id, id, result.err().unwrap_or(0), out);
        }
        if let Some(call_id) = how.async_id
            && !how.queued.get()
        {
            // Noted while the call still holds the quiesce lock, so that an image taken once
            // it has left says it ran (the guest may send it again to the restored session).
            // A queued launch is noted by its submitter, and a quiesce waits for that.
            session.async_calls.ran(call_id);
        }
        drop(in_flight);
        if let (Some(start), Some(entered)) = (start, entered) {
            let waited = entered.as_secs_f64() * 1e3;
            crate::timing::slow(start, || format!("{} while a C/R hook was on ({waited:.3} ms to enter)", id.name()));
        }
        result
    }

    /// [`run`](Self::run), in the quiesce lock and not frozen.
    fn run_entered(
        &self,
        id: Function,
        device: i32,
        payload: &[u8],
        out: &mut Vec<u8>,
        how: &Running<'_>,
    ) -> Result<(), i32> {
        let session = self.session();
        if let Some(e) = session.sticky_error() {
            return Err(e.0);
        }
        if device < 0 || device >= session.backend().device_count() {
            crate::guest_warn!(session.id, "{}: call names device {device}", id.name());
            return Err(CudaError::InvalidDevice.0);
        }
        session.backend().bind(device).map_err(|e| e.0)?;
        let mut cx = CallCx::new(device);
        cx.staging = how.staging.cloned();
        if let (Some(q), Some(call_id)) = (how.launches, how.async_id) {
            cx.launches = Some((q.clone(), call_id));
        }
        cx.measure = how.measure;
        cx.function = Some(id);
        let s = session.as_ref();
        let result = catch_unwind(AssertUnwindSafe(|| match id {
            Function::Cudart(f) => Self::outcome(s, f.name(), dispatch::cudart::dispatch(s, &cx, f, payload, out)),
            Function::Cuda(f) => Self::outcome(s, f.name(), dispatch::cuda::dispatch(s, &cx, f, payload, out)),
            Function::Cublas(f) => Self::outcome(s, f.name(), dispatch::cublas::dispatch(s, &cx, f, payload, out)),
            Function::Curand(f) => Self::outcome(s, f.name(), dispatch::curand::dispatch(s, &cx, f, payload, out)),
            Function::Cusolver(f) => Self::outcome(s, f.name(), dispatch::cusolver::dispatch(s, &cx, f, payload, out)),
            Function::Cusparse(f) => Self::outcome(s, f.name(), dispatch::cusparse::dispatch(s, &cx, f, payload, out)),
            Function::Cudnn(f) => Self::outcome(s, f.name(), dispatch::cudnn::dispatch(s, &cx, f, payload, out)),
            Function::Cublaslt(f) => Self::outcome(s, f.name(), dispatch::cublaslt::dispatch(s, &cx, f, payload, out)),
            Function::Cufft(f) => Self::outcome(s, f.name(), dispatch::cufft::dispatch(s, &cx, f, payload, out)),
            Function::Nvml(f) => Self::outcome(s, f.name(), dispatch::nvml::dispatch(s, &cx, f, payload, out)),
        }));
        how.queued.set(cx.queued.get());
        if s.hooks.active() {
            s.hooks.after_call();
        }
        let result = result.unwrap_or_else(|_| {
            if let Some(dropped) = GUEST_LINES.admit(&session.id.to_string()) {
                tracing::error!(session = session.id, dropped, "{}: internal error (panic)", id.name());
            }
            Err(id.api().internal_error())
        });
        match result {
            Err(code) if how.async_id.is_some() && id.info().async_id.is_some() => {
                Self::defer(s, id, payload, code);
                Ok(())
            }
            r => r,
        }
    }

    /// A library call the guest sent without waiting (its function's async id) failed: the
    /// guest has returned success already, so the failure is logged and kept for the next
    /// synchronous call of the API on the call's handle (its first argument), which returns
    /// it. The acknowledgement says success: the runtime's last error is not the library's.
    fn defer(session: &Session, id: Function, payload: &[u8], code: i32) {
        let api = id.api();
        let handle = if crate::service::cublaslt::defers_to_any(id) || crate::service::cudnn::defers_to_any(id) {
            crate::deferred::ANY
        } else {
            crate::deferred::first_handle(payload).unwrap_or(0)
        };
        let kept =
            session.deferred.failed(api.id(), handle, crate::deferred::Failed { status: code, function: id.name() });
        if let Some(dropped) = GUEST_LINES.admit(&session.id.to_string()) {
            tracing::error!(
                session = session.id,
                dropped,
                "{} (sent asynchronously) failed with {} on handle {handle:#x} (0: any): {}",
                id.name(),
                api.status_name(code),
                if kept {
                    "the next synchronous call of the API on that handle (any, for 0) returns it"
                } else {
                    "an earlier failure on that handle is still waiting to be returned"
                }
            );
        }
    }

    /// What a dispatch's rejection answers (a status of the call's API), and the log line it
    /// is worth.
    fn outcome<S: ApiStatus>(session: &Session, name: &str, result: Result<(), Rejection<S>>) -> Result<(), i32> {
        let Err(rejection) = result else { return Ok(()) };
        let code = rejection.code().code();
        match &rejection {
            // The same number in the runtime (cudaErrorInvalidResourceHandle) and the driver
            // API (CUDA_ERROR_INVALID_HANDLE).
            Rejection::Failed(c) if c.code() == CudaError::InvalidResourceHandle.0 => crate::guest_warn!(
                session.id,
                "{name}: a handle that is not one of the session's (or not of the kind the call takes)"
            ),
            Rejection::Failed(_) => tracing::debug!(session = session.id, "{name}: {rejection}"),
            r if r.is_guest_fault() => crate::guest_warn!(session.id, "{name}: {rejection}"),
            _ => {
                // A server bug, but the guest's calls trigger it: bounded as well.
                if let Some(dropped) = GUEST_LINES.admit(&session.id.to_string()) {
                    tracing::error!(session = session.id, dropped, "{name}: {rejection}");
                }
            }
        }
        // Sticky errors have the same numbers in the runtime and the driver API.
        session.note_error(CudaError(code));
        Err(code)
    }
}

/// Run one recorded call through its API's dispatch, as a restore replays it; a rejection is
/// said in words.
pub(crate) fn replay(
    session: &Session,
    cx: &CallCx,
    f: Function,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    match f {
        Function::Cudart(id) => dispatch::cudart::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string()),
        Function::Cuda(id) => dispatch::cuda::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string()),
        Function::Cublas(id) => dispatch::cublas::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string()),
        Function::Curand(id) => dispatch::curand::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string()),
        Function::Cusolver(id) => {
            dispatch::cusolver::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string())
        }
        Function::Cusparse(id) => {
            dispatch::cusparse::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string())
        }
        Function::Cudnn(id) => dispatch::cudnn::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string()),
        Function::Cublaslt(id) => {
            dispatch::cublaslt::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string())
        }
        Function::Cufft(id) => dispatch::cufft::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string()),
        Function::Nvml(id) => dispatch::nvml::dispatch(session, cx, id, payload, out).map_err(|e| e.to_string()),
    }
}
