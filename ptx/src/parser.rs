//! Recursive-descent parser from tokens to [`Module`].

use std::collections::{HashMap, HashSet};

use crate::ast::*;
use crate::error::{ParseError, ParseErrorKind};
use crate::lexer::{Lexer, Number, TokKind, Token, parse_number};

/// Parses a complete PTX module.
pub fn parse(src: &str) -> Result<Module, ParseError> {
    let mut lexer = Lexer::new(src);
    let first = lexer.next_token();
    let second = lexer.next_token();
    let mut p = Parser {
        src,
        lexer,
        look: [first, second],
        prev: first,
        scopes: Vec::new(),
        ctx: Ctx::Module,
        function: None,
        depth: 0,
    };
    p.module()
}

/// What is being parsed, for error messages. Kept cheap (no allocation) because it changes on
/// every statement; turned into text only when an error is built.
#[derive(Clone, Copy)]
enum Ctx<'a> {
    Module,
    /// The directive word, without its dot.
    Directive(&'a str),
    FunctionHeader,
    Statement,
    /// Byte offset of the opcode in the source.
    Instruction(usize),
}

/// Registers declared in one scope. Needed because PTX lets registers have plain names
/// (`.reg .b32 temp;`), which are otherwise indistinguishable from symbols.
#[derive(Default)]
struct RegScope {
    names: HashSet<String>,
    /// `%r<10>` is recorded as `"%r" -> 10`.
    ranges: HashMap<String, u32>,
}

impl RegScope {
    fn contains(&self, name: &str) -> bool {
        if self.names.contains(name) {
            return true;
        }
        let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits == name.len() {
            return false;
        }
        let (prefix, num) = name.split_at(name.len() - digits);
        match (self.ranges.get(prefix), num.parse::<u32>()) {
            (Some(&count), Ok(n)) => n < count,
            _ => false,
        }
    }
}

/// Tokens are produced on demand with two tokens of lookahead, so memory stays proportional to
/// the tree rather than to the (possibly very large) text.
struct Parser<'a> {
    src: &'a str,
    lexer: Lexer<'a>,
    look: [Token<'a>; 2],
    /// The token most recently consumed.
    prev: Token<'a>,
    scopes: Vec<RegScope>,
    ctx: Ctx<'a>,
    function: Option<&'a str>,
    /// Current nesting of blocks, initializer lists and compound operands.
    depth: u32,
}

/// Nesting limit. The parser is recursive; without a bound, hostile input such as a million
/// `{` would overflow the stack (an abort, not a recoverable error). nvcc never nests deeper
/// than a handful of levels.
const MAX_NESTING: u32 = 256;

type PResult<T> = Result<T, ParseError>;

/// State spaces a module-scope declaration may use.
const MODULE_SPACES: &[&str] = &["global", "const", "shared", "local", "tex", "reg"];

/// State spaces a declaration inside a function body may use.
const STATEMENT_SPACES: &[&str] = &["reg", "local", "shared", "param", "const", "global", "tex"];

impl<'a> Parser<'a> {
    // ----- token helpers -------------------------------------------------------------------

