//! IPC between sessions of one tenant (`cudaIpcGetMemHandle`, `cudaIpcOpenMemHandle`, ...).
//!
//! Every session has a server process of its own, so memory one session exports must reach
//! another process. The exporting server makes the allocation's block shareable (a file: a
//! `memfd` that backs the block on `emu`, `cuMemExportToShareableHandle` on `cuda`), keeps it
//! under a random 128-bit key and answers for it on a Unix socket in its tenant's IPC
//! directory (`<router runtime dir>/ipc/<tenant, hex>/<session>.sock`). The guest's handle
//! names the exporting session and the key, nothing else. An opening server looks only in its
//! own tenant's directory: a handle of another tenant names no socket there, a forged key
//! names no export, and a freed allocation's export is gone; each is refused, logged, and
//! changes nothing. The exporter gives the file (`SCM_RIGHTS`) and the block's length, and the
//! opener maps it into a free part of its own address range.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use phos_protocol::CudaError;

/// The first bytes of every handle Phos makes.
const MAGIC: &[u8; 8] = b"PHOSIPC1";
const KIND_MEMORY: u8 = 1;
const KIND_EVENT: u8 = 2;
/// What a request to an exporter starts with.
const REQUEST_MAGIC: &[u8; 4] = b"PIPQ";
/// How long an opener waits for an exporter's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// `cudaIpcMemLazyEnablePeerAccess`
pub const LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;

type Key = [u8; 16];

enum Export {
    /// The block `[start, start + block_len)` holding the allocation at `start + offset`.
    Memory { file: OwnedFd, block_len: u64, offset: u64, size: u64 },
    /// An interprocess event: what the backend exported.
    Event { exported: [u8; 64] },
}

/// What an opener learns of exported memory.
pub struct Exported {
    pub file: OwnedFd,
    pub block_len: u64,
    pub offset: u64,
    pub size: u64,
}

/// A handle as a guest sent it, taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Parsed {
    pub session: u64,
    pub key: Key,
}

/// Why an open is refused (logged; the guest sees the CUDA error).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("IPC is not available to this session (its tenant is not known)")]
    NoTenant,
    #[error("no session {0} of this tenant exports anything")]
    NoExporter(u64),
    #[error("session {0} does not export that key")]
    Unknown(u64),
    #[error("talking to session {0}: {1}")]
    Io(u64, std::io::Error),
}

/// The session's IPC state.
#[derive(Default)]
pub struct Ipc {
    /// The tenant's IPC directory; `None`: the tenant is not known, IPC is refused.
    dir: Mutex<Option<PathBuf>>,
    /// Whether the exporter socket is up.
    listening: Mutex<bool>,
    exports: Arc<Mutex<HashMap<Key, Export>>>,
    /// Export keys by allocation start and by event handle: one handle per object.
    by_allocation: Mutex<HashMap<u64, Key>>,
    by_event: Mutex<HashMap<u64, Key>>,
    /// Memory opened from other sessions: by (session, key), the address and the opens.
    opened: Mutex<HashMap<Parsed, (u64, u64)>>,
}

/// The IPC directory of `tenant` under the router's runtime directory `runtime_dir` (where
/// the server's channel socket lives).
pub fn tenant_dir(runtime_dir: &Path, tenant: &str) -> PathBuf {
    let hex: String = tenant.bytes().map(|b| format!("{b:02x}")).collect();
    runtime_dir.join("ipc").join(hex)
}

impl Ipc {
    /// Let the session export and open IPC handles of its tenant, whose directory is `dir`.
    pub fn set_dir(&self, dir: PathBuf) {
        *self.dir.lock() = Some(dir);
    }

    pub fn encode(kind: u8, session: u64, key: &Key) -> [u8; 64] {
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(MAGIC);
        h[8] = kind;
        h[16..24].copy_from_slice(&session.to_le_bytes());
        h[24..40].copy_from_slice(key);
        h
    }

    /// Take a guest's handle apart: anything not of Phos's shape, or of the other kind, is
    /// `cudaErrorInvalidValue`.
    pub fn parse(handle: &[u8; 64], kind: u8) -> Result<Parsed, CudaError> {
        let padding = handle[9..16].iter().chain(&handle[40..]).all(|&b| b == 0);
        if &handle[..8] != MAGIC || handle[8] != kind || !padding {
            return Err(CudaError::InvalidValue);
        }
        let session = u64::from_le_bytes(handle[16..24].try_into().expect("8 bytes"));
        let key = handle[24..40].try_into().expect("16 bytes");
        Ok(Parsed { session, key })
    }

    pub fn parse_memory(handle: &[u8; 64]) -> Result<Parsed, CudaError> {
        Self::parse(handle, KIND_MEMORY)
    }

    pub fn parse_event(handle: &[u8; 64]) -> Result<Parsed, CudaError> {
        Self::parse(handle, KIND_EVENT)
    }

