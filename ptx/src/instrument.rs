//! Checked twins of kernels: the validation half of validated speculation.
//!
//! While a checkpoint or restore is in progress, the API server launches a kernel's *checked
//! twin* instead of the kernel: the same code, with every store, atomic and reduction that can
//! reach global memory preceded by a check of its address against the ranges the launch was
//! speculated to write. A store outside every range sets a flag (and records the first such
//! address) and then goes ahead as the original would: validation never changes what a kernel
//! computes, it tells the checkpoint that its speculation missed.
//!
//! The twins live in a module of their own, [`checked_twin`] of the original module, loaded
//! beside it (the driver JIT-compiles it from this PTX; `emu` lowers it like any module). A
//! separate module has its own copies of module variables, but the twin must read and write
//! the original's: every reference to a `.global` or `.const` variable is rewritten into a
//! load of the variable's address from a table the server fills with the original module's
//! addresses (`.const` reads become global reads of the same bytes, which the GPU allows).
//!
//! Every function of the twin module takes one more parameter, [`CHECK_PARAM`], a pointer to
//! the *check context* in device memory (layout in [`context`]); kernels take it after their
//! own parameters, device functions are passed it by their callers.

use std::collections::{BTreeSet, HashMap};

use crate::access::{instruction_name, memory_operand, reaches_global, space_of};
use crate::ast::{
    Address, AddressBase, Directive, Function, FunctionKind, Guard, Immediate, Instruction, Modifier, Module, Operand,
    Param, ScalarType, StateSpace, Statement, StatementKind, VarDecl,
};

/// The name of the parameter every function of a twin module takes last.
pub const CHECK_PARAM: &str = "__phos_check";

/// Byte offsets of the check context's fields (little-endian, 8-byte aligned, [`context::SIZE`]
/// bytes in all).
pub mod context {
    /// `u32`: set to 1 by a store outside every range.
    pub const MISSED: u64 = 0;
    /// `u32`: how many ranges the table at [`RANGES`] holds.
    pub const RANGE_COUNT: u64 = 4;
    /// `u64`: device address of the ranges, `[start, end)` pairs of `u64`.
    pub const RANGES: u64 = 8;
    /// `u64`: device address of the variable table: the address of each of
    /// [`super::CheckedModule::variables`] in the original module, in that order.
    pub const VARIABLES: u64 = 16;
    /// `u64`: the first address a store missed with (0 until one does).
    pub const FIRST_MISS: u64 = 24;
    /// Size of the context.
    pub const SIZE: u64 = 32;
}

/// The largest parameter buffer a kernel may have for its twin to take the context pointer
/// (CUDA 12.1's limit for Volta and later is 32,764 bytes).
pub const MAX_PARAM_BYTES: u64 = 32_764;

/// A module of checked twins.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedModule {
    pub module: Module,
    /// The original module's variables the twins refer to, in variable-table order.
    pub variables: Vec<String>,
}

/// Why a module has no checked twin. The server then treats the module's kernels the
/// conservative way (writing everything they can reach) and says so.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InstrumentError {
    #[error("the module uses 32-bit addresses")]
    AddressSize32,
    #[error("the module declares texture, sampler or surface references (`{0}`)")]
    TextureReference(String),
    #[error("kernel `{kernel}` has {size} bytes of parameters, too many to add the check context")]
    ParamsTooLarge { kernel: String, size: u64 },
    #[error("`{function}` uses variable `{variable}` in `{instruction}` (PTX line {line}), which cannot be redirected")]
    VariableUse { function: String, variable: String, instruction: String, line: u32 },
    #[error("`{function}` stores with `{instruction}` (PTX line {line}), whose address cannot be checked")]
    UncheckableStore { function: String, instruction: String, line: u32 },
}

