//! The lowered form the interpreter executes.
//!
//! Every PTX instruction becomes one [`Inst`]: an [`Op`] whose operands are already resolved (registers to dense
//! indices into the frame's register file, immediates to bit patterns, symbols to [`Src`] kinds the machine can turn
//! into an address without any lookup by name) plus the guard predicate and the source line. Branch targets are
//! instruction indices. Modifiers that change the result (rounding, `.ftz`, `.sat`, comparison, shift mode...) are
//! fields of the op; modifiers that cannot change a single-threaded result (cache hints, memory-order and scope
//! qualifiers on ordinary loads and stores) are dropped during lowering.

use super::float::Rnd;
pub use super::texture::{Geom, OutOfRange, Query};

/// A register index within a function's register file.
pub type Reg = u32;

/// A source operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    Reg(Reg),
    Imm(u64),
    Special(Special),
    /// Address of module variable `i` (`.global`/`.const`), known once the variables are bound.
    Var(u32),
    /// Shared-space address of shared variable `i` (laid out per kernel).
    Shared(u32),
    /// Local-space address of a slot in the current call frame (`.local` variables, `.param` call slots).
    Frame(u32),
}

/// Special registers, with vector components resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    Tid(u8),
    NTid(u8),
    CtaId(u8),
    NCtaId(u8),
    LaneId,
    WarpId,
    NWarpId,
    SmId,
    NSmId,
    GridId,
    LanemaskEq,
    LanemaskLe,
    LanemaskLt,
    LanemaskGe,
    LanemaskGt,
    Clock,
    ClockHi,
    Clock64,
    GlobalTimer,
    GlobalTimerLo,
    GlobalTimerHi,
    DynamicSmem,
    TotalSmem,
    Zero,
    One,
}

/// An integer operation type: width in bits (1 for predicates) and signedness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntTy {
    pub bits: u8,
    pub signed: bool,
}

