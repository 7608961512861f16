//! Memory shared with another process: the one owner of every such mapping in Phos (a
//! channel's ring region, its staging region, a guest's pinned arena).
//!
//! A [`SharedRegion`] maps a whole file (a sealed `memfd`) and unmaps it when dropped. The
//! other process can write any byte of it at any time (it may be a hostile guest), so Rust
//! code never holds a reference (`&[u8]`, `&mut [u8]`, `&T`) into it, which would promise
//! the compiler that the bytes do not change. What it offers instead:
//!
//! - [`SharedRegion::slice`]: a `vm-memory` [`VolatileSlice`], whose copies are volatile
//!   accesses or, for bulk data, `copy_nonoverlapping` on raw pointers (what rust-vmm's
//!   devices use on guest memory): a copy out of it yields whatever bytes were there, and a
//!   peer that changes them mid-copy spoils only its own data;
//! - [`SharedRegion::atomics`]: a reference to a type made only of atomic integers
//!   ([`SharedAtomics`]), for the words the two sides synchronise on;
//! - [`SharedRegion::load`] and [`SharedRegion::store`]: one volatile value (a header word);
//! - [`SharedRegion::as_ptr`]: the address itself, for what reads the memory outside Rust
//!   (a device's DMA after the driver registered it, a kernel's `FUTEX_WAIT`).
//!
//! The mapping is made here (`mmap`), and handed to `vm-memory`'s bitmap-free
//! [`MmapRegion`] for access; `vm-memory` does not map it itself because a region may need
//! a fixed address (the pinned arena) and must not keep a second descriptor of the file
//! open (the router counts a channel's descriptors).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use vm_memory::mmap::{MmapRegion, MmapRegionBuilder};
use vm_memory::{ByteValued, VolatileMemory, VolatileSlice};

/// Types that may be referenced in place in memory another process writes.
///
/// # Safety
///
/// The type must consist only of atomic integers (with any padding between them), so that
/// every bit pattern is a valid value, every access to it is an atomic access (the peer
/// writing it at any time is no data race), and it has no destructor to run.
pub unsafe trait SharedAtomics: Sync {}

// SAFETY: an atomic integer: any bit pattern is a value, every access is atomic.
unsafe impl SharedAtomics for AtomicU32 {}
// SAFETY: as for AtomicU32.
unsafe impl SharedAtomics for AtomicU64 {}

/// A `memfd` of `len` bytes, sealed so that its size never changes: the peer gets the same
/// file and can neither shrink it under a mapping (which would fault the mapper) nor grow it.
pub fn sealed_memfd(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call; no memory is touched.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created by this process and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain system call on a descriptor this function owns.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: plain system call on a descriptor this function owns.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The size of a file the peer sent, once it carries all of `seals` (at least
/// `F_SEAL_SHRINK`, so it can never be cut short under a mapping).
pub fn sealed_len(fd: &OwnedFd, seals: libc::c_int) -> io::Result<u64> {
    // SAFETY: plain system call on an open descriptor; no memory is touched.
    let have = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    let seals = seals | libc::F_SEAL_SHRINK;
    if have < 0 || have & seals != seals {
        let what = if seals & libc::F_SEAL_GROW != 0 { "resizing" } else { "shrinking" };
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not sealed against {what}")));
    }
    Ok(fstat(fd)?.st_size as u64)
}

/// What `fstat` says of an open file (without a second descriptor of it, as `File`'s
/// `metadata` would need: the router counts its descriptors).
pub(crate) fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `stat` into the buffer it is given, which is that large.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    Ok(unsafe { st.assume_init() })
}

/// A whole file mapped shared, read-write: see the module's documentation.
pub struct SharedRegion {
    /// The mapping, for `vm-memory`'s accessors; not owned by it (`build_raw`): this type
    /// unmaps it.
    map: MmapRegion,
    /// The file, where the owner needs it again (the pinned arena: to send it to another
    /// channel, to give pages back).
    fd: Option<OwnedFd>,
    /// Mapped at an address the peer knows too (the pinned arena): the application holds
    /// pointers into it.
    fixed: bool,
    /// The process that mapped it. A forked child inherits the mapping; a fixed one must
    /// stay there for the pointers the child inherited too.
    pid: u32,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion").field("at", &self.map.as_ptr()).field("len", &self.map.len()).finish()
    }
}

