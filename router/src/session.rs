//! Sessions (a guest process and the API server that runs its calls) and the server
//! processes behind them.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::RouterConfig;
use crate::tenants::{Tenant, TenantState};
use crate::usage::Usage;

/// An API server process.
pub struct ServerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Where it accepts channels (its management service is this path plus `.ctl`).
    pub socket: PathBuf,
}

/// How a server starts.
pub enum ServerStart<'a> {
    /// A fresh session of this id and tenant.
    Fresh(u64, &'a Tenant),
    /// Without a session, ahead of need: it gets one later (`start`, `restore`).
    Pooled,
    /// Without a session, for a restore that follows at once: given up at `deadline` or once
    /// `cancel` is set (the server is then killed).
    ForRestore { deadline: Instant, cancel: &'a phos_control::Cancel },
}

/// How long a fresh or pooled server may take to say it is ready (a CUDA context takes
/// well under a second; a loaded machine, longer).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The first line a starting server writes, read with a deadline: a server that hangs
/// before `ready` must not hold the router's thread (and its client) for ever. `None` when
/// the deadline passed or `cancelled()` said so first.
fn first_line(stdout: &mut ChildStdout, deadline: Instant, cancelled: impl Fn() -> bool) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    loop {
        if cancelled() || Instant::now() >= deadline {
            return Ok(None);
        }
        let mut pfd = libc::pollfd { fd: stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 50) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            continue;
        }
        let mut byte = [0u8; 1];
        match stdout.read(&mut byte)? {
            0 => return Ok(Some(String::from_utf8_lossy(&line).into_owned())),
            _ if byte[0] == b'\n' => return Ok(Some(String::from_utf8_lossy(&line).into_owned())),
            _ => line.push(byte[0]),
        }
        if line.len() > 64 << 10 {
            return Err(io::Error::other("the API server wrote a start-up line without end"));
        }
    }
}

/// How a process ended, in words: its exit status, or the signal that killed it.
pub fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGSEGV => "SIGSEGV, ",
                libc::SIGABRT => "SIGABRT, ",
                libc::SIGBUS => "SIGBUS, ",
                libc::SIGILL => "SIGILL, ",
                libc::SIGFPE => "SIGFPE, ",
                libc::SIGKILL => "SIGKILL, ",
                libc::SIGTERM => "SIGTERM, ",
                libc::SIGINT => "SIGINT, ",
                _ => "",
            };
            let core = if status.core_dumped() { "core dumped" } else { "no core" };
            format!("was killed by signal {sig} ({name}{core})")
        }
        (None, None) => "ended".to_string(),
    }
}

impl ServerProcess {
    /// Start a server and wait until it is ready.
    pub fn spawn(config: &RouterConfig, socket: PathBuf, log_name: &str, start: ServerStart<'_>) -> io::Result<Self> {
        let stderr = match &config.server_log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                Stdio::from(
                    std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{log_name}.log")))?,
                )
            }
            None => Stdio::inherit(),
        };
        let mut cmd = Command::new(&config.server_bin);
        cmd.arg("--listen").arg(&socket).arg("--max-payload").arg(config.max_payload.to_string());
        cmd.args(config.session_limits.to_args());
        let mut deadline = Instant::now() + START_TIMEOUT;
        let mut cancel = None;
        match start {
            ServerStart::Fresh(id, tenant) => {
                cmd.arg("--session").arg(id.to_string()).arg("--tenant").arg(&tenant.0);
            }
            ServerStart::Pooled => {
                cmd.arg("--pooled");
            }
            ServerStart::ForRestore { deadline: until, cancel: c } => {
                cmd.arg("--pooled");
                (deadline, cancel) = (until, Some(c));
            }
        }
        let mut child = cmd
            .args(&config.server_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| io::Error::other(format!("{}: {e}", config.server_bin.display())))?;
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().expect("piped");
        let line = first_line(&mut stdout, deadline, || cancel.is_some_and(|c| c.is_cancelled()));
        let refused = match line {
            Ok(Some(line)) if line.trim() == "ready" => return Ok(ServerProcess { child, stdin, socket }),
            Ok(Some(line)) => io::Error::other(match line.trim().strip_prefix("failed ") {
                Some(why) => why.to_string(),
                None => "the API server exited during start-up (see its log)".to_string(),
            }),
            Ok(None) if cancel.is_some_and(|c| c.is_cancelled()) => {
                io::Error::new(io::ErrorKind::Interrupted, "abandoned: its client went away")
            }
            Ok(None) => io::Error::new(io::ErrorKind::TimedOut, "the API server did not get ready in time"),
            Err(e) => e,
        };
        let _ = child.kill();
        let _ = child.wait();
        Err(refused)
    }

    pub fn has_exited(&mut self) -> bool {
        self.exit_status().is_some()
    }

    /// How the server ended, if it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// End the server: closing its stdin stops it; a server that does not go is killed.
    pub fn end(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(phos_control::control_path(&self.socket));
    }
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Its server runs its calls.
    Active,
    /// Checkpointed and stopped: no server; channels that come back wait for a restore.
    Suspended,
    Ended,
}

