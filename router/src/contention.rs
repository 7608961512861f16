//! Device time when tenants' work overlaps.
//!
//! The API servers measure a kernel with events around it, which gives GPU wall time. When
//! several processes have work queued, the GPU time-slices between their contexts, and a
//! kernel's events then also span the slices the others ran in: a tenant of long kernels is
//! measured at nearly the whole wall time while it shares the GPU, and would be charged for
//! the other tenants' work. So the router charges a tenant at most the *contended time* it
//! earned while it had work queued (measured calls admitted and not yet measured): a
//! measurement is charged as the smaller of what was measured and the time earned.
//!
//! How the time of a period is earned: the GPU gives contexts with work equal time slices,
//! so each tenant with work queued earns an equal part of it; but a tenant whose queue runs
//! dry within its slice gives the rest of the slice up, and the others run in it. The
//! router sees that as credit the tenant earns and does not use, and passes it on
//! (water-filling):
//!
//! - a tenant holding more credit than its queued work can use (its calls pending times its
//!   mean charge, plus [`MARGIN_NS`] for the slices it waits through) earns nothing more
//!   while others with work queued can still use theirs: the period is split among them;
//! - a tenant whose queue empties gives the credit it has left, up to what it earned while
//!   others had work too, to the tenants that still have work queued.
//!
//! Running alone, a tenant is charged what it measured, however long its kernels; sharing with one other whose work
//! fills its slices, at most half the time; sharing with one whose queue runs dry, the time
//! the other did not use. Time no tenant's measurement accounts for (context switches)
//! falls to the tenants whose kernels it interrupted.
//!
//! Both balances carry over between measurements (they arrive in lumps: a 10 ms kernel at
//! once, short kernels a few at a time), up to [`CARRY_NS`], past which the excess of one
//! over the other is the overlap and is dropped.
//!
//! `PHOS_CONTENTION=equal` in the router's environment splits every period equally among
//! the tenants with work queued and passes no credit on (the accounting before
//! water-filling), for comparisons.

use parking_lot::Mutex;

/// The most either balance carries between measurements.
pub const CARRY_NS: u64 = 100_000_000;

/// Credit a tenant may hold beyond its queued work before it stops earning: room for the
/// time slices of others it waits through with work queued.
pub const MARGIN_NS: u64 = 2_000_000;

/// How a period of contended time is split among the tenants with work queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Equal parts, capped by what each can use; unused credit goes to the others.
    Fill,
    /// Equal parts, whatever each uses.
    Equal,
}

impl Split {
    /// `PHOS_CONTENTION` (`equal` or `fill`, the default).
    pub fn from_env() -> Split {
        match std::env::var("PHOS_CONTENTION").as_deref() {
            Ok("equal") => {
                tracing::info!("PHOS_CONTENTION=equal: overlapping device time is split equally");
                Split::Equal
            }
            Ok("fill") | Err(_) => Split::Fill,
            Ok(other) => {
                tracing::warn!("PHOS_CONTENTION={other:?} is neither `fill` nor `equal`: using `fill`");
                Split::Fill
            }
        }
    }
}

pub struct Contention {
    split: Split,
    state: Mutex<State>,
}

impl Default for Contention {
    fn default() -> Self {
        Contention::new(Split::from_env())
    }
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
    /// Of `earned`, what was earned while other tenants had work queued too.
    beside: u64,
    /// Measured time not yet charged (ns).
    measured: u64,
    /// Charged so far, and calls measured: the mean charge per call.
    charged: u64,
    calls: u64,
}

impl TenantClock {
    /// The credit this tenant's queued work can use.
    fn usable(&self) -> u64 {
        match self.charged.checked_div(self.calls) {
            Some(mean) => self.pending.saturating_mul(mean).saturating_add(MARGIN_NS).min(CARRY_NS),
            // Nothing measured yet: no idea what its work takes.
            None => CARRY_NS,
        }
    }
}

