//! Per-thread semantics of the arithmetic, logic, comparison and conversion instructions.
//!
//! Values travel as `u64` bit patterns; an operation reads the low `bits` of each operand (sign-extending for signed
//! types) and returns its result zero-extended, except that signed results narrower than 64 bits are returned
//! sign-extended (which is what PTX specifies when the destination register is wider than the instruction type).

use super::float::{self, Fmt, NAN32, Rnd};
use super::ir::*;

#[inline(always)]
pub fn trunc(v: u64, bits: u8) -> u64 {
    if bits >= 64 { v } else { v & ((1u64 << bits) - 1) }
}

#[inline(always)]
pub fn sext(v: u64, bits: u8) -> i64 {
    if bits >= 64 {
        v as i64
    } else {
        let sh = 64 - bits as u32;
        ((v << sh) as i64) >> sh
    }
}

/// The result register value of an integer of type `ty`.
#[inline(always)]
pub fn out_int(v: u64, ty: IntTy) -> u64 {
    if ty.signed { sext(v, ty.bits) as u64 } else { trunc(v, ty.bits) }
}

#[inline(always)]
fn read_int(v: u64, ty: IntTy) -> i128 {
    if ty.signed { sext(v, ty.bits) as i128 } else { trunc(v, ty.bits) as i128 }
}

fn int_min(ty: IntTy) -> i128 {
    if ty.signed { -(1i128 << (ty.bits - 1)) } else { 0 }
}

fn int_max(ty: IntTy) -> i128 {
    if ty.signed { (1i128 << (ty.bits - 1)) - 1 } else { (1i128 << ty.bits) - 1 }
}

#[inline(always)]
pub fn ibin(op: IBin, ty: IntTy, a: u64, b: u64) -> u64 {
    let bits = ty.bits;
    match op {
        IBin::Add => trunc(a.wrapping_add(b), bits),
        IBin::Sub => trunc(a.wrapping_sub(b), bits),
        IBin::MulLo => trunc(a.wrapping_mul(b), bits),
        IBin::MulHi => {
            let p = read_int(a, ty).wrapping_mul(read_int(b, ty));
            trunc((p >> bits) as u64, bits)
        }
        IBin::MulWide => {
            let p = read_int(a, ty).wrapping_mul(read_int(b, ty));
            trunc(p as u64, (bits * 2).min(64))
        }
        IBin::Mul24Lo | IBin::Mul24Hi => {
            let (x, y) = if ty.signed {
                (sext(a, 24) as i128, sext(b, 24) as i128)
            } else {
                (trunc(a, 24) as i128, trunc(b, 24) as i128)
            };
            let p = (x * y) as u64;
            if op == IBin::Mul24Lo { trunc(p, 32) } else { trunc(p >> 16, 32) }
        }
        IBin::Div => {
            if ty.signed {
                let (x, y) = (sext(a, bits), sext(b, bits));
                if y == 0 {
                    // What the GPU's division sequence yields: all ones, negated for a negative dividend.
                    return trunc(if x >= 0 { u64::MAX } else { 1 }, bits);
                }
                trunc(x.wrapping_div(y) as u64, bits)
            } else {
                let (x, y) = (trunc(a, bits), trunc(b, bits));
                x.checked_div(y).unwrap_or(trunc(u64::MAX, bits))
            }
        }
        IBin::Rem => {
            if ty.signed {
                let (x, y) = (sext(a, bits), sext(b, bits));
                if y == 0 {
                    // The GPU's remainder by zero is all ones.
                    return trunc(u64::MAX, bits);
                }
                trunc(x.wrapping_rem(y) as u64, bits)
            } else {
                let (x, y) = (trunc(a, bits), trunc(b, bits));
                if y == 0 { trunc(u64::MAX, bits) } else { x % y }
            }
        }
        IBin::Min => {
            if ty.signed {
                trunc(sext(a, bits).min(sext(b, bits)) as u64, bits)
            } else {
                trunc(a, bits).min(trunc(b, bits))
            }
        }
        IBin::Max => {
            if ty.signed {
                trunc(sext(a, bits).max(sext(b, bits)) as u64, bits)
            } else {
                trunc(a, bits).max(trunc(b, bits))
            }
        }
        IBin::And => trunc(a & b, bits),
        IBin::Or => trunc(a | b, bits),
        IBin::Xor => trunc(a ^ b, bits),
        IBin::Shl => {
            let s = b as u32;
            if s >= bits as u32 { 0 } else { trunc(a << s, bits) }
        }
        IBin::Shr => {
            let s = (b as u32).min(bits as u32 - 1 + (!ty.signed) as u32);
            if ty.signed {
                trunc((sext(a, bits) >> s.min(63)) as u64, bits)
            } else if s >= bits as u32 {
                0
            } else {
                trunc(a, bits) >> s
            }
        }
        IBin::AddSat | IBin::SubSat => {
            let (x, y) = (read_int(a, ty), read_int(b, ty));
            let r = if op == IBin::AddSat { x + y } else { x - y };
            trunc(r.clamp(int_min(ty), int_max(ty)) as u64, bits)
        }
    }
}

/// add/sub with carry: returns (result, carry-out).
#[inline(always)]
pub fn carry(sub: bool, cin: bool, bits: u8, a: u64, b: u64, cf: u64) -> (u64, u64) {
    let (a, b) = (trunc(a, bits) as u128, trunc(b, bits) as u128);
    let c = if cin { (cf & 1) as u128 } else { 0 };
    if sub {
        let r = a.wrapping_sub(b + c);
        (trunc(r as u64, bits), (a < b + c) as u64)
    } else {
        let r = a + b + c;
        (trunc(r as u64, bits), (r >> bits) as u64 & 1)
    }
}

/// Integer multiply-add: returns (result, carry-out of the addition).
pub fn mad(mode: MadMode, ty: IntTy, a: u64, b: u64, c: u64, cin: u64) -> (u64, u64) {
    let bits = ty.bits;
    let (x, y) = (read_int(a, ty), read_int(b, ty));
    let cin = (cin & 1) as u128;
    let add = |p: u64, w: u8| -> (u64, u64) {
        let r = trunc(p, w) as u128 + trunc(c, w) as u128 + cin;
        (trunc(r as u64, w), (r >> w) as u64 & 1)
    };
    match mode {
        MadMode::Lo => add(x.wrapping_mul(y) as u64, bits),
        MadMode::Hi => add((x.wrapping_mul(y) >> bits) as u64, bits),
        MadMode::Wide => {
            let w = (bits * 2).min(64);
            add(x.wrapping_mul(y) as u64, w)
        }
        MadMode::HiSat => {
            let r = (x.wrapping_mul(y) >> bits) + read_int(c, ty);
            (trunc(r.clamp(int_min(ty), int_max(ty)) as u64, bits), 0)
        }
        MadMode::Lo24 | MadMode::Hi24 => {
            let op = if mode == MadMode::Lo24 { IBin::Mul24Lo } else { IBin::Mul24Hi };
            add(ibin(op, ty, a, b), 32)
        }
    }
}