pub struct SessionEntry {
    pub id: u64,
    pub tenant: Tenant,
    /// The tenant's books, which this session's usage is part of.
    pub tenant_state: Arc<TenantState>,
    /// The guest process (as the router's PID namespace sees it).
    pub pid: u32,
    pub program: String,
    pub abi_major: u32,
    pub started: Instant,
    pub usage: Usage,
    token: [u8; 16],
    /// Restores so far.
    pub epoch: AtomicU64,
    channels: AtomicU64,
    idle_since: Mutex<Option<Instant>>,
    server: Mutex<Option<ServerProcess>>,
    state: Mutex<State>,
    state_changed: Condvar,
    books: Mutex<Books>,
    /// Set once the session's usage has left its tenant's books.
    closed_books: AtomicBool,
    /// A guest on another host (TCP).
    remote: AtomicBool,
    /// Its peer carries the guest's connection for it (a VM's device or relay): the peer's
    /// life says nothing of the guest's.
    carried: AtomicBool,
    /// Its process is being checkpointed with CRIU (`phosctl checkpoint --process`): its
    /// guest's channels are refused (`REFUSED_PARKED`) rather than held for the restore, so
    /// that the process holds no connection to be dumped. Cleared by the restore.
    parked: AtomicBool,
    /// The guest ends of the session's channels (their writing halves), for cutting them
    /// when the session is parked and its process left running.
    relays: Mutex<Vec<std::sync::Weak<GuestEnd>>>,
    /// Async calls the router answered itself (refused), most recent last: they never reach
    /// the server, so barriers must not wait for them.
    refused_async: Mutex<VecDeque<u64>>,
    /// Barriers forwarded to the server and not reported passed yet: a thread of the guest
    /// waits for calls of the others to have run.
    barriers_waiting: AtomicU64,
    /// What the guest reported that does not go through Phos (`phosReportBypass`).
    bypass: Mutex<Bypass>,
    /// The memory load of the last on-demand restore of the session, as its server last
    /// reported it (followed until it is over).
    pub restore_load: Mutex<Option<phos_control::LoadReport>>,
    /// Checkpoints of the session in progress: its server is not ended under them, even if
    /// its program ends meanwhile (a concurrent checkpoint lets it run on).
    operations: AtomicU64,
}

/// A checkpoint of a session in progress ([`SessionEntry::operation`]).
pub struct Operation<'a>(&'a SessionEntry);

