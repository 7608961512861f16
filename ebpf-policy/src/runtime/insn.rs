//! Instruction encoding, the static checks done at load, and the disassembler.

use super::maps::MapStore;
use super::{LoadError, MAX_INSNS, helpers, mem};

// Instruction classes (the low 3 bits of the opcode).
pub(crate) const CLS_LD: u8 = 0x00;
pub(crate) const CLS_LDX: u8 = 0x01;
pub(crate) const CLS_ST: u8 = 0x02;
pub(crate) const CLS_STX: u8 = 0x03;
pub(crate) const CLS_ALU: u8 = 0x04;
pub(crate) const CLS_JMP: u8 = 0x05;
pub(crate) const CLS_JMP32: u8 = 0x06;
pub(crate) const CLS_ALU64: u8 = 0x07;

// Load/store sizes and modes.
pub(crate) const SZ_W: u8 = 0x00;
pub(crate) const SZ_H: u8 = 0x08;
pub(crate) const SZ_B: u8 = 0x10;
pub(crate) const SZ_DW: u8 = 0x18;
pub(crate) const MODE_IMM: u8 = 0x00;
pub(crate) const MODE_MEM: u8 = 0x60;
pub(crate) const MODE_MEMSX: u8 = 0x80;
pub(crate) const MODE_ATOMIC: u8 = 0xc0;

// ALU operations (high 4 bits) and the source bit.
pub(crate) const SRC_X: u8 = 0x08;
pub(crate) const ALU_ADD: u8 = 0x00;
pub(crate) const ALU_SUB: u8 = 0x10;
pub(crate) const ALU_MUL: u8 = 0x20;
pub(crate) const ALU_DIV: u8 = 0x30;
pub(crate) const ALU_OR: u8 = 0x40;
pub(crate) const ALU_AND: u8 = 0x50;
pub(crate) const ALU_LSH: u8 = 0x60;
pub(crate) const ALU_RSH: u8 = 0x70;
pub(crate) const ALU_NEG: u8 = 0x80;
pub(crate) const ALU_MOD: u8 = 0x90;
pub(crate) const ALU_XOR: u8 = 0xa0;
pub(crate) const ALU_MOV: u8 = 0xb0;
pub(crate) const ALU_ARSH: u8 = 0xc0;
pub(crate) const ALU_END: u8 = 0xd0;

// Jump operations.
pub(crate) const JMP_JA: u8 = 0x00;
pub(crate) const JMP_JEQ: u8 = 0x10;
pub(crate) const JMP_JGT: u8 = 0x20;
pub(crate) const JMP_JGE: u8 = 0x30;
pub(crate) const JMP_JSET: u8 = 0x40;
pub(crate) const JMP_JNE: u8 = 0x50;
pub(crate) const JMP_JSGT: u8 = 0x60;
pub(crate) const JMP_JSGE: u8 = 0x70;
pub(crate) const JMP_CALL: u8 = 0x80;
pub(crate) const JMP_EXIT: u8 = 0x90;
pub(crate) const JMP_JLT: u8 = 0xa0;
pub(crate) const JMP_JLE: u8 = 0xb0;
pub(crate) const JMP_JSLT: u8 = 0xc0;
pub(crate) const JMP_JSLE: u8 = 0xd0;

// Atomic operations (the imm of an atomic STX).
pub(crate) const ATOMIC_ADD: i32 = 0x00;
pub(crate) const ATOMIC_OR: i32 = 0x40;
pub(crate) const ATOMIC_AND: i32 = 0x50;
pub(crate) const ATOMIC_XOR: i32 = 0xa0;
pub(crate) const ATOMIC_FETCH: i32 = 0x01;
pub(crate) const ATOMIC_XCHG: i32 = 0xe0 | ATOMIC_FETCH;
pub(crate) const ATOMIC_CMPXCHG: i32 = 0xf0 | ATOMIC_FETCH;

// src_reg values with a special meaning.
pub(crate) const PSEUDO_MAP_FD: u8 = 1;
pub(crate) const PSEUDO_MAP_VALUE: u8 = 2;
pub(crate) const PSEUDO_CALL: u8 = 1;

