//! What one tenant may hold of the router, and what every connection may take before it
//! is anybody's.
//!
//! The router is shared: a tenant that opens connections without end, never finishes a
//! handshake, or sends frames larger than it needs must cost only itself. Every resource a
//! connection takes in the router is bounded here ([`Limits`], the `[limits]` table of the
//! configuration file); an exceeded limit refuses that connection with
//! `cudaErrorDevicesUnavailable` (the guest's call fails with it), counts in the tenant's
//! metrics ([`LimitKind`]) and writes a rate-limited log line, nothing more.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::tenants::Amount;

/// Per-tenant and router-wide bounds (`[limits]` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Sessions (guest processes, each with an API server process) of one tenant.
    pub sessions_per_tenant: u64,
    /// Channels (calling threads) of one session.
    pub channels_per_session: u64,
    /// Channels of all of one tenant's sessions.
    pub channels_per_tenant: u64,
    /// Connections of one tenant (over TCP: of one address) still in their handshake.
    pub pending_per_tenant: u64,
    /// Connections in their handshake, all together.
    pub pending_total: u64,
    /// How long a connection has to finish its handshake.
    pub handshake_timeout: Duration,
    /// Bytes of frames the router holds for one tenant's channels at once (beyond 1 MiB
    /// each); it must be at least the largest frame a guest sends (`max_payload`).
    pub buffered_per_tenant: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            sessions_per_tenant: 64,
            channels_per_session: 1024,
            channels_per_tenant: 4096,
            pending_per_tenant: 64,
            pending_total: 1024,
            handshake_timeout: Duration::from_secs(10),
            buffered_per_tenant: 4 << 30,
        }
    }
}

/// The `[limits]` table as written: every key optional. Keys other than the router's own
/// are the per-session limits on objects ([`phos_protocol::limits`]), checked by
/// [`ConfigFile::session_limits`](crate::config::ConfigFile::session_limits).
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct LimitsFile {
    pub sessions_per_tenant: Option<u64>,
    pub channels_per_session: Option<u64>,
    pub channels_per_tenant: Option<u64>,
    pub pending_handshakes_per_tenant: Option<u64>,
    pub pending_handshakes: Option<u64>,
    /// A duration: `"10s"`, `"500ms"`, or nanoseconds.
    pub handshake_timeout: Option<Amount>,
    pub buffered_per_tenant: Option<Amount>,
    /// Objects one session may hold, by kind (`streams = 16384`).
    #[serde(flatten)]
    pub per_session: std::collections::BTreeMap<String, u64>,
}

impl LimitsFile {
    /// The limits, defaults filled in.
    pub fn resolve(&self) -> Result<Limits, LimitsError> {
        let d = Limits::default();
        let l = Limits {
            sessions_per_tenant: self.sessions_per_tenant.unwrap_or(d.sessions_per_tenant),
            channels_per_session: self.channels_per_session.unwrap_or(d.channels_per_session),
            channels_per_tenant: self.channels_per_tenant.unwrap_or(d.channels_per_tenant),
            pending_per_tenant: self.pending_handshakes_per_tenant.unwrap_or(d.pending_per_tenant),
            pending_total: self.pending_handshakes.unwrap_or(d.pending_total),
            handshake_timeout: self.handshake_timeout.map_or(d.handshake_timeout, |a| Duration::from_nanos(a.0)),
            buffered_per_tenant: self.buffered_per_tenant.map_or(d.buffered_per_tenant, |a| a.0),
        };
        if l.handshake_timeout < Duration::from_millis(10) {
            return Err(LimitsError::HandshakeTimeoutTooShort);
        }
        for (name, v) in [
            ("sessions_per_tenant", l.sessions_per_tenant),
            ("channels_per_session", l.channels_per_session),
            ("channels_per_tenant", l.channels_per_tenant),
            ("pending_handshakes_per_tenant", l.pending_per_tenant),
            ("pending_handshakes", l.pending_total),
        ] {
            if v == 0 {
                return Err(LimitsError::Zero(name));
            }
        }
        Ok(l)
    }
}

/// A `[limits]` table that does not check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("[limits] handshake_timeout below 10 ms would refuse every guest")]
    HandshakeTimeoutTooShort,
    #[error("[limits] {0} = 0 would refuse every guest")]
    Zero(&'static str),
    /// A per-session limit on objects (the API servers' `--limit KIND=N`).
    #[error("[limits] {0}")]
    PerSession(String),
}

/// Which limit refused a connection (a label of the tenant's metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Sessions,
    ChannelsPerSession,
    ChannelsPerTenant,
    PendingHandshakes,
    HandshakeTimeout,
    BufferedBytes,
    /// The router itself ran short (file descriptors, threads, memory, processes).
    RouterResources,
}