/// The checked twin of every kernel of `module`.
pub fn checked_twin(module: &Module) -> Result<CheckedModule, InstrumentError> {
    let mut variables = Vec::new();
    for d in &module.directives {
        match d {
            Directive::AddressSize(32) => return Err(InstrumentError::AddressSize32),
            Directive::Variable(v)
                if matches!(v.ty, ScalarType::TexRef | ScalarType::SamplerRef | ScalarType::SurfRef) =>
            {
                let name = v.declarators.first().map(|d| d.name.clone()).unwrap_or_default();
                return Err(InstrumentError::TextureReference(name));
            }
            Directive::Variable(v) if matches!(v.space, StateSpace::Global | StateSpace::Const) => {
                variables.extend(v.declarators.iter().map(|d| d.name.clone()));
            }
            _ => {}
        }
    }
    let index: HashMap<&str, usize> = variables.iter().enumerate().map(|(i, v)| (v.as_str(), i)).collect();
    // Functions that get the context: those with a body here. Others (vprintf, malloc) are
    // the runtime's and are called as they are.
    let defined: BTreeSet<&str> = module.functions().filter(|f| f.body.is_some()).map(|f| f.name.as_str()).collect();
    let mut directives = Vec::new();
    for d in &module.directives {
        match d {
            // The twins use the original's variables through the table.
            Directive::Variable(v) if matches!(v.space, StateSpace::Global | StateSpace::Const) => {}
            // Debug information describes the original (and names its variables); the twins
            // run only while a checkpoint is taken and are not debugged.
            Directive::Section(_) | Directive::File(_) => {}
            Directive::Target(t) => {
                directives.push(Directive::Target(t.iter().filter(|w| *w != "debug").cloned().collect()))
            }
            Directive::Function(f) if defined.contains(f.name.as_str()) => {
                directives.push(Directive::Function(Rewriter::new(&index, &defined, f).function()?));
            }
            other => directives.push(other.clone()),
        }
    }
    Ok(CheckedModule { module: Module { directives }, variables })
}

/// Scratch registers of the checks, declared once per function.
const CTX: &str = "%phos_ctx";
const TABLE: &str = "%phos_vars";
const ADDR: &str = "%phos_a";
const CURSOR: &str = "%phos_p";
const LOW: &str = "%phos_lo";
const HIGH: &str = "%phos_hi";
const COUNT: &str = "%phos_n";
const PRED: &str = "%phos_q";
/// Variable addresses: one register per address operand of an instruction (at most two).
const VAR: &str = "%phos_v";

struct Rewriter<'a> {
    variables: &'a HashMap<&'a str, usize>,
    defined: &'a BTreeSet<&'a str>,
    function: &'a Function,
    checks: u32,
    call_slots: u32,
}

fn ins(opcode: &str, modifiers: Vec<Modifier>, operands: Vec<Operand>) -> Instruction {
    Instruction { guard: None, opcode: opcode.to_string(), modifiers, operands }
}

fn reg(name: &str) -> Operand {
    Operand::Reg(name.to_string())
}

fn at(base: &str, offset: u64) -> Operand {
    Operand::Address(Address { base: AddressBase::Reg(base.to_string()), offset: offset as i64 })
}

fn imm(v: i64) -> Operand {
    Operand::Imm(Immediate::Int(v))
}

fn ty(t: ScalarType) -> Modifier {
    Modifier::Type(t)
}

fn global() -> Modifier {
    Modifier::Space(StateSpace::Global)
}

/// The context parameter: `.param .u64` on a kernel, `.param .b64` on a device function (as
/// nvcc declares pointers in each).
fn check_param(kind: FunctionKind) -> Param {
    let ty = if kind == FunctionKind::Entry { ScalarType::U64 } else { ScalarType::B64 };
    Param {
        space: StateSpace::Param,
        align: None,
        vector: None,
        ty,
        ptr: None,
        name: CHECK_PARAM.to_string(),
        dims: Vec::new(),
    }
}

fn reg_decl(t: ScalarType, names: &[(&str, Option<u32>)]) -> StatementKind {
    StatementKind::Decl(VarDecl {
        linkage: None,
        space: StateSpace::Reg,
        attributes: Vec::new(),
        align: None,
        vector: None,
        ty: t,
        declarators: names
            .iter()
            .map(|(n, range)| crate::ast::Declarator {
                name: n.to_string(),
                range: *range,
                dims: Vec::new(),
                init: None,
            })
            .collect(),
    })
}

impl<'a> Rewriter<'a> {
    fn new(variables: &'a HashMap<&'a str, usize>, defined: &'a BTreeSet<&'a str>, function: &'a Function) -> Self {
        Rewriter { variables, defined, function, checks: 0, call_slots: 0 }
    }

