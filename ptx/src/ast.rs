//! The typed syntax tree produced by [`crate::parse`].
//!
//! The tree stays close to the PTX text (so that it prints back faithfully) but replaces every
//! piece of syntax a consumer would otherwise re-parse with a typed value: types, state spaces,
//! vector widths, immediates (as exact bit patterns), address expressions and register
//! references are all decoded once here.

use std::fmt;

/// A whole PTX module: the directives in source order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Module {
    pub directives: Vec<Directive>,
}

/// A module-scope directive.
#[derive(Clone, Debug, PartialEq)]
pub enum Directive {
    /// `.version 7.8`
    Version { major: u32, minor: u32 },
    /// `.target sm_80, debug`: the architecture followed by any modifiers, as written.
    Target(Vec<String>),
    /// `.address_size 64`
    AddressSize(u32),
    /// `.file 1 "/path/x.cu"` with an optional timestamp and size.
    File(FileDirective),
    /// A module-scope variable (`.global`, `.const`, `.shared`, ...).
    Variable(VarDecl),
    /// A `.entry` or `.func`, either defined or only declared.
    Function(Function),
    /// `.pragma "...";` at module scope.
    Pragma(Vec<String>),
    /// `.alias alias, target;`
    Alias { alias: String, target: String },
    /// A `.section` (DWARF data emitted with `-G`/`-lineinfo`). Its body is kept as raw text:
    /// nothing downstream interprets it, but `.loc` directives refer to labels inside it, so
    /// dropping it would make the printed module invalid.
    Section(Section),
}

/// `.file index "path"[, timestamp, size]`
#[derive(Clone, Debug, PartialEq)]
pub struct FileDirective {
    pub index: u32,
    pub path: String,
    pub timestamp: Option<u64>,
    pub size: Option<u64>,
}

/// A debug section and its verbatim body (the text between the braces).
#[derive(Clone, Debug, PartialEq)]
pub struct Section {
    /// Section name including the leading dot, e.g. `.debug_info`.
    pub name: String,
    pub raw: String,
}

/// Linking directive on a function or module-scope variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Linkage {
    Visible,
    Extern,
    Weak,
    Common,
}

/// State spaces, including the `::`-qualified sub-spaces newer instructions use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateSpace {
    Reg,
    SReg,
    Const,
    Global,
    Local,
    Param,
    ParamEntry,
    ParamFunc,
    Shared,
    SharedCta,
    SharedCluster,
    Tex,
}

/// Fundamental PTX types. Sub-byte and packed types appear only as instruction modifiers; the
/// opaque `.texref`/`.samplerref`/`.surfref` only in declarations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    B1,
    B8,
    B16,
    B32,
    B64,
    B128,
    U4,
    U8,
    U16,
    U32,
    U64,
    S4,
    S8,
    S16,
    S32,
    S64,
    U16x2,
    S16x2,
    F16,
    F16x2,
    BF16,
    BF16x2,
    TF32,
    F32,
    F64,
    E4M3,
    E5M2,
    E4M3x2,
    E5M2x2,
    Pred,
    TexRef,
    SamplerRef,
    SurfRef,
}

/// Vector component selector (`.x`, `.y`, `.z`, `.w`; `.r`/`.g`/`.b`/`.a` are read as aliases).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Component {
    X,
    Y,
    Z,
    W,
}

/// A variable or register declaration: `.reg .f32 %f<12>;`, `.shared .align 4 .b8 s[1024];`,
/// `.global .align 8 .u64 p[2] = {generic(a), b};`. One declaration may declare several names.
#[derive(Clone, Debug, PartialEq)]
pub struct VarDecl {
    pub linkage: Option<Linkage>,
    pub space: StateSpace,
    /// `.attribute(.managed)` and friends, without the dots.
    pub attributes: Vec<String>,
    pub align: Option<u32>,
    /// Vector width from `.v2`/`.v4`/`.v8`.
    pub vector: Option<u8>,
    pub ty: ScalarType,
    pub declarators: Vec<Declarator>,
}

