//! What a session uses, as the router is told: the spec's continuous and measured resources,
//! and the calls its per-session limits refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phos_protocol::apis::RESOURCES;
use phos_protocol::handshake::UsageReport;
use phos_protocol::limits::{LimitKind, SessionLimits};
use phos_protocol::spec::ResourceKind;

/// The figures a report is made of: device memory, pinned host memory, device time (ns),
/// kernels, calls refused by a limit.
pub type Figures = [u64; 5];

/// The usage figures last reported to the router.
struct Reported {
    figures: Figures,
    at: Instant,
    /// A change of device time or kernels not reported yet.
    held_back: bool,
}

pub struct Usage {
    limits: SessionLimits,
    /// Calls refused by each limit ([`LimitKind::index`]) since the server started.
    refused: [AtomicU64; LimitKind::ALL.len()],
    reported: Mutex<Reported>,
}

impl Usage {
    pub fn new(limits: SessionLimits) -> Self {
        Usage {
            limits,
            refused: Default::default(),
            reported: Mutex::new(Reported { figures: [0; 5], at: Instant::now(), held_back: false }),
        }
    }

    /// The session's limit of `kind`.
    pub fn limit(&self, kind: LimitKind) -> u64 {
        self.limits.get(kind)
    }

    /// Count a call refused by the `kind` limit; the refusals so far.
    pub fn count_refusal(&self, kind: LimitKind) -> u64 {
        self.refused[kind.index()].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Calls refused by every limit so far.
    pub fn refusals(&self) -> u64 {
        self.refused.iter().map(|r| r.load(Ordering::Relaxed)).sum()
    }

    /// A report of `figures` (from [`refusals`](Self::refusals) and the registries and
    /// backend), if they changed since the last report. The server knows how to measure
    /// `device_memory` (bytes allocated), `pinned_host_memory` and `device_time` (kernel
    /// nanoseconds); a resource of another name is not reported.
    ///
    /// `kernel_gap`: device time and kernel counts alone are reported at most this often (a
    /// launch storm would otherwise send a report per launch); memory is always reported at
    /// once. A figure held back makes [`unreported`](Self::unreported) true.
    pub fn report_if_changed(&self, figures: Figures, kernel_gap: Duration) -> Option<UsageReport> {
        {
            let mut last = self.reported.lock();
            if last.figures == figures {
                last.held_back = false;
                return None;
            }
            let now = Instant::now();
            if last.figures[..2] == figures[..2]
                && last.figures[4] == figures[4]
                && !kernel_gap.is_zero()
                && now.saturating_duration_since(last.at) < kernel_gap
            {
                last.held_back = true;
                return None;
            }
            *last = Reported { figures, at: now, held_back: false };
        }
        let [memory, pinned, ns, kernels, _] = figures;
        let mut report = UsageReport::default();
        for (i, r) in RESOURCES.iter().enumerate() {
            match (r.kind, r.name) {
                (ResourceKind::Continuous, "device_memory") => report.held.push((i as u32, memory)),
                (ResourceKind::Continuous, "pinned_host_memory") => report.held.push((i as u32, pinned)),
                (ResourceKind::Measured, "device_time") => report.measured.push((i as u32, ns, kernels)),
                _ => {}
            }
        }
        report.refused = LimitKind::ALL
            .iter()
            .map(|k| (k.index() as u32, self.refused[k.index()].load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        Some(report)
    }

    /// Whether [`report_if_changed`](Self::report_if_changed) held a change back.
    pub fn unreported(&self) -> bool {
        self.reported.lock().held_back
    }
}
