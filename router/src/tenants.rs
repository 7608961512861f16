//! Tenants and what they use.
//!
//! A tenant is who a connection belongs to: a name the configuration gives to a set of Unix
//! user ids or to a socket of its own, else `uid:N` for the connecting user. Every session
//! belongs to one tenant, and the tenant's usage is the sum over its sessions, kept per
//! spec resource:
//!
//! - **continuous** resources (device memory) are *held*: the API servers report how much
//!   each session holds after every call that changes it;
//! - **instantaneous** ones (launches, bytes copied) are *used*: counted from the cost table
//!   as calls are admitted;
//! - **measured** ones (device time) are *measured* by the servers after the fact, and
//!   charged as [`crate::contention`] says when tenants' work overlaps; until a call's
//!   measurement arrives, the tenant's figure includes an estimate for it (the tenant's
//!   mean so far), so that a tenant cannot queue unmeasured work for free. The calls not
//!   measured yet are the tenant's queue on the device (the servers report each kernel as
//!   it ends), and the time that queue last emptied is kept for policies.
//!
//! Nothing here knows what the resources are: names, kinds and quota errors come from the
//! specs (`apis::RESOURCES`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use phos_control::TenantUsage;
use phos_policy::engine::monotonic_ns;

use crate::contention::Contention;
use phos_protocol::apis::RESOURCES;
use phos_protocol::limits::LimitKind;
use phos_protocol::spec::ResourceKind;

/// A tenant's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(pub String);

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Tenant {
    /// The tenant of a Unix user nobody configured.
    pub fn of_uid(uid: u32) -> Tenant {
        Tenant(format!("uid:{uid}"))
    }
}

/// What the configuration says about a tenant.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Unix users whose connections to the main socket are this tenant.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// A socket of the tenant's own: every connection to it is this tenant (its file
    /// permissions say who may connect).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Weight for fair-share policies.
    #[serde(default = "one")]
    pub share: u64,
    /// Quotas per continuous resource, by spec name (`device_memory = "8GiB"`).
    #[serde(default)]
    pub quota: HashMap<String, Amount>,
    /// The secret a guest connecting over TCP presents (`PHOS_TENANT_TOKEN`): there is no
    /// peer credential to go by. At least 16 characters.
    #[serde(default)]
    pub token: Option<String>,
}

fn one() -> u64 {
    1
}

/// A number in a configuration file: an integer, or a string with a unit (`"8GiB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amount(pub u64);

impl<'de> serde::Deserialize<'de> for Amount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Amount(n)),
            Raw::Text(s) => phos_policy::engine::parse_amount(&s)
                .and_then(|n| u64::try_from(n).ok())
                .map(Amount)
                .ok_or_else(|| serde::de::Error::custom(format!("`{s}` is not an amount"))),
        }
    }
}

/// One tenant's live state.
pub struct TenantState {
    /// Dense number (0, 1, ...) in order of first appearance: what policies index maps by.
    pub index: u64,
    pub name: Tenant,
    pub share: AtomicU64,
    /// Per resource: the quota (0: none).
    quota: Vec<AtomicU64>,
    /// Per resource: held (continuous), used (instantaneous) or measured (measured).
    used: Vec<AtomicU64>,
    /// Measured resources: calls measured, and calls admitted that will be measured.
    measured_calls: Vec<AtomicU64>,
    admitted_measured: Vec<AtomicU64>,
    /// Measured resources: when the calls admitted and not measured last fell to none
    /// (monotonic ns; 0: never).
    drained_ns: Vec<AtomicU64>,
    /// Continuous resources: amounts of calls admitted and not yet answered.
    reserved: Vec<AtomicU64>,
    pub calls: AtomicU64,
    pub delayed: AtomicU64,
    pub delay_ns: AtomicU64,
    pub rejected: AtomicU64,
    /// Calls its sessions' servers refused for a per-session limit, per
    /// [`LimitKind`](phos_protocol::limits::LimitKind) (by index).
    pub limit_refusals: Vec<AtomicU64>,
    pub sessions: AtomicU64,
    /// Sessions alive now whose guest reported a bypass (`phosReportBypass`).
    pub bypassed_sessions: AtomicU64,
    /// Clock of the last call (monotonic ns), for "active".
    pub last_call_ns: AtomicU64,
    /// Channels open (or being connected) in all the tenant's sessions.
    pub channels: AtomicU64,
    /// Bytes of frames the router holds for the tenant's channels.
    pub buffered: Arc<phos_protocol::transport::BufferBudget>,
    /// Connections refused by a limit, per limit.
    pub limit_hits: crate::limits::LimitHits,
    /// Shared by all tenants: how measured device time is charged when their work overlaps.
    contention: Arc<Contention>,
}