/// One instruction as encoded in the object (8 bytes; an ld_imm64 takes two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawInsn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl RawInsn {
    pub(crate) const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        RawInsn { code, dst, src, off, imm }
    }

    /// Decodes the little-endian encoding (the only one eBPF objects for x86/arm hosts use).
    pub(crate) fn from_bytes(b: [u8; 8]) -> Self {
        RawInsn {
            code: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// An instruction decoded for the interpreter: registers already checked, `imm`
/// sign-extended (or, for ld_imm64, the full resolved 64-bit value).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Insn {
    pub op: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i64,
}

/// Helpers the runtime provides: (id, name).
pub(crate) const HELPERS: &[(i32, &str)] = &[
    (helpers::MAP_LOOKUP_ELEM, "map_lookup_elem"),
    (helpers::MAP_UPDATE_ELEM, "map_update_elem"),
    (helpers::MAP_DELETE_ELEM, "map_delete_elem"),
    (helpers::KTIME_GET_NS, "ktime_get_ns"),
    (helpers::TRACE_PRINTK, "trace_printk"),
    (helpers::GET_PRANDOM_U32, "get_prandom_u32"),
    (helpers::GET_SMP_PROCESSOR_ID, "get_smp_processor_id"),
];

pub(crate) fn helper_name(id: i64) -> Option<&'static str> {
    HELPERS.iter().find(|(h, _)| i64::from(*h) == id).map(|(_, n)| *n)
}

fn err(pc: usize, why: impl Into<String>) -> LoadError {
    LoadError::Instruction { pc, why: why.into() }
}

fn check_reg(pc: usize, reg: u8, what: &str) -> Result<(), LoadError> {
    if reg > 10 { Err(err(pc, format!("invalid {what} register r{reg}"))) } else { Ok(()) }
}

fn check_dst_writable(pc: usize, reg: u8) -> Result<(), LoadError> {
    check_reg(pc, reg, "destination")?;
    if reg == 10 { Err(err(pc, "r10 (the frame pointer) is read-only")) } else { Ok(()) }
}

fn check_zero(pc: usize, value: i64, field: &str) -> Result<(), LoadError> {
    if value != 0 { Err(err(pc, format!("reserved field {field} is {value}, must be 0"))) } else { Ok(()) }
}

/// What a checked instruction does to control flow, for the second pass.
enum Flow {
    Next,
    /// A jump (conditional or not) to an absolute instruction index.
    Jump(i64),
    /// A local call to an absolute instruction index.
    Call(i64),
    Exit,
}

/// Checks a linked program statically and decodes it. Maps are those the program's
/// ld_imm64 instructions refer to by index.
pub(crate) fn check(raw: &[RawInsn], maps: &[MapStore]) -> Result<Vec<Insn>, LoadError> {
    check_all(raw, maps).map_err(|e| match e {
        // Show the offending instruction too.
        LoadError::Instruction { pc, why } if pc < raw.len() => {
            let line = disassemble(raw, pc, maps);
            match line.split_once(": ") {
                Some((_, text)) if !text.starts_with('<') => {
                    LoadError::Instruction { pc, why: format!("{why} (`{text}`)") }
                }
                _ => LoadError::Instruction { pc, why },
            }
        }
        e => e,
    })
}

fn check_all(raw: &[RawInsn], maps: &[MapStore]) -> Result<Vec<Insn>, LoadError> {
    if raw.is_empty() {
        return Err(err(0, "the program is empty"));
    }
    if raw.len() > MAX_INSNS {
        return Err(LoadError::TooLarge { count: raw.len() });
    }
    let n = raw.len();
    let mut out = vec![Insn::default(); n];
    let mut flow = Vec::with_capacity(n);
    // The second halves of ld_imm64: never executed, never a jump target.
    let mut second_half = vec![false; n];
    let mut pc = 0;
    while pc < n {
        let r = raw[pc];
        let (insn, f) = check_one(raw, pc, maps)?;
        out[pc] = insn;
        flow.push((pc, f));
        if r.code == (CLS_LD | SZ_DW | MODE_IMM) {
            second_half[pc + 1] = true;
            pc += 2;
        } else {
            pc += 1;
        }
    }

    // Functions start at 0 and at every local-call target; jumps must stay inside theirs.
    let mut starts = vec![0usize];
    for &(pc, ref f) in &flow {
        if let Flow::Call(t) = *f {
            if t < 0 || t as usize >= n {
                return Err(err(pc, format!("call target {t} is outside the program (0..{n})")));
            }
            if second_half[t as usize] {
                return Err(err(pc, format!("call target {t} is the second half of an ld_imm64")));
            }
            starts.push(t as usize);
        }
    }
    starts.sort_unstable();
    starts.dedup();
    let func_of = |pc: usize| -> (usize, usize) {
        let i = starts.partition_point(|&s| s <= pc) - 1;
        (starts[i], starts.get(i + 1).copied().unwrap_or(n))
    };
    for &(pc, ref f) in &flow {
        if let Flow::Jump(t) = *f {
            let (lo, hi) = func_of(pc);
            if t < lo as i64 || t >= hi as i64 {
                return Err(err(pc, format!("jump target {t} is outside its function ({lo}..{hi})")));
            }
            if second_half[t as usize] {
                return Err(err(pc, format!("jump target {t} is the second half of an ld_imm64")));
            }
        }
    }
    // No function may run off its end into the next one (or off the program).
    for (i, &s) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(n);
        let last = end - 1;
        if second_half[last] {
            return Err(err(last, "function ends in the middle of an ld_imm64"));
        }
        let code = raw[last].code;
        let ok = code == (CLS_JMP | JMP_EXIT) || code == (CLS_JMP | JMP_JA) || code == (CLS_JMP32 | JMP_JA);
        if !ok {
            return Err(err(last, format!("the last instruction of the function at {s} is not exit or goto")));
        }
    }
    Ok(out)
}