pub fn iun(op: IUn, ty: IntTy, a: u64) -> u64 {
    let bits = ty.bits;
    let v = trunc(a, bits);
    match op {
        IUn::Neg => trunc(v.wrapping_neg(), bits),
        IUn::Abs => trunc(sext(a, bits).unsigned_abs(), bits),
        IUn::Not => trunc(!v, bits),
        IUn::Cnot => (v == 0) as u64,
        IUn::Popc => v.count_ones() as u64,
        IUn::Clz => (v.leading_zeros() - (64 - bits as u32)) as u64,
        IUn::Brev => trunc(v.reverse_bits() >> (64 - bits as u32), bits),
        IUn::Bfind | IUn::BfindShift => {
            // Position of the most significant non-sign bit.
            let x = if ty.signed && sext(a, bits) < 0 { trunc(!v, bits) } else { v };
            if x == 0 {
                return 0xffff_ffff;
            }
            let pos = 63 - x.leading_zeros() as u64;
            if op == IUn::BfindShift { bits as u64 - 1 - pos } else { pos }
        }
    }
}

pub fn bfe(ty: IntTy, a: u64, b: u64, c: u64) -> u64 {
    let bits = ty.bits as u64;
    // 32-bit bfe is a hardware instruction that reads 8 bits of position and length; the 64-bit form is emulated and
    // reads them whole (an H100 fills with the sign for position 0x80000000).
    let (pos, len) =
        if bits == 64 { ((b & 0xffff_ffff).min(255), (c & 0xffff_ffff).min(255)) } else { (b & 0xff, c & 0xff) };
    let v = trunc(a, ty.bits);
    let sbit =
        if ty.signed { if len == 0 { false } else { (v >> (pos + len - 1).min(bits - 1)) & 1 != 0 } } else { false };
    let mut d = 0u64;
    for i in 0..bits {
        let bit = if i < len && pos + i < bits { (v >> (pos + i)) & 1 != 0 } else { sbit };
        d |= (bit as u64) << i;
    }
    out_int(d, ty)
}

pub fn bfi(bits: u8, a: u64, b: u64, c: u64, e: u64) -> u64 {
    let w = bits as u64;
    let pos = c & 0xff;
    let len = e & 0xff;
    let mut d = trunc(b, bits);
    let mut i = 0;
    while i < len && pos + i < w {
        let bit = (a >> i) & 1;
        d = (d & !(1 << (pos + i))) | (bit << (pos + i));
        i += 1;
    }
    d
}

pub fn prmt(mode: u8, a: u64, b: u64, c: u64) -> u64 {
    let bytes = (trunc(b, 32) << 32) | trunc(a, 32);
    let byte = |i: u64| (bytes >> (8 * (i & 7))) & 0xff;
    let c = c as u32;
    let sel = |i: u32| -> u64 {
        let s = (c >> (4 * i)) & 0xf;
        let v = byte(s as u64 & 7);
        if s & 8 != 0 { if v & 0x80 != 0 { 0xff } else { 0 } } else { v }
    };
    let n = (c & 3) as u64;
    let d: [u64; 4] = match mode {
        0 => [sel(0), sel(1), sel(2), sel(3)],
        // f4e: forward 4 extract
        1 => [byte(n), byte(n + 1), byte(n + 2), byte(n + 3)],
        // b4e: backward 4 extract
        2 => [byte(n), byte(n.wrapping_sub(1)), byte(n.wrapping_sub(2)), byte(n.wrapping_sub(3))],
        // rc8: replicate one byte
        3 => [byte(n); 4],
        // ecl/ecr: edge clamp left/right
        4 => [byte(n), byte(n.max(1)), byte(n.max(2)), byte(3)],
        5 => [byte(0), byte(n.min(1)), byte(n.min(2)), byte(n)],
        // rc16: replicate one half-word
        _ => {
            let lo = (n & 1) * 2;
            [byte(lo), byte(lo + 1), byte(lo), byte(lo + 1)]
        }
    };
    d[0] | d[1] << 8 | d[2] << 16 | d[3] << 24
}

pub fn shf(left: bool, clamp: bool, a: u64, b: u64, c: u64) -> u64 {
    let n = if clamp { (c as u32).min(32) } else { c as u32 & 31 };
    let v = (trunc(b, 32) << 32) | trunc(a, 32);
    if left { trunc((v << n) >> 32, 32) } else { trunc(v >> n, 32) }
}

/// `bmsk`: `b` one bits from bit `a` (the PTX ISA's semantics: a width that reaches past bit
/// 31 ends there; a position of 32 or more is an empty mask with `.clamp`, and position and
/// width are taken modulo 32 with `.wrap`).
pub fn bmsk(clamp: bool, a: u64, b: u64) -> u64 {
    let (a, b) = (a as u32, b as u32);
    let (a1, b1) = (a & 31, b & 31);
    let mask0 = if clamp && a >= 32 { 0 } else { u32::MAX << a1 };
    let to_the_top = a1 + b1 >= 32 || (clamp && (a >= 32 || b >= 32));
    let mask1 = if to_the_top {
        0
    } else if b1 == 0 {
        u32::MAX
    } else {
        u32::MAX << (a1 + b1)
    };
    u64::from(mask0 & !mask1)
}

/// `szext`: the low `b` bits of `a` (`b` at most 32 with `.clamp`, modulo 32 with `.wrap`),
/// sign- or zero-extended; none is 0.
pub fn szext(clamp: bool, signed: bool, a: u64, b: u64) -> u64 {
    let n = if clamp { (b as u32).min(32) } else { b as u32 & 31 } as u8;
    if n == 0 {
        return 0;
    }
    let ty = IntTy { bits: 32, signed };
    if signed { out_int(sext(a, n) as u64, ty) } else { trunc(a, n) }
}

pub fn lop3(a: u64, b: u64, c: u64, lut: u8) -> u64 {
    let mut d = 0u64;
    for k in 0..8u8 {
        if lut & (1 << k) != 0 {
            let ma = if k & 4 != 0 { a } else { !a };
            let mb = if k & 2 != 0 { b } else { !b };
            let mc = if k & 1 != 0 { c } else { !c };
            d |= ma & mb & mc;
        }
    }
    trunc(d, 32)
}

