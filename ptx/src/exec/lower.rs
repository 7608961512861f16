//! Lowering: from the syntax tree to the IR of [`super::ir`].
//!
//! Lowering walks each function body once. Declarations allocate registers (dense indices, one per scalar register;
//! `%r<N>` ranges are resolved arithmetically so a huge declared range costs nothing until it is used) and frame slots
//! (`.local` variables and `.param` call slots, laid out in the function's per-thread frame). Each instruction is
//! decoded from its opcode, modifiers and operands into an [`Op`]; any combination not understood becomes a
//! [`LowerError`] carrying the instruction text and line, so the function is marked unusable without affecting the
//! others. Labels are resolved after the walk.

use std::collections::HashMap;

use super::float::{self, Rnd};
use super::ir::*;
use super::{FUNC_WINDOW, PARAM_WINDOW, VariableInfo};
use crate::ast::{
    Function, FunctionKind, Immediate, Initializer, Instruction, Modifier, Module, Operand, Param, ScalarType,
    SpecialReg, StateSpace, Statement, StatementKind, VarDecl,
};

/// Registers per function beyond which lowering refuses (each costs 256 bytes per warp frame).
const MAX_REGS: u32 = 1 << 16;
/// The barrier id `barrier.cluster.wait` uses (ids 0..16 are the block's named barriers).
pub const CLUSTER_BARRIER: u64 = 16;
/// Bytes of per-thread frame beyond which lowering refuses.
const MAX_FRAME: u64 = 1 << 24;

/// Why a function could not be lowered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LowerError {
    pub function: String,
    pub instruction: String,
    pub line: u32,
}

/// A shared variable: module-scope or declared in a function body.
#[derive(Clone, Debug)]
pub struct SharedVar {
    pub size: u64,
    pub align: u64,
    /// `.extern .shared` unsized arrays: the dynamic shared memory.
    pub dynamic: bool,
}

/// A relocation in a variable's initial contents.
#[derive(Clone, Debug)]
pub struct Reloc {
    pub offset: u64,
    pub size: u64,
    pub target: RelocTarget,
    pub addend: i64,
}

#[derive(Clone, Debug)]
pub enum RelocTarget {
    Var(u32),
    Func(u32),
    /// A symbol that cannot be resolved (kept so that the bytes are still produced).
    Unknown,
}

/// Everything lowering produces for a module.
pub struct Lowered {
    pub funcs: Vec<Result<Func, LowerError>>,
    pub func_index: HashMap<String, u32>,
    pub vars: Vec<VariableInfo>,
    pub var_bytes: Vec<Vec<u8>>,
    pub var_relocs: Vec<Vec<Reloc>>,
    pub shared: Vec<SharedVar>,
    /// Functions whose address is taken (possible indirect call targets).
    pub address_taken: Vec<u32>,
}

#[derive(Clone, Copy, Debug)]
enum ModSym {
    Var(u32),
    Shared(u32),
    Func(u32),
    /// Declared but not defined here (`.extern .func vprintf`).
    ExternFunc,
    /// A `.texref`, `.samplerref` or `.surfref` variable: the texture references CUDA 12 removed.
    OpaqueRef(ScalarType),
    Unsupported,
}

#[derive(Clone, Copy, Debug)]
enum Binding {
    Reg(Reg),
    /// A vector register: base index and width.
    RegVec(Reg, u8),
    Frame(u32, u32),
    Shared(u32),
    KParam(u32),
}

#[derive(Default)]
struct Scope {
    names: HashMap<String, Binding>,
    /// `%r<N>`: prefix -> (count, first register).
    ranges: HashMap<String, (u32, Reg)>,
}

type LResult<T> = Result<T, String>;

pub fn lower_module(module: &Module) -> Lowered {
    let mut syms: HashMap<String, ModSym> = HashMap::new();
    let mut func_index = HashMap::new();
    let mut defined: Vec<&Function> = Vec::new();
    for f in module.functions() {
        if f.body.is_some() && !func_index.contains_key(&f.name) {
            func_index.insert(f.name.clone(), defined.len() as u32);
            syms.insert(f.name.clone(), ModSym::Func(defined.len() as u32));
            defined.push(f);
        }
    }
    for f in module.functions() {
        syms.entry(f.name.clone()).or_insert(ModSym::ExternFunc);
    }
    let mut vars = Vec::new();
    let mut var_decls: Vec<(&VarDecl, usize)> = Vec::new();
    let mut shared = Vec::new();
    for v in module.variables() {
        for (i, d) in v.declarators.iter().enumerate() {
            if matches!(v.ty, ScalarType::TexRef | ScalarType::SamplerRef | ScalarType::SurfRef) {
                syms.insert(d.name.clone(), ModSym::OpaqueRef(v.ty));
                continue;
            }
            match v.space {
                StateSpace::Global | StateSpace::Const => {
                    let size = declared_size(v, i);
                    syms.insert(d.name.clone(), ModSym::Var(vars.len() as u32));
                    vars.push(VariableInfo { name: d.name.clone(), space: v.space, size, align: v.alignment().max(1) });
                    var_decls.push((v, i));
                }
                StateSpace::Shared | StateSpace::SharedCta => {
                    let dynamic =
                        d.dims.iter().any(|x| x.is_none()) || (v.linkage == Some(crate::ast::Linkage::Extern));
                    syms.insert(d.name.clone(), ModSym::Shared(shared.len() as u32));
                    shared.push(SharedVar {
                        size: if dynamic { 0 } else { v.size_of(d) },
                        align: v.alignment().max(1),
                        dynamic,
                    });
                }
                _ => {
                    syms.insert(d.name.clone(), ModSym::Unsupported);
                }
            }
        }
    }
    let mut var_bytes = Vec::new();
    let mut var_relocs = Vec::new();
    for (v, i) in &var_decls {
        let (bytes, relocs) = initial_bytes(v, *i, &syms);
        var_bytes.push(bytes);
        var_relocs.push(relocs);
    }
    let mut address_taken = Vec::new();
    for r in var_relocs.iter().flatten() {
        if let RelocTarget::Func(f) = r.target {
            address_taken.push(f);
        }
    }
    let mut funcs = Vec::new();
    for f in &defined {
        let mut fl = FnLower::new(f, &syms, &mut shared, &func_index);
        let res = fl.lower();
        address_taken.extend(fl.address_taken.iter().copied());
        funcs.push(res);
    }
    address_taken.sort_unstable();
    address_taken.dedup();
    Lowered { funcs, func_index, vars, var_bytes, var_relocs, shared, address_taken }
}

fn declared_size(v: &VarDecl, i: usize) -> u64 {
    let d = &v.declarators[i];
    let elem = v.element_size();
    if d.dims.iter().any(|x| x.is_none()) {
        // `x[] = {...}`: the initializer gives the count.
        let n = d.init.as_ref().map_or(0, count_leaves);
        return n.saturating_mul(elem);
    }
    v.size_of(d)
}

fn count_leaves(i: &Initializer) -> u64 {
    match i {
        Initializer::List(items) => items.iter().map(count_leaves).sum(),
        _ => 1,
    }
}

fn initial_bytes(v: &VarDecl, i: usize, syms: &HashMap<String, ModSym>) -> (Vec<u8>, Vec<Reloc>) {
    let size = declared_size(v, i);
    let mut relocs = Vec::new();
    let Some(init) = &v.declarators[i].init else { return (Vec::new(), relocs) };
    let mut leaves = Vec::new();
    flatten(init, &mut leaves);
    let esize = v.ty.size();
    // Only the initialized prefix: the storage the backend gives a variable starts zeroed,
    // and a module may declare gigabytes it never initializes.
    let mut bytes = vec![0u8; size.min((leaves.len() as u64).saturating_mul(esize)) as usize];
    for (k, leaf) in leaves.iter().enumerate() {
        let off = k as u64 * esize;
        if off + esize > bytes.len() as u64 {
            break;
        }
        match leaf {
            Initializer::Imm(imm) => {
                let val = imm_for_type(*imm, v.ty);
                let b = val.to_le_bytes();
                bytes[off as usize..(off + esize) as usize].copy_from_slice(&b[..esize as usize]);
            }
            Initializer::Address { name, offset, .. } => {
                let target = match syms.get(name) {
                    Some(ModSym::Var(x)) => RelocTarget::Var(*x),
                    Some(ModSym::Func(x)) => RelocTarget::Func(*x),
                    _ => RelocTarget::Unknown,
                };
                relocs.push(Reloc { offset: off, size: esize, target, addend: *offset });
            }
            Initializer::List(_) => {}
        }
    }
    (bytes, relocs)
}

fn flatten<'a>(i: &'a Initializer, out: &mut Vec<&'a Initializer>) {
    match i {
        Initializer::List(items) => items.iter().for_each(|x| flatten(x, out)),
        other => out.push(other),
    }
}

/// The bits an immediate stands for in an operand (or initializer) of type `ty`.
fn imm_for_type(imm: Immediate, ty: ScalarType) -> u64 {
    match ty {
        ScalarType::F32 => match imm {
            Immediate::F32(b) => b as u64,
            Immediate::F64(b) => float::f64_to_f32(f64::from_bits(b), Rnd::Rn) as u64,
            Immediate::Int(v) => (v as f32).to_bits() as u64,
        },
        ScalarType::F64 => match imm {
            Immediate::F32(b) => (f32::from_bits(b) as f64).to_bits(),
            Immediate::F64(b) => b,
            Immediate::Int(v) => (v as f64).to_bits(),
        },
        ScalarType::F16 | ScalarType::BF16 => {
            let fmt = if ty == ScalarType::F16 { float::F16 } else { float::BF16 };
            match imm {
                Immediate::F32(b) => float::convert(b as u64, float::F32, fmt, Rnd::Rn),
                Immediate::F64(b) => float::convert(b, float::F64, fmt, Rnd::Rn),
                Immediate::Int(v) => v as u64,
            }
        }
        _ => match imm {
            Immediate::Int(v) => v as u64,
            Immediate::F32(b) => b as u64,
            Immediate::F64(b) => b,
        },
    }
}

