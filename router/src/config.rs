//! The router's configuration file (TOML), for `phosctl serve --config FILE`:
//!
//! ```toml
//! listen = "/run/phos/router.sock"   # the main socket (else --listen, else the default)
//! listen_tcp = "0.0.0.0:7070"        # also guests on other hosts (tenants with a token)
//! pool = 2                           # API servers started ahead of need
//! metrics = "127.0.0.1:9464"         # Prometheus endpoint
//! policy_budget = 100000             # instructions a policy may run per call
//! shared_memory = true               # let same-host guests move to shared-memory rings
//! ring_size = "4MiB"                 # each direction's ring, per channel
//! staging_slot = "8MiB"              # each of a channel's two slots for large copies
//!
//! name = "rack4-a"                  # what fleet listings call this router
//! peer_listen = "10.0.0.1:7101"      # the management service for peers (--peer-listen)
//! peer_secret_file = "/etc/phos/peer.secret"
//!
//! [[peer]]                           # the other routers of its fleet
//! name = "rack4-b"                   # (default: its endpoint)
//! endpoint = "tcp:10.0.0.2:7101"     # or unix:PATH of a router on this host
//!
//! [[tenant]]
//! name = "alice"
//! uids = [1000]                      # her connections to the main socket
//! socket = "/run/phos/alice.sock"    # and every connection to this one
//! share = 2                          # weight for fair-share policies
//! quota = { device_memory = "8GiB" } # per continuous resource of the spec
//! token = "a-long-random-secret"     # how her TCP guests identify (PHOS_TENANT_TOKEN)
//!
//! [limits]                           # defaults shown
//! sessions_per_tenant = 64           # what one tenant may hold of the router (`limits`)
//! channels_per_session = 1024
//! channels_per_tenant = 4096
//! pending_handshakes_per_tenant = 64 # over TCP: per peer address
//! pending_handshakes = 1024          # all together
//! handshake_timeout = "10s"
//! buffered_per_tenant = "4GiB"       # frame bytes held for a tenant's channels
//! streams = 16384                    # objects one session may hold (its API server)
//! events = 262144
//! allocations = 1048576
//!
//! [[policy]]                         # loaded at start, in this order
//! builtin = "fair_share"             # or file = "/etc/phos/policy.o"
//! set = { slack_ns = "30ms" }
//! ```
//!
//! Everything is optional; command-line options override the file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use phos_protocol::limits::SessionLimits;

use crate::limits::LimitsError;
use crate::tenants::TenantConfig;

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("{}: {source}", path.display())]
    Limits { path: PathBuf, source: LimitsError },
    #[error("{}: {source}", path.display())]
    Peer { path: PathBuf, source: crate::fleet::PeerError },
}

/// A `[[policy]]` of the configuration that cannot be loaded as written.
#[derive(Debug, thiserror::Error)]
pub enum PolicyConfigError {
    #[error("a [[policy]] needs exactly one of `builtin` and `file`")]
    Source,
    #[error(transparent)]
    Object(#[from] phos_policy::SourceError),
    #[error("policy `{policy}`: `{key}` = {value} is not a number")]
    NotANumber { policy: String, key: String, value: String },
    #[error("policy `{policy}`: kernel_check = {value:?}: expected auto, require or skip")]
    KernelCheck { policy: String, value: String },
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub listen: Option<String>,
    pub listen_tcp: Option<SocketAddr>,
    pub pool: Option<usize>,
    pub metrics: Option<SocketAddr>,
    pub policy_budget: Option<u64>,
    pub shared_memory: Option<bool>,
    pub ring_size: Option<crate::tenants::Amount>,
    pub staging_slot: Option<crate::tenants::Amount>,
    /// What fleet listings call this router.
    pub name: Option<String>,
    pub peer_listen: Option<SocketAddr>,
    pub peer_secret_file: Option<PathBuf>,
    #[serde(default, rename = "peer")]
    pub peers: Vec<crate::fleet::Peer>,
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
    #[serde(default, rename = "policy")]
    pub policies: Vec<PolicyConfig>,
    /// What one tenant may hold of the router, and one session of its API server
    /// (defaults where absent).
    #[serde(default)]
    pub limits: crate::limits::LimitsFile,
}

/// A policy to load at start.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Its name in the chain (default: the builtin's name or the file's stem).
    pub name: Option<String>,
    pub builtin: Option<String>,
    pub file: Option<PathBuf>,
    /// Parameter settings: integers or strings with units (`"2ms"`, `"4GiB"`).
    #[serde(default)]
    pub set: BTreeMap<String, toml::Value>,
    /// `auto` (default), `require` or `skip`: the kernel's verifier as a second check.
    pub kernel_check: Option<String>,
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let path_buf = || path.to_path_buf();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path_buf(), source })?;
        let file: ConfigFile =
            toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path_buf(), source })?;
        file.session_limits().map_err(|source| ConfigError::Limits { path: path_buf(), source })?;
        for peer in &file.peers {
            peer.check().map_err(|source| ConfigError::Peer { path: path_buf(), source })?;
        }
        Ok(file)
    }

    /// The `[limits]` table's per-session limits over the defaults.
    pub fn session_limits(&self) -> Result<SessionLimits, LimitsError> {
        let mut limits = SessionLimits::default();
        for (kind, n) in &self.limits.per_session {
            limits.apply(&format!("{kind}={n}")).map_err(LimitsError::PerSession)?;
        }
        Ok(limits)
    }
}

