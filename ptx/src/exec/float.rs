//! Exact floating-point arithmetic for the cases the host FPU cannot do directly.
//!
//! Round-to-nearest `f32`/`f64` arithmetic runs on the host FPU (it is IEEE 754 there too). Everything else goes through
//! the small soft-float in this file: the directed rounding modes (`.rz`, `.rm`, `.rp`) of add, mul, fma, div, sqrt and
//! cvt, and all `f16`/`bf16` arithmetic. The idea is simple: every finite operand is an exact `m * 2^e` with `m` an
//! integer; sums, products and quotients are formed exactly (or exactly up to a "sticky" bit that records a nonzero
//! remainder below the kept bits) in 128-bit integers, and [`round`] then rounds that exact value once, in the requested
//! mode, to the requested format. Rounding once from an exact value is what IEEE 754 prescribes, so the results are
//! correctly rounded in every mode, including subnormal results and overflow.
//!
//! NaN results are the GPU's canonical NaNs (all payload bits set, sign clear), not the host's.

/// A PTX rounding mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rnd {
    /// Nearest, ties to even.
    Rn,
    /// Toward zero.
    Rz,
    /// Toward minus infinity.
    Rm,
    /// Toward plus infinity.
    Rp,
}

/// An IEEE binary interchange format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fmt {
    pub exp_bits: u32,
    pub frac_bits: u32,
}

pub const F16: Fmt = Fmt { exp_bits: 5, frac_bits: 10 };
pub const BF16: Fmt = Fmt { exp_bits: 8, frac_bits: 7 };
pub const F32: Fmt = Fmt { exp_bits: 8, frac_bits: 23 };
pub const F64: Fmt = Fmt { exp_bits: 11, frac_bits: 52 };

/// The NaN a GPU produces for f32 operations.
pub const NAN32: u32 = 0x7fff_ffff;
/// The NaN a GPU's f64 operations produce when no operand is a NaN (0/0, sqrt(-1), inf-inf): negative, like x86.
pub const NAN64: u64 = 0xfff8_0000_0000_0000;

/// The NaN an f64 operation returns: NaN operands propagate (quietened), a quiet one in preference to a signaling one;
/// otherwise the default NaN. This is what the H100 does (see tests/exec_data/probe_h100.txt).
pub fn nan64(inputs: &[u64]) -> u64 {
    let is_nan = |x: u64| x & 0x7ff0_0000_0000_0000 == 0x7ff0_0000_0000_0000 && x & 0x000f_ffff_ffff_ffff != 0;
    let quiet = |x: u64| x & (1 << 51) != 0;
    if let Some(&q) = inputs.iter().find(|&&x| is_nan(x) && quiet(x)) {
        return q;
    }
    if let Some(&s) = inputs.iter().find(|&&x| is_nan(x)) {
        return s | (1 << 51);
    }
    NAN64
}

impl Fmt {
    pub fn bias(self) -> i32 {
        (1 << (self.exp_bits - 1)) - 1
    }
    fn emin(self) -> i32 {
        1 - self.bias()
    }
    fn emax(self) -> i32 {
        self.bias()
    }
    fn prec(self) -> u32 {
        self.frac_bits + 1
    }
    fn sign_bit(self) -> u64 {
        1 << (self.exp_bits + self.frac_bits)
    }
    fn exp_mask(self) -> u64 {
        ((1u64 << self.exp_bits) - 1) << self.frac_bits
    }
    fn frac_mask(self) -> u64 {
        (1u64 << self.frac_bits) - 1
    }
    pub fn inf(self, neg: bool) -> u64 {
        self.exp_mask() | if neg { self.sign_bit() } else { 0 }
    }
    pub fn zero(self, neg: bool) -> u64 {
        if neg { self.sign_bit() } else { 0 }
    }
    fn max_finite(self, neg: bool) -> u64 {
        (self.exp_mask() - (1 << self.frac_bits)) | self.frac_mask() | if neg { self.sign_bit() } else { 0 }
    }
    /// The canonical NaN: sign clear, exponent and fraction all ones.
    pub fn nan(self) -> u64 {
        self.exp_mask() | self.frac_mask()
    }
    pub fn is_nan(self, bits: u64) -> bool {
        bits & self.exp_mask() == self.exp_mask() && bits & self.frac_mask() != 0
    }
    pub fn is_subnormal(self, bits: u64) -> bool {
        bits & self.exp_mask() == 0 && bits & self.frac_mask() != 0
    }
    /// Sign-preserving flush of a subnormal to zero.
    pub fn flush(self, bits: u64) -> u64 {
        if self.is_subnormal(bits) { bits & self.sign_bit() } else { bits }
    }
    pub fn neg(self, bits: u64) -> bool {
        bits & self.sign_bit() != 0
    }
}