/// One declared name inside a [`VarDecl`].
#[derive(Clone, Debug, PartialEq)]
pub struct Declarator {
    pub name: String,
    /// `%r<12>` declares the 12 registers `%r0` .. `%r11`; this holds the 12.
    pub range: Option<u32>,
    /// Array dimensions, outermost first; `None` is an unsized dimension (`smem[]`).
    pub dims: Vec<Option<u64>>,
    pub init: Option<Initializer>,
}

/// A variable initializer.
#[derive(Clone, Debug, PartialEq)]
pub enum Initializer {
    Imm(Immediate),
    /// The address of a variable or function, optionally converted to a generic address
    /// (`generic(sym)`) and offset by a byte count (`generic(sym)+8`).
    Address {
        name: String,
        generic: bool,
        offset: i64,
    },
    /// `{a, b, ...}`, possibly nested for multi-dimensional arrays.
    List(Vec<Initializer>),
}

/// Immediate operand. Floats keep their exact bit pattern so that printing is lossless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Immediate {
    /// Integer literal; values above `i64::MAX` (e.g. `0xFFFFFFFFFFFFFFFF`) wrap, which preserves
    /// the 64 bits an instruction would see.
    Int(i64),
    /// `0fXXXXXXXX`: an exact single-precision value.
    F32(u32),
    /// `0dXXXXXXXXXXXXXXXX` or a decimal float literal (PTX evaluates those in double precision).
    F64(u64),
}

/// `.entry` (kernel) or `.func` (device function).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FunctionKind {
    Entry,
    Func,
}

/// A kernel or device function. `body` is `None` for a prototype (`.extern .func ... ;`).
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub kind: FunctionKind,
    pub linkage: Option<Linkage>,
    pub name: String,
    /// `.func (.param .b32 func_retval0) f(...)`: the return parameters; empty for `.entry`.
    pub return_params: Vec<Param>,
    pub params: Vec<Param>,
    /// Performance-tuning and other header directives, in source order.
    pub directives: Vec<FunctionDirective>,
    pub body: Option<Vec<Statement>>,
    /// Source line of the `.entry`/`.func` keyword.
    pub line: u32,
}

/// A parameter of a function, return list or call prototype.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// `.param` normally; `.reg` for register parameters of `.func`.
    pub space: StateSpace,
    pub align: Option<u32>,
    pub vector: Option<u8>,
    pub ty: ScalarType,
    /// `.ptr [.space] [.align N]`: what a pointer kernel parameter points to.
    pub ptr: Option<PtrAttr>,
    /// Parameter name; `_` in call prototypes.
    pub name: String,
    pub dims: Vec<Option<u64>>,
}

/// The `.ptr` kernel-parameter attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PtrAttr {
    pub space: Option<StateSpace>,
    pub align: Option<u32>,
}

/// Directives between a function's parameter list and its body.
#[derive(Clone, Debug, PartialEq)]
pub enum FunctionDirective {
    MaxNTid(Vec<u32>),
    ReqNTid(Vec<u32>),
    MinNCtaPerSm(u32),
    MaxNCtaPerSm(u32),
    MaxNReg(u32),
    NoReturn,
    ExplicitCluster,
    ReqNCtaPerCluster(Vec<u32>),
    MaxClusterRank(u32),
    BlocksAreClusters,
    Pragma(Vec<String>),
}

/// A statement of a function body together with its source line.
#[derive(Clone, Debug, PartialEq)]
pub struct Statement {
    /// 1-based line in the PTX text the statement started on (0 for synthesized statements).
    pub line: u32,
    pub kind: StatementKind,
}

/// What a statement is.
#[derive(Clone, Debug, PartialEq)]
pub enum StatementKind {
    Decl(VarDecl),
    Label(String),
    Instruction(Instruction),
    /// `{ ... }`: a nested scope; declarations inside are invisible outside.
    Block(Vec<Statement>),
    Pragma(Vec<String>),
    Loc(Loc),
    /// `label: .callprototype (.param .b32 _) _ (.param .b64 _);`
    CallPrototype(CallPrototype),
    /// `label: .calltargets f1, f2;`
    CallTargets {
        label: String,
        targets: Vec<String>,
    },
    /// `label: .branchtargets L1, L2;` (for `brx.idx`)
    BranchTargets {
        label: String,
        targets: Vec<String>,
    },
}

