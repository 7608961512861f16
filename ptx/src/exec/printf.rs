//! Device `printf` (`vprintf`): C format semantics over nvcc's argument buffer.
//!
//! nvcc lowers `printf(fmt, ...)` to `vprintf(fmt, buf)` where `buf` is a per-thread local buffer holding the
//! arguments after default promotions (float to double, char and short to int), each aligned to its own size. The
//! conversion specifications of the format tell how many bytes each argument takes: 8 for `l`/`ll`/`z`/`j`/`t` integers,
//! doubles and pointers, 4 for everything else. Output follows glibc's `printf` byte for byte (the tests compare with
//! `snprintf`), including exact decimal rounding of doubles, `inf`/`nan`, `%a` and the `#`, `0`, `-`, `+` and space
//! flags. As on the GPU, the return value is the number of arguments consumed (-1 for a null format).

use super::machine::Fault;

/// Reads device memory for one thread.
pub(crate) trait Memory {
    /// Reads `size` (1..=8) bytes at a generic address, little-endian.
    fn read(&mut self, addr: u64, size: usize) -> Result<u64, Fault>;
}

/// Reads a NUL-terminated string of at most `max` bytes.
pub(crate) fn read_cstr(m: &mut dyn Memory, addr: u64, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match m.read(addr.wrapping_add(out.len() as u64), 1) {
            Ok(0) | Err(_) => break,
            Ok(b) => out.push(b as u8),
        }
    }
    out
}

fn read_cstr_checked(m: &mut dyn Memory, addr: u64, max: usize) -> Result<Vec<u8>, Fault> {
    let mut out = Vec::new();
    while out.len() < max {
        let b = m.read(addr.wrapping_add(out.len() as u64), 1)?;
        if b == 0 {
            break;
        }
        out.push(b as u8);
    }
    Ok(out)
}

/// The longest format string and `%s` argument read.
const MAX_STR: usize = 1 << 16;

#[derive(Default, Clone, Copy)]
pub struct Spec {
    pub minus: bool,
    pub plus: bool,
    pub space: bool,
    pub alt: bool,
    pub zero: bool,
    pub width: usize,
    pub prec: Option<usize>,
}

struct Args<'m> {
    mem: &'m mut dyn Memory,
    base: u64,
    off: u64,
    count: i32,
}

impl Args<'_> {
    fn next(&mut self, size: u64) -> Result<u64, Fault> {
        self.off = self.off.div_ceil(size) * size;
        let v = self.mem.read(self.base.wrapping_add(self.off), size as usize)?;
        self.off += size;
        self.count += 1;
        Ok(v)
    }
}

