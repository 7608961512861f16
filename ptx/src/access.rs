//! What a kernel may read and write, as far as its PTX tells: the speculation half of validated
//! speculation (docs/architecture.md, "Concurrent checkpoint and restore: speculation and
//! validation").
//!
//! A checkpoint that runs while the application runs must know, before a launch, which
//! allocations the kernel may write. The launch's arguments name allocations (a parameter
//! word whose value falls inside one); this analysis says what the kernel does with each
//! 8-byte word of its parameter buffer: used as an address to read, to write, both, or not at
//! all. A pointer parameter never stored through is read-only; one never used as an address
//! names nothing the kernel touches.
//!
//! The analysis follows values, not control: every register holds the union of what any
//! instruction could put in it (flow-insensitive, so a register reused for two pointers is
//! both). Values stored to shared or local memory (debug builds spill pointers to the stack)
//! are merged into one pool that loads from those spaces give back. A pointer loaded from
//! global memory, an address computed from nothing the kernel was given, or an indirect call
//! can reach anything: the kernel then has *untracked* accesses, and each is named with its
//! PTX line so that the log can say why. Those are what validation ([`crate::instrument`]) is
//! for: it checks at run time the stores that speculation could not attribute.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::ast::{
    Address, AddressBase, Function, FunctionKind, Instruction, Modifier, Module, Operand, StateSpace, Statement,
    StatementKind,
};
use crate::signature::signature_of;

/// How a kernel uses one 8-byte word of its parameter buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WordUse {
    /// An address derived from the word is loaded from.
    pub read: bool,
    /// An address derived from the word is stored to (or used by an atomic or reduction).
    pub written: bool,
}

/// An access the analysis could not attribute to a parameter or a module variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untracked {
    /// The function it is in (the kernel or a function it calls).
    pub function: String,
    pub line: u32,
    /// What kind of access and why it could not be attributed.
    pub what: String,
}

/// What one kernel may read and write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelAccess {
    pub kernel: String,
    /// By byte offset of the word in the parameter buffer (a multiple of 8); words that are
    /// never used as an address are absent.
    pub words: BTreeMap<u64, WordUse>,
    /// Module variables (`.global`, `.const`) the kernel or its callees read.
    pub variables_read: BTreeSet<String>,
    /// Module variables the kernel or its callees write.
    pub variables_written: BTreeSet<String>,
    /// Stores whose target the analysis could not attribute: through a pointer loaded from
    /// device memory, an address made from nothing the kernel was given, an indirect call.
    pub untracked_stores: Vec<Untracked>,
    /// Loads of the same kind (only a restore that loads memory on demand cares).
    pub untracked_loads: Vec<Untracked>,
}

impl KernelAccess {
    /// How the word at byte `offset` of the parameter buffer is used (`offset` is rounded
    /// down to its word).
    pub fn word(&self, offset: u64) -> WordUse {
        self.words.get(&(offset & !7)).copied().unwrap_or_default()
    }

    /// True when every store of the kernel is attributed to a parameter word or a variable.
    pub fn stores_are_tracked(&self) -> bool {
        self.untracked_stores.is_empty()
    }
}

/// The access summary of every kernel (`.entry`) of `module` that has a body.
pub fn kernel_accesses(module: &Module) -> Vec<KernelAccess> {
    let mut analysis = Analysis::new(module);
    module
        .directives
        .iter()
        .filter_map(|d| match d {
            crate::Directive::Function(f) if f.kind == FunctionKind::Entry && f.body.is_some() => Some(f),
            _ => None,
        })
        .map(|f| analysis.kernel(f))
        .collect()
}

/// Where a value may have come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Origin {
    /// The value of the kernel parameter word at this byte offset.
    ParamWord(u64),
    /// The address of the kernel parameter at this byte offset (`mov %rd, k_param_2`).
    ParamAddress(u64),
    /// The address of module variable number N (index into `Analysis::variables`).
    Variable(usize),
    /// An address in shared or local memory: never global memory.
    Private,
    /// A function's own parameter, or a value loaded from one: a caller's argument, which the
    /// caller already counts as read and written (see `record`).
    Argument,
    /// Loaded from device memory, returned by a function, or otherwise unknowable.
    Unknown,
}

type Origins = BTreeSet<Origin>;