pub fn sad(ty: IntTy, a: u64, b: u64, c: u64) -> u64 {
    let (x, y) = (read_int(a, ty), read_int(b, ty));
    trunc(((x - y).unsigned_abs() as u64).wrapping_add(c), ty.bits)
}

pub fn dp(kind: u8, asg: bool, bsg: bool, a: u64, b: u64, c: u64) -> u64 {
    let part = |v: u64, i: u32, w: u32, s: bool| -> i64 {
        let x = (v >> (i * w)) & ((1 << w) - 1);
        if s { sext(x, w as u8) } else { x as i64 }
    };
    let mut acc = c as u32 as i32 as i64;
    if kind == 4 {
        for i in 0..4 {
            acc = acc.wrapping_add(part(a, i, 8, asg) * part(b, i, 8, bsg));
        }
    } else {
        let base = if kind == 3 { 2 } else { 0 };
        for i in 0..2 {
            acc = acc.wrapping_add(part(a, i, 16, asg) * part(b, base + i, 8, bsg));
        }
    }
    trunc(acc as u64, 32)
}

// ----- floating point -----

#[inline(always)]
pub fn f32_in(a: u64, ftz: bool) -> f32 {
    let b = a as u32;
    if ftz && b & 0x7f80_0000 == 0 { f32::from_bits(b & 0x8000_0000) } else { f32::from_bits(b) }
}

#[inline(always)]
pub fn f32_out(x: f32, m: FMode) -> u64 {
    let mut b = x.to_bits();
    if x.is_nan() {
        return if m.sat { 0 } else { NAN32 as u64 };
    }
    if m.ftz && b & 0x7f80_0000 == 0 {
        b &= 0x8000_0000;
    }
    if m.sat {
        let v = f32::from_bits(b);
        b = if v <= 0.0 {
            0
        } else if v >= 1.0 {
            1.0f32.to_bits()
        } else {
            b
        };
    }
    b as u64
}

/// An f64 result: NaNs follow the GPU's propagation rule over the operands `ins`.
#[inline(always)]
pub fn f64_out(x: f64, sat: bool, ins: &[u64]) -> u64 {
    if x.is_nan() {
        return if sat { 0 } else { float::nan64(ins) };
    }
    if sat {
        return if x <= 0.0 {
            0
        } else if x >= 1.0 {
            1.0f64.to_bits()
        } else {
            x.to_bits()
        };
    }
    x.to_bits()
}

fn half_fmt(ty: FTy) -> Fmt {
    match ty {
        FTy::F16 | FTy::F16x2 => float::F16,
        _ => float::BF16,
    }
}

/// Applies `f` to each 16-bit half (for x2 types) or to the single value.
fn halves(ty: FTy, a: u64, b: u64, c: u64, f: impl Fn(u64, u64, u64) -> u64) -> u64 {
    match ty {
        FTy::F16x2 | FTy::BF16x2 => {
            let lo = f(a & 0xffff, b & 0xffff, c & 0xffff) & 0xffff;
            let hi = f((a >> 16) & 0xffff, (b >> 16) & 0xffff, (c >> 16) & 0xffff) & 0xffff;
            lo | hi << 16
        }
        _ => f(a & 0xffff, b & 0xffff, c & 0xffff) & 0xffff,
    }
}

fn half_sat(bits: u64, f: Fmt, sat: bool) -> u64 {
    if !sat {
        return bits;
    }
    if f.is_nan(bits) || f.neg(bits) {
        return 0;
    }
    let one = float::convert(1.0f32.to_bits() as u64, float::F32, f, Rnd::Rn);
    let v = float::unpack(bits, f);
    match v {
        float::Val::Inf(false) => one,
        float::Val::Fin(false, ..) => {
            if float::convert(bits, f, float::F64, Rnd::Rn) >= 1.0f64.to_bits() {
                one
            } else {
                bits
            }
        }
        _ => bits,
    }
}

fn fminmax_f64(x: f64, y: f64, max: bool, nan_prop: bool) -> f64 {
    if x.is_nan() || y.is_nan() {
        if nan_prop || (x.is_nan() && y.is_nan()) {
            return f64::NAN;
        }
        return if x.is_nan() { y } else { x };
    }
    if x == y {
        // -0 vs +0: min prefers -0, max prefers +0.
        let xn = x.is_sign_negative();
        return if max == xn { y } else { x };
    }
    if (x < y) != max { x } else { y }
}

pub fn fbin(op: FBin, ty: FTy, m: FMode, a: u64, b: u64) -> u64 {
    match ty {
        FTy::F32 => {
            let (x, y) = (f32_in(a, m.ftz), f32_in(b, m.ftz));
            let r = match op {
                FBin::Add if m.rnd == Rnd::Rn => x + y,
                FBin::Sub if m.rnd == Rnd::Rn => x - y,
                FBin::Mul if m.rnd == Rnd::Rn => x * y,
                FBin::Div if m.rnd == Rnd::Rn => x / y,
                FBin::DivApprox if y.is_finite() && y.abs() > f32::from_bits(0x7e80_0000) => {
                    // The approximation multiplies by rcp(y), which flushes to zero for |y| > 2^126.
                    x * 0.0f32.copysign(y)
                }
                FBin::DivFull | FBin::DivApprox => x / y,
                FBin::Add => {
                    f32::from_bits(float::add(x.to_bits() as u64, y.to_bits() as u64, float::F32, m.rnd) as u32)
                }
                FBin::Sub => {
                    f32::from_bits(float::sub(x.to_bits() as u64, y.to_bits() as u64, float::F32, m.rnd) as u32)
                }
                FBin::Mul => {
                    f32::from_bits(float::mul(x.to_bits() as u64, y.to_bits() as u64, float::F32, m.rnd) as u32)
                }
                FBin::Div => {
                    f32::from_bits(float::div(x.to_bits() as u64, y.to_bits() as u64, float::F32, m.rnd) as u32)
                }
                FBin::Min | FBin::Max | FBin::MinNan | FBin::MaxNan => {
                    let max = matches!(op, FBin::Max | FBin::MaxNan);
                    fminmax_f64(x as f64, y as f64, max, matches!(op, FBin::MinNan | FBin::MaxNan)) as f32
                }
            };
            f32_out(r, m)
        }
        FTy::F64 => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            let r = match op {
                FBin::Add if m.rnd == Rnd::Rn => x + y,
                FBin::Sub if m.rnd == Rnd::Rn => x - y,
                FBin::Mul if m.rnd == Rnd::Rn => x * y,
                FBin::Div | FBin::DivFull | FBin::DivApprox if m.rnd == Rnd::Rn => x / y,
                FBin::Add => f64::from_bits(float::add(a, b, float::F64, m.rnd)),
                FBin::Sub => f64::from_bits(float::sub(a, b, float::F64, m.rnd)),
                FBin::Mul => f64::from_bits(float::mul(a, b, float::F64, m.rnd)),
                FBin::Div | FBin::DivFull | FBin::DivApprox => f64::from_bits(float::div(a, b, float::F64, m.rnd)),
                FBin::Min | FBin::Max | FBin::MinNan | FBin::MaxNan => {
                    let max = matches!(op, FBin::Max | FBin::MaxNan);
                    fminmax_f64(x, y, max, matches!(op, FBin::MinNan | FBin::MaxNan))
                }
            };
            f64_out(r, m.sat, &[a, b])
        }
        _ => {
            let f = half_fmt(ty);
            halves(ty, a, b, 0, |x, y, _| {
                let (x, y) = if m.ftz { (f.flush(x), f.flush(y)) } else { (x, y) };
                let r = match op {
                    FBin::Add => float::add(x, y, f, m.rnd),
                    FBin::Sub => float::sub(x, y, f, m.rnd),
                    FBin::Mul => float::mul(x, y, f, m.rnd),
                    _ => {
                        let (xf, yf) = (half_to_f64(x, f), half_to_f64(y, f));
                        let max = matches!(op, FBin::Max | FBin::MaxNan);
                        let r = fminmax_f64(xf, yf, max, matches!(op, FBin::MinNan | FBin::MaxNan));
                        if r.is_nan() {
                            f.nan()
                        } else if r.to_bits() == xf.to_bits() {
                            x
                        } else {
                            y
                        }
                    }
                };
                let r = if m.ftz { f.flush(r) } else { r };
                half_sat(r, f, m.sat)
            })
        }
    }
}