impl State {
    fn advance(&mut self, now: u64, split: Split) {
        let dt = now.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now);
        let busy = self.tenants.iter().filter(|t| t.pending > 0).count() as u64;
        if busy == 0 || dt == 0 {
            return;
        }
        // Who takes a part: the busy tenants that can still use credit, or all busy ones.
        let hungry = |t: &TenantClock| t.pending > 0 && (split == Split::Equal || t.earned < t.usable());
        let takers = match self.tenants.iter().filter(|t| hungry(t)).count() as u64 {
            0 => busy,
            n => n,
        };
        let all = takers == busy;
        for t in self.tenants.iter_mut().filter(|t| t.pending > 0) {
            if busy == 1 {
                // Alone, all of the period is its own, however long its kernel: the cap on
                // balances is there to drop overlap, and there is none.
                t.earned = t.earned.saturating_add(dt);
            } else if all || split == Split::Equal || t.earned < t.usable() {
                t.earned = (t.earned + dt / takers).min(CARRY_NS);
                t.beside = (t.beside + dt / takers).min(CARRY_NS);
            }
        }
    }

    fn tenant(&mut self, index: usize) -> &mut TenantClock {
        if self.tenants.len() <= index {
            self.tenants.resize(index + 1, TenantClock::default());
        }
        &mut self.tenants[index]
    }

    /// Tenant `index` has nothing queued any more: its credit does not outlive the work that
    /// earned it; what it earned beside others and left unused, they ran in.
    fn went_idle(&mut self, index: usize, split: Split) {
        let t = &mut self.tenants[index];
        let give = t.earned.min(t.beside);
        t.earned = 0;
        t.beside = 0;
        if split == Split::Equal || give == 0 {
            return;
        }
        let busy = self.tenants.iter().filter(|t| t.pending > 0).count() as u64;
        if busy == 0 {
            return;
        }
        for t in self.tenants.iter_mut().filter(|t| t.pending > 0) {
            t.earned = (t.earned + give / busy).min(CARRY_NS);
        }
    }
}

impl Contention {
    pub fn new(split: Split) -> Self {
        Contention { split, state: Mutex::new(State::default()) }
    }

    pub fn split(&self) -> Split {
        self.split
    }

    /// `delta` measured calls of tenant `index` were admitted (positive) or will not be
    /// measured after all (negative), at `now` (monotonic ns).
    pub fn pending(&self, index: usize, delta: i64, now: u64) {
        let mut s = self.state.lock();
        s.advance(now, self.split);
        let t = s.tenant(index);
        let was = t.pending;
        t.pending = t.pending.saturating_add_signed(delta);
        if was > 0 && t.pending == 0 {
            s.went_idle(index, self.split);
        }
    }