fn check_one(raw: &[RawInsn], pc: usize, maps: &[MapStore]) -> Result<(Insn, Flow), LoadError> {
    let r = raw[pc];
    let code = r.code;
    let mut insn = Insn { op: code, dst: r.dst, src: r.src, off: r.off, imm: i64::from(r.imm) };
    let unknown = || err(pc, format!("unknown opcode {code:#04x}"));
    let mut flow = Flow::Next;
    match code & 0x07 {
        CLS_LD => {
            if code != (CLS_LD | SZ_DW | MODE_IMM) {
                return Err(err(pc, format!("unsupported load opcode {code:#04x} (legacy packet access)")));
            }
            check_dst_writable(pc, r.dst)?;
            check_zero(pc, r.off.into(), "offset")?;
            let Some(next) = raw.get(pc + 1) else {
                return Err(err(pc, "ld_imm64 is missing its second half"));
            };
            if next.code != 0 || next.dst != 0 || next.src != 0 || next.off != 0 {
                return Err(err(pc, "malformed second half of ld_imm64"));
            }
            insn.imm = match r.src {
                0 => (u64::from(r.imm as u32) | (u64::from(next.imm as u32) << 32)) as i64,
                PSEUDO_MAP_FD => {
                    let m = map_index(pc, r.imm, maps)?;
                    check_zero(pc + 1, next.imm.into(), "immediate")?;
                    mem::map_handle(m) as i64
                }
                PSEUDO_MAP_VALUE => {
                    let m = map_index(pc, r.imm, maps)?;
                    let map = &maps[m];
                    if !map.is_array() {
                        return Err(err(pc, format!("direct value access to map `{}`, which is no array", map.name)));
                    }
                    let off = next.imm as u32;
                    // The kernel allows this for single-entry arrays only; any array is safe here.
                    if off as usize >= map.values.len().max(1) {
                        return Err(err(
                            pc,
                            format!(
                                "offset {off} is outside the values of map `{}` ({} bytes)",
                                map.name,
                                map.values.len()
                            ),
                        ));
                    }
                    (mem::map_base(m) + u64::from(off)) as i64
                }
                s => {
                    return Err(err(pc, format!("unsupported ld_imm64 source {s} (BTF ids, functions, map indices)")));
                }
            };
        }
        CLS_LDX => {
            let mode = code & 0xe0;
            let size = code & 0x18;
            if !(mode == MODE_MEM || (mode == MODE_MEMSX && size != SZ_DW)) {
                return Err(unknown());
            }
            check_dst_writable(pc, r.dst)?;
            check_reg(pc, r.src, "source")?;
            check_zero(pc, r.imm.into(), "immediate")?;
        }
        CLS_ST => {
            if code & 0xe0 != MODE_MEM {
                return Err(unknown());
            }
            check_reg(pc, r.dst, "destination")?;
            check_zero(pc, r.src.into(), "source register")?;
        }
        CLS_STX => {
            let mode = code & 0xe0;
            let size = code & 0x18;
            check_reg(pc, r.dst, "destination")?;
            check_reg(pc, r.src, "source")?;
            if mode == MODE_MEM {
                check_zero(pc, r.imm.into(), "immediate")?;
            } else if mode == MODE_ATOMIC && (size == SZ_W || size == SZ_DW) {
                match r.imm {
                    ATOMIC_ADD | ATOMIC_OR | ATOMIC_AND | ATOMIC_XOR => {}
                    i if i == ATOMIC_ADD | ATOMIC_FETCH
                        || i == ATOMIC_OR | ATOMIC_FETCH
                        || i == ATOMIC_AND | ATOMIC_FETCH
                        || i == ATOMIC_XOR | ATOMIC_FETCH
                        || i == ATOMIC_XCHG =>
                    {
                        // These write the old value back into the source register.
                        if r.src == 10 {
                            return Err(err(pc, "r10 (the frame pointer) is read-only"));
                        }
                    }
                    ATOMIC_CMPXCHG => {}
                    i => return Err(err(pc, format!("unknown atomic operation {i:#x}"))),
                }
            } else {
                return Err(unknown());
            }
        }
        cls @ (CLS_ALU | CLS_ALU64) => {
            let op = code & 0xf0;
            let x = code & SRC_X != 0;
            check_dst_writable(pc, r.dst)?;
            match op {
                ALU_ADD | ALU_SUB | ALU_MUL | ALU_OR | ALU_AND | ALU_LSH | ALU_RSH | ALU_XOR | ALU_ARSH => {
                    check_zero(pc, r.off.into(), "offset")?;
                }
                ALU_DIV | ALU_MOD => {
                    if r.off != 0 && r.off != 1 {
                        return Err(err(pc, format!("invalid offset {} for div/mod (0 or 1)", r.off)));
                    }
                }
                ALU_MOV => {
                    let ok = match (x, r.off) {
                        (_, 0) => true,
                        (true, 8 | 16) => true,
                        (true, 32) => cls == CLS_ALU64,
                        _ => false,
                    };
                    if !ok {
                        return Err(err(pc, format!("invalid offset {} for mov", r.off)));
                    }
                }
                ALU_NEG => {
                    if x {
                        return Err(unknown());
                    }
                    check_zero(pc, r.off.into(), "offset")?;
                    check_zero(pc, r.imm.into(), "immediate")?;
                }
                ALU_END => {
                    if cls == CLS_ALU64 && x {
                        return Err(unknown());
                    }
                    check_zero(pc, r.off.into(), "offset")?;
                    check_zero(pc, r.src.into(), "source register")?;
                    if !matches!(r.imm, 16 | 32 | 64) {
                        return Err(err(pc, format!("invalid byte swap width {}", r.imm)));
                    }
                    return Ok((insn, flow));
                }
                _ => return Err(unknown()),
            }
            if x {
                check_reg(pc, r.src, "source")?;
                check_zero(pc, r.imm.into(), "immediate")?;
            } else {
                check_zero(pc, r.src.into(), "source register")?;
            }
        }
        cls @ (CLS_JMP | CLS_JMP32) => {
            let op = code & 0xf0;
            let x = code & SRC_X != 0;
            let target = |rel: i64| pc as i64 + rel + 1;
            match op {
                JMP_JA => {
                    if x {
                        return Err(unknown());
                    }
                    check_zero(pc, r.dst.into(), "destination register")?;
                    check_zero(pc, r.src.into(), "source register")?;
                    if cls == CLS_JMP {
                        check_zero(pc, r.imm.into(), "immediate")?;
                        flow = Flow::Jump(target(r.off.into()));
                    } else {
                        // gotol: the offset is in imm.
                        check_zero(pc, r.off.into(), "offset")?;
                        flow = Flow::Jump(target(r.imm.into()));
                    }
                }
                JMP_JEQ | JMP_JGT | JMP_JGE | JMP_JSET | JMP_JNE | JMP_JSGT | JMP_JSGE | JMP_JLT | JMP_JLE
                | JMP_JSLT | JMP_JSLE => {
                    check_reg(pc, r.dst, "destination")?;
                    if x {
                        check_reg(pc, r.src, "source")?;
                        check_zero(pc, r.imm.into(), "immediate")?;
                    } else {
                        check_zero(pc, r.src.into(), "source register")?;
                    }
                    flow = Flow::Jump(target(r.off.into()));
                }
                JMP_CALL if cls == CLS_JMP && !x => {
                    check_zero(pc, r.dst.into(), "destination register")?;
                    check_zero(pc, r.off.into(), "offset")?;
                    match r.src {
                        0 => {
                            if helper_name(r.imm.into()).is_none() {
                                return Err(LoadError::UnknownHelper { pc, id: r.imm.into() });
                            }
                        }
                        PSEUDO_CALL => flow = Flow::Call(target(r.imm.into())),
                        s => return Err(err(pc, format!("unsupported call kind (src_reg {s}: kfunc or unknown)"))),
                    }
                }
                JMP_EXIT if cls == CLS_JMP && !x => {
                    check_zero(pc, r.dst.into(), "destination register")?;
                    check_zero(pc, r.src.into(), "source register")?;
                    check_zero(pc, r.off.into(), "offset")?;
                    check_zero(pc, r.imm.into(), "immediate")?;
                    flow = Flow::Exit;
                }
                _ => return Err(unknown()),
            }
        }
        _ => return Err(unknown()),
    }
    Ok((insn, flow))
}

