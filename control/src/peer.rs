//! The router's management service over TCP, for other routers (a migration's target is
//! named `tcp:HOST:PORT`) and operators elsewhere. Anyone who can reach the port could
//! otherwise manage the router, so each connection begins with a mutual challenge-response
//! over a secret both sides are configured with (HMAC-SHA256 of the other side's nonce):
//! the secret itself never crosses the network, and each side learns the other knows it.
//! The calls that follow are not encrypted: keep the port on a network you trust.
//!
//! ```text
//! listener: "PHOSPEER", nonce_l (32 bytes)
//! client:   "PHOSPEER", nonce_c (32), HMAC(secret, "client" nonce_l nonce_c)
//! listener: HMAC(secret, "listener" nonce_c nonce_l)            (or it closes)
//! ```

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use tarpc::tokio_serde::formats::Bincode;
use tarpc::tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use phos_protocol::log_limit::GUEST_LINES;

use crate::{Cancel, ControlError, RouterControlClient};

const GREETING: &[u8; 8] = b"PHOSPEER";
const NONCE: usize = 32;
/// How long the exchange may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Frames of the management calls (as over the Unix sockets).
const MAX_FRAME: usize = 64 << 20;

type HmacSha256 = Hmac<Sha256>;

/// The shared secret routers present to each other, at least 16 bytes.
#[derive(Clone)]
pub struct Secret(std::sync::Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why a secret was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("the peer secret has {0} bytes: at least 16 are needed")]
    TooShort(usize),
}

impl Secret {
    pub fn new(bytes: &[u8]) -> Result<Self, SecretError> {
        if bytes.len() < 16 {
            return Err(SecretError::TooShort(bytes.len()));
        }
        Ok(Secret(bytes.into()))
    }

    /// Read from a file (its surrounding whitespace dropped).
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let text =
            std::fs::read(path).map_err(|source| SecretError::Read { path: path.display().to_string(), source })?;
        let start = text.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(text.len());
        let end = text.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
        Secret::new(&text[start..end])
    }

    fn mac(&self, label: &[u8], first: &[u8], second: &[u8]) -> [u8; 32] {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(first);
        m.update(second);
        m.finalize().into_bytes().into()
    }

    fn verify(&self, label: &[u8], first: &[u8], second: &[u8], tag: &[u8]) -> bool {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(first);
        m.update(second);
        // Constant time.
        m.verify_slice(tag).is_ok()
    }
}

/// Random bytes from the kernel.
pub fn random<const N: usize>() -> io::Result<[u8; N]> {
    use std::io::Read;
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut out)?;
    Ok(out)
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_string())
}

/// The listener's side of the exchange.
async fn admit(stream: &mut TcpStream, secret: &Secret) -> io::Result<()> {
    let nonce_l = random::<NONCE>()?;
    let mut hello = GREETING.to_vec();
    hello.extend_from_slice(&nonce_l);
    stream.write_all(&hello).await?;
    let mut answer = [0u8; 8 + NONCE + 32];
    stream.read_exact(&mut answer).await?;
    let (greeting, rest) = answer.split_at(8);
    let (nonce_c, tag) = rest.split_at(NONCE);
    if greeting != GREETING {
        return Err(refused("not a Phos router"));
    }
    if !secret.verify(b"client", &nonce_l, nonce_c, tag) {
        return Err(refused("the peer does not know the shared secret"));
    }
    stream.write_all(&secret.mac(b"listener", nonce_c, &nonce_l)).await
}

/// The client's side of the exchange.
async fn present(stream: &mut TcpStream, secret: &Secret) -> io::Result<()> {
    let mut hello = [0u8; 8 + NONCE];
    stream.read_exact(&mut hello).await?;
    let (greeting, nonce_l) = hello.split_at(8);
    if greeting != GREETING {
        return Err(refused("not a Phos router's peer port"));
    }
    let nonce_c = random::<NONCE>()?;
    let mut answer = GREETING.to_vec();
    answer.extend_from_slice(&nonce_c);
    answer.extend_from_slice(&secret.mac(b"client", nonce_l, &nonce_c));
    stream.write_all(&answer).await?;
    let mut tag = [0u8; 32];
    stream.read_exact(&mut tag).await.map_err(|_| refused("it closed the connection: not the same secret"))?;
    if !secret.verify(b"listener", &nonce_c, nonce_l, &tag) {
        return Err(refused("it does not know the shared secret"));
    }
    Ok(())
}

