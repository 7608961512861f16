//! The interpreter loop. Instructions were checked at load (opcodes, registers, jump
//! targets), so the loop only checks what depends on run-time values: memory accesses, the
//! budget and the call depth. Nothing here panics on any program or input.

use super::helpers::{self, Env};
use super::insn::{ATOMIC_ADD, ATOMIC_AND, ATOMIC_CMPXCHG, ATOMIC_FETCH, ATOMIC_OR, ATOMIC_XCHG, ATOMIC_XOR, Insn};
use super::mem::{self, Mem, STACK_SIZE};
use super::{Fault, MAX_CALL_DEPTH};

#[derive(Clone, Copy, Default)]
struct Frame {
    ret: usize,
    saved: [u64; 4],
    fp: u64,
}

#[cold]
#[inline(never)]
fn mem_fault(mem: &Mem<'_>, pc: usize, addr: u64, len: usize, write: bool) -> Fault {
    Fault::Memory { pc, addr, len, write, region: mem.describe(addr) }
}

#[inline(always)]
fn load<const N: usize>(mem: &Mem<'_>, base: u64, off: i16, pc: usize) -> Result<[u8; N], Fault> {
    let addr = base.wrapping_add(off as i64 as u64);
    match mem.load::<N>(addr) {
        Some(b) => Ok(b),
        None => Err(mem_fault(mem, pc, addr, N, false)),
    }
}

#[inline(always)]
fn store<const N: usize>(mem: &mut Mem<'_>, base: u64, off: i16, bytes: [u8; N], pc: usize) -> Result<(), Fault> {
    let addr = base.wrapping_add(off as i64 as u64);
    match mem.store::<N>(addr, bytes) {
        Some(()) => Ok(()),
        None => Err(mem_fault(mem, pc, addr, N, true)),
    }
}

// Division and modulo by zero as RFC 9669 defines them: x / 0 = 0, x % 0 = x.
// Signed overflow (MIN / -1) wraps: MIN / -1 = MIN, MIN % -1 = 0.
#[inline(always)]
fn div64(a: u64, b: u64, signed: bool) -> u64 {
    match (b, signed) {
        (0, _) => 0,
        (_, false) => a / b,
        (_, true) => (a as i64).wrapping_div(b as i64) as u64,
    }
}

#[inline(always)]
fn mod64(a: u64, b: u64, signed: bool) -> u64 {
    match (b, signed) {
        (0, _) => a,
        (_, false) => a % b,
        (_, true) => (a as i64).wrapping_rem(b as i64) as u64,
    }
}

#[inline(always)]
fn div32(a: u64, b: u64, signed: bool) -> u64 {
    let (a, b) = (a as u32, b as u32);
    u64::from(match (b, signed) {
        (0, _) => 0,
        (_, false) => a / b,
        (_, true) => (a as i32).wrapping_div(b as i32) as u32,
    })
}

#[inline(always)]
fn mod32(a: u64, b: u64, signed: bool) -> u64 {
    let (a, b) = (a as u32, b as u32);
    u64::from(match (b, signed) {
        (0, _) => a,
        (_, false) => a % b,
        (_, true) => (a as i32).wrapping_rem(b as i32) as u32,
    })
}

#[inline(always)]
fn movsx64(v: u64, bits: i16) -> u64 {
    match bits {
        8 => v as i8 as i64 as u64,
        16 => v as i16 as i64 as u64,
        32 => v as i32 as i64 as u64,
        _ => v,
    }
}

#[inline(always)]
fn movsx32(v: u64, bits: i16) -> u64 {
    u64::from(match bits {
        8 => v as i8 as i32 as u32,
        16 => v as i16 as i32 as u32,
        _ => v as u32,
    })
}

/// END with source "to little endian" (ALU), "to big endian" (ALU) or unconditional (ALU64).
#[inline(always)]
fn byte_order(v: u64, width: i64, kind: u8) -> u64 {
    match (width, kind) {
        (16, 0) => u64::from((v as u16).to_le()),
        (32, 0) => u64::from((v as u32).to_le()),
        (64, 0) => v.to_le(),
        (16, 1) => u64::from((v as u16).to_be()),
        (32, 1) => u64::from((v as u32).to_be()),
        (64, 1) => v.to_be(),
        (16, _) => u64::from((v as u16).swap_bytes()),
        (32, _) => u64::from((v as u32).swap_bytes()),
        _ => v.swap_bytes(),
    }
}