/// Float formats the arithmetic ops work on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FTy {
    F16,
    BF16,
    F32,
    F64,
    F16x2,
    BF16x2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IBin {
    Add,
    Sub,
    MulLo,
    MulHi,
    MulWide,
    Mul24Lo,
    Mul24Hi,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    AddSat,
    SubSat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IUn {
    Neg,
    Abs,
    Not,
    Cnot,
    Popc,
    Clz,
    Brev,
    Bfind,
    BfindShift,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MadMode {
    Lo,
    Hi,
    Wide,
    HiSat,
    Lo24,
    Hi24,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FBin {
    Add,
    Sub,
    Mul,
    Div,
    DivApprox,
    DivFull,
    Min,
    Max,
    MinNan,
    MaxNan,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FUn {
    Neg,
    Abs,
    Sqrt,
    SqrtApprox,
    Rsqrt,
    Rcp,
    RcpApprox,
    RcpApproxF64,
    Sin,
    Cos,
    Lg2,
    Ex2,
    Tanh,
}

/// Floating-point op modifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FMode {
    pub rnd: Rnd,
    pub ftz: bool,
    pub sat: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// What a comparison compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpTy {
    Int(IntTy),
    Float(FTy, bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoolOp {
    And,
    Or,
    Xor,
}

/// The optional `.and/.or/.xor {!}c` tail of `setp`/`set`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Combine {
    pub op: BoolOp,
    pub pred: Src,
    pub negate: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Testp {
    Finite,
    Infinite,
    Number,
    NotANumber,
    Normal,
    Subnormal,
}

/// A conversion's source or destination kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CvtTy {
    Int(IntTy),
    F16,
    BF16,
    F32,
    F64,
    TF32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CvtRnd {
    None,
    /// `.rn/.rz/.rm/.rp`: rounding of a float result (or float-to-int with PTX 7.x's rule that these imply integer
    /// rounding too).
    Float(Rnd),
    /// `.rni/.rzi/.rmi/.rpi`: rounding to an integral value.
    Int(Rnd),
    /// `.rna` (tf32): nearest, ties away from zero.
    Rna,
}

/// Memory spaces as the machine sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Generic,
    Global,
    Shared,
    Local,
    Param,
    Const,
}

/// An address `base + offset`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Addr {
    pub base: Src,
    pub offset: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomOp {
    Add,
    Min,
    Max,
    Inc,
    Dec,
    And,
    Or,
    Xor,
    Exch,
    Cas,
}

/// The value type of an atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomTy {
    Int(IntTy),
    F32,
    F64,
    F16x2,
    BF16x2,
    F16,
    BF16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    Sync,
    Arrive,
    RedPopc,
    RedAnd,
    RedOr,
}

/// Where a call argument comes from or a return value goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Slot {
    /// A `.param` slot in the caller's frame: offset and size.
    Frame(u32, u32),
    /// A register (or, for arguments, an immediate) passed directly.
    Value(Src),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Direct target, or None for an indirect call through `target`.
    pub func: Option<u32>,
    pub target: Src,
    pub args: Vec<Slot>,
    pub rets: Vec<Slot>,
}

/// Built-in functions nvcc calls as `.extern .func`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Vprintf,
    AssertFail,
}

/// The level of detail operands of a `tex`.
#[derive(Clone, Debug, PartialEq)]
pub enum LodSrc {
    Implicit,
    Base,
    Level(Src),
    /// `tex.grad`: the derivatives of the coordinates along x and y.
    Grad(Vec<Src>, Vec<Src>),
}

/// `tex` and `tld4`.
#[derive(Clone, Debug, PartialEq)]
pub struct TexInst {
    pub geom: Geom,
    /// `tld4`: the component gathered.
    pub gather: Option<u8>,
    pub ds: [Option<Reg>; 4],
    /// The residency predicate (`d|p`): always true here.
    pub pred: Option<Reg>,
    pub handle: Src,
    /// Coordinates as given, the array index first for arrays.
    pub coords: Vec<Src>,
    pub int_coords: bool,
    pub lod: LodSrc,
}

/// `suld.b`, `sust.b` and `sust.p`.
#[derive(Clone, Debug, PartialEq)]
pub struct SurfInst {
    pub geom: Geom,
    pub store: bool,
    /// `sust.p`: 32-bit values converted to the surface's format.
    pub formatted: bool,
    /// Bits of each element of the vector.
    pub bits: u8,
    /// Loads: the destinations.
    pub ds: Vec<Option<Reg>>,
    /// Stores: the values.
    pub srcs: Vec<Src>,
    pub handle: Src,
    pub coords: Vec<Src>,
    pub oob: OutOfRange,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Nop,
    Mov {
        d: Reg,
        a: Src,
        bits: u8,
    },
    /// `mov.b64 d, {a, b}`: concatenate little-endian.
    Pack {
        d: Reg,
        srcs: Vec<Src>,
        elem_bits: u8,
    },
    /// `mov.b64 {a, b}, d`: split.
    Unpack {
        ds: Vec<Option<Reg>>,
        a: Src,
        elem_bits: u8,
    },
    IBin {
        op: IBin,
        ty: IntTy,
        d: Reg,
        a: Src,
        b: Src,
    },
    /// add/sub with carry in and/or out (`add.cc`, `addc`, `addc.cc`, `sub.cc`, ...). `cc` is the carry register.
    Carry {
        sub: bool,
        cin: bool,
        cout: bool,
        bits: u8,
        d: Reg,
        a: Src,
        b: Src,
        cc: Reg,
    },
    Mad {
        mode: MadMode,
        ty: IntTy,
        cin: bool,
        cout: bool,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
        cc: Reg,
    },
    IUn {
        op: IUn,
        ty: IntTy,
        d: Reg,
        a: Src,
    },
    Bfe {
        ty: IntTy,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
    },
    Bfi {
        bits: u8,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
        e: Src,
    },
    Prmt {
        mode: u8,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
    },
    Shf {
        left: bool,
        clamp: bool,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `bmsk.{clamp,wrap}.b32`: a mask of `b` bits from bit `a`.
    Bmsk {
        clamp: bool,
        d: Reg,
        a: Src,
        b: Src,
    },
    /// `szext.{clamp,wrap}.{s32,u32}`: the low `b` bits of `a`, sign- or zero-extended.
    Szext {
        clamp: bool,
        signed: bool,
        d: Reg,
        a: Src,
        b: Src,
    },
    Lop3 {
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
        lut: u8,
    },
    Sad {
        ty: IntTy,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
    },
    Dp {
        /// 4 for dp4a, 2 for dp2a.lo, 3 for dp2a.hi
        kind: u8,
        a_signed: bool,
        b_signed: bool,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
    },
    Selp {
        bits: u8,
        d: Reg,
        a: Src,
        b: Src,
        p: Src,
    },
    Slct {
        bits: u8,
        float: bool,
        ftz: bool,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
    },
    Setp {
        cmp: Cmp,
        ty: CmpTy,
        d: Option<Reg>,
        d2: Option<Reg>,
        a: Src,
        b: Src,
        comb: Option<Combine>,
    },
    Set {
        cmp: Cmp,
        ty: CmpTy,
        dfloat: bool,
        d: Reg,
        a: Src,
        b: Src,
        comb: Option<Combine>,
    },
    FBin {
        op: FBin,
        ty: FTy,
        m: FMode,
        d: Reg,
        a: Src,
        b: Src,
    },
    Fma {
        ty: FTy,
        m: FMode,
        d: Reg,
        a: Src,
        b: Src,
        c: Src,
    },
    FUn {
        op: FUn,
        ty: FTy,
        m: FMode,
        d: Reg,
        a: Src,
    },
    Testp {
        op: Testp,
        f64: bool,
        d: Reg,
        a: Src,
    },
    Copysign {
        f64: bool,
        d: Reg,
        a: Src,
        b: Src,
    },
    Cvt {
        to: CvtTy,
        from: CvtTy,
        rnd: CvtRnd,
        sat: bool,
        ftz: bool,
        relu: bool,
        d: Reg,
        a: Src,
    },
    /// `cvt.rn.f16x2.f32 d, a, b` and friends: d = {cvt(a) in the high half, cvt(b) in the low half}.
    CvtPack {
        to: CvtTy,
        rnd: Rnd,
        relu: bool,
        sat: bool,
        d: Reg,
        a: Src,
        b: Src,
    },
    Cvta {
        to_generic: bool,
        space: Space,
        bits: u8,
        d: Reg,
        a: Src,
    },
    Isspacep {
        space: Space,
        d: Reg,
        a: Src,
    },
    Ld {
        space: Space,
        bits: u8,
        signed: bool,
        ds: Vec<Option<Reg>>,
        addr: Addr,
    },
    St {
        space: Space,
        bits: u8,
        srcs: Vec<Src>,
        addr: Addr,
    },
    Atom {
        space: Space,
        op: AtomOp,
        ty: AtomTy,
        d: Option<Reg>,
        addr: Addr,
        b: Src,
        c: Src,
    },
    /// `cp.async` global to shared, done synchronously: `size` bytes, of which the first `src_size` come from
    /// global memory and the rest are zero.
    CpAsync {
        dst: Addr,
        src: Addr,
        size: u8,
        src_size: Option<Src>,
    },
    Bra {
        target: u32,
    },
    /// `brx.idx a, table`: jump to `targets[a]`.
    Brx {
        a: Src,
        targets: Vec<u32>,
    },
    Call(Box<Call>),
    Builtin {
        which: Builtin,
        args: Vec<Slot>,
        ret: Option<Slot>,
    },
    Ret,
    Exit,
    Trap,
    Bar {
        kind: BarKind,
        id: Src,
        count: Option<Src>,
        d: Option<Reg>,
        pred: Option<(Src, bool)>,
        aligned: bool,
    },
    WarpSync {
        mask: Src,
    },
    Shfl {
        mode: ShflMode,
        d: Option<Reg>,
        p: Option<Reg>,
        a: Src,
        b: Src,
        c: Src,
        mask: Option<Src>,
    },
    Vote {
        mode: VoteMode,
        d: Reg,
        a: Src,
        negate: bool,
        mask: Option<Src>,
    },
    Match {
        all: bool,
        bits: u8,
        d: Option<Reg>,
        p: Option<Reg>,
        a: Src,
        mask: Src,
    },
    Redux {
        op: IBin,
        ty: IntTy,
        d: Reg,
        a: Src,
        mask: Src,
    },
    Activemask {
        d: Reg,
    },
    Elect {
        d: Option<Reg>,
        p: Option<Reg>,
        mask: Src,
    },
    Tex(Box<TexInst>),
    Surf(Box<SurfInst>),
    /// `txq` (with the level of `txq.level`) and `suq`.
    Query {
        surface: bool,
        query: Query,
        d: Reg,
        handle: Src,
        level: Option<Src>,
    },
}

/// One lowered instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub op: Op,
    /// Guard predicate register and whether it is negated.
    pub guard: Option<(Reg, bool)>,
    pub line: u32,
}

/// Where a `.func` parameter or return value lives in the callee.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamLoc {
    Frame(u32, u32),
    Reg(Reg),
}

/// A lowered function.
#[derive(Clone, Debug)]
pub struct Func {
    pub name: String,
    pub is_entry: bool,
    pub code: Vec<Inst>,
    pub nregs: u32,
    /// Bytes of per-thread frame: parameter slots, `.local` variables and call-sequence `.param` slots.
    pub frame_size: u32,
    /// Alignment the frame needs (the largest alignment of its slots, at least 16).
    pub frame_align: u32,
    pub params: Vec<ParamLoc>,
    pub rets: Vec<ParamLoc>,
    /// Kernel parameter buffer size (entries only).
    pub param_size: u64,
    /// Shared variables this function refers to.
    pub shared_refs: Vec<u32>,
    /// Functions it calls directly.
    pub callees: Vec<u32>,
    /// Whether it makes indirect calls.
    pub indirect_calls: bool,
}