fn half_to_f64(x: u64, f: Fmt) -> f64 {
    f64::from_bits(float::convert(x, f, float::F64, Rnd::Rn))
}

pub fn ffma(ty: FTy, m: FMode, a: u64, b: u64, c: u64) -> u64 {
    match ty {
        FTy::F32 => {
            let (x, y, z) = (f32_in(a, m.ftz), f32_in(b, m.ftz), f32_in(c, m.ftz));
            let r = if m.rnd == Rnd::Rn {
                x.mul_add(y, z)
            } else {
                f32::from_bits(
                    float::fma(x.to_bits() as u64, y.to_bits() as u64, z.to_bits() as u64, float::F32, m.rnd) as u32,
                )
            };
            f32_out(r, m)
        }
        FTy::F64 => {
            let r = if m.rnd == Rnd::Rn {
                f64::from_bits(a).mul_add(f64::from_bits(b), f64::from_bits(c))
            } else {
                f64::from_bits(float::fma(a, b, c, float::F64, m.rnd))
            };
            f64_out(r, m.sat, &[a, b, c])
        }
        _ => {
            let f = half_fmt(ty);
            halves(ty, a, b, c, |x, y, z| {
                let (x, y, z) = if m.ftz { (f.flush(x), f.flush(y), f.flush(z)) } else { (x, y, z) };
                let r = float::fma(x, y, z, f, m.rnd);
                let r = if m.ftz { f.flush(r) } else { r };
                half_sat(r, f, m.sat)
            })
        }
    }
}

pub fn fun(op: FUn, ty: FTy, m: FMode, a: u64) -> u64 {
    match ty {
        FTy::F32 => {
            let x = f32_in(a, m.ftz);
            let approx = |v: f64| v as f32;
            let r = match op {
                FUn::Neg => return f32_out_raw(f32_in(a, m.ftz).to_bits() ^ 0x8000_0000, x.is_nan(), m),
                FUn::Abs => return f32_out_raw(f32_in(a, m.ftz).to_bits() & 0x7fff_ffff, x.is_nan(), m),
                FUn::Sqrt if m.rnd == Rnd::Rn => x.sqrt(),
                FUn::Sqrt => f32::from_bits(float::sqrt(x.to_bits() as u64, float::F32, m.rnd) as u32),
                FUn::SqrtApprox => x.sqrt(),
                FUn::Rsqrt => approx(1.0 / (x as f64).sqrt()),
                FUn::Rcp if m.rnd == Rnd::Rn => 1.0 / x,
                FUn::Rcp => {
                    f32::from_bits(float::div(1.0f32.to_bits() as u64, x.to_bits() as u64, float::F32, m.rnd) as u32)
                }
                FUn::RcpApprox | FUn::RcpApproxF64 => approx(1.0 / x as f64),
                FUn::Sin => sincos_approx(x, false),
                FUn::Cos => sincos_approx(x, true),
                FUn::Lg2 => approx((x as f64).log2()),
                FUn::Ex2 => approx((x as f64).exp2()),
                FUn::Tanh => approx((x as f64).tanh()),
            };
            f32_out(r, m)
        }
        FTy::F64 => {
            let x = f64::from_bits(a);
            let r = match op {
                FUn::Neg => return if x.is_nan() { float::nan64(&[a]) } else { a ^ (1 << 63) },
                FUn::Abs => return if x.is_nan() { float::nan64(&[a]) } else { a & !(1 << 63) },
                FUn::Sqrt | FUn::SqrtApprox if m.rnd == Rnd::Rn => x.sqrt(),
                FUn::Sqrt | FUn::SqrtApprox => f64::from_bits(float::sqrt(a, float::F64, m.rnd)),
                FUn::Rsqrt => 1.0 / x.sqrt(),
                FUn::Rcp if m.rnd == Rnd::Rn => 1.0 / x,
                FUn::Rcp => f64::from_bits(float::div(1.0f64.to_bits(), a, float::F64, m.rnd)),
                FUn::RcpApprox | FUn::RcpApproxF64 => return rcp_approx_f64(a),
                FUn::Sin => x.sin(),
                FUn::Cos => x.cos(),
                FUn::Lg2 => x.log2(),
                FUn::Ex2 => x.exp2(),
                FUn::Tanh => x.tanh(),
            };
            f64_out(r, m.sat, &[a])
        }
        _ => {
            let f = half_fmt(ty);
            halves(ty, a, 0, 0, |x, _, _| {
                let x = if m.ftz { f.flush(x) } else { x };
                match op {
                    FUn::Neg => {
                        if f.is_nan(x) {
                            f.nan()
                        } else {
                            x ^ (1 << 15)
                        }
                    }
                    FUn::Abs => {
                        if f.is_nan(x) {
                            f.nan()
                        } else {
                            x & 0x7fff
                        }
                    }
                    _ => {
                        let v = half_to_f64(x, f);
                        let r = match op {
                            FUn::Ex2 => v.exp2(),
                            FUn::Tanh => v.tanh(),
                            FUn::Sqrt | FUn::SqrtApprox => v.sqrt(),
                            FUn::Rsqrt => 1.0 / v.sqrt(),
                            FUn::Rcp | FUn::RcpApprox => 1.0 / v,
                            FUn::Sin => v.sin(),
                            FUn::Cos => v.cos(),
                            FUn::Lg2 => v.log2(),
                            _ => v,
                        };
                        float::convert(r.to_bits(), float::F64, f, Rnd::Rn)
                    }
                }
            })
        }
    }
}