/// A decoded floating-point value. Finite values are `(-1)^neg * m * 2^e`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Val {
    Nan,
    Inf(bool),
    Zero(bool),
    Fin(bool, u64, i32),
}

pub fn unpack(bits: u64, f: Fmt) -> Val {
    let neg = f.neg(bits);
    let exp = ((bits & f.exp_mask()) >> f.frac_bits) as i32;
    let frac = bits & f.frac_mask();
    if exp == (1 << f.exp_bits) - 1 {
        return if frac != 0 { Val::Nan } else { Val::Inf(neg) };
    }
    if exp == 0 {
        if frac == 0 {
            return Val::Zero(neg);
        }
        return Val::Fin(neg, frac, f.emin() - f.frac_bits as i32);
    }
    Val::Fin(neg, frac | (1 << f.frac_bits), exp - f.bias() - f.frac_bits as i32)
}

/// Rounds the exact value `(-1)^neg * (m + s) * 2^e` to format `f`, where `s` is in (0, 1) when `sticky` is set and 0
/// otherwise. Callers keep at least two bits of `m` below the target precision when `sticky` is set.
pub fn round(neg: bool, m: u128, e: i32, sticky: bool, f: Fmt, rnd: Rnd) -> u64 {
    if m == 0 {
        if !sticky {
            return f.zero(neg);
        }
        // A value below one unit of 2^e, which callers only produce far below the format's smallest subnormal.
        return match (rnd, neg) {
            (Rnd::Rp, false) | (Rnd::Rm, true) => f.zero(neg) | 1,
            _ => f.zero(neg),
        };
    }
    let prec = f.prec() as i32;
    let msb = 127 - m.leading_zeros() as i32;
    let top = msb as i64 + e as i64;
    // Exponent of the unit in the last place of the result.
    let mut q = top.max(f.emin() as i64) - (prec as i64 - 1);
    let (mut mant, half, rest) = if q <= e as i64 {
        // Exact: the shift is at most prec-1 bits, so it cannot overflow.
        (m << (e as i64 - q) as u32, false, false)
    } else {
        let sh = q - e as i64;
        if sh > 128 {
            (0u128, false, true)
        } else if sh == 128 {
            (0u128, m >> 127 != 0, m & (u128::MAX >> 1) != 0)
        } else {
            let sh = sh as u32;
            let kept = m >> sh;
            let half = (m >> (sh - 1)) & 1 != 0;
            let rest = sh > 1 && m & ((1u128 << (sh - 1)) - 1) != 0;
            (kept, half, rest)
        }
    };
    let rest = rest || sticky;
    let inexact = half || rest;
    let up = match rnd {
        Rnd::Rn => half && (rest || mant & 1 == 1),
        Rnd::Rz => false,
        Rnd::Rm => neg && inexact,
        Rnd::Rp => !neg && inexact,
    };
    if up {
        mant += 1;
    }
    if mant >> prec != 0 {
        mant >>= 1;
        q += 1;
    }
    if mant == 0 {
        return f.zero(neg);
    }
    let sign = if neg { f.sign_bit() } else { 0 };
    if mant >> (prec - 1) == 0 {
        // Subnormal: q is the minimum quantum.
        return sign | mant as u64;
    }
    let exp = q + prec as i64 - 1;
    if exp > f.emax() as i64 {
        return match rnd {
            Rnd::Rn => f.inf(neg),
            Rnd::Rz => f.max_finite(neg),
            Rnd::Rm => {
                if neg {
                    f.inf(true)
                } else {
                    f.max_finite(false)
                }
            }
            Rnd::Rp => {
                if neg {
                    f.max_finite(true)
                } else {
                    f.inf(false)
                }
            }
        };
    }
    sign | (((exp + f.bias() as i64) as u64) << f.frac_bits) | (mant as u64 & f.frac_mask())
}