/// How an operand's immediates are to be read.
#[derive(Clone, Copy)]
enum K {
    /// Integer or bit type: the literal bits.
    Bits,
    F32,
    F64,
}

fn k_of(t: ScalarType) -> K {
    match t {
        ScalarType::F32 => K::F32,
        ScalarType::F64 => K::F64,
        _ => K::Bits,
    }
}

struct FnLower<'a> {
    f: &'a Function,
    syms: &'a HashMap<String, ModSym>,
    shared: &'a mut Vec<SharedVar>,
    func_index: &'a HashMap<String, u32>,
    scopes: Vec<Scope>,
    nregs: u32,
    frame: u64,
    frame_align: u64,
    code: Vec<Inst>,
    labels: HashMap<String, u32>,
    /// (instruction index, label names) to patch.
    fixups: Vec<(usize, Vec<String>, u32, String)>,
    branch_tables: HashMap<String, Vec<String>>,
    cc: Option<Reg>,
    shared_refs: Vec<u32>,
    callees: Vec<u32>,
    indirect: bool,
    address_taken: Vec<u32>,
    cur_line: u32,
}

impl<'a> FnLower<'a> {
    fn new(
        f: &'a Function,
        syms: &'a HashMap<String, ModSym>,
        shared: &'a mut Vec<SharedVar>,
        func_index: &'a HashMap<String, u32>,
    ) -> Self {
        FnLower {
            f,
            syms,
            shared,
            func_index,
            scopes: vec![Scope::default()],
            nregs: 0,
            frame: 0,
            frame_align: 16,
            code: Vec::new(),
            labels: HashMap::new(),
            fixups: Vec::new(),
            branch_tables: HashMap::new(),
            cc: None,
            shared_refs: Vec::new(),
            callees: Vec::new(),
            indirect: false,
            address_taken: Vec::new(),
            cur_line: 0,
        }
    }

    fn err_at(&self, line: u32, text: String) -> LowerError {
        LowerError { function: self.f.name.clone(), instruction: text, line }
    }

    fn lower(&mut self) -> Result<Func, LowerError> {
        let f = self.f;
        let is_entry = f.kind == FunctionKind::Entry;
        let mut params = Vec::new();
        let mut rets = Vec::new();
        let mut param_size = 0u64;
        if is_entry {
            let sig = crate::signature_of(f);
            for p in &sig.params {
                self.scopes[0].names.insert(p.name.clone(), Binding::KParam(p.offset.min(u32::MAX as u64) as u32));
            }
            param_size = sig.size;
        } else {
            for p in &f.return_params {
                let loc = self.declare_param(p).map_err(|e| self.err_at(f.line, e))?;
                rets.push(loc);
            }
            for p in &f.params {
                let loc = self.declare_param(p).map_err(|e| self.err_at(f.line, e))?;
                params.push(loc);
            }
        }
        let body = f.body.as_deref().unwrap_or(&[]);
        self.collect_labels(body);
        self.block(body)?;
        let end_line = body.last().map_or(f.line, |s| s.line);
        self.code.push(Inst { op: if is_entry { Op::Exit } else { Op::Ret }, guard: None, line: end_line });
        for (idx, names, line, text) in std::mem::take(&mut self.fixups) {
            let mut targets = Vec::new();
            for n in &names {
                match self.labels.get(n) {
                    Some(&t) => targets.push(t),
                    None => return Err(self.err_at(line, format!("{text} (unknown label `{n}`)"))),
                }
            }
            match &mut self.code[idx].op {
                Op::Bra { target } => *target = targets[0],
                Op::Brx { targets: t, .. } => *t = targets,
                _ => {}
            }
        }
        if self.frame > MAX_FRAME {
            return Err(self.err_at(f.line, format!("{} (frame of {} bytes is too large)", f.name, self.frame)));
        }
        self.shared_refs.sort_unstable();
        self.shared_refs.dedup();
        self.callees.sort_unstable();
        self.callees.dedup();
        Ok(Func {
            name: f.name.clone(),
            is_entry,
            code: std::mem::take(&mut self.code),
            nregs: self.nregs.max(1),
            frame_size: (self.frame.div_ceil(16) * 16) as u32,
            frame_align: self.frame_align as u32,
            params,
            rets,
            param_size,
            shared_refs: std::mem::take(&mut self.shared_refs),
            callees: std::mem::take(&mut self.callees),
            indirect_calls: self.indirect,
        })
    }

    fn declare_param(&mut self, p: &Param) -> LResult<ParamLoc> {
        if p.space == StateSpace::Reg {
            let r = self.alloc_regs(1)?;
            self.scopes[0].names.insert(p.name.clone(), Binding::Reg(r));
            return Ok(ParamLoc::Reg(r));
        }
        let size = p.size().max(if p.dims.is_empty() { p.ty.size() } else { 0 });
        let off = self.alloc_frame(size, p.alignment().max(1))?;
        self.scopes[0].names.insert(p.name.clone(), Binding::Frame(off, size as u32));
        Ok(ParamLoc::Frame(off, size as u32))
    }

    fn alloc_regs(&mut self, n: u32) -> LResult<Reg> {
        let base = self.nregs;
        match self.nregs.checked_add(n) {
            Some(t) if t <= MAX_REGS => {
                self.nregs = t;
                Ok(base)
            }
            _ => Err(format!("too many registers in `{}`", self.f.name)),
        }
    }

    fn alloc_frame(&mut self, size: u64, align: u64) -> LResult<u32> {
        let align = align.clamp(1, 4096);
        self.frame_align = self.frame_align.max(align);
        let off = self.frame.div_ceil(align) * align;
        let end = off.checked_add(size).ok_or("frame overflow")?;
        if end > MAX_FRAME {
            return Err(format!("per-thread frame of `{}` is too large", self.f.name));
        }
        self.frame = end;
        Ok(off as u32)
    }

    fn collect_labels(&mut self, stmts: &[Statement]) {
        for s in stmts {
            match &s.kind {
                StatementKind::Block(b) => self.collect_labels(b),
                StatementKind::BranchTargets { label, targets } => {
                    self.branch_tables.insert(label.clone(), targets.clone());
                }
                _ => {}
            }
        }
    }