/// A function's effects that its callers inherit.
#[derive(Clone, Debug, Default)]
struct Summary {
    variables_read: BTreeSet<String>,
    variables_written: BTreeSet<String>,
    untracked_stores: Vec<Untracked>,
    untracked_loads: Vec<Untracked>,
}

struct Analysis<'m> {
    module: &'m Module,
    variables: Vec<String>,
    variable_index: HashMap<&'m str, usize>,
    private: BTreeSet<&'m str>,
    summaries: HashMap<String, Summary>,
}

/// How an instruction touches memory through one of its address operands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MemoryUse {
    Load,
    Store,
    LoadStore,
}

/// The space an instruction's memory operand is in: the first state-space modifier, or
/// generic.
pub(crate) fn space_of(ins: &Instruction) -> Option<StateSpace> {
    ins.modifiers.iter().find_map(|m| match m {
        Modifier::Space(s) => Some(*s),
        _ => None,
    })
}

fn has_word(ins: &Instruction, word: &str) -> bool {
    ins.modifiers.iter().any(|m| matches!(m, Modifier::Other(w) if w == word))
}

/// The address operand an instruction reads or writes memory through, and how; `None` for
/// instructions that do not access memory through an address operand.
pub(crate) fn memory_operand(ins: &Instruction) -> Option<(usize, bool, bool)> {
    let (index, access) = match ins.opcode.as_str() {
        "ld" | "ldu" => (1, MemoryUse::Load),
        "st" => (0, MemoryUse::Store),
        "red" => (0, MemoryUse::LoadStore),
        "atom" => (1, MemoryUse::LoadStore),
        "wmma" if has_word(ins, "load") => (1, MemoryUse::Load),
        "wmma" if has_word(ins, "store") => (0, MemoryUse::Store),
        "cp" if has_word(ins, "async") => (0, MemoryUse::Store),
        _ => return None,
    };
    matches!(ins.operands.get(index), Some(Operand::Address(_))).then_some((
        index,
        access != MemoryUse::Store,
        access != MemoryUse::Load,
    ))
}

/// Whether an access in `space` can reach global memory (generic accesses can).
pub(crate) fn reaches_global(space: Option<StateSpace>) -> bool {
    matches!(space, None | Some(StateSpace::Global))
}

impl<'m> Analysis<'m> {
    fn new(module: &'m Module) -> Analysis<'m> {
        let mut variables = Vec::new();
        let mut variable_index = HashMap::new();
        let mut private = BTreeSet::new();
        for d in &module.directives {
            if let crate::Directive::Variable(v) = d {
                for decl in &v.declarators {
                    match v.space {
                        StateSpace::Global | StateSpace::Const => {
                            variable_index.insert(decl.name.as_str(), variables.len());
                            variables.push(decl.name.clone());
                        }
                        _ => {
                            private.insert(decl.name.as_str());
                        }
                    }
                }
            }
        }
        Analysis { module, variables, variable_index, private, summaries: HashMap::new() }
    }

    fn kernel(&mut self, f: &'m Function) -> KernelAccess {
        let mut state = FunctionState::new(self, f);
        state.solve();
        let mut out = KernelAccess { kernel: f.name.clone(), ..KernelAccess::default() };
        for (word, use_) in &state.words {
            out.words.insert(*word, *use_);
        }
        let summary = state.finish();
        out.variables_read = summary.variables_read;
        out.variables_written = summary.variables_written;
        out.untracked_stores = summary.untracked_stores;
        out.untracked_loads = summary.untracked_loads;
        out
    }

    /// The summary of the function `name`, computed once. A function being summarised that
    /// is reached again (recursion) contributes nothing more the second time: its effects are
    /// already being collected.
    fn summary(&mut self, name: &str) -> Summary {
        if let Some(s) = self.summaries.get(name) {
            return s.clone();
        }
        let Some(f) = self.module.function(name).filter(|f| f.body.is_some()) else {
            // A declared function without a body (an external one): anything may happen.
            let what = format!("call of `{name}`, whose body is not in the module");
            let u = Untracked { function: name.to_string(), line: 0, what };
            return Summary { untracked_stores: vec![u.clone()], untracked_loads: vec![u], ..Summary::default() };
        };
        self.summaries.insert(name.to_string(), Summary::default());
        let mut state = FunctionState::new(self, f);
        state.solve();
        let s = state.finish();
        self.summaries.insert(name.to_string(), s.clone());
        s
    }
}

/// The analysis of one function's body.
struct FunctionState<'a, 'm> {
    analysis: &'a mut Analysis<'m>,
    function: &'m Function,
    /// Kernel parameters by name: their byte offsets (entries only).
    params: HashMap<&'m str, u64>,
    /// A function's own parameters (device functions only).
    arguments: BTreeSet<&'m str>,
    regs: HashMap<&'m str, Origins>,
    /// What was stored to shared or local memory.
    pool: Origins,
    words: BTreeMap<u64, WordUse>,
    summary: Summary,
    callees: BTreeSet<String>,
}

impl<'a, 'm> FunctionState<'a, 'm> {
    fn new(analysis: &'a mut Analysis<'m>, function: &'m Function) -> Self {
        let mut params = HashMap::new();
        let mut arguments = BTreeSet::new();
        if function.kind == FunctionKind::Entry {
            let sig = signature_of(function);
            for (p, layout) in function.params.iter().zip(&sig.params) {
                params.insert(p.name.as_str(), layout.offset);
            }
        } else {
            arguments.extend(function.params.iter().map(|p| p.name.as_str()));
        }
        FunctionState {
            analysis,
            function,
            params,
            arguments,
            regs: HashMap::new(),
            pool: Origins::new(),
            words: BTreeMap::new(),
            summary: Summary::default(),
            callees: BTreeSet::new(),
        }
    }