fn zeros() -> Vec<AtomicU64> {
    RESOURCES.iter().map(|_| AtomicU64::new(0)).collect()
}

impl TenantState {
    fn new(index: u64, name: Tenant, contention: Arc<Contention>, buffered: u64) -> Self {
        TenantState {
            index,
            name,
            share: AtomicU64::new(1),
            quota: zeros(),
            used: zeros(),
            measured_calls: zeros(),
            admitted_measured: zeros(),
            drained_ns: zeros(),
            reserved: zeros(),
            calls: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            delay_ns: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            limit_refusals: LimitKind::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            sessions: AtomicU64::new(0),
            bypassed_sessions: AtomicU64::new(0),
            last_call_ns: AtomicU64::new(0),
            channels: AtomicU64::new(0),
            buffered: phos_protocol::transport::BufferBudget::new(buffered),
            limit_hits: Default::default(),
            contention,
        }
    }

    fn configure(&self, c: &TenantConfig) {
        self.share.store(c.share.max(1), Ordering::Relaxed);
        for (i, r) in RESOURCES.iter().enumerate() {
            let q = c.quota.get(r.name).map(|a| a.0).unwrap_or(0);
            self.quota[i].store(q, Ordering::Relaxed);
        }
    }

    pub fn quota(&self, rc: usize) -> u64 {
        self.quota[rc].load(Ordering::Relaxed)
    }

    /// What policies see as the tenant's use of `rc` (see the module docs).
    pub fn used(&self, rc: usize) -> u64 {
        self.used[rc].load(Ordering::Relaxed).saturating_add(self.pending(rc))
    }

    /// For a measured resource, the estimate for calls admitted and not measured yet: the
    /// tenant's mean measured amount per call for each (0 for other resources).
    pub fn pending(&self, rc: usize) -> u64 {
        self.queued(rc).saturating_mul(self.mean(rc))
    }

    /// For a measured resource, the calls admitted and not measured yet (for device time,
    /// the tenant's kernels queued or running); 0 for other resources.
    pub fn queued(&self, rc: usize) -> u64 {
        if RESOURCES[rc].kind != ResourceKind::Measured {
            return 0;
        }
        let measured = self.measured_calls[rc].load(Ordering::Relaxed);
        self.admitted_measured[rc].load(Ordering::Relaxed).saturating_sub(measured)
    }

    /// For a measured resource, the tenant's mean charge per measured call so far (the
    /// estimate of a call not measured yet); 0 for other resources.
    pub fn mean(&self, rc: usize) -> u64 {
        if RESOURCES[rc].kind != ResourceKind::Measured {
            return 0;
        }
        let measured = self.measured_calls[rc].load(Ordering::Relaxed);
        self.used[rc].load(Ordering::Relaxed).checked_div(measured).unwrap_or(0)
    }

    /// For a measured resource, when [`queued`](Self::queued) last fell to 0 (monotonic ns;
    /// 0: never).
    pub fn drained_ns(&self, rc: usize) -> u64 {
        self.drained_ns[rc].load(Ordering::Relaxed)
    }

    /// Note the time if the tenant's queue of `rc` just emptied (`was` calls before).
    fn note_drained(&self, rc: usize, was: u64) {
        if was > 0 && self.queued(rc) == 0 {
            self.drained_ns[rc].store(monotonic_ns(), Ordering::Relaxed);
        }
    }

    pub fn reserved(&self, rc: usize) -> u64 {
        self.reserved[rc].load(Ordering::Relaxed)
    }

    pub(crate) fn consume(&self, rc: usize, amount: u64) {
        self.used[rc].fetch_add(amount, Ordering::Relaxed);
    }