/// `.loc file line column[, function_name label[+off], inlined_at file line column]`
#[derive(Clone, Debug, PartialEq)]
pub struct Loc {
    pub file: u32,
    pub line: u32,
    pub column: u32,
    pub function_name: Option<(String, i64)>,
    pub inlined_at: Option<(u32, u32, u32)>,
}

/// Declared signature used by indirect calls.
#[derive(Clone, Debug, PartialEq)]
pub struct CallPrototype {
    pub label: String,
    pub return_params: Vec<Param>,
    pub params: Vec<Param>,
    pub noreturn: bool,
}

/// Guard predicate: `@%p` or `@!%p`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Guard {
    pub negated: bool,
    pub pred: String,
}

/// One instruction. PTX has hundreds of opcodes and every release adds modifiers, so the parser
/// does not know any of them: the opcode is the leading word and every `.suffix` is decoded into
/// a [`Modifier`], in source order. Consumers match on `(opcode, modifiers)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Instruction {
    pub guard: Option<Guard>,
    pub opcode: String,
    pub modifiers: Vec<Modifier>,
    pub operands: Vec<Operand>,
}

/// A `.suffix` of an instruction, classified by what it denotes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Modifier {
    /// `.f32`, `.u64`, `.pred`, ...
    Type(ScalarType),
    /// `.v2`, `.v4`, `.v8`
    Vector(u8),
    /// `.global`, `.shared::cta`, ...
    Space(StateSpace),
    /// Anything else (`.rn`, `.sync`, `.L2::128B`, `.m16n8k16`), without the dot.
    Other(String),
}

/// Instruction operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A register: any `%name`, or a plain name declared by `.reg` in an enclosing scope.
    Reg(String),
    /// A component of a vector register, `%v.x`.
    RegComponent(String, Component),
    /// A special register such as `%tid.x` or `%laneid`.
    Special(SpecialReg, Option<Component>),
    Imm(Immediate),
    /// A name that is not a register: label, variable, function or parameter.
    Symbol(String),
    /// `[base+offset]`
    Address(Address),
    /// `[a, b, ...]` with more than one element: texture, surface and tensor coordinates.
    BracketList(Vec<Operand>),
    /// `{a, b, ...}`
    Vector(Vec<Operand>),
    /// `(a, b, ...)`: the return and argument lists of `call`.
    List(Vec<Operand>),
    /// `!%p`
    Not(Box<Operand>),
    /// `%r|%p`: two destinations, as in `shfl.sync` or `setp`.
    Pair(Box<Operand>, Box<Operand>),
    /// `_`
    Sink,
}

/// A memory operand `[base+offset]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Address {
    pub base: AddressBase,
    pub offset: i64,
}

/// What an address is relative to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AddressBase {
    Reg(String),
    Symbol(String),
    /// `[imm]`: an absolute address; the value is in `offset`.
    Absolute,
}

/// Special (read-only, hardware-defined) registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpecialReg {
    Tid,
    NTid,
    LaneId,
    WarpId,
    NWarpId,
    CtaId,
    NCtaId,
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
    TotalSmemSize,
    AggrSmemSize,
    DynamicSmemSize,
    ReservedSmemOffsetBegin,
    ReservedSmemOffsetEnd,
    ReservedSmemOffsetCap,
    IsExplicitCluster,
    ClusterId,
    NClusterId,
    ClusterCtaId,
    ClusterNCtaId,
    ClusterCtaRank,
    ClusterNCtaRank,
    CurrentGraphExec,
    /// `%pm0` .. `%pm7`
    Pm(u8),
    /// `%pm0_64` .. `%pm7_64`
    Pm64(u8),
    /// `%envreg0` .. `%envreg31`
    EnvReg(u8),
    /// `%reserved_smem_offset_0`, `%reserved_smem_offset_1`
    ReservedSmemOffset(u8),
}

