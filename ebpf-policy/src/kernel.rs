//! The kernel's verifier as a second opinion.
//!
//! A policy only uses helpers the kernel also has (same ids and signatures) and reads its
//! context the way a tracepoint program reads its record, so where the router runs with
//! `CAP_BPF` (or as root) it can load the object into the kernel as a tracepoint program,
//! through aya, and let the kernel's verifier check it before the router accepts it. The
//! program is never attached: it is dropped (and its maps freed) right after.

use aya::EbpfLoader;
use aya::programs::TracePoint;

/// Why the kernel's verifier did not accept a policy. The kernel's own explanation (the
/// verifier's log) is in the messages.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("the kernel's verifier was required, but this router may not load eBPF programs (it needs CAP_BPF)")]
    NotPermitted,
    #[error("the kernel's verification was abandoned: its client gave up")]
    Abandoned,
    #[error("cannot start the verification: {0}")]
    NoThread(std::io::Error),
    #[error("the verification thread failed")]
    ThreadFailed,
    #[error("the kernel refused the object: {0}")]
    Object(String),
    #[error("program `{name}` is not a policy entry point: {why}")]
    NotAnEntryPoint { name: String, why: String },
    #[error("the kernel's verifier refused `{name}`: {log}")]
    Refused { name: String, log: String },
    #[error("the object has no program")]
    NoProgram,
}

/// Whether this process may load eBPF programs into the kernel (it tries the syscall).
pub fn available() -> bool {
    // BPF_PROG_LOAD of a two-instruction socket filter: allowed means verifying is.
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095]; // mov r0, 0; exit
    let license = c"GPL";
    #[repr(C)]
    #[derive(Default)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
    }
    let attr = ProgLoad {
        prog_type: 1, // BPF_PROG_TYPE_SOCKET_FILTER
        insn_cnt: 2,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        ..Default::default()
    };
    const BPF_PROG_LOAD: libc::c_long = 5;
    // SAFETY: BPF_PROG_LOAD reads `size_of::<ProgLoad>()` bytes of `attr` (the kernel's
    // `bpf_attr` prefix for this command, zeros beyond what is set) and, through it, the two
    // instructions and the licence string, all on this stack for the call.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, &attr as *const ProgLoad, std::mem::size_of::<ProgLoad>())
    };
    if fd >= 0 {
        // SAFETY: the program's descriptor just returned, owned by nobody else.
        unsafe { libc::close(fd as i32) };
        true
    } else {
        false
    }
}

/// Pass every program of `elf` (with `globals` set) through the kernel's verifier. The error
/// carries the verifier's own explanation. `cancelled` is asked every 20 ms while the kernel
/// works: once it says so (the load's client gave up), the verifying thread is interrupted
/// (the verifier stops when a signal is pending) and the verification fails.
pub fn verify(elf: &[u8], globals: &[(String, Vec<u8>)], cancelled: &dyn Fn() -> bool) -> Result<(), KernelError> {
    use std::os::unix::thread::JoinHandleExt;
    use std::sync::mpsc::{RecvTimeoutError, channel};
    use std::time::Duration;

    if cancelled() {
        return Err(KernelError::Abandoned);
    }
    install_interrupt_handler();
    let (elf, globals) = (elf.to_vec(), globals.to_vec());
    let (tx, rx) = channel();
    let worker = std::thread::Builder::new()
        .name("phos-verify".into())
        .spawn(move || {
            let _ = tx.send(verify_here(&elf, &globals));
        })
        .map_err(KernelError::NoThread)?;
    let tick = Duration::from_millis(20);
    let mut interrupted = false;
    let outcome = loop {
        match rx.recv_timeout(tick) {
            Ok(r) => break r,
            Err(RecvTimeoutError::Disconnected) => break Err(KernelError::ThreadFailed),
            Err(RecvTimeoutError::Timeout) => {
                if interrupted || cancelled() {
                    interrupted = true;
                    // Again on every tick: a signal that lands between system calls is lost.
                    // SAFETY: the thread has not been joined, so its id is still valid.
                    unsafe { libc::pthread_kill(worker.as_pthread_t(), INTERRUPT) };
                }
            }
        }
    };
    let _ = worker.join();
    if interrupted { Err(KernelError::Abandoned) } else { outcome }
}

/// The signal that interrupts a verification: one nothing else here uses, whose default is
/// to be ignored.
const INTERRUPT: libc::c_int = libc::SIGURG;

/// A handler for [`INTERRUPT`] that does nothing: the signal only has to be pending (a
/// signal ignored by default would be dropped before it is). System calls it interrupts
/// elsewhere are restarted.
fn install_interrupt_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn nothing(_: libc::c_int) {}
    ONCE.call_once(|| {
        // SAFETY: all zeros is a valid sigaction (no handler, no flags, an empty mask).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: writes the mask inside `action`, a live local.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: reads `action`; the handler is async-signal safe (it does nothing), and
        // installing it changes no other signal's handler.
        unsafe { libc::sigaction(INTERRUPT, &action, std::ptr::null_mut()) };
    });
}

fn verify_here(elf: &[u8], globals: &[(String, Vec<u8>)]) -> Result<(), KernelError> {
    let mut loader = EbpfLoader::new();
    for (name, bytes) in globals {
        loader.override_global(name.as_str(), bytes.as_slice(), true);
    }
    let mut ebpf = loader.load(elf).map_err(|e| KernelError::Object(chain(&e)))?;
    let mut checked = 0;
    for (name, program) in ebpf.programs_mut() {
        let tp: &mut TracePoint = program.try_into().map_err(|e: aya::programs::ProgramError| {
            KernelError::NotAnEntryPoint { name: name.to_string(), why: e.to_string() }
        })?;
        tp.load().map_err(|e| KernelError::Refused { name: name.to_string(), log: chain(&e) })?;
        checked += 1;
    }
    if checked == 0 {
        return Err(KernelError::NoProgram);
    }
    Ok(())
}

/// An error with its sources (the verifier log is in the innermost one).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}