/// `sin.approx.f32`/`cos.approx.f32` the way the GPU computes them: the argument is scaled to revolutions by an f32
/// multiplication with 1/(2 pi) and only the fraction of a revolution is kept, so huge arguments give the same
/// results as on the GPU (for instance sin(2^31) = 0); the function of the fraction is then computed accurately,
/// where the hardware's is accurate to about 1e-6.
fn sincos_approx(x: f32, cos: bool) -> f32 {
    if !x.is_finite() {
        return f32::NAN;
    }
    let t = (x.abs() * 0.159_154_94_f32) as f64;
    let r = t - t.floor();
    let tau = std::f64::consts::TAU;
    // Reduce to half a revolution so that r = 1/2 gives exact values (sin -0, cos -1), as on the GPU.
    let v = match (r < 0.5, cos) {
        (true, false) => (tau * r).sin(),
        (false, false) => -(tau * (r - 0.5)).sin(),
        (true, true) => (tau * r).cos(),
        (false, true) => -(tau * (r - 0.5)).cos(),
    };
    let v = v as f32;
    if !cos && x.is_sign_negative() { -v } else { v }
}

/// `rcp.approx.ftz.f64`: the hardware reads only the high word of the operand and produces only the high word of
/// the result (the low word is zero).
fn rcp_approx_f64(a: u64) -> u64 {
    let hi = a & 0xffff_ffff_0000_0000;
    let x = f64::from_bits(hi);
    if x.is_nan() {
        return 0x7fff_ffff_0000_0000;
    }
    let exp = (a >> 52) & 0x7ff;
    if exp == 0 {
        // Subnormal (flushed) or zero: infinity of the same sign.
        return (a & (1 << 63)) | 0x7ff0_0000_0000_0000;
    }
    let r = 1.0 / x;
    if !r.is_finite() || r == 0.0 {
        return r.to_bits();
    }
    let hi = r.to_bits() & 0xffff_ffff_0000_0000;
    // Subnormal results are flushed (.ftz).
    if hi & 0x7ff0_0000_0000_0000 == 0 { hi & (1 << 63) } else { hi }
}

fn f32_out_raw(bits: u32, nan: bool, m: FMode) -> u64 {
    if nan {
        return NAN32 as u64;
    }
    f32_out(f32::from_bits(bits), m)
}

pub fn compare(cmp: Cmp, ty: CmpTy, a: u64, b: u64) -> bool {
    match ty {
        CmpTy::Int(t) => {
            let (x, y) = (read_int(a, t), read_int(b, t));
            let (ux, uy) = (trunc(a, t.bits), trunc(b, t.bits));
            match cmp {
                Cmp::Eq => x == y,
                Cmp::Ne => x != y,
                Cmp::Lt => x < y,
                Cmp::Le => x <= y,
                Cmp::Gt => x > y,
                Cmp::Ge => x >= y,
                Cmp::Lo => ux < uy,
                Cmp::Ls => ux <= uy,
                Cmp::Hi => ux > uy,
                Cmp::Hs => ux >= uy,
                _ => false,
            }
        }
        CmpTy::Float(ft, ftz) => {
            let (x, y) = match ft {
                FTy::F32 => (f32_in(a, ftz) as f64, f32_in(b, ftz) as f64),
                FTy::F64 => (f64::from_bits(a), f64::from_bits(b)),
                _ => {
                    let f = half_fmt(ft);
                    (half_to_f64(a & 0xffff, f), half_to_f64(b & 0xffff, f))
                }
            };
            let nan = x.is_nan() || y.is_nan();
            match cmp {
                Cmp::Eq => x == y,
                Cmp::Ne => !nan && x != y,
                Cmp::Lt | Cmp::Lo => x < y,
                Cmp::Le | Cmp::Ls => x <= y,
                Cmp::Gt | Cmp::Hi => x > y,
                Cmp::Ge | Cmp::Hs => x >= y,
                Cmp::Equ => nan || x == y,
                Cmp::Neu => nan || x != y,
                Cmp::Ltu => nan || x < y,
                Cmp::Leu => nan || x <= y,
                Cmp::Gtu => nan || x > y,
                Cmp::Geu => nan || x >= y,
                Cmp::Num => !nan,
                Cmp::Nan => nan,
            }
        }
    }
}

pub fn testp(op: Testp, f64_: bool, a: u64) -> bool {
    let x = if f64_ { f64::from_bits(a) } else { f32::from_bits(a as u32) as f64 };
    let sub = if f64_ { x.is_subnormal() } else { f32::from_bits(a as u32).is_subnormal() };
    match op {
        Testp::Finite => x.is_finite(),
        Testp::Infinite => x.is_infinite(),
        Testp::Number => !x.is_nan(),
        Testp::NotANumber => x.is_nan(),
        // The GPU counts zeros as normal.
        Testp::Normal => x.is_finite() && !sub,
        Testp::Subnormal => sub,
    }
}

fn cvt_fmt(t: CvtTy) -> Fmt {
    match t {
        CvtTy::F16 => float::F16,
        CvtTy::BF16 => float::BF16,
        CvtTy::F64 => float::F64,
        _ => float::F32,
    }
}

/// Rounds an f64 that holds an integral-or-not value to an integer in mode `r`.
fn round_f64(x: f64, r: Rnd) -> f64 {
    match r {
        Rnd::Rn => x.round_ties_even(),
        Rnd::Rz => x.trunc(),
        Rnd::Rm => x.floor(),
        Rnd::Rp => x.ceil(),
    }
}

fn sat_float(bits: u64, f: Fmt) -> u64 {
    if f.is_nan(bits) || f.neg(bits) {
        return 0;
    }
    let one = float::convert(1.0f64.to_bits(), float::F64, f, Rnd::Rn);
    if float::convert(bits, f, float::F64, Rnd::Rn) >= 1.0f64.to_bits() { one } else { bits }
}

