//! Where the C/R engine's time goes on the device: each step of a concurrent checkpoint that
//! may hold up the session's own work (mapping the reserve, page-locking copy buffers,
//! copying aside, a launch issued while a window is armed) is timed, and one that takes a
//! millisecond or more is logged at debug level under the target `phos::cr_timing`
//! (`PHOS_LOG=info,phos::cr_timing=debug`). Nothing is measured unless that level is on.

use std::time::{Duration, Instant};

/// Steps shorter than this are not worth a line.
const SLOW: Duration = Duration::from_millis(1);

/// Whether the steps are being timed.
pub(crate) fn on() -> bool {
    tracing::enabled!(target: "phos::cr_timing", tracing::Level::DEBUG)
}

/// Run `step`, logging what `what` names if it was slow.
pub(crate) fn timed<T>(what: impl FnOnce() -> String, step: impl FnOnce() -> T) -> T {
    if !on() {
        return step();
    }
    let start = Instant::now();
    let out = step();
    slow(start, what);
    out
}

/// Log what `what` names if the time since `start` was slow.
pub(crate) fn slow(start: Instant, what: impl FnOnce() -> String) {
    let took = start.elapsed();
    if took >= SLOW {
        tracing::debug!(target: "phos::cr_timing", ms = took.as_secs_f64() * 1e3, "{}", what());
    }
}