const SPECIAL_NAMES: &[(&str, SpecialReg)] = &[
    ("%tid", SpecialReg::Tid),
    ("%ntid", SpecialReg::NTid),
    ("%laneid", SpecialReg::LaneId),
    ("%warpid", SpecialReg::WarpId),
    ("%nwarpid", SpecialReg::NWarpId),
    ("%ctaid", SpecialReg::CtaId),
    ("%nctaid", SpecialReg::NCtaId),
    ("%smid", SpecialReg::SmId),
    ("%nsmid", SpecialReg::NSmId),
    ("%gridid", SpecialReg::GridId),
    ("%lanemask_eq", SpecialReg::LanemaskEq),
    ("%lanemask_le", SpecialReg::LanemaskLe),
    ("%lanemask_lt", SpecialReg::LanemaskLt),
    ("%lanemask_ge", SpecialReg::LanemaskGe),
    ("%lanemask_gt", SpecialReg::LanemaskGt),
    ("%clock", SpecialReg::Clock),
    ("%clock_hi", SpecialReg::ClockHi),
    ("%clock64", SpecialReg::Clock64),
    ("%globaltimer", SpecialReg::GlobalTimer),
    ("%globaltimer_lo", SpecialReg::GlobalTimerLo),
    ("%globaltimer_hi", SpecialReg::GlobalTimerHi),
    ("%total_smem_size", SpecialReg::TotalSmemSize),
    ("%aggr_smem_size", SpecialReg::AggrSmemSize),
    ("%dynamic_smem_size", SpecialReg::DynamicSmemSize),
    ("%reserved_smem_offset_begin", SpecialReg::ReservedSmemOffsetBegin),
    ("%reserved_smem_offset_end", SpecialReg::ReservedSmemOffsetEnd),
    ("%reserved_smem_offset_cap", SpecialReg::ReservedSmemOffsetCap),
    ("%is_explicit_cluster", SpecialReg::IsExplicitCluster),
    ("%clusterid", SpecialReg::ClusterId),
    ("%nclusterid", SpecialReg::NClusterId),
    ("%cluster_ctaid", SpecialReg::ClusterCtaId),
    ("%cluster_nctaid", SpecialReg::ClusterNCtaId),
    ("%cluster_ctarank", SpecialReg::ClusterCtaRank),
    ("%cluster_nctarank", SpecialReg::ClusterNCtaRank),
    ("%current_graph_exec", SpecialReg::CurrentGraphExec),
];

impl SpecialReg {
    /// Recognizes a special register by its name, including the `%`.
    pub fn from_name(name: &str) -> Option<SpecialReg> {
        if let Some(&(_, reg)) = SPECIAL_NAMES.iter().find(|(n, _)| *n == name) {
            return Some(reg);
        }
        let numbered = |prefix: &str, suffix: &str, max: u8| -> Option<u8> {
            let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            if digits.is_empty() || digits.len() > 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u8 = digits.parse().ok()?;
            (n <= max && digits == n.to_string()).then_some(n)
        };
        if let Some(n) = numbered("%pm", "_64", 7) {
            return Some(SpecialReg::Pm64(n));
        }
        if let Some(n) = numbered("%pm", "", 7) {
            return Some(SpecialReg::Pm(n));
        }
        if let Some(n) = numbered("%envreg", "", 31) {
            return Some(SpecialReg::EnvReg(n));
        }
        numbered("%reserved_smem_offset_", "", 1).map(SpecialReg::ReservedSmemOffset)
    }
}

impl fmt::Display for SpecialReg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecialReg::Pm(n) => write!(f, "%pm{n}"),
            SpecialReg::Pm64(n) => write!(f, "%pm{n}_64"),
            SpecialReg::EnvReg(n) => write!(f, "%envreg{n}"),
            SpecialReg::ReservedSmemOffset(n) => write!(f, "%reserved_smem_offset_{n}"),
            other => {
                let name = SPECIAL_NAMES.iter().find(|(_, r)| r == other).map(|(n, _)| *n).unwrap_or("%?");
                f.write_str(name)
            }
        }
    }
}