fn framed(stream: TcpStream) -> Framed<TcpStream, LengthDelimitedCodec> {
    Framed::new(stream, LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).new_codec())
}

/// Serve the management service on `addr` over TCP for peers that know `secret`, on a
/// thread of its own (as [`spawn_service_thread`](crate::spawn_service_thread)). Answers the
/// address it listens on (the port chosen, for port 0).
pub fn spawn_tcp_service_thread<S>(
    addr: SocketAddr,
    secret: Secret,
    service: impl Fn(Cancel) -> S + Send + 'static,
) -> io::Result<SocketAddr>
where
    S: tarpc::server::Serve + Clone + Send + 'static,
    S::Req: tarpc::RequestName + for<'de> Deserialize<'de> + Send + 'static,
    S::Resp: serde::Serialize + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind(addr))?;
    let local = listener.local_addr()?;
    std::thread::Builder::new().name("phos-peer".into()).spawn(move || {
        let tasks = tokio::task::LocalSet::new();
        tasks.block_on(&runtime, async move {
            loop {
                let Ok((mut stream, from)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let gone = Cancel::default();
                let service = service(gone.clone());
                let secret = secret.clone();
                tokio::task::spawn_local(async move {
                    let why = match tokio::time::timeout(HANDSHAKE_TIMEOUT, admit(&mut stream, &secret)).await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(_) => Some(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")),
                    };
                    if let Some(why) = why {
                        // Anyone who reaches the port can make this line: limited per address.
                        if let Some(dropped) = GUEST_LINES.admit(&from.ip().to_string()) {
                            tracing::warn!(%from, dropped, "a peer router's connection refused: {why}");
                        }
                        return;
                    }
                    let transport = tarpc::serde_transport::new(framed(stream), Bincode::default());
                    crate::run_connection(transport, service, gone).await;
                });
            }
        });
    })?;
    Ok(local)
}

