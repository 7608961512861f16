//! The server's side of the guest's pinned arena ([`phos_protocol::host_arena`]): the file
//! the guest shares, mapped at the same address here, and the page-locked allocations in it.
//!
//! The server decides where each allocation goes, so the only ranges it ever registers with
//! the driver are ones it handed out. A restore replays the allocations before any channel
//! has brought the file: they are kept, and registered once the file is mapped.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::host_arena::{self, BASE, Mapping, PAGE};

use crate::backend::prelude::*;
use crate::registry::memory::{AddressSpace, coalesce_insert, take_exact, take_first_fit};

/// Why a channel's pinned arena is not used.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("cannot identify the pinned arena's file: {0}")]
    Identity(std::io::Error),
    #[error("a different pinned arena than the session's")]
    Different,
    #[error("cannot register the restored pinned allocations: {0:?}")]
    Bind(CudaError),
    #[error("cannot map the pinned arena at {BASE:#x}: {0}")]
    Map(std::io::Error),
}

/// One page-locked allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// Bytes asked for.
    pub size: u64,
    /// Bytes it takes (whole pages).
    span: u64,
    pub flags: u32,
    /// Its device address once registered (the same as its address under unified addressing).
    pub device: Option<u64>,
}

#[derive(Default)]
struct Inner {
    /// The guest's file, mapped, once a channel brought it.
    file: Option<Mapping>,
    /// Unused ranges of the arena (known once it is mapped).
    holes: BTreeMap<u64, u64>,
    allocations: BTreeMap<u64, Pinned>,
    allocated: u64,
}

/// The session's pinned arena.
pub struct PinnedArena {
    inner: Mutex<Inner>,
    /// Allocations the session may hold at once (its `host_allocations` limit).
    max_allocations: usize,
}

impl PinnedArena {
    /// An arena (mapped later) for at most `max_allocations` allocations at once.
    pub fn new(max_allocations: u64) -> Self {
        PinnedArena { inner: Mutex::default(), max_allocations: usize::try_from(max_allocations).unwrap_or(usize::MAX) }
    }

    /// Whether the session holds as many page-locked allocations as it may.
    pub fn at_limit(&self) -> bool {
        self.inner.lock().allocations.len() >= self.max_allocations
    }

    /// Map the arena a channel brought (checked and mapped at [`BASE`]); a later channel's copy
    /// of the same file changes nothing, and another file is refused. Allocations replayed by
    /// a restore are registered now.
    pub fn attach(&self, fd: OwnedFd, backend: &dyn Backend, memory: &AddressSpace) -> Result<(), AttachError> {
        let mut g = self.inner.lock();
        let identity = host_arena::identity(&fd).map_err(AttachError::Identity)?;
        if let Some(m) = &g.file {
            return if m.identity() == identity { Ok(()) } else { Err(AttachError::Different) };
        }
        // Bound first, so that a failure leaves nothing mapped.
        if !g.allocations.is_empty() {
            backend.bind(0).map_err(AttachError::Bind)?;
        }
        let mapping = Mapping::at_base(fd).map_err(AttachError::Map)?;
        let inner = &mut *g;
        inner.holes.insert(BASE, mapping.len());
        let replayed: Vec<u64> = inner.allocations.keys().copied().collect();
        for addr in replayed {
            let p = inner.allocations[&addr];
            let registered = take_exact(&mut inner.holes, addr, p.span)
                .then(|| register(backend, memory, addr, p.span))
                .and_then(Result::ok);
            match registered {
                Some(device) => inner.allocations.get_mut(&addr).expect("listed").device = Some(device),
                None => {
                    tracing::warn!("a restored pinned allocation at {addr:#x} does not fit the guest's arena; dropped");
                    inner.allocated -= p.size;
                    inner.allocations.remove(&addr);
                }
            }
        }
        inner.file = Some(mapping);
        Ok(())
    }

