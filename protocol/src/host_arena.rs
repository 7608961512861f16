//! The pinned host arena: where a guest process's page-locked host memory
//! (`cudaMallocHost`, `cudaHostAlloc`) lives, so that its API server can DMA to and from it
//! directly.
//!
//! The guest creates one sealed `memfd` per process and maps it at [`BASE`]; it sends the
//! file with the `Hello` of each shared-memory channel, the router passes it on, and the
//! server maps the same file at the same address. A pinned allocation is then one range of
//! the file, registered with the driver by the server (`cuMemHostRegister`): a copy from it
//! is a DMA from the guest's own pages, an async copy really is asynchronous, and because
//! the address is the same in both processes the pointer the application holds is also the
//! device pointer of mapped memory, as it is under CUDA's unified addressing.
//!
//! The server hands out the ranges (the guest asks with `phosHostAlloc`), so a guest cannot
//! make it register memory it did not allocate; the guest owns the file, so its contents
//! survive a restore of the session into another server. Either side that cannot map the
//! file at [`BASE`] (the range is taken in its process) does without the arena, and pinned
//! memory is then the guest's own, copied through the ordinary paths.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::shared::SharedRegion;

/// Where the arena is mapped in the guest and the server: below the sessions' device
/// address range ([`crate::handshake::Welcome::device_base`], 96 TiB by default) and clear of
/// where Linux places executables and mappings.
pub const BASE: u64 = 0x5000_0000_0000;
/// The arena's size unless `PHOS_PINNED_ARENA` says otherwise: address space only; pages
/// exist once an allocation is made.
pub const DEFAULT_BYTES: u64 = 256 << 30;
/// The smallest and largest arenas accepted.
pub const MIN_BYTES: u64 = 2 << 20;
pub const MAX_BYTES: u64 = 8 << 40;
/// Allocations are whole pages, so no two share a page the driver pins.
pub const PAGE: u64 = 4096;

/// Create an arena file of `bytes` (rounded to pages, clamped to [`MIN_BYTES`]..[`MAX_BYTES`]),
/// sealed so that its size never changes again.
pub fn create(bytes: u64) -> io::Result<OwnedFd> {
    crate::shared::sealed_memfd(c"phos-pinned", bytes.clamp(MIN_BYTES, MAX_BYTES).next_multiple_of(PAGE))
}

/// Size of an arena file a peer sent, once it is known to be one: sealed against shrinking
/// and growing (so it can never be cut short under a mapping), of an accepted size.
pub fn checked_len(fd: &OwnedFd) -> io::Result<u64> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("pinned arena: {why}"));
    let len = crate::shared::sealed_len(fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => bad(&e.to_string()),
        _ => e,
    })?;
    if !(MIN_BYTES..=MAX_BYTES).contains(&len) || !len.is_multiple_of(PAGE) {
        return Err(bad("wrong size"));
    }
    Ok(len)
}

/// The identity of an open file (device, inode): a later channel's copy of the arena is the
/// same file when this matches.
pub fn identity(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = crate::shared::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// An arena file mapped at [`BASE`]; unmapped when dropped (except in a forked child, whose
/// inherited pointers into it stay good).
#[derive(Debug)]
pub struct Mapping {
    region: SharedRegion,
    identity: (u64, u64),
}

impl Mapping {
    /// Map `fd` (checked with [`checked_len`]) at [`BASE`] exactly, keeping the file; fails if
    /// anything of this process is already there.
    pub fn at_base(fd: OwnedFd) -> io::Result<Mapping> {
        let len = checked_len(&fd)?;
        let identity = identity(&fd)?;
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        let region = SharedRegion::attach_at(fd, len, BASE).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists | io::ErrorKind::AddrInUse => {
                io::Error::new(io::ErrorKind::AddrInUse, "the pinned arena's address is taken")
            }
            _ => e,
        })?;
        Ok(Mapping { region, identity })
    }

    pub fn len(&self) -> u64 {
        self.region.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    pub fn identity(&self) -> (u64, u64) {
        self.identity
    }

    /// The arena's file (to send with a channel).
    pub fn fd(&self) -> &OwnedFd {
        self.region.fd().expect("an arena keeps its file")
    }

    /// Whether `[addr, addr + len)` lies in the arena.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= BASE && addr.checked_add(len).is_some_and(|end| end <= BASE + self.len())
    }

    /// Give the pages of `[addr, addr + len)` back to the system (their contents read as
    /// zeros afterwards): what a free does, so that freed pinned memory costs nothing.
    pub fn release_pages(&self, addr: u64, len: u64) {
        if !self.contains(addr, len) {
            return;
        }
        // SAFETY: punching a hole changes the file's contents, not the mapping: the pages of
        // the freed allocation read as zeros from now on, in both processes.
        unsafe {
            libc::fallocate(
                self.fd().as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (addr - BASE) as libc::off_t,
                len as libc::off_t,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::FromRawFd;

    use super::*;

    #[test]
    fn an_arena_is_sealed_and_maps_once_at_its_base() {
        let fd = create(4 << 20).unwrap();
        assert_eq!(checked_len(&fd).unwrap(), 4 << 20);
        // SAFETY: a plain system call on an open descriptor.
        assert!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 20) } != 0, "the size is sealed");
        let m = Mapping::at_base(fd.try_clone().unwrap()).unwrap();
        assert!(m.contains(BASE, 4 << 20) && !m.contains(BASE, (4 << 20) + 1) && !m.contains(BASE - 1, 1));
        // The same file through a second mapping (what the other process sees).
        let other_view = SharedRegion::attach(&fd, 4096, 4 << 20).unwrap();
        m.region.store::<u64>(0, 0x1234);
        assert_eq!(other_view.load::<u64>(0), 0x1234);
        // The base is taken now: a second arena cannot go there.
        let other = create(4 << 20).unwrap();
        let taken = Mapping::at_base(other.try_clone().unwrap()).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse, "{taken}");
        m.release_pages(BASE, PAGE);
        assert_eq!(other_view.load::<u64>(0), 0, "released pages read as zeros");
        drop(m);
        assert!(Mapping::at_base(other).is_ok(), "the base is free again once unmapped");
    }

    #[test]
    fn an_unsealed_or_odd_file_is_refused() {
        // SAFETY: a plain system call with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: just created, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap()).set_len(4 << 20).unwrap();
        assert!(checked_len(&fd).unwrap_err().to_string().contains("pinned arena: not sealed"));
        let odd = crate::shared::sealed_memfd(c"x", (4 << 20) + 1).unwrap();
        assert!(checked_len(&odd).unwrap_err().to_string().contains("wrong size"));
    }
}
