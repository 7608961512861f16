//! `PHOS_PROFILE=1`: which carried calls a program's time through Phos goes to.
//!
//! The guest library counts the calls it carries to the API server, per function, and for
//! synchronous ones the time the calling thread waited for the answer; at exit it prints the
//! table, most waited-for first, on standard error. The API server keeps the same table of
//! the time each call took there ([`phos_protocol::call_profile`]).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use phos_protocol::apis::Function;
use phos_protocol::call_profile::{self, CallProfile};

static TABLE: LazyLock<CallProfile> = LazyLock::new(CallProfile::new);
static REPORT_REGISTERED: AtomicBool = AtomicBool::new(false);
/// Synchronous calls that returned on the answer the server posted in the staging region.
static POSTED: AtomicU64 = AtomicU64::new(0);

/// When a synchronous call starts, if profiling.
pub fn start() -> Option<Instant> {
    call_profile::start()
}

/// A synchronous call of `f` started at `started` has its answer.
pub fn sync_call(f: Function, started: Option<Instant>) {
    if started.is_some() {
        TABLE.ended(f, false, started);
        registered();
    }
}

/// A synchronous call returned on its posted answer (counted when profiling).
pub fn posted_answer() {
    if call_profile::enabled() {
        POSTED.fetch_add(1, Ordering::Relaxed);
    }
}

/// An async call of `f` was sent.
pub fn async_call(f: Function) {
    if call_profile::enabled() {
        TABLE.sent(f);
        registered();
    }
}

fn registered() {
    if !REPORT_REGISTERED.swap(true, Ordering::Relaxed) {
        // SAFETY: registers a plain `extern "C"` function with no arguments, as atexit asks.
        unsafe { libc::atexit(report_at_exit) };
    }
}

extern "C" fn report_at_exit() {
    // No tracing here: its thread-local state may be gone in exit handlers.
    let mut text = TABLE.table(&format!("phos profile of process {}", std::process::id()), "waited");
    text.push_str(&format!("answers taken as posted: {}\n", POSTED.load(Ordering::Relaxed)));
    // SAFETY: writes the bytes of a live String to standard error.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}