    /// Propagates origins until nothing changes, then records every access once.
    fn solve(&mut self) {
        let body: &'m [Statement] = self.function.body.as_deref().unwrap_or(&[]);
        let locals = local_symbols(body);
        loop {
            let before = (self.regs.values().map(|s| s.len()).sum::<usize>(), self.pool.len());
            walk(body, &mut |ins, _| self.propagate(ins, &locals));
            if (self.regs.values().map(|s| s.len()).sum::<usize>(), self.pool.len()) == before {
                break;
            }
        }
        walk(body, &mut |ins, line| self.record(ins, line, &locals));
    }

    fn finish(mut self) -> Summary {
        for callee in std::mem::take(&mut self.callees) {
            let s = self.analysis.summary(&callee);
            self.summary.variables_read.extend(s.variables_read);
            self.summary.variables_written.extend(s.variables_written);
            self.summary.untracked_stores.extend(s.untracked_stores);
            self.summary.untracked_loads.extend(s.untracked_loads);
        }
        self.summary
    }

    fn symbol(&self, name: &str, locals: &BTreeSet<&str>) -> Origins {
        if let Some(&offset) = self.params.get(name) {
            return [Origin::ParamAddress(offset)].into();
        }
        if self.arguments.contains(name) {
            return [Origin::Argument].into();
        }
        if locals.contains(name) || self.analysis.private.contains(name) {
            return [Origin::Private].into();
        }
        if let Some(&i) = self.analysis.variable_index.get(name) {
            return [Origin::Variable(i)].into();
        }
        // A function's address or a label: not memory a kernel reads or writes through.
        Origins::new()
    }

    fn operand(&self, op: &Operand, locals: &BTreeSet<&str>) -> Origins {
        match op {
            Operand::Reg(r) | Operand::RegComponent(r, _) => self.regs.get(r.as_str()).cloned().unwrap_or_default(),
            Operand::Symbol(s) => self.symbol(s, locals),
            Operand::Vector(items) | Operand::List(items) | Operand::BracketList(items) => {
                items.iter().flat_map(|o| self.operand(o, locals)).collect()
            }
            Operand::Not(o) => self.operand(o, locals),
            Operand::Pair(a, b) => self.operand(a, locals).into_iter().chain(self.operand(b, locals)).collect(),
            Operand::Address(a) => self.address(a, locals),
            Operand::Special(..) | Operand::Imm(_) | Operand::Sink => Origins::new(),
        }
    }

    /// Where an address expression may point.
    fn address(&self, a: &Address, locals: &BTreeSet<&str>) -> Origins {
        match &a.base {
            AddressBase::Reg(r) => self.regs.get(r.as_str()).cloned().unwrap_or_default(),
            AddressBase::Symbol(s) => self.symbol(s, locals),
            AddressBase::Absolute => Origins::new(),
        }
    }