/// Formats one `vprintf` call, appending to `out`. Returns vprintf's return value.
pub(crate) fn format(mem: &mut dyn Memory, fmt: u64, args: u64, out: &mut Vec<u8>) -> Result<i32, Fault> {
    if fmt == 0 {
        return Ok(-1);
    }
    let f = read_cstr_checked(mem, fmt, MAX_STR)?;
    let mut a = Args { mem, base: args, off: 0, count: 0 };
    let mut i = 0;
    while i < f.len() {
        let c = f[i];
        if c != b'%' {
            out.push(c);
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        let mut s = Spec::default();
        while i < f.len() {
            match f[i] {
                b'-' => s.minus = true,
                b'+' => s.plus = true,
                b' ' => s.space = true,
                b'#' => s.alt = true,
                b'0' => s.zero = true,
                b'\'' => {}
                _ => break,
            }
            i += 1;
        }
        if i < f.len() && f[i] == b'*' {
            let w = a.next(4)? as u32 as i32;
            if w < 0 {
                s.minus = true;
            }
            s.width = w.unsigned_abs() as usize;
            i += 1;
        } else {
            while i < f.len() && f[i].is_ascii_digit() {
                s.width = (s.width * 10 + (f[i] - b'0') as usize).min(1 << 20);
                i += 1;
            }
        }
        if i < f.len() && f[i] == b'.' {
            i += 1;
            if i < f.len() && f[i] == b'*' {
                let p = a.next(4)? as u32 as i32;
                s.prec = if p < 0 { None } else { Some(p as usize) };
                i += 1;
            } else {
                let mut p = 0usize;
                while i < f.len() && f[i].is_ascii_digit() {
                    p = (p * 10 + (f[i] - b'0') as usize).min(1 << 20);
                    i += 1;
                }
                s.prec = Some(p);
            }
        }
        // Length modifiers: only the argument size matters (h/hh also narrow the value).
        let mut long = false;
        let mut half = 0u8;
        while i < f.len() {
            match f[i] {
                b'l' | b'z' | b'j' | b't' | b'q' | b'L' => long = true,
                b'h' => half += 1,
                _ => break,
            }
            i += 1;
        }
        let Some(&conv) = f.get(i) else {
            out.extend_from_slice(&f[start..]);
            break;
        };
        i += 1;
        let isize_ = if long { 8 } else { 4 };
        match conv {
            b'd' | b'i' => {
                let v = a.next(isize_)?;
                let v: i64 = match (long, half) {
                    (true, _) => v as i64,
                    (false, 0) => v as u32 as i32 as i64,
                    (false, 1) => v as u16 as i16 as i64,
                    (false, _) => v as u8 as i8 as i64,
                };
                fmt_int(out, &s, v < 0, v.unsigned_abs(), 10, false, conv);
            }
            b'u' | b'x' | b'X' | b'o' => {
                let v = a.next(isize_)?;
                let v = match (long, half) {
                    (true, _) => v,
                    (false, 0) => v as u32 as u64,
                    (false, 1) => v as u16 as u64,
                    (false, _) => v as u8 as u64,
                };
                let base = match conv {
                    b'o' => 8,
                    b'u' => 10,
                    _ => 16,
                };
                fmt_int(out, &s, false, v, base, conv == b'X', conv);
            }
            b'c' => {
                let v = a.next(4)? as u8;
                pad(out, &s, &[], &[v], false);
            }
            b's' => {
                let p = a.next(8)?;
                let text = if p == 0 {
                    if s.prec.is_none_or(|x| x >= 6) { b"(null)".to_vec() } else { Vec::new() }
                } else {
                    read_cstr_checked(a.mem, p, s.prec.unwrap_or(MAX_STR).min(MAX_STR))?
                };
                pad(out, &Spec { zero: false, ..s }, &[], &text, false);
            }
            b'p' => {
                let p = a.next(8)?;
                if p == 0 {
                    pad(out, &Spec { zero: false, ..s }, &[], b"(nil)", false);
                } else {
                    let sign: &[u8] = if s.plus {
                        b"+0x"
                    } else if s.space {
                        b" 0x"
                    } else {
                        b"0x"
                    };
                    let digits = format!("{p:x}");
                    pad(out, &s, sign, digits.as_bytes(), true);
                }
            }
            b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A' => {
                let v = f64::from_bits(a.next(8)?);
                fmt_float(out, &s, v, conv);
            }
            b'%' => out.push(b'%'),
            b'n' => {
                a.next(8)?;
            }
            _ => out.extend_from_slice(&f[start..i]),
        }
    }
    Ok(a.count)
}

/// Writes `prefix` and `body` padded to the width: spaces left or right, or zeros between prefix and body.
fn pad(out: &mut Vec<u8>, s: &Spec, prefix: &[u8], body: &[u8], zero_ok: bool) {
    let len = prefix.len() + body.len();
    let fill = s.width.saturating_sub(len);
    if s.minus {
        out.extend_from_slice(prefix);
        out.extend_from_slice(body);
        out.resize(out.len() + fill, b' ');
    } else if s.zero && zero_ok {
        out.extend_from_slice(prefix);
        out.resize(out.len() + fill, b'0');
        out.extend_from_slice(body);
    } else {
        out.resize(out.len() + fill, b' ');
        out.extend_from_slice(prefix);
        out.extend_from_slice(body);
    }
}

