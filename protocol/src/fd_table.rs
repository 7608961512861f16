//! Sizing a process's descriptor table once, before it is needed.
//!
//! Linux grows a process's descriptor table by doubling it when a new descriptor does not
//! fit, and in a process of several threads each growth waits for an RCU grace period
//! (`expand_fdtable`'s `synchronize_rcu`): 8-16 ms measured on this project's machines at
//! 256, 512, 1024 and 2048 descriptors. Whatever opened the descriptor waits that long: a
//! restore opening its image's memory files, a checkpoint creating them, a channel's socket
//! or staging memory. The table never shrinks, so growing it once at start (while the
//! process has one thread, which skips the wait) removes those stalls for the process's
//! life; it costs 8 bytes and a few bits per slot.

use std::io;

/// Grow the descriptor table to hold `most` descriptors, or the soft `RLIMIT_NOFILE` if
/// that is lower. Returns the slots it now has at least. Call it early, before threads.
pub fn presize(most: u32) -> io::Result<u32> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct, which `rl` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let slots = u32::try_from(rl.rlim_cur).unwrap_or(u32::MAX).min(most);
    if slots <= 64 {
        // The smallest table a process has anyway.
        return Ok(slots);
    }
    let null = std::fs::File::open("/dev/null")?;
    let highest = i32::try_from(slots - 1).unwrap_or(i32::MAX);
    // SAFETY: F_DUPFD_CLOEXEC duplicates an open descriptor (`null`'s) onto the lowest free
    // one at or above `highest`; it touches no memory of ours.
    let fd = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&null), libc::F_DUPFD_CLOEXEC, highest) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made by fcntl above and nothing else holds it.
    unsafe { libc::close(fd) };
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's size, as the kernel reports it.
    fn table_size() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line["FDSize:".len()..].trim().parse().unwrap()
    }

    #[test]
    fn the_table_is_grown_to_the_size_asked_within_the_limit() {
        let slots = presize(3000).unwrap();
        let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit struct, which `rl` is.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
        assert_eq!(u64::from(slots), rl.rlim_cur.min(3000));
        assert!(table_size() >= slots, "FDSize {} after presizing to {slots}", table_size());
    }
}
