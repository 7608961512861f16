//! Instruction semantics, faults and load checks, on programs assembled here.

use super::helpers::format_printk;
use super::insn::RawInsn;
use super::maps::{BPF_ANY, BPF_EXIST, BPF_NOEXIST, MapDeclError, MapStore};
use super::*;

// A tiny assembler. Sizes for loads/stores.
const W: u8 = 0x00;
const H: u8 = 0x08;
const B: u8 = 0x10;
const DW: u8 = 0x18;
// ALU operations.
const ADD: u8 = 0x00;
const SUB: u8 = 0x10;
const MUL: u8 = 0x20;
const DIV: u8 = 0x30;
const OR: u8 = 0x40;
const AND: u8 = 0x50;
const LSH: u8 = 0x60;
const RSH: u8 = 0x70;
const MOD: u8 = 0x90;
const XOR: u8 = 0xa0;
const ARSH: u8 = 0xc0;
// Jumps.
const JEQ: u8 = 0x10;
const JGT: u8 = 0x20;
const JSET: u8 = 0x40;
const JNE: u8 = 0x50;
const JSGT: u8 = 0x60;
const JSGE: u8 = 0x70;
const JLT: u8 = 0xa0;
const JSLT: u8 = 0xc0;
const JSLE: u8 = 0xd0;

