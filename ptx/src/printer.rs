//! PTX text output. The layout follows nvcc's (tab-indented bodies, one statement per line) so
//! printed modules are easy to diff against compiler output; the guarantee is that parsing the
//! output yields the same tree.

use std::fmt::{self, Display, Formatter, Write};

use crate::ast::*;

impl Display for Module {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let mut prev_was_header = false;
        for d in &self.directives {
            let is_header = matches!(d, Directive::Version { .. } | Directive::Target(_) | Directive::AddressSize(_));
            // Blank line between the header block and the rest, and around function definitions.
            if prev_was_header && !is_header {
                f.write_char('\n')?;
            }
            prev_was_header = is_header;
            writeln!(f, "{d}")?;
            if matches!(d, Directive::Function(func) if func.body.is_some()) {
                f.write_char('\n')?;
            }
        }
        Ok(())
    }
}

impl Display for Directive {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Directive::Version { major, minor } => write!(f, ".version {major}.{minor}"),
            Directive::Target(list) => write!(f, ".target {}", list.join(", ")),
            Directive::AddressSize(n) => write!(f, ".address_size {n}"),
            Directive::File(file) => {
                write!(f, ".file {} \"{}\"", file.index, file.path)?;
                if let (Some(t), Some(s)) = (file.timestamp, file.size) {
                    write!(f, ", {t}, {s}")?;
                }
                Ok(())
            }
            Directive::Variable(v) => write!(f, "{v}"),
            Directive::Function(func) => write!(f, "{func}"),
            Directive::Pragma(p) => write!(f, ".pragma {};", Strings(p)),
            Directive::Alias { alias, target } => write!(f, ".alias {alias}, {target};"),
            // The raw body already holds its own line breaks and indentation.
            Directive::Section(s) => write!(f, "\t.section\t{}\n\t{{{}}}", s.name, s.raw),
        }
    }
}

/// Comma-separated quoted strings (pragma arguments).
struct Strings<'a>(&'a [String]);

impl Display for Strings<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "\"{s}\"")?;
        }
        Ok(())
    }
}

/// Items joined by `", "`.
struct Commas<'a, T>(&'a [T]);

impl<T: Display> Display for Commas<'_, T> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

impl Display for Immediate {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Immediate::Int(v) => write!(f, "{v}"),
            Immediate::F32(bits) => write!(f, "0f{bits:08X}"),
            Immediate::F64(bits) => write!(f, "0d{bits:016X}"),
        }
    }
}

fn write_offset(f: &mut Formatter<'_>, offset: i64) -> fmt::Result {
    // nvcc writes `+-8` for negative offsets; ptxas accepts it, so keep that form.
    if offset != 0 { write!(f, "+{offset}") } else { Ok(()) }
}

impl Display for Initializer {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Initializer::Imm(i) => write!(f, "{i}"),
            Initializer::Address { name, generic, offset } => {
                if *generic {
                    write!(f, "generic({name})")?;
                } else {
                    f.write_str(name)?;
                }
                write_offset(f, *offset)
            }
            Initializer::List(items) => write!(f, "{{{}}}", Commas(items)),
        }
    }
}

fn write_dims(f: &mut Formatter<'_>, dims: &[Option<u64>]) -> fmt::Result {
    for d in dims {
        match d {
            Some(n) => write!(f, "[{n}]")?,
            None => f.write_str("[]")?,
        }
    }
    Ok(())
}

impl Display for Declarator {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(n) = self.range {
            write!(f, "<{n}>")?;
        }
        write_dims(f, &self.dims)?;
        if let Some(init) = &self.init {
            write!(f, " = {init}")?;
        }
        Ok(())
    }
}

impl Display for VarDecl {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if let Some(l) = self.linkage {
            write!(f, ".{} ", l.name())?;
        }
        write!(f, ".{}", self.space.name())?;
        if !self.attributes.is_empty() {
            f.write_str(" .attribute(")?;
            for (i, a) in self.attributes.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, ".{a}")?;
            }
            f.write_char(')')?;
        }
        if let Some(a) = self.align {
            write!(f, " .align {a}")?;
        }
        if let Some(v) = self.vector {
            write!(f, " .v{v}")?;
        }
        write!(f, " .{} {};", self.ty.name(), Commas(&self.declarators))
    }
}

impl Display for Param {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, ".{}", self.space.name())?;
        if let Some(a) = self.align {
            write!(f, " .align {a}")?;
        }
        if let Some(v) = self.vector {
            write!(f, " .v{v}")?;
        }
        write!(f, " .{}", self.ty.name())?;
        if let Some(p) = &self.ptr {
            f.write_str(" .ptr")?;
            if let Some(s) = p.space {
                write!(f, " .{}", s.name())?;
            }
            if let Some(a) = p.align {
                write!(f, " .align {a}")?;
            }
        }
        write!(f, " {}", self.name)?;
        write_dims(f, &self.dims)
    }
}

fn write_param_block(f: &mut Formatter<'_>, params: &[Param]) -> fmt::Result {
    f.write_str("(\n")?;
    for (i, p) in params.iter().enumerate() {
        let sep = if i + 1 < params.len() { "," } else { "" };
        writeln!(f, "\t{p}{sep}")?;
    }
    f.write_char(')')
}