    fn function(mut self) -> Result<Function, InstrumentError> {
        let f = self.function;
        let mut out = f.clone();
        if f.kind == FunctionKind::Entry {
            let size = crate::signature_of(f).size;
            // A hostile module may declare parameters whose size nears the integer's limit.
            let with_slot = size.checked_next_multiple_of(8).and_then(|s| s.checked_add(8));
            if with_slot.is_none_or(|s| s > MAX_PARAM_BYTES) {
                return Err(InstrumentError::ParamsTooLarge { kernel: f.name.clone(), size });
            }
        }
        out.params.push(check_param(f.kind));
        let Some(body) = &f.body else { return Ok(out) };
        let line = body.first().map_or(f.line, |s| s.line);
        let mut prologue: Vec<StatementKind> = vec![
            reg_decl(
                ScalarType::B64,
                &[(CTX, None), (TABLE, None), (ADDR, None), (CURSOR, None), (LOW, None), (HIGH, None), (VAR, Some(2))],
            ),
            reg_decl(ScalarType::B32, &[(COUNT, None)]),
            reg_decl(ScalarType::Pred, &[(PRED, None)]),
        ];
        let rewritten = self.statements(body)?;
        // Declarations first (PTX wants them before use), then the context and the table.
        let mut head = Vec::new();
        let mut rest = rewritten.into_iter().peekable();
        while let Some(s) = rest.next_if(|s| matches!(s.kind, StatementKind::Decl(_))) {
            head.push(s);
        }
        prologue.push(StatementKind::Instruction(ins(
            "ld",
            vec![Modifier::Space(StateSpace::Param), ty(ScalarType::U64)],
            vec![reg(CTX), Operand::Address(Address { base: AddressBase::Symbol(CHECK_PARAM.to_string()), offset: 0 })],
        )));
        prologue.push(StatementKind::Instruction(ins(
            "ld",
            vec![global(), ty(ScalarType::U64)],
            vec![reg(TABLE), at(CTX, context::VARIABLES)],
        )));
        let mut body_out: Vec<Statement> = prologue.into_iter().map(|kind| Statement { line, kind }).collect();
        body_out.splice(0..0, head);
        body_out.extend(rest);
        out.body = Some(body_out);
        Ok(out)
    }

    fn statements(&mut self, body: &[Statement]) -> Result<Vec<Statement>, InstrumentError> {
        let mut out = Vec::with_capacity(body.len());
        for s in body {
            match &s.kind {
                StatementKind::Instruction(i) => self.instruction(i, s.line, &mut out)?,
                StatementKind::Block(inner) => {
                    out.push(Statement { line: s.line, kind: StatementKind::Block(self.statements(inner)?) })
                }
                StatementKind::CallPrototype(p) => {
                    // Indirect calls reach functions of this module, which all take the context.
                    let mut p = p.clone();
                    p.params.push(check_param(FunctionKind::Func));
                    out.push(Statement { line: s.line, kind: StatementKind::CallPrototype(p) });
                }
                StatementKind::Loc(_) => {}
                _ => out.push(s.clone()),
            }
        }
        Ok(out)
    }

    fn fail_variable(&self, variable: &str, i: &Instruction, line: u32) -> InstrumentError {
        InstrumentError::VariableUse {
            function: self.function.name.clone(),
            variable: variable.to_string(),
            instruction: instruction_name(i),
            line,
        }
    }

    /// Loads the original module's address of variable `v` into `dest`.
    fn variable_address(&self, v: usize, dest: &str, line: u32, out: &mut Vec<Statement>) {
        let load = ins("ld", vec![global(), ty(ScalarType::U64)], vec![reg(dest), at(TABLE, 8 * v as u64)]);
        out.push(Statement { line, kind: StatementKind::Instruction(load) });
    }