/// Atomic read-modify-write of `N` bytes (4 or 8). Runs are serialised, so plain memory
/// operations are atomic enough.
#[inline(always)]
fn atomic<const N: usize>(mem: &mut Mem<'_>, r: &mut [u64; 16], i: Insn, pc: usize) -> Result<(), Fault> {
    let d = (i.dst & 15) as usize;
    let s = (i.src & 15) as usize;
    let addr = r[d].wrapping_add(i.off as i64 as u64);
    let Some(slot) = mem.slot::<N>(addr) else {
        return Err(mem_fault(mem, pc, addr, N, true));
    };
    let mask = if N == 4 { u64::from(u32::MAX) } else { u64::MAX };
    let mut word = [0u8; 8];
    word[..N].copy_from_slice(slot);
    let old = u64::from_le_bytes(word);
    let src = r[s] & mask;
    let op = i.imm as i32;
    let new = match op & !ATOMIC_FETCH {
        _ if op == ATOMIC_XCHG => src,
        _ if op == ATOMIC_CMPXCHG => {
            if old == r[0] & mask {
                src
            } else {
                old
            }
        }
        ATOMIC_ADD => old.wrapping_add(src) & mask,
        ATOMIC_OR => old | src,
        ATOMIC_AND => old & src,
        ATOMIC_XOR => old ^ src,
        _ => return Err(Fault::BadInstruction { pc }),
    };
    slot.copy_from_slice(&new.to_le_bytes()[..N]);
    if op == ATOMIC_CMPXCHG {
        r[0] = old;
    } else if op & ATOMIC_FETCH != 0 {
        r[s] = old;
    }
    Ok(())
}