/// A client of the router's management service at `endpoint`: `unix:PATH` (its management
/// socket; the socket's permissions are its protection) or `tcp:HOST:PORT` (its peer port;
/// `secret` is then needed).
pub async fn router_client_at(endpoint: &str, secret: Option<&Secret>) -> Result<RouterControlClient, ControlError> {
    let unreachable = |e: &dyn std::fmt::Display| ControlError::io(format!("reaching the router at {endpoint}"), e);
    if let Some(path) = endpoint.strip_prefix("unix:") {
        // The router's guest socket names its management socket too.
        let path = Path::new(path);
        let ctl =
            if path.extension().is_some_and(|e| e == "ctl") { path.to_path_buf() } else { crate::control_path(path) };
        return crate::router_client(&ctl).await.map_err(|e| unreachable(&e));
    }
    let Some(addr) = endpoint.strip_prefix("tcp:") else {
        return Err(ControlError::io(format!("the router endpoint {endpoint:?}"), "not unix:PATH or tcp:HOST:PORT"));
    };
    let Some(secret) = secret else {
        return Err(ControlError::PeerRefused {
            peer: endpoint.into(),
            reason: "no shared secret is configured here (--peer-secret-file)".into(),
        });
    };
    let mut stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(&"no connection within 10 s"))?
        .map_err(|e| unreachable(&e))?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, present(&mut stream, secret)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(ControlError::PeerRefused { peer: endpoint.into(), reason: e.to_string() });
        }
        Ok(Err(e)) => return Err(unreachable(&e)),
        Err(_) => return Err(unreachable(&"no handshake within 10 s")),
    }
    let transport = tarpc::serde_transport::new(framed(stream), Bincode::default());
    Ok(RouterControlClient::new(tarpc::client::Config::default(), transport).spawn())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RouterControl;

    /// A peer with the secret is served; one with another secret is refused, and says so.
    #[test]
    fn only_peers_knowing_the_secret_are_served() {
        #[derive(Clone)]
        struct Usage;
        impl crate::RouterControl for Usage {
            async fn sessions(self, _: tarpc::context::Context) -> Vec<crate::SessionInfo> {
                Vec::new()
            }
            async fn fleet_sessions(self, _: tarpc::context::Context) -> Vec<crate::FleetSessions> {
                Vec::new()
            }
            async fn checkpoint(
                self,
                _: tarpc::context::Context,
                session: u64,
                _: crate::CheckpointRequest,
            ) -> Result<crate::CheckpointSummary, ControlError> {
                Err(ControlError::NoSuchSession { session })
            }
            async fn restore(
                self,
                _: tarpc::context::Context,
                _: crate::RestoreRequest,
            ) -> Result<crate::RestoreSummary, ControlError> {
                Err(ControlError::NoSuchSession { session: 0 })
            }
            async fn progress(self, _: tarpc::context::Context, _: u64) -> Option<crate::Progress> {
                None
            }
            async fn cut_channels(
                self,
                _: tarpc::context::Context,
                session: u64,
                _: std::time::Duration,
            ) -> Result<u64, ControlError> {
                Err(ControlError::NoSuchSession { session })
            }
            async fn unpark(self, _: tarpc::context::Context, session: u64) -> Result<(), ControlError> {
                Err(ControlError::NoSuchSession { session })
            }
            async fn restore_load(self, _: tarpc::context::Context, _: u64) -> Option<crate::LoadReport> {
                None
            }
            async fn policy_load(
                self,
                _: tarpc::context::Context,
                _: crate::PolicyLoad,
            ) -> Result<crate::PolicySummary, ControlError> {
                Err(ControlError::NoSuchPolicy { name: String::new() })
            }
            async fn policy_unload(self, _: tarpc::context::Context, name: String) -> Result<(), ControlError> {
                Err(ControlError::NoSuchPolicy { name })
            }
            async fn policy_list(self, _: tarpc::context::Context) -> Vec<crate::PolicySummary> {
                Vec::new()
            }
            async fn policy_show(
                self,
                _: tarpc::context::Context,
                name: String,
            ) -> Result<crate::PolicyDetail, ControlError> {
                Err(ControlError::NoSuchPolicy { name })
            }
            async fn usage(self, _: tarpc::context::Context) -> Vec<crate::TenantUsage> {
                vec![crate::TenantUsage { name: "served".into(), ..Default::default() }]
            }
            async fn migrate(
                self,
                _: tarpc::context::Context,
                session: u64,
                _: crate::MigrateRequest,
            ) -> Result<crate::MigrationSummary, ControlError> {
                Err(ControlError::NoSuchSession { session })
            }
            async fn migrate_prepare(
                self,
                _: tarpc::context::Context,
                _: u64,
                _: crate::SessionIdentity,
                _: u32,
                _: bool,
            ) -> Result<crate::Incoming, ControlError> {
                Err(ControlError::NoSuchSession { session: 0 })
            }
            async fn migrate_finish(
                self,
                _: tarpc::context::Context,
                _: u64,
            ) -> Result<crate::RestoreSummary, ControlError> {
                Err(ControlError::NoSuchSession { session: 0 })
            }
            async fn migrate_abort(self, _: tarpc::context::Context, _: u64) {}
            async fn vm_migrated(self, _: tarpc::context::Context, _: Option<crate::VmMigrationReport>) {}
        }
        let secret = Secret::new(b"0123456789abcdef-shared").unwrap();
        let addr = spawn_tcp_service_thread("127.0.0.1:0".parse().unwrap(), secret.clone(), |_| Usage.serve()).unwrap();
        let endpoint = format!("tcp:{addr}");
        let served = crate::block_on(async {
            let c = router_client_at(&endpoint, Some(&secret)).await.unwrap();
            c.usage(tarpc::context::current()).await.unwrap()
        })
        .unwrap();
        assert_eq!(served[0].name, "served");
        let other = Secret::new(b"0123456789abcdef-other").unwrap();
        let refused = crate::block_on(router_client_at(&endpoint, Some(&other))).unwrap();
        assert!(matches!(&refused, Err(ControlError::PeerRefused { .. })), "{:?}", refused.err());
        let none = crate::block_on(router_client_at(&endpoint, None)).unwrap();
        assert!(matches!(&none, Err(ControlError::PeerRefused { .. })), "{:?}", none.err());
        assert!(matches!(Secret::new(b"short"), Err(SecretError::TooShort(5))));
    }
}
