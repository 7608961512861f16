//! Deciding each call before it is forwarded, and keeping the books after.
//!
//! For every call the router computes, from the spec's cost table, what the call uses;
//! refuses it when it would take the tenant past a quota (with the error the spec names for
//! that resource, as a device that is full would); asks the loaded policies; and, once the
//! call is admitted, charges it to the session and the tenant. A delayed call waits on the
//! channel's own thread and is asked about again, so one tenant's waits never hold up
//! another's calls. The servers' usage reports and the replies close the books: held
//! amounts come from the reports, and a reservation made for an allocation in flight is
//! released when its reply passes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use phos_policy::engine::{CallContext, PolicySet, Verdict, monotonic_ns};
use phos_protocol::apis::{Function, RESOURCES};
use phos_protocol::handshake::UsageReport;
use phos_protocol::spec::{Charge, RcOp, ResourceKind};

use crate::session::SessionEntry;
use crate::tenants::{TenantState, Tenants};

/// What happens to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Forward,
    /// Answer the guest with this CUDA error; the call never reaches the server.
    Refuse(i32),
}

/// What an admitted call still has open until its reply: reservations and expected
/// measurements.
#[derive(Debug, Default)]
pub struct InFlight {
    pub call_id: u64,
    reserved: Vec<(usize, u64)>,
    measured: Vec<usize>,
}

impl InFlight {
    /// Whether the call's use of some resource is measured by the server once it has run.
    pub fn is_measured(&self) -> bool {
        !self.measured.is_empty()
    }
}