impl Component {
    pub fn from_name(name: &str) -> Option<Component> {
        Some(match name {
            "x" | "r" => Component::X,
            "y" | "g" => Component::Y,
            "z" | "b" => Component::Z,
            "w" | "a" => Component::W,
            _ => return None,
        })
    }

    /// Lane index within the vector.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        ["x", "y", "z", "w"][self.index()]
    }
}

const TYPE_NAMES: &[(&str, ScalarType)] = &[
    ("b1", ScalarType::B1),
    ("b8", ScalarType::B8),
    ("b16", ScalarType::B16),
    ("b32", ScalarType::B32),
    ("b64", ScalarType::B64),
    ("b128", ScalarType::B128),
    ("u4", ScalarType::U4),
    ("u8", ScalarType::U8),
    ("u16", ScalarType::U16),
    ("u32", ScalarType::U32),
    ("u64", ScalarType::U64),
    ("s4", ScalarType::S4),
    ("s8", ScalarType::S8),
    ("s16", ScalarType::S16),
    ("s32", ScalarType::S32),
    ("s64", ScalarType::S64),
    ("u16x2", ScalarType::U16x2),
    ("s16x2", ScalarType::S16x2),
    ("f16", ScalarType::F16),
    ("f16x2", ScalarType::F16x2),
    ("bf16", ScalarType::BF16),
    ("bf16x2", ScalarType::BF16x2),
    ("tf32", ScalarType::TF32),
    ("f32", ScalarType::F32),
    ("f64", ScalarType::F64),
    ("e4m3", ScalarType::E4M3),
    ("e5m2", ScalarType::E5M2),
    ("e4m3x2", ScalarType::E4M3x2),
    ("e5m2x2", ScalarType::E5M2x2),
    ("pred", ScalarType::Pred),
    ("texref", ScalarType::TexRef),
    ("samplerref", ScalarType::SamplerRef),
    ("surfref", ScalarType::SurfRef),
];

impl ScalarType {
    /// Parses a type name without its dot (`"f32"`).
    pub fn from_name(name: &str) -> Option<ScalarType> {
        TYPE_NAMES.iter().find(|(n, _)| *n == name).map(|&(_, t)| t)
    }

    /// The name without its dot.
    pub fn name(self) -> &'static str {
        TYPE_NAMES.iter().find(|(_, t)| *t == self).map(|(n, _)| *n).unwrap_or("?")
    }

    /// Width in bits. Predicates count as 1 bit; opaque handles as 64.
    pub fn bits(self) -> u32 {
        use ScalarType::*;
        match self {
            B1 | Pred => 1,
            U4 | S4 => 4,
            B8 | U8 | S8 | E4M3 | E5M2 => 8,
            B16 | U16 | S16 | F16 | BF16 | E4M3x2 | E5M2x2 => 16,
            B32 | U32 | S32 | F32 | TF32 | F16x2 | BF16x2 | U16x2 | S16x2 => 32,
            B64 | U64 | S64 | F64 | TexRef | SamplerRef | SurfRef => 64,
            B128 => 128,
        }
    }

    /// Storage size in bytes (sub-byte types round up to one byte).
    pub fn size(self) -> u64 {
        u64::from(self.bits().div_ceil(8))
    }

    pub fn is_float(self) -> bool {
        use ScalarType::*;
        matches!(self, F16 | F16x2 | BF16 | BF16x2 | TF32 | F32 | F64 | E4M3 | E5M2 | E4M3x2 | E5M2x2)
    }

    pub fn is_signed(self) -> bool {
        use ScalarType::*;
        matches!(self, S4 | S8 | S16 | S32 | S64 | S16x2)
    }
}

const SPACE_NAMES: &[(&str, StateSpace)] = &[
    ("reg", StateSpace::Reg),
    ("sreg", StateSpace::SReg),
    ("const", StateSpace::Const),
    ("global", StateSpace::Global),
    ("local", StateSpace::Local),
    ("param", StateSpace::Param),
    ("param::entry", StateSpace::ParamEntry),
    ("param::func", StateSpace::ParamFunc),
    ("shared", StateSpace::Shared),
    ("shared::cta", StateSpace::SharedCta),
    ("shared::cluster", StateSpace::SharedCluster),
    ("tex", StateSpace::Tex),
];

