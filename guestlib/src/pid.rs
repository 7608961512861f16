//! This process's id without a system call per look.
//!
//! The guest compares its pid with the one its session, channel, pinned arena and copy
//! threads were made in, to tell a forked child (which must not use its parent's) from the
//! process itself. `getpid` is a real system call (glibc does not cache it): about 0.5 µs on
//! a virtual machine, and a small copy looked several times. The pid is kept in a page
//! marked `MADV_WIPEONFORK`, which the kernel hands to every child of a fork zeroed, whatever
//! made the fork (`fork`, `_Fork`, a raw `clone`), so a child finds no pid there and asks the
//! kernel once. Where the kernel cannot wipe the page (before Linux 4.14), every look asks it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The address of the page, or `None` where it could not be made.
fn page() -> Option<&'static AtomicU32> {
    static PAGE: OnceLock<usize> = OnceLock::new();
    let addr = *PAGE.get_or_init(|| {
        let len = 4096;
        // SAFETY: a new private anonymous mapping; touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return 0;
        }
        // SAFETY: the mapping just made, of `len` bytes.
        if unsafe { libc::madvise(p, len, libc::MADV_WIPEONFORK) } != 0 {
            // SAFETY: the mapping just made, which nothing else knows.
            unsafe { libc::munmap(p, len) };
            return 0;
        }
        p as usize
    });
    // SAFETY: a page of this process that is never unmapped, zeroed when made (and in every
    // forked child), aligned for a u32 and only ever used as this one atomic.
    (addr != 0).then(|| unsafe { &*(addr as *const AtomicU32) })
}

/// This process's id, as `std::process::id()`.
pub fn current() -> u32 {
    let Some(word) = page() else { return std::process::id() };
    match word.load(Ordering::Relaxed) {
        0 => {
            let pid = std::process::id();
            word.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_forked_child_sees_its_own_pid() {
        let parent = super::current();
        assert_eq!(parent, std::process::id());
        assert_eq!(super::current(), parent);
        let mut fds = [0; 2];
        // SAFETY: writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only asks for its pid, writes it to the pipe and exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let seen = super::current();
            let ok = seen == std::process::id() && seen != parent;
            // SAFETY: one byte from this stack to the pipe's writing end.
            unsafe { libc::write(fds[1], [u8::from(ok)].as_ptr().cast(), 1) };
            // SAFETY: ends the child at once, running nothing of the test harness's.
            unsafe { libc::_exit(0) };
        }
        let mut byte = [0u8; 1];
        // SAFETY: reads one byte into `byte`.
        assert_eq!(unsafe { libc::read(fds[0], byte.as_mut_ptr().cast(), 1) }, 1);
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(byte[0], 1, "the child saw its parent's pid");
        assert_eq!(super::current(), parent);
    }
}
