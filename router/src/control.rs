//! The router's management service, for `phosctl`: sessions, checkpoint, restore, progress,
//! policies and usage. Failures answer with a [`ControlError`].
//! Each operation runs on a blocking thread (it waits on API servers and the disk), so the
//! service keeps answering progress queries meanwhile. An operation whose client gives up
//! (its deadline passes, it cancels, or its connection closes) is told so through a
//! [`Cancel`] flag and stops at its next step: nothing a client gave up on takes effect
//! later behind its back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use phos_control::{
    Cancel, CheckpointRequest, CheckpointSummary, ControlError, FleetSessions, Incoming, LoadReport, MigrateRequest,
    MigrationSummary, PolicyDetail, PolicyLoad, PolicySummary, Progress, RestoreRequest, RestoreSummary, RouterControl,
    SessionIdentity, SessionInfo, TenantUsage,
};
use phos_policy::engine::{PolicyError, PolicyInfo};
use tarpc::context::Context;

use crate::Router;

#[derive(Clone)]
pub struct RouterCtl {
    pub router: Arc<Router>,
    /// Set once this connection's client has gone.
    pub gone: Cancel,
}

impl RouterCtl {
    pub fn into_service(
        self,
    ) -> impl tarpc::server::Serve<Req = phos_control::RouterControlRequest, Resp = phos_control::RouterControlResponse>
    + Clone
    + Send
    + 'static {
        self.serve()
    }
}

/// Run `f` on a blocking thread with a flag that is set if the request is dropped (its
/// deadline passed, its client cancelled it) or its client's connection closes.
async fn blocking<T: Send + 'static>(
    gone: &Cancel,
    f: impl FnOnce(&Cancel) -> Result<T, ControlError> + Send + 'static,
) -> Result<T, ControlError> {
    let cancel = gone.child();
    let _on_drop = cancel.on_drop();
    tokio::task::spawn_blocking(move || f(&cancel)).await.map_err(|e| ControlError::io("the operation's thread", e))?
}

impl RouterControl for RouterCtl {
    async fn sessions(self, _: Context) -> Vec<SessionInfo> {
        self.router.session_infos()
    }

    async fn fleet_sessions(self, _: Context) -> Vec<FleetSessions> {
        self.router.fleet_sessions().await
    }

    async fn checkpoint(
        self,
        _: Context,
        session: u64,
        request: CheckpointRequest,
    ) -> Result<CheckpointSummary, ControlError> {
        let router = self.router.clone();
        blocking(&self.gone, move |cancel| router.checkpoint(session, request, cancel)).await
    }

    async fn restore(self, _: Context, request: RestoreRequest) -> Result<RestoreSummary, ControlError> {
        let router = self.router.clone();
        let started = Instant::now();
        blocking(&self.gone, move |cancel| {
            let (entry, summary) = router.restore(&request, cancel)?;
            Ok(RestoreSummary { session: entry.id, total_ms: started.elapsed().as_secs_f64() * 1e3, ..summary })
        })
        .await
    }

    async fn progress(self, _: Context, session: u64) -> Option<Progress> {
        let ctl = match self.router.restoring(session) {
            Some(ctl) => ctl,
            None => self.router.session(session)?.control_socket()?,
        };
        let client = phos_control::server_client(&ctl).await.ok()?;
        client.progress(tarpc::context::current()).await.ok()
    }

    async fn cut_channels(self, _: Context, session: u64, within: Duration) -> Result<u64, ControlError> {
        let router = self.router.clone();
        blocking(&self.gone, move |_| router.cut_channels(session, within)).await
    }

    async fn unpark(self, _: Context, session: u64) -> Result<(), ControlError> {
        let router = self.router.clone();
        blocking(&self.gone, move |_| router.unpark(session)).await
    }

    async fn restore_load(self, _: Context, session: u64) -> Option<LoadReport> {
        self.router.restore_load(session)
    }

    async fn policy_load(self, _: Context, policy: PolicyLoad) -> Result<PolicySummary, ControlError> {
        let router = self.router.clone();
        blocking(&self.gone, move |cancel| router.load_policy(policy, cancel)).await
    }

    async fn policy_unload(self, _: Context, name: String) -> Result<(), ControlError> {
        self.router.policies.unload(&name).map_err(|e| policy_error(&name, e))
    }

    async fn policy_list(self, _: Context) -> Vec<PolicySummary> {
        self.router.policies.list().into_iter().map(summary).collect()
    }

    async fn policy_show(self, _: Context, name: String) -> Result<PolicyDetail, ControlError> {
        let (info, disassembly, maps) = self.router.policies.show(&name).map_err(|e| policy_error(&name, e))?;
        Ok(PolicyDetail {
            summary: summary(info),
            disassembly,
            maps: maps
                .into_iter()
                .map(|m| (m.name, m.kind, m.key_size, m.value_size, m.max_entries, m.entries))
                .collect(),
        })
    }

    async fn usage(self, _: Context) -> Vec<TenantUsage> {
        self.router.tenants.usage()
    }

    async fn migrate(
        self,
        _: Context,
        session: u64,
        request: MigrateRequest,
    ) -> Result<MigrationSummary, ControlError> {
        let router = self.router.clone();
        blocking(&self.gone, move |cancel| router.migrate(session, &request, cancel)).await
    }

    async fn migrate_prepare(
        self,
        _: Context,
        session: u64,
        identity: SessionIdentity,
        pid: u32,
        remote: bool,
    ) -> Result<Incoming, ControlError> {
        let router = self.router.clone();
        blocking(&self.gone, move |cancel| router.migrate_prepare(session, identity, pid, remote, cancel)).await
    }

    async fn migrate_finish(self, _: Context, ticket: u64) -> Result<RestoreSummary, ControlError> {
        let router = self.router.clone();
        blocking(&self.gone, move |_| router.migrate_finish(ticket)).await
    }

    async fn migrate_abort(self, _: Context, ticket: u64) {
        let router = self.router.clone();
        let _ = tokio::task::spawn_blocking(move || router.migrate_abort(ticket)).await;
    }

    async fn vm_migrated(self, _: Context, report: Option<phos_control::VmMigrationReport>) {
        self.router.vm_migrated(report);
    }
}

/// What a failed operation on policy `name` says to its client.
pub(crate) fn policy_error(name: &str, e: PolicyError) -> ControlError {
    let name = name.to_string();
    match e {
        PolicyError::NotFound(_) => ControlError::NoSuchPolicy { name },
        PolicyError::Abandoned => ControlError::PolicyAbandoned { name },
        e => ControlError::PolicyRefused { name, reason: e.to_string() },
    }
}

pub(crate) fn summary(p: PolicyInfo) -> PolicySummary {
    PolicySummary {
        name: p.name,
        source: p.source,
        program: p.program,
        instructions: p.instructions,
        loaded_unix_s: p.loaded_unix_s,
        kernel_verified: p.kernel_verified,
        runs: p.runs,
        admitted: p.admitted,
        delayed: p.delayed,
        rejected: p.rejected,
        mean_run_ns: p.mean_run_ns,
    }
}