impl StateSpace {
    pub fn from_name(name: &str) -> Option<StateSpace> {
        SPACE_NAMES.iter().find(|(n, _)| *n == name).map(|&(_, s)| s)
    }

    pub fn name(self) -> &'static str {
        SPACE_NAMES.iter().find(|(_, s)| *s == self).map(|(n, _)| *n).unwrap_or("?")
    }
}

impl Linkage {
    pub fn from_name(name: &str) -> Option<Linkage> {
        Some(match name {
            "visible" => Linkage::Visible,
            "extern" => Linkage::Extern,
            "weak" => Linkage::Weak,
            "common" => Linkage::Common,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Linkage::Visible => "visible",
            Linkage::Extern => "extern",
            Linkage::Weak => "weak",
            Linkage::Common => "common",
        }
    }
}

impl Modifier {
    /// Classifies a dot-suffix (given without its dot).
    pub fn from_word(word: &str) -> Modifier {
        if let Some(t) = ScalarType::from_name(word) {
            return Modifier::Type(t);
        }
        if let Some(s) = StateSpace::from_name(word) {
            return Modifier::Space(s);
        }
        match word {
            "v2" => Modifier::Vector(2),
            "v4" => Modifier::Vector(4),
            "v8" => Modifier::Vector(8),
            _ => Modifier::Other(word.to_string()),
        }
    }
}

impl Instruction {
    /// The type suffixes in order: `cvt.rn.f32.s32` gives `[F32, S32]`.
    pub fn types(&self) -> impl Iterator<Item = ScalarType> + '_ {
        self.modifiers.iter().filter_map(|m| match m {
            Modifier::Type(t) => Some(*t),
            _ => None,
        })
    }

    /// The state space suffix, if any (`ld.global` gives `Global`).
    pub fn space(&self) -> Option<StateSpace> {
        self.modifiers.iter().find_map(|m| match m {
            Modifier::Space(s) => Some(*s),
            _ => None,
        })
    }

    /// The vector width suffix, if any.
    pub fn vector(&self) -> Option<u8> {
        self.modifiers.iter().find_map(|m| match m {
            Modifier::Vector(n) => Some(*n),
            _ => None,
        })
    }

    /// Whether a non-type, non-space word modifier such as `"rn"` or `"sync"` is present.
    pub fn has(&self, word: &str) -> bool {
        self.modifiers.iter().any(|m| matches!(m, Modifier::Other(w) if w == word))
    }

    /// The full mnemonic as written, e.g. `ld.global.nc.v4.f32`.
    pub fn mnemonic(&self) -> String {
        let mut s = self.opcode.clone();
        for m in &self.modifiers {
            s.push('.');
            s.push_str(&m.to_string());
        }
        s
    }
}

impl fmt::Display for Modifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Modifier::Type(t) => f.write_str(t.name()),
            Modifier::Vector(n) => write!(f, "v{n}"),
            Modifier::Space(s) => f.write_str(s.name()),
            Modifier::Other(w) => f.write_str(w),
        }
    }
}

impl VarDecl {
    /// Size in bytes of one element: the type times the vector width.
    pub fn element_size(&self) -> u64 {
        self.ty.size() * u64::from(self.vector.unwrap_or(1))
    }

    /// Size in bytes of one declared variable (unsized dimensions count as zero elements);
    /// `u64::MAX` where the dimensions multiply past it.
    pub fn size_of(&self, declarator: &Declarator) -> u64 {
        saturating_product(&declarator.dims).saturating_mul(self.element_size())
    }

    /// Alignment in bytes: the explicit `.align`, else the element size.
    pub fn alignment(&self) -> u64 {
        self.align.map_or_else(|| self.element_size(), u64::from)
    }
}

