//! Rate limits for log lines a guest can trigger.
//!
//! A guest that makes 100 000 bad calls must not write 100 000 warnings into the router's or
//! its server's log (disk, and the operator's attention, are shared by every tenant). Each
//! key (a tenant, a session) gets a token bucket: a burst of lines, then a steady rate; the
//! lines dropped meanwhile are counted and reported with the next line let through.
//!
//! The caller logs; this module only decides:
//!
//! ```
//! use phos_protocol::log_limit::LogLimit;
//! let limit = LogLimit::new(20, 5);
//! if let Some(dropped) = limit.admit("alice") {
//!     // log the line, adding "(and N similar lines dropped)" when dropped > 0
//!     let _ = dropped;
//! }
//! ```

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// Keys kept at most; past this the oldest buckets are forgotten (a forgotten key starts
/// again with a full burst, which only lets a few more lines through).
const MAX_KEYS: usize = 4096;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    dropped: u64,
}

/// Token buckets of log lines, one per key.
#[derive(Debug)]
pub struct LogLimit {
    burst: f64,
    per_sec: f64,
    buckets: Mutex<BTreeMap<String, Bucket>>,
}

impl LogLimit {
    /// `burst` lines at once, then `per_sec` lines a second, per key.
    pub const fn new(burst: u32, per_sec: u32) -> Self {
        LogLimit { burst: burst as f64, per_sec: per_sec as f64, buckets: Mutex::new(BTreeMap::new()) }
    }

    /// Whether a line for `key` may be logged now; `Some(n)`: yes, and `n` lines for this
    /// key were dropped since the last one let through.
    pub fn admit(&self, key: &str) -> Option<u64> {
        let now = Instant::now();
        // A panic elsewhere while the lock was held leaves counters only: keep using them.
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(key) && buckets.len() >= MAX_KEYS {
            let oldest = buckets.iter().min_by_key(|(_, b)| b.last).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                buckets.remove(&k);
            }
        }
        let b = buckets.entry(key.to_owned()).or_insert(Bucket { tokens: self.burst, last: now, dropped: 0 });
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * self.per_sec).min(self.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Some(std::mem::take(&mut b.dropped))
        } else {
            b.dropped += 1;
            None
        }
    }
}

/// The limit for guest-triggered lines in the router and the API servers: 20 lines at once,
/// then 5 a second, per tenant (router) or per session (server).
pub static GUEST_LINES: LogLimit = LogLimit::new(20, 5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_counted_drops_per_key() {
        let limit = LogLimit::new(3, 1);
        assert_eq!(limit.admit("a"), Some(0));
        assert_eq!(limit.admit("a"), Some(0));
        assert_eq!(limit.admit("a"), Some(0));
        for _ in 0..100 {
            assert_eq!(limit.admit("a"), None);
        }
        // Another key has its own bucket.
        assert_eq!(limit.admit("b"), Some(0));
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert_eq!(limit.admit("a"), Some(100), "the next line says how many were dropped");
        assert_eq!(limit.admit("a"), None);
    }

    #[test]
    fn keys_are_bounded() {
        let limit = LogLimit::new(1, 1);
        for i in 0..(MAX_KEYS + 10) {
            assert_eq!(limit.admit(&i.to_string()), Some(0));
        }
        assert!(limit.buckets.lock().unwrap().len() <= MAX_KEYS);
    }
}