/// An exact intermediate: `(-1)^neg * (m + sticky) * 2^e`.
#[derive(Clone, Copy, Debug)]
struct Exact {
    neg: bool,
    m: u128,
    e: i32,
    sticky: bool,
}

fn normalize(m: u128, e: i32) -> (u128, i32) {
    let sh = m.leading_zeros() as i32 - 3; // msb at bit 124
    if sh >= 0 { (m << sh, e - sh) } else { (m >> -sh, e - sh) }
}

/// Exact sum of two nonzero exact values (the second without sticky bits).
fn add_exact(a: Exact, b: Exact) -> Exact {
    let (am, ae) = normalize(a.m, a.e);
    let (bm, be) = normalize(b.m, b.e);
    let (hi, hm, he, lo, lm, le) = if ae >= be { (a, am, ae, b, bm, be) } else { (b, bm, be, a, am, ae) };
    let diff = (he as i64 - le as i64) as u64;
    let (lm, mut sticky) = if diff == 0 {
        (lm, false)
    } else if diff >= 126 {
        (0, true)
    } else {
        (lm >> diff, lm & ((1u128 << diff) - 1) != 0)
    };
    sticky |= hi.sticky || lo.sticky;
    if hi.neg == lo.neg {
        return Exact { neg: hi.neg, m: hm + lm, e: he, sticky };
    }
    // Opposite signs. When the smaller one lost bits it is strictly smaller than the larger (diff > 0), and the
    // true difference lies just below hm - lm.
    if hm >= lm {
        let (m, sticky) = if sticky { (hm - lm - 1, true) } else { (hm - lm, false) };
        Exact { neg: hi.neg, m, e: he, sticky }
    } else {
        Exact { neg: lo.neg, m: lm - hm, e: he, sticky }
    }
}

fn fin(v: Val) -> Option<Exact> {
    match v {
        Val::Fin(neg, m, e) => Some(Exact { neg, m: m as u128, e, sticky: false }),
        _ => None,
    }
}

/// The sign of an exact zero sum: +0 except when rounding toward minus infinity.
fn zero_sum(a_neg: bool, b_neg: bool, rnd: Rnd) -> bool {
    if a_neg == b_neg { a_neg } else { rnd == Rnd::Rm }
}

pub fn add(a: u64, b: u64, f: Fmt, rnd: Rnd) -> u64 {
    let (va, vb) = (unpack(a, f), unpack(b, f));
    match (va, vb) {
        (Val::Nan, _) | (_, Val::Nan) => f.nan(),
        (Val::Inf(x), Val::Inf(y)) => {
            if x == y {
                f.inf(x)
            } else {
                f.nan()
            }
        }
        (Val::Inf(x), _) | (_, Val::Inf(x)) => f.inf(x),
        (Val::Zero(x), Val::Zero(y)) => f.zero(zero_sum(x, y, rnd)),
        (Val::Zero(_), _) => b,
        (_, Val::Zero(_)) => a,
        (Val::Fin(..), Val::Fin(..)) => {
            let (Some(x), Some(y)) = (fin(va), fin(vb)) else { return f.nan() };
            let s = add_exact(x, y);
            if s.m == 0 && !s.sticky {
                return f.zero(rnd == Rnd::Rm);
            }
            round(s.neg, s.m, s.e, s.sticky, f, rnd)
        }
    }
}

pub fn sub(a: u64, b: u64, f: Fmt, rnd: Rnd) -> u64 {
    add(a, b ^ f.sign_bit(), f, rnd)
}