/// The product of array dimensions (unsized ones count as 0), saturating: the dimensions are
/// the module's word, and `[4294967296][4294967296]` must not overflow.
fn saturating_product(dims: &[Option<u64>]) -> u64 {
    dims.iter().fold(1, |n, d| n.saturating_mul(d.unwrap_or(0)))
}

impl Param {
    /// Number of elements (product of the array dimensions; 1 for a scalar; 0 if unsized;
    /// `u64::MAX` where the dimensions multiply past it).
    pub fn count(&self) -> u64 {
        saturating_product(&self.dims)
    }

    /// Size in bytes of the parameter (`u64::MAX` where it does not fit).
    pub fn size(&self) -> u64 {
        (self.ty.size() * u64::from(self.vector.unwrap_or(1))).saturating_mul(self.count())
    }

    /// Alignment in bytes: the explicit `.align`, else the natural alignment of the element.
    pub fn alignment(&self) -> u64 {
        match self.align {
            Some(a) => u64::from(a),
            None => self.ty.size() * u64::from(self.vector.unwrap_or(1)),
        }
    }
}

impl Module {
    /// All functions (definitions and prototypes) in source order.
    pub fn functions(&self) -> impl Iterator<Item = &Function> + '_ {
        self.directives.iter().filter_map(|d| match d {
            Directive::Function(f) => Some(f),
            _ => None,
        })
    }

    /// The kernels (`.entry` functions).
    pub fn entries(&self) -> impl Iterator<Item = &Function> + '_ {
        self.functions().filter(|f| f.kind == FunctionKind::Entry)
    }

    /// The definition of a function by name, if there is one (else its prototype).
    pub fn function(&self, name: &str) -> Option<&Function> {
        let mut found = None;
        for f in self.functions().filter(|f| f.name == name) {
            if f.body.is_some() {
                return Some(f);
            }
            found.get_or_insert(f);
        }
        found
    }

    /// Module-scope variables.
    pub fn variables(&self) -> impl Iterator<Item = &VarDecl> + '_ {
        self.directives.iter().filter_map(|d| match d {
            Directive::Variable(v) => Some(v),
            _ => None,
        })
    }

    /// `.version` as (major, minor).
    pub fn version(&self) -> Option<(u32, u32)> {
        self.directives.iter().find_map(|d| match d {
            Directive::Version { major, minor } => Some((*major, *minor)),
            _ => None,
        })
    }

    /// The `.target` list (architecture first).
    pub fn target(&self) -> Option<&[String]> {
        self.directives.iter().find_map(|d| match d {
            Directive::Target(t) => Some(t.as_slice()),
            _ => None,
        })
    }

    pub fn address_size(&self) -> Option<u32> {
        self.directives.iter().find_map(|d| match d {
            Directive::AddressSize(n) => Some(*n),
            _ => None,
        })
    }

    /// A copy with every source line number set to 0, for comparing trees parsed from
    /// differently formatted text.
    pub fn without_lines(&self) -> Module {
        let mut m = self.clone();
        for d in &mut m.directives {
            if let Directive::Function(f) = d {
                f.line = 0;
                if let Some(body) = &mut f.body {
                    clear_lines(body);
                }
            }
        }
        m
    }

    /// Structural equality that ignores source line numbers.
    pub fn eq_ignoring_lines(&self, other: &Module) -> bool {
        self.without_lines() == other.without_lines()
    }
}

fn clear_lines(stmts: &mut [Statement]) {
    for s in stmts {
        s.line = 0;
        if let StatementKind::Block(inner) = &mut s.kind {
            clear_lines(inner);
        }
    }
}

impl Function {
    /// Visits every instruction in the body (descending into blocks) with its source line.
    pub fn instructions(&self) -> Vec<(u32, &Instruction)> {
        fn walk<'a>(stmts: &'a [Statement], out: &mut Vec<(u32, &'a Instruction)>) {
            for s in stmts {
                match &s.kind {
                    StatementKind::Instruction(i) => out.push((s.line, i)),
                    StatementKind::Block(b) => walk(b, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        if let Some(body) = &self.body {
            walk(body, &mut out);
        }
        out
    }
}
