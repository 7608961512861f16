//! Device `printf` output on its way to the guest's stdout.
//!
//! On `emu` the interpreter hands the text over directly. On `cuda` the driver prints it to
//! the server process's own standard output, so the server points its fd 1 at a pipe
//! ([`StdoutCapture`]) and collects what arrives. Either way the text waits here until a call
//! the spec marks `device_output` (a synchronisation, a blocking copy, ...) carries it to the
//! guest, which is when CUDA itself flushes its printf buffer.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

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
            self.pending.lock().unwrap().extend_from_slice(bytes);
        }
    }

    /// Everything printed so far.
    pub fn take(&self) -> Vec<u8> {
        let mut out = std::mem::take(&mut *self.pending.lock().unwrap());
        if let Some(c) = &self.capture {
            out.extend(c.drain());
        }
        out
    }
}

unsafe extern "C" {
    static mut stdout: *mut libc::FILE;
}

/// This process's stdout, redirected into a pipe that a thread drains.
pub struct StdoutCapture {
    state: Mutex<CaptureState>,
    changed: Condvar,
}

#[derive(Default)]
struct CaptureState {
    data: Vec<u8>,
    /// Markers written so far and the last one the reader has seen.
    written: u64,
    seen: u64,
}

/// Separates what was printed before a drain from what comes after. It starts with a NUL
/// byte, which printf text does not contain in practice.
const MARKER: &[u8] = b"\0phos-output-mark\0";

impl StdoutCapture {
    /// Point fd 1 at a fresh pipe and start draining it. Returns the capture and the
    /// original stdout, for what is meant for whoever started the process.
    pub fn install() -> std::io::Result<(Arc<Self>, std::fs::File)> {
        let original = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
        if original < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let original = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(original) });
        let mut fds = [0; 2];
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if unsafe { libc::dup2(fds[1], 1) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        unsafe { libc::close(fds[1]) };
        let mut reader = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fds[0]) });
        let capture = Arc::new(StdoutCapture { state: Mutex::new(CaptureState::default()), changed: Condvar::new() });
        let c = capture.clone();
        std::thread::Builder::new().name("phos-stdout".into()).spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = c.state.lock().unwrap();
                s.data.extend_from_slice(&buf[..n]);
                // Count complete markers and cut them out.
                while let Some(at) = find(&s.data, MARKER) {
                    s.data.drain(at..at + MARKER.len());
                    s.seen += 1;
                }
                c.changed.notify_all();
            }
        })?;
        Ok((capture, original))
    }

    /// Flush the C library's stdout buffer (where the driver prints), and wait until
    /// everything printed before now has come through the pipe.
    fn drain(&self) -> Vec<u8> {
        unsafe {
            libc::fflush(stdout);
        }
        let target = {
            let mut s = self.state.lock().unwrap();
            s.written += 1;
            s.written
        };
        // Written without the lock held: the reader needs it to make room in the pipe.
        let w = unsafe { libc::write(1, MARKER.as_ptr() as *const libc::c_void, MARKER.len()) };
        let mut s = self.state.lock().unwrap();
        if w == MARKER.len() as isize {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while s.seen < target {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    tracing::warn!("device output did not arrive within 5 s");
                    break;
                }
                s = self.changed.wait_timeout(s, left).unwrap().0;
            }
        }
        std::mem::take(&mut s.data)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