pub fn mul(a: u64, b: u64, f: Fmt, rnd: Rnd) -> u64 {
    let neg = f.neg(a) != f.neg(b);
    match (unpack(a, f), unpack(b, f)) {
        (Val::Nan, _) | (_, Val::Nan) => f.nan(),
        (Val::Inf(_), Val::Zero(_)) | (Val::Zero(_), Val::Inf(_)) => f.nan(),
        (Val::Inf(_), _) | (_, Val::Inf(_)) => f.inf(neg),
        (Val::Zero(_), _) | (_, Val::Zero(_)) => f.zero(neg),
        (Val::Fin(_, ma, ea), Val::Fin(_, mb, eb)) => round(neg, ma as u128 * mb as u128, ea + eb, false, f, rnd),
    }
}

pub fn fma(a: u64, b: u64, c: u64, f: Fmt, rnd: Rnd) -> u64 {
    let pneg = f.neg(a) != f.neg(b);
    let (va, vb, vc) = (unpack(a, f), unpack(b, f), unpack(c, f));
    if matches!(va, Val::Nan) || matches!(vb, Val::Nan) || matches!(vc, Val::Nan) {
        return f.nan();
    }
    let p_inf = matches!(va, Val::Inf(_)) || matches!(vb, Val::Inf(_));
    let p_zero = matches!(va, Val::Zero(_)) || matches!(vb, Val::Zero(_));
    if p_inf && p_zero {
        return f.nan();
    }
    if p_inf {
        return match vc {
            Val::Inf(cn) if cn != pneg => f.nan(),
            _ => f.inf(pneg),
        };
    }
    if let Val::Inf(cn) = vc {
        return f.inf(cn);
    }
    if p_zero {
        return match vc {
            Val::Zero(cn) => f.zero(zero_sum(pneg, cn, rnd)),
            _ => c,
        };
    }
    let (Val::Fin(_, ma, ea), Val::Fin(_, mb, eb)) = (va, vb) else { return f.nan() };
    let p = Exact { neg: pneg, m: ma as u128 * mb as u128, e: ea + eb, sticky: false };
    match vc {
        Val::Zero(_) => round(p.neg, p.m, p.e, false, f, rnd),
        Val::Fin(cn, mc, ec) => {
            let s = add_exact(p, Exact { neg: cn, m: mc as u128, e: ec, sticky: false });
            if s.m == 0 && !s.sticky {
                return f.zero(rnd == Rnd::Rm);
            }
            round(s.neg, s.m, s.e, s.sticky, f, rnd)
        }
        _ => f.nan(),
    }
}

pub fn div(a: u64, b: u64, f: Fmt, rnd: Rnd) -> u64 {
    let neg = f.neg(a) != f.neg(b);
    match (unpack(a, f), unpack(b, f)) {
        (Val::Nan, _) | (_, Val::Nan) => f.nan(),
        (Val::Inf(_), Val::Inf(_)) | (Val::Zero(_), Val::Zero(_)) => f.nan(),
        (Val::Inf(_), _) | (_, Val::Zero(_)) => f.inf(neg),
        (Val::Zero(_), _) | (_, Val::Inf(_)) => f.zero(neg),
        (Val::Fin(_, ma, ea), Val::Fin(_, mb, eb)) => {
            // Put the dividend's msb at bit 116 so the quotient keeps at least 64 bits.
            let sh = 116 - (63 - ma.leading_zeros() as i32);
            let num = (ma as u128) << sh;
            let q = num / mb as u128;
            let r = num % mb as u128;
            round(neg, q, ea - sh - eb, r != 0, f, rnd)
        }
    }
}

pub fn sqrt(a: u64, f: Fmt, rnd: Rnd) -> u64 {
    match unpack(a, f) {
        Val::Nan => f.nan(),
        Val::Zero(_) => a,
        Val::Inf(false) => a,
        Val::Inf(true) | Val::Fin(true, ..) => f.nan(),
        Val::Fin(false, m, e) => {
            // Shift the msb to bit ~120 with an even exponent; the root then has ~60 bits.
            let mut sh = 120 - (63 - m.leading_zeros() as i32);
            if (e - sh) % 2 != 0 {
                sh -= 1;
            }
            let v = (m as u128) << sh;
            let r = v.isqrt();
            round(false, r, (e - sh) / 2, r * r != v, f, rnd)
        }
    }
}

