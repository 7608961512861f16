//! The policy chain the router consults before forwarding a call.
//!
//! Policies run in the order they were loaded; the first one that does not admit the call
//! decides (so a delayed call is not charged by the policies after it, and is asked again
//! later). Loading a policy under a name already in use replaces that policy in place: the
//! swap is atomic for the calls being decided. A policy that faults (a bad memory access,
//! an instruction budget overrun, an invalid verdict) is unloaded at once, with a log line,
//! and the call goes on as the remaining policies (or, with none, the default: admit)
//! decide.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};
use phos_protocol::apis;

use crate::runtime::{Fault, LoadError, MapInfo, Program};

/// Instructions one policy may execute per call before it counts as running too long.
pub const DEFAULT_BUDGET: u64 = 100_000;
/// The longest a single delay verdict holds a call before it is asked again.
pub const MAX_DELAY: Duration = Duration::from_millis(100);
/// Room for the resource arrays of the context.
const MAX_RESOURCES: usize = 16;
/// `reserved` (the kernel keeps a tracepoint context's first word from programs) and the
/// seven fields after it.
const HEADER_FIELDS: usize = 8;
/// The per-resource arrays: amount, used, quota, pending, queued, drained_ns.
const RESOURCE_ARRAYS: usize = 6;
/// Fields after the arrays (`awaited`).
const TRAILER_FIELDS: usize = 1;
/// Per-resource arrays after the trailer (`others_queued`: added after `awaited`, so the
/// offsets of the fields before it stay what policies built earlier read).
const LATER_ARRAYS: usize = 1;
const CONTEXT_BYTES: usize =
    8 * (HEADER_FIELDS + RESOURCE_ARRAYS * MAX_RESOURCES + TRAILER_FIELDS + LATER_ARRAYS * MAX_RESOURCES);

/// What a policy decided about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Ask again after this long (at most [`MAX_DELAY`]).
    Delay(Duration),
    /// Fail the call with this CUDA error.
    Reject(i32),
}

impl Verdict {
    /// Decode a policy's return value (`PHOS_ADMIT`, `PHOS_DELAY(ns)`, `PHOS_REJECT(err)`).
    pub fn decode(r0: u64) -> Option<Verdict> {
        match r0 >> 62 {
            0 if r0 == 0 => Some(Verdict::Admit),
            1 => Some(Verdict::Delay(Duration::from_nanos(r0 & ((1 << 62) - 1)).min(MAX_DELAY))),
            2 if (r0 >> 32) & ((1 << 30) - 1) == 0 && r0 as u32 != 0 => Some(Verdict::Reject(r0 as u32 as i32)),
            _ => None,
        }
    }
}

/// The `struct phos_call` a policy reads (`include/phos_policy.h`).
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    pub tenant: u64,
    pub session: u64,
    pub function: u64,
    pub now_ns: u64,
    pub share: u64,
    pub active_tenants: u64,
    pub active_shares: u64,
    /// Per resource (`apis::RESOURCES` order): what this call uses; for a measured
    /// resource, an estimate (the tenant's mean per call so far).
    pub amount: [u64; MAX_RESOURCES],
    /// Per resource: what the tenant has used (held, total, or measured plus estimate).
    pub used: [u64; MAX_RESOURCES],
    /// Per resource: the tenant's quota (0: none).
    pub quota: [u64; MAX_RESOURCES],
    /// Per measured resource: the part of `used` that is an estimate for calls admitted and
    /// not measured yet.
    pub pending: [u64; MAX_RESOURCES],
    /// Per measured resource: calls admitted and not measured yet (kernels queued or
    /// running).
    pub queued: [u64; MAX_RESOURCES],
    /// Per measured resource: when `queued` last fell to 0 (monotonic ns; 0: never).
    pub drained_ns: [u64; MAX_RESOURCES],
    /// 1 when, while this call was held back, a thread of the guest waited at a barrier for
    /// calls of its other threads (maybe this one).
    pub awaited: u64,
    /// Per measured resource: the other tenants' calls admitted and not measured yet (their
    /// kernels queued or running; 0: the device is free of their work).
    pub others_queued: [u64; MAX_RESOURCES],
}