fn map_index(pc: usize, imm: i32, maps: &[MapStore]) -> Result<usize, LoadError> {
    usize::try_from(imm)
        .ok()
        .filter(|&m| m < maps.len())
        .ok_or_else(|| err(pc, format!("reference to unknown map #{imm}")))
}

/// One readable line for instruction `pc` (llvm-objdump's syntax, roughly).
pub(crate) fn disassemble(raw: &[RawInsn], pc: usize, maps: &[MapStore]) -> String {
    let r = raw[pc];
    let code = r.code;
    let size_name = |size: u8| match size {
        SZ_W => "u32",
        SZ_H => "u16",
        SZ_B => "u8",
        _ => "u64",
    };
    let addr = |reg: u8, off: i16| {
        if off < 0 { format!("r{reg} - {}", -i32::from(off)) } else { format!("r{reg} + {off}") }
    };
    let target = |rel: i64| format!("{:+} <{}>", rel, pc as i64 + rel + 1);
    let text = match code & 0x07 {
        CLS_LD if code == (CLS_LD | SZ_DW | MODE_IMM) => {
            let next = raw.get(pc + 1).copied().unwrap_or_default();
            let map_name = |i: i32| {
                usize::try_from(i).ok().and_then(|i| maps.get(i)).map_or_else(|| format!("#{i}"), |m| m.name.clone())
            };
            match r.src {
                PSEUDO_MAP_FD => format!("r{} = map[{}] ll", r.dst, map_name(r.imm)),
                PSEUDO_MAP_VALUE => format!("r{} = {} + {} ll", r.dst, map_name(r.imm), next.imm as u32),
                0 => format!("r{} = {:#x} ll", r.dst, u64::from(r.imm as u32) | (u64::from(next.imm as u32) << 32)),
                s => format!("r{} = <ld_imm64 src {s}> {} ll", r.dst, r.imm),
            }
        }
        CLS_LDX if code & 0xe0 == MODE_MEM => {
            format!("r{} = *({} *)({})", r.dst, size_name(code & 0x18), addr(r.src, r.off))
        }
        CLS_LDX if code & 0xe0 == MODE_MEMSX => {
            format!("r{} = *(s{} *)({})", r.dst, &size_name(code & 0x18)[1..], addr(r.src, r.off))
        }
        CLS_ST if code & 0xe0 == MODE_MEM => {
            format!("*({} *)({}) = {}", size_name(code & 0x18), addr(r.dst, r.off), r.imm)
        }
        CLS_STX if code & 0xe0 == MODE_MEM => {
            format!("*({} *)({}) = r{}", size_name(code & 0x18), addr(r.dst, r.off), r.src)
        }
        CLS_STX if code & 0xe0 == MODE_ATOMIC => {
            let w = code & 0x18 == SZ_W;
            let (ty, reg) = if w { ("u32", 'w') } else { ("u64", 'r') };
            let at = format!("({ty} *)({})", addr(r.dst, r.off));
            let op = |imm: i32| match imm & !ATOMIC_FETCH {
                ATOMIC_ADD => Some(("+=", "add")),
                ATOMIC_OR => Some(("|=", "or")),
                ATOMIC_AND => Some(("&=", "and")),
                ATOMIC_XOR => Some(("^=", "xor")),
                _ => None,
            };
            match r.imm {
                ATOMIC_XCHG => {
                    format!(
                        "{reg}{} = xchg{}({}, {reg}{})",
                        r.src,
                        if w { "32_32" } else { "_64" },
                        addr(r.dst, r.off),
                        r.src
                    )
                }
                ATOMIC_CMPXCHG => format!(
                    "{reg}0 = cmpxchg{}({}, {reg}0, {reg}{})",
                    if w { "32_32" } else { "_64" },
                    addr(r.dst, r.off),
                    r.src
                ),
                i if i & ATOMIC_FETCH != 0 && op(i).is_some() => {
                    let (_, name) = op(i).unwrap_or_default();
                    format!("{reg}{} = atomic_fetch_{name}({at}, {reg}{})", r.src, r.src)
                }
                i if op(i).is_some() => {
                    let (sym, _) = op(i).unwrap_or_default();
                    format!("lock *{at} {sym} {reg}{}", r.src)
                }
                i => format!("<atomic {i:#x}>"),
            }
        }
        cls @ (CLS_ALU | CLS_ALU64) => {
            let reg = if cls == CLS_ALU64 { 'r' } else { 'w' };
            let src = if code & SRC_X != 0 { format!("{reg}{}", r.src) } else { r.imm.to_string() };
            let d = format!("{reg}{}", r.dst);
            let sym = match code & 0xf0 {
                ALU_ADD => "+=",
                ALU_SUB => "-=",
                ALU_MUL => "*=",
                ALU_DIV if r.off == 1 => "s/=",
                ALU_DIV => "/=",
                ALU_OR => "|=",
                ALU_AND => "&=",
                ALU_LSH => "<<=",
                ALU_RSH => ">>=",
                ALU_MOD if r.off == 1 => "s%=",
                ALU_MOD => "%=",
                ALU_XOR => "^=",
                ALU_ARSH => "s>>=",
                ALU_MOV if r.off != 0 => return line(pc, format!("{d} = (s{}){src}", r.off)),
                ALU_MOV => "=",
                ALU_NEG => return line(pc, format!("{d} = -{d}")),
                ALU_END => {
                    let kind = match (cls, code & SRC_X != 0) {
                        (CLS_ALU64, _) => "bswap",
                        (_, true) => "be",
                        _ => "le",
                    };
                    return line(pc, format!("r{} = {kind}{} r{}", r.dst, r.imm, r.dst));
                }
                _ => return line(pc, format!("<unknown opcode {code:#04x}>")),
            };
            format!("{d} {sym} {src}")
        }
        cls @ (CLS_JMP | CLS_JMP32) => {
            let reg = if cls == CLS_JMP { 'r' } else { 'w' };
            let src = if code & SRC_X != 0 { format!("{reg}{}", r.src) } else { r.imm.to_string() };
            let cond = match code & 0xf0 {
                JMP_JEQ => "==",
                JMP_JGT => ">",
                JMP_JGE => ">=",
                JMP_JSET => "&",
                JMP_JNE => "!=",
                JMP_JSGT => "s>",
                JMP_JSGE => "s>=",
                JMP_JLT => "<",
                JMP_JLE => "<=",
                JMP_JSLT => "s<",
                JMP_JSLE => "s<=",
                JMP_JA if cls == CLS_JMP => return line(pc, format!("goto {}", target(r.off.into()))),
                JMP_JA => return line(pc, format!("gotol {}", target(r.imm.into()))),
                JMP_CALL if r.src == PSEUDO_CALL => return line(pc, format!("call {}", target(r.imm.into()))),
                JMP_CALL => {
                    let name = helper_name(r.imm.into()).unwrap_or("unknown helper");
                    return line(pc, format!("call {} ({name})", r.imm));
                }
                JMP_EXIT => return line(pc, "exit".to_string()),
                _ => return line(pc, format!("<unknown opcode {code:#04x}>")),
            };
            format!("if {reg}{} {cond} {src} goto {}", r.dst, target(r.off.into()))
        }
        _ if pc > 0 && raw[pc - 1].code == (CLS_LD | SZ_DW | MODE_IMM) && code == 0 => {
            "(second half of the ld_imm64 above)".to_string()
        }
        _ => format!("<unknown opcode {code:#04x}>"),
    };
    line(pc, text)
}

fn line(pc: usize, text: String) -> String {
    format!("{pc:5}: {text}")
}