    fn peek(&self) -> Token<'a> {
        self.look[0]
    }

    /// The token after the next one.
    fn peek2(&self) -> Token<'a> {
        self.look[1]
    }

    /// Consumes the next token. End of input and lexical errors are sticky: they stay next.
    fn bump(&mut self) -> Token<'a> {
        let t = self.look[0];
        if !matches!(t.kind, TokKind::Eof | TokKind::Error) {
            self.look[0] = self.look[1];
            self.look[1] = self.lexer.next_token();
            self.prev = t;
        }
        t
    }

    fn at_punct(&self, c: char) -> bool {
        self.peek().is_punct(c)
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if self.at_punct(c) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, c: char) -> PResult<Token<'a>> {
        if self.at_punct(c) { Ok(self.bump()) } else { self.unexpected(&format!("`{c}`")) }
    }

    fn expect_ident(&mut self, what: &str) -> PResult<Token<'a>> {
        if self.peek().kind == TokKind::Ident { Ok(self.bump()) } else { self.unexpected(what) }
    }

    fn expect_dot(&mut self, what: &str) -> PResult<Token<'a>> {
        if self.peek().kind == TokKind::Dot { Ok(self.bump()) } else { self.unexpected(what) }
    }

    /// Enters a nested construct, failing once the nesting limit is reached.
    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            let t = self.peek();
            return self.fail(t, ParseErrorKind::Invalid(format!("nesting deeper than {MAX_NESTING} levels")));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn construct(&self) -> String {
        let in_fn = |s: String| match self.function {
            Some(f) => format!("{s} in function `{f}`"),
            None => s,
        };
        match self.ctx {
            Ctx::Module => "module".to_string(),
            Ctx::Directive(word) => in_fn(format!("directive `.{word}`")),
            Ctx::FunctionHeader => format!("header of function `{}`", self.function.unwrap_or("?")),
            Ctx::Statement => in_fn("statement".to_string()),
            Ctx::Instruction(start) => {
                // The mnemonic is the opcode and its dot-suffixes, written without spaces.
                let rest = &self.src[start..];
                let len = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.' | ':')))
                    .unwrap_or(rest.len());
                in_fn(format!("instruction `{}`", &rest[..len]))
            }
        }
    }

    fn error_at(&self, tok: Token<'a>, kind: ParseErrorKind) -> ParseError {
        // A lexical error surfaces as an error token; report what the lexer found, not what the
        // parser expected there.
        if tok.kind == TokKind::Error
            && let Some(e) = self.lexer.error()
        {
            let mut e = e.clone();
            e.construct = self.construct();
            return e;
        }
        ParseError { line: tok.line, column: tok.col, construct: self.construct(), kind }
    }

    fn fail<T>(&self, tok: Token<'a>, kind: ParseErrorKind) -> PResult<T> {
        Err(self.error_at(tok, kind))
    }

    fn unexpected<T>(&self, expected: &str) -> PResult<T> {
        let t = self.peek();
        self.fail(t, ParseErrorKind::Unexpected { expected: expected.to_string(), found: t.describe() })
    }

    fn number(&mut self, what: &str) -> PResult<(Token<'a>, Number)> {
        let t = self.peek();
        if t.kind != TokKind::Number {
            return self.unexpected(what);
        }
        self.bump();
        match parse_number(t.text) {
            Some(n) => Ok((t, n)),
            None => self.fail(t, ParseErrorKind::InvalidNumber(t.text.to_string())),
        }
    }

    /// A non-negative integer literal that fits in `u64`.
    fn uint(&mut self, what: &str) -> PResult<u64> {
        match self.number(what)? {
            // Literals above i64::MAX were stored wrapped; undo that.
            (_, Number::Int(v)) => Ok(v as u64),
            (t, _) => {
                self.fail(t, ParseErrorKind::Invalid(format!("expected an integer for {what}, found `{}`", t.text)))
            }
        }
    }

    fn uint32(&mut self, what: &str) -> PResult<u32> {
        let t = self.peek();
        let v = self.uint(what)?;
        u32::try_from(v).or_else(|_| self.fail(t, ParseErrorKind::Invalid(format!("{what} `{v}` is out of range"))))
    }

    /// A signed integer: optional `-` then a literal.
    fn int(&mut self, what: &str) -> PResult<i64> {
        let neg = self.eat_punct('-');
        match self.number(what)? {
            (_, Number::Int(v)) => Ok(if neg { v.wrapping_neg() } else { v }),
            (t, _) => {
                self.fail(t, ParseErrorKind::Invalid(format!("expected an integer for {what}, found `{}`", t.text)))
            }
        }
    }

    /// Immediate with an optional leading minus.
    fn immediate(&mut self) -> PResult<Immediate> {
        let neg = self.eat_punct('-');
        let (_, n) = self.number("a number")?;
        Ok(match n {
            Number::Int(v) => Immediate::Int(if neg { v.wrapping_neg() } else { v }),
            Number::F32(b) => Immediate::F32(if neg { b ^ 0x8000_0000 } else { b }),
            Number::F64(b) => Immediate::F64(if neg { b ^ 0x8000_0000_0000_0000 } else { b }),
        })
    }

    fn string(&mut self) -> PResult<String> {
        let t = self.peek();
        if t.kind != TokKind::Str {
            return self.unexpected("a string literal");
        }
        self.bump();
        Ok(t.text.to_string())
    }

    // ----- module level --------------------------------------------------------------------

    fn module(&mut self) -> PResult<Module> {
        let mut directives = Vec::new();
        while self.peek().kind != TokKind::Eof {
            self.ctx = Ctx::Module;
            directives.push(self.top_directive()?);
        }
        Ok(Module { directives })
    }

    fn top_directive(&mut self) -> PResult<Directive> {
        let mut linkage = None;
        loop {
            let t = self.peek();
            if t.kind != TokKind::Dot {
                return self.unexpected("a directive");
            }
            match Linkage::from_name(t.text) {
                Some(l) if linkage.is_none() => {
                    linkage = Some(l);
                    self.bump();
                }
                Some(_) => return self.fail(t, ParseErrorKind::Invalid("more than one linkage directive".into())),
                None => break,
            }
        }
        let t = self.bump();
        self.ctx = Ctx::Directive(t.text);
        let only_unlinked = |p: &Self, d: Directive| match linkage {
            None => Ok(d),
            Some(l) => p.fail(t, ParseErrorKind::Invalid(format!("`.{}` cannot have linkage `.{}`", t.text, l.name()))),
        };
        match t.text {
            "version" => {
                let (n, _) = self.number("a version number")?;
                let parsed = n.text.split_once('.').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
                let Some((major, minor)) = parsed else {
                    return self.fail(n, ParseErrorKind::InvalidNumber(n.text.to_string()));
                };
                only_unlinked(self, Directive::Version { major, minor })
            }
            "target" => {
                let mut list = vec![self.expect_ident("a target architecture")?.text.to_string()];
                while self.eat_punct(',') {
                    list.push(self.expect_ident("a target modifier")?.text.to_string());
                }
                only_unlinked(self, Directive::Target(list))
            }
            "address_size" => {
                let n = self.uint32("the address size")?;
                only_unlinked(self, Directive::AddressSize(n))
            }
            "file" => {
                let index = self.uint32("a file index")?;
                let path = self.string()?;
                let (mut timestamp, mut size) = (None, None);
                if self.eat_punct(',') {
                    timestamp = Some(self.uint("a timestamp")?);
                    self.expect_punct(',')?;
                    size = Some(self.uint("a file size")?);
                }
                only_unlinked(self, Directive::File(FileDirective { index, path, timestamp, size }))
            }
            "entry" => Ok(Directive::Function(self.function(FunctionKind::Entry, linkage, t.line)?)),
            "func" => Ok(Directive::Function(self.function(FunctionKind::Func, linkage, t.line)?)),
            "pragma" => {
                let p = self.pragma_strings()?;
                only_unlinked(self, Directive::Pragma(p))
            }
            "alias" => {
                let alias = self.expect_ident("an alias name")?.text.to_string();
                self.expect_punct(',')?;
                let target = self.expect_ident("an aliased function")?.text.to_string();
                self.expect_punct(';')?;
                only_unlinked(self, Directive::Alias { alias, target })
            }
            "section" => {
                let name = self.expect_dot("a section name")?.text;
                let open = self.expect_punct('{')?;
                let mut depth = 1usize;
                let close = loop {
                    let t = self.bump();
                    match t.kind {
                        TokKind::Eof | TokKind::Error => {
                            return self.fail(t, ParseErrorKind::Invalid("unterminated section".into()));
                        }
                        TokKind::Punct if t.text == "{" => depth += 1,
                        TokKind::Punct if t.text == "}" => {
                            depth -= 1;
                            if depth == 0 {
                                break t;
                            }
                        }
                        _ => {}
                    }
                };
                let raw = self.src[open.end..close.start].to_string();
                only_unlinked(self, Directive::Section(Section { name: format!(".{name}"), raw }))
            }
            word if MODULE_SPACES.contains(&word) => {
                let space = StateSpace::from_name(word).unwrap_or(StateSpace::Global);
                Ok(Directive::Variable(self.var_decl(linkage, space, false)?))
            }
            other => self.fail(t, ParseErrorKind::UnknownDirective(other.to_string())),
        }
    }

    /// `"a", "b";` after `.pragma`.
    fn pragma_strings(&mut self) -> PResult<Vec<String>> {
        let mut list = vec![self.string()?];
        while self.eat_punct(',') {
            list.push(self.string()?);
        }
        self.expect_punct(';')?;
        Ok(list)
    }

    // ----- declarations --------------------------------------------------------------------

    /// Parses the rest of a declaration after its state space, through the `;`.
    /// `local_scope` registers `.reg` names for operand classification.
    fn var_decl(&mut self, linkage: Option<Linkage>, space: StateSpace, local_scope: bool) -> PResult<VarDecl> {
        let mut attributes = Vec::new();
        let (mut align, mut vector, mut ty) = (None, None, None);
        while self.peek().kind == TokKind::Dot {
            let t = self.bump();
            match t.text {
                "align" => align = Some(self.uint32("an alignment")?),
                "v2" => vector = Some(2),
                "v4" => vector = Some(4),
                "v8" => vector = Some(8),
                "attribute" => {
                    self.expect_punct('(')?;
                    loop {
                        attributes.push(self.expect_dot("an attribute such as `.managed`")?.text.to_string());
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    self.expect_punct(')')?;
                }
                word => match ScalarType::from_name(word) {
                    Some(tt) if ty.is_none() => ty = Some(tt),
                    Some(_) => {
                        return self.fail(t, ParseErrorKind::Invalid("more than one type in declaration".into()));
                    }
                    None => return self.fail(t, ParseErrorKind::UnknownType(word.to_string())),
                },
            }
        }
        let Some(ty) = ty else {
            return self.unexpected("a type such as `.b32`");
        };
        let mut declarators = Vec::new();
        loop {
            let name = self.expect_ident("a variable name")?.text.to_string();
            let mut range = None;
            if self.eat_punct('<') {
                range = Some(self.uint32("a register count")?);
                self.expect_punct('>')?;
            }
            let dims = self.array_dims()?;
            let init = if self.eat_punct('=') { Some(self.initializer()?) } else { None };
            declarators.push(Declarator { name, range, dims, init });
            if !self.eat_punct(',') {
                break;
            }
        }
        self.expect_punct(';')?;
        if local_scope
            && space == StateSpace::Reg
            && let Some(scope) = self.scopes.last_mut()
        {
            for d in &declarators {
                match d.range {
                    Some(n) => {
                        scope.ranges.insert(d.name.clone(), n);
                    }
                    None => {
                        scope.names.insert(d.name.clone());
                    }
                }
            }
        }
        Ok(VarDecl { linkage, space, attributes, align, vector, ty, declarators })
    }

    fn array_dims(&mut self) -> PResult<Vec<Option<u64>>> {
        let mut dims = Vec::new();
        while self.eat_punct('[') {
            if self.eat_punct(']') {
                dims.push(None);
            } else {
                dims.push(Some(self.uint("an array size")?));
                self.expect_punct(']')?;
            }
        }
        Ok(dims)
    }

    fn initializer(&mut self) -> PResult<Initializer> {
        if self.eat_punct('{') {
            self.enter()?;
            let mut items = Vec::new();
            if !self.eat_punct('}') {
                loop {
                    items.push(self.initializer()?);
                    if self.eat_punct('}') {
                        break;
                    }
                    if !self.eat_punct(',') {
                        return self.unexpected("`,` or `}` in initializer list");
                    }
                }
            }
            self.leave();
            return Ok(Initializer::List(items));
        }
        let t = self.peek();
        if t.kind == TokKind::Ident {
            self.bump();
            let (name, generic) = if t.text == "generic" && self.at_punct('(') {
                self.bump();
                let name = self.expect_ident("a symbol inside `generic(...)`")?.text;
                self.expect_punct(')')?;
                (name, true)
            } else {
                (t.text, false)
            };
            // `sym+8` or `sym-8` (`int` takes the minus sign itself).
            let offset = if self.eat_punct('+') || self.at_punct('-') { self.int("an address offset")? } else { 0 };
            return Ok(Initializer::Address { name: name.to_string(), generic, offset });
        }
        if t.kind == TokKind::Number || t.is_punct('-') {
            return Ok(Initializer::Imm(self.immediate()?));
        }
        self.unexpected("an initializer value")
    }

    // ----- functions -----------------------------------------------------------------------

    fn function(&mut self, kind: FunctionKind, linkage: Option<Linkage>, line: u32) -> PResult<Function> {
        self.ctx = Ctx::FunctionHeader;
        let return_params =
            if kind == FunctionKind::Func && self.at_punct('(') { self.param_list()? } else { Vec::new() };
        let name = self.expect_ident("a function name")?.text;
        self.function = Some(name);
        let params = if self.at_punct('(') { self.param_list()? } else { Vec::new() };
        let mut directives = Vec::new();
        while self.peek().kind == TokKind::Dot {
            directives.push(self.function_directive()?);
        }
        let body = if self.eat_punct(';') {
            None
        } else if self.at_punct('{') {
            let mut scope = RegScope::default();
            for p in params.iter().chain(&return_params).filter(|p| p.space == StateSpace::Reg) {
                scope.names.insert(p.name.clone());
            }
            self.scopes.push(scope);
            self.bump();
            let body = self.statements()?;
            self.scopes.pop();
            Some(body)
        } else {
            return self.unexpected("`{` or `;` after the function header");
        };
        self.function = None;
        Ok(Function { kind, linkage, name: name.to_string(), return_params, params, directives, body, line })
    }

    fn param_list(&mut self) -> PResult<Vec<Param>> {
        self.expect_punct('(')?;
        let mut params = Vec::new();
        if self.eat_punct(')') {
            return Ok(params);
        }
        loop {
            params.push(self.param()?);
            if self.eat_punct(')') {
                return Ok(params);
            }
            if !self.eat_punct(',') {
                return self.unexpected("`,` or `)` in parameter list");
            }
        }
    }

    fn param(&mut self) -> PResult<Param> {
        let t = self.expect_dot("`.param` or `.reg`")?;
        let space = match t.text {
            "param" => StateSpace::Param,
            "reg" => StateSpace::Reg,
            other => {
                return self.fail(t, ParseErrorKind::Invalid(format!("parameter in state space `.{other}`")));
            }
        };
        let (mut align, mut vector, mut ty, mut ptr) = (None, None, None, None::<PtrAttr>);
        while self.peek().kind == TokKind::Dot {
            let t = self.bump();
            match (t.text, ptr.as_mut()) {
                ("ptr", None) => ptr = Some(PtrAttr { space: None, align: None }),
                ("align", Some(p)) => p.align = Some(self.uint32("an alignment")?),
                ("align", None) => align = Some(self.uint32("an alignment")?),
                ("v2", _) => vector = Some(2),
                ("v4", _) => vector = Some(4),
                ("v8", _) => vector = Some(8),
                (word, Some(p)) if StateSpace::from_name(word).is_some() => p.space = StateSpace::from_name(word),
                (word, _) => match ScalarType::from_name(word) {
                    Some(tt) if ty.is_none() => ty = Some(tt),
                    _ => return self.fail(t, ParseErrorKind::UnknownType(word.to_string())),
                },
            }
        }
        let Some(ty) = ty else {
            return self.unexpected("a parameter type");
        };
        let name = self.expect_ident("a parameter name")?.text.to_string();
        let dims = self.array_dims()?;
        Ok(Param { space, align, vector, ty, ptr, name, dims })
    }

    fn dims_list(&mut self) -> PResult<Vec<u32>> {
        let mut v = vec![self.uint32("a dimension")?];
        while self.eat_punct(',') {
            v.push(self.uint32("a dimension")?);
        }
        if v.len() > 3 {
            return self.fail(self.prev, ParseErrorKind::Invalid("more than three dimensions".into()));
        }
        Ok(v)
    }

    fn function_directive(&mut self) -> PResult<FunctionDirective> {
        let t = self.bump();
        Ok(match t.text {
            "maxntid" => FunctionDirective::MaxNTid(self.dims_list()?),
            "reqntid" => FunctionDirective::ReqNTid(self.dims_list()?),
            "reqnctapercluster" => FunctionDirective::ReqNCtaPerCluster(self.dims_list()?),
            "minnctapersm" => FunctionDirective::MinNCtaPerSm(self.uint32("a CTA count")?),
            "maxnctapersm" => FunctionDirective::MaxNCtaPerSm(self.uint32("a CTA count")?),
            "maxnreg" => FunctionDirective::MaxNReg(self.uint32("a register count")?),
            "maxclusterrank" => FunctionDirective::MaxClusterRank(self.uint32("a cluster rank")?),
            "noreturn" => FunctionDirective::NoReturn,
            "explicitcluster" => FunctionDirective::ExplicitCluster,
            "blocksareclusters" => FunctionDirective::BlocksAreClusters,
            "pragma" => FunctionDirective::Pragma(self.pragma_strings()?),
            other => return self.fail(t, ParseErrorKind::UnknownDirective(other.to_string())),
        })
    }

    // ----- statements ----------------------------------------------------------------------

    /// Statements up to and including the closing `}` of the current scope.
    fn statements(&mut self) -> PResult<Vec<Statement>> {
        let mut out = Vec::new();
        loop {
            self.ctx = Ctx::Statement;
            let t = self.peek();
            if t.is_punct('}') {
                self.bump();
                return Ok(out);
            }
            let kind = match t.kind {
                TokKind::Eof => return self.unexpected("`}` closing the function body"),
                TokKind::Punct if t.text == "{" => {
                    self.bump();
                    self.enter()?;
                    self.scopes.push(RegScope::default());
                    let inner = self.statements()?;
                    self.scopes.pop();
                    self.leave();
                    StatementKind::Block(inner)
                }
                TokKind::Punct if t.text == "@" => StatementKind::Instruction(self.instruction()?),
                TokKind::Dot => self.statement_directive()?,
                TokKind::Ident if self.peek2().is_punct(':') => self.label()?,
                TokKind::Ident => StatementKind::Instruction(self.instruction()?),
                _ => return self.unexpected("an instruction, label, declaration or `}`"),
            };
            out.push(Statement { line: t.line, kind });
        }
    }

    fn statement_directive(&mut self) -> PResult<StatementKind> {
        let t = self.bump();
        self.ctx = Ctx::Directive(t.text);
        match t.text {
            "pragma" => Ok(StatementKind::Pragma(self.pragma_strings()?)),
            "loc" => {
                let file = self.uint32("a file index")?;
                let line = self.uint32("a line number")?;
                let column = self.uint32("a column number")?;
                let (mut function_name, mut inlined_at) = (None, None);
                // Attributes follow after commas; the directive ends at the line break, but the
                // next statement never starts with `,`, so token lookahead suffices.
                while self.at_punct(',') && self.peek2().kind == TokKind::Ident {
                    self.bump();
                    let key = self.bump();
                    match key.text {
                        "function_name" => {
                            let label = self.expect_ident("a label")?.text.to_string();
                            let off = if self.eat_punct('+') { self.int("an offset")? } else { 0 };
                            function_name = Some((label, off));
                        }
                        "inlined_at" => {
                            let a = self.uint32("a file index")?;
                            let b = self.uint32("a line number")?;
                            let c = self.uint32("a column number")?;
                            inlined_at = Some((a, b, c));
                        }
                        other => {
                            return self
                                .fail(key, ParseErrorKind::Invalid(format!("unknown `.loc` attribute `{other}`")));
                        }
                    }
                }
                Ok(StatementKind::Loc(Loc { file, line, column, function_name, inlined_at }))
            }
            word if STATEMENT_SPACES.contains(&word) => {
                let space = StateSpace::from_name(word).unwrap_or(StateSpace::Reg);
                Ok(StatementKind::Decl(self.var_decl(None, space, true)?))
            }
            "extern" | "visible" | "weak" => {
                // `.extern .shared ...` may appear inside a function.
                let linkage = Linkage::from_name(t.text);
                let s = self.expect_dot("a state space")?;
                match StateSpace::from_name(s.text) {
                    Some(space) => Ok(StatementKind::Decl(self.var_decl(linkage, space, true)?)),
                    None => self.fail(s, ParseErrorKind::UnknownDirective(s.text.to_string())),
                }
            }
            other => self.fail(t, ParseErrorKind::UnknownDirective(other.to_string())),
        }
    }

    /// `name:` possibly introducing `.callprototype`, `.calltargets` or `.branchtargets`.
    fn label(&mut self) -> PResult<StatementKind> {
        let label = self.bump().text.to_string();
        self.bump(); // ':'
        let t = self.peek();
        let introduces = ["callprototype", "calltargets", "branchtargets"];
        if t.kind != TokKind::Dot || !introduces.contains(&t.text) {
            return Ok(StatementKind::Label(label));
        }
        self.bump();
        self.ctx = Ctx::Directive(t.text);
        match t.text {
            "callprototype" => {
                let return_params = if self.at_punct('(') { self.param_list()? } else { Vec::new() };
                let placeholder = self.expect_ident("`_`")?;
                if placeholder.text != "_" {
                    return self.fail(placeholder, ParseErrorKind::Invalid("call prototype name must be `_`".into()));
                }
                let params = if self.at_punct('(') { self.param_list()? } else { Vec::new() };
                let noreturn = self.peek().is_dot("noreturn");
                if noreturn {
                    self.bump();
                }
                self.expect_punct(';')?;
                Ok(StatementKind::CallPrototype(CallPrototype { label, return_params, params, noreturn }))
            }
            _ => {
                // `.calltargets` or `.branchtargets`
                let mut targets = vec![self.expect_ident("a target name")?.text.to_string()];
                while self.eat_punct(',') {
                    targets.push(self.expect_ident("a target name")?.text.to_string());
                }
                self.expect_punct(';')?;
                Ok(if t.text == "calltargets" {
                    StatementKind::CallTargets { label, targets }
                } else {
                    StatementKind::BranchTargets { label, targets }
                })
            }
        }
    }

    fn instruction(&mut self) -> PResult<Instruction> {
        let guard = if self.eat_punct('@') {
            let negated = self.eat_punct('!');
            Some(Guard { negated, pred: self.expect_ident("a guard predicate")?.text.to_string() })
        } else {
            None
        };
        self.ctx = Ctx::Instruction(self.peek().start);
        let opcode = self.expect_ident("an instruction opcode")?.text.to_string();
        let mut modifiers = Vec::new();
        while self.peek().kind == TokKind::Dot {
            modifiers.push(Modifier::from_word(self.bump().text));
        }
        let mut operands = Vec::new();
        if !self.eat_punct(';') {
            loop {
                operands.push(self.operand()?);
                if self.eat_punct(';') {
                    break;
                }
                if !self.eat_punct(',') {
                    return self.unexpected("`,` or `;` after an operand");
                }
            }
        }
        Ok(Instruction { guard, opcode, modifiers, operands })
    }

    fn operand(&mut self) -> PResult<Operand> {
        let first = self.operand_atom()?;
        if self.eat_punct('|') {
            let second = self.operand_atom()?;
            return Ok(Operand::Pair(Box::new(first), Box::new(second)));
        }
        Ok(first)
    }

    fn operand_list(&mut self, close: char) -> PResult<Vec<Operand>> {
        let mut items = Vec::new();
        if self.eat_punct(close) {
            return Ok(items);
        }
        loop {
            items.push(self.operand()?);
            if self.eat_punct(close) {
                return Ok(items);
            }
            if !self.eat_punct(',') {
                return self.unexpected(&format!("`,` or `{close}`"));
            }
        }
    }

    fn operand_atom(&mut self) -> PResult<Operand> {
        self.enter()?;
        let result = self.operand_atom_inner();
        self.leave();
        result
    }

    fn operand_atom_inner(&mut self) -> PResult<Operand> {
        let t = self.peek();
        match t.kind {
            TokKind::Number => Ok(Operand::Imm(self.immediate()?)),
            TokKind::Punct => match t.text {
                "-" => Ok(Operand::Imm(self.immediate()?)),
                "!" => {
                    self.bump();
                    Ok(Operand::Not(Box::new(self.operand_atom()?)))
                }
                "{" => {
                    self.bump();
                    Ok(Operand::Vector(self.operand_list('}')?))
                }
                "(" => {
                    self.bump();
                    Ok(Operand::List(self.operand_list(')')?))
                }
                "[" => {
                    self.bump();
                    self.address()
                }
                _ => self.unexpected("an operand"),
            },
            TokKind::Ident => {
                self.bump();
                let name = t.text;
                let comp = self.peek();
                if comp.kind == TokKind::Dot {
                    let Some(c) = Component::from_name(comp.text) else {
                        return self.fail(
                            comp,
                            ParseErrorKind::Invalid(format!("`.{}` is not a vector component", comp.text)),
                        );
                    };
                    self.bump();
                    return match self.name_operand(name) {
                        Operand::Reg(r) => Ok(Operand::RegComponent(r, c)),
                        Operand::Special(s, None) => Ok(Operand::Special(s, Some(c))),
                        _ => self.fail(comp, ParseErrorKind::Invalid(format!("`{name}` has no components"))),
                    };
                }
                Ok(self.name_operand(name))
            }
            _ => self.unexpected("an operand"),
        }
    }

    fn is_declared_reg(&self, name: &str) -> bool {
        self.scopes.iter().rev().any(|s| s.contains(name))
    }

    /// Classifies a bare name: sink, register, special register or symbol.
    fn name_operand(&self, name: &str) -> Operand {
        if name == "_" {
            return Operand::Sink;
        }
        if self.is_declared_reg(name) {
            return Operand::Reg(name.to_string());
        }
        if name.starts_with('%') {
            return match SpecialReg::from_name(name) {
                Some(s) => Operand::Special(s, None),
                None => Operand::Reg(name.to_string()),
            };
        }
        Operand::Symbol(name.to_string())
    }

    /// After `[`: `[reg]`, `[sym+4]`, `[reg+-8]`, `[1024]`, or a bracket list `[tex, {..}]`.
    fn address(&mut self) -> PResult<Operand> {
        let t = self.peek();
        let base = match t.kind {
            TokKind::Ident => {
                self.bump();
                match self.name_operand(t.text) {
                    Operand::Reg(r) => AddressBase::Reg(r),
                    Operand::Symbol(s) => AddressBase::Symbol(s),
                    _ => {
                        return self
                            .fail(t, ParseErrorKind::Invalid(format!("`{}` cannot be an address base", t.text)));
                    }
                }
            }
            TokKind::Number => AddressBase::Absolute,
            TokKind::Punct if t.text == "-" => AddressBase::Absolute,
            _ => return self.unexpected("a register, symbol or constant address"),
        };
        let offset = match base {
            AddressBase::Absolute => self.int("an absolute address")?,
            _ if self.eat_punct('+') => self.int("an address offset")?,
            _ if self.at_punct('-') => self.int("an address offset")?,
            _ => 0,
        };
        if self.eat_punct(']') {
            return Ok(Operand::Address(Address { base, offset }));
        }
        let first = match base {
            AddressBase::Reg(r) if offset == 0 => Some(Operand::Reg(r)),
            AddressBase::Symbol(s) if offset == 0 => Some(Operand::Symbol(s)),
            _ => None,
        };
        if let Some(first) = first.filter(|_| self.at_punct(',')) {
            self.bump();
            // `[a,]` is no PTX; read as a list of one it would print as the address `[a]`.
            if self.at_punct(']') {
                return self.unexpected("an operand after `,`");
            }
            let mut items = vec![first];
            items.extend(self.operand_list(']')?);
            return Ok(Operand::BracketList(items));
        }
        self.unexpected("`]` closing the address")
    }
}

#[cfg(test)]
mod tests;