    /// `calls` calls of tenant `index` were measured at `amount` in all: returns what to
    /// charge.
    pub fn measured(&self, index: usize, amount: u64, calls: u64, now: u64) -> u64 {
        let mut s = self.state.lock();
        s.advance(now, self.split);
        let t = s.tenant(index);
        t.pending = t.pending.saturating_sub(calls);
        t.measured = t.measured.saturating_add(amount);
        let charge = t.measured.min(t.earned);
        t.measured = (t.measured - charge).min(CARRY_NS);
        t.earned -= charge;
        t.beside = t.beside.min(t.earned);
        t.charged = t.charged.saturating_add(charge);
        t.calls = t.calls.saturating_add(calls);
        if t.pending == 0 {
            s.went_idle(index, self.split);
        }
        charge
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    #[test]
    fn alone_a_tenant_is_charged_what_it_measured() {
        for split in [Split::Fill, Split::Equal] {
            let c = Contention::new(split);
            c.pending(0, 1, 0);
            assert_eq!(c.measured(0, 10 * MS, 1, 10 * MS), 10 * MS);
        }
    }

    #[test]
    fn alone_a_kernel_longer_than_the_carry_is_charged_in_full() {
        for split in [Split::Fill, Split::Equal] {
            let c = Contention::new(split);
            c.pending(0, 2, 0);
            assert_eq!(c.measured(0, 3 * CARRY_NS, 1, 3 * CARRY_NS), 3 * CARRY_NS, "{split:?}");
            assert_eq!(c.measured(0, 2 * CARRY_NS, 1, 5 * CARRY_NS), 2 * CARRY_NS, "{split:?}");
        }
    }

    #[test]
    fn sharing_the_gpu_each_is_charged_its_time_slices() {
        for split in [Split::Fill, Split::Equal] {
            let c = Contention::new(split);
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
            assert!((45 * MS..=55 * MS).contains(&long), "{split:?}: long charged {long}");
            assert!((45 * MS..=55 * MS).contains(&short), "{split:?}: short charged {short}");
        }
    }

    #[test]
    fn an_idle_tenant_banks_nothing() {
        for split in [Split::Fill, Split::Equal] {
            let c = Contention::new(split);
            c.pending(0, 1, 0);
            assert_eq!(c.measured(0, MS, 1, MS), MS);
            // Nothing pending for a second, then one short kernel.
            c.pending(0, 1, 1000 * MS);
            assert_eq!(c.measured(0, MS / 10, 1, 1000 * MS + MS / 10), MS / 10);
        }
    }

    /// A time-sliced GPU: the long tenant always has a 10 ms kernel queued; the short tenant
    /// has 0.1 ms kernels queued all along but runs only `short_slice` of each cycle before
    /// its queue runs dry and the GPU goes back to the long one for `long_slice`. Returns
    /// (charged / run) for the long and the short tenant over `secs` seconds.
    fn sliced(split: Split, long_slice: u64, short_slice: u64, secs: u64) -> (f64, f64) {
        let c = Contention::new(split);
        let (short_k, long_k) = (100 * US, 10 * MS);
        let mut now = 0;
        c.pending(0, 2, 0);
        c.pending(1, 20, 0);
        let (mut ran, mut charged) = ([0u64; 2], [0u64; 2]);
        let (mut long_left, mut long_start) = (long_k, 0);
        while now < secs * 1000 * MS {
            let mut t = 0;
            while t < long_slice {
                let step = (long_slice - t).min(long_left);
                now += step;
                t += step;
                long_left -= step;
                ran[0] += step;
                if long_left == 0 {
                    charged[0] += c.measured(0, now - long_start, 1, now);
                    c.pending(0, 1, now);
                    (long_left, long_start) = (long_k, now);
                }
            }
            let mut t = 0;
            while t < short_slice {
                now += short_k;
                t += short_k;
                ran[1] += short_k;
                charged[1] += c.measured(1, short_k, 1, now);
                c.pending(1, 1, now);
            }
        }
        (charged[0] as f64 / ran[0] as f64, charged[1] as f64 / ran[1] as f64)
    }

    #[test]
    fn time_a_tenant_leaves_unused_is_charged_to_the_one_that_ran() {
        // Equal slices: both charged what they ran, however the time is split.
        for split in [Split::Fill, Split::Equal] {
            let (long, short) = sliced(split, 2 * MS, 2 * MS, 5);
            assert!((0.99..=1.01).contains(&long) && (0.99..=1.01).contains(&short), "{split:?}: {long} {short}");
        }
        // The short tenant's queue runs dry after 1 ms of each 3 ms slice it waited through:
        // the long one ran three quarters of the time.
        let (long, short) = sliced(Split::Fill, 3 * MS, MS, 5);
        assert!((0.98..=1.01).contains(&long), "long charged {long} of what it ran");
        assert!((0.99..=1.01).contains(&short), "short charged {short} of what it ran");
        // Split equally, the long tenant would be charged two thirds of the time: 0.89 of it.
        let (long, _) = sliced(Split::Equal, 3 * MS, MS, 5);
        assert!(long < 0.9, "equal split charged the long tenant {long} of what it ran");
    }

    #[test]
    fn credit_left_by_a_tenant_whose_queue_empties_goes_to_those_still_busy() {
        // Both queue work; the short tenant's 2 ms runs, then its queue is empty, while the
        // long tenant's kernel runs on alone: over 10 ms the long one ran 8.
        let long_charged = |split| {
            let c = Contention::new(split);
            c.pending(0, 1, 0);
            c.pending(1, 20, 0);
            for i in 1..=20 {
                c.measured(1, 100 * US, 1, 9 * MS * i / 20);
            }
            c.measured(0, 10 * MS, 1, 10 * MS)
        };
        let long = long_charged(Split::Fill);
        assert!((7_900 * US..=8_100 * US).contains(&long), "long charged {long}");
        // Equally split, the long tenant would be charged 5.5 ms.
        let long = long_charged(Split::Equal);
        assert!(long < 6 * MS, "{long}");
    }

    #[test]
    fn credit_earned_alone_is_not_passed_on() {
        let c = Contention::new(Split::Fill);
        // The short tenant has work queued alone for 5 ms (in flight to the GPU, or the GPU
        // idle) and uses 1 ms of it.
        c.pending(1, 11, 0);
        for i in 1..=10 {
            c.measured(1, 100 * US, 1, 500 * US * i);
        }
        // The long tenant queues a kernel; the short one's last kernel ends at once.
        c.pending(0, 1, 5 * MS);
        c.measured(1, 100 * US, 1, 5_100 * US);
        // Measured across someone else's work too, the long kernel is charged the time it
        // had: the 4 ms the short tenant left unused before it came are not its.
        let long = c.measured(0, 20 * MS, 1, 15 * MS);
        assert!((9_900 * US..=10_100 * US).contains(&long), "long charged {long}");
    }
}
