//! Large host-memory copies on several threads. A staged copy (pageable memory through the
//! channel's staging slots) moves as fast as the guest copies each chunk into or out of a
//! slot: one core copies 7-10 GB/s where the DMA behind it runs at 50 GB/s, so chunks are
//! split across a few helper threads (`PHOS_COPY_THREADS`, by default half the CPUs up to 4;
//! 1 copies on the calling thread only).

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Parts smaller than this are not worth a hand-over to another thread.
const MIN_PART: usize = 1 << 20;

/// One part of a copy, and the count its caller waits on.
struct Part {
    dst: usize,
    src: usize,
    len: usize,
    done: Arc<(Mutex<usize>, Condvar)>,
}

struct Pool {
    workers: Vec<Mutex<Sender<Part>>>,
    /// The process that started the threads: a forked child has none of them.
    pid: u32,
}

fn threads() -> usize {
    if let Some(n) = std::env::var("PHOS_COPY_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok()) {
        return n.clamp(1, 16);
    }
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 4))
}

fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    let pool = POOL
        .get_or_init(|| {
            let mut workers = Vec::new();
            for i in 1..threads() {
                let (tx, rx) = channel::<Part>();
                let started = std::thread::Builder::new().name(format!("phos-copy-{i}")).spawn(move || {
                    while let Ok(p) = rx.recv() {
                        // SAFETY: a part of a `copy` whose caller waits (on `done`) until every
                        // part is counted, so both ranges stay valid for this copy, and the parts
                        // of one copy do not overlap one another.
                        unsafe { std::ptr::copy_nonoverlapping(p.src as *const u8, p.dst as *mut u8, p.len) };
                        let (count, cv) = &*p.done;
                        *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                        cv.notify_one();
                    }
                });
                if started.is_err() {
                    break;
                }
                workers.push(Mutex::new(tx));
            }
            (!workers.is_empty()).then(|| Pool { workers, pid: crate::pid::current() })
        })
        .as_ref()?;
    (pool.pid == crate::pid::current()).then_some(pool)
}

/// Copy `len` bytes from `src` to `dst` (which do not overlap), on several threads when it is
/// large enough.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    if len < 2 * MIN_PART {
        // One part: on this thread, without looking for the pool (a small copy's path).
        // SAFETY: this function's contract is `copy_nonoverlapping`'s.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let pool = pool();
    let parts = (len / MIN_PART).min(pool.map_or(1, |p| p.workers.len() + 1));
    let Some(pool) = pool.filter(|_| parts > 1) else {
        // SAFETY: this function's contract is `copy_nonoverlapping`'s.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    };
    // Cache-line aligned parts; the calling thread copies the first (and the remainder).
    let part = (len / parts) & !63;
    let done = Arc::new((Mutex::new(0usize), Condvar::new()));
    let mut handed = 0;
    for (i, worker) in pool.workers.iter().take(parts - 1).enumerate() {
        let at = (i + 1) * part;
        let len = if i + 2 == parts { len - at } else { part };
        let p = Part { dst: dst as usize + at, src: src as usize + at, len, done: done.clone() };
        if let Err(e) = worker.lock().unwrap_or_else(|e| e.into_inner()).send(p) {
            // The worker is gone: copy its part here.
            let p = e.0;
            // SAFETY: a part of this copy's ranges (this function's contract), copied here instead
            // of on the worker that is gone.
            unsafe { std::ptr::copy_nonoverlapping(p.src as *const u8, p.dst as *mut u8, p.len) };
        } else {
            handed += 1;
        }
    }
    // SAFETY: the first `part` bytes of this copy's ranges (this function's contract); the other
    // parts are the workers', which do not overlap it.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, part) };
    let (count, cv) = &*done;
    let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
    while *n < handed {
        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn large_and_odd_sized_copies_arrive_whole() {
        // Helper threads even on a small machine (no other test of this binary copies).
        // SAFETY: no other test of this binary reads or writes the environment while this one runs.
        unsafe { std::env::set_var("PHOS_COPY_THREADS", "4") };
        assert_eq!(super::pool().map(|p| p.workers.len()), Some(3));
        for len in [0, 1, 4097, (1 << 20) - 3, (3 << 20) + 65, 9 << 20] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut dst = vec![0u8; len];
            // SAFETY: two distinct vectors of `len` bytes.
            unsafe { super::copy(dst.as_mut_ptr(), src.as_ptr(), len) };
            assert!(dst == src, "{len} bytes");
        }
    }
}