/// Converts between float formats with rounding (NaN becomes the target's canonical NaN).
pub fn convert(bits: u64, from: Fmt, to: Fmt, rnd: Rnd) -> u64 {
    match unpack(bits, from) {
        Val::Nan => to.nan(),
        Val::Inf(n) => to.inf(n),
        Val::Zero(n) => to.zero(n),
        Val::Fin(n, m, e) => round(n, m as u128, e, false, to, rnd),
    }
}

/// Converts an integer (given as sign and magnitude) to a float format.
pub fn from_int(neg: bool, mag: u64, to: Fmt, rnd: Rnd) -> u64 {
    round(neg, mag as u128, 0, false, to, rnd)
}

/// f16 bits to f32 (exact).
#[cfg(test)]
pub fn f16_to_f32(h: u16) -> f32 {
    let b = convert(h as u64, F16, F32, Rnd::Rn) as u32;
    // Keep NaN payload-free canonical pattern of f32.
    f32::from_bits(b)
}

#[cfg(test)]
pub fn f32_to_f16(x: f32, rnd: Rnd) -> u16 {
    convert(x.to_bits() as u64, F32, F16, rnd) as u16
}

/// Converts an f64 to f32 bits in the given mode.
pub fn f64_to_f32(x: f64, rnd: Rnd) -> u32 {
    if rnd == Rnd::Rn {
        let r = x as f32;
        return if r.is_nan() { NAN32 } else { r.to_bits() };
    }
    convert(x.to_bits(), F64, F32, rnd) as u32
}