/// Where `now_ns` lies in the context's bytes (the fifth word of the header below).
const NOW_NS_OFFSET: usize = 4 * 8;

impl CallContext {
    /// The context's bytes, as the C struct lays them out.
    fn encode(&self, out: &mut [u8; CONTEXT_BYTES]) -> usize {
        let n = apis::RESOURCES.len().min(MAX_RESOURCES);
        let header = [
            0,
            self.tenant,
            self.session,
            self.function,
            self.now_ns,
            self.share,
            self.active_tenants,
            self.active_shares,
        ];
        let words = header
            .iter()
            .chain(&self.amount[..n])
            .chain(&self.used[..n])
            .chain(&self.quota[..n])
            .chain(&self.pending[..n])
            .chain(&self.queued[..n])
            .chain(&self.drained_ns[..n])
            .chain(std::iter::once(&self.awaited))
            .chain(&self.others_queued[..n]);
        let mut len = 0;
        for (i, w) in words.enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
            len = i * 8 + 8;
        }
        len
    }
}

/// The clock of `now_ns` and of `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, into `ts` on this stack.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("the policy was built against other API specs ({found:016x}, this router {expected:016x}); rebuild it")]
    OtherSpec { found: u64, expected: u64 },
    #[error("parameter `{name}`: {why}")]
    Param { name: String, why: String },
    #[error("no policy named `{0}`")]
    NotFound(String),
    #[error("not an eBPF object: {0}")]
    NotAnObject(String),
    #[error(transparent)]
    Kernel(#[from] crate::kernel::KernelError),
    #[error("the load was abandoned: its client gave up before it took effect")]
    Abandoned,
}

/// Whether the kernel's verifier checks a policy before it is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelCheck {
    /// Where this process may load eBPF programs, else not.
    Auto,
    /// Refuse the policy unless the kernel accepted it.
    Require,
    Skip,
}

/// Counters of one loaded policy.
#[derive(Debug, Default)]
struct Stats {
    runs: AtomicU64,
    admitted: AtomicU64,
    delayed: AtomicU64,
    rejected: AtomicU64,
    run_ns: AtomicU64,
}

/// A policy in the chain.
struct Loaded {
    name: String,
    source: String,
    program: Mutex<Program>,
    /// The latest `now_ns` the program has seen (read and written under `program`'s lock):
    /// calls of several threads reach it in another order than their clocks were read, and
    /// a program must never see time go backwards.
    clock_floor: AtomicU64,
    instructions: usize,
    loaded_unix_s: u64,
    kernel_verified: bool,
    stats: Stats,
}

/// What `phosctl policy list` shows of a policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyInfo {
    pub name: String,
    /// Where it came from (a file, `builtin:NAME`).
    pub source: String,
    pub program: String,
    pub instructions: usize,
    pub loaded_unix_s: u64,
    /// The kernel's verifier accepted it too.
    pub kernel_verified: bool,
    pub runs: u64,
    pub admitted: u64,
    pub delayed: u64,
    pub rejected: u64,
    /// Mean time of one run, in nanoseconds.
    pub mean_run_ns: u64,
}

/// The loaded policies, in order.
pub struct PolicySet {
    chain: RwLock<Vec<Arc<Loaded>>>,
    /// `chain.len()`, readable without the lock: with no policy, calls skip all of this.
    len: AtomicUsize,
    budget: u64,
}

impl Default for PolicySet {
    fn default() -> Self {
        Self::new(DEFAULT_BUDGET)
    }
}