    fn new_key() -> Result<Key, CudaError> {
        let mut k = [0u8; 16];
        // SAFETY: getrandom writes at most `k.len()` bytes into `k`.
        let n = unsafe { libc::getrandom(k.as_mut_ptr().cast(), k.len(), 0) };
        if n != k.len() as isize {
            return Err(CudaError::Unknown);
        }
        Ok(k)
    }

    /// Start answering for this session's exports (once).
    fn listen(&self, session: u64) -> Result<(), CudaError> {
        let mut listening = self.listening.lock();
        if *listening {
            return Ok(());
        }
        let Some(dir) = self.dir.lock().clone() else {
            tracing::warn!(session, "IPC export refused: the session's tenant is not known");
            return Err(CudaError::NotSupported);
        };
        let setup = || -> std::io::Result<UnixListener> {
            std::fs::create_dir_all(&dir)?;
            let path = dir.join(format!("{session}.sock"));
            // A socket of an earlier server of this session (a restore) answers nothing now.
            let _ = std::fs::remove_file(&path);
            UnixListener::bind(&path)
        };
        let listener = setup().map_err(|e| {
            tracing::error!(session, "IPC: cannot listen in {}: {e}", dir.display());
            CudaError::MapBufferObjectFailed
        })?;
        let exports = self.exports.clone();
        std::thread::Builder::new()
            .name("ipc-exports".into())
            .spawn(move || serve(listener, exports, session))
            .map_err(|_| CudaError::MapBufferObjectFailed)?;
        *listening = true;
        Ok(())
    }

    /// The handle of the allocation the backend's `export` made shareable; one per
    /// allocation, whatever pointer into it was given.
    pub fn export_memory(
        &self,
        session: u64,
        alloc: u64,
        size: u64,
        block: (u64, u64),
        export: impl FnOnce() -> Result<OwnedFd, CudaError>,
    ) -> Result<[u8; 64], CudaError> {
        self.listen(session)?;
        let mut by_allocation = self.by_allocation.lock();
        if let Some(key) = by_allocation.get(&alloc) {
            return Ok(Self::encode(KIND_MEMORY, session, key));
        }
        let file = export()?;
        let key = Self::new_key()?;
        let (start, block_len) = block;
        self.exports.lock().insert(key, Export::Memory { file, block_len, offset: alloc - start, size });
        by_allocation.insert(alloc, key);
        Ok(Self::encode(KIND_MEMORY, session, &key))
    }

    /// The allocation at `alloc` was freed: its handle names nothing from now on (an opener
    /// keeps what it opened).
    pub fn forget_allocation(&self, alloc: u64) {
        if let Some(key) = self.by_allocation.lock().remove(&alloc) {
            self.exports.lock().remove(&key);
        }
    }

    /// Every allocation went (a device reset).
    pub fn forget_all_memory(&self) {
        let keys: Vec<Key> = self.by_allocation.lock().drain().map(|(_, k)| k).collect();
        let mut exports = self.exports.lock();
        for k in keys {
            exports.remove(&k);
        }
    }

    pub fn export_event(&self, session: u64, handle: u64, exported: [u8; 64]) -> Result<[u8; 64], CudaError> {
        self.listen(session)?;
        let mut by_event = self.by_event.lock();
        if let Some(key) = by_event.get(&handle) {
            return Ok(Self::encode(KIND_EVENT, session, key));
        }
        let key = Self::new_key()?;
        self.exports.lock().insert(key, Export::Event { exported });
        by_event.insert(handle, key);
        Ok(Self::encode(KIND_EVENT, session, &key))
    }

    pub fn forget_event(&self, handle: u64) {
        if let Some(key) = self.by_event.lock().remove(&handle) {
            self.exports.lock().remove(&key);
        }
    }

    /// Where memory of `handle` is open already in this session: the address (its count of
    /// opens goes up).
    pub fn reopen(&self, handle: &Parsed) -> Option<u64> {
        let mut opened = self.opened.lock();
        let entry = opened.get_mut(handle)?;
        entry.1 += 1;
        Some(entry.0)
    }

    pub fn note_opened(&self, handle: Parsed, addr: u64) {
        self.opened.lock().insert(handle, (addr, 1));
    }

    /// One close of opened memory at `addr`: `Some(true)` when it was the last (unmap it),
    /// `None` when `addr` is no opened memory.
    pub fn close(&self, addr: u64) -> Option<bool> {
        let mut opened = self.opened.lock();
        let (&key, entry) = opened.iter_mut().find(|(_, (a, _))| *a == addr)?;
        entry.1 -= 1;
        if entry.1 == 0 {
            opened.remove(&key);
            return Some(true);
        }
        Some(false)
    }

    /// Opened memory went (a device reset, the session's end).
    pub fn forget_opened(&self) {
        self.opened.lock().clear();
    }

