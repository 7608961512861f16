//! Device time when tenants' work overlaps.
//!
//! The API servers measure a kernel with events around it, which gives GPU wall time. When
//! several processes have work queued, the GPU time-slices between their contexts, and a
//! kernel's events then also span the slices the others ran in: a tenant of long kernels is
//! measured at nearly the whole wall time while it shares the GPU, and would be charged for
//! the other tenants' work. Time slices are equal between contexts that have work, so the
//! router charges a tenant at most its fair part of the time it had work queued: over any
//! period, each tenant with measured calls pending (admitted, not yet measured) earns
//! `dt / n` of *contended time*, `n` being the number of such tenants, and a measurement is
//! charged as the smaller of what was measured and the contended time earned. Running alone,
//! a tenant is charged what it measured; sharing with one other, at most half the time.
//!
//! Both balances carry over between measurements (they arrive in lumps: a 10 ms kernel at
//! once, short kernels a few at a time), up to [`CARRY_NS`], past which the excess of one
//! over the other is the overlap and is dropped.

use std::sync::Mutex;

/// The most either balance carries between measurements.
pub const CARRY_NS: u64 = 100_000_000;

#[derive(Default)]
pub struct Contention {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last_ns: u64,
    tenants: Vec<TenantClock>,
}

#[derive(Default, Clone, Copy)]
struct TenantClock {
    /// Measured calls admitted and not yet measured.
    pending: u64,
    /// Contended time earned and not yet charged (ns).
    earned: u64,
    /// Measured time not yet charged (ns).
    measured: u64,
}

impl State {
    fn advance(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now);
        let busy = self.tenants.iter().filter(|t| t.pending > 0).count() as u64;
        if busy == 0 || dt == 0 {
            return;
        }
        for t in self.tenants.iter_mut().filter(|t| t.pending > 0) {
            t.earned = (t.earned + dt / busy).min(CARRY_NS);
        }
    }

    fn tenant(&mut self, index: usize) -> &mut TenantClock {
        if self.tenants.len() <= index {
            self.tenants.resize(index + 1, TenantClock::default());
        }
        &mut self.tenants[index]
    }
}

impl Contention {
    /// `delta` measured calls of tenant `index` were admitted (positive) or will not be
    /// measured after all (negative), at `now` (monotonic ns).
    pub fn pending(&self, index: usize, delta: i64, now: u64) {
        let mut s = self.state.lock().unwrap();
        s.advance(now);
        let t = s.tenant(index);
        t.pending = t.pending.saturating_add_signed(delta);
    }

    /// `calls` calls of tenant `index` were measured at `amount` in all: returns what to
    /// charge.
    pub fn measured(&self, index: usize, amount: u64, calls: u64, now: u64) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.advance(now);
        let t = s.tenant(index);
        t.pending = t.pending.saturating_sub(calls);
        t.measured = t.measured.saturating_add(amount);
        let charge = t.measured.min(t.earned);
        t.measured = (t.measured - charge).min(CARRY_NS);
        t.earned -= charge;
        if t.pending == 0 {
            // Idle from here on: earned time does not outlive the work that earned it.
            t.earned = 0;
        }
        charge
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn alone_a_tenant_is_charged_what_it_measured() {
        let c = Contention::default();
        c.pending(0, 1, 0);
        assert_eq!(c.measured(0, 10 * MS, 1, 10 * MS), 10 * MS);
    }

    #[test]
    fn sharing_the_gpu_each_is_charged_its_time_slices() {
        let c = Contention::default();
        // Both always have work: the long tenant's 10 ms kernels take 20 ms of wall time.
        c.pending(0, 2, 0);
        c.pending(1, 20, 0);
        let (mut long, mut short) = (0, 0);
        for step in 1..=100u64 {
            let now = step * MS;
            // The short tenant's 0.1 ms kernels: ~5 finish per ms, measured unbroken.
            short += c.measured(1, 500_000, 5, now);
            c.pending(1, 5, now);
            if step % 20 == 0 {
                // The long kernel measured across the other's slices.
                long += c.measured(0, 20 * MS, 1, now);
                c.pending(0, 1, now);
            }
        }
        assert!((45 * MS..=55 * MS).contains(&long), "long charged {long}");
        assert!((45 * MS..=55 * MS).contains(&short), "short charged {short}");
    }

    #[test]
    fn an_idle_tenant_banks_nothing() {
        let c = Contention::default();
        c.pending(0, 1, 0);
        assert_eq!(c.measured(0, MS, 1, MS), MS);
        // Nothing pending for a second, then one short kernel.
        c.pending(0, 1, 1000 * MS);
        assert_eq!(c.measured(0, MS / 10, 1, 1000 * MS + MS / 10), MS / 10);
    }
}