/// Runs `insns` from instruction 0 with r1 = the context, for at most `budget` instructions.
pub(crate) fn execute(insns: &[Insn], env: &mut Env<'_>, budget: u64) -> Result<u64, Fault> {
    // 16 registers so that a 4-bit register number indexes without a bounds check; r11..r15
    // are never named by a checked program.
    let mut r = [0u64; 16];
    r[1] = mem::CTX_BASE;
    r[10] = mem::frame_top(0);
    if let Some(frame) = env.mem.stack.get_mut(..STACK_SIZE) {
        frame.fill(0);
    }
    let mut frames = [Frame::default(); MAX_CALL_DEPTH];
    let mut depth = 0usize;
    let mut pc = 0usize;
    let mut left = budget;

    // Relative jump from the instruction after the current one.
    macro_rules! jump_if {
        ($cond:expr, $rel:expr) => {
            if $cond {
                pc = pc.wrapping_add_signed($rel as isize);
            }
        };
    }

    loop {
        let cur = pc;
        let Some(&i) = insns.get(pc) else {
            return Err(Fault::BadInstruction { pc });
        };
        if left == 0 {
            return Err(Fault::Budget { budget, pc });
        }
        left -= 1;
        pc += 1;
        let d = (i.dst & 15) as usize;
        let s = (i.src & 15) as usize;
        let imm = i.imm as u64;
        let off = i.off;
        match i.op {
            // ALU64, K and X sources.
            0x07 => r[d] = r[d].wrapping_add(imm),
            0x0f => r[d] = r[d].wrapping_add(r[s]),
            0x17 => r[d] = r[d].wrapping_sub(imm),
            0x1f => r[d] = r[d].wrapping_sub(r[s]),
            0x27 => r[d] = r[d].wrapping_mul(imm),
            0x2f => r[d] = r[d].wrapping_mul(r[s]),
            0x37 => r[d] = div64(r[d], imm, off == 1),
            0x3f => r[d] = div64(r[d], r[s], off == 1),
            0x47 => r[d] |= imm,
            0x4f => r[d] |= r[s],
            0x57 => r[d] &= imm,
            0x5f => r[d] &= r[s],
            0x67 => r[d] = r[d].wrapping_shl(imm as u32),
            0x6f => r[d] = r[d].wrapping_shl(r[s] as u32),
            0x77 => r[d] = r[d].wrapping_shr(imm as u32),
            0x7f => r[d] = r[d].wrapping_shr(r[s] as u32),
            0x87 => r[d] = r[d].wrapping_neg(),
            0x97 => r[d] = mod64(r[d], imm, off == 1),
            0x9f => r[d] = mod64(r[d], r[s], off == 1),
            0xa7 => r[d] ^= imm,
            0xaf => r[d] ^= r[s],
            0xb7 => r[d] = imm,
            0xbf => r[d] = movsx64(r[s], off),
            0xc7 => r[d] = (r[d] as i64).wrapping_shr(imm as u32) as u64,
            0xcf => r[d] = (r[d] as i64).wrapping_shr(r[s] as u32) as u64,
            0xd7 => r[d] = byte_order(r[d], i.imm, 2),

            // ALU (32-bit): operands truncated, result zero-extended.
            0x04 => r[d] = u64::from((r[d] as u32).wrapping_add(imm as u32)),
            0x0c => r[d] = u64::from((r[d] as u32).wrapping_add(r[s] as u32)),
            0x14 => r[d] = u64::from((r[d] as u32).wrapping_sub(imm as u32)),
            0x1c => r[d] = u64::from((r[d] as u32).wrapping_sub(r[s] as u32)),
            0x24 => r[d] = u64::from((r[d] as u32).wrapping_mul(imm as u32)),
            0x2c => r[d] = u64::from((r[d] as u32).wrapping_mul(r[s] as u32)),
            0x34 => r[d] = div32(r[d], imm, off == 1),
            0x3c => r[d] = div32(r[d], r[s], off == 1),
            0x44 => r[d] = u64::from(r[d] as u32 | imm as u32),
            0x4c => r[d] = u64::from(r[d] as u32 | r[s] as u32),
            0x54 => r[d] = u64::from(r[d] as u32 & imm as u32),
            0x5c => r[d] = u64::from(r[d] as u32 & r[s] as u32),
            0x64 => r[d] = u64::from((r[d] as u32).wrapping_shl(imm as u32)),
            0x6c => r[d] = u64::from((r[d] as u32).wrapping_shl(r[s] as u32)),
            0x74 => r[d] = u64::from((r[d] as u32).wrapping_shr(imm as u32)),
            0x7c => r[d] = u64::from((r[d] as u32).wrapping_shr(r[s] as u32)),
            0x84 => r[d] = u64::from((r[d] as u32).wrapping_neg()),
            0x94 => r[d] = mod32(r[d], imm, off == 1),
            0x9c => r[d] = mod32(r[d], r[s], off == 1),
            0xa4 => r[d] = u64::from(r[d] as u32 ^ imm as u32),
            0xac => r[d] = u64::from(r[d] as u32 ^ r[s] as u32),
            0xb4 => r[d] = u64::from(imm as u32),
            0xbc => r[d] = movsx32(r[s], off),
            0xc4 => r[d] = u64::from((r[d] as u32 as i32).wrapping_shr(imm as u32) as u32),
            0xcc => r[d] = u64::from((r[d] as u32 as i32).wrapping_shr(r[s] as u32) as u32),
            0xd4 => r[d] = byte_order(r[d], i.imm, 0),
            0xdc => r[d] = byte_order(r[d], i.imm, 1),

            // JMP (64-bit compares).
            0x05 => jump_if!(true, off),
            0x15 => jump_if!(r[d] == imm, off),
            0x1d => jump_if!(r[d] == r[s], off),
            0x25 => jump_if!(r[d] > imm, off),
            0x2d => jump_if!(r[d] > r[s], off),
            0x35 => jump_if!(r[d] >= imm, off),
            0x3d => jump_if!(r[d] >= r[s], off),
            0x45 => jump_if!(r[d] & imm != 0, off),
            0x4d => jump_if!(r[d] & r[s] != 0, off),
            0x55 => jump_if!(r[d] != imm, off),
            0x5d => jump_if!(r[d] != r[s], off),
            0x65 => jump_if!((r[d] as i64) > (imm as i64), off),
            0x6d => jump_if!((r[d] as i64) > (r[s] as i64), off),
            0x75 => jump_if!((r[d] as i64) >= (imm as i64), off),
            0x7d => jump_if!((r[d] as i64) >= (r[s] as i64), off),
            0xa5 => jump_if!(r[d] < imm, off),
            0xad => jump_if!(r[d] < r[s], off),
            0xb5 => jump_if!(r[d] <= imm, off),
            0xbd => jump_if!(r[d] <= r[s], off),
            0xc5 => jump_if!((r[d] as i64) < (imm as i64), off),
            0xcd => jump_if!((r[d] as i64) < (r[s] as i64), off),
            0xd5 => jump_if!((r[d] as i64) <= (imm as i64), off),
            0xdd => jump_if!((r[d] as i64) <= (r[s] as i64), off),

            // JMP32 (32-bit compares); its ja (gotol) takes the offset from imm.
            0x06 => jump_if!(true, i.imm),
            0x16 => jump_if!(r[d] as u32 == imm as u32, off),
            0x1e => jump_if!(r[d] as u32 == r[s] as u32, off),
            0x26 => jump_if!(r[d] as u32 > imm as u32, off),
            0x2e => jump_if!(r[d] as u32 > r[s] as u32, off),
            0x36 => jump_if!(r[d] as u32 >= imm as u32, off),
            0x3e => jump_if!(r[d] as u32 >= r[s] as u32, off),
            0x46 => jump_if!(r[d] as u32 & imm as u32 != 0, off),
            0x4e => jump_if!(r[d] as u32 & r[s] as u32 != 0, off),
            0x56 => jump_if!(r[d] as u32 != imm as u32, off),
            0x5e => jump_if!(r[d] as u32 != r[s] as u32, off),
            0x66 => jump_if!((r[d] as i32) > (imm as i32), off),
            0x6e => jump_if!((r[d] as i32) > (r[s] as i32), off),
            0x76 => jump_if!((r[d] as i32) >= (imm as i32), off),
            0x7e => jump_if!((r[d] as i32) >= (r[s] as i32), off),
            0xa6 => jump_if!((r[d] as u32) < imm as u32, off),
            0xae => jump_if!((r[d] as u32) < r[s] as u32, off),
            0xb6 => jump_if!(r[d] as u32 <= imm as u32, off),
            0xbe => jump_if!(r[d] as u32 <= r[s] as u32, off),
            0xc6 => jump_if!((r[d] as i32) < (imm as i32), off),
            0xce => jump_if!((r[d] as i32) < (r[s] as i32), off),
            0xd6 => jump_if!((r[d] as i32) <= (imm as i32), off),
            0xde => jump_if!((r[d] as i32) <= (r[s] as i32), off),

            // Loads: MEM zero-extends, MEMSX sign-extends.
            0x61 => r[d] = u64::from(u32::from_le_bytes(load::<4>(&env.mem, r[s], off, cur)?)),
            0x69 => r[d] = u64::from(u16::from_le_bytes(load::<2>(&env.mem, r[s], off, cur)?)),
            0x71 => r[d] = u64::from(load::<1>(&env.mem, r[s], off, cur)?[0]),
            0x79 => r[d] = u64::from_le_bytes(load::<8>(&env.mem, r[s], off, cur)?),
            0x81 => r[d] = i32::from_le_bytes(load::<4>(&env.mem, r[s], off, cur)?) as i64 as u64,
            0x89 => r[d] = i16::from_le_bytes(load::<2>(&env.mem, r[s], off, cur)?) as i64 as u64,
            0x91 => r[d] = load::<1>(&env.mem, r[s], off, cur)?[0] as i8 as i64 as u64,

            // Stores of an immediate.
            0x62 => store(&mut env.mem, r[d], off, (imm as u32).to_le_bytes(), cur)?,
            0x6a => store(&mut env.mem, r[d], off, (imm as u16).to_le_bytes(), cur)?,
            0x72 => store(&mut env.mem, r[d], off, [imm as u8], cur)?,
            0x7a => store(&mut env.mem, r[d], off, imm.to_le_bytes(), cur)?,

            // Stores of a register.
            0x63 => store(&mut env.mem, r[d], off, (r[s] as u32).to_le_bytes(), cur)?,
            0x6b => store(&mut env.mem, r[d], off, (r[s] as u16).to_le_bytes(), cur)?,
            0x73 => store(&mut env.mem, r[d], off, [r[s] as u8], cur)?,
            0x7b => store(&mut env.mem, r[d], off, r[s].to_le_bytes(), cur)?,

            // Atomics.
            0xc3 => atomic::<4>(&mut env.mem, &mut r, i, cur)?,
            0xdb => atomic::<8>(&mut env.mem, &mut r, i, cur)?,

            0x18 => {
                // Skip the second half.
                r[d] = imm;
                pc += 1;
            }

            0x85 if i.src == 0 => r[0] = helpers::call(i.imm, &r, env, cur)?,
            0x85 => {
                // Local call: save the callee-saved registers and the frame pointer.
                if depth == MAX_CALL_DEPTH {
                    return Err(Fault::CallDepth { pc: cur });
                }
                frames[depth] = Frame { ret: pc, saved: [r[6], r[7], r[8], r[9]], fp: r[10] };
                depth += 1;
                r[10] = mem::frame_top(depth);
                if let Some(frame) = env.mem.stack.get_mut(depth * STACK_SIZE..(depth + 1) * STACK_SIZE) {
                    frame.fill(0);
                }
                pc = pc.wrapping_add_signed(i.imm as isize);
            }
            0x95 => {
                if depth == 0 {
                    return Ok(r[0]);
                }
                depth -= 1;
                let f = frames[depth];
                pc = f.ret;
                r[6..10].copy_from_slice(&f.saved);
                r[10] = f.fp;
            }
            _ => return Err(Fault::BadInstruction { pc: cur }),
        }
    }
}
