//! A router as a member of a fleet: the peers it knows from its configuration (`[[peer]]`,
//! `phosctl serve --peer`), and the sessions of all of them (`phosctl sessions --all`). A
//! peer is reached the way a migration's target is: `unix:PATH` on this host, or
//! `tcp:HOST:PORT` (its `--peer-listen` address, with the shared secret).

use std::time::Duration;

use phos_control::{FleetSessions, SessionInfo};

use crate::Router;

/// How long a peer may take to answer before it is reported as not answering.
pub const PEER_WAIT: Duration = Duration::from_secs(5);

/// A router of the same fleet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// How listings name it (default: its endpoint).
    pub name: Option<String>,
    /// `unix:PATH` (its socket on this host) or `tcp:HOST:PORT` (its `--peer-listen` address).
    pub endpoint: String,
}

/// A peer that cannot be used as written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeerError {
    #[error("peer `{0}`: its endpoint is not unix:PATH or tcp:HOST:PORT")]
    Endpoint(String),
    #[error("peer `{0}`: a name is not empty")]
    EmptyName(String),
}

impl Peer {
    /// What listings call it.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.endpoint)
    }

    /// Whether it is usable: a known kind of endpoint, a name if one is given.
    pub fn check(&self) -> Result<(), PeerError> {
        let addr = self.endpoint.strip_prefix("unix:").or_else(|| self.endpoint.strip_prefix("tcp:"));
        if addr.is_none_or(str::is_empty) {
            return Err(PeerError::Endpoint(self.endpoint.clone()));
        }
        if self.name.as_deref().is_some_and(str::is_empty) {
            return Err(PeerError::EmptyName(self.endpoint.clone()));
        }
        Ok(())
    }
}

impl std::str::FromStr for Peer {
    type Err = PeerError;

    /// `ENDPOINT` or `NAME=ENDPOINT` (`phosctl serve --peer`).
    fn from_str(s: &str) -> Result<Self, PeerError> {
        // A name has no `:`; an endpoint always has one (a path may hold `=`).
        let peer = match s.split_once('=') {
            Some((name, endpoint)) if !name.contains(':') => {
                Peer { name: Some(name.to_string()), endpoint: endpoint.to_string() }
            }
            _ => Peer { name: None, endpoint: s.to_string() },
        };
        peer.check()?;
        Ok(peer)
    }
}

impl Router {
    /// What listings call this router: its configured name, else its socket.
    pub fn fleet_name(&self) -> String {
        self.config.name.clone().unwrap_or_else(|| format!("unix:{}", self.config.listen.display()))
    }

    /// This router's sessions as the management service answers them.
    pub fn session_infos(&self) -> Vec<SessionInfo> {
        self.sessions().iter().map(|s| s.info()).collect()
    }

    /// The sessions of this router and of each of its peers, in the configuration's order;
    /// a peer that does not answer within [`PEER_WAIT`] has its error instead. The peers are
    /// asked all at once. Must run inside a [`tokio::task::LocalSet`] (as the management
    /// service's requests do).
    pub async fn fleet_sessions(&self) -> Vec<FleetSessions> {
        let asked: Vec<_> = self
            .config
            .peers
            .iter()
            .map(|peer| {
                let endpoint = peer.endpoint.clone();
                let secret = self.config.peer_secret.clone();
                tokio::task::spawn_local(async move { peer_sessions(&endpoint, secret.as_ref()).await })
            })
            .collect();
        let mut all = vec![FleetSessions {
            router: self.fleet_name(),
            endpoint: format!("unix:{}", self.config.listen.display()),
            sessions: Ok(self.session_infos()),
        }];
        for (peer, task) in self.config.peers.iter().zip(asked) {
            let sessions = match task.await {
                Ok(answer) => answer,
                Err(e) => Err(phos_control::ControlError::io(format!("asking the router at {}", peer.endpoint), e)),
            };
            all.push(FleetSessions { router: peer.label().to_string(), endpoint: peer.endpoint.clone(), sessions });
        }
        all
    }
}

/// The sessions of the router at `endpoint`, within [`PEER_WAIT`].
async fn peer_sessions(
    endpoint: &str,
    secret: Option<&phos_control::peer::Secret>,
) -> Result<Vec<SessionInfo>, phos_control::ControlError> {
    let asked = async {
        let peer = phos_control::peer::router_client_at(endpoint, secret).await?;
        peer.sessions(phos_control::context_within(PEER_WAIT))
            .await
            .map_err(|e| phos_control::ControlError::io(format!("asking the router at {endpoint}"), e))
    };
    tokio::time::timeout(PEER_WAIT, asked).await.unwrap_or_else(|_| {
        Err(phos_control::ControlError::io(
            format!("asking the router at {endpoint}"),
            format!("no answer within {PEER_WAIT:?}"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_with_and_without_names() {
        let p: Peer = "tcp:10.0.0.2:7101".parse().unwrap();
        assert_eq!((p.label(), p.name.is_none()), ("tcp:10.0.0.2:7101", true));
        let p: Peer = "b=unix:/run/phos/b.sock".parse().unwrap();
        assert_eq!((p.label(), p.endpoint.as_str()), ("b", "unix:/run/phos/b.sock"));
        let p: Peer = "unix:/run/a=b.sock".parse().unwrap();
        assert_eq!((p.label(), p.name.is_none()), ("unix:/run/a=b.sock", true));
        assert_eq!("10.0.0.2:7101".parse::<Peer>(), Err(PeerError::Endpoint("10.0.0.2:7101".into())));
        assert_eq!("b=tcp:".parse::<Peer>(), Err(PeerError::Endpoint("tcp:".into())));
        assert_eq!("=tcp:h:1".parse::<Peer>(), Err(PeerError::EmptyName("tcp:h:1".into())));
    }
}