    /// Allocate `size` bytes (at `forced`, when a restore replays an allocation); (address,
    /// device address). Before the arena is mapped only replayed allocations are accepted.
    pub fn alloc(
        &self,
        backend: &dyn Backend,
        memory: &AddressSpace,
        size: u64,
        flags: u32,
        forced: Option<u64>,
    ) -> Result<(u64, u64), CudaError> {
        let span = size.checked_next_multiple_of(PAGE).filter(|&s| s > 0).ok_or(CudaError::InvalidValue)?;
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if inner.allocations.len() >= self.max_allocations {
            return Err(CudaError::MemoryAllocation);
        }
        // The pages are pinned (and charged) in this process: one session may not take more
        // than half the host's memory this way, whatever its arena's size (operators set
        // tighter limits with the `pinned_host_memory` quota).
        if forced.is_none() && inner.allocated.saturating_add(span) > session_limit() {
            return Err(CudaError::MemoryAllocation);
        }
        if inner.file.is_none() {
            // Not mapped yet: only a restore's replay may place an allocation, registered later.
            let Some(at) = forced.filter(|a| a.is_multiple_of(PAGE) && *a >= BASE) else {
                return Err(CudaError::NotSupported);
            };
            if inner.allocations.range(..at.saturating_add(span)).next_back().is_some_and(|(a, p)| a + p.span > at) {
                return Err(CudaError::InvalidValue);
            }
            inner.allocations.insert(at, Pinned { size, span, flags, device: None });
            inner.allocated += size;
            return Ok((at, at));
        }
        let at = match forced {
            Some(at) if take_exact(&mut inner.holes, at, span) => at,
            Some(_) => return Err(CudaError::InvalidValue),
            None => take_first_fit(&mut inner.holes, span, PAGE).ok_or(CudaError::MemoryAllocation)?,
        };
        match register(backend, memory, at, span) {
            Ok(device) => {
                inner.allocations.insert(at, Pinned { size, span, flags, device: Some(device) });
                inner.allocated += size;
                Ok((at, device))
            }
            Err(e) => {
                coalesce_insert(&mut inner.holes, at, span);
                Err(e)
            }
        }
    }

    /// Free the allocation at `addr`: unregister it and give its pages back. The caller has
    /// waited for the device.
    pub fn free(&self, backend: &dyn Backend, memory: &AddressSpace, addr: u64) -> Result<(), CudaError> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let p = inner.allocations.remove(&addr).ok_or(CudaError::InvalidValue)?;
        inner.allocated -= p.size;
        if let Some(device) = p.device {
            memory.remove_external(device);
            backend.unregister_host(addr);
        }
        if let Some(mapping) = &inner.file {
            mapping.release_pages(addr, p.span);
            coalesce_insert(&mut inner.holes, addr, p.span);
        }
        Ok(())
    }

    /// Whether `[addr, addr + len)` lies wholly in one registered allocation of the mapped
    /// arena (what a pinned copy may touch).
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        let g = self.inner.lock();
        let Some((&start, p)) = g.allocations.range(..=addr).next_back() else { return false };
        g.file.is_some() && p.device.is_some() && addr.checked_add(len).is_some_and(|end| end <= start + p.size)
    }

    /// Bytes allocated (as asked for).
    pub fn allocated(&self) -> u64 {
        self.inner.lock().allocated
    }

    /// Unregister everything (the session ends).
    pub fn release(&self, backend: &dyn Backend) {
        let mut g = self.inner.lock();
        for (addr, p) in std::mem::take(&mut g.allocations) {
            if p.device.is_some() {
                backend.unregister_host(addr);
            }
        }
        g.allocated = 0;
    }
}

/// Half of the host's physical memory.
fn session_limit() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        // SAFETY: sysconf only reads a system setting.
        let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if pages > 0 && page > 0 { pages as u64 * page as u64 / 2 } else { u64::MAX }
    })
}

/// Register `[addr, addr + len)` with the backend and let the session's kernels and copies
/// use its device range; the device address.
fn register(backend: &dyn Backend, memory: &AddressSpace, addr: u64, len: u64) -> Result<u64, CudaError> {
    let device = backend.register_host(addr, len)?;
    memory.add_external(device, len);
    Ok(device)
}