pub fn cvt(to: CvtTy, from: CvtTy, rnd: CvtRnd, sat: bool, ftz: bool, relu: bool, a: u64) -> u64 {
    match (to, from) {
        (CvtTy::Int(t), CvtTy::Int(f)) => {
            let v = read_int(a, f);
            let v = if sat { v.clamp(int_min(t), int_max(t)) } else { v };
            out_int(v as u64, t)
        }
        (CvtTy::Int(t), _) => {
            let r = match rnd {
                CvtRnd::Int(r) | CvtRnd::Float(r) => r,
                _ => Rnd::Rz,
            };
            let x = match from {
                CvtTy::F32 | CvtTy::TF32 => f32_in(a, ftz) as f64,
                CvtTy::F64 => f64::from_bits(a),
                _ => half_to_f64(a & 0xffff, cvt_fmt(from)),
            };
            if x.is_nan() {
                // What an H100 returns: the integer indefinite for 64-bit results and for 32-bit results from f64,
                // zero otherwise.
                return match (t.bits, from) {
                    (64, _) => 1 << 63,
                    (32, CvtTy::F64) => out_int(0x8000_0000, t),
                    _ => 0,
                };
            }
            let x = round_f64(x, r);
            let v = if x <= int_min(t) as f64 {
                int_min(t)
            } else if x >= int_max(t) as f64 {
                int_max(t)
            } else {
                x as i128
            };
            out_int(v as u64, t)
        }
        (_, CvtTy::Int(f)) => {
            let r = match rnd {
                CvtRnd::Float(r) | CvtRnd::Int(r) => r,
                _ => Rnd::Rn,
            };
            let v = read_int(a, f);
            let fmt = cvt_fmt(to);
            let bits = match (to, r) {
                (CvtTy::F32, Rnd::Rn) => {
                    (if f.signed { (v as i64) as f32 } else { (v as u64) as f32 }).to_bits() as u64
                }
                (CvtTy::F64, Rnd::Rn) => (if f.signed { (v as i64) as f64 } else { (v as u64) as f64 }).to_bits(),
                _ => float::from_int(v < 0, v.unsigned_abs() as u64, fmt, r),
            };
            let bits = if relu && fmt.neg(bits) { 0 } else { bits };
            if sat { sat_float(bits, fmt) } else { bits }
        }
        _ => {
            let (ff, tf) = (cvt_fmt(from), cvt_fmt(to));
            let mut x = a & if ff == float::F64 {
                u64::MAX
            } else if ff == float::F32 {
                0xffff_ffff
            } else {
                0xffff
            };
            if ftz && ff == float::F32 {
                x = ff.flush(x);
            }
            let mut r = if to == CvtTy::TF32 {
                // Round to 10 fraction bits, ties away from zero; the result stays in f32 format.
                let v = x as u32;
                if ff.is_nan(x) {
                    ((v | 0x0040_0000) & 0xffff_e000) as u64
                } else if v & 0x7f80_0000 == 0x7f80_0000 {
                    v as u64
                } else {
                    let rounded = match rnd {
                        CvtRnd::Float(Rnd::Rz) => v,
                        _ => v.wrapping_add(0x1000),
                    };
                    (rounded & 0xffff_e000) as u64
                }
            } else if ff == float::F32 && tf == float::F64 && ff.is_nan(x) {
                // Widening keeps the payload (quietened), as x86 does.
                ((x & 0x8000_0000) << 32) | 0x7ff8_0000_0000_0000 | ((x & 0x3f_ffff) << 29)
            } else if ff == float::F64 && tf != float::F64 && ff.is_nan(x) {
                // Narrowing from f64 keeps the sign and the top payload bits (quietened).
                let sign = x >> 63;
                let payload = x & 0x000f_ffff_ffff_ffff;
                if tf == float::F32 {
                    (sign << 31) | 0x7fc0_0000 | ((payload >> 29) & 0x3f_ffff)
                } else if tf == float::F16 {
                    (sign << 15) | 0x7e00 | ((payload >> 42) & 0x1ff)
                } else {
                    (sign << 15) | 0x7fc0 | ((payload >> 45) & 0x3f)
                }
            } else if ff == tf {
                match rnd {
                    CvtRnd::Int(_) if ff == float::F64 && ff.is_nan(x) => float::nan64(&[x]),
                    CvtRnd::Int(r) => float::round_integral(x, ff, r),
                    _ => {
                        if ff.is_nan(x) {
                            if ff == float::F64 { float::nan64(&[x]) } else { ff.nan() }
                        } else {
                            x
                        }
                    }
                }
            } else {
                let r = match rnd {
                    CvtRnd::Float(r) | CvtRnd::Int(r) => r,
                    _ => Rnd::Rn,
                };
                if ff == float::F64 && tf == float::F32 {
                    float::f64_to_f32(f64::from_bits(x), r) as u64
                } else {
                    float::convert(x, ff, tf, r)
                }
            };
            if tf == float::F32 && ftz {
                r = tf.flush(r);
            }
            if relu && (tf.neg(r) && !tf.is_nan(r)) {
                r = 0;
            }
            if sat { sat_float(r, tf) } else { r }
        }
    }
}

