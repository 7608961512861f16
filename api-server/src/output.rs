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
    /// Whether the captured stdout can hold anything new (see [`Quiet`]).
    pub quiet: Quiet,
}

impl DeviceOutput {
    /// Output collected from this process's stdout as well (the `cuda` backend).
    pub fn with_capture(capture: Arc<StdoutCapture>) -> Self {
        DeviceOutput { pending: Mutex::new(Vec::new()), capture: Some(capture), quiet: Quiet::default() }
    }

    /// Whether output is read back from this process's stdout (what [`Quiet`] is for).
    pub fn captures(&self) -> bool {
        self.capture.is_some()
    }

    /// Text the interpreter printed.
    pub fn push(&self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.pending.lock().extend_from_slice(bytes);
        }
    }

    /// Everything printed so far. The captured stdout is drained (a `fflush` and a `read` of
    /// its pipe, a system call) unless no device code can have run since it was last known
    /// complete.
    pub fn take(&self) -> Vec<u8> {
        let mut out = std::mem::take(&mut *self.pending.lock());
        if let Some(c) = &self.capture
            && !self.quiet.is_quiet()
        {
            out.extend(c.drain());
        }
        out
    }
}

/// Whether the driver can have printed since the captured output was last known complete,
/// so that a synchronising call must drain the pipe (on `cuda`, one `read` system call a
/// call: 0.7 µs on a virtual machine, at every small synchronous copy).
///
/// Device `printf` output comes from kernels (the program's, a library's, a graph's), which
/// only calls that may start device code start; the driver writes it out at a flush point
/// (a synchronisation, a blocking copy, a launch, a module load) after the kernel finished.
/// So the output is complete, and stays so, from a drain made after a synchronisation of the
/// whole device that no such call ran beside or had left queued, until the next such call
/// starts: every call but those that [`may_start_device_code`] says cannot is counted when it
/// starts (`started`) and while it runs (`running`). The session's start counts as complete
/// (nothing of the program's ran yet).
///
/// Why a mark taken before a device synchronisation is sound: the calls running and the
/// calls started are one word, read at once, and the launches queued for channels'
/// submitters are read after it. A call counted in the mark as started was either still
/// running (the mark is refused) or had returned, its kernels given to the driver or still
/// queued (refused); so every kernel a marked call started was with the driver before the
/// synchronisation began, which waits for it and flushes what it printed. A call that starts
/// later moves `started` past the mark, and the mark is not kept.
#[derive(Default)]
pub struct Quiet {
    /// Calls started (above [`RUNNING_BITS`]) and running (below).
    calls: std::sync::atomic::AtomicU64,
    /// The calls started when the output was last complete.
    complete_at: std::sync::atomic::AtomicU64,
}

/// The low bits of [`Quiet::calls`] count the calls running (a session runs at most one call
/// a channel at a time, and has far fewer channels than this).
const RUNNING_BITS: u32 = 24;

impl Quiet {
    /// A call that may start device code begins (before it runs, and before what it delivers
    /// is taken).
    pub fn starting(&self) {
        self.calls.fetch_add((1 << RUNNING_BITS) + 1, std::sync::atomic::Ordering::SeqCst);
    }

