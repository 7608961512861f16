//! The operator's step timing of checkpoints and restores: each step that may take a
//! while (a phase of a checkpoint or restore, a page-locking, a replayed call) is timed, and
//! one that takes a millisecond or more is logged at debug level under the target
//! `phos::cr_timing` (`PHOS_LOG=info,phos::cr_timing=debug`). Nothing is measured unless
//! that level is on. The engine here and the API server log through the same functions.

use std::time::{Duration, Instant};

/// The target the step timing is logged under.
pub const TARGET: &str = "phos::cr_timing";

/// Steps shorter than this are not worth a line.
pub const SLOW: Duration = Duration::from_millis(1);

/// Whether the steps are being timed.
pub fn on() -> bool {
    tracing::enabled!(target: "phos::cr_timing", tracing::Level::DEBUG)
}

/// Run `step`, logging what `what` names if it was slow.
pub fn timed<T>(what: impl FnOnce() -> String, step: impl FnOnce() -> T) -> T {
    if !on() {
        return step();
    }
    let start = Instant::now();
    let out = step();
    slow(start, what);
    out
}

/// Log what `what` names if the time since `start` was slow.
pub fn slow(start: Instant, what: impl FnOnce() -> String) {
    let took = start.elapsed();
    if took >= SLOW {
        tracing::debug!(target: "phos::cr_timing", ms = took.as_secs_f64() * 1e3, "{}", what());
    }
}

/// Log `what` at the step timing's level whatever it took (a summary of a phase's figures).
pub fn note(what: impl FnOnce() -> String) {
    if on() {
        tracing::debug!(target: "phos::cr_timing", "{}", what());
    }
}