    fn block(&mut self, stmts: &[Statement]) -> Result<(), LowerError> {
        for s in stmts {
            match &s.kind {
                StatementKind::Decl(d) => self.decl(d).map_err(|e| self.err_at(s.line, format!("{d} ({e})")))?,
                StatementKind::Label(l) => {
                    self.labels.insert(l.clone(), self.code.len() as u32);
                }
                StatementKind::Instruction(i) => {
                    let text = i.to_string().replace(" \t", " ");
                    let inst = self.inst(i, s.line).map_err(|e| {
                        let text = if e.is_empty() { text.clone() } else { format!("{text} ({e})") };
                        self.err_at(s.line, text)
                    })?;
                    self.code.push(inst);
                }
                StatementKind::Block(b) => {
                    self.scopes.push(Scope::default());
                    let r = self.block(b);
                    self.scopes.pop();
                    r?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn decl(&mut self, d: &VarDecl) -> LResult<()> {
        match d.space {
            StateSpace::Reg => {
                let width = d.vector.unwrap_or(1) as u32;
                for decl in &d.declarators {
                    match decl.range {
                        Some(n) => {
                            let count = n.checked_mul(width).ok_or("register range too large")?;
                            let base = self.alloc_regs(count)?;
                            let scope = self.scopes.last_mut().ok_or("no scope")?;
                            scope.ranges.insert(decl.name.clone(), (n, base));
                        }
                        None => {
                            let base = self.alloc_regs(width)?;
                            let b = if width > 1 { Binding::RegVec(base, width as u8) } else { Binding::Reg(base) };
                            self.scopes.last_mut().ok_or("no scope")?.names.insert(decl.name.clone(), b);
                        }
                    }
                }
            }
            StateSpace::Local | StateSpace::Param => {
                for decl in &d.declarators {
                    let size = d.size_of(decl).max(if decl.dims.is_empty() { d.element_size() } else { 0 });
                    let off = self.alloc_frame(size, d.alignment().max(1))?;
                    self.scopes
                        .last_mut()
                        .ok_or("no scope")?
                        .names
                        .insert(decl.name.clone(), Binding::Frame(off, size as u32));
                }
            }
            StateSpace::Shared | StateSpace::SharedCta => {
                for decl in &d.declarators {
                    let dynamic = decl.dims.iter().any(|x| x.is_none());
                    let id = self.shared.len() as u32;
                    self.shared.push(SharedVar {
                        size: if dynamic { 0 } else { d.size_of(decl) },
                        align: d.alignment().max(1),
                        dynamic,
                    });
                    self.scopes.last_mut().ok_or("no scope")?.names.insert(decl.name.clone(), Binding::Shared(id));
                }
            }
            _ => return Err("unsupported declaration in a function body".into()),
        }
        Ok(())
    }

    fn lookup(&self, name: &str) -> Option<Binding> {
        for s in self.scopes.iter().rev() {
            if let Some(b) = s.names.get(name) {
                return Some(*b);
            }
            if !s.ranges.is_empty() {
                let digits = name.len() - name.bytes().rev().take_while(|b| b.is_ascii_digit()).count();
                let (prefix, num) = name.split_at(digits);
                if !num.is_empty()
                    && (num == "0" || !num.starts_with('0'))
                    && let (Some(&(count, base)), Ok(n)) = (s.ranges.get(prefix), num.parse::<u32>())
                    && n < count
                {
                    return Some(Binding::Reg(base + n));
                }
            }
        }
        None
    }

    // ----- operands -----

    fn reg(&self, op: &Operand) -> LResult<Reg> {
        match op {
            Operand::Reg(name) => match self.lookup(name) {
                Some(Binding::Reg(r)) => Ok(r),
                Some(Binding::RegVec(r, _)) => Ok(r),
                _ => Err(format!("unknown register `{name}`")),
            },
            Operand::RegComponent(name, c) => match self.lookup(name) {
                Some(Binding::RegVec(r, n)) if (c.index() as u8) < n => Ok(r + c.index() as u32),
                _ => Err(format!("unknown register `{name}`")),
            },
            Operand::Symbol(name) => match self.lookup(name) {
                Some(Binding::Reg(r)) => Ok(r),
                _ => Err(format!("`{name}` is not a register")),
            },
            _ => Err(format!("expected a register, found `{op}`")),
        }
    }

    fn dst(&self, op: &Operand) -> LResult<Option<Reg>> {
        match op {
            Operand::Sink => Ok(None),
            _ => self.reg(op).map(Some),
        }
    }

    fn src(&mut self, op: &Operand, k: K) -> LResult<Src> {
        match op {
            Operand::Reg(_) | Operand::RegComponent(..) => Ok(Src::Reg(self.reg(op)?)),
            Operand::Imm(i) => Ok(Src::Imm(match k {
                K::Bits => imm_for_type(*i, ScalarType::B64),
                K::F32 => imm_for_type(*i, ScalarType::F32),
                K::F64 => imm_for_type(*i, ScalarType::F64),
            })),
            Operand::Special(s, c) => Ok(Src::Special(special(*s, c.map(|c| c.index() as u8)))),
            Operand::Symbol(name) => self.symbol_value(name),
            _ => Err(format!("unsupported operand `{op}`")),
        }
    }

    fn symbol_value(&mut self, name: &str) -> LResult<Src> {
        if let Some(b) = self.lookup(name) {
            return Ok(match b {
                Binding::Reg(r) | Binding::RegVec(r, _) => Src::Reg(r),
                Binding::Frame(off, _) => Src::Frame(off),
                Binding::Shared(id) => {
                    self.shared_refs.push(id);
                    Src::Shared(id)
                }
                Binding::KParam(off) => Src::Imm(PARAM_WINDOW + off as u64),
            });
        }
        match self.syms.get(name) {
            Some(ModSym::Var(i)) => Ok(Src::Var(*i)),
            Some(ModSym::Shared(i)) => {
                self.shared_refs.push(*i);
                Ok(Src::Shared(*i))
            }
            Some(ModSym::Func(i)) => {
                self.address_taken.push(*i);
                Ok(Src::Imm(FUNC_WINDOW + *i as u64))
            }
            Some(ModSym::ExternFunc) => Err(format!("address of undefined function `{name}`")),
            Some(ModSym::OpaqueRef(t)) => Err(opaque_ref(name, *t)),
            Some(ModSym::Unsupported) => Err(format!("variable `{name}` is in an unsupported state space")),
            None => Err(format!("unknown symbol `{name}`")),
        }
    }

    /// Lowers `[base+off]` for an access in `space`, returning the space actually used (a symbol of a known space
    /// turns a generic or `.param` access into an access of that space).
    fn addr(&mut self, op: &Operand, space: Space) -> LResult<(Addr, Space)> {
        let a = match op {
            Operand::Address(a) => a,
            Operand::Symbol(name) => {
                return self.addr(
                    &Operand::Address(crate::ast::Address {
                        base: crate::ast::AddressBase::Symbol(name.clone()),
                        offset: 0,
                    }),
                    space,
                );
            }
            _ => return Err(format!("expected an address, found `{op}`")),
        };
        match &a.base {
            crate::ast::AddressBase::Absolute => Ok((Addr { base: Src::Imm(0), offset: a.offset }, space)),
            crate::ast::AddressBase::Reg(name) => {
                let r = self.reg(&Operand::Reg(name.clone()))?;
                Ok((Addr { base: Src::Reg(r), offset: a.offset }, space))
            }
            crate::ast::AddressBase::Symbol(name) => {
                let base = self.symbol_value(name)?;
                let sp = match base {
                    Src::Frame(_) => Space::Local,
                    Src::Shared(_) => Space::Shared,
                    Src::Var(_) if space == Space::Generic => Space::Global,
                    Src::Imm(x) if (PARAM_WINDOW..FUNC_WINDOW).contains(&x) => Space::Param,
                    Src::Reg(_) => space,
                    _ => space,
                };
                Ok((Addr { base, offset: a.offset }, sp))
            }
        }
    }

    fn cc(&mut self) -> LResult<Reg> {
        if let Some(r) = self.cc {
            return Ok(r);
        }
        let r = self.alloc_regs(1)?;
        self.cc = Some(r);
        Ok(r)
    }

    fn guard(&self, i: &Instruction) -> LResult<Option<(Reg, bool)>> {
        match &i.guard {
            None => Ok(None),
            Some(g) => {
                let r = match self.lookup(&g.pred) {
                    Some(Binding::Reg(r)) => r,
                    _ => return Err(format!("unknown predicate `{}`", g.pred)),
                };
                Ok(Some((r, g.negated)))
            }
        }
    }

    fn inst(&mut self, i: &Instruction, line: u32) -> LResult<Inst> {
        self.cur_line = line;
        let guard = self.guard(i)?;
        let mut m = Mods::new(i);
        let op = self.op(i, &mut m)?;
        if let Some(w) = m.unused() {
            return Err(format!("modifier `.{w}` is not supported"));
        }
        Ok(Inst { op, guard, line })
    }

    fn op(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        let n = ops.len();
        let need =
            |k: usize| -> LResult<()> { if n < k { Err(format!("expected {k} operands, found {n}")) } else { Ok(()) } };
        match i.opcode.as_str() {
            "mov" => {
                need(2)?;
                let t = m.one_type()?;
                if let Operand::Vector(items) = &ops[0] {
                    let ds = items.iter().map(|x| self.dst(x)).collect::<LResult<Vec<_>>>()?;
                    let a = self.src(&ops[1], K::Bits)?;
                    let elem = (t.bits() / ds.len().max(1) as u32) as u8;
                    return Ok(Op::Unpack { ds, a, elem_bits: elem });
                }
                let d = self.reg(&ops[0])?;
                if let Operand::Vector(items) = &ops[1] {
                    let srcs = items.iter().map(|x| self.src(x, K::Bits)).collect::<LResult<Vec<_>>>()?;
                    let elem = (t.bits() / srcs.len().max(1) as u32) as u8;
                    return Ok(Op::Pack { d, srcs, elem_bits: elem });
                }
                let a = self.src(&ops[1], k_of(t))?;
                Ok(Op::Mov { d, a, bits: bits_of(t) })
            }
            "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "mul24" => {
                need(3)?;
                let t = m.one_type()?;
                if is_float_ty(t) {
                    return self.float_bin(i, m, t);
                }
                let ty = int_ty(t)?;
                let opc = i.opcode.as_str();
                let cc_out = m.take("cc");
                if cc_out {
                    if opc != "add" && opc != "sub" {
                        return Err(String::new());
                    }
                    let cc = self.cc()?;
                    let d = self.reg(&ops[0])?;
                    let (a, b) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?);
                    return Ok(Op::Carry { sub: opc == "sub", cin: false, cout: true, bits: ty.bits, d, a, b, cc });
                }
                let sat = m.take("sat");
                let bop = match opc {
                    "add" if sat => IBin::AddSat,
                    "sub" if sat => IBin::SubSat,
                    "add" => IBin::Add,
                    "sub" => IBin::Sub,
                    "mul" => {
                        if m.take("hi") {
                            IBin::MulHi
                        } else if m.take("wide") {
                            IBin::MulWide
                        } else {
                            m.take("lo");
                            IBin::MulLo
                        }
                    }
                    "mul24" => {
                        if m.take("hi") {
                            IBin::Mul24Hi
                        } else {
                            m.take("lo");
                            IBin::Mul24Lo
                        }
                    }
                    "div" => IBin::Div,
                    "rem" => IBin::Rem,
                    "min" => {
                        m.take("relu");
                        IBin::Min
                    }
                    _ => {
                        m.take("relu");
                        IBin::Max
                    }
                };
                if sat && ty != (IntTy { bits: 32, signed: true }) {
                    return Err(String::new());
                }
                let d = self.reg(&ops[0])?;
                let (a, b) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?);
                Ok(Op::IBin { op: bop, ty, d, a, b })
            }
            "addc" | "subc" => {
                need(3)?;
                let t = m.one_type()?;
                let ty = int_ty(t)?;
                let cout = m.take("cc");
                let cc = self.cc()?;
                let d = self.reg(&ops[0])?;
                let (a, b) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?);
                Ok(Op::Carry { sub: i.opcode == "subc", cin: true, cout, bits: ty.bits, d, a, b, cc })
            }
            "mad" | "madc" | "mad24" | "fma" => {
                need(4)?;
                let t = m.one_type()?;
                if is_float_ty(t) {
                    let ty = fty(t)?;
                    let mode = self.fmode(m, t, i.opcode == "fma")?;
                    let k = k_of(t);
                    let d = self.reg(&ops[0])?;
                    let (a, b, c) = (self.src(&ops[1], k)?, self.src(&ops[2], k)?, self.src(&ops[3], k)?);
                    return Ok(Op::Fma { ty, m: mode, d, a, b, c });
                }
                let ty = int_ty(t)?;
                let cin = i.opcode == "madc";
                let cout = m.take("cc");
                let mode = if i.opcode == "mad24" {
                    if m.take("hi") {
                        MadMode::Hi24
                    } else {
                        m.take("lo");
                        MadMode::Lo24
                    }
                } else if m.take("hi") {
                    if m.take("sat") { MadMode::HiSat } else { MadMode::Hi }
                } else if m.take("wide") {
                    MadMode::Wide
                } else {
                    m.take("lo");
                    MadMode::Lo
                };
                let cc = if cin || cout { self.cc()? } else { 0 };
                let d = self.reg(&ops[0])?;
                let (a, b, c) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?, self.src(&ops[3], K::Bits)?);
                Ok(Op::Mad { mode, ty, cin, cout, d, a, b, c, cc })
            }
            "and" | "or" | "xor" => {
                need(3)?;
                let t = m.one_type()?;
                let d = self.reg(&ops[0])?;
                let (a, b) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?);
                let op = match i.opcode.as_str() {
                    "and" => IBin::And,
                    "or" => IBin::Or,
                    _ => IBin::Xor,
                };
                Ok(Op::IBin { op, ty: IntTy { bits: bits_of(t), signed: false }, d, a, b })
            }
            "shl" | "shr" => {
                need(3)?;
                let t = m.one_type()?;
                let ty = int_ty(t)?;
                let d = self.reg(&ops[0])?;
                let (a, b) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?);
                let op = if i.opcode == "shl" { IBin::Shl } else { IBin::Shr };
                Ok(Op::IBin { op, ty, d, a, b })
            }
            "not" | "cnot" | "popc" | "clz" | "brev" | "bfind" => {
                need(2)?;
                let t = m.one_type()?;
                let ty = int_ty(t)?;
                let op = match i.opcode.as_str() {
                    "not" => IUn::Not,
                    "cnot" => IUn::Cnot,
                    "popc" => IUn::Popc,
                    "clz" => IUn::Clz,
                    "brev" => IUn::Brev,
                    _ => {
                        if m.take("shiftamt") {
                            IUn::BfindShift
                        } else {
                            IUn::Bfind
                        }
                    }
                };
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], K::Bits)?;
                Ok(Op::IUn { op, ty, d, a })
            }
            "neg" | "abs" => {
                need(2)?;
                let t = m.one_type()?;
                if is_float_ty(t) {
                    let ty = fty(t)?;
                    let mode = self.fmode(m, t, false)?;
                    let d = self.reg(&ops[0])?;
                    let a = self.src(&ops[1], k_of(t))?;
                    let op = if i.opcode == "neg" { FUn::Neg } else { FUn::Abs };
                    return Ok(Op::FUn { op, ty, m: mode, d, a });
                }
                let ty = int_ty(t)?;
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], K::Bits)?;
                Ok(Op::IUn { op: if i.opcode == "neg" { IUn::Neg } else { IUn::Abs }, ty, d, a })
            }
            "bfe" => {
                need(4)?;
                let ty = int_ty(m.one_type()?)?;
                let d = self.reg(&ops[0])?;
                let (a, b, c) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?, self.src(&ops[3], K::Bits)?);
                Ok(Op::Bfe { ty, d, a, b, c })
            }
            "bfi" => {
                need(5)?;
                let t = m.one_type()?;
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], K::Bits)?;
                let b = self.src(&ops[2], K::Bits)?;
                let c = self.src(&ops[3], K::Bits)?;
                let e = self.src(&ops[4], K::Bits)?;
                Ok(Op::Bfi { bits: bits_of(t), d, a, b, c, e })
            }
            "prmt" => {
                need(4)?;
                m.one_type()?;
                let mode = match m.any(&["f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]) {
                    None => 0,
                    Some("f4e") => 1,
                    Some("b4e") => 2,
                    Some("rc8") => 3,
                    Some("ecl") => 4,
                    Some("ecr") => 5,
                    _ => 6,
                };
                let d = self.reg(&ops[0])?;
                let (a, b, c) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?, self.src(&ops[3], K::Bits)?);
                Ok(Op::Prmt { mode, d, a, b, c })
            }
            "lop3" => {
                need(5)?;
                m.one_type()?;
                let d = self.reg(&ops[0])?;
                let (a, b, c) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?, self.src(&ops[3], K::Bits)?);
                let lut = match &ops[4] {
                    Operand::Imm(Immediate::Int(v)) => *v as u8,
                    _ => return Err("lop3 needs an immediate lookup table".into()),
                };
                Ok(Op::Lop3 { d, a, b, c, lut })
            }
            "shf" => {
                need(4)?;
                m.one_type()?;
                let left = match m.any(&["l", "r"]) {
                    Some("l") => true,
                    Some(_) => false,
                    None => return Err(String::new()),
                };
                let clamp = match m.any(&["wrap", "clamp"]) {
                    Some("clamp") => true,
                    Some(_) => false,
                    None => return Err(String::new()),
                };
                let d = self.reg(&ops[0])?;
                let (a, b, c) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?, self.src(&ops[3], K::Bits)?);
                Ok(Op::Shf { left, clamp, d, a, b, c })
            }
            "bmsk" | "szext" => {
                need(3)?;
                let t = m.one_type()?;
                let clamp = match m.any(&["wrap", "clamp"]) {
                    Some("clamp") => true,
                    Some(_) => false,
                    None => return Err(String::new()),
                };
                let d = self.reg(&ops[0])?;
                let (a, b) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?);
                if i.opcode == "bmsk" {
                    return Ok(Op::Bmsk { clamp, d, a, b });
                }
                Ok(Op::Szext { clamp, signed: int_ty(t)?.signed, d, a, b })
            }
            "sad" => {
                need(4)?;
                let ty = int_ty(m.one_type()?)?;
                let d = self.reg(&ops[0])?;
                let (a, b, c) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?, self.src(&ops[3], K::Bits)?);
                Ok(Op::Sad { ty, d, a, b, c })
            }
            "dp4a" | "dp2a" => {
                need(4)?;
                let ts = m.types();
                if ts.len() != 2 {
                    return Err(String::new());
                }
                let kind = if i.opcode == "dp4a" {
                    4
                } else if m.take("hi") {
                    3
                } else {
                    m.take("lo");
                    2
                };
                let d = self.reg(&ops[0])?;
                let (a, b, c) = (self.src(&ops[1], K::Bits)?, self.src(&ops[2], K::Bits)?, self.src(&ops[3], K::Bits)?);
                Ok(Op::Dp { kind, a_signed: ts[0].is_signed(), b_signed: ts[1].is_signed(), d, a, b, c })
            }
            "selp" => {
                need(4)?;
                let t = m.one_type()?;
                let d = self.reg(&ops[0])?;
                let k = k_of(t);
                let (a, b, p) = (self.src(&ops[1], k)?, self.src(&ops[2], k)?, self.src(&ops[3], K::Bits)?);
                Ok(Op::Selp { bits: bits_of(t), d, a, b, p })
            }
            "slct" => {
                need(4)?;
                let ts = m.types();
                if ts.len() != 2 {
                    return Err(String::new());
                }
                let ftz = m.take("ftz");
                let float = ts[1] == ScalarType::F32;
                let d = self.reg(&ops[0])?;
                let k = k_of(ts[0]);
                let (a, b) = (self.src(&ops[1], k)?, self.src(&ops[2], k)?);
                let c = self.src(&ops[3], k_of(ts[1]))?;
                Ok(Op::Slct { bits: bits_of(ts[0]), float, ftz, d, a, b, c })
            }
            "setp" | "set" => self.setp(i, m),
            "testp" => {
                need(2)?;
                let t = m.one_type()?;
                let op = match m.any(&["finite", "infinite", "number", "notanumber", "normal", "subnormal"]) {
                    Some("finite") => Testp::Finite,
                    Some("infinite") => Testp::Infinite,
                    Some("number") => Testp::Number,
                    Some("notanumber") => Testp::NotANumber,
                    Some("normal") => Testp::Normal,
                    Some(_) => Testp::Subnormal,
                    None => return Err(String::new()),
                };
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], k_of(t))?;
                Ok(Op::Testp { op, f64: t == ScalarType::F64, d, a })
            }
            "copysign" => {
                need(3)?;
                let t = m.one_type()?;
                let d = self.reg(&ops[0])?;
                let (a, b) = (self.src(&ops[1], k_of(t))?, self.src(&ops[2], k_of(t))?);
                Ok(Op::Copysign { f64: t == ScalarType::F64, d, a, b })
            }
            "rcp" | "sqrt" | "rsqrt" | "sin" | "cos" | "lg2" | "ex2" | "tanh" => {
                need(2)?;
                let t = m.one_type()?;
                let ty = fty(t)?;
                let approx = m.take("approx");
                let full = m.take("full");
                let rnd = m.rnd();
                let ftz = m.take("ftz");
                let op = match i.opcode.as_str() {
                    "rcp" if approx && t == ScalarType::F64 => FUn::RcpApproxF64,
                    "rcp" if approx => FUn::RcpApprox,
                    "rcp" if rnd.is_some() => FUn::Rcp,
                    "sqrt" if approx => FUn::SqrtApprox,
                    "sqrt" if rnd.is_some() => FUn::Sqrt,
                    "rsqrt" if approx => FUn::Rsqrt,
                    "sin" if approx => FUn::Sin,
                    "cos" if approx => FUn::Cos,
                    "lg2" if approx => FUn::Lg2,
                    "ex2" if approx => FUn::Ex2,
                    "tanh" if approx => FUn::Tanh,
                    _ => return Err(String::new()),
                };
                let _ = full;
                if !matches!(ty, FTy::F32 | FTy::F64) {
                    return Err(String::new());
                }
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], k_of(t))?;
                Ok(Op::FUn { op, ty, m: FMode { rnd: rnd.unwrap_or(Rnd::Rn), ftz, sat: false }, d, a })
            }
            "cvt" => self.cvt(i, m),
            "cvta" => {
                need(2)?;
                let to = m.take("to");
                let space = m.space().ok_or_else(String::new)?;
                let t = m.one_type()?;
                let sp = mem_space(space)?;
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], K::Bits)?;
                Ok(Op::Cvta { to_generic: !to, space: sp, bits: bits_of(t), d, a })
            }
            "isspacep" => {
                need(2)?;
                let space = mem_space(m.space().ok_or_else(String::new)?)?;
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], K::Bits)?;
                Ok(Op::Isspacep { space, d, a })
            }
            "ld" | "ldu" | "st" => self.ld_st(i, m),
            "atom" | "red" => self.atom(i, m),
            "prefetch" | "prefetchu" | "membar" | "fence" | "nanosleep" | "pmevent" | "griddepcontrol" => {
                m.take_all();
                Ok(Op::Nop)
            }
            "createpolicy" => {
                // Cache policies only steer caching: a zero policy is as good as any here.
                need(1)?;
                m.take_all();
                Ok(Op::Mov { d: self.reg(&ops[0])?, a: Src::Imm(0), bits: 64 })
            }
            "bra" => {
                need(1)?;
                m.take("uni");
                let name = match &ops[0] {
                    Operand::Symbol(s) => s.clone(),
                    _ => return Err("branch target must be a label".into()),
                };
                self.fixups.push((self.code.len(), vec![name], self.cur_line, i.to_string().replace(" \t", " ")));
                Ok(Op::Bra { target: 0 })
            }
            "brx" => {
                need(2)?;
                m.take("idx");
                m.take("uni");
                let a = self.src(&ops[0], K::Bits)?;
                let table = match &ops[1] {
                    Operand::Symbol(s) => self.branch_tables.get(s).cloned().ok_or("unknown branch table")?,
                    _ => return Err("brx needs a .branchtargets label".into()),
                };
                self.fixups.push((self.code.len(), table, self.cur_line, i.to_string().replace(" \t", " ")));
                Ok(Op::Brx { a, targets: Vec::new() })
            }
            "call" => self.call(i, m),
            "cp" if m.take("async") => {
                // cp.async copies synchronously here, so commit and wait have nothing left to do.
                if m.take("commit_group") || m.take("wait_group") || m.take("wait_all") {
                    return Ok(Op::Nop);
                }
                let level = m.any(&["ca", "cg"]).is_some();
                let spaces: Vec<StateSpace> = i
                    .modifiers
                    .iter()
                    .filter_map(|x| if let Modifier::Space(s) = x { Some(*s) } else { None })
                    .collect();
                m.take_memory_hints();
                for _ in 0..spaces.len() {
                    m.space_any();
                }
                if !level || spaces.len() != 2 || ops.len() < 3 {
                    return Err(String::new());
                }
                let (dst, _) = self.addr(&ops[0], Space::Shared)?;
                let (src, _) = self.addr(&ops[1], Space::Global)?;
                let size = match &ops[2] {
                    Operand::Imm(Immediate::Int(v)) if matches!(*v, 4 | 8 | 16) => *v as u8,
                    _ => return Err("cp.async size must be 4, 8 or 16".into()),
                };
                let src_size = match ops.get(3) {
                    Some(x @ (Operand::Reg(_) | Operand::Imm(_))) => Some(self.src(x, K::Bits)?),
                    _ => None,
                };
                Ok(Op::CpAsync { dst, src, size, src_size })
            }
            "ret" => {
                m.take("uni");
                Ok(Op::Ret)
            }
            "exit" => Ok(Op::Exit),
            "trap" | "brkpt" => Ok(Op::Trap),
            "bar" | "barrier" => self.bar(i, m),
            "shfl" => {
                let sync = m.take("sync");
                let mode = match m.any(&["up", "down", "bfly", "idx"]) {
                    Some("up") => ShflMode::Up,
                    Some("down") => ShflMode::Down,
                    Some("bfly") => ShflMode::Bfly,
                    Some(_) => ShflMode::Idx,
                    None => return Err(String::new()),
                };
                m.one_type()?;
                need(if sync { 5 } else { 4 })?;
                let (d, p) = match &ops[0] {
                    Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
                    other => (self.dst(other)?, None),
                };
                let a = self.src(&ops[1], K::Bits)?;
                let b = self.src(&ops[2], K::Bits)?;
                let c = self.src(&ops[3], K::Bits)?;
                let mask = if sync { Some(self.src(&ops[4], K::Bits)?) } else { None };
                Ok(Op::Shfl { mode, d, p, a, b, c, mask })
            }
            "vote" => {
                let sync = m.take("sync");
                let mode = match m.any(&["all", "any", "uni", "ballot"]) {
                    Some("all") => VoteMode::All,
                    Some("any") => VoteMode::Any,
                    Some("uni") => VoteMode::Uni,
                    Some(_) => VoteMode::Ballot,
                    None => return Err(String::new()),
                };
                m.one_type()?;
                need(if sync { 3 } else { 2 })?;
                let d = self.reg(&ops[0])?;
                let (a, negate) = match &ops[1] {
                    Operand::Not(x) => (self.src(x, K::Bits)?, true),
                    x => (self.src(x, K::Bits)?, false),
                };
                let mask = if sync { Some(self.src(&ops[2], K::Bits)?) } else { None };
                Ok(Op::Vote { mode, d, a, negate, mask })
            }
            "match" => {
                need(3)?;
                m.take("sync");
                let all = match m.any(&["any", "all"]) {
                    Some("all") => true,
                    Some(_) => false,
                    None => return Err(String::new()),
                };
                let t = m.one_type()?;
                let (d, p) = match &ops[0] {
                    Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
                    other => (self.dst(other)?, None),
                };
                let a = self.src(&ops[1], K::Bits)?;
                let mask = self.src(&ops[2], K::Bits)?;
                Ok(Op::Match { all, bits: bits_of(t), d, p, a, mask })
            }
            "redux" => {
                need(3)?;
                m.take("sync");
                let op = match m.any(&["add", "min", "max", "and", "or", "xor"]) {
                    Some("add") => IBin::Add,
                    Some("min") => IBin::Min,
                    Some("max") => IBin::Max,
                    Some("and") => IBin::And,
                    Some("or") => IBin::Or,
                    Some(_) => IBin::Xor,
                    None => return Err(String::new()),
                };
                let ty = int_ty(m.one_type()?)?;
                let d = self.reg(&ops[0])?;
                let a = self.src(&ops[1], K::Bits)?;
                let mask = self.src(&ops[2], K::Bits)?;
                Ok(Op::Redux { op, ty, d, a, mask })
            }
            "tex" | "tld4" => self.tex(i, m),
            "suld" | "sust" => self.surf(i, m),
            "txq" | "suq" => self.query(i, m),
            "activemask" => {
                need(1)?;
                m.one_type()?;
                Ok(Op::Activemask { d: self.reg(&ops[0])? })
            }
            "elect" => {
                need(2)?;
                m.take("sync");
                let (d, p) = match &ops[0] {
                    Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
                    other => (self.dst(other)?, None),
                };
                let mask = self.src(&ops[1], K::Bits)?;
                Ok(Op::Elect { d, p, mask })
            }
            _ => Err(String::new()),
        }
    }

    /// The texture or surface operand: a register holding an object handle (unified mode).
    fn handle(&mut self, op: &Operand) -> LResult<Src> {
        let symbol = match op {
            Operand::Reg(_) | Operand::RegComponent(..) => return Ok(Src::Reg(self.reg(op)?)),
            Operand::Imm(_) => return self.src(op, K::Bits),
            Operand::Address(crate::ast::Address { base: crate::ast::AddressBase::Reg(r), offset: 0 }) => {
                return Ok(Src::Reg(self.reg(&Operand::Reg(r.clone()))?));
            }
            Operand::Symbol(name)
            | Operand::Address(crate::ast::Address { base: crate::ast::AddressBase::Symbol(name), .. }) => name,
            other => return Err(format!("unsupported texture or surface operand `{other}`")),
        };
        match (self.lookup(symbol), self.syms.get(symbol)) {
            (Some(Binding::Reg(r)), _) => Ok(Src::Reg(r)),
            (None, Some(ModSym::OpaqueRef(t))) => Err(opaque_ref(symbol, *t)),
            (Some(Binding::KParam(_)), _) => Err(format!(
                "`{symbol}` is a texture reference parameter: texture references are not supported (CUDA 12 removed \
                 them); use texture objects"
            )),
            _ => Err(format!("`{symbol}` is not a texture or surface object")),
        }
    }

    /// A vector operand of `n` scalars (or a lone scalar when `n` is 1).
    fn src_vec(&mut self, op: &Operand, k: K) -> LResult<Vec<Src>> {
        match op {
            Operand::Vector(items) => items.iter().map(|x| self.src(x, k)).collect(),
            x => Ok(vec![self.src(x, k)?]),
        }
    }

    fn tex(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        let gather = if i.opcode == "tld4" {
            Some(match m.any(&["r", "g", "b", "a"]) {
                Some("r") => 0,
                Some("g") => 1,
                Some("b") => 2,
                Some(_) => 3,
                None => return Err(String::new()),
            })
        } else {
            None
        };
        let lod_kind = m.any(&["base", "level", "grad"]);
        let geom = geom_of(m, gather.is_some())?;
        if m.vector() != Some(4) {
            return Err("only the four-component forms are supported".into());
        }
        let ts = m.types();
        let [dty, cty] = ts[..] else { return Err(String::new()) };
        if !matches!(dty, ScalarType::F32 | ScalarType::S32 | ScalarType::U32)
            || !matches!(cty, ScalarType::F32 | ScalarType::S32)
        {
            return Err(String::new());
        }
        let int_coords = cty == ScalarType::S32;
        if int_coords && (gather.is_some() || matches!(geom, Geom::Cube | Geom::ACube)) {
            return Err(String::new());
        }
        let (dst, pred) = match ops.first() {
            Some(Operand::Pair(d, p)) => (&**d, self.dst(p)?),
            Some(d) => (d, None),
            None => return Err("missing operands".into()),
        };
        let ds = match dst {
            Operand::Vector(items) if items.len() == 4 => {
                let v = items.iter().map(|x| self.dst(x)).collect::<LResult<Vec<_>>>()?;
                [v[0], v[1], v[2], v[3]]
            }
            _ => return Err("expected four destinations".into()),
        };
        let (handle, coords) = match ops.get(1) {
            Some(Operand::BracketList(items)) if items.len() == 2 => {
                let handle = self.handle(&items[0])?;
                // Array indices are integers even among float coordinates.
                let k = if int_coords { K::Bits } else { K::F32 };
                let mut coords = Vec::new();
                let list: &[Operand] = match &items[1] {
                    Operand::Vector(v) => v,
                    x => std::slice::from_ref(x),
                };
                for (n, x) in list.iter().enumerate() {
                    let array_index = n == 0 && matches!(geom, Geom::A1d | Geom::A2d | Geom::ACube);
                    coords.push(self.src(x, if array_index { K::Bits } else { k })?);
                }
                (handle, coords)
            }
            Some(Operand::BracketList(items)) if items.len() == 3 => {
                return Err("independent texturing mode (a separate sampler) is not supported".into());
            }
            _ => return Err("expected [texture, coordinates]".into()),
        };
        let need = match geom {
            Geom::D1 => 1,
            Geom::D2 | Geom::A1d => 2,
            Geom::ACube => 4,
            _ => 3,
        };
        if coords.len() < need {
            return Err(format!("expected {need} coordinates"));
        }
        let rest = &ops[2..];
        let lod = match (lod_kind, rest) {
            (None, []) => LodSrc::Implicit,
            (Some("base"), []) => LodSrc::Base,
            (Some("level"), [l]) => LodSrc::Level(self.src(l, K::F32)?),
            (Some("grad"), [dx, dy]) => LodSrc::Grad(self.src_vec(dx, K::F32)?, self.src_vec(dy, K::F32)?),
            (None, _) => return Err("coordinate offsets and depth comparison are not supported".into()),
            _ => return Err("unexpected level-of-detail operands".into()),
        };
        if gather.is_some() && !matches!(lod, LodSrc::Implicit) {
            return Err(String::new());
        }
        Ok(Op::Tex(Box::new(TexInst { geom, gather, ds, pred, handle, coords, int_coords, lod })))
    }

    fn surf(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        let store = i.opcode == "sust";
        let formatted = match m.any(&["b", "p"]) {
            Some("b") => false,
            Some(_) if store => true,
            _ => return Err(String::new()),
        };
        let geom = geom_of(m, false)?;
        if matches!(geom, Geom::Cube | Geom::ACube) {
            return Err(String::new());
        }
        m.take_memory_hints();
        let oob = match m.any(&["trap", "clamp", "zero"]) {
            Some("clamp") => OutOfRange::Clamp,
            Some("zero") => OutOfRange::Zero,
            _ => OutOfRange::Trap,
        };
        let n = m.vector().unwrap_or(1) as usize;
        let t = m.one_type()?;
        let bits = match t {
            ScalarType::B8 | ScalarType::B16 | ScalarType::B32 | ScalarType::B64 => t.bits() as u8,
            _ => return Err(String::new()),
        };
        if !matches!(n, 1 | 2 | 4) || (formatted && bits != 32) {
            return Err(String::new());
        }
        if ops.len() != 2 {
            return Err("expected two operands".into());
        }
        let (target, data) = if store { (&ops[0], &ops[1]) } else { (&ops[1], &ops[0]) };
        let Operand::BracketList(items) = target else { return Err("expected [surface, coordinates]".into()) };
        let [handle, coords] = &items[..] else { return Err("expected [surface, coordinates]".into()) };
        let handle = self.handle(handle)?;
        let coords = self.src_vec(coords, K::Bits)?;
        let need = match geom {
            Geom::D1 => 1,
            Geom::D2 | Geom::A1d => 2,
            _ => 3,
        };
        if coords.len() < need {
            return Err(format!("expected {need} coordinates"));
        }
        let (mut ds, mut srcs) = (Vec::new(), Vec::new());
        if store {
            srcs = self.src_vec(data, K::Bits)?;
        } else {
            ds = match data {
                Operand::Vector(items) => items.iter().map(|x| self.dst(x)).collect::<LResult<Vec<_>>>()?,
                x => vec![self.dst(x)?],
            };
        }
        if ds.len().max(srcs.len()) != n {
            return Err("vector width mismatch".into());
        }
        Ok(Op::Surf(Box::new(SurfInst { geom, store, formatted, bits, ds, srcs, handle, coords, oob })))
    }

    fn query(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        let surface = i.opcode == "suq";
        let level = !surface && m.take("level");
        const QUERIES: &[&str] = &[
            "width",
            "height",
            "depth",
            "channel_data_type",
            "channel_order",
            "normalized_coords",
            "array_size",
            "num_mipmap_levels",
            "num_samples",
            "force_unnormalized_coords",
            "filter_mode",
            "addr_mode_0",
            "addr_mode_1",
            "addr_mode_2",
            "memory_layout",
        ];
        let query = match m.any(QUERIES) {
            Some("width") => Query::Width,
            Some("height") => Query::Height,
            Some("depth") => Query::Depth,
            Some("channel_data_type") => Query::ChannelDataType,
            Some("channel_order") => Query::ChannelOrder,
            Some("array_size") => Query::ArraySize,
            Some("memory_layout") if surface => Query::MemoryLayout,
            Some("normalized_coords") if !surface => Query::NormalizedCoords,
            Some("num_mipmap_levels") if !surface => Query::NumMipmapLevels,
            Some("num_samples") if !surface => Query::NumSamples,
            Some("force_unnormalized_coords") if !surface => Query::ForceUnnormalizedCoords,
            Some("filter_mode") if !surface => Query::FilterMode,
            Some("addr_mode_0") if !surface => Query::AddrMode(0),
            Some("addr_mode_1") if !surface => Query::AddrMode(1),
            Some("addr_mode_2") if !surface => Query::AddrMode(2),
            _ => return Err(String::new()),
        };
        if level && !matches!(query, Query::Width | Query::Height | Query::Depth) {
            return Err(String::new());
        }
        if m.one_type()? != ScalarType::B32 || ops.len() != 2 + level as usize {
            return Err(String::new());
        }
        let d = self.reg(&ops[0])?;
        let handle = self.handle(&ops[1])?;
        let level = if level { Some(self.src(&ops[2], K::Bits)?) } else { None };
        Ok(Op::Query { surface, query, d, handle, level })
    }

    fn fmode(&self, m: &mut Mods, t: ScalarType, need_rnd: bool) -> LResult<FMode> {
        let rnd = m.rnd();
        if need_rnd && rnd.is_none() && t == ScalarType::F64 {
            // fma.f64 without rounding is not valid PTX but is unambiguous.
        }
        let ftz = m.take("ftz");
        let sat = m.take("sat");
        m.take("noftz");
        Ok(FMode { rnd: rnd.unwrap_or(Rnd::Rn), ftz, sat })
    }

    fn float_bin(&mut self, i: &Instruction, m: &mut Mods, t: ScalarType) -> LResult<Op> {
        let ops = &i.operands;
        let ty = fty(t)?;
        let approx = m.take("approx");
        let full = m.take("full");
        let nan = m.take("NaN");
        let mode = self.fmode(m, t, false)?;
        let op = match i.opcode.as_str() {
            "add" => FBin::Add,
            "sub" => FBin::Sub,
            "mul" => FBin::Mul,
            "div" if approx => FBin::DivApprox,
            "div" if full => FBin::DivFull,
            "div" => FBin::Div,
            "min" if nan => FBin::MinNan,
            "max" if nan => FBin::MaxNan,
            "min" => FBin::Min,
            "max" => FBin::Max,
            _ => return Err(String::new()),
        };
        if matches!(ty, FTy::F16 | FTy::BF16 | FTy::F16x2 | FTy::BF16x2)
            && matches!(op, FBin::Div | FBin::DivApprox | FBin::DivFull)
        {
            return Err(String::new());
        }
        let k = k_of(t);
        let d = self.reg(&ops[0])?;
        let (a, b) = (self.src(&ops[1], k)?, self.src(&ops[2], k)?);
        Ok(Op::FBin { op, ty, m: mode, d, a, b })
    }

    fn setp(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        if ops.len() < 3 {
            return Err("expected at least 3 operands".into());
        }
        const CMPS: &[&str] = &[
            "eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu", "gtu", "geu",
            "num", "nan",
        ];
        let cmp = match m.any(CMPS) {
            Some(c) => match c {
                "eq" => Cmp::Eq,
                "ne" => Cmp::Ne,
                "lt" => Cmp::Lt,
                "le" => Cmp::Le,
                "gt" => Cmp::Gt,
                "ge" => Cmp::Ge,
                "lo" => Cmp::Lo,
                "ls" => Cmp::Ls,
                "hi" => Cmp::Hi,
                "hs" => Cmp::Hs,
                "equ" => Cmp::Equ,
                "neu" => Cmp::Neu,
                "ltu" => Cmp::Ltu,
                "leu" => Cmp::Leu,
                "gtu" => Cmp::Gtu,
                "geu" => Cmp::Geu,
                "num" => Cmp::Num,
                _ => Cmp::Nan,
            },
            None => return Err(String::new()),
        };
        let bop = match m.any(&["and", "or", "xor"]) {
            Some("and") => Some(BoolOp::And),
            Some("or") => Some(BoolOp::Or),
            Some(_) => Some(BoolOp::Xor),
            None => None,
        };
        let ftz = m.take("ftz");
        let ts = m.types();
        let (dty, sty) = match (i.opcode.as_str(), ts.as_slice()) {
            ("setp", [s]) => (None, *s),
            ("set", [d, s]) => (Some(*d), *s),
            _ => return Err(String::new()),
        };
        if matches!(sty, ScalarType::F16x2 | ScalarType::BF16x2) {
            // Packed comparisons produce a predicate per half; not implemented.
            return Err(String::new());
        }
        let ty = if is_float_ty(sty) { CmpTy::Float(fty(sty)?, ftz) } else { CmpTy::Int(int_ty(sty)?) };
        let is_float = matches!(ty, CmpTy::Float(..));
        if !is_float
            && matches!(cmp, Cmp::Equ | Cmp::Neu | Cmp::Ltu | Cmp::Leu | Cmp::Gtu | Cmp::Geu | Cmp::Num | Cmp::Nan)
        {
            return Err(String::new());
        }
        let k = k_of(sty);
        let a = self.src(&ops[1], k)?;
        let b = self.src(&ops[2], k)?;
        let comb = match (bop, ops.get(3)) {
            (Some(op), Some(c)) => {
                let (pred, negate) = match c {
                    Operand::Not(x) => (self.src(x, K::Bits)?, true),
                    x => (self.src(x, K::Bits)?, false),
                };
                Some(Combine { op, pred, negate })
            }
            (None, None) => None,
            _ => return Err("combining predicate mismatch".into()),
        };
        match dty {
            None => {
                let (d, d2) = match &ops[0] {
                    Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
                    x => (self.dst(x)?, None),
                };
                Ok(Op::Setp { cmp, ty, d, d2, a, b, comb })
            }
            Some(dt) => {
                let d = self.reg(&ops[0])?;
                Ok(Op::Set { cmp, ty, dfloat: dt == ScalarType::F32, d, a, b, comb })
            }
        }
    }

    fn cvt(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        if ops.len() < 2 {
            return Err("expected 2 operands".into());
        }
        let ts = m.types();
        if ts.len() != 2 {
            return Err(String::new());
        }
        let rnd = if let Some(r) = m.rnd() {
            CvtRnd::Float(r)
        } else if let Some(r) = m.any(&["rni", "rzi", "rmi", "rpi"]) {
            CvtRnd::Int(match r {
                "rni" => Rnd::Rn,
                "rzi" => Rnd::Rz,
                "rmi" => Rnd::Rm,
                _ => Rnd::Rp,
            })
        } else if m.take("rna") {
            CvtRnd::Rna
        } else {
            CvtRnd::None
        };
        let sat = m.take("sat");
        let ftz = m.take("ftz");
        let relu = m.take("relu");
        let d = self.reg(&ops[0])?;
        if matches!(ts[0], ScalarType::F16x2 | ScalarType::BF16x2) {
            if ops.len() < 3 || ts[1] != ScalarType::F32 {
                return Err(String::new());
            }
            let r = match rnd {
                CvtRnd::Float(r) => r,
                _ => return Err(String::new()),
            };
            let a = self.src(&ops[1], K::F32)?;
            let b = self.src(&ops[2], K::F32)?;
            let to = if ts[0] == ScalarType::F16x2 { CvtTy::F16 } else { CvtTy::BF16 };
            return Ok(Op::CvtPack { to, rnd: r, relu, sat, d, a, b });
        }
        let to = cvt_ty(ts[0])?;
        let from = cvt_ty(ts[1])?;
        let a = self.src(&ops[1], k_of(ts[1]))?;
        Ok(Op::Cvt { to, from, rnd, sat, ftz, relu, d, a })
    }

    fn ld_st(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        if ops.len() < 2 {
            return Err("expected 2 operands".into());
        }
        m.take_memory_hints();
        let space = match m.space() {
            None => Space::Generic,
            Some(s) => mem_space(s)?,
        };
        let vec = m.vector().unwrap_or(1) as usize;
        let t = m.one_type()?;
        if t == ScalarType::B128 || t.bits() < 8 {
            return Err(String::new());
        }
        let bits = t.bits() as u8;
        let signed = t.is_signed();
        if i.opcode == "st" {
            let (addr, sp) = self.addr(&ops[0], space)?;
            let srcs = match &ops[1] {
                Operand::Vector(items) => items.iter().map(|x| self.src(x, k_of(t))).collect::<LResult<Vec<_>>>()?,
                x => vec![self.src(x, k_of(t))?],
            };
            if srcs.len() != vec {
                return Err("vector width mismatch".into());
            }
            Ok(Op::St { space: sp, bits, srcs, addr })
        } else {
            let (addr, sp) = self.addr(&ops[1], space)?;
            let ds = match &ops[0] {
                Operand::Vector(items) => items.iter().map(|x| self.dst(x)).collect::<LResult<Vec<_>>>()?,
                x => vec![self.dst(x)?],
            };
            if ds.len() != vec {
                return Err("vector width mismatch".into());
            }
            Ok(Op::Ld { space: sp, bits, signed, ds, addr })
        }
    }

    fn atom(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        m.take_memory_hints();
        let space = match m.space() {
            None => Space::Generic,
            Some(s) => mem_space(s)?,
        };
        let op = match m.any(&["add", "min", "max", "inc", "dec", "and", "or", "xor", "exch", "cas"]) {
            Some("add") => AtomOp::Add,
            Some("min") => AtomOp::Min,
            Some("max") => AtomOp::Max,
            Some("inc") => AtomOp::Inc,
            Some("dec") => AtomOp::Dec,
            Some("and") => AtomOp::And,
            Some("or") => AtomOp::Or,
            Some("xor") => AtomOp::Xor,
            Some("exch") => AtomOp::Exch,
            Some("cas") => AtomOp::Cas,
            _ => return Err(String::new()),
        };
        m.take("noftz");
        let t = m.one_type()?;
        if m.vector().is_some() {
            return Err(String::new());
        }
        let ty = match t {
            ScalarType::F32 => AtomTy::F32,
            ScalarType::F64 => AtomTy::F64,
            ScalarType::F16x2 => AtomTy::F16x2,
            ScalarType::BF16x2 => AtomTy::BF16x2,
            ScalarType::F16 => AtomTy::F16,
            ScalarType::BF16 => AtomTy::BF16,
            ScalarType::B128 => return Err(String::new()),
            _ => AtomTy::Int(int_ty(t)?),
        };
        if let AtomTy::Int(it) = ty {
            if it.bits < 32 && !(op == AtomOp::Cas && it.bits == 16) {
                return Err(String::new());
            }
        } else if !matches!(op, AtomOp::Add | AtomOp::Exch | AtomOp::Min | AtomOp::Max) {
            return Err(String::new());
        }
        let k = k_of(t);
        let red = i.opcode == "red";
        let (d, rest) =
            if red { (None, &ops[..]) } else { (self.dst(ops.first().ok_or("missing operands")?)?, &ops[1..]) };
        if rest.len() < 2 {
            return Err("expected an address and a value".into());
        }
        let (addr, sp) = self.addr(&rest[0], space)?;
        let b = self.src(&rest[1], k)?;
        let c = if op == AtomOp::Cas { self.src(rest.get(2).ok_or("cas needs two values")?, k)? } else { Src::Imm(0) };
        Ok(Op::Atom { space: sp, op, ty, d, addr, b, c })
    }

    fn call(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        m.take("uni");
        let ops = &i.operands;
        let mut idx = 0;
        let mut rets: &[Operand] = &[];
        if let (Some(Operand::List(r)), true) = (ops.first(), ops.len() > 1) {
            rets = r;
            idx = 1;
        }
        let target = ops.get(idx).ok_or("call without a target")?;
        let args: &[Operand] = match ops.get(idx + 1) {
            Some(Operand::List(a)) => a,
            _ => &[],
        };
        let arg_slots = args.iter().map(|a| self.slot(a)).collect::<LResult<Vec<_>>>()?;
        let ret_slots = rets.iter().map(|a| self.slot(a)).collect::<LResult<Vec<_>>>()?;
        match target {
            Operand::Symbol(name) if self.lookup(name).is_none() => {
                if let Some(&fi) = self.func_index.get(name) {
                    self.callees.push(fi);
                    return Ok(Op::Call(Box::new(Call {
                        func: Some(fi),
                        target: Src::Imm(0),
                        args: arg_slots,
                        rets: ret_slots,
                    })));
                }
                let which = match name.as_str() {
                    "vprintf" => Builtin::Vprintf,
                    "__assertfail" | "__assert_fail" => Builtin::AssertFail,
                    _ => return Err(format!("call to undefined function `{name}`")),
                };
                Ok(Op::Builtin { which, args: arg_slots, ret: ret_slots.first().copied() })
            }
            other => {
                let t = self.src(other, K::Bits)?;
                self.indirect = true;
                Ok(Op::Call(Box::new(Call { func: None, target: t, args: arg_slots, rets: ret_slots })))
            }
        }
    }

    fn slot(&mut self, op: &Operand) -> LResult<Slot> {
        if let Operand::Symbol(name) = op
            && let Some(Binding::Frame(off, size)) = self.lookup(name)
        {
            return Ok(Slot::Frame(off, size));
        }
        Ok(Slot::Value(self.src(op, K::Bits)?))
    }

    fn bar(&mut self, i: &Instruction, m: &mut Mods) -> LResult<Op> {
        let ops = &i.operands;
        m.take("cta");
        let aligned = m.take("aligned");
        if m.take("cluster") {
            // Launches here never form clusters larger than one block, so the cluster barrier is the block's: arrive
            // does nothing and wait synchronizes the block (on a barrier id of its own).
            m.take("relaxed");
            m.take("acquire");
            m.take("release");
            if m.take("arrive") {
                return Ok(Op::Nop);
            }
            if m.take("wait") {
                return Ok(Op::Bar {
                    kind: BarKind::Sync,
                    id: Src::Imm(CLUSTER_BARRIER),
                    count: None,
                    d: None,
                    pred: None,
                    aligned,
                });
            }
            return Err(String::new());
        }
        if m.take("warp") {
            m.take("sync");
            let mask = self.src(ops.first().ok_or("missing mask")?, K::Bits)?;
            return Ok(Op::WarpSync { mask });
        }
        let kind = if m.take("sync") {
            BarKind::Sync
        } else if m.take("arrive") {
            BarKind::Arrive
        } else if m.take("red") {
            match m.any(&["popc", "and", "or"]) {
                Some("popc") => BarKind::RedPopc,
                Some("and") => BarKind::RedAnd,
                Some(_) => BarKind::RedOr,
                None => return Err(String::new()),
            }
        } else if i.opcode == "bar" && ops.len() <= 2 && !i.modifiers.iter().any(|x| matches!(x, Modifier::Other(_))) {
            BarKind::Sync
        } else {
            return Err(String::new());
        };
        let red = matches!(kind, BarKind::RedPopc | BarKind::RedAnd | BarKind::RedOr);
        if red {
            m.types();
            // bar.red.op d, a{, b}, {!}c
            if ops.len() < 3 {
                return Err("expected at least 3 operands".into());
            }
            let d = Some(self.reg(&ops[0])?);
            let id = self.src(&ops[1], K::Bits)?;
            let count = if ops.len() == 4 { Some(self.src(&ops[2], K::Bits)?) } else { None };
            let p = &ops[ops.len() - 1];
            let pred = match p {
                Operand::Not(x) => (self.src(x, K::Bits)?, true),
                x => (self.src(x, K::Bits)?, false),
            };
            return Ok(Op::Bar { kind, id, count, d, pred: Some(pred), aligned });
        }
        let id = match ops.first() {
            Some(x) => self.src(x, K::Bits)?,
            None => Src::Imm(0),
        };
        let count = match ops.get(1) {
            Some(x) => Some(self.src(x, K::Bits)?),
            None => None,
        };
        Ok(Op::Bar { kind, id, count, d: None, pred: None, aligned })
    }
}