impl Display for FunctionDirective {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            FunctionDirective::MaxNTid(d) => write!(f, ".maxntid {}", Commas(d)),
            FunctionDirective::ReqNTid(d) => write!(f, ".reqntid {}", Commas(d)),
            FunctionDirective::ReqNCtaPerCluster(d) => write!(f, ".reqnctapercluster {}", Commas(d)),
            FunctionDirective::MinNCtaPerSm(n) => write!(f, ".minnctapersm {n}"),
            FunctionDirective::MaxNCtaPerSm(n) => write!(f, ".maxnctapersm {n}"),
            FunctionDirective::MaxNReg(n) => write!(f, ".maxnreg {n}"),
            FunctionDirective::MaxClusterRank(n) => write!(f, ".maxclusterrank {n}"),
            FunctionDirective::NoReturn => f.write_str(".noreturn"),
            FunctionDirective::ExplicitCluster => f.write_str(".explicitcluster"),
            FunctionDirective::BlocksAreClusters => f.write_str(".blocksareclusters"),
            FunctionDirective::Pragma(p) => write!(f, ".pragma {};", Strings(p)),
        }
    }
}

impl Display for Function {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if let Some(l) = self.linkage {
            write!(f, ".{} ", l.name())?;
        }
        f.write_str(match self.kind {
            FunctionKind::Entry => ".entry ",
            FunctionKind::Func => ".func ",
        })?;
        if !self.return_params.is_empty() {
            write!(f, "({}) ", Commas(&self.return_params))?;
        }
        f.write_str(&self.name)?;
        write_param_block(f, &self.params)?;
        f.write_char('\n')?;
        for d in &self.directives {
            writeln!(f, "{d}")?;
        }
        match &self.body {
            None => f.write_char(';'),
            Some(body) => {
                f.write_str("{\n")?;
                write_statements(f, body, 1)?;
                f.write_char('}')
            }
        }
    }
}

fn write_statements(f: &mut Formatter<'_>, stmts: &[Statement], depth: usize) -> fmt::Result {
    for s in stmts {
        // Labels sit in the first column, like nvcc's output.
        if !matches!(s.kind, StatementKind::Label(_)) {
            for _ in 0..depth {
                f.write_char('\t')?;
            }
        }
        match &s.kind {
            StatementKind::Block(inner) => {
                f.write_str("{\n")?;
                write_statements(f, inner, depth + 1)?;
                for _ in 0..depth {
                    f.write_char('\t')?;
                }
                f.write_str("}\n")?;
            }
            other => writeln!(f, "{other}")?,
        }
    }
    Ok(())
}

impl Display for Statement {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)
    }
}

impl Display for StatementKind {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            StatementKind::Decl(d) => write!(f, "{d}"),
            StatementKind::Label(l) => write!(f, "{l}:"),
            StatementKind::Instruction(i) => write!(f, "{i}"),
            StatementKind::Block(inner) => {
                f.write_str("{\n")?;
                write_statements(f, inner, 1)?;
                f.write_char('}')
            }
            StatementKind::Pragma(p) => write!(f, ".pragma {};", Strings(p)),
            StatementKind::Loc(l) => write!(f, "{l}"),
            StatementKind::CallPrototype(p) => {
                write!(f, "{}: .callprototype ", p.label)?;
                if !p.return_params.is_empty() {
                    write!(f, "({}) ", Commas(&p.return_params))?;
                }
                write!(f, "_ ({})", Commas(&p.params))?;
                if p.noreturn {
                    f.write_str(" .noreturn")?;
                }
                f.write_char(';')
            }
            StatementKind::CallTargets { label, targets } => {
                write!(f, "{label}: .calltargets {};", targets.join(", "))
            }
            StatementKind::BranchTargets { label, targets } => {
                write!(f, "{label}: .branchtargets {};", targets.join(", "))
            }
        }
    }
}

impl Display for Loc {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, ".loc\t{} {} {}", self.file, self.line, self.column)?;
        if let Some((label, off)) = &self.function_name {
            write!(f, ", function_name {label}")?;
            write_offset(f, *off)?;
        }
        if let Some((a, b, c)) = self.inlined_at {
            write!(f, ", inlined_at {a} {b} {c}")?;
        }
        Ok(())
    }
}

impl Display for Instruction {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if let Some(g) = &self.guard {
            write!(f, "@{}{} ", if g.negated { "!" } else { "" }, g.pred)?;
        }
        f.write_str(&self.opcode)?;
        for m in &self.modifiers {
            write!(f, ".{m}")?;
        }
        if !self.operands.is_empty() {
            write!(f, " \t{}", Commas(&self.operands))?;
        }
        f.write_char(';')
    }
}

impl Display for Address {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match &self.base {
            AddressBase::Reg(r) => f.write_str(r)?,
            AddressBase::Symbol(s) => f.write_str(s)?,
            AddressBase::Absolute => return write!(f, "{}", self.offset),
        }
        write_offset(f, self.offset)
    }
}

impl Display for Operand {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Reg(r) | Operand::Symbol(r) => f.write_str(r),
            Operand::RegComponent(r, c) => write!(f, "{r}.{}", c.name()),
            Operand::Special(s, None) => write!(f, "{s}"),
            Operand::Special(s, Some(c)) => write!(f, "{s}.{}", c.name()),
            Operand::Imm(i) => write!(f, "{i}"),
            Operand::Address(a) => write!(f, "[{a}]"),
            Operand::BracketList(items) => write!(f, "[{}]", Commas(items)),
            Operand::Vector(items) => write!(f, "{{{}}}", Commas(items)),
            Operand::List(items) => write!(f, "({})", Commas(items)),
            Operand::Not(inner) => write!(f, "!{inner}"),
            Operand::Pair(a, b) => write!(f, "{a}|{b}"),
            Operand::Sink => f.write_char('_'),
        }
    }
}

impl Display for ScalarType {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, ".{}", self.name())
    }
}

impl Display for StateSpace {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, ".{}", self.name())
    }
}
