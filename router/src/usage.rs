//! Per-session usage, from the spec's cost table: calls per function and resource amounts.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use phos_protocol::apis::{Function, RESOURCES};
use phos_protocol::spec::{Charge, RcOp};

#[derive(Default)]
pub struct Usage {
    calls: AtomicU64,
    /// Per resource: (used once, held now) amounts.
    resources: Mutex<Vec<(u64, i128)>>,
}

impl Usage {
    pub fn record(&self, _function: Function, charges: &[Charge]) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if charges.is_empty() {
            return;
        }
        let mut r = self.resources.lock();
        if r.len() < RESOURCES.len() {
            r.resize(RESOURCES.len(), (0, 0));
        }
        for c in charges {
            let Some(slot) = r.get_mut(c.resource) else { continue };
            let amount = c.amount.unwrap_or(0);
            match c.op {
                RcOp::Consumes => slot.0 = slot.0.saturating_add(amount),
                RcOp::Allocates => slot.1 += i128::from(amount),
                RcOp::Deallocates => slot.1 -= i128::from(amount),
            }
        }
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// (resource name, total used, held now) for each resource.
    pub fn resources(&self) -> Vec<(&'static str, u64, i128)> {
        let r = self.resources.lock();
        RESOURCES
            .iter()
            .enumerate()
            .map(|(i, info)| {
                let (used, held) = r.get(i).copied().unwrap_or((0, 0));
                (info.name, used, held)
            })
            .collect()
    }
}
