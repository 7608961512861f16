//! The helpers a program may call, with the kernel's ids and semantics. Every pointer a
//! program passes is a VM address and is translated and bounds-checked like a load.

use super::Fault;
use super::mem::{self, Mem};

pub(crate) const MAP_LOOKUP_ELEM: i32 = 1;
pub(crate) const MAP_UPDATE_ELEM: i32 = 2;
pub(crate) const MAP_DELETE_ELEM: i32 = 3;
pub(crate) const KTIME_GET_NS: i32 = 5;
pub(crate) const TRACE_PRINTK: i32 = 6;
pub(crate) const GET_PRANDOM_U32: i32 = 7;
pub(crate) const GET_SMP_PROCESSOR_ID: i32 = 8;

/// Longest format string trace_printk accepts, and longest line it writes.
const MAX_FMT: u64 = 1024;
const MAX_LINE: usize = 1024;
/// Longest string a `%s` copies.
const MAX_STR: usize = 256;

/// What helpers can reach besides the registers.
pub(crate) struct Env<'a> {
    pub mem: Mem<'a>,
    pub rng: &'a mut u64,
    /// Reused buffer for keys and values: they are copied out of VM memory first because
    /// they may point into the very map being changed.
    pub scratch: &'a mut Vec<u8>,
    pub name: &'a str,
}

fn errno(e: i32) -> u64 {
    (-i64::from(e)) as u64
}

/// Calls helper `id` (checked at load to be one of ours) with r1..r5.
pub(crate) fn call(id: i64, r: &[u64; 16], env: &mut Env<'_>, pc: usize) -> Result<u64, Fault> {
    let fault = |why: String| Fault::Helper { pc, id: id as u32, why };
    let map_arg = |env: &Env<'_>| {
        mem::handle_to_map(r[1])
            .filter(|&m| m < env.mem.maps.len())
            .ok_or_else(|| fault(format!("r1 ({:#x}) is not a map", r[1])))
    };
    // Copies `len` bytes at `addr` into the scratch buffer (after what is there).
    let copy_in = |env: &mut Env<'_>, what: &str, addr: u64, len: usize| match env.mem.read(addr, len) {
        Some(bytes) => {
            env.scratch.extend_from_slice(bytes);
            Ok(())
        }
        None => Err(fault(format!(
            "the {what} pointer {addr:#x} ({len} bytes) is outside memory: {}",
            env.mem.describe(addr)
        ))),
    };
    match i32::try_from(id).unwrap_or(-1) {
        MAP_LOOKUP_ELEM => {
            let m = map_arg(env)?;
            let ks = env.mem.maps[m].key_size as usize;
            env.scratch.clear();
            copy_in(env, "key", r[2], ks)?;
            Ok(match env.mem.maps[m].find(&env.scratch[..], true) {
                Some(off) => mem::map_base(m) + off as u64,
                None => 0,
            })
        }
        MAP_UPDATE_ELEM => {
            let m = map_arg(env)?;
            let (ks, vs) = (env.mem.maps[m].key_size as usize, env.mem.maps[m].value_size as usize);
            env.scratch.clear();
            copy_in(env, "key", r[2], ks)?;
            copy_in(env, "value", r[3], vs)?;
            let (key, value) = env.scratch.split_at(ks);
            Ok(match env.mem.maps[m].update(key, value, r[4]) {
                Ok(()) => 0,
                Err(e) => errno(e),
            })
        }
        MAP_DELETE_ELEM => {
            let m = map_arg(env)?;
            let ks = env.mem.maps[m].key_size as usize;
            env.scratch.clear();
            copy_in(env, "key", r[2], ks)?;
            Ok(match env.mem.maps[m].delete(&env.scratch[..]) {
                Ok(()) => 0,
                Err(e) => errno(e),
            })
        }
        KTIME_GET_NS => Ok(monotonic_ns()),
        TRACE_PRINTK => {
            if r[2] == 0 || r[2] > MAX_FMT {
                return Ok(errno(libc::EINVAL));
            }
            env.scratch.clear();
            copy_in(env, "format", r[1], r[2] as usize)?;
            // The kernel wants the format NUL-terminated within fmt_size.
            let Some(nul) = env.scratch.iter().position(|&b| b == 0) else {
                return Ok(errno(libc::EINVAL));
            };
            let mem = &env.mem;
            let read_str = |addr: u64| read_c_string(mem, addr);
            match format_printk(&env.scratch[..nul], [r[3], r[4], r[5]], read_str) {
                Some(line) => {
                    tracing::info!(target: "phos_policy", policy = env.name, "{line}");
                    Ok(line.len() as u64)
                }
                None => Ok(errno(libc::EINVAL)),
            }
        }
        GET_PRANDOM_U32 => Ok(u64::from(next_random(env.rng))),
        GET_SMP_PROCESSOR_ID => Ok(0),
        _ => Err(fault("unknown helper".to_string())),
    }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of `phos_call.now_ns`.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec we pass, which lives on our stack.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// A nonzero seed for [`next_random`], different at every load.
