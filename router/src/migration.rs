//! Live migration of a session to another router or another device (docs/architecture.md,
//! "Live migration").
//!
//! The source router readies a target server (its own, for another device; through the
//! target router's `migrate_prepare`, for another router), then asks the session's server to
//! send the session there (`migrate_out`: recopy rounds streamed to the target server while
//! the program runs, then the rest with the session held, then the target restores it on
//! demand and says so). The session is frozen at the source from then on. The source router
//! then asks the target to take the session (`migrate_finish`, or for a device, its own
//! server's `received`): once it has, the source's server is ended and the guest's channels
//! break; the guest reconnects with its token to its router, which hands it over: for a
//! device, the session's new server is simply its server now; for another router, the guest
//! is told where to reconnect (a refusal that names the target's endpoint), and resends its
//! unanswered calls there. A failure at any step before the hand-over leaves the session
//! running at the source; a failure of the target's final step thaws it there.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phos_control::{
    ControlError, Incoming, MigrateOut, MigrateRequest, MigrationSummary, MigrationTarget, RestoreSummary, SentFigures,
    SessionIdentity, VmMigrationReport,
};

use crate::session::{self, ServerProcess, ServerStart, SessionEntry, State};
use crate::tenants::Tenant;
use crate::{Router, follow_load};

/// Sessions that moved to another router, remembered for their guests' reconnections.
const MOVED_KEPT: usize = 1024;

/// A session that moved away: its token, tenant, and where its guest reconnects.
pub(crate) struct Moved {
    token: [u8; 16],
    tenant: Tenant,
    endpoint: String,
}

/// A session this router is taking in from another.
pub(crate) struct Arriving {
    session: u64,
    identity: SessionIdentity,
    pid: u32,
    remote: bool,
    server: ServerProcess,
    /// Given up (its server ended) if the source has not finished by then.
    deadline: Instant,
}

/// How long a target waits between `migrate_prepare` and `migrate_finish`.
const ARRIVAL_WAIT: Duration = Duration::from_secs(900);

/// Migrations so far, for the metrics.
#[derive(Default)]
pub struct MigrationFigures {
    pub done: u64,
    pub failed: u64,
    pub arrived: u64,
    /// The last successful one's figures.
    pub last: Option<MigrationSummary>,
    /// VMs moved with their sessions (`phosctl vm-migrate`), those whose move was undone,
    /// and the last move's figures.
    pub vm_done: u64,
    pub vm_failed: u64,
    pub vm_last: Option<VmMigrationReport>,
}

/// The migration state a router keeps.
#[derive(Default)]
pub(crate) struct Migrations {
    pub(crate) moved: Mutex<VecDeque<Moved>>,
    pub(crate) arriving: Mutex<std::collections::HashMap<u64, Arriving>>,
    pub(crate) next_ticket: std::sync::atomic::AtomicU64,
    pub(crate) figures: Mutex<MigrationFigures>,
}

/// This host's boot id: two routers on one host have the same (a guest on it can reach
/// either's Unix socket).
pub(crate) fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

fn failed(session: u64, to: &str, reason: impl std::fmt::Display) -> ControlError {
    ControlError::MigrationFailed { session, to: to.to_string(), reason: reason.to_string() }
}

/// Run `f` with a client of the server whose management socket is `ctl`.
fn with_server<T>(
    ctl: &std::path::Path,
    session: u64,
    f: impl AsyncFnOnce(phos_control::ServerControlClient) -> Result<T, ControlError>,
) -> Result<T, ControlError> {
    phos_control::block_on(async {
        let client = phos_control::server_client(ctl)
            .await
            .map_err(|e| ControlError::ServerUnreachable { session, reason: e.to_string() })?;
        f(client).await
    })
    .map_err(|e| ControlError::io("a runtime for the migration", e))?
}

fn rpc(session: u64, e: tarpc::client::RpcError) -> ControlError {
    ControlError::ServerUnreachable { session, reason: e.to_string() }
}

