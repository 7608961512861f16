//! `PHOS_PROFILE=1`: which carried calls a program's time through Phos goes to.
//!
//! The guest library counts the calls it carries to the API server, per function, and for
//! synchronous ones the time the calling thread waited for the answer; at exit it prints the
//! table, most waited-for first, on standard error. Off (the default), a call pays one relaxed
//! load of a flag.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use phos_protocol::apis::Function;

/// Calls of one function: synchronous ones, their waiting time, async ones.
#[derive(Default, Clone, Copy)]
struct Tally {
    sync: u64,
    waited_ns: u64,
    async_calls: u64,
}

static ON: OnceLock<bool> = OnceLock::new();
static TABLE: Mutex<Option<HashMap<Function, Tally>>> = Mutex::new(None);
static REPORT_REGISTERED: AtomicBool = AtomicBool::new(false);

fn on() -> bool {
    *ON.get_or_init(|| std::env::var("PHOS_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// When a synchronous call starts, if profiling.
pub fn start() -> Option<Instant> {
    on().then(Instant::now)
}

/// A synchronous call of `f` started at `started` has its answer.
pub fn sync_call(f: Function, started: Option<Instant>) {
    if let Some(t) = started {
        let ns = t.elapsed().as_nanos() as u64;
        note(f, |e| {
            e.sync += 1;
            e.waited_ns += ns;
        });
    }
}

/// An async call of `f` was sent.
pub fn async_call(f: Function) {
    if on() {
        note(f, |e| e.async_calls += 1);
    }
}

fn note(f: Function, change: impl FnOnce(&mut Tally)) {
    change(TABLE.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).entry(f).or_default());
    if !REPORT_REGISTERED.swap(true, Ordering::Relaxed) {
        // SAFETY: registers a plain `extern "C"` function with no arguments, as atexit asks.
        unsafe { libc::atexit(report_at_exit) };
    }
}

/// The table as printed at exit.
fn table() -> String {
    let rows: Vec<(Function, Tally)> = TABLE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|t| t.iter().map(|(f, e)| (*f, *e)).collect())
        .unwrap_or_default();
    let mut rows = rows;
    rows.sort_by(|a, b| b.1.waited_ns.cmp(&a.1.waited_ns).then(b.1.async_calls.cmp(&a.1.async_calls)));
    let (sync, waited, asyncs) =
        rows.iter().fold((0, 0, 0), |(s, w, a), (_, e)| (s + e.sync, w + e.waited_ns, a + e.async_calls));
    let mut out = format!(
        "phos profile of process {}: {sync} synchronous calls ({:.3} ms waited), {asyncs} async calls\n\
         {:<48} {:>10} {:>12} {:>10} {:>10}\n",
        std::process::id(),
        waited as f64 / 1e6,
        "function",
        "sync",
        "waited ms",
        "us/call",
        "async"
    );
    for (f, e) in rows {
        let per = if e.sync > 0 { e.waited_ns as f64 / e.sync as f64 / 1e3 } else { 0.0 };
        out.push_str(&format!(
            "{:<48} {:>10} {:>12.3} {:>10.2} {:>10}\n",
            f.name(),
            e.sync,
            e.waited_ns as f64 / 1e6,
            per,
            e.async_calls
        ));
    }
    out
}

extern "C" fn report_at_exit() {
    // No tracing here: its thread-local state may be gone in exit handlers.
    let text = table();
    // SAFETY: writes the bytes of a live String to standard error.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::cudart::FunctionId;

    #[test]
    fn the_table_lists_the_most_waited_for_first() {
        let a = Function::Cudart(FunctionId::CudaMalloc);
        let b = Function::Cudart(FunctionId::CudaMemcpy);
        note(a, |e| {
            e.sync += 1;
            e.waited_ns += 1_000;
        });
        note(b, |e| {
            e.sync += 2;
            e.waited_ns += 9_000;
        });
        let t = table();
        let (pa, pb) = (t.find("cudaMalloc ").unwrap(), t.find("cudaMemcpy ").unwrap());
        assert!(pb < pa, "{t}");
        assert!(t.contains("3 synchronous calls"), "{t}");
    }
}