impl PolicySet {
    pub fn new(budget: u64) -> Self {
        PolicySet { chain: RwLock::new(Vec::new()), len: AtomicUsize::new(0), budget }
    }

    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Load (or, under a name in use, replace) a policy. `params` set its `PHOS_PARAM`s.
    /// `cancelled` says whether the load's client has given up: the kernel's verification
    /// is interrupted then, and a load given up never takes effect.
    pub fn load(
        &self,
        name: &str,
        source: &str,
        elf: &[u8],
        params: &[(String, i128)],
        kernel: KernelCheck,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<PolicyInfo, PolicyError> {
        let globals = encode_params(elf, params)?;
        let borrowed: Vec<(&str, Vec<u8>)> = globals.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        let program = Program::load(elf, &borrowed)?;
        if let Some(found) = program.spec_hash()
            && found != apis::POLICY_HASH
        {
            return Err(PolicyError::OtherSpec { found, expected: apis::POLICY_HASH });
        }
        let kernel_verified = match kernel {
            KernelCheck::Skip => false,
            KernelCheck::Auto if !crate::kernel::available() => false,
            KernelCheck::Auto | KernelCheck::Require => {
                if kernel == KernelCheck::Require && !crate::kernel::available() {
                    return Err(crate::kernel::KernelError::NotPermitted.into());
                }
                crate::kernel::verify(elf, &globals, cancelled)?;
                true
            }
        };
        if cancelled() {
            return Err(PolicyError::Abandoned);
        }
        let loaded = Arc::new(Loaded {
            name: name.to_string(),
            source: source.to_string(),
            instructions: program.instructions(),
            program: Mutex::new(program),
            clock_floor: AtomicU64::new(0),
            loaded_unix_s: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            kernel_verified,
            stats: Stats::default(),
        });
        let info = loaded.info();
        let mut chain = self.chain.write();
        match chain.iter().position(|p| p.name == name) {
            Some(i) => chain[i] = loaded,
            None => chain.push(loaded),
        }
        self.len.store(chain.len(), Ordering::Relaxed);
        tracing::info!(policy = name, source, kernel_verified, "policy loaded ({} instructions)", info.instructions);
        Ok(info)
    }

    pub fn unload(&self, name: &str) -> Result<(), PolicyError> {
        let mut chain = self.chain.write();
        let before = chain.len();
        chain.retain(|p| p.name != name);
        self.len.store(chain.len(), Ordering::Relaxed);
        if chain.len() == before {
            return Err(PolicyError::NotFound(name.to_string()));
        }
        tracing::info!(policy = name, "policy unloaded");
        Ok(())
    }

    pub fn list(&self) -> Vec<PolicyInfo> {
        self.chain.read().iter().map(|p| p.info()).collect()
    }

    /// A policy's description, disassembly and maps.
    pub fn show(&self, name: &str) -> Result<(PolicyInfo, Vec<String>, Vec<MapInfo>), PolicyError> {
        let chain = self.chain.read();
        let p = chain.iter().find(|p| p.name == name).ok_or_else(|| PolicyError::NotFound(name.to_string()))?;
        // `info` takes the program's lock itself: ask it first.
        let info = p.info();
        let program = p.program.lock();
        Ok((info, program.disassemble(), program.maps()))
    }

    /// The value at `key` in map `map` of policy `name` (`None`: no such entry).
    pub fn map_lookup(&self, name: &str, map: &str, key: &[u8]) -> Result<Option<Vec<u8>>, PolicyError> {
        let chain = self.chain.read();
        let p = chain.iter().find(|p| p.name == name).ok_or_else(|| PolicyError::NotFound(name.to_string()))?;
        let program = p.program.lock();
        Ok(program.map_lookup(map, key))
    }

    /// Ask the chain about one call.
    pub fn decide(&self, ctx: &CallContext) -> Verdict {
        if self.is_empty() {
            return Verdict::Admit;
        }
        let mut bytes = [0u8; CONTEXT_BYTES];
        let len = ctx.encode(&mut bytes);
        let mut faulted = Vec::new();
        let mut verdict = Verdict::Admit;
        {
            let chain = self.chain.read();
            for p in chain.iter() {
                let started = Instant::now();
                let r = {
                    let mut program = p.program.lock();
                    let now = ctx.now_ns.max(p.clock_floor.load(Ordering::Relaxed));
                    p.clock_floor.store(now, Ordering::Relaxed);
                    bytes[NOW_NS_OFFSET..NOW_NS_OFFSET + 8].copy_from_slice(&now.to_le_bytes());
                    program.run(&bytes[..len], self.budget)
                };
                p.stats.run_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                p.stats.runs.fetch_add(1, Ordering::Relaxed);
                let v = match r {
                    Ok(r0) => match Verdict::decode(r0) {
                        Some(v) => v,
                        None => {
                            faulted.push((p.name.clone(), format!("invalid verdict {r0:#x}")));
                            continue;
                        }
                    },
                    Err(fault) => {
                        faulted.push((p.name.clone(), fault_text(&fault)));
                        continue;
                    }
                };
                match v {
                    Verdict::Admit => {
                        p.stats.admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Verdict::Delay(_) => {
                        p.stats.delayed.fetch_add(1, Ordering::Relaxed);
                        verdict = v;
                        break;
                    }
                    Verdict::Reject(_) => {
                        p.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        verdict = v;
                        break;
                    }
                }
            }
        }
        for (name, why) in faulted {
            tracing::error!(policy = %name, "policy faulted and is unloaded ({why}); its calls are admitted by the rest of the chain");
            let _ = self.unload(&name);
        }
        verdict
    }
}

fn fault_text(f: &Fault) -> String {
    f.to_string()
}

impl Loaded {
    fn info(&self) -> PolicyInfo {
        let runs = self.stats.runs.load(Ordering::Relaxed);
        PolicyInfo {
            name: self.name.clone(),
            source: self.source.clone(),
            program: self.program.lock().name().to_string(),
            instructions: self.instructions,
            loaded_unix_s: self.loaded_unix_s,
            kernel_verified: self.kernel_verified,
            runs,
            admitted: self.stats.admitted.load(Ordering::Relaxed),
            delayed: self.stats.delayed.load(Ordering::Relaxed),
            rejected: self.stats.rejected.load(Ordering::Relaxed),
            mean_run_ns: self.stats.run_ns.load(Ordering::Relaxed).checked_div(runs).unwrap_or(0),
        }
    }
}

/// Integer parameters as the bytes of the globals they set: the width is the symbol's.
pub fn encode_params(elf: &[u8], params: &[(String, i128)]) -> Result<Vec<(String, Vec<u8>)>, PolicyError> {
    use object::{Object, ObjectSymbol};
    if params.is_empty() {
        return Ok(Vec::new());
    }
    let file = object::File::parse(elf).map_err(|e| PolicyError::NotAnObject(e.to_string()))?;
    let mut out = Vec::new();
    for (name, value) in params {
        let param_err = |why: String| PolicyError::Param { name: name.clone(), why };
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok(name.as_str()))
            .ok_or_else(|| param_err("the policy has no such parameter".into()))?;
        let width = sym.size() as usize;
        let bytes = value.to_le_bytes();
        let fits = match width {
            1 | 2 | 4 | 8 => {
                let bits = width * 8;
                *value >= -(1i128 << (bits - 1)) && *value < (1i128 << bits)
            }
            _ => return Err(param_err(format!("a parameter of {width} bytes is not an integer"))),
        };
        if !fits {
            return Err(param_err(format!("{value} does not fit in {width} bytes")));
        }
        out.push((name.clone(), bytes[..width].to_vec()));
    }
    Ok(out)
}

/// A parameter setting that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("`{0}`: expected NAME=VALUE")]
    NotASetting(String),
    #[error("`{0}` is not a number")]
    NotANumber(String),
}

