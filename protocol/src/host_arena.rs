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
    crate::shm::sealed_memfd(c"phos-pinned", bytes.clamp(MIN_BYTES, MAX_BYTES).next_multiple_of(PAGE))
}

/// Size of an arena file a peer sent, once it is known to be one: sealed against shrinking
/// and growing (so it can never be cut short under a mapping), of an accepted size.
pub fn checked_len(fd: &OwnedFd) -> io::Result<u64> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("pinned arena: {why}"));
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) != (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) {
        return Err(bad("not sealed against resizing"));
    }
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = st.st_size as u64;
    if !(MIN_BYTES..=MAX_BYTES).contains(&len) || !len.is_multiple_of(PAGE) {
        return Err(bad("wrong size"));
    }
    Ok(len)
}

/// The identity of an open file (device, inode): a later channel's copy of the arena is the
/// same file when this matches.
pub fn identity(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// An arena file mapped at [`BASE`]; unmapped when dropped.
#[derive(Debug)]
pub struct Mapping {
    len: u64,
    identity: (u64, u64),
    /// The process that mapped it: a forked child inherits the mapping and must not unmap
    /// its parent's arena when it drops the copy.
    pid: u32,
}

impl Mapping {
    /// Map `fd` (checked with [`checked_len`]) at [`BASE`] exactly; fails if anything of this
    /// process is already there.
    pub fn at_base(fd: &OwnedFd) -> io::Result<Mapping> {
        let len = checked_len(fd)?;
        let identity = identity(fd)?;
        let p = unsafe {
            libc::mmap(
                BASE as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if p as u64 != BASE {
            // A kernel without MAP_FIXED_NOREPLACE takes it as a hint.
            unsafe { libc::munmap(p, len as usize) };
            return Err(io::Error::new(io::ErrorKind::AddrInUse, "the pinned arena's address is taken"));
        }
        Ok(Mapping { len, identity, pid: std::process::id() })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn identity(&self) -> (u64, u64) {
        self.identity
    }

    /// Whether `[addr, addr + len)` lies in the arena.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= BASE && addr.checked_add(len).is_some_and(|end| end <= BASE + self.len)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            unsafe { libc::munmap(BASE as *mut libc::c_void, self.len as usize) };
        }
    }
}

/// Give the pages of `[addr, addr + len)` back to the system (their contents read as zeros
/// afterwards): what a free does, so that freed pinned memory costs nothing.
pub fn release_pages(fd: &OwnedFd, addr: u64, len: u64) {
    if addr < BASE {
        return;
    }
    unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            (addr - BASE) as libc::off_t,
            len as libc::off_t,
        );
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
        assert!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 20) } != 0, "the size is sealed");
        let m = Mapping::at_base(&fd).unwrap();
        assert!(m.contains(BASE, 4 << 20) && !m.contains(BASE, (4 << 20) + 1) && !m.contains(BASE - 1, 1));
        unsafe { (BASE as *mut u64).write(0x1234) };
        // The same file through a second mapping (what the other process sees).
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        assert_eq!(unsafe { (p as *const u64).read() }, 0x1234);
        unsafe { libc::munmap(p, 4096) };
        // The base is taken now: a second arena cannot go there.
        let other = create(4 << 20).unwrap();
        assert!(Mapping::at_base(&other).is_err());
        release_pages(&fd, BASE, PAGE);
        assert_eq!(unsafe { (BASE as *const u64).read() }, 0, "released pages read as zeros");
        drop(m);
        assert!(Mapping::at_base(&other).is_ok(), "the base is free again once unmapped");
    }

    #[test]
    fn an_unsealed_or_odd_file_is_refused() {
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC)) };
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4 << 20) }, 0);
        assert!(checked_len(&fd).is_err());
    }
}