/// Modifier bookkeeping: every modifier must be consumed by the decoder, or the instruction is unsupported.
struct Mods<'i> {
    list: &'i [Modifier],
    used: Vec<bool>,
}

impl<'i> Mods<'i> {
    fn new(i: &'i Instruction) -> Self {
        Mods { list: &i.modifiers, used: vec![false; i.modifiers.len()] }
    }

    fn take(&mut self, w: &str) -> bool {
        for (k, m) in self.list.iter().enumerate() {
            if !self.used[k] && matches!(m, Modifier::Other(x) if x == w) {
                self.used[k] = true;
                return true;
            }
        }
        false
    }

    fn any(&mut self, ws: &[&'static str]) -> Option<&'static str> {
        for (k, m) in self.list.iter().enumerate() {
            if let Modifier::Other(x) = m
                && !self.used[k]
                && let Some(w) = ws.iter().find(|w| **w == x)
            {
                self.used[k] = true;
                return Some(w);
            }
        }
        None
    }

    fn rnd(&mut self) -> Option<Rnd> {
        match self.any(&["rn", "rz", "rm", "rp"]) {
            Some("rn") => Some(Rnd::Rn),
            Some("rz") => Some(Rnd::Rz),
            Some("rm") => Some(Rnd::Rm),
            Some("rp") => Some(Rnd::Rp),
            _ => None,
        }
    }

    fn types(&mut self) -> Vec<ScalarType> {
        let mut out = Vec::new();
        for (k, m) in self.list.iter().enumerate() {
            if let Modifier::Type(t) = m {
                self.used[k] = true;
                out.push(*t);
            }
        }
        out
    }

    fn one_type(&mut self) -> LResult<ScalarType> {
        let ts = self.types();
        match ts.as_slice() {
            [t] => Ok(*t),
            _ => Err("expected exactly one type".into()),
        }
    }

    fn space(&mut self) -> Option<StateSpace> {
        for (k, m) in self.list.iter().enumerate() {
            if let Modifier::Space(s) = m {
                self.used[k] = true;
                return Some(*s);
            }
        }
        None
    }

    /// Consumes the next unused state-space modifier.
    fn space_any(&mut self) -> Option<StateSpace> {
        for (k, m) in self.list.iter().enumerate() {
            if let Modifier::Space(s) = m
                && !self.used[k]
            {
                self.used[k] = true;
                return Some(*s);
            }
        }
        None
    }

    fn vector(&mut self) -> Option<u8> {
        for (k, m) in self.list.iter().enumerate() {
            if let Modifier::Vector(v) = m {
                self.used[k] = true;
                return Some(*v);
            }
        }
        None
    }

    /// Cache, eviction, ordering and scope qualifiers: they cannot change what one thread reads or writes here.
    fn take_memory_hints(&mut self) {
        const HINTS: &[&str] = &[
            "volatile", "relaxed", "acquire", "release", "acq_rel", "weak", "mmio", "cta", "gpu", "sys", "cluster",
            "ca", "cg", "cs", "lu", "cv", "wb", "wt", "nc", "unified",
        ];
        for (k, m) in self.list.iter().enumerate() {
            if let Modifier::Other(x) = m
                && (HINTS.contains(&x.as_str()) || x.starts_with("L1::") || x.starts_with("L2::"))
            {
                self.used[k] = true;
            }
        }
    }

    fn take_all(&mut self) {
        self.used.iter_mut().for_each(|u| *u = true);
    }

    fn unused(&self) -> Option<String> {
        self.list.iter().zip(&self.used).find(|(_, u)| !**u).map(|(m, _)| m.to_string())
    }
}

fn special(s: SpecialReg, c: Option<u8>) -> Special {
    let c = c.unwrap_or(0);
    let comp = |f: fn(u8) -> Special| if c < 3 { f(c) } else { Special::Zero };
    match s {
        SpecialReg::Tid => comp(Special::Tid),
        SpecialReg::NTid => comp(Special::NTid),
        SpecialReg::CtaId | SpecialReg::ClusterId => comp(Special::CtaId),
        SpecialReg::NCtaId | SpecialReg::NClusterId => comp(Special::NCtaId),
        SpecialReg::LaneId => Special::LaneId,
        SpecialReg::WarpId => Special::WarpId,
        SpecialReg::NWarpId => Special::NWarpId,
        SpecialReg::SmId => Special::SmId,
        SpecialReg::NSmId => Special::NSmId,
        SpecialReg::GridId => Special::GridId,
        SpecialReg::LanemaskEq => Special::LanemaskEq,
        SpecialReg::LanemaskLe => Special::LanemaskLe,
        SpecialReg::LanemaskLt => Special::LanemaskLt,
        SpecialReg::LanemaskGe => Special::LanemaskGe,
        SpecialReg::LanemaskGt => Special::LanemaskGt,
        SpecialReg::Clock => Special::Clock,
        SpecialReg::ClockHi => Special::ClockHi,
        SpecialReg::Clock64 => Special::Clock64,
        SpecialReg::GlobalTimer => Special::GlobalTimer,
        SpecialReg::GlobalTimerLo => Special::GlobalTimerLo,
        SpecialReg::GlobalTimerHi => Special::GlobalTimerHi,
        SpecialReg::TotalSmemSize | SpecialReg::AggrSmemSize => Special::TotalSmem,
        SpecialReg::DynamicSmemSize => Special::DynamicSmem,
        SpecialReg::ClusterNCtaId => {
            if c < 3 {
                Special::One
            } else {
                Special::Zero
            }
        }
        SpecialReg::ClusterNCtaRank => Special::One,
        _ => Special::Zero,
    }
}

/// The refusal of a texture, sampler or surface reference.
fn opaque_ref(name: &str, t: ScalarType) -> String {
    let kind = match t {
        ScalarType::TexRef => "texture reference (.texref)",
        ScalarType::SamplerRef => "sampler reference (.samplerref)",
        _ => "surface reference (.surfref)",
    };
    format!(
        "`{name}` is a {kind}: texture and surface references are not supported (CUDA 12 removed them); use texture and surface objects"
    )
}

/// The geometry modifier of a texture or surface instruction.
fn geom_of(m: &mut Mods, gather: bool) -> LResult<Geom> {
    Ok(match m.any(&["1d", "2d", "3d", "a1d", "a2d", "cube", "acube"]) {
        Some("2d") => Geom::D2,
        Some("a2d") => Geom::A2d,
        Some("cube") => Geom::Cube,
        Some("acube") => Geom::ACube,
        Some("1d") if !gather => Geom::D1,
        Some("3d") if !gather => Geom::D3,
        Some("a1d") if !gather => Geom::A1d,
        _ => return Err(String::new()),
    })
}

fn bits_of(t: ScalarType) -> u8 {
    t.bits().min(64) as u8
}

fn is_float_ty(t: ScalarType) -> bool {
    matches!(
        t,
        ScalarType::F16 | ScalarType::F16x2 | ScalarType::BF16 | ScalarType::BF16x2 | ScalarType::F32 | ScalarType::F64
    )
}

fn fty(t: ScalarType) -> LResult<FTy> {
    Ok(match t {
        ScalarType::F16 => FTy::F16,
        ScalarType::BF16 => FTy::BF16,
        ScalarType::F32 => FTy::F32,
        ScalarType::F64 => FTy::F64,
        ScalarType::F16x2 => FTy::F16x2,
        ScalarType::BF16x2 => FTy::BF16x2,
        _ => return Err(String::new()),
    })
}

fn int_ty(t: ScalarType) -> LResult<IntTy> {
    use ScalarType::*;
    let (bits, signed) = match t {
        Pred => (1, false),
        B8 | U8 => (8, false),
        S8 => (8, true),
        B16 | U16 => (16, false),
        S16 => (16, true),
        B32 | U32 => (32, false),
        S32 => (32, true),
        B64 | U64 => (64, false),
        S64 => (64, true),
        _ => return Err(String::new()),
    };
    Ok(IntTy { bits, signed })
}

fn cvt_ty(t: ScalarType) -> LResult<CvtTy> {
    Ok(match t {
        ScalarType::F16 => CvtTy::F16,
        ScalarType::BF16 => CvtTy::BF16,
        ScalarType::F32 => CvtTy::F32,
        ScalarType::F64 => CvtTy::F64,
        ScalarType::TF32 => CvtTy::TF32,
        other => CvtTy::Int(int_ty(other)?),
    })
}

fn mem_space(s: StateSpace) -> LResult<Space> {
    Ok(match s {
        StateSpace::Global => Space::Global,
        StateSpace::Shared | StateSpace::SharedCta => Space::Shared,
        StateSpace::Local => Space::Local,
        StateSpace::Param | StateSpace::ParamEntry | StateSpace::ParamFunc => Space::Param,
        StateSpace::Const => Space::Const,
        _ => return Err(String::new()),
    })
}