    fn instruction(&mut self, i: &Instruction, line: u32, out: &mut Vec<Statement>) -> Result<(), InstrumentError> {
        let mut i = i.clone();
        if i.opcode == "call" {
            return self.call(i, line, out);
        }
        // `.const` accesses and conversions: the twin reaches constants by their global
        // address, so they become global accesses and conversions do nothing.
        let is_const = |m: &Modifier| *m == Modifier::Space(StateSpace::Const);
        if i.opcode == "cvta" && i.modifiers.iter().any(is_const) {
            i.opcode = "mov".into();
            i.modifiers = vec![ty(ScalarType::B64)];
        } else if i.modifiers.iter().any(is_const) {
            i.modifiers.iter_mut().filter(|m| is_const(m)).for_each(|m| *m = global());
        }
        // Variables: by address operand, or as the source of mov/cvta.
        let mut vars_used = 0;
        for k in 0..i.operands.len() {
            let symbol = match &i.operands[k] {
                Operand::Address(Address { base: AddressBase::Symbol(s), .. }) | Operand::Symbol(s) => s.clone(),
                _ => continue,
            };
            let Some(&v) = self.variables.get(symbol.as_str()) else { continue };
            let direct = matches!(i.operands[k], Operand::Symbol(_));
            if direct && i.opcode == "mov" && k == 1 {
                // `mov.u64 %rd, var` becomes a load of the address from the table.
                let dest = i.operands[0].clone();
                let mut load = ins("ld", vec![global(), ty(ScalarType::U64)], vec![dest, at(TABLE, 8 * v as u64)]);
                load.guard = i.guard.clone();
                out.push(Statement { line, kind: StatementKind::Instruction(load) });
                return Ok(());
            }
            if vars_used == 2 || (direct && i.opcode != "cvta") {
                return Err(self.fail_variable(&symbol, &i, line));
            }
            let scratch = format!("{VAR}{vars_used}");
            vars_used += 1;
            self.variable_address(v, &scratch, line, out);
            i.operands[k] = match &i.operands[k] {
                Operand::Address(a) => {
                    Operand::Address(Address { base: AddressBase::Reg(scratch.clone()), offset: a.offset })
                }
                _ => reg(&scratch),
            };
        }
        if let Some((index, _, stores)) = memory_operand(&i)
            && stores
            && reaches_global(space_of(&i))
        {
            self.check(&i, index, line, out)?;
        } else if is_uncheckable_store(&i) {
            return Err(InstrumentError::UncheckableStore {
                function: self.function.name.clone(),
                instruction: instruction_name(&i),
                line,
            });
        }
        out.push(Statement { line, kind: StatementKind::Instruction(i) });
        Ok(())
    }

    /// The check before a store through operand `index` of `i`.
    fn check(
        &mut self,
        i: &Instruction,
        index: usize,
        line: u32,
        out: &mut Vec<Statement>,
    ) -> Result<(), InstrumentError> {
        let Some(Operand::Address(a)) = i.operands.get(index) else { return Ok(()) };
        let k = self.checks;
        self.checks += 1;
        let ok = format!("$phos_check_{k}_ok");
        let lp = format!("$phos_check_{k}_loop");
        let miss = format!("$phos_check_{k}_miss");
        let mut emit = |kind: StatementKind| out.push(Statement { line, kind });
        let guarded = |guard: Option<Guard>, i: Instruction| StatementKind::Instruction(Instruction { guard, ..i });
        let bra = |target: &str| ins("bra", vec![], vec![Operand::Symbol(target.to_string())]);
        let u64t = ty(ScalarType::U64);
        if let Some(g) = &i.guard {
            // A store that does not happen is not checked.
            emit(guarded(Some(Guard { negated: !g.negated, pred: g.pred.clone() }), bra(&ok)));
        }
        match &a.base {
            AddressBase::Reg(r) => emit(StatementKind::Instruction(ins(
                "add",
                vec![ty(ScalarType::S64)],
                vec![reg(ADDR), reg(r), imm(a.offset)],
            ))),
            AddressBase::Absolute => {
                emit(StatementKind::Instruction(ins("mov", vec![ty(ScalarType::B64)], vec![reg(ADDR), imm(a.offset)])))
            }
            // A private (shared or local) variable: not global memory.
            AddressBase::Symbol(_) => return Ok(()),
        }
        if space_of(i).is_none() {
            emit(StatementKind::Instruction(ins("isspacep", vec![global()], vec![reg(PRED), reg(ADDR)])));
            emit(guarded(Some(Guard { negated: true, pred: PRED.into() }), bra(&ok)));
        }
        emit(StatementKind::Instruction(ins(
            "ld",
            vec![global(), ty(ScalarType::U32)],
            vec![reg(COUNT), at(CTX, context::RANGE_COUNT)],
        )));
        emit(StatementKind::Instruction(ins(
            "ld",
            vec![global(), u64t.clone()],
            vec![reg(CURSOR), at(CTX, context::RANGES)],
        )));
        emit(StatementKind::Label(lp.clone()));
        emit(StatementKind::Instruction(ins(
            "setp",
            vec![Modifier::Other("eq".into()), ty(ScalarType::U32)],
            vec![reg(PRED), reg(COUNT), imm(0)],
        )));
        emit(guarded(Some(Guard { negated: false, pred: PRED.into() }), bra(&miss)));
        emit(StatementKind::Instruction(ins("ld", vec![global(), u64t.clone()], vec![reg(LOW), at(CURSOR, 0)])));
        emit(StatementKind::Instruction(ins("ld", vec![global(), u64t.clone()], vec![reg(HIGH), at(CURSOR, 8)])));
        emit(StatementKind::Instruction(ins(
            "add",
            vec![ty(ScalarType::S64)],
            vec![reg(CURSOR), reg(CURSOR), imm(16)],
        )));
        emit(StatementKind::Instruction(ins("sub", vec![ty(ScalarType::S32)], vec![reg(COUNT), reg(COUNT), imm(1)])));
        emit(StatementKind::Instruction(ins(
            "setp",
            vec![Modifier::Other("lt".into()), u64t.clone()],
            vec![reg(PRED), reg(ADDR), reg(LOW)],
        )));
        emit(guarded(Some(Guard { negated: false, pred: PRED.into() }), bra(&lp)));
        emit(StatementKind::Instruction(ins(
            "setp",
            vec![Modifier::Other("lt".into()), u64t.clone()],
            vec![reg(PRED), reg(ADDR), reg(HIGH)],
        )));
        emit(guarded(Some(Guard { negated: false, pred: PRED.into() }), bra(&ok)));
        emit(StatementKind::Instruction(bra(&lp)));
        emit(StatementKind::Label(miss));
        emit(StatementKind::Instruction(ins(
            "st",
            vec![global(), ty(ScalarType::U32)],
            vec![at(CTX, context::MISSED), imm(1)],
        )));
        emit(StatementKind::Instruction(ins(
            "atom",
            vec![global(), Modifier::Other("cas".into()), ty(ScalarType::B64)],
            vec![reg(LOW), at(CTX, context::FIRST_MISS), imm(0), reg(ADDR)],
        )));
        emit(StatementKind::Label(ok));
        Ok(())
    }

