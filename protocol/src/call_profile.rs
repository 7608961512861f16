//! `PHOS_PROFILE=1`: where a program's time through Phos goes, per carried function.
//!
//! The guest library tallies the calls it carries (for synchronous ones, how long the calling
//! thread waited for the answer) and the API server the same calls as it runs them (how long
//! each took in the server, async ones included). Set in both environments, the two tables
//! tell a call's own cost from what it waited behind. Off (the default), a call pays one
//! relaxed load of a flag.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::apis::Function;

/// Whether `PHOS_PROFILE` asks for the tables (read once per process).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PHOS_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// When a call starts, if profiling.
pub fn start() -> Option<Instant> {
    enabled().then(Instant::now)
}

thread_local! {
    /// Time this thread spent in vendor libraries' entry points since the last take.
    static VENDOR_NS: Cell<u64> = const { Cell::new(0) };
}

/// A vendor library's entry point called at `started` has returned (the API server's share
/// of a call that NVIDIA's library itself took).
pub fn vendor_ended(started: Option<Instant>) {
    if let Some(t) = started {
        VENDOR_NS.with(|v| v.set(v.get() + t.elapsed().as_nanos() as u64));
    }
}

/// The vendor time noted on this thread since the last take.
pub fn take_vendor_ns() -> u64 {
    VENDOR_NS.with(|v| v.replace(0))
}

/// Calls of one function: synchronous and async ones, with the time each kind took, and how
/// much of it was spent in a vendor library.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tally {
    pub sync: u64,
    pub sync_ns: u64,
    pub async_calls: u64,
    pub async_ns: u64,
    pub vendor_ns: u64,
}

/// A table of tallies by function.
#[derive(Default)]
pub struct CallProfile {
    table: Mutex<HashMap<Function, Tally>>,
}

impl CallProfile {
    pub fn new() -> Self {
        Self::default()
    }

    /// A call of `f` that started at `started` has ended (no-op when not profiling).
    pub fn ended(&self, f: Function, is_async: bool, started: Option<Instant>) {
        let Some(t) = started else { return };
        let ns = t.elapsed().as_nanos() as u64;
        let vendor = take_vendor_ns();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let e = table.entry(f).or_default();
        e.vendor_ns += vendor;
        if is_async {
            e.async_calls += 1;
            e.async_ns += ns;
        } else {
            e.sync += 1;
            e.sync_ns += ns;
        }
    }

    /// An async call of `f` with no time to account (the guest sends it and goes on).
    pub fn sent(&self, f: Function) {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).entry(f).or_default().async_calls += 1;
    }

    /// The tallies so far, leaving this one empty.
    pub fn take(&self) -> CallProfile {
        CallProfile { table: Mutex::new(std::mem::take(&mut *self.table.lock().unwrap_or_else(|p| p.into_inner()))) }
    }

    pub fn is_empty(&self) -> bool {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// The table, the most time first: `heading` names whose it is, `time` what its times are.
    pub fn table(&self, heading: &str, time: &str) -> String {
        let mut rows: Vec<(Function, Tally)> =
            self.table.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(f, e)| (*f, *e)).collect();
        rows.sort_by(|a, b| {
            (b.1.sync_ns + b.1.async_ns).cmp(&(a.1.sync_ns + a.1.async_ns)).then(b.1.async_calls.cmp(&a.1.async_calls))
        });
        let total = rows.iter().fold(Tally::default(), |t, (_, e)| Tally {
            sync: t.sync + e.sync,
            sync_ns: t.sync_ns + e.sync_ns,
            async_calls: t.async_calls + e.async_calls,
            async_ns: t.async_ns + e.async_ns,
            vendor_ns: t.vendor_ns + e.vendor_ns,
        });
        let ms = |ns: u64| ns as f64 / 1e6;
        let per = |ns: u64, n: u64| if n > 0 { ns as f64 / n as f64 / 1e3 } else { 0.0 };
        let mut out = format!(
            "{heading}: {} synchronous calls ({:.3} ms {time}), {} async calls ({:.3} ms)\n\
             {:<48} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10}\n",
            total.sync,
            ms(total.sync_ns),
            total.async_calls,
            ms(total.async_ns),
            "function",
            "sync",
            "sync ms",
            "us/call",
            "async",
            "us/async",
            "vendor us"
        );
        for (f, e) in rows {
            out.push_str(&format!(
                "{:<48} {:>10} {:>12.3} {:>10.2} {:>10} {:>10.2} {:>10.2}\n",
                f.name(),
                e.sync,
                ms(e.sync_ns),
                per(e.sync_ns, e.sync),
                e.async_calls,
                per(e.async_ns, e.async_calls),
                per(e.vendor_ns, e.sync + e.async_calls)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cudart::FunctionId;
    use std::time::Duration;

    #[test]
    fn the_table_lists_the_most_time_first() {
        let p = CallProfile::new();
        let a = Function::Cudart(FunctionId::CudaMalloc);
        let b = Function::Cudart(FunctionId::CudaMemcpy);
        let long_ago = Instant::now() - Duration::from_millis(5);
        p.ended(a, false, Some(Instant::now()));
        p.ended(b, false, Some(long_ago));
        p.ended(b, true, Some(long_ago));
        p.sent(a);
        let t = p.table("test", "waited");
        let (pa, pb) = (t.find("cudaMalloc ").unwrap(), t.find("cudaMemcpy ").unwrap());
        assert!(pb < pa, "{t}");
        assert!(t.contains("2 synchronous calls"), "{t}");
        assert!(t.contains("2 async calls"), "{t}");
        // Not profiling (no start time): nothing is noted.
        p.ended(a, false, None);
        assert_eq!(p.table("test", "waited"), t);
        // Taking the table leaves an empty one.
        assert!(!p.take().is_empty());
        assert!(p.is_empty());
    }
}