/// Rounds a float (given by its bits in format `f`) to an integral value of the same format, in mode `rnd`.
pub fn round_integral(bits: u64, f: Fmt, rnd: Rnd) -> u64 {
    match unpack(bits, f) {
        Val::Nan => f.nan(),
        Val::Inf(_) | Val::Zero(_) => bits,
        Val::Fin(neg, m, e) => {
            if e >= 0 {
                return bits;
            }
            let sh = (-e) as u32;
            let (int, half, rest) = if sh >= 64 {
                (0u64, false, true)
            } else {
                let int = m >> sh;
                let half = (m >> (sh - 1)) & 1 != 0;
                let rest = sh > 1 && m & ((1u64 << (sh - 1)) - 1) != 0;
                (int, half, rest)
            };
            let inexact = half || rest;
            let up = match rnd {
                Rnd::Rn => half && (rest || int & 1 == 1),
                Rnd::Rz => false,
                Rnd::Rm => neg && inexact,
                Rnd::Rp => !neg && inexact,
            };
            let int = int + up as u64;
            if int == 0 {
                return f.zero(neg);
            }
            round(neg, int as u128, 0, false, f, Rnd::Rn)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_f32_values() {
        for &x in &[1.0f32, -2.5, 1e-40, f32::MAX, f32::MIN_POSITIVE, 3.25, -0.0] {
            let b = x.to_bits() as u64;
            assert_eq!(convert(b, F32, F32, Rnd::Rn), b, "{x}");
        }
    }

    #[test]
    fn f16_conversions() {
        assert_eq!(f32_to_f16(1.0, Rnd::Rn), 0x3c00);
        assert_eq!(f32_to_f16(65504.0, Rnd::Rn), 0x7bff);
        assert_eq!(f32_to_f16(65520.0, Rnd::Rn), 0x7c00);
        assert_eq!(f32_to_f16(65520.0, Rnd::Rz), 0x7bff);
        assert_eq!(f32_to_f16(5.96e-8, Rnd::Rn), 0x0001);
        assert_eq!(f16_to_f32(0x3555), 0.33325195);
        assert_eq!(f16_to_f32(0x0001), 5.9604645e-8);
    }

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    fn interesting64(s: &mut u64) -> f64 {
        let r = xorshift(s);
        match r % 8 {
            0 => f64::from_bits(xorshift(s) & 0x800f_ffff_ffff_ffff), // subnormal
            1 => f64::from_bits(xorshift(s) % 8),                     // tiny
            2 => (xorshift(s) % 1000) as f64 - 500.0,
            _ => f64::from_bits(xorshift(s)),
        }
    }

    #[test]
    fn rn_matches_host_f64() {
        let mut s = 0x1234_5678_9abc_def1u64;
        for _ in 0..200_000 {
            let (a, b, c) = (interesting64(&mut s), interesting64(&mut s), interesting64(&mut s));
            // The host's result goes through black_box before its NaN test: optimised, LLVM
            // rewrote `sqrt(x).is_nan()` for a negative subnormal `x` into a test that said
            // no, and the reference itself was wrong.
            let fix = |x: f64| {
                let x = std::hint::black_box(x);
                if x.is_nan() { F64.nan() } else { x.to_bits() }
            };
            let (ab, bb, cb) = (a.to_bits(), b.to_bits(), c.to_bits());
            assert_eq!(add(ab, bb, F64, Rnd::Rn), fix(a + b), "{a:e}+{b:e}");
            assert_eq!(mul(ab, bb, F64, Rnd::Rn), fix(a * b), "{a:e}*{b:e}");
            assert_eq!(div(ab, bb, F64, Rnd::Rn), fix(a / b), "{a:e}/{b:e}");
            assert_eq!(fma(ab, bb, cb, F64, Rnd::Rn), fix(a.mul_add(b, c)), "fma {a:e} {b:e} {c:e}");
            assert_eq!(sqrt(ab, F64, Rnd::Rn), fix(a.sqrt()), "sqrt {a:e}");
        }
    }

    #[test]
    fn rn_matches_host_f32() {
        let mut s = 0x9876_5432_1fed_cba9u64;
        for _ in 0..200_000 {
            let pick = |s: &mut u64| {
                let r = xorshift(s);
                match r % 6 {
                    0 => f32::from_bits(xorshift(s) as u32 & 0x807f_ffff),
                    1 => (xorshift(s) % 100) as f32 - 50.0,
                    _ => f32::from_bits(xorshift(s) as u32),
                }
            };
            let (a, b, c) = (pick(&mut s), pick(&mut s), pick(&mut s));
            let fix = |x: f32| if x.is_nan() { NAN32 as u64 } else { x.to_bits() as u64 };
            let (ab, bb, cb) = (a.to_bits() as u64, b.to_bits() as u64, c.to_bits() as u64);
            assert_eq!(add(ab, bb, F32, Rnd::Rn), fix(a + b));
            assert_eq!(mul(ab, bb, F32, Rnd::Rn), fix(a * b));
            assert_eq!(div(ab, bb, F32, Rnd::Rn), fix(a / b));
            assert_eq!(fma(ab, bb, cb, F32, Rnd::Rn), fix(a.mul_add(b, c)));
            assert_eq!(sqrt(ab, F32, Rnd::Rn), fix(a.sqrt()));
            assert_eq!(
                convert(a.to_bits() as u64, F32, F64, Rnd::Rn),
                if a.is_nan() { F64.nan() } else { (a as f64).to_bits() }
            );
        }
    }

    /// Directed rounding checked against the host FPU running in that rounding mode (x86-64 MXCSR).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn directed_matches_host_mxcsr() {
        use std::arch::asm;
        fn with_mode<T>(mode: Rnd, f: impl FnOnce() -> T) -> T {
            let rc: u32 = match mode {
                Rnd::Rn => 0,
                Rnd::Rm => 1,
                Rnd::Rp => 2,
                Rnd::Rz => 3,
            };
            let mut old: u32 = 0;
            // SAFETY: stores the 4-byte MXCSR into `old`, a live u32.
            unsafe { asm!("stmxcsr [{}]", in(reg) &mut old) };
            let new = (old & !(3 << 13)) | (rc << 13);
            // SAFETY: loads MXCSR from `new`, only its rounding bits changed (no exception is
            // unmasked); restored below before the function returns.
            unsafe { asm!("ldmxcsr [{}]", in(reg) &new) };
            let r = f();
            // SAFETY: restores the MXCSR read above.
            unsafe { asm!("ldmxcsr [{}]", in(reg) &old) };
            r
        }
        fn hw64(op: u8, a: f64, b: f64, mode: Rnd) -> u64 {
            with_mode(mode, || {
                let mut x = a;
                // SAFETY: one SSE instruction on registers, touching no memory.
                #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs")]
                unsafe {
                    match op {
                        0 => asm!("addsd {x}, {y}", x = inout(xmm_reg) x, y = in(xmm_reg) b),
                        1 => asm!("mulsd {x}, {y}", x = inout(xmm_reg) x, y = in(xmm_reg) b),
                        2 => asm!("divsd {x}, {y}", x = inout(xmm_reg) x, y = in(xmm_reg) b),
                        _ => asm!("sqrtsd {x}, {x}", x = inout(xmm_reg) x),
                    }
                }
                x.to_bits()
            })
        }
        fn hw32(op: u8, a: f32, b: f32, mode: Rnd) -> u64 {
            with_mode(mode, || {
                let mut x = a;
                // SAFETY: one SSE instruction on registers, touching no memory.
                #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs")]
                unsafe {
                    match op {
                        0 => asm!("addss {x}, {y}", x = inout(xmm_reg) x, y = in(xmm_reg) b),
                        1 => asm!("mulss {x}, {y}", x = inout(xmm_reg) x, y = in(xmm_reg) b),
                        2 => asm!("divss {x}, {y}", x = inout(xmm_reg) x, y = in(xmm_reg) b),
                        3 => asm!("sqrtss {x}, {x}", x = inout(xmm_reg) x),
                        _ => {}
                    }
                }
                x.to_bits() as u64
            })
        }
        fn cvt(a: f64, mode: Rnd) -> u64 {
            with_mode(mode, || {
                let r: f32;
                // SAFETY: one SSE conversion on registers, touching no memory.
                unsafe { asm!("cvtsd2ss {r}, {x}", r = out(xmm_reg) r, x = in(xmm_reg) a) };
                r.to_bits() as u64
            })
        }
        let mut s = 0xdead_beef_cafe_f00du64;
        for i in 0..100_000 {
            let mode = [Rnd::Rz, Rnd::Rm, Rnd::Rp, Rnd::Rn][i % 4];
            let (a, b) = (interesting64(&mut s), interesting64(&mut s));
            if a.is_nan() || b.is_nan() {
                continue;
            }
            let canon = |x: u64| if f64::from_bits(x).is_nan() { F64.nan() } else { x };
            let (ab, bb) = (a.to_bits(), b.to_bits());
            assert_eq!(add(ab, bb, F64, mode), canon(hw64(0, a, b, mode)), "{a:e} + {b:e} {mode:?}");
            assert_eq!(mul(ab, bb, F64, mode), canon(hw64(1, a, b, mode)), "{a:e} * {b:e} {mode:?}");
            assert_eq!(div(ab, bb, F64, mode), canon(hw64(2, a, b, mode)), "{a:e} / {b:e} {mode:?}");
            assert_eq!(sqrt(ab, F64, mode), canon(hw64(3, a, b, mode)), "sqrt {a:e} {mode:?}");
            assert_eq!(
                convert(ab, F64, F32, mode),
                {
                    let r = cvt(a, mode);
                    if f32::from_bits(r as u32).is_nan() { NAN32 as u64 } else { r }
                },
                "cvt {a:e} {mode:?}"
            );
            let (x, y) = (f32::from_bits(xorshift(&mut s) as u32), f32::from_bits(xorshift(&mut s) as u32));
            if x.is_nan() || y.is_nan() {
                continue;
            }
            let c32 = |r: u64| if f32::from_bits(r as u32).is_nan() { NAN32 as u64 } else { r };
            let (xb, yb) = (x.to_bits() as u64, y.to_bits() as u64);
            for op in 0..4u8 {
                let ours = match op {
                    0 => add(xb, yb, F32, mode),
                    1 => mul(xb, yb, F32, mode),
                    2 => div(xb, yb, F32, mode),
                    _ => sqrt(xb, F32, mode),
                };
                assert_eq!(ours, c32(hw32(op, x, y, mode)), "op {op} {x:e} {y:e} {mode:?}");
            }
        }
    }
}