impl Drop for Operation<'_> {
    fn drop(&mut self) {
        self.0.operations.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A session's bypass findings.
#[derive(Default)]
struct Bypass {
    /// (kind, detail), at most `bypass::MAX_FINDINGS`.
    findings: Vec<(i32, String)>,
    /// The session is among its tenant's bypassed sessions (from its first finding while it is
    /// in the tenant's books, until it ends).
    counted: bool,
}

/// Refused async calls remembered per session (a guest has far fewer unanswered).
const REFUSED_ASYNC_KEPT: usize = 4096;

/// The session's part of its tenant's usage, per resource.
#[derive(Default)]
struct Books {
    /// Continuous: held, as last reported.
    held: Vec<u64>,
    /// Measured: (total, calls) as the current server last reported them.
    last_measured: Vec<(u64, u64)>,
    /// Measured: calls admitted, and calls measured, over the session's life.
    admitted: Vec<u64>,
    measured: Vec<u64>,
    /// Calls refused for each per-session limit, as the current server last reported them.
    refused: Vec<u64>,
}

/// The guest end of a channel's relay (its writing half, which replies go through).
pub(crate) type GuestEnd = Mutex<Box<dyn phos_protocol::transport::Transport>>;

/// Closes a channel's count when the channel ends, however it ends.
pub(crate) struct ChannelGuard(pub std::sync::Arc<SessionEntry>);

impl Drop for ChannelGuard {
    fn drop(&mut self) {
        self.0.channel_closed();
    }
}

/// Whether two session tokens are the same, in a time that does not depend on where they
/// differ.
pub(crate) fn tokens_match(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn random_token() -> io::Result<[u8; 16]> {
    let mut t = [0u8; 16];
    // SAFETY: getrandom writes at most `t.len()` bytes into `t`.
    let n = unsafe { libc::getrandom(t.as_mut_ptr() as *mut libc::c_void, t.len(), 0) };
    if n != t.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(t)
}

impl SessionEntry {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        tenant: Tenant,
        tenant_state: Arc<TenantState>,
        pid: u32,
        program: String,
        abi_major: u32,
        token: [u8; 16],
        epoch: u64,
        server: Option<ServerProcess>,
    ) -> Self {
        // The tenant's count of sessions was taken by the caller (a place under the tenant's
        // limit, or an operator's restore) and is given back when the session ends.
        let state = if server.is_some() { State::Active } else { State::Suspended };
        let n = phos_protocol::apis::RESOURCES.len();
        SessionEntry {
            id,
            tenant,
            tenant_state,
            pid,
            program,
            abi_major,
            started: Instant::now(),
            usage: Usage::default(),
            token,
            epoch: AtomicU64::new(epoch),
            channels: AtomicU64::new(0),
            idle_since: Mutex::new(Some(Instant::now())),
            server: Mutex::new(server),
            state: Mutex::new(state),
            state_changed: Condvar::new(),
            books: Mutex::new(Books {
                held: vec![0; n],
                last_measured: vec![(0, 0); n],
                admitted: vec![0; n],
                measured: vec![0; n],
                refused: vec![0; phos_protocol::limits::LimitKind::ALL.len()],
            }),
            closed_books: AtomicBool::new(false),
            remote: AtomicBool::new(false),
            carried: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            relays: Mutex::new(Vec::new()),
            refused_async: Mutex::new(VecDeque::new()),
            barriers_waiting: AtomicU64::new(0),
            bypass: Mutex::new(Bypass::default()),
            restore_load: Mutex::new(None),
            operations: AtomicU64::new(0),
        }
    }

    /// A checkpoint of the session begins: until the returned guard is dropped, the session
    /// does not end for want of its guest (its server still answers the checkpoint).
    pub(crate) fn operation(&self) -> Operation<'_> {
        self.operations.fetch_add(1, Ordering::Relaxed);
        Operation(self)
    }

    /// The guest reports a bypass (the payload of its `phosReportBypass` call): the finding in
    /// words if it is news. The first makes the session one of its tenant's bypassed
    /// sessions. A payload that does not decode is left to the server, which refuses the call.
    pub(crate) fn note_bypass(&self, payload: &[u8]) -> Option<String> {
        use phos_protocol::bypass::{MAX_FINDINGS, bounded, describe};
        let req = phos_protocol::decode_request::<phos_protocol::cudart::PhosReportBypassRequest>(payload).ok()?;
        let finding = (req.kind, bounded(req.detail).to_string());
        let mut bypass = self.bypass.lock();
        if bypass.findings.contains(&finding) || bypass.findings.len() >= MAX_FINDINGS {
            return None;
        }
        // Not once the session has left its tenant's books (`end`).
        if !bypass.counted && !self.closed_books.load(Ordering::Relaxed) {
            bypass.counted = true;
            self.tenant_state.bypassed_sessions.fetch_add(1, Ordering::Relaxed);
        }
        let said = describe(finding.0, &finding.1);
        bypass.findings.push(finding);
        Some(said)
    }

    /// What the guest reported that does not go through Phos, in words.
    pub fn bypass(&self) -> Vec<String> {
        self.bypass
            .lock()
            .findings
            .iter()
            .map(|(kind, detail)| phos_protocol::bypass::describe(*kind, detail))
            .collect()
    }

    /// The session as the management service answers it (`phosctl sessions`).
    pub fn info(&self) -> phos_control::SessionInfo {
        phos_control::SessionInfo {
            id: self.id,
            tenant: self.tenant.to_string(),
            pid: self.pid,
            remote: self.is_remote(),
            program: self.program.clone(),
            abi_major: self.abi_major,
            state: match self.state() {
                State::Active => "active",
                State::Suspended => "suspended",
                State::Ended => "ended",
            }
            .to_string(),
            channels: self.channels() as usize,
            calls: self.usage.calls(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            resources: self
                .usage
                .resources()
                .into_iter()
                .map(|(n, used, held)| (n.to_string(), used, held as i64))
                .collect(),
            bypass: self.bypass(),
        }
    }

    /// An async call was refused here and will not run on the server.
    pub(crate) fn refused_async(&self, call_id: u64) {
        let mut r = self.refused_async.lock();
        if r.len() == REFUSED_ASYNC_KEPT {
            r.pop_front();
        }
        r.push_back(call_id);
    }

    /// A barrier's payload (call ids), less the calls refused here. `None`: malformed.
    pub(crate) fn filter_barrier(&self, payload: &[u8]) -> Option<Vec<u8>> {
        if !payload.len().is_multiple_of(8) || payload.len() / 8 > phos_protocol::frame::MAX_BARRIER_IDS {
            return None;
        }
        let refused = self.refused_async.lock();
        Some(
            payload
                .chunks_exact(8)
                .filter(|c| !refused.contains(&u64::from_le_bytes((*c).try_into().expect("8 bytes"))))
                .flatten()
                .copied()
                .collect(),
        )
    }

    /// A barrier went to the server (`true`), or the server passed it.
    pub(crate) fn barrier_waiting(&self, waiting: bool) {
        if waiting {
            self.barriers_waiting.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self.barriers_waiting.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Whether a thread of the guest waits at a barrier for other threads' calls (asked only
    /// of calls a policy holds back).
    pub(crate) fn waits_at_a_barrier(&self) -> bool {
        self.barriers_waiting.load(Ordering::Relaxed) > 0
    }

    /// Record what the server says the session holds of `rc`; returns the change.
    pub(crate) fn set_held(&self, rc: usize, held: u64) -> i64 {
        let mut b = self.books.lock();
        let old = std::mem::replace(&mut b.held[rc], held);
        held as i64 - old as i64
    }

    /// Record a server's measured totals of `rc`; returns what is new since the last report
    /// (amount, calls). Reports come on every channel of the session, so one can arrive after
    /// a newer one sent on another channel: totals below the last seen are such a report,
    /// and add nothing. (A restored session's server counts from zero again: [`resume`]
    /// starts the books over.)
    ///
    /// [`resume`]: SessionEntry::resume
    pub(crate) fn set_measured(&self, rc: usize, total: u64, calls: u64) -> (u64, u64) {
        let mut b = self.books.lock();
        let (last_total, last_calls) = b.last_measured[rc];
        if calls < last_calls || total < last_total {
            return (0, 0);
        }
        b.last_measured[rc] = (total, calls);
        b.measured[rc] += calls - last_calls;
        (total - last_total, calls - last_calls)
    }

    /// Record a server's count of calls refused for limit `kind` (by index); returns what is
    /// new since the last report (a report overtaken by a newer one adds nothing).
    pub(crate) fn set_refused(&self, kind: usize, total: u64) -> u64 {
        let mut b = self.books.lock();
        let Some(last) = b.refused.get_mut(kind) else { return 0 };
        let new = total.saturating_sub(*last);
        *last = (*last).max(total);
        new
    }

    pub(crate) fn admit_measured(&self, rc: usize, delta: i64) {
        let mut b = self.books.lock();
        b.admitted[rc] = b.admitted[rc].saturating_add_signed(delta);
    }

    /// Calls of `rc` admitted and never measured.
    pub(crate) fn unmeasured(&self, rc: usize) -> u64 {
        let b = self.books.lock();
        b.admitted[rc].saturating_sub(b.measured[rc])
    }

    pub fn token(&self) -> [u8; 16] {
        self.token
    }

    /// Compare tokens without leaking how much of one matched.
    pub fn token_matches(&self, other: &[u8; 16]) -> bool {
        tokens_match(&self.token, other)
    }

    pub fn channels(&self) -> u64 {
        self.channels.load(Ordering::Relaxed)
    }

    pub fn state(&self) -> State {
        *self.state.lock()
    }

    fn set_state(&self, s: State) {
        *self.state.lock() = s;
        self.state_changed.notify_all();
    }

    /// The socket of the session's server, once the session is active (waiting up to
    /// `wait` while it is suspended, for a restore to bring it back).
    pub fn server_socket(&self, wait: Duration) -> Option<PathBuf> {
        let deadline = Instant::now() + wait;
        let mut state = self.state.lock();
        loop {
            match *state {
                State::Active => return self.server.lock().as_ref().map(|s| s.socket.clone()),
                State::Ended => return None,
                State::Suspended => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    self.state_changed.wait_until(&mut state, deadline);
                }
            }
        }
    }

    /// The management socket of the session's server.
    pub fn control_socket(&self) -> Option<PathBuf> {
        self.server.lock().as_ref().map(|s| phos_control::control_path(&s.socket))
    }

    /// A place for one more channel, unless the session has `per_session` or its tenant
    /// `per_tenant` already (which limit refused, then). The channel counts as open (the
    /// session is not idle) until the guard goes.
    pub(crate) fn open_channel(
        self: &Arc<Self>,
        per_session: u64,
        per_tenant: u64,
    ) -> Result<ChannelGuard, crate::limits::LimitKind> {
        use crate::limits::{LimitKind, take_place};
        if !take_place(&self.channels, per_session) {
            return Err(LimitKind::ChannelsPerSession);
        }
        if !take_place(&self.tenant_state.channels, per_tenant) {
            self.channels.fetch_sub(1, Ordering::Relaxed);
            return Err(LimitKind::ChannelsPerTenant);
        }
        *self.idle_since.lock() = None;
        Ok(ChannelGuard(self.clone()))
    }

    fn channel_closed(&self) {
        self.tenant_state.channels.fetch_sub(1, Ordering::Relaxed);
        if self.channels.fetch_sub(1, Ordering::Relaxed) == 1 {
            *self.idle_since.lock() = Some(Instant::now());
        }
    }

    /// The guest reached us over the network: its pid is another host's, so only its
    /// channels (and the linger time) say whether it is still there.
    pub(crate) fn set_remote(&self) {
        self.remote.store(true, Ordering::Relaxed);
    }

    /// Whether the guest reached us over the network.
    pub(crate) fn is_remote(&self) -> bool {
        self.remote.load(Ordering::Relaxed)
    }

    /// The session's peer is not its guest process but carries its connection: a VM's device
    /// or relay (the guest's pid is the VM's). As for a remote guest, only its channels (and
    /// the linger time) say whether it is still there: a session opened through a relay that
    /// exited when its connection was cut is kept for its guest to come back (over vsock, or
    /// another relay).
    pub(crate) fn set_carried(&self) {
        self.carried.store(true, Ordering::Relaxed);
    }

    fn guest_alive(&self) -> bool {
        if self.remote.load(Ordering::Relaxed) || self.carried.load(Ordering::Relaxed) {
            return true;
        }
        // SAFETY: signal 0 sends nothing: kill only checks that the process exists.
        unsafe { libc::kill(self.pid as libc::pid_t, 0) == 0 }
    }

    /// An active session is over when no channel is open and the guest is gone (or idle
    /// past `linger`), or when its server died. A suspended one waits `suspended_for` for
    /// its restore.
    pub(crate) fn is_finished(&self, linger: Duration, suspended_for: Duration) -> bool {
        match self.state() {
            State::Ended => true,
            State::Suspended => self.idle_since.lock().is_some_and(|since| since.elapsed() > suspended_for),
            State::Active => {
                if let Some(s) = self.server.lock().as_mut()
                    && let Some(status) = s.exit_status()
                {
                    // Nothing but the router ends a session's server: this one crashed (or
                    // was killed), and the session with it.
                    tracing::error!(
                        session = self.id,
                        tenant = %self.tenant,
                        "the session's API server (pid {}) {}; the session ends",
                        s.pid(),
                        describe_exit(status)
                    );
                    return true;
                }
                if self.operations.load(Ordering::Relaxed) > 0 {
                    return false;
                }
                // Parked, its process being dumped: it has no channel, and is not idle.
                if self.is_parked() && self.guest_alive() {
                    return false;
                }
                match *self.idle_since.lock() {
                    Some(since) => !self.guest_alive() || since.elapsed() > linger,
                    None => false,
                }
            }
        }
    }

    /// Take the server away: the session waits, suspended, for a restore.
    pub(crate) fn suspend(&self) {
        let server = self.server.lock().take();
        *self.idle_since.lock() = Some(Instant::now());
        self.set_state(State::Suspended);
        if let Some(s) = server {
            s.end();
        }
    }

    /// Suspended for a checkpoint of its process: see the `parked` field.
    pub(crate) fn park(&self) {
        self.parked.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_parked(&self) -> bool {
        self.parked.load(Ordering::Relaxed)
    }

    /// Its process dumped and left running: its channels are accepted again.
    pub(crate) fn unpark(&self) {
        self.parked.store(false, Ordering::Relaxed);
    }

    /// Note the guest end of a channel, to be cut when the session is parked.
    pub(crate) fn add_relay(&self, guest: &Arc<GuestEnd>) {
        let mut relays = self.relays.lock();
        relays.retain(|r| r.strong_count() > 0);
        relays.push(Arc::downgrade(guest));
    }

    /// Close the guest end of every channel of the session (each relay then ends, and its
    /// server end with it); returns how many were open.
    pub(crate) fn cut_relays(&self) -> u64 {
        let relays: Vec<_> = self.relays.lock().drain(..).filter_map(|r| r.upgrade()).collect();
        for r in &relays {
            r.lock().shutdown();
        }
        relays.len() as u64
    }

    /// A restored server takes over the session.
    pub(crate) fn resume(&self, server: ServerProcess) {
        self.parked.store(false, Ordering::Relaxed);
        if let Some(old) = self.server.lock().replace(server) {
            old.end();
        }
        // The restored server measures (and counts refusals) from zero.
        let mut books = self.books.lock();
        books.last_measured.iter_mut().for_each(|m| *m = (0, 0));
        books.refused.iter_mut().for_each(|r| *r = 0);
        drop(books);
        self.epoch.fetch_add(1, Ordering::Relaxed);
        self.set_state(State::Active);
    }

    /// The memory load of an on-demand restore that was still being followed, as `server`
    /// says it ended, asked once more before the server goes (its figures go with it).
    fn last_load_report(&self, server: &ServerProcess) {
        if self.restore_load.lock().as_ref().is_none_or(phos_control::LoadReport::finished) {
            return;
        }
        let ctl = phos_control::control_path(&server.socket);
        let report = phos_control::block_on(async {
            let client = phos_control::server_client(&ctl).await.ok()?;
            client.load(phos_control::context_within(Duration::from_secs(1))).await.ok().flatten()
        });
        if let Ok(Some(mut r)) = report {
            r.session_ended = !r.finished();
            *self.restore_load.lock() = Some(r);
        }
    }

    /// Stop the server for good.
    pub(crate) fn end(&self) {
        let server = self.server.lock().take();
        self.set_state(State::Ended);
        if let Some(s) = server {
            self.last_load_report(&s);
            s.end();
        }
        if !self.closed_books.swap(true, Ordering::Relaxed) {
            crate::admission::session_ended(self, &self.tenant_state);
            let mut bypass = self.bypass.lock();
            if std::mem::take(&mut bypass.counted) {
                self.tenant_state.bypassed_sessions.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for SessionEntry {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::apis::RESOURCES;
    use phos_protocol::handshake::UsageReport;

    /// A session the guest reports bypassed counts among its tenant's bypassed sessions
    /// until it ends; a finding is kept once, and at most `MAX_FINDINGS` of them.
    #[test]
    fn a_bypass_report_marks_the_session_until_it_ends() {
        use phos_protocol::bypass::MAX_FINDINGS;
        use phos_protocol::cudart::PhosReportBypassRequest;
        let tenants = crate::Tenants::new(vec![]).unwrap();
        let tenant = crate::Tenant("t".into());
        let state = tenants.state(&tenant);
        state.sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let s = SessionEntry::new(1, tenant, state.clone(), 0, "p".into(), 12, [0; 16], 0, None);
        let report = |kind: i32, detail: &str| phos_protocol::encode(&PhosReportBypassRequest { kind, detail });
        let bypassed = || state.bypassed_sessions.load(Ordering::Relaxed);
        assert!(s.note_bypass(b"not a request").is_none(), "left to the server to refuse");
        assert_eq!((bypassed(), s.bypass().len()), (0, 0));
        let said = s.note_bypass(&report(1, "/x/copy.so (soname libcudart.so.12)")).expect("news");
        assert!(said.contains("/x/copy.so"), "{said}");
        assert!(s.note_bypass(&report(1, "/x/copy.so (soname libcudart.so.12)")).is_none(), "the same again");
        assert_eq!((bypassed(), s.bypass().len()), (1, 1));
        for i in 0..2 * MAX_FINDINGS {
            s.note_bypass(&report(2, &format!("/lib{i}.so")));
        }
        assert_eq!((bypassed(), s.bypass().len()), (1, MAX_FINDINGS), "one session, findings bounded");
        s.end();
        assert_eq!(bypassed(), 0, "an ended session is no longer counted");
        s.note_bypass(&report(1, "/late.so"));
        assert_eq!(bypassed(), 0, "nor counted again after it ended");
        // A session whose first finding comes after it left the books is never counted, and
        // its end takes nothing off.
        state.sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let late = SessionEntry::new(2, crate::Tenant("t".into()), state.clone(), 0, "p".into(), 12, [0; 16], 0, None);
        late.end();
        assert!(late.note_bypass(&report(1, "/x/copy.so")).is_some());
        late.end();
        assert_eq!((bypassed(), late.bypass().len()), (0, 1));
    }

    /// A session whose guest is gone ends, unless a checkpoint of it is in progress: then it
    /// ends once the checkpoint is done (its server must stay to answer it).
    #[test]
    fn a_session_does_not_end_under_its_checkpoint() {
        let tenants = crate::Tenants::new(vec![]).unwrap();
        let tenant = crate::Tenant("t".into());
        let state = tenants.state(&tenant);
        state.sessions.fetch_add(1, Ordering::Relaxed);
        // A pid no process has (above the kernel's largest).
        let gone = 1 << 30;
        let s = SessionEntry::new(3, tenant, state, gone, "p".into(), 12, [0; 16], 0, None);
        s.set_state(State::Active);
        let (linger, suspended_for) = (Duration::from_secs(60), Duration::from_secs(60));
        assert!(s.is_finished(linger, suspended_for), "its guest is gone");
        let checkpoint = s.operation();
        let other = s.operation();
        assert!(!s.is_finished(linger, suspended_for), "ended under a checkpoint");
        drop(checkpoint);
        assert!(!s.is_finished(linger, suspended_for), "ended under the other checkpoint");
        drop(other);
        assert!(s.is_finished(linger, suspended_for));
        s.end();
    }

    /// A session whose peer is not its guest (a VM's relay, which exits with its
    /// connection) is kept for `linger` after its last channel closed, though its peer is gone.
    #[test]
    fn a_session_carried_for_its_guest_lingers_after_its_carrier_went() {
        let tenants = crate::Tenants::new(vec![]).unwrap();
        let tenant = crate::Tenant("t".into());
        let state = tenants.state(&tenant);
        state.sessions.fetch_add(1, Ordering::Relaxed);
        let relay_gone = 1 << 30;
        let s = SessionEntry::new(4, tenant, state, relay_gone, "p".into(), 12, [0; 16], 0, None);
        s.set_state(State::Active);
        s.set_carried();
        assert!(!s.is_remote(), "not a guest over the network");
        assert!(!s.is_finished(Duration::from_secs(60), Duration::from_secs(60)), "kept for its guest");
        assert!(s.is_finished(Duration::ZERO, Duration::from_secs(60)), "until its linger passed");
        s.end();
    }

    #[test]
    fn a_report_overtaken_by_a_newer_one_adds_nothing() {
        let tenants = crate::Tenants::new(vec![]).unwrap();
        let tenant = crate::Tenant("t".into());
        let state = tenants.state(&tenant);
        state.sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let s = SessionEntry::new(1, tenant, state.clone(), 0, "p".into(), 12, [0; 16], 0, None);
        let dt = RESOURCES.iter().position(|r| r.name == "device_time").unwrap();
        let report =
            |total: u64, calls: u64| UsageReport { measured: vec![(dt as u32, total, calls)], ..Default::default() };
        state.admit_measured(dt, 3);
        s.admit_measured(dt, 3);
        std::thread::sleep(Duration::from_millis(1));
        // Sent on two channels: the report of two kernels arrives after that of three.
        crate::admission::report(&s, &state, &report(300, 3));
        crate::admission::report(&s, &state, &report(200, 2));
        assert_eq!((state.queued(dt), state.used(dt)), (0, 300));
        assert_eq!(s.unmeasured(dt), 0);
        state.admit_measured(dt, 1);
        s.admit_measured(dt, 1);
        assert_eq!(state.queued(dt), 1, "the next kernel is queued, not hidden by a double count");
    }
}