fn ins(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> RawInsn {
    RawInsn::new(code, dst, src, off, imm)
}
fn mov(d: u8, imm: i32) -> RawInsn {
    ins(0xb7, d, 0, 0, imm)
}
fn movr(d: u8, s: u8) -> RawInsn {
    ins(0xbf, d, s, 0, 0)
}
fn mov32(d: u8, imm: i32) -> RawInsn {
    ins(0xb4, d, 0, 0, imm)
}
fn alu(op: u8, d: u8, imm: i32) -> RawInsn {
    ins(op | 0x07, d, 0, 0, imm)
}
fn alur(op: u8, d: u8, s: u8) -> RawInsn {
    ins(op | 0x0f, d, s, 0, 0)
}
fn alu32(op: u8, d: u8, imm: i32) -> RawInsn {
    ins(op | 0x04, d, 0, 0, imm)
}
fn alu32r(op: u8, d: u8, s: u8) -> RawInsn {
    ins(op | 0x0c, d, s, 0, 0)
}
/// Signed div/mod (offset 1).
fn salur(op: u8, d: u8, s: u8) -> RawInsn {
    ins(op | 0x0f, d, s, 1, 0)
}
fn salu32r(op: u8, d: u8, s: u8) -> RawInsn {
    ins(op | 0x0c, d, s, 1, 0)
}
fn ld64(d: u8, v: u64) -> [RawInsn; 2] {
    [ins(0x18, d, 0, 0, v as u32 as i32), ins(0, 0, 0, 0, (v >> 32) as u32 as i32)]
}
fn ld_map(d: u8, m: i32) -> [RawInsn; 2] {
    [ins(0x18, d, 1, 0, m), ins(0, 0, 0, 0, 0)]
}
fn ld_map_value(d: u8, m: i32, off: i32) -> [RawInsn; 2] {
    [ins(0x18, d, 2, 0, m), ins(0, 0, 0, 0, off)]
}
fn exit() -> RawInsn {
    ins(0x95, 0, 0, 0, 0)
}
fn ja(off: i16) -> RawInsn {
    ins(0x05, 0, 0, off, 0)
}
fn jmp(op: u8, d: u8, imm: i32, off: i16) -> RawInsn {
    ins(op | 0x05, d, 0, off, imm)
}
fn jmpr(op: u8, d: u8, s: u8, off: i16) -> RawInsn {
    ins(op | 0x0d, d, s, off, 0)
}
fn jmp32(op: u8, d: u8, imm: i32, off: i16) -> RawInsn {
    ins(op | 0x06, d, 0, off, imm)
}
fn ldx(size: u8, d: u8, s: u8, off: i16) -> RawInsn {
    ins(0x61 | size, d, s, off, 0)
}
fn ldsx(size: u8, d: u8, s: u8, off: i16) -> RawInsn {
    ins(0x81 | size, d, s, off, 0)
}
fn stx(size: u8, d: u8, s: u8, off: i16) -> RawInsn {
    ins(0x63 | size, d, s, off, 0)
}
fn st(size: u8, d: u8, off: i16, imm: i32) -> RawInsn {
    ins(0x62 | size, d, 0, off, imm)
}
fn atomic(size: u8, d: u8, s: u8, off: i16, op: i32) -> RawInsn {
    ins(0xc3 | size, d, s, off, op)
}
fn call(id: i32) -> RawInsn {
    ins(0x85, 0, 0, 0, id)
}
fn call_local(rel: i32) -> RawInsn {
    ins(0x85, 0, 1, 0, rel)
}

/// Flattens instruction groups (single instructions and ld_imm64 pairs).
macro_rules! prog {
    ($($e:expr),* $(,)?) => {{
        let mut v: Vec<RawInsn> = Vec::new();
        $( v.extend(Insns::from($e).0); )*
        v
    }};
}
struct Insns(Vec<RawInsn>);
impl From<RawInsn> for Insns {
    fn from(i: RawInsn) -> Self {
        Insns(vec![i])
    }
}
impl From<[RawInsn; 2]> for Insns {
    fn from(i: [RawInsn; 2]) -> Self {
        Insns(i.to_vec())
    }
}

fn load(p: Vec<RawInsn>, maps: Vec<MapStore>) -> Result<Program, LoadError> {
    Program::assemble("test".into(), None, p, maps)
}

fn run(p: Vec<RawInsn>) -> Result<u64, Fault> {
    run_ctx(p, &[])
}

fn run_ctx(p: Vec<RawInsn>, ctx: &[u8]) -> Result<u64, Fault> {
    load(p, vec![]).expect("program loads").run(ctx, 100_000)
}

fn ok(p: Vec<RawInsn>) -> u64 {
    run(p).expect("program runs")
}

fn hash_map(name: &str, key: u32, value: u32, n: u32) -> MapStore {
    MapStore::new(name, 1, key, value, n).unwrap()
}

#[test]
fn alu32_results_are_zero_extended() {
    assert_eq!(ok(prog![mov(0, -1), alu32(ADD, 0, 1), exit()]), 0);
    assert_eq!(ok(prog![mov(0, -1), alu32(ADD, 0, 3), exit()]), 2);
    assert_eq!(ok(prog![mov(0, -1), ins(0xbc, 0, 0, 0, 0), exit()]), 0xffff_ffff);
    assert_eq!(ok(prog![mov32(0, -1), exit()]), 0xffff_ffff);
    assert_eq!(ok(prog![mov(0, -1), exit()]), u64::MAX);
    assert_eq!(ok(prog![ld64(0, 0x1234_5678_9abc_def0), alu32(MUL, 0, 1), exit()]), 0x9abc_def0);
    assert_eq!(ok(prog![mov(0, 0), ins(0x84, 0, 0, 0, 0), exit()]), 0);
    assert_eq!(ok(prog![mov(0, 1), ins(0x84, 0, 0, 0, 0), exit()]), 0xffff_ffff);
    assert_eq!(ok(prog![mov(0, 1), ins(0x87, 0, 0, 0, 0), exit()]), u64::MAX);
    assert_eq!(ok(prog![ld64(0, 0xffff_ffff_0000_0005), mov(1, 3), alu32r(SUB, 0, 1), exit()]), 2);
}

#[test]
fn alu64_basics() {
    assert_eq!(ok(prog![mov(0, 6), mov(1, 7), alur(MUL, 0, 1), exit()]), 42);
    assert_eq!(ok(prog![mov(0, 0b1100), alu(OR, 0, 0b0011), alu(AND, 0, 0b0110), alu(XOR, 0, 1), exit()]), 0b0111);
    assert_eq!(ok(prog![mov(0, 5), alu(SUB, 0, 7), exit()]), (-2i64) as u64);
    assert_eq!(ok(prog![mov(0, 1), alu(ADD, 0, -1), exit()]), 0);
}

#[test]
fn division_and_modulo_by_zero() {
    assert_eq!(ok(prog![mov(0, 7), mov(1, 0), alur(DIV, 0, 1), exit()]), 0);
    assert_eq!(ok(prog![mov(0, 7), mov(1, 0), alur(MOD, 0, 1), exit()]), 7);
    assert_eq!(ok(prog![mov(0, 7), alu(DIV, 0, 0), exit()]), 0);
    assert_eq!(ok(prog![mov(0, 7), alu(MOD, 0, 0), exit()]), 7);
    // 32-bit: the untouched dividend is still truncated.
    assert_eq!(ok(prog![ld64(0, 0x1_0000_0007), mov(1, 0), alu32r(MOD, 0, 1), exit()]), 7);
    assert_eq!(ok(prog![ld64(0, 0x1_0000_0007), mov(1, 0), alu32r(DIV, 0, 1), exit()]), 0);
    // Signed ones too.
    assert_eq!(ok(prog![mov(0, -7), mov(1, 0), salur(DIV, 0, 1), exit()]), 0);
    assert_eq!(ok(prog![mov(0, -7), mov(1, 0), salur(MOD, 0, 1), exit()]), (-7i64) as u64);
    // A divisor above 32 bits counts as zero in 32-bit division.
    assert_eq!(ok(prog![mov(0, 9), ld64(1, 1 << 32), alu32r(DIV, 0, 1), exit()]), 0);
    // Unsigned division by a negative immediate divides by 2^64 - n.
    assert_eq!(ok(prog![mov(0, -1), alu(DIV, 0, -1), exit()]), 1);
    assert_eq!(ok(prog![mov(0, 100), alu(DIV, 0, 7), exit()]), 14);
    assert_eq!(ok(prog![mov(0, 100), alu(MOD, 0, 7), exit()]), 2);
}

#[test]
fn signed_operations() {
    assert_eq!(ok(prog![mov(0, -7), mov(1, 2), salur(DIV, 0, 1), exit()]), (-3i64) as u64);
    assert_eq!(ok(prog![mov(0, -7), mov(1, 2), salur(MOD, 0, 1), exit()]), (-1i64) as u64);
    assert_eq!(ok(prog![mov(0, 7), mov(1, -2), salur(MOD, 0, 1), exit()]), 1);
    // Unsigned interpretation of the same bits.
    assert_eq!(ok(prog![mov(0, -7), mov(1, 2), alur(DIV, 0, 1), exit()]), ((-7i64) as u64) / 2);
    // Overflow wraps.
    assert_eq!(ok(prog![ld64(0, i64::MIN as u64), mov(1, -1), salur(DIV, 0, 1), exit()]), i64::MIN as u64);
    assert_eq!(ok(prog![ld64(0, i64::MIN as u64), mov(1, -1), salur(MOD, 0, 1), exit()]), 0);
    // 32-bit signed division, zero-extended.
    assert_eq!(ok(prog![mov(0, -8), mov(1, 3), salu32r(DIV, 0, 1), exit()]), 0xffff_fffe);
    assert_eq!(ok(prog![mov(0, -8), mov(1, 3), salu32r(MOD, 0, 1), exit()]), 0xffff_fffe);
    // Signed division by an immediate.
    assert_eq!(ok(prog![mov(0, -9), ins(0x37, 0, 0, 1, 3), exit()]), (-3i64) as u64);
    // movsx.
    assert_eq!(ok(prog![mov(1, 0x80), ins(0xbf, 0, 1, 8, 0), exit()]), (-128i64) as u64);
    assert_eq!(ok(prog![mov(1, 0x7fff), ins(0xbf, 0, 1, 16, 0), exit()]), 0x7fff);
    assert_eq!(ok(prog![mov(1, 0x8000), ins(0xbf, 0, 1, 16, 0), exit()]), (-32768i64) as u64);
    assert_eq!(ok(prog![ld64(1, 0x8000_0000), ins(0xbf, 0, 1, 32, 0), exit()]), 0xffff_ffff_8000_0000);
    assert_eq!(ok(prog![mov(1, 0x8000), ins(0xbc, 0, 1, 16, 0), exit()]), 0xffff_8000);
    assert_eq!(ok(prog![mov(1, 0xff), ins(0xbc, 0, 1, 8, 0), exit()]), 0xffff_ffff);
    // Arithmetic shifts.
    assert_eq!(ok(prog![mov(0, -16), alu(ARSH, 0, 2), exit()]), (-4i64) as u64);
    assert_eq!(ok(prog![mov32(0, i32::MIN), alu32(ARSH, 0, 31), exit()]), 0xffff_ffff);
    assert_eq!(ok(prog![mov(0, -16), alu(RSH, 0, 60), exit()]), 0xf);
    // Sign-extending loads.
    assert_eq!(ok(prog![st(B, 10, -1, 0xff), ldsx(B, 0, 10, -1), exit()]), u64::MAX);
    assert_eq!(ok(prog![st(H, 10, -2, 0x8001), ldsx(H, 0, 10, -2), exit()]), (-32767i64) as u64);
    assert_eq!(ok(prog![st(W, 10, -4, -2), ldsx(W, 0, 10, -4), exit()]), (-2i64) as u64);
    assert_eq!(ok(prog![st(W, 10, -4, -2), ldx(W, 0, 10, -4), exit()]), 0xffff_fffe);
    // Signed compares.
    assert_eq!(ok(prog![mov(0, 0), mov(1, -1), jmp(JSGT, 1, 1, 1), mov(0, 1), exit()]), 1);
    assert_eq!(ok(prog![mov(0, 0), mov(1, -1), jmp(JGT, 1, 1, 1), mov(0, 1), exit()]), 0);
    assert_eq!(ok(prog![mov(0, 0), mov(1, -5), mov(2, -4), jmpr(JSLT, 1, 2, 1), mov(0, 1), exit()]), 0);
    assert_eq!(ok(prog![mov(0, 0), mov(1, -4), jmp(JSGE, 1, -4, 1), mov(0, 1), exit()]), 0);
    assert_eq!(ok(prog![mov(0, 0), mov(1, -4), jmp(JSLE, 1, -5, 1), mov(0, 1), exit()]), 1);
}

#[test]
fn shifts_are_masked() {
    assert_eq!(ok(prog![mov(0, 1), mov(1, 65), alur(LSH, 0, 1), exit()]), 2);
    assert_eq!(ok(prog![mov(0, 1), alu(LSH, 0, 63), exit()]), 1 << 63);
    assert_eq!(ok(prog![mov(0, 1), mov(1, 33), alu32r(LSH, 0, 1), exit()]), 2);
    assert_eq!(ok(prog![mov(0, 1), alu32(LSH, 0, 31), exit()]), 0x8000_0000);
    assert_eq!(ok(prog![mov(0, 1), alu32(LSH, 0, 32), exit()]), 1);
    assert_eq!(ok(prog![ld64(0, 0x8000_0000_0000_0000), mov(1, 127), alur(RSH, 0, 1), exit()]), 1);
    assert_eq!(ok(prog![ld64(0, 0xffff_ffff_8000_0000), alu32(RSH, 0, 31), exit()]), 1);
    assert_eq!(ok(prog![mov(0, -1), mov(1, 200), alur(ARSH, 0, 1), exit()]), u64::MAX);
}

#[test]
fn byte_swaps() {
    let v = 0x0102_0304_0506_0708u64;
    let end = |code: u8, imm: i32| ok(prog![ld64(0, v), ins(code, 0, 0, 0, imm), exit()]);
    assert_eq!(end(0xdc, 16), 0x0807);
    assert_eq!(end(0xdc, 32), 0x0807_0605);
    assert_eq!(end(0xdc, 64), 0x0807_0605_0403_0201);
    assert_eq!(end(0xd4, 16), 0x0708);
    assert_eq!(end(0xd4, 32), 0x0506_0708);
    assert_eq!(end(0xd4, 64), v);
    assert_eq!(end(0xd7, 16), 0x0807);
    assert_eq!(end(0xd7, 32), 0x0807_0605);
    assert_eq!(end(0xd7, 64), 0x0807_0605_0403_0201);
}

#[test]
fn jumps() {
    // r0 counts the taken branches.
    let taken = |j: RawInsn, setup: Vec<RawInsn>| {
        let mut p = setup;
        p.extend(prog![mov(0, 0), j, ja(1), mov(0, 1), exit()]);
        ok(p)
    };
    assert_eq!(taken(jmp(JEQ, 1, 5, 1), prog![mov(1, 5)]), 1);
    assert_eq!(taken(jmp(JNE, 1, 5, 1), prog![mov(1, 5)]), 0);
    assert_eq!(taken(jmp(JSET, 1, 4, 1), prog![mov(1, 6)]), 1);
    assert_eq!(taken(jmp(JSET, 1, 1, 1), prog![mov(1, 6)]), 0);
    assert_eq!(taken(jmp(JLT, 1, 7, 1), prog![mov(1, 6)]), 1);
    assert_eq!(taken(jmpr(JGT, 1, 2, 1), prog![mov(1, 6), mov(2, 5)]), 1);
    assert_eq!(taken(ins(0x3d, 1, 2, 1, 0), prog![mov(1, 5), mov(2, 5)]), 1); // jge
    assert_eq!(taken(ins(0xb5, 1, 0, 1, 4), prog![mov(1, 5)]), 0); // jle
    // JMP32 compares the low halves only.
    assert_eq!(taken(jmp32(JEQ, 1, 0, 1), prog![ld64(1, 1 << 32)]), 1);
    assert_eq!(taken(jmp(JEQ, 1, 0, 1), prog![ld64(1, 1 << 32)]), 0);
    assert_eq!(taken(jmp32(JSGT, 1, 0, 1), prog![ld64(1, 0x0000_0001_8000_0000)]), 0);
    assert_eq!(taken(jmp32(JSLT, 1, 0, 1), prog![ld64(1, 0x0000_0001_8000_0000)]), 1);
    assert_eq!(taken(jmp32(JGT, 1, 0, 1), prog![ld64(1, 0x0000_0001_8000_0000)]), 1);
    assert_eq!(taken(ins(0x1e, 1, 2, 1, 0), prog![ld64(1, 0x5_0000_0003), mov(2, 3)]), 1);
    // The immediate of a 64-bit compare is sign-extended.
    assert_eq!(taken(jmp(JEQ, 1, -1, 1), prog![mov(1, -1)]), 1);
    // gotol: JMP32 ja with the offset in imm.
    assert_eq!(ok(prog![mov(0, 1), ins(0x06, 0, 0, 0, 1), mov(0, 2), exit()]), 1);
    // Backward jumps: sum 1..=10.
    assert_eq!(ok(prog![mov(0, 0), mov(1, 10), alur(ADD, 0, 1), alu(SUB, 1, 1), jmp(JNE, 1, 0, -3), exit()]), 55);
}

#[test]
fn local_calls_preserve_r6_to_r9_and_have_their_own_frames() {
    let p = prog![
        // main
        mov(6, 11),
        mov(7, 12),
        mov(8, 13),
        mov(9, 14),
        st(DW, 10, -8, 1000),
        mov(1, 5),
        call_local(8),      // -> callee at 15
        ldx(DW, 2, 10, -8), // still 1000
        alur(ADD, 0, 2),
        alur(ADD, 0, 6),
        alur(ADD, 0, 7),
        alur(ADD, 0, 8),
        alur(ADD, 0, 9),
        exit(),
        ja(-1), // padding, never reached
        // callee(r1): clobbers r6-r9 and its own r10-8, returns 2 * r1
        mov(6, 0),
        mov(7, 0),
        mov(8, 0),
        mov(9, 0),
        st(DW, 10, -8, 999),
        movr(0, 1),
        alu(MUL, 0, 2),
        exit(),
    ];
    assert_eq!(ok(p), 10 + 1000 + 11 + 12 + 13 + 14);
}

#[test]
fn callee_can_use_a_pointer_into_the_callers_frame() {
    let p = prog![
        movr(1, 10),
        alu(ADD, 1, -8),
        st(DW, 10, -8, 1),
        call_local(2),
        ldx(DW, 0, 10, -8),
        exit(),
        // callee(r1 = &caller's slot): *r1 += 41
        ldx(DW, 2, 1, 0),
        alu(ADD, 2, 41),
        stx(DW, 1, 2, 0),
        exit(),
    ];
    assert_eq!(ok(p), 42);
}

#[test]
fn a_callees_frame_is_separate_memory() {
    // The callee cannot reach its caller's frame by going above its own r10.
    let p = prog![call_local(1), exit(), ldx(DW, 0, 10, 8), exit()];
    assert!(matches!(run(p), Err(Fault::Memory { pc: 2, write: false, .. })));
}

#[test]
fn call_depth_is_limited() {
    // Recursion nine deep: main plus 8 nested calls is fine, one more faults.
    let depth = |n: i32| {
        prog![
            mov(1, n),
            call_local(1),
            exit(),
            // f(r1): if r1 == 0 return; f(r1 - 1)
            jmp(JEQ, 1, 0, 2),
            alu(SUB, 1, 1),
            call_local(-3),
            exit(),
        ]
    };
    assert_eq!(run(depth(7)), Ok(0));
    assert!(matches!(run(depth(8)), Err(Fault::CallDepth { pc: 5 })));
}

#[test]
fn atomics() {
    let add = super::insn::ATOMIC_ADD;
    let fetch = super::insn::ATOMIC_FETCH;
    let or = super::insn::ATOMIC_OR;
    let and = super::insn::ATOMIC_AND;
    let xor = super::insn::ATOMIC_XOR;
    let xchg = super::insn::ATOMIC_XCHG;
    let cmpxchg = super::insn::ATOMIC_CMPXCHG;
    // add without fetch leaves the source alone; with fetch it gets the old value.
    assert_eq!(ok(prog![st(DW, 10, -8, 5), mov(1, 3), atomic(DW, 10, 1, -8, add), ldx(DW, 0, 10, -8), exit()]), 8);
    assert_eq!(ok(prog![st(DW, 10, -8, 5), mov(1, 3), atomic(DW, 10, 1, -8, add), movr(0, 1), exit()]), 3);
    assert_eq!(ok(prog![st(DW, 10, -8, 5), mov(1, 3), atomic(DW, 10, 1, -8, add | fetch), movr(0, 1), exit()]), 5);
    assert_eq!(
        ok(prog![
            st(DW, 10, -8, 0b1100),
            mov(1, 0b1010),
            atomic(DW, 10, 1, -8, or | fetch),
            ldx(DW, 0, 10, -8),
            exit()
        ]),
        0b1110
    );
    assert_eq!(
        ok(prog![st(DW, 10, -8, 0b1100), mov(1, 0b1010), atomic(DW, 10, 1, -8, and), ldx(DW, 0, 10, -8), exit()]),
        0b1000
    );
    assert_eq!(
        ok(prog![st(DW, 10, -8, 0b1100), mov(1, 0b1010), atomic(DW, 10, 1, -8, xor | fetch), movr(0, 1), exit()]),
        0b1100
    );
    assert_eq!(
        ok(prog![st(DW, 10, -8, 0b1100), mov(1, 0b1010), atomic(DW, 10, 1, -8, xor), ldx(DW, 0, 10, -8), exit()]),
        0b0110
    );
    // xchg.
    assert_eq!(
        ok(prog![
            st(DW, 10, -8, 7),
            mov(1, 9),
            atomic(DW, 10, 1, -8, xchg),
            ldx(DW, 0, 10, -8),
            alu(MUL, 0, 100),
            alur(ADD, 0, 1),
            exit()
        ]),
        907
    );
    // cmpxchg: r0 is compared and receives the old value.
    let cas = |expected: i32| {
        ok(prog![
            st(DW, 10, -8, 7),
            mov(0, expected),
            mov(1, 9),
            atomic(DW, 10, 1, -8, cmpxchg),
            ldx(DW, 2, 10, -8),
            alu(MUL, 0, 100),
            alur(ADD, 0, 2),
            exit()
        ])
    };
    assert_eq!(cas(7), 709);
    assert_eq!(cas(8), 707);
    // 32-bit: only 4 bytes change, the fetched value is zero-extended.
    assert_eq!(
        ok(prog![st(DW, 10, -8, -1), mov(1, 1), atomic(W, 10, 1, -8, add | fetch), ldx(DW, 0, 10, -8), exit()]),
        0xffff_ffff_0000_0000
    );
    assert_eq!(
        ok(prog![st(DW, 10, -8, -1), mov(1, 1), atomic(W, 10, 1, -8, add | fetch), movr(0, 1), exit()]),
        0xffff_ffff
    );
    // 32-bit cmpxchg compares the low half of r0 only.
    assert_eq!(
        ok(prog![
            st(W, 10, -8, 7),
            ld64(0, 0xabcd_0000_0000_0007),
            mov(1, 9),
            atomic(W, 10, 1, -8, cmpxchg),
            ldx(W, 2, 10, -8),
            alu(MUL, 0, 100),
            alur(ADD, 0, 2),
            exit()
        ]),
        709
    );
    // Atomics on the context fault (it is read-only).
    let ctx = [0u8; 8];
    assert!(matches!(
        run_ctx(prog![mov(2, 1), atomic(DW, 1, 2, 0, add), exit()], &ctx),
        Err(Fault::Memory { pc: 1, write: true, .. })
    ));
}

#[test]
fn budget_stops_infinite_loops() {
    let mut p = load(prog![mov(0, 0), alu(ADD, 0, 1), ja(-2), exit()], vec![]).unwrap();
    assert_eq!(p.run(&[], 1000), Err(Fault::Budget { budget: 1000, pc: 2 }));
    // A self-jump too.
    assert!(matches!(run(prog![ja(-1), exit()]), Err(Fault::Budget { .. })));
    // The budget counts every executed instruction, exactly.
    let mut p = load(prog![mov(0, 3), exit()], vec![]).unwrap();
    assert_eq!(p.run(&[], 2), Ok(3));
    assert!(matches!(p.run(&[], 1), Err(Fault::Budget { budget: 1, pc: 1 })));
    assert!(matches!(p.run(&[], 0), Err(Fault::Budget { budget: 0, pc: 0 })));
    // Local calls' instructions count too.
    let mut p = load(prog![call_local(1), exit(), mov(0, 1), exit()], vec![]).unwrap();
    assert_eq!(p.run(&[], 4), Ok(1));
    assert!(p.run(&[], 3).is_err());
}

#[test]
fn memory_faults() {
    let ctx: Vec<u8> = (0..16).collect();
    // In bounds.
    assert_eq!(run_ctx(prog![ldx(DW, 0, 1, 8), exit()], &ctx), Ok(u64::from_le_bytes(ctx[8..].try_into().unwrap())));
    assert_eq!(run_ctx(prog![ldx(B, 0, 1, 15), exit()], &ctx), Ok(15));
    // Past the end, partly past the end, before the start.
    for p in [ldx(DW, 0, 1, 16), ldx(DW, 0, 1, 9), ldx(B, 0, 1, -1), ldx(W, 0, 1, i16::MAX)] {
        let f = run_ctx(prog![p, exit()], &ctx).unwrap_err();
        assert!(matches!(f, Fault::Memory { pc: 0, write: false, .. }), "{f}");
    }
    // Stores into the context.
    let f = run_ctx(prog![st(W, 1, 0, 1), exit()], &ctx).unwrap_err();
    assert!(matches!(f, Fault::Memory { pc: 0, write: true, len: 4, .. }), "{f}");
    assert!(f.to_string().contains("read-only"), "{f}");
    assert!(matches!(run_ctx(prog![stx(B, 1, 1, 3), exit()], &ctx), Err(Fault::Memory { write: true, .. })));
    // Null and forged pointers.
    for addr in [0u64, 8, 0xdead_beef, 0xffff_ffff_ffff_fff8, 0x7fff_0000_0000_0000] {
        let f = run(prog![ld64(1, addr), ldx(DW, 0, 1, 0), exit()]).unwrap_err();
        assert_eq!(f, Fault::Memory { pc: 2, addr, len: 8, write: false, region: f_region(&f) });
        assert!(matches!(run(prog![ld64(1, addr), st(DW, 1, 0, 0), exit()]), Err(Fault::Memory { .. })));
    }
    // Outside the stack frame, both ends.
    assert!(matches!(run(prog![ldx(DW, 0, 10, 0), exit()]), Err(Fault::Memory { .. })));
    assert!(matches!(run(prog![ldx(DW, 0, 10, -520), exit()]), Err(Fault::Memory { .. })));
    assert_eq!(run(prog![st(DW, 10, -512, 3), ldx(DW, 0, 10, -512), exit()]), Ok(3));
    // A map handle is not memory.
    let p = load(prog![ld_map(1, 0), ldx(B, 0, 1, 0), exit()], vec![hash_map("m", 4, 4, 1)]).unwrap();
    let f = { p }.run(&[], 100).unwrap_err();
    assert!(f.to_string().contains("map handle"), "{f}");
}

fn f_region(f: &Fault) -> String {
    match f {
        Fault::Memory { region, .. } => region.clone(),
        _ => String::new(),
    }
}

#[test]
fn helper_pointer_arguments_are_checked() {
    let maps = || vec![hash_map("m", 8, 8, 4)];
    // Key pointer outside memory.
    let mut p = load(prog![ld_map(1, 0), mov(2, 0x1234), call(1), exit()], maps()).unwrap();
    let f = p.run(&[], 100).unwrap_err();
    assert!(matches!(&f, Fault::Helper { pc: 3, id: 1, .. }), "{f}");
    // Key straddling the end of the stack frame.
    let mut p = load(prog![ld_map(1, 0), movr(2, 10), alu(ADD, 2, -4), call(1), exit()], maps()).unwrap();
    assert!(matches!(p.run(&[], 100), Err(Fault::Helper { id: 1, .. })));
    // Value pointer into the read-only context is fine to read from.
    let ctx = [7u8; 8];
    let mut p = load(
        prog![movr(3, 1), ld_map(1, 0), movr(2, 10), alu(ADD, 2, -8), st(DW, 2, 0, 1), mov(4, 0), call(2), exit()],
        maps(),
    )
    .unwrap();
    assert_eq!(p.run(&ctx, 100), Ok(0));
    assert_eq!(p.map_lookup("m", &1u64.to_le_bytes()), Some(ctx.to_vec()));
    // r1 not a map.
    let mut p = load(prog![movr(1, 10), movr(2, 10), alu(ADD, 2, -8), call(1), exit()], maps()).unwrap();
    assert!(matches!(p.run(&[], 100), Err(Fault::Helper { id: 1, .. })));
    // A handle for a map that does not exist.
    let mut p =
        load(prog![ld64(1, super::mem::map_handle(5)), movr(2, 10), alu(ADD, 2, -8), call(3), exit()], maps()).unwrap();
    assert!(matches!(p.run(&[], 100), Err(Fault::Helper { id: 3, .. })));
    // A format string outside memory.
    let mut p = load(prog![mov(1, 16), mov(2, 4), call(6), exit()], vec![]).unwrap();
    assert!(matches!(p.run(&[], 100), Err(Fault::Helper { id: 6, .. })));
}

/// Program: key = r6 (u64 on the stack), value = r7; returns update's result.
fn update_prog(flags: i32) -> Vec<RawInsn> {
    prog![
        stx(DW, 10, 6, -8),
        stx(DW, 10, 7, -16),
        ld_map(1, 0),
        movr(2, 10),
        alu(ADD, 2, -8),
        movr(3, 10),
        alu(ADD, 3, -16),
        mov(4, flags),
        call(2),
        exit()
    ]
}

fn with_regs(mut p: Vec<RawInsn>, key: i32, value: i32) -> Vec<RawInsn> {
    p.splice(0..0, [mov(6, key), mov(7, value)]);
    p
}

#[test]
fn hash_map_semantics_from_programs() {
    let mut maps = vec![hash_map("h", 8, 8, 2)];
    let mut go = |key: i32, value: i32, flags: i32| -> i64 {
        let mut p = load(with_regs(update_prog(flags), key, value), std::mem::take(&mut maps)).unwrap();
        let r = p.run(&[], 1000).unwrap() as i64;
        maps = std::mem::take(&mut p.maps);
        r
    };
    assert_eq!(go(1, 10, BPF_EXIST as i32), -(libc::ENOENT as i64));
    assert_eq!(go(1, 10, BPF_NOEXIST as i32), 0);
    assert_eq!(go(1, 11, BPF_NOEXIST as i32), -(libc::EEXIST as i64));
    assert_eq!(go(1, 12, BPF_EXIST as i32), 0);
    assert_eq!(go(2, 20, BPF_ANY as i32), 0);
    assert_eq!(go(3, 30, BPF_ANY as i32), -(libc::E2BIG as i64));
    assert_eq!(go(2, 21, BPF_ANY as i32), 0);
    assert_eq!(go(2, 21, 7), -(libc::EINVAL as i64));

    // Lookup returns a pointer into the map's storage; writes through it stick.
    let p = prog![
        st(DW, 10, -8, 1),
        ld_map(1, 0),
        movr(2, 10),
        alu(ADD, 2, -8),
        call(1),
        jmp(JEQ, 0, 0, 4),
        ldx(DW, 1, 0, 0),
        alu(ADD, 1, 100),
        stx(DW, 0, 1, 0),
        movr(0, 1),
        exit()
    ];
    let mut p = load(p, maps).unwrap();
    assert_eq!(p.run(&[], 1000), Ok(112));
    assert_eq!(p.map_lookup("h", &1u64.to_le_bytes()), Some(112u64.to_le_bytes().to_vec()));
    // Delete from the program, then a missing key.
    let del = prog![st(DW, 10, -8, 1), ld_map(1, 0), movr(2, 10), alu(ADD, 2, -8), call(3), exit()];
    let mut d = load(del, std::mem::take(&mut p.maps)).unwrap();
    assert_eq!(d.run(&[], 100), Ok(0));
    assert_eq!(d.run(&[], 100), Ok(-(libc::ENOENT as i64) as u64));
    assert_eq!(d.map_lookup("h", &1u64.to_le_bytes()), None);
    assert_eq!(d.maps()[0].entries, 1);
}

#[test]
fn array_map_semantics() {
    let mk = || MapStore::new("a", 2, 4, 8, 4).unwrap();
    let mut m = mk();
    assert_eq!(m.update(&3u32.to_le_bytes(), &[1; 8], BPF_ANY), Ok(()));
    assert_eq!(m.update(&4u32.to_le_bytes(), &[1; 8], BPF_ANY), Err(libc::E2BIG));
    assert_eq!(m.update(&0u32.to_le_bytes(), &[1; 8], BPF_NOEXIST), Err(libc::EEXIST));
    assert_eq!(m.update(&0u32.to_le_bytes(), &[2; 8], BPF_EXIST), Ok(()));
    assert_eq!(m.delete(&0u32.to_le_bytes()), Err(libc::EINVAL));
    assert_eq!(m.find(&9u32.to_le_bytes(), true), None);
    assert_eq!(m.find(&3u32.to_le_bytes(), true), Some(24));
    assert_eq!(m.entries(), 4);
    assert_eq!(MapStore::new("a", 2, 8, 8, 4).err(), Some(MapDeclError::ArrayKey(8)), "array keys are u32");

    // Direct value access (ld_imm64 of a map value) and the program's view.
    let mut p =
        load(prog![ld_map_value(1, 0, 8), ldx(DW, 0, 1, 0), alu(ADD, 0, 1), stx(DW, 1, 0, 0), exit()], vec![mk()])
            .unwrap();
    assert_eq!(p.run(&[], 100), Ok(1));
    assert_eq!(p.run(&[], 100), Ok(2));
    assert_eq!(p.map_lookup("a", &1u32.to_le_bytes()), Some(2u64.to_le_bytes().to_vec()));
    p.map_update("a", &1u32.to_le_bytes(), &40u64.to_le_bytes()).unwrap();
    assert_eq!(p.run(&[], 100), Ok(41));
    assert_eq!(p.map_update("a", &4u32.to_le_bytes(), &[0; 8]), Err(MapError::OutOfRange("a".into())));
    assert!(matches!(p.map_update("a", &[0; 3], &[0; 8]), Err(MapError::KeySize { .. })));
    assert!(matches!(p.map_update("a", &[0; 4], &[0; 7]), Err(MapError::ValueSize { .. })));
    assert!(matches!(p.map_update("nope", &[0; 4], &[0; 8]), Err(MapError::NoSuchMap(_))));
    // Past the last entry.
    let mut p = load(prog![ld_map_value(1, 0, 0), ldx(DW, 0, 1, 32), exit()], vec![mk()]).unwrap();
    assert!(matches!(p.run(&[], 100), Err(Fault::Memory { .. })));
    // A value offset outside the value is rejected at load.
    assert!(matches!(load(prog![ld_map_value(1, 0, 8 * 4), exit()], vec![mk()]), Err(LoadError::Instruction { .. })));
}

#[test]
fn lru_hash_evicts_the_least_recently_used() {
    let mut m = MapStore::new("l", 9, 4, 4, 3).unwrap();
    for k in 0u32..3 {
        m.update(&k.to_le_bytes(), &k.to_le_bytes(), BPF_ANY).unwrap();
    }
    // Touch 0, so 1 is now the oldest.
    assert!(m.find(&0u32.to_le_bytes(), true).is_some());
    m.update(&3u32.to_le_bytes(), &[3, 0, 0, 0], BPF_ANY).unwrap();
    assert!(m.peek(&1u32.to_le_bytes()).is_none());
    for k in [0u32, 2, 3] {
        let off = m.peek(&k.to_le_bytes()).unwrap();
        assert_eq!(m.values[off..off + 4], k.to_le_bytes());
    }
    // Updating counts as a use: 2 is now the oldest.
    m.update(&0u32.to_le_bytes(), &[9; 4], BPF_ANY).unwrap();
    m.update(&3u32.to_le_bytes(), &[9; 4], BPF_ANY).unwrap();
    m.update(&4u32.to_le_bytes(), &[4; 4], BPF_ANY).unwrap();
    assert!(m.peek(&2u32.to_le_bytes()).is_none());
    assert_eq!(m.entries(), 3);
    // Delete, then refill without eviction.
    m.delete(&0u32.to_le_bytes()).unwrap();
    m.update(&5u32.to_le_bytes(), &[5; 4], BPF_ANY).unwrap();
    assert!(m.peek(&3u32.to_le_bytes()).is_some());
    assert!(m.peek(&4u32.to_le_bytes()).is_some());
    assert_eq!(m.keys().len(), 3);
    // A plain hash map does not evict.
    let mut h = MapStore::new("h", 1, 4, 4, 1).unwrap();
    h.update(&[1; 4], &[1; 4], BPF_ANY).unwrap();
    assert_eq!(h.update(&[2; 4], &[2; 4], BPF_ANY), Err(libc::E2BIG));
}

#[test]
fn deleted_hash_slots_are_zeroed_and_reused() {
    let mut m = MapStore::new("h", 5, 4, 4, 2).unwrap();
    m.update(&[1; 4], &[0xaa; 4], BPF_ANY).unwrap();
    let off = m.peek(&[1; 4]).unwrap();
    m.delete(&[1; 4]).unwrap();
    assert_eq!(m.values[off..off + 4], [0; 4]);
    assert_eq!(m.delete(&[1; 4]), Err(libc::ENOENT));
    m.update(&[2; 4], &[0xbb; 4], BPF_ANY).unwrap();
    m.update(&[3; 4], &[0xcc; 4], BPF_ANY).unwrap();
    assert_eq!(m.entries(), 2);
}

#[test]
fn map_shapes_are_checked() {
    assert_eq!(MapStore::new("m", 1, 0, 8, 1).err(), Some(MapDeclError::Size { what: "key", size: 0 }));
    assert_eq!(MapStore::new("m", 1, 8, 0, 1).err(), Some(MapDeclError::Size { what: "value", size: 0 }));
    assert_eq!(MapStore::new("m", 1, 8, 65537, 1).err(), Some(MapDeclError::Size { what: "value", size: 65537 }));
    assert_eq!(MapStore::new("m", 1, 8, 8, 0).err(), Some(MapDeclError::NoEntries));
    assert_eq!(MapStore::new("m", 3, 4, 8, 1).err(), Some(MapDeclError::Type(3)), "prog arrays are not supported");
    assert!(matches!(MapStore::new("m", 2, 4, 65536, 4096), Err(MapDeclError::TooLarge(_))), "256 MiB");
    assert!(MapStore::new("m", 6, 4, 8, 16).is_ok());
}

#[test]
fn rodata_is_read_only() {
    let ro = MapStore::data(".rodata", vec![1, 2, 3, 4, 5, 6, 7, 8], true);
    let rw = MapStore::data(".data", vec![0; 8], false);
    let mut p = load(prog![ld_map_value(1, 0, 0), ldx(DW, 0, 1, 0), exit()], vec![ro]).unwrap();
    assert_eq!(p.run(&[], 10), Ok(0x0807_0605_0403_0201));
    assert_eq!(p.map_update(".rodata", &[0; 4], &[0; 8]), Err(MapError::ReadOnly(".rodata".into())));
    let ro = MapStore::data(".rodata", vec![0; 8], true);
    let mut p = load(prog![ld_map_value(1, 0, 4), st(W, 1, 0, 1), exit()], vec![ro]).unwrap();
    assert!(matches!(p.run(&[], 10), Err(Fault::Memory { write: true, .. })));
    let mut p = load(prog![ld_map_value(1, 0, 4), st(W, 1, 0, 1), mov(0, 0), exit()], vec![rw]).unwrap();
    assert_eq!(p.run(&[], 10), Ok(0));
    assert_eq!(p.map_lookup(".data", &[0; 4]), Some(vec![0, 0, 0, 0, 1, 0, 0, 0]));
}

#[test]
fn other_helpers() {
    let t0 = super::helpers::monotonic_ns();
    let now = ok(prog![call(5), exit()]);
    assert!(now >= t0 && now - t0 < 10_000_000_000, "{t0} {now}");
    assert_eq!(ok(prog![mov(0, 5), call(8), exit()]), 0);
    let mut p = load(prog![call(7), movr(6, 0), call(7), alu(LSH, 0, 32), alur(OR, 0, 6), exit()], vec![]).unwrap();
    let (a, b) = (p.run(&[], 10).unwrap(), p.run(&[], 10).unwrap());
    assert_ne!(a, b);
    assert!((a >> 32) != (a & 0xffff_ffff) || (b >> 32) != (b & 0xffff_ffff));
}

#[test]
fn trace_printk_from_a_program() {
    // "n=%d\0" on the stack.
    let fmt = u64::from_le_bytes(*b"n=%d\0\0\0\0");
    let p =
        prog![ld64(1, fmt), stx(DW, 10, 1, -8), movr(1, 10), alu(ADD, 1, -8), mov(2, 5), mov(3, -42), call(6), exit()];
    assert_eq!(ok(p), "n=-42".len() as u64);
    // No NUL within fmt_size: -EINVAL, like the kernel.
    let p = prog![st(DW, 10, -8, 0x41414141), movr(1, 10), alu(ADD, 1, -8), mov(2, 4), call(6), exit()];
    assert_eq!(ok(p) as i64, -(libc::EINVAL as i64));
}

#[test]
fn printk_formats() {
    let no_str = |_| None;
    let f = |fmt: &str, args: [u64; 3]| format_printk(fmt.as_bytes(), args, no_str);
    assert_eq!(f("plain\n", [0; 3]).unwrap(), "plain");
    assert_eq!(f("%d %i %u", [-5i64 as u64, 7, -1i64 as u64]).unwrap(), "-5 7 4294967295");
    assert_eq!(f("%ld %lld %llu", [-5i64 as u64, -6i64 as u64, -1i64 as u64]).unwrap(), "-5 -6 18446744073709551615");
    assert_eq!(f("%x %X %llx", [0xdead_beef_cafe, 0xab, 1 << 40]).unwrap(), "beefcafe AB 10000000000");
    assert_eq!(f("%lu %li %lx", [1, 2, 255]).unwrap(), "1 2 ff");
    assert_eq!(f("[%5d|%-5d|%05d]", [42, 42, -42i64 as u64]).unwrap(), "[   42|42   |-0042]");
    assert_eq!(f("%#x %#llx %+d", [255, 0, 3]).unwrap(), "0xff 0 +3");
    assert_eq!(f("%+d % d", [3, 4, 0]).unwrap(), "+3  4");
    assert_eq!(f("100%% %c", [b'!' as u64, 0, 0]).unwrap(), "100% !");
    assert_eq!(f("%p", [0x1234, 0, 0]).unwrap(), "0000000000001234");
    assert_eq!(f("%s|%s", [0, 0x99, 0]).unwrap(), "(null)|(efault)");
    let strs = |a: u64| (a == 7).then(|| b"hello".to_vec());
    assert_eq!(format_printk(b"<%s> <%8s>", [7, 7, 0], strs).unwrap(), "<hello> <   hello>");
    // What the kernel rejects.
    assert!(f("%d %d %d %d", [1, 2, 3]).is_none(), "four arguments");
    assert!(f("%q", [1, 0, 0]).is_none());
    assert!(f("%lllu", [1, 0, 0]).is_none());
    assert!(f("%pS", [1, 0, 0]).is_none());
    assert!(f("trailing %", [1, 0, 0]).is_none());
}

#[test]
fn bad_programs_are_rejected_at_load() {
    #[track_caller]
    fn reject(p: Vec<RawInsn>) -> LoadError {
        load(p, vec![hash_map("m", 4, 4, 1)]).unwrap_err()
    }
    let at = |e: &LoadError| match e {
        LoadError::Instruction { pc, .. } | LoadError::UnknownHelper { pc, .. } => Some(*pc),
        _ => None,
    };
    // Unknown opcodes.
    for code in [0xff, 0x00, 0x20, 0x8d, 0xe7, 0x99, 0xf5, 0x0e, 0x99, 0xc7 | 0x08 | 0x10, 0xd3, 0xcb] {
        let e = reject(prog![mov(0, 0), ins(code, 0, 0, 0, 0), exit()]);
        assert_eq!(at(&e), Some(1), "opcode {code:#x}: {e}");
    }
    let e = reject(prog![ins(0xff, 0, 0, 0, 0), exit()]);
    assert!(e.to_string().contains("unknown opcode 0xff"), "{e}");
    // Jumps out of range, into an ld_imm64, off the end.
    assert_eq!(at(&reject(prog![ja(5), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ja(-2), exit()])), Some(0));
    assert_eq!(at(&reject(prog![jmp(JEQ, 1, 0, 1), ld64(0, 1), exit()])), Some(0));
    assert_eq!(at(&reject(prog![mov(0, 0), jmp(JEQ, 0, 0, -1)])), Some(1));
    assert_eq!(at(&reject(prog![mov(0, 0)])), Some(0));
    assert_eq!(at(&reject(prog![ins(0x06, 0, 0, 0, 100), exit()])), Some(0));
    // Writes to r10.
    for p in [mov(10, 0), alu(ADD, 10, 8), ldx(DW, 10, 1, 0), ins(0x18, 10, 0, 0, 0)] {
        let e = reject(prog![p, ins(0, 0, 0, 0, 0), exit()]);
        assert!(e.to_string().contains("r10"), "{e}");
    }
    assert!(reject(prog![atomic(DW, 1, 10, 0, super::insn::ATOMIC_ADD | 1), exit()]).to_string().contains("r10"));
    // Registers past r10.
    assert_eq!(at(&reject(prog![mov(11, 0), exit()])), Some(0));
    assert_eq!(at(&reject(prog![mov(0, 0), movr(0, 12), exit()])), Some(1));
    // Unknown helpers.
    let e = reject(prog![call(99), exit()]);
    assert!(matches!(e, LoadError::UnknownHelper { pc: 0, id: 99 }), "{e}");
    assert!(e.to_string().contains("99"));
    assert!(matches!(reject(prog![call(4), exit()]), LoadError::UnknownHelper { id: 4, .. }));
    // Local calls out of range, kfuncs.
    assert_eq!(at(&reject(prog![call_local(10), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ins(0x85, 0, 2, 0, 1), exit()])), Some(0));
    // A local function must not jump into another one.
    assert_eq!(at(&reject(prog![call_local(1), ja(1), exit(), exit()])), Some(1));
    // A function that falls into the next.
    assert_eq!(at(&reject(prog![call_local(1), mov(0, 1), exit()])), Some(1));
    // ld_imm64: truncated, malformed second half, unknown map, unsupported sources.
    assert!(matches!(reject(prog![ins(0x18, 0, 0, 0, 0)]), LoadError::Instruction { pc: 0, .. }));
    assert_eq!(at(&reject(prog![ins(0x18, 0, 0, 0, 0), mov(0, 1), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ld_map(1, 3), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ld_map(1, -1), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ld_map_value(1, 0, 0), exit()])), Some(0), "value access to a hash map");
    for src in [3, 4, 5, 6] {
        assert_eq!(at(&reject(prog![[ins(0x18, 1, src, 0, 0), ins(0, 0, 0, 0, 0)], exit()])), Some(0));
    }
    // Reserved fields, invalid variants.
    assert_eq!(at(&reject(prog![ins(0xb7, 0, 1, 0, 0), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ins(0x07, 0, 0, 1, 0), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ins(0x99, 0, 0, 0, 0), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ins(0x37, 0, 0, 2, 1), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ins(0xbf, 0, 1, 32 - 24, 0), ins(0xbc, 0, 1, 32, 0), exit()])), Some(1));
    assert_eq!(at(&reject(prog![ins(0xd4, 0, 0, 0, 8), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ins(0x99, 0, 1, 0, 0), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ldsx(DW, 0, 1, 0), exit()])), Some(0));
    assert_eq!(at(&reject(prog![atomic(B, 1, 2, 0, 0), exit()])), Some(0));
    assert_eq!(at(&reject(prog![atomic(DW, 1, 2, 0, 0x02), exit()])), Some(0));
    assert_eq!(at(&reject(prog![ins(0x20, 0, 0, 0, 0), exit()])), Some(0), "legacy packet access");
    assert_eq!(at(&reject(prog![ins(0x95, 0, 0, 0, 1)])), Some(0));
    // Empty and oversized programs.
    assert!(matches!(reject(vec![]), LoadError::Instruction { .. }));
    let mut big = vec![mov(0, 0); MAX_INSNS];
    big.push(exit());
    assert!(matches!(reject(big), LoadError::TooLarge { count } if count == MAX_INSNS + 1));
    let mut max = vec![mov(0, 0); MAX_INSNS - 1];
    max.push(exit());
    assert!(load(max, vec![]).is_ok());
}

#[test]
fn disassembly() {
    let p = load(
        prog![
            ld_map(1, 0),
            ld64(2, 0x1_0000_0002),
            ldx(DW, 0, 1, -8),
            stx(W, 10, 0, -4),
            st(B, 10, -1, 7),
            alu32(ADD, 0, 1),
            alur(MOD, 0, 2),
            jmp32(JEQ, 0, 3, 1),
            call(1),
            call_local(2),
            atomic(DW, 10, 1, -8, super::insn::ATOMIC_CMPXCHG),
            exit(),
            mov(0, 0),
            exit(),
        ],
        vec![hash_map("counters", 4, 4, 1)],
    )
    .unwrap();
    let lines = p.disassemble();
    assert_eq!(lines.len(), p.instructions());
    let text = lines.join("\n");
    for want in [
        "0: r1 = map[counters] ll",
        "2: r2 = 0x100000002 ll",
        "3: (second half",
        "r0 = *(u64 *)(r1 - 8)",
        "*(u32 *)(r10 - 4) = r0",
        "*(u8 *)(r10 - 1) = 7",
        "w0 += 1",
        "r0 %= r2",
        "if w0 == 3 goto +1 <11>",
        "call 1 (map_lookup_elem)",
        "call +2 <14>",
        "r0 = cmpxchg_64(r10 - 8, r0, r1)",
        "exit",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn faults_do_not_poison_the_program() {
    let mut p = load(prog![ldx(DW, 0, 1, 0), exit()], vec![]).unwrap();
    assert!(p.run(&[1, 2], 100).is_err());
    assert_eq!(p.run(&[1, 0, 0, 0, 0, 0, 0, 0], 100), Ok(1));
}

/// Interpreter throughput (run with `--release -- --ignored --nocapture`).
#[test]
#[ignore]
fn throughput() {
    let n = 50_000_000i32;
    let mut p = load(
        prog![mov(0, 0), mov(1, n), alur(ADD, 0, 1), alu(XOR, 0, 3), alu(SUB, 1, 1), jmp(JNE, 1, 0, -4), exit()],
        vec![],
    )
    .unwrap();
    let start = std::time::Instant::now();
    p.run(&[], u64::MAX).unwrap();
    let insns = 4.0 * f64::from(n);
    let secs = start.elapsed().as_secs_f64();
    println!("{:.0} M instructions/s", insns / secs / 1e6);
}

/// Random instruction streams: whatever passes the checks must run without panicking.
#[test]
fn random_programs_never_panic() {
    let mut state = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let imms = [0, 1, -1, 2, 7, 8, 16, 31, 32, 63, 64, i32::MIN, i32::MAX];
    let atomics = [0x00, 0x01, 0x40, 0x41, 0x50, 0x51, 0xa0, 0xa1, 0xe1, 0xf1];
    let (mut loaded, mut faulted) = (0, 0);
    for _ in 0..100_000 {
        let n = 1 + (next() % 24) as usize;
        let mut p: Vec<RawInsn> = Vec::new();
        while p.len() < n {
            let r = next();
            let pick = |k: u64| (r >> k) as usize;
            let reg = |k: u64| ((r >> k) % 10) as u8; // r0..r9
            let any_reg = |k: u64| ((r >> k) % 11) as u8;
            let imm = if (r >> 60) % 4 == 0 { (r >> 32) as i32 } else { imms[pick(32) % imms.len()] };
            let jump = ((r >> 48) % 9) as i16 - 4;
            let mem_off = [-8i16, -16, -1, -512, 0, 8, 4, 60][pick(50) % 8];
            let size = [W, H, B, DW][pick(54) % 4];
            let cls = if r & 1 == 0 { 0x07 } else { 0x04 };
            let insn = match r % 16 {
                0..=3 => {
                    let op = [ADD, SUB, MUL, DIV, OR, AND, LSH, RSH, MOD, XOR, 0xb0, ARSH][pick(8) % 12];
                    let signed = (op == DIV || op == MOD) && (r >> 12) & 1 == 1;
                    if (r >> 13) & 1 == 0 {
                        ins(op | cls, reg(16), 0, signed as i16, imm)
                    } else {
                        let off = if op == 0xb0 { [0, 8, 16][pick(14) % 3] } else { signed as i16 };
                        ins(op | 0x08 | cls, reg(16), any_reg(20), off, 0)
                    }
                }
                4 => ins(0x84 | (cls & 0x03), reg(16), 0, 0, 0),
                5 => ins([0xd4, 0xdc, 0xd7][pick(8) % 3], reg(16), 0, 0, [16, 32, 64][pick(12) % 3]),
                6..=7 => {
                    let op = [JEQ, JGT, 0x30, JSET, JNE, JSGT, JSGE, JLT, 0xb0, JSLT, JSLE][pick(8) % 11];
                    let c = if (r >> 12) & 1 == 0 { 0x05 } else { 0x06 };
                    if (r >> 13) & 1 == 0 {
                        ins(op | c, any_reg(16), 0, jump, imm)
                    } else {
                        ins(op | 0x08 | c, any_reg(16), any_reg(20), jump, 0)
                    }
                }
                8 => ja(jump),
                9 => ins([0x61, 0x81][pick(8) % 2] | size, reg(16), any_reg(20), mem_off, 0),
                10 => ins(0x62 | size, any_reg(16), 0, mem_off, imm),
                11 => ins(0x63 | size, any_reg(16), any_reg(20), mem_off, 0),
                12 => atomic([W, DW][pick(8) % 2], any_reg(16), reg(20), mem_off, atomics[pick(24) % atomics.len()]),
                13 => {
                    let src = (pick(8) % 3) as u8;
                    let first = if src == 0 { imm } else { (pick(12) % 3) as i32 };
                    let second = if src == 2 { (pick(16) % 40) as i32 } else { 0 };
                    p.push(ins(0x18, reg(20), src, 0, first));
                    ins(0, 0, 0, 0, second)
                }
                14 => {
                    if (r >> 8) & 3 == 0 {
                        call_local(jump.into())
                    } else {
                        call([1, 2, 3, 5, 6, 7, 8][pick(12) % 7])
                    }
                }
                _ => ins((r >> 8) as u8, any_reg(16), any_reg(20), jump, imm),
            };
            p.push(insn);
        }
        p.push(exit());
        let maps = vec![
            MapStore::new("h", 1, 8, 16, 4).unwrap(),
            MapStore::new("a", 2, 4, 16, 4).unwrap(),
            MapStore::data(".rodata", vec![7; 32], true),
        ];
        let Ok(mut prog) = load(p, maps) else { continue };
        loaded += 1;
        let ctx: Vec<u8> = (0..64).map(|_| next() as u8).collect();
        if prog.run(&ctx, 2000).is_err() {
            faulted += 1;
        }
        let _ = prog.disassemble();
    }
    eprintln!("{loaded} random programs loaded, {faulted} faulted");
    assert!(loaded > 2000, "only {loaded} random programs loaded");
    assert!(faulted > 0 && faulted < loaded, "{faulted} of {loaded} faulted");
}