    /// That call has returned (its kernels are with the driver, or queued and counted in
    /// the session's queued launches).
    pub fn ended(&self) {
        self.calls.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Before a synchronisation of the whole device: the mark it may make complete once it
    /// has succeeded and its output has been drained; `queued`, the launches queued now.
    pub fn mark(&self, queued: &std::sync::atomic::AtomicU64) -> Option<u64> {
        use std::sync::atomic::Ordering::SeqCst;
        let calls = self.calls.load(SeqCst);
        let running = calls & ((1 << RUNNING_BITS) - 1);
        (running == 0 && queued.load(SeqCst) == 0).then_some(calls >> RUNNING_BITS)
    }

    /// After that synchronisation and the drain that followed it: the output is complete if
    /// nothing started, ran or was queued meanwhile.
    pub fn settled(&self, mark: u64, queued: &std::sync::atomic::AtomicU64) {
        if self.mark(queued) == Some(mark) {
            self.complete_at.store(mark, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Whether nothing that may print started since the output was complete.
    pub fn is_quiet(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.load(SeqCst) >> RUNNING_BITS == self.complete_at.load(SeqCst)
    }
}

/// Whether a call of `f` may start device code (and so make the driver print). The calls
/// that cannot are those a loop of small copies makes: copies between host and device
/// memory, allocations, queries and synchronisations.
pub fn may_start_device_code(f: phos_protocol::apis::Function) -> bool {
    use phos_protocol::apis::Function;
    use phos_protocol::cudart::FunctionId as Rt;
    !matches!(
        f,
        Function::Cudart(
            Rt::CudaMemcpy
                | Rt::PhosMemcpyPinned
                | Rt::PhosMemcpyStaged
                | Rt::CudaMalloc
                | Rt::CudaFree
                | Rt::CudaStreamQuery
                | Rt::CudaEventQuery
                | Rt::CudaDeviceSynchronize
                | Rt::CudaStreamSynchronize
                | Rt::CudaEventSynchronize
        ) | Function::Cuda(phos_protocol::cuda::FunctionId::CuCtxSynchronize)
    )
}

/// Whether a call of `f` waits for all of the current device's work (and so, on a session
/// of one device, for every kernel given to the driver before it).
pub fn synchronises_the_device(f: phos_protocol::apis::Function) -> bool {
    use phos_protocol::apis::Function;
    matches!(
        f,
        Function::Cudart(phos_protocol::cudart::FunctionId::CudaDeviceSynchronize)
            | Function::Cuda(phos_protocol::cuda::FunctionId::CuCtxSynchronize)
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn output_is_complete_from_a_synchronisation_nothing_ran_beside_until_the_next_launch() {
        let q = Quiet::default();
        let queued = AtomicU64::new(0);
        assert!(q.is_quiet(), "nothing of the program's ran yet");
        q.starting();
        assert!(!q.is_quiet(), "a launch in progress");
        q.ended();
        assert!(!q.is_quiet(), "its kernel may still run");
        // A device synchronisation with nothing beside it makes the output complete.
        let mark = q.mark(&queued).expect("nothing runs");
        q.settled(mark, &queued);
        assert!(q.is_quiet());
        // The next launch ends it.
        q.starting();
        assert!(!q.is_quiet());
        q.ended();
        // A launch that started during the synchronisation: the mark is not kept.
        let mark = q.mark(&queued).unwrap();
        q.starting();
        q.ended();
        q.settled(mark, &queued);
        assert!(!q.is_quiet());
        // One running when it began: no mark.
        q.starting();
        assert_eq!(q.mark(&queued), None);
        q.ended();
        // A launch left queued for its channel's submitter: no mark, and none kept.
        queued.store(1, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(q.mark(&queued), None);
        queued.store(0, std::sync::atomic::Ordering::SeqCst);
        let mark = q.mark(&queued).unwrap();
        queued.store(1, std::sync::atomic::Ordering::SeqCst);
        q.settled(mark, &queued);
        assert!(!q.is_quiet());
        queued.store(0, std::sync::atomic::Ordering::SeqCst);
        let mark = q.mark(&queued).unwrap();
        q.settled(mark, &queued);
        assert!(q.is_quiet());
    }

    #[test]
    fn copies_and_synchronisations_start_no_device_code_and_launches_do() {
        use phos_protocol::apis::Function;
        use phos_protocol::cudart::FunctionId as Rt;
        for f in [Rt::CudaMemcpy, Rt::PhosMemcpyPinned, Rt::PhosMemcpyStaged, Rt::CudaStreamQuery] {
            assert!(!may_start_device_code(Function::Cudart(f)), "{f:?}");
        }
        for f in [Rt::PhosLaunchKernel, Rt::CudaGraphLaunch, Rt::PhosModuleLoad, Rt::CudaDeviceReset] {
            assert!(may_start_device_code(Function::Cudart(f)), "{f:?}");
        }
        assert!(synchronises_the_device(Function::Cudart(Rt::CudaDeviceSynchronize)));
        assert!(!synchronises_the_device(Function::Cudart(Rt::CudaStreamSynchronize)));
    }
}