/// Decide about one call of `session` (`charges` from the cost table). Blocks while the
/// policies delay it.
pub fn admit(
    tenants: &Tenants,
    policies: &PolicySet,
    session: &SessionEntry,
    tenant: &TenantState,
    function: Function,
    charges: &[Charge],
    call_id: u64,
) -> (Decision, Option<InFlight>) {
    let now = monotonic_ns();
    tenant.last_call_ns.store(now, Ordering::Relaxed);
    tenant.calls.fetch_add(1, Ordering::Relaxed);
    let mut amount = [0u64; 16];
    for c in charges {
        if c.op == RcOp::Deallocates || c.resource >= amount.len() {
            continue;
        }
        // A measured amount is not known before the call has run: the tenant's mean so far.
        let a = match RESOURCES.get(c.resource).map(|r| r.kind) {
            Some(ResourceKind::Measured) => tenant.mean(c.resource),
            _ => c.amount.unwrap_or(0),
        };
        amount[c.resource] = amount[c.resource].saturating_add(a);
    }
    // Quotas first: they hold whatever the policies say.
    for (rc, info) in RESOURCES.iter().enumerate() {
        let quota = tenant.quota(rc);
        if info.kind != ResourceKind::Continuous || quota == 0 || amount[rc] == 0 {
            continue;
        }
        let after = tenant.used(rc).saturating_add(tenant.reserved(rc)).saturating_add(amount[rc]);
        if after > quota {
            let code = info.exhausted.unwrap_or_else(|| function.api().not_supported());
            tracing::info!(
                session = session.id,
                tenant = %tenant.name,
                "{} refused: {} {} would exceed the quota of {}",
                function.name(),
                info.name,
                after,
                quota
            );
            tenant.rejected.fetch_add(1, Ordering::Relaxed);
            return (Decision::Refuse(code), None);
        }
    }
    if !policies.is_empty() {
        let mut waited = Duration::ZERO;
        // Whether a thread of the guest waits at a barrier, maybe for this call (asked once
        // the call is held).
        let mut awaited = false;
        loop {
            let now = monotonic_ns();
            let mut ctx = CallContext {
                tenant: tenant.index,
                session: session.id,
                function: function.policy_id(),
                now_ns: now,
                share: tenant.share.load(Ordering::Relaxed),
                amount,
                awaited: u64::from(awaited),
                ..Default::default()
            };
            (ctx.active_tenants, ctx.active_shares) = tenants.census(tenant.index, now, &mut ctx.others_queued);
            for rc in 0..RESOURCES.len().min(ctx.used.len()) {
                ctx.used[rc] = tenant.used(rc);
                ctx.pending[rc] = tenant.pending(rc);
                ctx.quota[rc] = tenant.quota(rc);
                ctx.queued[rc] = tenant.queued(rc);
                ctx.drained_ns[rc] = tenant.drained_ns(rc);
            }
            match policies.decide(&ctx) {
                Verdict::Admit => break,
                Verdict::Delay(d) => {
                    if !awaited && session.waits_at_a_barrier() {
                        // This call may be among those a thread of the guest waits for: ask
                        // again at once, saying so.
                        awaited = true;
                        continue;
                    }
                    if waited.is_zero() {
                        tenant.delayed.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(d);
                    waited += d;
                    tenant.delay_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
                }
                Verdict::Reject(code) => {
                    tracing::debug!(session = session.id, tenant = %tenant.name, "{} rejected by policy ({code})", function.name());
                    tenant.rejected.fetch_add(1, Ordering::Relaxed);
                    return (Decision::Refuse(code), None);
                }
            }
        }
    }
    // Admitted: charge it.
    session.usage.record(function, charges);
    let mut inflight = InFlight { call_id, ..Default::default() };
    for c in charges {
        let info = &RESOURCES[c.resource];
        match (info.kind, c.op) {
            (ResourceKind::Instantaneous, _) => tenant.consume(c.resource, c.amount.unwrap_or(0)),
            (ResourceKind::Measured, _) => {
                tenant.admit_measured(c.resource, 1);
                session.admit_measured(c.resource, 1);
                inflight.measured.push(c.resource);
            }
            (ResourceKind::Continuous, RcOp::Allocates) => {
                let a = c.amount.unwrap_or(0);
                tenant.reserve(c.resource, a);
                inflight.reserved.push((c.resource, a));
            }
            (ResourceKind::Continuous, _) => {}
        }
    }
    (Decision::Forward, Some(inflight))
}

/// The reply to an admitted call passed: release its reservations; a failed call will never
/// be measured.
pub fn answered(session: &SessionEntry, tenant: &TenantState, inflight: InFlight, status: i32) {
    for (rc, a) in inflight.reserved {
        tenant.unreserve(rc, a);
    }
    if status != 0 {
        for rc in inflight.measured {
            tenant.admit_measured(rc, -1);
            session.admit_measured(rc, -1);
        }
    }
}

/// A server's usage report for `session`.
pub fn report(session: &SessionEntry, tenant: &TenantState, report: &UsageReport) {
    for &(rc, held) in &report.held {
        let rc = rc as usize;
        if RESOURCES.get(rc).is_some_and(|r| r.kind == ResourceKind::Continuous) {
            let delta = session.set_held(rc, held);
            tenant.held_changed(rc, delta);
        }
    }
    for &(rc, total, calls) in &report.measured {
        let rc = rc as usize;
        if RESOURCES.get(rc).is_some_and(|r| r.kind == ResourceKind::Measured) {
            let (amount, n) = session.set_measured(rc, total, calls);
            tenant.measured(rc, amount, n);
        }
    }
    for &(kind, total) in &report.refused {
        let new = session.set_refused(kind as usize, total);
        if let Some(count) = tenant.limit_refusals.get(kind as usize) {
            count.fetch_add(new, Ordering::Relaxed);
        }
    }
}

/// A session is gone: what it held is free, what it had in flight will not be measured.
pub fn session_ended(session: &SessionEntry, tenant: &Arc<TenantState>) {
    for (rc, info) in RESOURCES.iter().enumerate() {
        match info.kind {
            ResourceKind::Continuous => {
                let delta = session.set_held(rc, 0);
                tenant.held_changed(rc, delta);
            }
            ResourceKind::Measured => {
                let pending = session.unmeasured(rc);
                tenant.admit_measured(rc, -(pending as i64));
            }
            ResourceKind::Instantaneous => {}
        }
    }
    tenant.sessions.fetch_sub(1, Ordering::Relaxed);
}