/// Have the session's server (management socket `ctl`) send it as `request` says, by
/// `deadline`; if `cancel` is set meanwhile (the operator's `phosctl` went away), the server
/// is told to give up, which leaves the session running there.
fn send(
    ctl: &std::path::Path,
    session: u64,
    request: MigrateOut,
    deadline: Instant,
    cancel: &phos_control::Cancel,
) -> Result<SentFigures, ControlError> {
    let within = deadline.saturating_duration_since(Instant::now());
    with_server(ctl, session, async |c| {
        let call = c.migrate_out(phos_control::context_within(within), request);
        tokio::pin!(call);
        let answer = tokio::select! {
            biased;
            r = &mut call => r,
            _ = cancel.cancelled() => {
                let _ = c.abandon(tarpc::context::current()).await;
                call.await
            }
        };
        answer.map_err(|e| match e {
            tarpc::client::RpcError::DeadlineExceeded => ControlError::DeadlinePassed {
                session,
                operation: phos_control::Operation::Migration,
                within,
                during: "sending the session".into(),
            },
            e => rpc(session, e),
        })?
    })
}

/// What the image of `session` says of it besides its state (as a checkpoint's).
fn identity_of(session: &SessionEntry) -> SessionIdentity {
    SessionIdentity {
        token: session.token(),
        tenant: session.tenant.to_string(),
        program: session.program.clone(),
        abi_major: session.abi_major,
        epoch: session.epoch.load(Ordering::Relaxed),
    }
}

impl Router {
    /// Where a guest whose session (by `token`, of `tenant`) moved away reconnects.
    pub(crate) fn moved_to(&self, token: &[u8; 16], tenant: &Tenant) -> Option<String> {
        let moved = self.migrations.moved.lock();
        moved
            .iter()
            .rev()
            .find(|m| session::tokens_match(&m.token, token) && m.tenant == *tenant)
            .map(|m| m.endpoint.clone())
    }

    /// A server without a session for a session arriving here: from the pool, or started.
    fn server_for_arrival(
        &self,
        session: u64,
        deadline: Instant,
        cancel: &phos_control::Cancel,
    ) -> io::Result<ServerProcess> {
        match self.take_pooled() {
            Some(p) => Ok(p),
            None => {
                let socket = self.server_socket(session);
                self.spawn_server_at(socket, session, ServerStart::ForRestore { deadline, cancel })
            }
        }
    }