impl SharedRegion {
    /// A new sealed `memfd` of `len` bytes (zeros), mapped; the file is for the peer.
    pub fn create(name: &CStr, len: usize) -> io::Result<(SharedRegion, OwnedFd)> {
        let fd = sealed_memfd(name, len as u64)?;
        let region = Self::map(&fd, len, None)?;
        Ok((region, fd))
    }

    /// Map the whole of a file the peer sent, once it is sealed against shrinking and its
    /// size is within `min..=max`.
    pub fn attach(fd: &OwnedFd, min: usize, max: usize) -> io::Result<SharedRegion> {
        let len = sealed_len(fd, libc::F_SEAL_SHRINK)?;
        let len = usize::try_from(len).ok().filter(|l| (min..=max).contains(l));
        let len = len.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "wrong size"))?;
        Self::map(fd, len, None)
    }

    /// Map the first `len` bytes of `fd` at `addr` exactly (failing if anything of this
    /// process is there), keeping the file; it stays mapped in a forked child.
    pub fn attach_at(fd: OwnedFd, len: usize, addr: u64) -> io::Result<SharedRegion> {
        let mut region = Self::map(&fd, len, Some(addr))?;
        region.fd = Some(fd);
        Ok(region)
    }

    fn map(fd: &OwnedFd, len: usize, at: Option<u64>) -> io::Result<SharedRegion> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let (hint, flags) = match at {
            Some(a) => (a as *mut libc::c_void, libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE),
            None => (std::ptr::null_mut(), libc::MAP_SHARED),
        };
        // SAFETY: a new mapping; MAP_FIXED_NOREPLACE never replaces one of this process (it
        // fails where the range is taken), so no memory in use changes.
        let p = unsafe { libc::mmap(hint, len, prot, flags, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let unmap = || {
            // SAFETY: the mapping just made, which nothing else knows of.
            unsafe { libc::munmap(p, len) };
        };
        if at.is_some_and(|a| p as u64 != a) {
            // A kernel without MAP_FIXED_NOREPLACE takes the address as a hint.
            unmap();
            return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{:#x} is taken", at.unwrap_or(0))));
        }
        let builder = MmapRegionBuilder::new(len).with_mmap_prot(prot).with_mmap_flags(flags);
        // SAFETY: `p` is a mapping of `len` bytes made above; it stays mapped until this
        // region's `drop`, which outlives every slice `vm-memory` hands out (they borrow it).
        let built = unsafe { builder.with_raw_mmap_pointer(p as *mut u8) }.build();
        match built {
            Ok(map) => Ok(SharedRegion { map, fd: None, fixed: at.is_some(), pid: std::process::id() }),
            Err(e) => {
                unmap();
                Err(io::Error::other(e.to_string()))
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Where it is mapped in this process. Only for what reads or writes it outside Rust
    /// (a driver registering it for DMA, a kernel's futex): Rust code goes through
    /// [`slice`](Self::slice), [`atomics`](Self::atomics), [`load`](Self::load) and
    /// [`store`](Self::store).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// The file, if the region keeps it ([`attach_at`](Self::attach_at)).
    pub fn fd(&self) -> Option<&OwnedFd> {
        self.fd.as_ref()
    }

    /// `len` bytes at `offset`, for volatile copies.
    ///
    /// # Panics
    /// If the range is not within the region: offsets are the layout's, never input.
    #[track_caller]
    pub fn slice(&self, offset: usize, len: usize) -> VolatileSlice<'_> {
        match self.map.get_slice(offset, len) {
            Ok(s) => s,
            Err(e) => panic!("{len} bytes at {offset} of a shared region of {}: {e}", self.len()),
        }
    }

    /// The atomics at `offset`, in place.
    ///
    /// # Panics
    /// If they are not within the region or misaligned: offsets are the layout's, never
    /// input.
    #[track_caller]
    pub fn atomics<T: SharedAtomics>(&self, offset: usize) -> &T {
        let size = std::mem::size_of::<T>();
        let fits = offset.checked_add(size).is_some_and(|end| end <= self.len());
        assert!(fits, "{size} bytes of atomics at {offset} of a shared region of {}", self.len());
        // SAFETY: `offset + size` is within the mapping (checked above).
        let p = unsafe { self.as_ptr().add(offset) };
        assert!(p.align_offset(std::mem::align_of::<T>()) == 0, "misaligned atomics at {offset}");
        // SAFETY: `size` bytes at `p` lie in the mapping, which lives as long as `self`, and
        // `p` is aligned for `T`. `T` is made only of atomics (`SharedAtomics`): any bytes
        // the peer left there are a valid `T`, and its writes are atomic accesses that a
        // shared reference to atomics permits.
        unsafe { &*(p as *const T) }
    }

    /// The value at `offset`, read with one volatile access.
    #[track_caller]
    pub fn load<T: ByteValued>(&self, offset: usize) -> T {
        self.slice(offset, std::mem::size_of::<T>()).get_ref::<T>(0).expect("sized to fit").load()
    }

    /// Write `value` at `offset` with one volatile access.
    #[track_caller]
    pub fn store<T: ByteValued>(&self, offset: usize, value: T) {
        self.slice(offset, std::mem::size_of::<T>()).get_ref::<T>(0).expect("sized to fit").store(value)
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        if self.fixed && self.pid != std::process::id() {
            // A forked child: the application's pointers into the arena are its own too.
            return;
        }
        // SAFETY: the mapping this region made; every slice and reference into it borrowed
        // `self`, so none is left.
        unsafe { libc::munmap(self.map.as_ptr() as *mut libc::c_void, self.map.len()) };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn two_mappings_of_one_file_see_each_others_writes() {
        let (a, fd) = SharedRegion::create(c"phos-test", 8192).unwrap();
        let b = SharedRegion::attach(&fd, 4096, 8192).unwrap();
        a.store::<u64>(0, 0x1122_3344_5566_7788);
        assert_eq!(b.load::<u64>(0), 0x1122_3344_5566_7788);
        a.atomics::<AtomicU32>(64).store(7, Ordering::Release);
        assert_eq!(b.atomics::<AtomicU32>(64).load(Ordering::Acquire), 7);
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        a.slice(100, data.len()).copy_from(&data);
        let mut back = vec![0u8; 5000];
        assert_eq!(b.slice(100, 5000).copy_to(&mut back), 5000);
        assert_eq!(back, data);
    }

    #[test]
    fn a_file_must_be_sealed_and_of_an_accepted_size() {
        // SAFETY: a plain system call with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: just created, owned by nobody else.
        let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(unsealed.try_clone().unwrap()).set_len(8192).unwrap();
        assert!(SharedRegion::attach(&unsealed, 4096, 8192).unwrap_err().to_string().contains("sealed"));
        let fd = sealed_memfd(c"phos-test", 8192).unwrap();
        assert!(SharedRegion::attach(&fd, 4096, 4096).is_err(), "too large");
        assert!(SharedRegion::attach(&fd, 16384, 32768).is_err(), "too small");
    }

    #[test]
    #[should_panic(expected = "atomics at 8190")]
    fn atomics_past_the_end_are_a_bug_caught() {
        let (a, _fd) = SharedRegion::create(c"phos-test", 8192).unwrap();
        a.atomics::<AtomicU32>(8190);
    }

    #[test]
    fn a_fixed_address_is_taken_once() {
        let fd = sealed_memfd(c"phos-test", 4096).unwrap();
        // Far below where the kernel places mappings of its choosing (and the pinned arena's
        // address, which another test takes).
        let free = 0x4a00_0000_0000;
        let a = SharedRegion::attach_at(fd.try_clone().unwrap(), 4096, free).unwrap();
        assert_eq!(a.as_ptr() as u64, free);
        assert!(a.fd().is_some());
        assert_eq!(
            SharedRegion::attach_at(fd.try_clone().unwrap(), 4096, free).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        drop(a);
        assert!(SharedRegion::attach_at(fd, 4096, free).is_ok(), "free again once dropped");
    }
}