impl PolicyConfig {
    /// What `phosctl policy load` would send for it.
    pub fn to_load(&self) -> Result<phos_control::PolicyLoad, PolicyConfigError> {
        let spec = match (&self.builtin, &self.file) {
            (Some(b), None) => format!("builtin:{b}"),
            (None, Some(f)) => f.display().to_string(),
            _ => return Err(PolicyConfigError::Source),
        };
        let (source, elf) = phos_policy::resolve(&spec)?;
        let name = self.name.clone().unwrap_or_else(|| phos_policy::default_name(&spec));
        let params = self
            .set
            .iter()
            .map(|(k, v)| match v {
                toml::Value::Integer(n) => Ok(format!("{k}={n}")),
                toml::Value::String(s) => Ok(format!("{k}={s}")),
                other => Err(PolicyConfigError::NotANumber {
                    policy: name.clone(),
                    key: k.clone(),
                    value: other.to_string(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let kernel_check = match self.kernel_check.as_deref() {
            None | Some("auto") => phos_control::KernelCheck::Auto,
            Some("require") => phos_control::KernelCheck::Require,
            Some("skip") => phos_control::KernelCheck::Skip,
            Some(other) => {
                return Err(PolicyConfigError::KernelCheck { policy: name, value: other.to_string() });
            }
        };
        Ok(phos_control::PolicyLoad { name, source, elf, params, kernel_check })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::limits::LimitKind;

    #[test]
    fn a_full_file_parses() {
        let c: ConfigFile = toml::from_str(
            r#"
            pool = 2
            metrics = "127.0.0.1:9464"
            shared_memory = false
            ring_size = "1MiB"
            [[tenant]]
            name = "alice"
            uids = [1000]
            socket = "/run/phos/alice.sock"
            share = 2
            quota = { device_memory = "8GiB" }
            [[tenant]]
            name = "bob"
            [[policy]]
            builtin = "fair_share"
            set = { slack_ns = "30ms", poll_ns = 100000 }
            "#,
        )
        .unwrap();
        assert_eq!(c.pool, Some(2));
        assert_eq!((c.shared_memory, c.ring_size.map(|a| a.0)), (Some(false), Some(1 << 20)));
        assert_eq!(c.tenants.len(), 2);
        assert_eq!(c.tenants[0].quota["device_memory"].0, 8 << 30);
        assert_eq!(c.tenants[1].share, 1);
        assert_eq!(c.policies[0].builtin.as_deref(), Some("fair_share"));
        assert_eq!(c.session_limits().unwrap(), SessionLimits::default(), "no [limits]: the defaults");
        assert!(toml::from_str::<ConfigFile>("colour = 3").is_err(), "unknown keys are refused");
    }

    #[test]
    fn a_fleet_parses_and_bad_peers_are_refused() {
        let c: ConfigFile = toml::from_str(
            r#"
            name = "a"
            peer_listen = "127.0.0.1:7101"
            peer_secret_file = "/etc/phos/peer.secret"
            [[peer]]
            name = "b"
            endpoint = "tcp:10.0.0.2:7101"
            [[peer]]
            endpoint = "unix:/run/phos/c.sock"
            "#,
        )
        .unwrap();
        assert_eq!(c.name.as_deref(), Some("a"));
        assert_eq!(c.peer_listen, Some("127.0.0.1:7101".parse().unwrap()));
        assert_eq!(c.peers.iter().map(|p| p.label()).collect::<Vec<_>>(), ["b", "unix:/run/phos/c.sock"]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[[peer]]\nendpoint = \"10.0.0.2:7101\"\n").unwrap();
        let e = ConfigFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("not unix:PATH or tcp:HOST:PORT"), "{e}");
    }

    #[test]
    fn limits_parse_and_unknown_kinds_are_refused() {
        let c: ConfigFile = toml::from_str("[limits]\nstreams = 8\ngraph_nodes = 100").unwrap();
        let l = c.session_limits().unwrap();
        assert_eq!((l.get(LimitKind::Streams), l.get(LimitKind::GraphNodes)), (8, 100));
        assert_eq!(l.get(LimitKind::Events), LimitKind::Events.default_limit());
        let c: ConfigFile = toml::from_str("[limits]\nspoons = 8").unwrap();
        assert!(c.session_limits().unwrap_err().to_string().contains("`spoons` is not a limit"));
        let c: ConfigFile = toml::from_str("[limits]\nstreams = 0").unwrap();
        assert!(c.session_limits().is_err());
    }
}