/// Parse `name=value` (decimal, `0x` hex, or with a K/M/G/Ki/Mi/Gi suffix, or `ms`/`us`/`s`
/// for nanoseconds).
pub fn parse_param(s: &str) -> Result<(String, i128), SettingError> {
    let (name, value) = s.split_once('=').ok_or_else(|| SettingError::NotASetting(s.to_string()))?;
    let value = parse_amount(value.trim()).ok_or_else(|| SettingError::NotANumber(value.to_string()))?;
    Ok((name.trim().to_string(), value))
}

/// An integer with an optional unit suffix.
pub fn parse_amount(v: &str) -> Option<i128> {
    let v = v.replace('_', "");
    if let Some(hex) = v.strip_prefix("0x") {
        return i128::from_str_radix(hex, 16).ok();
    }
    let units: [(&str, i128); 12] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
        ("G", 1_000_000_000),
        ("M", 1_000_000),
        ("K", 1_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = v.strip_suffix(suffix) {
            return n.trim().parse::<i128>().ok().and_then(|n| n.checked_mul(mult));
        }
    }
    if let Some(n) = v.strip_suffix('s') {
        return n.trim().parse::<i128>().ok().and_then(|n| n.checked_mul(1_000_000_000));
    }
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call of every tenant asks the chain: a thread that panics holding its lock must
    /// not make the later ones panic.
    #[test]
    fn a_panic_under_the_chains_lock_leaves_it_usable() {
        let set = Arc::new(PolicySet::default());
        let held = set.clone();
        let panicked = std::thread::spawn(move || {
            let _chain = held.chain.write();
            panic!("a bug under the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(set.list().is_empty());
        assert!(matches!(set.unload("none"), Err(PolicyError::NotFound(_))));
    }

    #[test]
    fn verdicts_decode() {
        assert_eq!(Verdict::decode(0), Some(Verdict::Admit));
        assert_eq!(Verdict::decode((1 << 62) | 5000), Some(Verdict::Delay(Duration::from_nanos(5000))));
        assert_eq!(Verdict::decode((1 << 62) | (u32::MAX as u64 * 1000)), Some(Verdict::Delay(MAX_DELAY)));
        assert_eq!(Verdict::decode((2 << 62) | 2), Some(Verdict::Reject(2)));
        // Not a verdict: an admit with bits set, a reject of success, the fourth kind.
        assert_eq!(Verdict::decode(7), None);
        assert_eq!(Verdict::decode(2 << 62), None);
        assert_eq!(Verdict::decode(3 << 62), None);
        assert_eq!(Verdict::decode((2 << 62) | (1 << 40) | 2), None);
    }

    #[test]
    fn amounts_parse() {
        assert_eq!(parse_amount("8GiB"), Some(8 << 30));
        assert_eq!(parse_amount("1_000"), Some(1000));
        assert_eq!(parse_amount("2ms"), Some(2_000_000));
        assert_eq!(parse_amount("3s"), Some(3_000_000_000));
        assert_eq!(parse_amount("0x10"), Some(16));
        assert_eq!(parse_amount("5K"), Some(5000));
        assert_eq!(parse_amount("x"), None);
        assert_eq!(parse_param("rate=100").unwrap(), ("rate".to_string(), 100));
        assert_eq!(parse_param("rate"), Err(SettingError::NotASetting("rate".into())));
        assert_eq!(parse_param("rate=fast"), Err(SettingError::NotANumber("fast".into())));
    }

    #[test]
    fn context_layout_matches_the_header() {
        let mut ctx = CallContext { tenant: 1, now_ns: 9, ..Default::default() };
        ctx.amount[0] = 7;
        ctx.used[0] = 11;
        ctx.quota[0] = 13;
        ctx.pending[0] = 17;
        ctx.queued[0] = 19;
        ctx.drained_ns[0] = 23;
        ctx.awaited = 1;
        ctx.others_queued[0] = 29;
        let mut b = [0u8; CONTEXT_BYTES];
        let len = ctx.encode(&mut b);
        let n = apis::RESOURCES.len();
        assert_eq!(len, 8 * (HEADER_FIELDS + RESOURCE_ARRAYS * n + TRAILER_FIELDS + LATER_ARRAYS * n));
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let h = HEADER_FIELDS;
        assert_eq!((word(0), word(1), word(4), word(h), word(h + n), word(h + 2 * n)), (0, 1, 9, 7, 11, 13));
        assert_eq!(word(NOW_NS_OFFSET / 8), 9);
        assert_eq!((word(h + 3 * n), word(h + 4 * n), word(h + 5 * n), word(h + 6 * n)), (17, 19, 23, 1));
        assert_eq!(word(h + 6 * n + 1), 29);
    }
}