    /// A call passes the context on to functions of this module.
    fn call(&mut self, mut i: Instruction, line: u32, out: &mut Vec<Statement>) -> Result<(), InstrumentError> {
        let target = i.operands.iter().find(|o| !matches!(o, Operand::List(_)));
        let passes = match target {
            Some(Operand::Symbol(name)) => self.defined.contains(name.as_str()),
            // Indirect: through a register to a function of this module.
            _ => true,
        };
        if passes {
            let slot = format!("__phos_check_arg{}", self.call_slots);
            self.call_slots += 1;
            out.push(Statement {
                line,
                kind: StatementKind::Decl(VarDecl {
                    linkage: None,
                    space: StateSpace::Param,
                    attributes: Vec::new(),
                    align: None,
                    vector: None,
                    ty: ScalarType::B64,
                    declarators: vec![crate::ast::Declarator {
                        name: slot.clone(),
                        range: None,
                        dims: Vec::new(),
                        init: None,
                    }],
                }),
            });
            let store = ins(
                "st",
                vec![Modifier::Space(StateSpace::Param), ty(ScalarType::B64)],
                vec![Operand::Address(Address { base: AddressBase::Symbol(slot.clone()), offset: 0 }), reg(CTX)],
            );
            out.push(Statement { line, kind: StatementKind::Instruction(store) });
            // The argument list follows the target; with none, it is added after it.
            let target_at = i.operands.iter().position(|o| !matches!(o, Operand::List(_))).unwrap_or(0);
            match i.operands.get_mut(target_at + 1) {
                Some(Operand::List(args)) => args.push(Operand::Symbol(slot)),
                _ => i.operands.insert(target_at + 1, Operand::List(vec![Operand::Symbol(slot)])),
            }
        }
        out.push(Statement { line, kind: StatementKind::Instruction(i) });
        Ok(())
    }
}

/// Stores to global memory whose address is not an address operand (tensor copies through a
/// tensor map, multimem): the twin cannot check them.
fn is_uncheckable_store(i: &Instruction) -> bool {
    let words = |w: &str| i.modifiers.iter().any(|m| matches!(m, Modifier::Other(x) if x == w));
    i.opcode == "multimem" || (i.opcode == "cp" && words("tensor") && space_of(i) == Some(StateSpace::Global))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostile module's parameters may declare a size near the integer's limit: refused as
    /// too large, not an overflow (found by the ptx_parse fuzzer).
    #[test]
    fn parameters_sized_near_the_limit_are_refused() {
        let ptx = ".version 7.8\n.target sm_70\n.address_size 64\n\
                   .visible .entry k(\n\t.param .u64 p[4294967296][4294967296]\n)\n{\n\tret;\n}\n";
        let module = crate::parse(ptx).expect("parses");
        match checked_twin(&module) {
            Err(InstrumentError::ParamsTooLarge { kernel, .. }) => assert_eq!(kernel, "k"),
            other => panic!("expected ParamsTooLarge, got {:?}", other.map(|_| ())),
        }
    }
}