pub(crate) fn random_seed() -> u64 {
    // splitmix64 of the two clocks: cheap and good enough to spread the bits.
    let mut z = clock_ns(libc::CLOCK_REALTIME) ^ monotonic_ns().rotate_left(32);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// xorshift64*: the state must stay nonzero.
pub(crate) fn next_random(state: &mut u64) -> u32 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
}

/// A `%s` argument: `None` where the pointer is not valid memory.
fn read_c_string(mem: &Mem<'_>, addr: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    // Byte by byte: the string may end right at the end of its region.
    for i in 0..MAX_STR as u64 {
        let [b] = mem.load::<1>(addr.wrapping_add(i))?;
        if b == 0 {
            break;
        }
        out.push(b);
    }
    Some(out)
}

/// Formats a trace_printk line like the kernel: up to three arguments, conversions
/// %d %i %u %x %X with optional l/ll, %c, %s, %p, %px, %pK and %%, flags `-+ #0` and a
/// width. `None` for a format the kernel would reject (-EINVAL).
pub(crate) fn format_printk(fmt: &[u8], args: [u64; 3], read_str: impl Fn(u64) -> Option<Vec<u8>>) -> Option<String> {
    let mut out: Vec<u8> = Vec::new();
    let mut next_arg = args.iter().copied();
    let mut i = 0;
    while i < fmt.len() {
        let c = fmt[i];
        i += 1;
        if c != b'%' {
            out.push(c);
            continue;
        }
        if fmt.get(i) == Some(&b'%') {
            out.push(b'%');
            i += 1;
            continue;
        }
        let (mut left, mut plus, mut space, mut alt, mut zero) = (false, false, false, false, false);
        while let Some(&f) = fmt.get(i) {
            match f {
                b'-' => left = true,
                b'+' => plus = true,
                b' ' => space = true,
                b'#' => alt = true,
                b'0' => zero = true,
                _ => break,
            }
            i += 1;
        }
        let mut width = 0usize;
        while let Some(&d) = fmt.get(i).filter(|d| d.is_ascii_digit()) {
            width = width * 10 + usize::from(d - b'0');
            if width > MAX_LINE {
                return None;
            }
            i += 1;
        }
        let arg = next_arg.next()?;
        // (sign or prefix, body, whether zero padding applies)
        let (prefix, body, numeric): (String, Vec<u8>, bool) = match *fmt.get(i)? {
            b'p' => {
                i += 1;
                // %px and %pK print the raw value; other %p extensions are kernel-only.
                match fmt.get(i) {
                    Some(b'x' | b'K') => i += 1,
                    Some(c) if c.is_ascii_alphanumeric() => return None,
                    _ => {}
                }
                (String::new(), format!("{arg:016x}").into_bytes(), false)
            }
            b's' => {
                i += 1;
                let s = match arg {
                    0 => b"(null)".to_vec(),
                    a => read_str(a).unwrap_or_else(|| b"(efault)".to_vec()),
                };
                (String::new(), s, false)
            }
            b'c' => {
                i += 1;
                (String::new(), vec![arg as u8], false)
            }
            _ => {
                let mut long = 0;
                while long < 2 && fmt.get(i) == Some(&b'l') {
                    long += 1;
                    i += 1;
                }
                let conv = *fmt.get(i)?;
                i += 1;
                // Without `l` the argument is an int: its low 32 bits.
                let unsigned = if long == 0 { u64::from(arg as u32) } else { arg };
                match conv {
                    b'd' | b'i' => {
                        let v = if long == 0 { i64::from(arg as u32 as i32) } else { arg as i64 };
                        let sign = if v < 0 {
                            "-"
                        } else if plus {
                            "+"
                        } else if space {
                            " "
                        } else {
                            ""
                        };
                        (sign.to_string(), v.unsigned_abs().to_string().into_bytes(), true)
                    }
                    b'u' => (String::new(), unsigned.to_string().into_bytes(), true),
                    b'x' | b'X' => {
                        let upper = conv == b'X';
                        let digits = if upper { format!("{unsigned:X}") } else { format!("{unsigned:x}") };
                        let prefix = match (alt && unsigned != 0, upper) {
                            (false, _) => "",
                            (true, false) => "0x",
                            (true, true) => "0X",
                        };
                        (prefix.to_string(), digits.into_bytes(), true)
                    }
                    _ => return None,
                }
            }
        };
        let len = prefix.len() + body.len();
        let pad = width.saturating_sub(len);
        if left {
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(&body);
            out.extend(std::iter::repeat_n(b' ', pad));
        } else if zero && numeric {
            out.extend_from_slice(prefix.as_bytes());
            out.extend(std::iter::repeat_n(b'0', pad));
            out.extend_from_slice(&body);
        } else {
            out.extend(std::iter::repeat_n(b' ', pad));
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(&body);
        }
        if out.len() > MAX_LINE {
            break;
        }
    }
    let mut line = String::from_utf8_lossy(&out).into_owned();
    if line.len() > MAX_LINE {
        let mut end = MAX_LINE;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    // The kernel's trace lines end at the newline the format usually carries.
    while line.ends_with('\n') {
        line.pop();
    }
    Some(line)
}