    /// What a load from `a` gives.
    fn loaded(&self, ins: &Instruction, a: &Address, locals: &BTreeSet<&str>) -> Origins {
        let target = self.address(a, locals);
        let space = space_of(ins);
        // Reading a kernel parameter word: by symbol, or through the parameter's address.
        let params: Origins = target
            .iter()
            .filter_map(|o| match o {
                Origin::ParamAddress(base) => Some(Origin::ParamWord((base + a.offset as u64) & !7)),
                _ => None,
            })
            .collect();
        if !params.is_empty() {
            return params;
        }
        if target.contains(&Origin::Argument) && matches!(space, Some(StateSpace::Param | StateSpace::ParamFunc)) {
            return [Origin::Argument].into();
        }
        if matches!(space, Some(StateSpace::Param | StateSpace::ParamEntry | StateSpace::ParamFunc)) {
            // A function's own parameter or a call's return value: what it holds was passed
            // by a caller or made by a callee, neither of which this function can see.
            return [Origin::Unknown].into();
        }
        if !target.is_empty() && target.iter().all(|o| *o == Origin::Private) {
            return self.pool.clone();
        }
        [Origin::Unknown].into()
    }

    fn set(&mut self, dest: &'m Operand, values: &Origins) {
        match dest {
            Operand::Reg(r) | Operand::RegComponent(r, _) => {
                self.regs.entry(r.as_str()).or_default().extend(values.iter().copied());
            }
            Operand::Vector(items) | Operand::List(items) => items.iter().for_each(|o| self.set(o, values)),
            Operand::Pair(a, b) => {
                self.set(a, values);
                self.set(b, values);
            }
            _ => {}
        }
    }

    fn propagate(&mut self, ins: &'m Instruction, locals: &BTreeSet<&'m str>) {
        if ins.opcode == "call" {
            // Return values: whatever the callee made (unknowable here).
            if let Some(Operand::List(rets)) = ins.operands.first()
                && ins.operands.len() > 1
            {
                for r in rets {
                    if let Operand::Symbol(_) = r {
                        continue; // a `.param` slot; loaded later by ld.param, which gives Unknown
                    }
                    self.set(r, &[Origin::Unknown].into());
                }
            }
            return;
        }
        if let Some((index, loads, stores)) = memory_operand(ins) {
            let Some(Operand::Address(a)) = ins.operands.get(index) else { return };
            let target = self.address(a, locals);
            let call_slot = matches!(space_of(ins), Some(StateSpace::Param | StateSpace::ParamFunc));
            if stores && !call_slot && !target.is_empty() && target.iter().all(|o| *o == Origin::Private) {
                // A value written to shared or local memory (a spill, a shared pointer table).
                let value: Origins =
                    ins.operands.iter().skip(index + 1).flat_map(|o| self.operand(o, locals)).collect();
                self.pool.extend(value);
            }
            if loads && index > 0 {
                let value = if ins.opcode == "ld" || ins.opcode == "ldu" {
                    self.loaded(ins, a, locals)
                } else {
                    // An atomic returns the old contents of memory.
                    [Origin::Unknown].into()
                };
                self.set(&ins.operands[0], &value);
            }
            return;
        }
        // Anything else: the destination may hold a mix of every source.
        let Some((dest, sources)) = ins.operands.split_first() else { return };
        let values: Origins = sources.iter().flat_map(|o| self.operand(o, locals)).collect();
        if !values.is_empty() {
            self.set(dest, &values);
        }
    }

    fn untracked(&self, line: u32, what: String) -> Untracked {
        Untracked { function: self.function.name.clone(), line, what }
    }