/// `cvt.rn.f16x2.f32 d, a, b`: `a` goes to the upper half.
pub fn cvt_pack(to: CvtTy, rnd: Rnd, relu: bool, sat: bool, a: u64, b: u64) -> u64 {
    let one = |x: u64| cvt(to, CvtTy::F32, CvtRnd::Float(rnd), sat, false, relu, x) & 0xffff;
    one(a) << 16 | one(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U32: IntTy = IntTy { bits: 32, signed: false };
    const S32: IntTy = IntTy { bits: 32, signed: true };
    const U64: IntTy = IntTy { bits: 64, signed: false };
    const S64: IntTy = IntTy { bits: 64, signed: true };

    fn xs(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    fn pick(s: &mut u64) -> u64 {
        match xs(s) % 6 {
            0 => xs(s) % 70,
            1 => 0x8000_0000,
            2 => u64::MAX - xs(s) % 4,
            _ => xs(s),
        }
    }

    #[test]
    fn integer_ops_match_rust() {
        let mut s = 0x1357_9bdf_2468_ace0;
        for _ in 0..100_000 {
            let (a, b) = (pick(&mut s), pick(&mut s));
            let (a32, b32) = (a as u32, b as u32);
            assert_eq!(ibin(IBin::Add, U32, a, b), a32.wrapping_add(b32) as u64);
            assert_eq!(ibin(IBin::Sub, U32, a, b), a32.wrapping_sub(b32) as u64);
            assert_eq!(ibin(IBin::MulLo, S32, a, b), (a32 as i32).wrapping_mul(b32 as i32) as u32 as u64);
            assert_eq!(ibin(IBin::MulHi, S32, a, b), (((a32 as i32 as i64) * (b32 as i32 as i64)) >> 32) as u32 as u64);
            assert_eq!(ibin(IBin::MulHi, U64, a, b), ((a as u128 * b as u128) >> 64) as u64);
            assert_eq!(ibin(IBin::MulHi, S64, a, b), ((a as i64 as i128 * b as i64 as i128) >> 64) as u64);
            assert_eq!(ibin(IBin::MulWide, S32, a, b), ((a32 as i32 as i64) * (b32 as i32 as i64)) as u64);
            assert_eq!(ibin(IBin::MulWide, U32, a, b), a32 as u64 * b32 as u64);
            if let Some(q) = a32.checked_div(b32) {
                assert_eq!(ibin(IBin::Div, U32, a, b), q as u64);
                assert_eq!(ibin(IBin::Rem, U32, a, b), (a32 % b32) as u64);
                assert_eq!(ibin(IBin::Div, S32, a, b), (a32 as i32).wrapping_div(b32 as i32) as u32 as u64);
                assert_eq!(ibin(IBin::Rem, S32, a, b), (a32 as i32).wrapping_rem(b32 as i32) as u32 as u64);
            }
            if b != 0 {
                assert_eq!(ibin(IBin::Div, S64, a, b), (a as i64).wrapping_div(b as i64) as u64);
                assert_eq!(ibin(IBin::Rem, U64, a, b), a % b);
            }
            assert_eq!(ibin(IBin::Min, S32, a, b), (a32 as i32).min(b32 as i32) as u32 as u64);
            assert_eq!(ibin(IBin::Max, U32, a, b), a32.max(b32) as u64);
            let sh = b32 % 40;
            assert_eq!(ibin(IBin::Shl, U32, a, sh as u64), a32.checked_shl(sh).unwrap_or(0) as u64);
            assert_eq!(ibin(IBin::Shr, U32, a, sh as u64), a32.checked_shr(sh).unwrap_or(0) as u64);
            assert_eq!(ibin(IBin::Shr, S32, a, sh as u64), ((a32 as i32) >> sh.min(31)) as u32 as u64);
            assert_eq!(iun(IUn::Popc, U32, a), a32.count_ones() as u64);
            assert_eq!(iun(IUn::Clz, U64, a), a.leading_zeros() as u64);
            assert_eq!(iun(IUn::Brev, U32, a), a32.reverse_bits() as u64);
            assert_eq!(iun(IUn::Abs, S32, a), (a32 as i32).wrapping_abs() as u32 as u64);
            let (r, c) = carry(false, false, 32, a, b, 0);
            let (r2, c2) = a32.overflowing_add(b32);
            assert_eq!((r, c), (r2 as u64, c2 as u64));
            let (r, c) = carry(true, true, 32, a, b, 1);
            assert_eq!(r, a32.wrapping_sub(b32).wrapping_sub(1) as u64);
            assert_eq!(c, ((a32 as u64) < b32 as u64 + 1) as u64);
        }
    }

    #[test]
    fn edge_cases() {
        assert_eq!(ibin(IBin::Div, U32, 5, 0), 0xffff_ffff);
        assert_eq!(ibin(IBin::Div, S32, 5, 0), 0xffff_ffff);
        assert_eq!(ibin(IBin::Div, S32, (-5i32) as u32 as u64, 0), 1);
        assert_eq!(ibin(IBin::Rem, U32, 7, 0), 0xffff_ffff);
        assert_eq!(ibin(IBin::Div, S32, 0x8000_0000, 0xffff_ffff), 0x8000_0000);
        assert_eq!(ibin(IBin::Div, S64, 1 << 63, u64::MAX), 1 << 63);
        assert_eq!(iun(IUn::Bfind, U32, 0), 0xffff_ffff);
        assert_eq!(iun(IUn::Bfind, U32, 0x10), 4);
        assert_eq!(iun(IUn::BfindShift, U32, 0x10), 27);
        assert_eq!(iun(IUn::Bfind, S32, 0xffff_fff0), 3);
        // bmsk: the ISA's example, widths reaching the top, clamped and wrapped positions.
        assert_eq!(bmsk(false, 1, 2), 0x6);
        assert_eq!(bmsk(true, 0, 32), 0xffff_ffff);
        assert_eq!(bmsk(true, 4, 0), 0);
        assert_eq!(bmsk(true, 28, 8), 0xf000_0000);
        assert_eq!(bmsk(true, 32, 4), 0);
        assert_eq!(bmsk(false, 33, 4), 0x1e);
        assert_eq!(bmsk(false, 0, 32), 0);
        assert_eq!(bmsk(true, 8, 40), 0xffff_ff00);
        // szext: sign- and zero-extension of the low bits.
        assert_eq!(szext(true, true, 0x80, 8), 0xffff_ffff_ffff_ff80);
        assert_eq!(szext(true, false, 0x1ff, 8), 0xff);
        assert_eq!(szext(true, true, 0x7f, 8), 0x7f);
        assert_eq!(szext(false, true, 0xffff_ffff, 0), 0);
        assert_eq!(szext(false, false, 0x1234_5678, 36), 0x8);
        assert_eq!(szext(true, false, 0x1234_5678, 36), 0x1234_5678);
        assert_eq!(szext(true, true, 0x8000_0000, 32), 0xffff_ffff_8000_0000);
        assert_eq!(bfe(U32, 0xabcd_1234, 8, 8), 0x12);
        assert_eq!(bfe(S32, 0x0000_8000, 8, 8), 0xffff_ffff_ffff_ff80);
        assert_eq!(bfe(U32, 0xffff_ffff, 30, 8), 3);
        assert_eq!(bfe(S32, 0x8000_0000, 28, 8), 0xffff_ffff_ffff_fff8);
        assert_eq!(bfi(32, 0xf, 0xffff_0000, 4, 8), 0xffff_00f0);
        assert_eq!(prmt(0, 0x4433_2211, 0x8877_6655, 0x3210), 0x4433_2211);
        assert_eq!(prmt(0, 0x4433_2211, 0x8877_6655, 0x7654), 0x8877_6655);
        assert_eq!(prmt(0, 0x4433_2211, 0x8877_6655, 0x0123), 0x1122_3344);
        assert_eq!(prmt(0, 0x0000_0080, 0, 0x8888), 0xffff_ffff);
        assert_eq!(shf(true, false, 0x8000_0001, 0x1, 4), 0x18);
        assert_eq!(shf(false, true, 0x10, 0x1, 40), 0x1);
        assert_eq!(shf(false, false, 0x10, 0x1, 4), 0x1000_0001);
        assert_eq!(lop3(0xf0, 0xcc, 0xaa, 0x80), 0x80);
        assert_eq!(lop3(0xf0, 0xcc, 0xaa, 0xfe), 0xfe);
        assert_eq!(dp(4, true, true, 0xff02_0304, 0x0101_0101, 10), (10 + 4 + 3 + 2 - 1) as u64);
    }

    #[test]
    fn float_edges() {
        let m = FMode { rnd: Rnd::Rn, ftz: false, sat: false };
        let ftz = FMode { ftz: true, ..m };
        let sat = FMode { sat: true, ..m };
        let nan = f32::NAN.to_bits() as u64;
        let b = |x: f32| x.to_bits() as u64;
        assert_eq!(fbin(FBin::Add, FTy::F32, m, b(1.0), b(2.0)), b(3.0));
        assert_eq!(fbin(FBin::Div, FTy::F32, m, b(0.0), b(0.0)), NAN32 as u64);
        assert_eq!(fbin(FBin::Min, FTy::F32, m, nan, b(2.0)), b(2.0));
        assert_eq!(fbin(FBin::Max, FTy::F32, m, b(-0.0), b(0.0)), b(0.0));
        assert_eq!(fbin(FBin::Min, FTy::F32, m, b(0.0), b(-0.0)), b(-0.0));
        assert_eq!(fbin(FBin::MinNan, FTy::F32, m, nan, b(2.0)), NAN32 as u64);
        let tiny = b(1e-40);
        assert_eq!(fbin(FBin::Mul, FTy::F32, m, tiny, b(1.0)), tiny);
        assert_eq!(fbin(FBin::Mul, FTy::F32, ftz, tiny, b(1.0)), 0);
        assert_eq!(fbin(FBin::Mul, FTy::F32, ftz, b(-1e-20), b(1e-20)), b(-0.0));
        assert_eq!(fbin(FBin::Add, FTy::F32, sat, b(0.5), b(0.75)), b(1.0));
        assert_eq!(fbin(FBin::Add, FTy::F32, sat, nan, b(0.75)), 0);
        assert_eq!(fbin(FBin::Sub, FTy::F32, sat, b(0.5), b(0.75)), 0);
        let rz = FMode { rnd: Rnd::Rz, ..m };
        assert_eq!(fbin(FBin::Add, FTy::F32, rz, b(1.0), b(1e-10)), b(1.0));
        let rp = FMode { rnd: Rnd::Rp, ..m };
        assert_eq!(fbin(FBin::Add, FTy::F32, rp, b(1.0), b(1e-10)), b(1.0) + 1);
        assert_eq!(ffma(FTy::F32, m, b(2.0), b(3.0), b(1.0)), b(7.0));
        // cvt: saturation and NaN
        let s32 = CvtTy::Int(S32);
        let u8t = CvtTy::Int(IntTy { bits: 8, signed: false });
        assert_eq!(cvt(s32, CvtTy::F32, CvtRnd::Int(Rnd::Rz), false, false, false, b(3e10)), 0x7fff_ffff);
        assert_eq!(cvt(s32, CvtTy::F32, CvtRnd::Int(Rnd::Rz), false, false, false, b(-3e10)), 0xffff_ffff_8000_0000);
        assert_eq!(cvt(s32, CvtTy::F32, CvtRnd::Int(Rnd::Rz), false, false, false, nan), 0);
        assert_eq!(cvt(u8t, CvtTy::F32, CvtRnd::Int(Rnd::Rn), false, false, false, b(300.0)), 255);
        assert_eq!(cvt(u8t, CvtTy::F32, CvtRnd::Int(Rnd::Rn), false, false, false, b(-3.0)), 0);
        assert_eq!(cvt(s32, CvtTy::F32, CvtRnd::Int(Rnd::Rn), false, false, false, b(2.5)), 2);
        assert_eq!(cvt(s32, CvtTy::F32, CvtRnd::Int(Rnd::Rm), false, false, false, b(-2.5)), (-3i64) as u64);
        assert_eq!(cvt(s32, CvtTy::F32, CvtRnd::Int(Rnd::Rp), false, false, false, b(1e-40)), 1);
        assert_eq!(cvt(s32, CvtTy::F32, CvtRnd::Int(Rnd::Rp), false, true, false, b(1e-40)), 0);
        assert_eq!(cvt(CvtTy::Int(U32), CvtTy::Int(S32), CvtRnd::None, true, false, false, (-5i64) as u64), 0);
        assert_eq!(
            cvt(CvtTy::Int(S32), CvtTy::Int(IntTy { bits: 8, signed: true }), CvtRnd::None, false, false, false, 0x80),
            0xffff_ffff_ffff_ff80
        );
        assert_eq!(
            cvt(CvtTy::F32, CvtTy::Int(U32), CvtRnd::Float(Rnd::Rn), false, false, false, 0xffff_ffff),
            b(4294967296.0)
        );
        assert_eq!(
            cvt(CvtTy::F32, CvtTy::Int(U32), CvtRnd::Float(Rnd::Rz), false, false, false, 0xffff_ffff),
            b(4294967040.0)
        );
        assert_eq!(cvt(CvtTy::F32, CvtTy::F32, CvtRnd::Int(Rnd::Rn), false, false, false, b(2.5)), b(2.0));
        assert_eq!(cvt(CvtTy::F32, CvtTy::F32, CvtRnd::Int(Rnd::Rm), false, false, false, b(-0.5)), b(-1.0));
        assert_eq!(cvt(CvtTy::F32, CvtTy::F32, CvtRnd::Int(Rnd::Rz), false, false, false, b(-0.5)), b(-0.0));
        assert_eq!(cvt(CvtTy::F32, CvtTy::F32, CvtRnd::None, true, false, false, b(7.0)), b(1.0));
        assert_eq!(cvt(CvtTy::F16, CvtTy::F32, CvtRnd::Float(Rnd::Rn), false, false, false, b(1.0)), 0x3c00);
        assert_eq!(cvt(CvtTy::F32, CvtTy::F16, CvtRnd::None, false, false, false, 0x3c00), b(1.0));
        assert_eq!(
            cvt(CvtTy::F32, CvtTy::F64, CvtRnd::Float(Rnd::Rz), false, false, false, (1.0f64 + 1e-12).to_bits()),
            b(1.0)
        );
        assert_eq!(cvt_pack(CvtTy::F16, Rnd::Rn, false, false, b(1.0), b(2.0)), 0x3c00_4000);
        assert!(compare(Cmp::Neu, CmpTy::Float(FTy::F32, false), nan, b(1.0)));
        assert!(!compare(Cmp::Ne, CmpTy::Float(FTy::F32, false), nan, b(1.0)));
        assert!(compare(Cmp::Lo, CmpTy::Int(S32), 1, 0xffff_ffff));
        assert!(compare(Cmp::Lt, CmpTy::Int(S32), 0xffff_ffff, 1));
        assert!(testp(Testp::Subnormal, false, tiny));
    }
}