    pub(crate) fn reserve(&self, rc: usize, amount: u64) {
        self.reserved[rc].fetch_add(amount, Ordering::Relaxed);
    }

    pub(crate) fn unreserve(&self, rc: usize, amount: u64) {
        let _ =
            self.reserved[rc].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(amount)));
    }

    pub(crate) fn admit_measured(&self, rc: usize, delta: i64) {
        let was = self.queued(rc);
        add_signed(&self.admitted_measured[rc], delta);
        self.contention.pending(self.index as usize, delta, monotonic_ns());
        self.note_drained(rc, was);
    }

    /// A session's held amount changed by `delta`.
    pub(crate) fn held_changed(&self, rc: usize, delta: i64) {
        add_signed(&self.used[rc], delta);
    }

    /// A session's servers measured `calls` more calls at `amount` in all; the tenant is
    /// charged what [`Contention`] allows of it.
    pub(crate) fn measured(&self, rc: usize, amount: u64, calls: u64) {
        let was = self.queued(rc);
        let charged = self.contention.measured(self.index as usize, amount, calls, monotonic_ns());
        self.used[rc].fetch_add(charged, Ordering::Relaxed);
        self.measured_calls[rc].fetch_add(calls, Ordering::Relaxed);
        self.note_drained(rc, was);
    }
}

fn add_signed(a: &AtomicU64, delta: i64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_add_signed(delta)));
}

/// Every tenant seen so far, and the configuration of the known ones.
#[derive(Default)]
pub struct Tenants {
    configs: Vec<TenantConfig>,
    by_uid: HashMap<u32, usize>,
    states: RwLock<Vec<Arc<TenantState>>>,
    create: Mutex<()>,
    contention: Arc<Contention>,
    /// Each tenant's budget of buffered frame bytes.
    buffered_per_tenant: u64,
}

/// A tenant configuration that does not check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantConfigError {
    #[error("tenant `{0}` is configured twice")]
    Twice(String),
    #[error("uid {0} belongs to two tenants")]
    UidTwice(u32),
    #[error("tenant `{0}`: a token needs at least {MIN_TOKEN_LEN} characters")]
    ShortToken(String),
    #[error("tenant `{0}` has another tenant's token")]
    SharedToken(String),
    #[error("tenant `{tenant}`: resource `{resource}` has no quota")]
    NoQuota { tenant: String, resource: String },
    #[error("tenant `{tenant}`: no resource `{resource}` in the spec")]
    NoResource { tenant: String, resource: String },
}

/// The shortest tenant token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// How long after its last call a tenant still counts as active.
pub const ACTIVE_NS: u64 = 100_000_000;

impl Tenants {
    pub fn new(configs: Vec<TenantConfig>) -> Result<Self, TenantConfigError> {
        let mut by_uid = HashMap::new();
        let mut names = std::collections::HashSet::new();
        for (i, c) in configs.iter().enumerate() {
            if !names.insert(c.name.clone()) {
                return Err(TenantConfigError::Twice(c.name.clone()));
            }
            for &uid in &c.uids {
                if by_uid.insert(uid, i).is_some() {
                    return Err(TenantConfigError::UidTwice(uid));
                }
            }
            if let Some(t) = &c.token {
                if t.len() < MIN_TOKEN_LEN {
                    return Err(TenantConfigError::ShortToken(c.name.clone()));
                }
                if configs[..i].iter().any(|o| o.token.as_deref() == Some(t.as_str())) {
                    return Err(TenantConfigError::SharedToken(c.name.clone()));
                }
            }
            for r in c.quota.keys() {
                let (tenant, resource) = (c.name.clone(), r.clone());
                match RESOURCES.iter().find(|x| x.name == r.as_str()) {
                    Some(x) if x.exhausted.is_some() => {}
                    Some(_) => return Err(TenantConfigError::NoQuota { tenant, resource }),
                    None => return Err(TenantConfigError::NoResource { tenant, resource }),
                }
            }
        }
        Ok(Tenants {
            configs,
            by_uid,
            buffered_per_tenant: crate::limits::Limits::default().buffered_per_tenant,
            ..Default::default()
        })
    }