impl LimitKind {
    pub const ALL: [LimitKind; 7] = [
        LimitKind::Sessions,
        LimitKind::ChannelsPerSession,
        LimitKind::ChannelsPerTenant,
        LimitKind::PendingHandshakes,
        LimitKind::HandshakeTimeout,
        LimitKind::BufferedBytes,
        LimitKind::RouterResources,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LimitKind::Sessions => "sessions",
            LimitKind::ChannelsPerSession => "channels_per_session",
            LimitKind::ChannelsPerTenant => "channels_per_tenant",
            LimitKind::PendingHandshakes => "pending_handshakes",
            LimitKind::HandshakeTimeout => "handshake_timeout",
            LimitKind::BufferedBytes => "buffered_bytes",
            LimitKind::RouterResources => "router_resources",
        }
    }
}

/// Refusals per [`LimitKind`], for one tenant.
#[derive(Debug, Default)]
pub struct LimitHits([AtomicU64; LimitKind::ALL.len()]);

impl LimitHits {
    pub fn hit(&self, kind: LimitKind) {
        self.0[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, kind: LimitKind) -> u64 {
        self.0[kind as usize].load(Ordering::Relaxed)
    }
}

/// Connections in their handshake, all together and per key (a tenant; over TCP, where the
/// tenant is not known yet, the peer's address).
#[derive(Debug, Default)]
pub struct Pending {
    total: AtomicU64,
    by_key: Mutex<HashMap<String, u64>>,
}

/// A connection's place among the [`Pending`] ones, given back when dropped.
#[derive(Debug)]
pub struct PendingSlot {
    pending: std::sync::Arc<Pending>,
    key: String,
}

impl Pending {
    /// A place for a connection of `key`, unless `key` has `per_key` already or everyone
    /// `total` together.
    pub fn enter(self: &std::sync::Arc<Self>, key: &str, per_key: u64, total: u64) -> Option<PendingSlot> {
        let mut by_key = self.by_key.lock();
        let mine = by_key.get(key).copied().unwrap_or(0);
        if mine >= per_key || self.total.load(Ordering::Relaxed) >= total {
            return None;
        }
        by_key.insert(key.to_owned(), mine + 1);
        self.total.fetch_add(1, Ordering::Relaxed);
        Some(PendingSlot { pending: self.clone(), key: key.to_owned() })
    }

    /// Connections in their handshake now.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut by_key = self.pending.by_key.lock();
        if let Some(n) = by_key.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                by_key.remove(&self.key);
            }
        }
        self.pending.total.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Take one of `limit` places counted by `counter`; `false` when all are taken.
pub fn take_place(counter: &AtomicU64, limit: u64) -> bool {
    counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < limit).then_some(n + 1)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_places_per_key_and_in_all() {
        let p = std::sync::Arc::new(Pending::default());
        let a1 = p.enter("a", 2, 3).unwrap();
        let _a2 = p.enter("a", 2, 3).unwrap();
        assert!(p.enter("a", 2, 3).is_none(), "a has its two");
        let _b1 = p.enter("b", 2, 3).unwrap();
        assert!(p.enter("c", 2, 3).is_none(), "three in all");
        drop(a1);
        assert_eq!(p.total(), 2);
        assert!(p.enter("a", 2, 3).is_some());
        assert!(p.by_key.lock().len() <= 2);
    }

    #[test]
    fn limits_from_a_file() {
        let f: LimitsFile =
            toml::from_str("sessions_per_tenant = 3\nhandshake_timeout = \"2s\"\nbuffered_per_tenant = \"1GiB\"")
                .unwrap();
        let l = f.resolve().unwrap();
        assert_eq!(l.sessions_per_tenant, 3);
        assert_eq!(l.handshake_timeout, Duration::from_secs(2));
        assert_eq!(l.buffered_per_tenant, 1 << 30);
        assert_eq!(l.channels_per_session, Limits::default().channels_per_session);
        let objects: LimitsFile = toml::from_str("streams = 3").unwrap();
        assert_eq!(objects.per_session.get("streams"), Some(&3));
        let zero: LimitsFile = toml::from_str("channels_per_session = 0").unwrap();
        assert_eq!(zero.resolve(), Err(LimitsError::Zero("channels_per_session")));
    }

    #[test]
    fn places_are_taken_up_to_the_limit() {
        let c = AtomicU64::new(0);
        assert!(take_place(&c, 2) && take_place(&c, 2));
        assert!(!take_place(&c, 2));
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }
}