    /// Move session `id` to `request.to` while it runs (see the module's documentation).
    pub fn migrate(
        &self,
        id: u64,
        request: &MigrateRequest,
        cancel: &phos_control::Cancel,
    ) -> Result<MigrationSummary, ControlError> {
        let started = Instant::now();
        let session = self.session(id).ok_or(ControlError::NoSuchSession { session: id })?;
        let source_ctl = session.control_socket().ok_or(match session.state() {
            State::Ended => ControlError::Ended { session: id },
            State::Active | State::Suspended => ControlError::Suspended { session: id },
        })?;
        let identity = identity_of(&session);
        let to = request.to.to_string();
        let deadline = started + request.timeout;
        let out = |stream: String, key: [u8; 16]| MigrateOut {
            stream,
            key,
            identity: identity.clone(),
            quiesce_timeout: request.quiesce_timeout,
            answer_timeout: deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1)),
            connections: request.connections,
        };
        let result = match &request.to {
            MigrationTarget::Device(device) => {
                self.migrate_to_device(&session, &source_ctl, *device, deadline, cancel, out)
            }
            MigrationTarget::Router(endpoint) => {
                self.migrate_to_router(&session, &source_ctl, endpoint, deadline, cancel, out)
            }
        };
        let mut figures = self.migrations.figures.lock();
        match result {
            Ok((sent, restore)) => {
                let round_ms: f64 = sent.passes.iter().skip(1).rev().skip(1).map(|p| p.ms).sum();
                let round_dirty: u64 = sent.passes.iter().skip(1).rev().skip(1).map(|p| p.dirty_bytes).sum();
                let summary = MigrationSummary {
                    session: id,
                    to,
                    memory_bytes: sent.memory_bytes,
                    sent_bytes: sent.sent_bytes,
                    dirty_rate: if round_ms > 0.0 { round_dirty as f64 / (round_ms / 1e3) } else { 0.0 },
                    downtime_ms: sent.held_ms,
                    total_ms: started.elapsed().as_secs_f64() * 1e3,
                    passes: sent.passes,
                    restore,
                };
                tracing::info!(
                    session = id,
                    "migrated to {}: {} bytes of memory, {} sent in {} passes, {:.1} ms in all, calls held {:.1} ms",
                    summary.to,
                    summary.memory_bytes,
                    summary.sent_bytes,
                    summary.passes.len(),
                    summary.total_ms,
                    summary.downtime_ms
                );
                figures.done += 1;
                figures.last = Some(summary.clone());
                Ok(summary)
            }
            Err(e) => {
                tracing::warn!(session = id, "migration to {to} failed: {e}");
                figures.failed += 1;
                Err(e)
            }
        }
    }

    /// To a server of this router on `device`: the session's server is replaced once the new
    /// one has the session.
    fn migrate_to_device(
        &self,
        session: &Arc<SessionEntry>,
        source_ctl: &std::path::Path,
        device: i32,
        deadline: Instant,
        cancel: &phos_control::Cancel,
        out: impl Fn(String, [u8; 16]) -> MigrateOut,
    ) -> Result<(SentFigures, RestoreSummary), ControlError> {
        let id = session.id;
        let to = format!("device {device}");
        let server = self.server_for_arrival(id, deadline, cancel).map_err(|e| failed(id, &to, e))?;
        let target_ctl = phos_control::control_path(&server.socket);
        let key = phos_control::peer::random::<16>().map_err(|e| failed(id, &to, e))?;
        let taken = (|| {
            let port = with_server(&target_ctl, id, async |c| {
                c.receive(tarpc::context::current(), id, Some(device), key, "127.0.0.1".into())
                    .await
                    .map_err(|e| rpc(id, e))?
            })?;
            let sent = send(source_ctl, id, out(format!("127.0.0.1:{port}"), key), deadline, cancel)?;
            let restore = with_server(&target_ctl, id, async |c| {
                c.received(phos_control::context_within(Duration::from_secs(60))).await.map_err(|e| rpc(id, e))?
            });
            match restore {
                Ok(r) => Ok((sent, r)),
                Err(e) => {
                    self.thaw(source_ctl, id);
                    Err(e)
                }
            }
        })();
        match taken {
            Ok(done) => {
                // The old server ends: the guest's channels reconnect to the new one.
                session.resume(server);
                *session.restore_load.lock() = None;
                follow_load(session.clone());
                Ok(done)
            }
            Err(e) => {
                server.end();
                Err(failed(id, &to, e))
            }
        }
    }

    /// To another router: it readies a server, the session goes there, and the guest is
    /// told to reconnect to that router.
    fn migrate_to_router(
        &self,
        session: &Arc<SessionEntry>,
        source_ctl: &std::path::Path,
        endpoint: &str,
        deadline: Instant,
        cancel: &phos_control::Cancel,
        out: impl Fn(String, [u8; 16]) -> MigrateOut,
    ) -> Result<(SentFigures, RestoreSummary), ControlError> {
        let id = session.id;
        let to = format!("router {endpoint}");
        let secret = self.config.peer_secret.clone();
        let identity = identity_of(session);
        let (pid, remote) = (session.pid, session.is_remote());
        let incoming: Incoming = phos_control::block_on(async {
            let peer = phos_control::peer::router_client_at(endpoint, secret.as_ref()).await?;
            peer.migrate_prepare(phos_control::context_within(Duration::from_secs(150)), id, identity, pid, remote)
                .await
                .map_err(|e| ControlError::io(format!("asking the router at {endpoint}"), e))?
        })
        .map_err(|e| ControlError::io("a runtime for the migration", e))
        .and_then(|r| r)
        .map_err(|e| failed(id, &to, e))?;
        let abort = |why: ControlError| {
            let _ = phos_control::block_on(async {
                if let Ok(peer) = phos_control::peer::router_client_at(endpoint, secret.as_ref()).await {
                    let _ = peer.migrate_abort(tarpc::context::current(), incoming.ticket).await;
                }
            });
            failed(id, &to, why)
        };
        // Where the guest reconnects: the target's Unix socket from this host, else its TCP.
        let guest_endpoint = if !remote && incoming.host == host_id() {
            format!("unix:{}", incoming.guest_unix.display())
        } else if let Some(tcp) = &incoming.guest_tcp {
            format!("tcp:{tcp}")
        } else {
            return Err(abort(ControlError::io(
                "the target router",
                "takes no guests over TCP (--listen-tcp), and the guest cannot reach its Unix socket",
            )));
        };
        let host = match endpoint.strip_prefix("tcp:") {
            Some(addr) => addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string(),
            None => "127.0.0.1".to_string(),
        };
        let stream = format!("{host}:{}", incoming.stream_port);
        let sent = send(source_ctl, id, out(stream, incoming.key), deadline, cancel).map_err(abort)?;
        // The target has the session: it becomes the target router's.
        let finished = phos_control::block_on(async {
            let peer = phos_control::peer::router_client_at(endpoint, secret.as_ref()).await?;
            peer.migrate_finish(phos_control::context_within(Duration::from_secs(90)), incoming.ticket)
                .await
                .map_err(|e| ControlError::io(format!("asking the router at {endpoint}"), e))?
        })
        .map_err(|e| ControlError::io("a runtime for the migration", e))
        .and_then(|r| r);
        let restore = match finished {
            Ok(r) => r,
            Err(e) => {
                self.thaw(source_ctl, id);
                return Err(abort(e));
            }
        };
        {
            let mut moved = self.migrations.moved.lock();
            if moved.len() == MOVED_KEPT {
                moved.pop_front();
            }
            moved.push_back(Moved { token: session.token(), tenant: session.tenant.clone(), endpoint: guest_endpoint });
        }
        // The session is the target's now: its server here ends, and its guest's channels
        // reconnect and are sent on.
        self.sessions.lock().remove(&id);
        session.end();
        tracing::info!(session = id, "session moved to {endpoint}");
        Ok((sent, restore))
    }

    /// Let a frozen session's server serve it again (the move was given up after it).
    fn thaw(&self, ctl: &std::path::Path, session: u64) {
        let thawed =
            with_server(ctl, session, async |c| c.thaw(tarpc::context::current()).await.map_err(|e| rpc(session, e)));
        if let Err(e) = thawed {
            tracing::error!(session, "the migration was given up, but the session's server could not be thawed: {e}");
        }
    }

    /// Another router's session `session` comes here: a server is readied to receive it.
    pub fn migrate_prepare(
        &self,
        session: u64,
        identity: SessionIdentity,
        pid: u32,
        remote: bool,
        cancel: &phos_control::Cancel,
    ) -> Result<Incoming, ControlError> {
        let refuse = |why: String| ControlError::MigrationFailed { session, to: "this router".into(), reason: why };
        let tenant = Tenant(identity.tenant.clone());
        if !self.tenants.is_known(&tenant) {
            return Err(refuse(format!("no tenant {tenant} here")));
        }
        if self.session(session).is_some_and(|s| s.state() != State::Ended)
            || self.migrations.arriving.lock().values().any(|a| a.session == session)
        {
            return Err(refuse(format!("session id {session} is in use here")));
        }
        let deadline = Instant::now() + ARRIVAL_WAIT;
        let server = self
            .server_for_arrival(session, Instant::now() + Duration::from_secs(120), cancel)
            .map_err(|e| ControlError::ServerNotStarted { session, reason: e.to_string() })?;
        let key = phos_control::peer::random::<16>().map_err(|e| refuse(format!("a key: {e}")))?;
        let bind = self.config.peer_listen.map_or("127.0.0.1".to_string(), |a| a.ip().to_string());
        let ctl = phos_control::control_path(&server.socket);
        let port = with_server(&ctl, session, async |c| {
            c.receive(tarpc::context::current(), session, None, key, bind).await.map_err(|e| rpc(session, e))?
        });
        let port = match port {
            Ok(p) => p,
            Err(e) => {
                server.end();
                return Err(e);
            }
        };
        let ticket = self.migrations.next_ticket.fetch_add(1, Ordering::Relaxed) + 1;
        self.migrations.arriving.lock().insert(ticket, Arriving { session, identity, pid, remote, server, deadline });
        tracing::info!(session, ticket, "a session is arriving from another router");
        Ok(Incoming {
            ticket,
            stream_port: port,
            key,
            guest_unix: self.config.listen.clone(),
            guest_tcp: self.tcp_addr().map(|a| a.to_string()),
            host: host_id(),
        })
    }

    /// The arriving session of `ticket` was sent: once its server has restored it, it is a
    /// session of this router.
    pub fn migrate_finish(&self, ticket: u64) -> Result<RestoreSummary, ControlError> {
        let arriving = self.migrations.arriving.lock().remove(&ticket).ok_or(ControlError::MigrationFailed {
            session: 0,
            to: "this router".into(),
            reason: format!("no migration {ticket} here"),
        })?;
        let id = arriving.session;
        let ctl = phos_control::control_path(&arriving.server.socket);
        let restored = with_server(&ctl, id, async |c| {
            c.received(phos_control::context_within(Duration::from_secs(60))).await.map_err(|e| rpc(id, e))?
        });
        let summary = match restored {
            Ok(s) => s,
            Err(e) => {
                arriving.server.end();
                return Err(e);
            }
        };
        let identity = &arriving.identity;
        let tenant = Tenant(identity.tenant.clone());
        self.tenants.state(&tenant).sessions.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(SessionEntry::new(
            id,
            tenant.clone(),
            self.tenants.state(&tenant),
            arriving.pid,
            identity.program.clone(),
            identity.abi_major,
            identity.token,
            identity.epoch + 1,
            Some(arriving.server),
        ));
        if arriving.remote {
            entry.set_remote();
        }
        self.sessions.lock().insert(id, entry.clone());
        self.next_session.fetch_max(id + 1, Ordering::Relaxed);
        self.migrations.figures.lock().arrived += 1;
        follow_load(entry);
        tracing::info!(session = id, %tenant, "session arrived from another router");
        Ok(summary)
    }

    /// A VM moved away with its sessions (`None`: its move was undone).
    pub fn vm_migrated(&self, report: Option<VmMigrationReport>) {
        let mut figures = self.migrations.figures.lock();
        match report {
            Some(r) => {
                tracing::info!(
                    "a VM moved away with {} session(s): paused {:.1} ms, its vsock device away {:.1} ms",
                    r.sessions,
                    r.vm_downtime_ms,
                    r.device_away_ms
                );
                figures.vm_done += 1;
                figures.vm_last = Some(r);
            }
            None => figures.vm_failed += 1,
        }
    }

    /// The migration of `ticket` is given up: its server ends.
    pub fn migrate_abort(&self, ticket: u64) {
        if let Some(a) = self.migrations.arriving.lock().remove(&ticket) {
            tracing::info!(session = a.session, ticket, "the arriving session was given up by its source");
            a.server.end();
        }
    }

    /// End arrivals whose source never finished them.
    pub(crate) fn expire_arrivals(&self) {
        let now = Instant::now();
        let expired: Vec<Arriving> = {
            let mut arriving = self.migrations.arriving.lock();
            let late: Vec<u64> = arriving.iter().filter(|(_, a)| a.deadline <= now).map(|(&t, _)| t).collect();
            late.into_iter().filter_map(|t| arriving.remove(&t)).collect()
        };
        for a in expired {
            tracing::warn!(session = a.session, "an arriving session was never finished by its source: given up");
            a.server.end();
        }
    }
}
