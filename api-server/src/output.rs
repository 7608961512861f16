//! Device `printf` output on its way to the guest's stdout.
//!
//! On `emu` the interpreter hands the text over directly. On `cuda` the driver prints it to
//! the server process's own standard output, so the server points its fd 1 at a pipe
//! ([`StdoutCapture`]) and collects what arrives. Either way the text waits here until a call
//! the spec marks `device_output` (a synchronisation, a blocking copy, ...) carries it to the
//! guest, which is when CUDA itself flushes its printf buffer.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;

/// Pending device output of one session.
#[derive(Default)]
pub struct DeviceOutput {
    pending: Mutex<Vec<u8>>,
    capture: Option<Arc<StdoutCapture>>,
}

impl DeviceOutput {
    /// Output collected from this process's stdout as well (the `cuda` backend).
    pub fn with_capture(capture: Arc<StdoutCapture>) -> Self {
        DeviceOutput { pending: Mutex::new(Vec::new()), capture: Some(capture) }
    }

    /// Text the interpreter printed.
    pub fn push(&self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.pending.lock().extend_from_slice(bytes);
        }
    }

    /// Everything printed so far.
    pub fn take(&self) -> Vec<u8> {
        let mut out = std::mem::take(&mut *self.pending.lock());
        if let Some(c) = &self.capture {
            out.extend(c.drain());
        }
        out
    }
}

unsafe extern "C" {
    static mut stdout: *mut libc::FILE;
}

/// This process's stdout, redirected into a pipe. Whatever reads the pipe does so holding the
/// lock, so a byte is always either still in the pipe or in `data`: a drain that empties the
/// pipe itself has everything printed before it, with no hand-over between threads on the
/// call path. A thread keeps the pipe from filling up between drains.
pub struct StdoutCapture {
    data: Mutex<Captured>,
    pipe: std::fs::File,
}

/// What was read from the pipe, and the buffer reads go through: made once, because a
/// drain runs at every synchronising call (each small `cudaMemcpy`), where zeroing a fresh
/// 64 KiB buffer on the stack cost more than the (empty) read itself.
struct Captured {
    data: Vec<u8>,
    buf: Box<[u8]>,
}

impl StdoutCapture {
    /// Point fd 1 at a fresh pipe and start draining it. Returns the capture and the
    /// original stdout, for what is meant for whoever started the process.
    pub fn install() -> std::io::Result<(Arc<Self>, std::fs::File)> {
        // SAFETY: duplicates fd 1 into a new descriptor; touches no memory.
        let original = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
        if original < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just made, owned by nothing else.
        let original = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(original) });
        let mut fds = [0; 2];
        // SAFETY: writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Only the reading end is non-blocking: a printer waits for room rather than lose text.
        // SAFETY: the flags of the pipe's writing end, which this owns.
        let blocking = unsafe { libc::fcntl(fds[1], libc::F_SETFL, 0) } == 0;
        // SAFETY: fd 1 becomes a duplicate of the pipe's writing end (what the process printed
        // there went to the file kept above as `original`).
        let writer_set = blocking && unsafe { libc::dup2(fds[1], 1) } >= 0;
        if !writer_set {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the writing end, now duplicated as fd 1; nothing else holds this number.
        unsafe { libc::close(fds[1]) };
        // SAFETY: the reading end, just made, owned by nothing else.
        let pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fds[0]) });
        let captured = Captured { data: Vec::new(), buf: vec![0u8; 64 << 10].into_boxed_slice() };
        let capture = Arc::new(StdoutCapture { data: Mutex::new(captured), pipe });
        let c = capture.clone();
        std::thread::Builder::new().name("phos-stdout".into()).spawn(move || {
            use std::os::fd::AsRawFd;
            let mut pfd = libc::pollfd { fd: c.pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            loop {
                // SAFETY: polls one descriptor, described by `pfd`.
                if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    break;
                }
                if pfd.revents & libc::POLLIN == 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    break;
                }
                let mut captured = c.data.lock();
                c.read_available(&mut captured);
            }
        })?;
        Ok((capture, original))
    }

    /// Move what the pipe holds into `data` (called with the lock held).
    fn read_available(&self, captured: &mut Captured) {
        let Captured { data, buf } = captured;
        loop {
            match (&self.pipe).read(buf) {
                Ok(0) => return,
                Ok(n) => data.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // WouldBlock: empty.
                Err(_) => return,
            }
        }
    }

    /// Flush the C library's stdout buffer (where the driver prints) and take everything
    /// printed before now.
    fn drain(&self) -> Vec<u8> {
        // SAFETY: reading the C library's `stdout` pointer, which it sets before `main`
        // and never changes.
        let stream = unsafe { stdout };
        // SAFETY: that stream lives as long as the process.
        unsafe { libc::fflush(stream) };
        let mut captured = self.data.lock();
        self.read_available(&mut captured);
        std::mem::take(&mut captured.data)
    }
}