    fn ask(&self, handle: &Parsed, kind: u8) -> Result<(UnixStream, [u8; 1]), OpenError> {
        let Some(dir) = self.dir.lock().clone() else { return Err(OpenError::NoTenant) };
        // Only this tenant's directory is looked in: another tenant's sessions are not there.
        let path = dir.join(format!("{}.sock", handle.session));
        let mut s = UnixStream::connect(&path).map_err(|_| OpenError::NoExporter(handle.session))?;
        let io = |e| OpenError::Io(handle.session, e);
        s.set_read_timeout(Some(ANSWER_WAIT)).map_err(io)?;
        s.set_write_timeout(Some(ANSWER_WAIT)).map_err(io)?;
        let mut req = [0u8; 21];
        req[..4].copy_from_slice(REQUEST_MAGIC);
        req[4] = kind;
        req[5..].copy_from_slice(&handle.key);
        s.write_all(&req).map_err(io)?;
        let mut status = [0u8; 1];
        s.read_exact(&mut status).map_err(io)?;
        if status[0] != 0 {
            return Err(OpenError::Unknown(handle.session));
        }
        Ok((s, status))
    }

    /// Ask the exporting session of `handle` for its memory.
    pub fn fetch_memory(&self, handle: &Parsed) -> Result<Exported, OpenError> {
        let (mut s, _) = self.ask(handle, KIND_MEMORY)?;
        let io = |e| OpenError::Io(handle.session, e);
        let mut figures = [0u8; 24];
        s.read_exact(&mut figures).map_err(io)?;
        let file = phos_protocol::shm::recv_fd(&s).map_err(io)?;
        let word = |i: usize| u64::from_le_bytes(figures[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Ok(Exported { file, block_len: word(0), offset: word(1), size: word(2) })
    }

    /// Ask the exporting session of `handle` for its event.
    pub fn fetch_event(&self, handle: &Parsed) -> Result<[u8; 64], OpenError> {
        let (mut s, _) = self.ask(handle, KIND_EVENT)?;
        let mut exported = [0u8; 64];
        s.read_exact(&mut exported).map_err(|e| OpenError::Io(handle.session, e))?;
        Ok(exported)
    }
}

/// The uid of the peer of `s` (`SO_PEERCRED`).
fn peer_uid(s: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: all zeros is a valid `ucred`.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: writes at most `len` bytes into `cred`, a live socket of ours.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

/// Answer openers: each connection asks for one key.
fn serve(listener: UnixListener, exports: Arc<Mutex<HashMap<Key, Export>>>, session: u64) {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        // Only API servers (the router's user) ask; the directory is the router's own too.
        if peer_uid(&s) != Some(uid) {
            tracing::warn!(session, "IPC: a connection of another user refused");
            continue;
        }
        let _ = s.set_read_timeout(Some(ANSWER_WAIT));
        let _ = s.set_write_timeout(Some(ANSWER_WAIT));
        let mut req = [0u8; 21];
        if s.read_exact(&mut req).is_err() || &req[..4] != REQUEST_MAGIC {
            continue;
        }
        let key: Key = req[5..].try_into().expect("16 bytes");
        // The answer is made under the lock, sent after it.
        let answer = match (req[4], exports.lock().get(&key)) {
            (KIND_MEMORY, Some(Export::Memory { file, block_len, offset, size, .. })) => {
                file.try_clone().ok().map(|f| Answer::Memory(f, [*block_len, *offset, *size]))
            }
            (KIND_EVENT, Some(Export::Event { exported, .. })) => Some(Answer::Event(*exported)),
            _ => None,
        };
        match answer {
            None => {
                tracing::warn!(session, "IPC: a request for a key this session does not export refused");
                let _ = s.write_all(&[1]);
            }
            Some(Answer::Memory(file, words)) => {
                let mut out = [0u8; 25];
                for (i, w) in words.iter().enumerate() {
                    out[1 + i * 8..9 + i * 8].copy_from_slice(&w.to_le_bytes());
                }
                if s.write_all(&out).is_ok() {
                    let _ = phos_protocol::shm::send_fd(&s, &file);
                }
            }
            Some(Answer::Event(exported)) => {
                let mut out = [0u8; 65];
                out[1..].copy_from_slice(&exported);
                let _ = s.write_all(&out);
            }
        }
    }
}

enum Answer {
    Memory(OwnedFd, [u64; 3]),
    Event([u8; 64]),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_of_another_shape_or_kind_are_refused() {
        let key = [7u8; 16];
        let h = Ipc::encode(KIND_MEMORY, 42, &key);
        assert_eq!(Ipc::parse_memory(&h).unwrap(), Parsed { session: 42, key });
        assert_eq!(Ipc::parse_event(&h), Err(CudaError::InvalidValue));
        let mut bad = h;
        bad[63] = 1;
        assert_eq!(Ipc::parse_memory(&bad), Err(CudaError::InvalidValue));
        assert_eq!(Ipc::parse_memory(&[0; 64]), Err(CudaError::InvalidValue));
    }

    #[test]
    fn a_tenant_directory_names_the_tenant_in_hex() {
        assert_eq!(tenant_dir(Path::new("/r"), "a/b"), PathBuf::from("/r/ipc/612f62"));
    }
}