    fn record(&mut self, ins: &'m Instruction, line: u32, locals: &BTreeSet<&'m str>) {
        if ins.opcode == "call" {
            self.record_call(ins, line, locals);
            return;
        }
        // Passing a pointer to a function: the callee may read and write through it.
        if ins.opcode == "st" && matches!(space_of(ins), Some(StateSpace::Param)) {
            let passed: Origins = ins.operands.iter().skip(1).flat_map(|o| self.operand(o, locals)).collect();
            self.touch(&passed, true, true);
            return;
        }
        if matches!(ins.opcode.as_str(), "tex" | "tld4" | "suld" | "sust" | "sured") {
            // Textures and surfaces reach memory through an object, not an address: a CUDA
            // array, or linear memory bound to a texture.
            let what = format!("{} through a texture or surface object", instruction_name(ins));
            let u = self.untracked(line, what);
            if ins.opcode != "tex" && ins.opcode != "tld4" && ins.opcode != "suld" {
                self.summary.untracked_stores.push(u.clone());
            }
            self.summary.untracked_loads.push(u);
            return;
        }
        if ins.opcode == "cp"
            && let Some(Operand::Address(source)) = ins.operands.get(1)
        {
            // A copy's source (`cp.async`, bulk copies) is read.
            let from: Origins = self.address(source, locals).into_iter().filter(|o| *o != Origin::Private).collect();
            self.touch(&from, true, false);
        }
        let Some((index, loads, stores)) = memory_operand(ins) else { return };
        let space = space_of(ins);
        if !reaches_global(space) && space != Some(StateSpace::Const) {
            return;
        }
        let Some(Operand::Address(a)) = ins.operands.get(index) else { return };
        let target = self.address(a, locals);
        let global: Origins = target.iter().copied().filter(|o| *o != Origin::Private).collect();
        if global.is_empty() && !target.is_empty() {
            return; // only shared or local memory
        }
        self.touch(&global, loads, stores);
        let untracked = global.is_empty() || global.contains(&Origin::Unknown);
        if untracked {
            let why = if global.is_empty() {
                "an address made from nothing the kernel was given"
            } else {
                "an address loaded from memory"
            };
            let what = format!("{} through {why}", instruction_name(ins));
            if stores {
                let u = self.untracked(line, what.clone());
                self.summary.untracked_stores.push(u);
            }
            if loads {
                let u = self.untracked(line, what);
                self.summary.untracked_loads.push(u);
            }
        }
    }

    fn record_call(&mut self, ins: &'m Instruction, line: u32, _locals: &BTreeSet<&'m str>) {
        // `call (rets), target, (args)[, prototype]` or `call target, (args)`.
        let target = ins.operands.iter().find(|o| !matches!(o, Operand::List(_)));
        match target {
            Some(Operand::Symbol(name)) if self.analysis.module.function(name).is_some() => {
                if matches!(name.as_str(), "vprintf" | "__assertfail" | "malloc" | "free") {
                    return; // runtime services: they write only their own buffers
                }
                self.callees.insert(name.clone());
            }
            _ => {
                let what = format!("indirect call ({})", instruction_name(ins));
                let u = self.untracked(line, what);
                self.summary.untracked_stores.push(u.clone());
                self.summary.untracked_loads.push(u);
            }
        }
    }

    /// Records that addresses from `origins` are read and/or written.
    fn touch(&mut self, origins: &Origins, read: bool, written: bool) {
        for o in origins {
            match *o {
                Origin::ParamWord(w) => {
                    let u = self.words.entry(w).or_default();
                    u.read |= read;
                    u.written |= written;
                }
                Origin::Variable(i) => {
                    let name = self.analysis.variables[i].clone();
                    if read {
                        self.summary.variables_read.insert(name.clone());
                    }
                    if written {
                        self.summary.variables_written.insert(name);
                    }
                }
                Origin::ParamAddress(_) | Origin::Private | Origin::Argument | Origin::Unknown => {}
            }
        }
    }
}

/// `st.global.v4.f32` and the like, for messages.
pub(crate) fn instruction_name(ins: &Instruction) -> String {
    ins.modifiers.iter().fold(ins.opcode.clone(), |s, m| format!("{s}.{m}"))
}

/// Names declared in a function body's `.local`, `.shared` and `.param` declarations.
fn local_symbols(body: &[Statement]) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    fn visit<'s>(body: &'s [Statement], out: &mut BTreeSet<&'s str>) {
        for s in body {
            match &s.kind {
                StatementKind::Decl(v) if v.space != StateSpace::Reg => {
                    out.extend(v.declarators.iter().map(|d| d.name.as_str()));
                }
                StatementKind::Block(inner) => visit(inner, out),
                _ => {}
            }
        }
    }
    visit(body, &mut out);
    out
}

/// Calls `f` on every instruction of `body`, nested blocks included, with its line.
fn walk<'s>(body: &'s [Statement], f: &mut impl FnMut(&'s Instruction, u32)) {
    for s in body {
        match &s.kind {
            StatementKind::Instruction(i) => f(i, s.line),
            StatementKind::Block(inner) => walk(inner, f),
            _ => {}
        }
    }
}