fn fmt_int(out: &mut Vec<u8>, s: &Spec, neg: bool, v: u64, base: u32, upper: bool, conv: u8) {
    let mut digits = match base {
        8 => format!("{v:o}"),
        10 => format!("{v}"),
        _ if upper => format!("{v:X}"),
        _ => format!("{v:x}"),
    }
    .into_bytes();
    if s.prec == Some(0) && v == 0 {
        digits.clear();
    }
    if let Some(p) = s.prec
        && digits.len() < p
    {
        let mut d = vec![b'0'; p - digits.len()];
        d.extend_from_slice(&digits);
        digits = d;
    }
    let mut prefix: Vec<u8> = Vec::new();
    if conv == b'd' || conv == b'i' {
        if neg {
            prefix.push(b'-');
        } else if s.plus {
            prefix.push(b'+');
        } else if s.space {
            prefix.push(b' ');
        }
    }
    if s.alt {
        match conv {
            b'o' if digits.first() != Some(&b'0') => digits.insert(0, b'0'),
            b'x' if v != 0 => prefix.extend_from_slice(b"0x"),
            b'X' if v != 0 => prefix.extend_from_slice(b"0X"),
            _ => {}
        }
    }
    pad(out, s, &prefix, &digits, s.prec.is_none());
}

/// `d.ddde±XX` from Rust's exact `{:e}` output.
fn exp_form(mantissa_exp: &str, upper: bool) -> (String, i32) {
    let (m, e) = mantissa_exp.split_once('e').unwrap_or((mantissa_exp, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    let sign = if e < 0 { '-' } else { '+' };
    let s = format!("{m}{}{sign}{:02}", if upper { 'E' } else { 'e' }, e.unsigned_abs());
    (s, e)
}

fn strip_zeros(s: &mut String) {
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
}

pub(crate) fn fmt_float(out: &mut Vec<u8>, s: &Spec, v: f64, conv: u8) {
    let upper = conv.is_ascii_uppercase();
    let neg = v.is_sign_negative();
    let sign: &[u8] = if neg {
        b"-"
    } else if s.plus {
        b"+"
    } else if s.space {
        b" "
    } else {
        b""
    };
    if !v.is_finite() {
        let body: &[u8] = match (v.is_nan(), upper) {
            (true, false) => b"nan",
            (true, true) => b"NAN",
            (false, false) => b"inf",
            (false, true) => b"INF",
        };
        pad(out, s, sign, body, false);
        return;
    }
    let x = v.abs();
    let body = match conv {
        b'f' | b'F' => {
            let p = s.prec.unwrap_or(6);
            let mut t = format!("{x:.p$}");
            if s.alt && p == 0 {
                t.push('.');
            }
            t
        }
        b'e' | b'E' => {
            let p = s.prec.unwrap_or(6);
            let mut t = format!("{x:.p$e}");
            if s.alt && p == 0 {
                t = t.replacen('e', ".e", 1);
            }
            exp_form(&t, upper).0
        }
        b'g' | b'G' => {
            let p = s.prec.unwrap_or(6).max(1);
            let (_, e) = exp_form(&format!("{x:.*e}", p - 1), upper);
            let mut t = if (p as i64) > e as i64 && e >= -4 {
                let fp = (p as i64 - 1 - e as i64) as usize;
                let mut t = format!("{x:.fp$}");
                if s.alt && !t.contains('.') {
                    t.push('.');
                }
                t
            } else {
                let mut t = format!("{x:.*e}", p - 1);
                if s.alt && !t.contains('.') {
                    t = t.replacen('e', ".e", 1);
                }
                exp_form(&t, upper).0
            };
            if !s.alt {
                if let Some(epos) = t.find(['e', 'E']) {
                    let (m, e) = t.split_at(epos);
                    let mut m = m.to_string();
                    strip_zeros(&mut m);
                    t = m + e;
                } else {
                    strip_zeros(&mut t);
                }
            }
            t
        }
        _ => hex_float(x, s.prec, s.alt, upper),
    };
    let (sign, body) = if conv == b'a' || conv == b'A' {
        let mut pre = sign.to_vec();
        pre.extend_from_slice(if upper { b"0X" } else { b"0x" });
        (pre, body)
    } else {
        (sign.to_vec(), body)
    };
    pad(out, s, &sign, body.as_bytes(), true);
}

/// glibc's `%a` digits after the `0x` prefix, for a non-negative finite value.
fn hex_float(x: f64, prec: Option<usize>, alt: bool, upper: bool) -> String {
    let bits = x.to_bits();
    let exp_field = (bits >> 52) as i64;
    let mut frac = bits & ((1u64 << 52) - 1);
    let (mut lead, exp) =
        if exp_field == 0 { if frac == 0 { (0u64, 0i64) } else { (0u64, -1022i64) } } else { (1u64, exp_field - 1023) };
    let mut ndig = 13usize;
    if let Some(p) = prec {
        if p < 13 {
            // Round lead.frac to p hex digits, ties to even (the lead digit counts when p is 0).
            let drop = (13 - p) * 4;
            let m = (lead << 52) | frac;
            let kept = m >> drop;
            let rest = m & ((1u64 << drop) - 1);
            let half = 1u64 << (drop - 1);
            let kept = if rest > half || (rest == half && kept & 1 == 1) { kept + 1 } else { kept };
            let m = kept << drop;
            lead = m >> 52;
            frac = m & ((1u64 << 52) - 1);
        }
        ndig = p;
    }
    let mut digits = format!("{frac:013x}");
    if prec.is_none() {
        while digits.ends_with('0') {
            digits.pop();
        }
    } else if ndig <= 13 {
        digits.truncate(ndig);
    } else {
        digits.extend(std::iter::repeat_n('0', ndig - 13));
    }
    let mut s = format!("{lead}");
    if !digits.is_empty() || alt {
        s.push('.');
    }
    s.push_str(&digits);
    s.push(if upper { 'P' } else { 'p' });
    s.push(if exp < 0 { '-' } else { '+' });
    s.push_str(&exp.unsigned_abs().to_string());
    if upper { s.to_uppercase() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device memory for tests: one flat buffer at a fake base address.
    struct Buf {
        base: u64,
        data: Vec<u8>,
    }

    impl Memory for Buf {
        fn read(&mut self, addr: u64, size: usize) -> Result<u64, Fault> {
            let off = addr.checked_sub(self.base).ok_or(Fault::Illegal(addr))? as usize;
            let b = self.data.get(off..off + size).ok_or(Fault::Illegal(addr))?;
            let mut x = [0u8; 8];
            x[..size].copy_from_slice(b);
            Ok(u64::from_le_bytes(x))
        }
    }

    enum A<'s> {
        I(i32),
        L(i64),
        D(f64),
        S(&'s str),
    }

    /// Formats like the device would, building the argument buffer the way nvcc lays it out.
    fn dev(fmt: &str, args: &[A]) -> String {
        let base = 0x1000u64;
        let mut data = vec![0u8; 4096];
        let fmt_at = 0usize;
        data[..fmt.len()].copy_from_slice(fmt.as_bytes());
        let mut strings_at = 2048usize;
        let mut off = 1024usize;
        for a in args {
            match a {
                A::I(v) => {
                    off = off.div_ceil(4) * 4;
                    data[off..off + 4].copy_from_slice(&v.to_le_bytes());
                    off += 4;
                }
                A::L(v) => {
                    off = off.div_ceil(8) * 8;
                    data[off..off + 8].copy_from_slice(&v.to_le_bytes());
                    off += 8;
                }
                A::D(v) => {
                    off = off.div_ceil(8) * 8;
                    data[off..off + 8].copy_from_slice(&v.to_le_bytes());
                    off += 8;
                }
                A::S(s) => {
                    data[strings_at..strings_at + s.len()].copy_from_slice(s.as_bytes());
                    let p = base + strings_at as u64;
                    strings_at += s.len() + 1;
                    off = off.div_ceil(8) * 8;
                    data[off..off + 8].copy_from_slice(&p.to_le_bytes());
                    off += 8;
                }
            }
        }
        let mut m = Buf { base, data };
        let mut out = Vec::new();
        format(&mut m, base + fmt_at as u64, base + 1024, &mut out).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    fn host(fmt: &str, args: &[A]) -> String {
        let cfmt = std::ffi::CString::new(fmt).unwrap();
        let mut buf = vec![0u8; 8192];
        let strs: Vec<std::ffi::CString> = args
            .iter()
            .filter_map(|a| if let A::S(s) = a { Some(std::ffi::CString::new(*s).unwrap()) } else { None })
            .collect();
        // SAFETY: `buf` is writable for `len` bytes, the format and strings are NUL-terminated
        // and live, and each call passes the arguments its test format asks for.
        #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs")]
        let n = unsafe {
            let p = buf.as_mut_ptr() as *mut libc::c_char;
            let len = buf.len();
            match args {
                [] => libc::snprintf(p, len, cfmt.as_ptr()),
                [A::I(a)] => libc::snprintf(p, len, cfmt.as_ptr(), *a),
                [A::L(a)] => libc::snprintf(p, len, cfmt.as_ptr(), *a),
                [A::D(a)] => libc::snprintf(p, len, cfmt.as_ptr(), *a),
                [A::S(_)] => libc::snprintf(p, len, cfmt.as_ptr(), strs[0].as_ptr()),
                [A::I(a), A::D(b)] => libc::snprintf(p, len, cfmt.as_ptr(), *a, *b),
                [A::I(a), A::I(b), A::D(c)] => libc::snprintf(p, len, cfmt.as_ptr(), *a, *b, *c),
                _ => panic!("unsupported test shape"),
            }
        };
        buf.truncate(n as usize);
        String::from_utf8_lossy(&buf).into_owned()
    }

    fn xs(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn floats_match_glibc() {
        let convs = ["f", "e", "g", "a", "E", "G", "F", "A"];
        let flags = ["", "-", "+", " ", "#", "0", "+0", "-#"];
        let mut seed = 0x5eed_1234_abcd_0001u64;
        let mut values = vec![
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            0.125,
            1e-5,
            1e-4,
            123456.0,
            1234567.0,
            1e100,
            -1e-300,
            5e-324,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            0.1,
            2.675,
            9.9999995,
            0.000099995,
            999999.5,
        ];
        for _ in 0..300 {
            let v = match xs(&mut seed) % 4 {
                0 => f64::from_bits(xs(&mut seed)),
                1 => (xs(&mut seed) % 2_000_000) as f64 / 1000.0 - 1000.0,
                2 => (xs(&mut seed) % 100) as f64 * 0.05,
                _ => f64::from_bits(xs(&mut seed) >> 12),
            };
            if !v.is_nan() {
                values.push(v);
            }
        }
        for (k, v) in values.iter().enumerate() {
            for c in convs {
                let fl = flags[k % flags.len()];
                for spec in [
                    format!("%{fl}{c}"),
                    format!("%{fl}12.3{c}"),
                    format!("%{fl}.0{c}"),
                    format!("%{fl}.10{c}"),
                    format!("[%{fl}*.*{c}]"),
                ] {
                    if spec.contains('*') {
                        let a = [A::I(9), A::I(2), A::D(*v)];
                        assert_eq!(dev(&spec, &a), host(&spec, &a), "{spec} {v:e}");
                    } else {
                        assert_eq!(dev(&spec, &[A::D(*v)]), host(&spec, &[A::D(*v)]), "{spec} {v:e}");
                    }
                }
            }
        }
    }

    #[test]
    fn ints_and_strings_match_glibc() {
        let mut seed = 0x0123_4567_89ab_cdefu64;
        let specs = [
            "%d", "%i", "%5d", "%-5d|", "%+d", "% d", "%05d", "%.3d", "%.0d", "%x", "%#x", "%#X", "%#o", "%o", "%u",
            "%08.3x", "%hd", "%hhd", "%hu", "%hhx", "%c", "%-3c|", "%%d",
        ];
        for _ in 0..200 {
            let v = match xs(&mut seed) % 3 {
                0 => 0,
                1 => (xs(&mut seed) % 2000) as i32 - 1000,
                _ => xs(&mut seed) as i32,
            };
            for s in specs {
                assert_eq!(dev(s, &[A::I(v)]), host(s, &[A::I(v)]), "{s} {v}");
            }
            let l = xs(&mut seed) as i64;
            for s in ["%ld", "%lld", "%lu", "%llx", "%#lo", "%20lld", "%zu"] {
                assert_eq!(dev(s, &[A::L(l)]), host(s, &[A::L(l)]), "{s} {l}");
            }
        }
        for s in ["%s", "%10s|", "%-10s|", "%.2s", "%5.1s|"] {
            assert_eq!(dev(s, &[A::S("hello")]), host(s, &[A::S("hello")]), "{s}");
        }
        assert_eq!(dev("x=%d y=%f\n", &[A::I(3), A::D(1.5)]), "x=3 y=1.500000\n");
        assert_eq!(dev("%p", &[A::L(0x1234)]), "0x1234");
        assert_eq!(dev("%p", &[A::L(0)]), "(nil)");
    }
}