    /// Give each tenant this many bytes of buffered frames (see [`crate::limits::Limits`]).
    pub fn with_buffer_limit(mut self, bytes: u64) -> Self {
        self.buffered_per_tenant = bytes;
        self
    }

    pub fn configs(&self) -> &[TenantConfig] {
        &self.configs
    }

    /// The tenant whose token this is (TCP guests). Every configured token is compared, each
    /// in constant time, so the answer's timing tells nothing about how much of one matched.
    pub fn for_token(&self, token: &str) -> Option<Tenant> {
        let mut found = None;
        for c in &self.configs {
            if let Some(t) = &c.token {
                let same =
                    t.len() == token.len() && t.bytes().zip(token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
                if same {
                    found = Some(Tenant(c.name.clone()));
                }
            }
        }
        found
    }

    /// Whether `tenant` is one a connection can be: a configured tenant, or `uid:N`.
    pub fn is_known(&self, tenant: &Tenant) -> bool {
        self.configs.iter().any(|c| c.name == tenant.0)
            || tenant
                .0
                .strip_prefix("uid:")
                .is_some_and(|n| n.parse::<u32>().is_ok_and(|u| Tenant::of_uid(u) == *tenant))
    }

    /// The tenant of a connection from `uid` to the main socket.
    pub fn for_uid(&self, uid: u32) -> Tenant {
        match self.by_uid.get(&uid) {
            Some(&i) => Tenant(self.configs[i].name.clone()),
            None => Tenant::of_uid(uid),
        }
    }

    /// The state of `tenant`, created (and configured) on first use.
    pub fn state(&self, tenant: &Tenant) -> Arc<TenantState> {
        if let Some(s) = self.states.read().iter().find(|s| s.name == *tenant) {
            return s.clone();
        }
        let _one_at_a_time = self.create.lock();
        if let Some(s) = self.states.read().iter().find(|s| s.name == *tenant) {
            return s.clone();
        }
        let mut states = self.states.write();
        let s = Arc::new(TenantState::new(
            states.len() as u64,
            tenant.clone(),
            self.contention.clone(),
            self.buffered_per_tenant,
        ));
        if let Some(c) = self.configs.iter().find(|c| c.name == tenant.0) {
            s.configure(c);
        }
        states.push(s.clone());
        s
    }

    /// One look at every tenant, for a policy's context: the tenants active at `now`
    /// (monotonic ns) as (count, sum of shares), and per resource the calls admitted and not
    /// measured yet of every tenant but the one numbered `me`, written into `others_queued`
    /// (for device time, the others' kernels queued or running; 0 for resources that are not
    /// measured).
    pub fn census(&self, me: u64, now: u64, others_queued: &mut [u64]) -> (u64, u64) {
        let states = self.states.read();
        let mut n = 0;
        let mut shares = 0;
        others_queued.fill(0);
        let resources = others_queued.len().min(RESOURCES.len());
        for s in states.iter() {
            let last = s.last_call_ns.load(Ordering::Relaxed);
            if last != 0 && now.saturating_sub(last) <= ACTIVE_NS {
                n += 1;
                shares += s.share.load(Ordering::Relaxed);
            }
            if s.index != me {
                for (rc, q) in others_queued[..resources].iter_mut().enumerate() {
                    *q += s.queued(rc);
                }
            }
        }
        (n, shares)
    }

    pub fn usage(&self) -> Vec<TenantUsage> {
        self.states
            .read()
            .iter()
            .map(|s| TenantUsage {
                name: s.name.0.clone(),
                index: s.index,
                share: s.share.load(Ordering::Relaxed),
                sessions: s.sessions.load(Ordering::Relaxed),
                bypassed_sessions: s.bypassed_sessions.load(Ordering::Relaxed),
                calls: s.calls.load(Ordering::Relaxed),
                delayed: s.delayed.load(Ordering::Relaxed),
                delay_ns: s.delay_ns.load(Ordering::Relaxed),
                rejected: s.rejected.load(Ordering::Relaxed),
                // The router's own limits, then the API servers' per-session ones.
                limit_refusals: crate::limits::LimitKind::ALL
                    .iter()
                    .map(|&k| (k.name().to_string(), s.limit_hits.get(k)))
                    .chain(
                        LimitKind::ALL
                            .iter()
                            .map(|k| (k.name().to_string(), s.limit_refusals[k.index()].load(Ordering::Relaxed))),
                    )
                    .collect(),
                resources: RESOURCES
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let kind = match r.kind {
                            ResourceKind::Continuous => "held",
                            ResourceKind::Instantaneous => "used",
                            ResourceKind::Measured => "measured",
                        };
                        (r.name.to_string(), kind.to_string(), s.used(i), s.quota(i))
                    })
                    .collect(),
                channels: s.channels.load(Ordering::Relaxed),
                buffered_bytes: s.buffered.used(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc(name: &str) -> usize {
        RESOURCES.iter().position(|r| r.name == name).unwrap()
    }

    /// The router's books are shared by every tenant: a thread that panics holding their
    /// locks (a bug one guest hit) must not make every later caller panic too.
    #[test]
    fn a_panic_under_the_books_locks_leaves_them_usable() {
        let t = Arc::new(Tenants::new(vec![]).unwrap());
        let first = t.state(&Tenant("a".into()));
        let held = t.clone();
        let panicked = std::thread::spawn(move || {
            let _create = held.create.lock();
            let _states = held.states.write();
            panic!("a bug under the locks");
        })
        .join();
        assert!(panicked.is_err());
        assert!(Arc::ptr_eq(&first, &t.state(&Tenant("a".into()))));
        assert_eq!(t.state(&Tenant("b".into())).index, 1);
        assert_eq!(t.usage().len(), 2);
    }

    #[test]
    fn configured_tenants_by_uid_and_defaults() {
        let c: TenantConfig = toml::from_str(
            r#"
            name = "alice"
            uids = [1000, 1001]
            share = 3
            quota = { device_memory = "1GiB" }
            "#,
        )
        .unwrap();
        let t = Tenants::new(vec![c]).unwrap();
        assert_eq!(t.for_uid(1001), Tenant("alice".into()));
        assert_eq!(t.for_uid(7), Tenant("uid:7".into()));
        let alice = t.state(&Tenant("alice".into()));
        assert_eq!(alice.share.load(Ordering::Relaxed), 3);
        assert_eq!(alice.quota(rc("device_memory")), 1 << 30);
        let other = t.state(&Tenant("uid:7".into()));
        assert_eq!((alice.index, other.index), (0, 1));
        assert_eq!(other.quota(rc("device_memory")), 0);
        assert!(Arc::ptr_eq(&alice, &t.state(&Tenant("alice".into()))));
    }

    #[test]
    fn bad_configurations_are_refused() {
        let quota = |r: &str| TenantConfig {
            name: "a".into(),
            uids: vec![],
            socket: None,
            share: 1,
            quota: [(r.to_string(), Amount(1))].into(),
            token: None,
        };
        let (tenant, resource) = ("a".to_string(), "kernel_launches".to_string());
        assert_eq!(Tenants::new(vec![quota(&resource)]).err(), Some(TenantConfigError::NoQuota { tenant, resource }));
        let (tenant, resource) = ("a".to_string(), "no_such_thing".to_string());
        assert_eq!(
            Tenants::new(vec![quota(&resource)]).err(),
            Some(TenantConfigError::NoResource { tenant, resource })
        );
        let two = |name: &str| TenantConfig {
            name: name.into(),
            uids: vec![5],
            socket: None,
            share: 1,
            quota: [].into(),
            token: None,
        };
        assert_eq!(Tenants::new(vec![two("a"), two("b")]).err(), Some(TenantConfigError::UidTwice(5)));
        assert_eq!(Tenants::new(vec![two("a"), two("a")]).err(), Some(TenantConfigError::Twice("a".into())));
        let with_token = |name: &str, t: &str| TenantConfig {
            name: name.into(),
            uids: vec![],
            socket: None,
            share: 1,
            quota: [].into(),
            token: Some(t.into()),
        };
        assert_eq!(Tenants::new(vec![with_token("a", "short")]).err(), Some(TenantConfigError::ShortToken("a".into())));
        let secret = "0123456789abcdef-a";
        let shared = Tenants::new(vec![with_token("a", secret), with_token("b", secret)]).err();
        assert_eq!(shared, Some(TenantConfigError::SharedToken("b".into())));
        let t = Tenants::new(vec![with_token("a", secret), with_token("b", "0123456789abcdef-b")]).unwrap();
        assert_eq!(t.for_token(secret), Some(Tenant("a".into())));
        assert_eq!(t.for_token("0123456789abcdef-c"), None);
        assert_eq!(t.for_token(""), None);
    }

    fn mem_rc() -> usize {
        rc("device_memory")
    }

    #[test]
    fn the_queue_of_measured_calls_and_when_it_last_emptied() {
        let t = Tenants::new(vec![]).unwrap();
        let s = t.state(&Tenant("x".into()));
        let dt = rc("device_time");
        assert_eq!((s.queued(dt), s.drained_ns(dt)), (0, 0), "never had work");
        s.admit_measured(dt, 3);
        std::thread::sleep(std::time::Duration::from_micros(10));
        s.measured(dt, 2, 2);
        assert_eq!((s.queued(dt), s.drained_ns(dt)), (1, 0), "one kernel still queued");
        let before = monotonic_ns();
        s.measured(dt, 1, 1);
        let drained = s.drained_ns(dt);
        assert_eq!(s.queued(dt), 0);
        assert!(before <= drained && drained <= monotonic_ns(), "emptied at {drained}, asked at {before}");
        // A report with nothing new while the queue is empty does not move it.
        std::thread::sleep(std::time::Duration::from_micros(10));
        s.measured(dt, 0, 0);
        assert_eq!(s.drained_ns(dt), drained);
        // A call that failed will not be measured: the queue empties with it.
        s.admit_measured(dt, 2);
        s.measured(dt, 1, 1);
        assert_eq!((s.queued(dt), s.drained_ns(dt)), (1, drained));
        s.admit_measured(dt, -1);
        assert_eq!(s.queued(dt), 0);
        assert!(s.drained_ns(dt) > drained);
    }

    #[test]
    fn the_other_tenants_queues() {
        let t = Tenants::new(vec![]).unwrap();
        let (x, y, z) = (t.state(&Tenant("x".into())), t.state(&Tenant("y".into())), t.state(&Tenant("z".into())));
        let dt = rc("device_time");
        let others_queued = |me: u64, rc: usize| {
            let mut q = vec![0; RESOURCES.len()];
            t.census(me, monotonic_ns(), &mut q);
            q[rc]
        };
        x.admit_measured(dt, 2);
        y.admit_measured(dt, 3);
        assert_eq!([others_queued(x.index, dt), others_queued(y.index, dt), others_queued(z.index, dt)], [3, 2, 5]);
        y.measured(dt, 30, 3);
        assert_eq!(others_queued(x.index, dt), 0, "the device is free of the others' work");
        assert_eq!(others_queued(z.index, mem_rc()), 0, "only measured resources queue");
    }

    #[test]
    fn measured_use_includes_an_estimate_for_unmeasured_calls() {
        let t = Tenants::new(vec![]).unwrap();
        let s = t.state(&Tenant("x".into()));
        let dt = rc("device_time");
        // Four calls admitted, two measured at 10 ns each: 20 measured + 2 * 10 estimated.
        // (The tenant runs alone, so it is charged what it measured once it has had the
        // GPU for as long.)
        s.admit_measured(dt, 4);
        std::thread::sleep(std::time::Duration::from_micros(10));
        s.measured(dt, 20, 2);
        assert_eq!(s.used(dt), 40);
        // A failed call is never measured: it leaves the estimate.
        s.admit_measured(dt, -1);
        assert_eq!(s.used(dt), 30);
        assert_eq!((s.queued(dt), s.mean(dt)), (1, 10));
        assert_eq!(s.queued(mem_rc()), 0, "only measured resources queue");
        let mem = rc("device_memory");
        s.held_changed(mem, 100);
        s.held_changed(mem, -300);
        assert_eq!(s.used(mem), 0, "held never goes below zero");
    }
}
