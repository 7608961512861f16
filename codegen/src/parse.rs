//! The spec parser, built with `winnow` over a located `&str` so that every node carries its
//! byte span. Grammar reference: `docs/spec-language.md`.

use winnow::LocatingSlice;
use winnow::ascii::{digit1, hex_digit1, multispace1};
use winnow::combinator::{alt, cut_err, delimited, opt, preceded, repeat, separated, terminated};
use winnow::error::{ContextError, ErrMode, StrContext, StrContextValue};
use winnow::prelude::*;
use winnow::stream::Location;
use winnow::token::{any, one_of, take_until, take_while};

use crate::ast::*;
use crate::diag::Diagnostic;

type Input<'a> = LocatingSlice<&'a str>;
type PResult<T> = ModalResult<T>;

/// Parse a whole spec file.
pub fn parse_spec(source: &str) -> Result<SpecFile, Diagnostic> {
    let mut input = LocatingSlice::new(source);
    let parsed = terminated(repeat(0.., item), (ws, winnow::combinator::eof.context(expected("a declaration"))))
        .parse_next(&mut input);
    match parsed {
        Ok(items) => Ok(SpecFile { items }),
        Err(e) => {
            let offset = input.current_token_start();
            let ctx = match e {
                ErrMode::Backtrack(c) | ErrMode::Cut(c) => c,
                ErrMode::Incomplete(_) => ContextError::new(),
            };
            Err(Diagnostic::new(Span::new(offset, offset + 1), describe(&ctx)))
        }
    }
}

fn describe(ctx: &ContextError) -> String {
    let label = ctx.context().find_map(|c| match c {
        StrContext::Label(l) => Some(*l),
        _ => None,
    });
    let expected: Vec<String> = ctx
        .context()
        .filter_map(|c| match c {
            StrContext::Expected(v) => Some(match v {
                StrContextValue::CharLiteral(c) => format!("`{c}`"),
                StrContextValue::StringLiteral(s) => format!("`{s}`"),
                StrContextValue::Description(d) => d.to_string(),
                _ => v.to_string(),
            }),
            _ => None,
        })
        .collect();
    let mut msg = String::from("syntax error");
    if let Some(l) = label {
        msg = format!("syntax error in {l}");
    }
    if !expected.is_empty() {
        msg.push_str(": expected ");
        msg.push_str(&expected.join(" or "));
    }
    msg
}

fn expected(what: &'static str) -> StrContext {
    StrContext::Expected(StrContextValue::Description(what))
}

fn label(what: &'static str) -> StrContext {
    StrContext::Label(what)
}

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------

/// Whitespace, `// line` and `/* block */` comments.
fn ws(i: &mut Input<'_>) -> PResult<()> {
    repeat(
        0..,
        alt((
            multispace1.void(),
            ("//", take_while(0.., |c| c != '\n')).void(),
            ("/*", cut_err(take_until(0.., "*/")), "*/").void(),
        )),
    )
    .parse_next(i)
}

fn ident_raw<'a>(i: &mut Input<'a>) -> PResult<Ident> {
    preceded(
        ws,
        (
            one_of(|c: char| c.is_ascii_alphabetic() || c == '_'),
            take_while(0.., |c: char| c.is_ascii_alphanumeric() || c == '_'),
        )
            .take()
            .with_span(),
    )
    .map(|(s, r): (&str, std::ops::Range<usize>)| Ident { name: s.to_string(), span: Span::new(r.start, r.end) })
    .parse_next(i)
}

fn ident(i: &mut Input<'_>) -> PResult<Ident> {
    ident_raw.context(expected("an identifier")).parse_next(i)
}

/// A keyword: an identifier that is exactly `word`.
fn kw<'a>(word: &'static str) -> impl FnMut(&mut Input<'a>) -> PResult<Span> {
    move |i: &mut Input<'a>| {
        ident_raw
            .verify(|id: &Ident| id.name == word)
            .map(|id| id.span)
            .context(StrContext::Expected(StrContextValue::StringLiteral(word)))
            .parse_next(i)
    }
}

/// Punctuation.
fn p<'a>(tok: &'static str) -> impl FnMut(&mut Input<'a>) -> PResult<Span> {
    move |i: &mut Input<'a>| {
        preceded(ws, tok.span())
            .map(|r| Span::new(r.start, r.end))
            .context(StrContext::Expected(StrContextValue::StringLiteral(tok)))
            .parse_next(i)
    }
}

fn integer(i: &mut Input<'_>) -> PResult<(i128, Span)> {
    preceded(
        ws,
        (
            opt('-'),
            alt((
                preceded(alt(("0x", "0X")), hex_digit1).try_map(|h: &str| i128::from_str_radix(h, 16)),
                digit1.try_map(|d: &str| d.parse::<i128>()),
            )),
            take_while(0.., |c: char| matches!(c, 'u' | 'U' | 'l' | 'L')),
        )
            .with_span(),
    )
    .map(|((neg, v, _), r)| (if neg.is_some() { -v } else { v }, Span::new(r.start, r.end)))
    .context(expected("an integer"))
    .parse_next(i)
}

fn string_lit(i: &mut Input<'_>) -> PResult<String> {
    preceded(
        ws,
        delimited(
            '"',
            repeat(
                0..,
                alt((
                    preceded(
                        '\\',
                        any.map(|c: char| match c {
                            'n' => '\n',
                            't' => '\t',
                            other => other,
                        }),
                    ),
                    any.verify(|c: &char| *c != '"' && *c != '\\' && *c != '\n'),
                )),
            ),
            cut_err('"').context(expected("the closing `\"`")),
        ),
    )
    .context(expected("a string literal"))
    .parse_next(i)
}

// ---------------------------------------------------------------------------------------------
// Items
// ---------------------------------------------------------------------------------------------

/// `@name(value)`.
fn attr(i: &mut Input<'_>) -> PResult<Attr> {
    let start = {
        ws.parse_next(i)?;
        i.current_token_start()
    };
    '@'.parse_next(i)?;
    let (name, (value, _)) =
        cut_err((ident, delimited(p("("), integer, p(")")))).context(label("`@` attribute")).parse_next(i)?;
    Ok(Attr { name, value, span: Span::new(start, i.previous_token_end()) })
}

fn item(i: &mut Input<'_>) -> PResult<Item> {
    let attrs: Vec<Attr> = repeat(0.., attr).parse_next(i)?;
    // Peek the leading word to pick the production, so errors inside one are reported there.
    let checkpoint = i.checkpoint();
    let first = ident.parse_next(i)?;
    let name = first.name.clone();
    let takes_attrs = matches!(name.as_str(), "api" | "retired" | "handle_kind")
        || !matches!(
            name.as_str(),
            "coverage_note"
                | "continuous_rc"
                | "instantaneous_rc"
                | "measured_rc"
                | "type"
                | "enum"
                | "errors"
                | "utility"
                | "alias"
        );
    if !attrs.is_empty() && !takes_attrs {
        return Err(ErrMode::Cut(
            ContextError::new().add_ctx(expected("`api`, `retired`, `handle_kind` or a function after `@` attributes")),
        ));
    }
    match name.as_str() {
        "coverage_note" => cut_err(terminated(string_lit, p(";")))
            .context(label("`coverage_note` declaration"))
            .map(Item::CoverageNote)
            .parse_next(i),
        "api" => cut_err(terminated(ident, p(";")))
            .context(label("`api` declaration"))
            .map(|name| Item::Api { name, attrs: attrs.clone() })
            .parse_next(i),
        "retired" => cut_err(terminated(ident, p(";")))
            .context(label("`retired` declaration"))
            .map(|name| Item::Retired { name, attrs: attrs.clone() })
            .parse_next(i),
        "handle_kind" => cut_err(terminated(ident, p(";")))
            .context(label("`handle_kind` declaration"))
            .map(|name| Item::HandleKind { name, attrs: attrs.clone() })
            .parse_next(i),
        "continuous_rc" | "instantaneous_rc" | "measured_rc" => {
            let kind = match name.as_str() {
                "continuous_rc" => ResourceKind::Continuous,
                "instantaneous_rc" => ResourceKind::Instantaneous,
                _ => ResourceKind::Measured,
            };
            cut_err(terminated((ident, opt(preceded(kw("exhausted"), delimited(p("("), ident, p(")"))))), p(";")))
                .context(label("resource declaration"))
                .map(|(name, exhausted)| Item::Resource { kind, name, exhausted })
                .parse_next(i)
        }
        "type" => cut_err(type_decl).context(label("`type` declaration")).parse_next(i),
        "enum" if peek_enum_def(i) => cut_err(enum_decl).context(label("`enum` declaration")).parse_next(i),
        "errors" => cut_err(errors_decl).context(label("`errors` table")).parse_next(i),
        "utility" => cut_err(utility_decl).context(label("`utility` declaration")).parse_next(i),
        "alias" => cut_err((
            ident,
            p("="),
            ident,
            opt(preceded(kw("per_thread_stream"), delimited(p("("), ident, p(")")))),
            p(";"),
        ))
        .context(label("`alias` declaration"))
        .map(|(name, _, target, per_thread_stream, _)| Item::Alias { name, target, per_thread_stream })
        .parse_next(i),
        _ => {
            i.reset(&checkpoint);
            let mut f = function.parse_next(i)?;
            f.attrs = attrs;
            Ok(Item::Function(f))
        }
    }
}

/// `enum X {` or `enum X : repr {` starts an enum definition; `enum X name` is a C type.
fn peek_enum_def(i: &mut Input<'_>) -> bool {
    let cp = i.checkpoint();
    let r = (ident, alt((p("{"), p(":")))).parse_next(i).is_ok();
    i.reset(&cp);
    r
}

fn type_decl(i: &mut Input<'_>) -> PResult<Item> {
    let name = delimited(p("("), ident, p(")")).parse_next(i)?;
    let descs = delimited(p("{"), repeat(0.., type_desc), p("}")).parse_next(i)?;
    Ok(Item::Type { name, descs })
}

fn type_desc(i: &mut Input<'_>) -> PResult<TypeDesc> {
    let word = ident.parse_next(i)?;
    let d = match word.name.as_str() {
        "handle" => TypeDesc::Handle(delimited(p("("), ident, p(")")).parse_next(i)?),
        "int_handle" => TypeDesc::IntHandle(delimited(p("("), ident, p(")")).parse_next(i)?),
        "enum" | "scalar" => TypeDesc::Scalar(delimited(p("("), ident, p(")")).parse_next(i)?),
        "pod" => {
            let (_, wire, _, (size, _), _) = (p("("), ident, p(","), integer, p(")")).parse_next(i)?;
            TypeDesc::Pod { wire, size: size as i64 }
        }
        "abi_struct" => TypeDesc::AbiStruct(delimited(p("("), ident, p(")")).parse_next(i)?),
        "struct" => TypeDesc::Struct,
        "return_code" => TypeDesc::ReturnCode(opt(delimited(p("("), ident, p(")"))).parse_next(i)?),
        "invalid_value" | "internal_error" | "no_device" | "session_lost" => {
            TypeDesc::Failure { reason: word.clone(), error: delimited(p("("), ident, p(")")).parse_next(i)? }
        }
        "success" => TypeDesc::Success(delimited(p("("), ident, p(")")).parse_next(i)?),
        "not_supported" => TypeDesc::NotSupported(delimited(p("("), ident, p(")")).parse_next(i)?),
        _ => {
            return Err(ErrMode::Cut(ContextError::new().add_ctx(expected(
                "a type descriptor (handle, int_handle, enum, pod, abi_struct, struct, return_code, success, not_supported, \
                 invalid_value, internal_error, no_device, session_lost)",
            ))));
        }
    };
    p(";").parse_next(i)?;
    Ok(d)
}

trait AddCtx {
    fn add_ctx(self, c: StrContext) -> Self;
}
impl AddCtx for ContextError {
    fn add_ctx(mut self, c: StrContext) -> Self {
        self.push(c);
        self
    }
}

fn enum_decl(i: &mut Input<'_>) -> PResult<Item> {
    let name = ident.parse_next(i)?;
    let repr = opt(preceded(p(":"), ident)).parse_next(i)?;
    let variants = delimited(
        p("{"),
        terminated(
            separated(0.., (ident, preceded(p("="), integer)).map(|(n, (v, _))| (n, v as i64)), p(",")),
            opt(p(",")),
        ),
        p("}"),
    )
    .parse_next(i)?;
    opt(p(";")).parse_next(i)?;
    Ok(Item::Enum { name, repr, variants })
}

fn errors_decl(i: &mut Input<'_>) -> PResult<Item> {
    let ty = ident.parse_next(i)?;
    let entries = delimited(p("{"), repeat(0.., error_entry), p("}")).parse_next(i)?;
    Ok(Item::Errors { ty, entries })
}

fn error_entry(i: &mut Input<'_>) -> PResult<ErrorEntry> {
    let name = ident.parse_next(i)?;
    let (_, (code, _), text) = cut_err((p("="), integer, string_lit)).parse_next(i)?;
    let abi_texts =
        repeat(0.., (kw("abi"), delimited(p("("), integer, p(")")), string_lit).map(|(_, (v, _), s)| (v as i64, s)))
            .parse_next(i)?;
    cut_err(p(";")).parse_next(i)?;
    Ok(ErrorEntry { name, code: code as i64, text, abi_texts })
}

fn utility_decl(i: &mut Input<'_>) -> PResult<Item> {
    let side = delimited(p("("), ident, p(")")).parse_next(i)?;
    let decl = terminated(prototype, p(";")).parse_next(i)?;
    Ok(Item::Utility { side, decl })
}

// ---------------------------------------------------------------------------------------------
// C declarations
// ---------------------------------------------------------------------------------------------

fn c_type(i: &mut Input<'_>) -> PResult<CType> {
    let start = {
        ws.parse_next(i)?;
        i.current_token_start()
    };
    let mut is_const = opt(kw("const")).parse_next(i)?.is_some();
    let base = base_type.parse_next(i)?;
    if opt(kw("const")).parse_next(i)?.is_some() {
        is_const = true;
    }
    let pointers: Vec<bool> = repeat(0.., preceded(p("*"), opt(kw("const")).map(|c| c.is_some()))).parse_next(i)?;
    let end = i.previous_token_end();
    Ok(CType { is_const, base, pointers, span: Span::new(start, end) })
}

fn base_type(i: &mut Input<'_>) -> PResult<BaseType> {
    let first = ident.context(expected("a C type")).parse_next(i)?;
    let t = match first.name.as_str() {
        "void" => BaseType::Void,
        "bool" => BaseType::Bool,
        "char" => BaseType::Char,
        "short" => BaseType::Short,
        "float" => BaseType::Float,
        "double" => BaseType::Double,
        "size_t" => BaseType::SizeT,
        "int" => BaseType::Int,
        "long" => {
            if opt(kw("long")).parse_next(i)?.is_some() {
                opt(kw("int")).parse_next(i)?;
                BaseType::LongLong
            } else {
                opt(kw("int")).parse_next(i)?;
                BaseType::Long
            }
        }
        "signed" => {
            if opt(kw("char")).parse_next(i)?.is_some() {
                BaseType::SignedChar
            } else {
                opt(kw("int")).parse_next(i)?;
                BaseType::Int
            }
        }
        "unsigned" => {
            if opt(kw("char")).parse_next(i)?.is_some() {
                BaseType::UnsignedChar
            } else if opt(kw("short")).parse_next(i)?.is_some() {
                BaseType::UnsignedShort
            } else if opt(kw("long")).parse_next(i)?.is_some() {
                if opt(kw("long")).parse_next(i)?.is_some() {
                    opt(kw("int")).parse_next(i)?;
                    BaseType::UnsignedLongLong
                } else {
                    opt(kw("int")).parse_next(i)?;
                    BaseType::UnsignedLong
                }
            } else {
                opt(kw("int")).parse_next(i)?;
                BaseType::UnsignedInt
            }
        }
        "struct" | "enum" => BaseType::Named(ident.parse_next(i)?.name),
        _ => BaseType::Named(first.name),
    };
    Ok(t)
}

fn param(i: &mut Input<'_>) -> PResult<Param> {
    let ty = c_type.parse_next(i)?;
    let name = ident.context(expected("a parameter name")).parse_next(i)?;
    Ok(Param { ty, name })
}

fn params(i: &mut Input<'_>) -> PResult<Vec<Param>> {
    delimited(
        p("("),
        alt((
            // `(void)` and `()` both mean no parameters.
            (kw("void"), winnow::combinator::peek(p(")"))).map(|_| Vec::new()),
            separated(0.., param, p(",")),
        )),
        cut_err(p(")")),
    )
    .parse_next(i)
}

fn prototype(i: &mut Input<'_>) -> PResult<Prototype> {
    let ret = c_type.parse_next(i)?;
    let name = ident.context(expected("a function name")).parse_next(i)?;
    let params = cut_err(params).context(label("parameter list")).parse_next(i)?;
    Ok(Prototype { ret, name, params })
}

fn function(i: &mut Input<'_>) -> PResult<FunctionDecl> {
    ws.parse_next(i)?;
    let start = i.current_token_start();
    let proto = prototype.parse_next(i)?;
    let body = cut_err(alt((delimited(p("{"), repeat(0.., fn_desc), p("}")), p(";").map(|_| Vec::new()))))
        .context(label("function body"))
        .parse_next(i)?;
    let end = i.previous_token_end();
    Ok(FunctionDecl { attrs: Vec::new(), proto, body, span: Span::new(start, end) })
}

// ---------------------------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------------------------

fn fn_desc(i: &mut Input<'_>) -> PResult<FnDesc> {
    let word = ident.context(expected("a function descriptor")).parse_next(i)?;
    let d = match word.name.as_str() {
        "success" => FnDesc::Success(cut_err(delimited(p("("), expr, p(")"))).parse_next(i)?),
        "allocates_rc" | "deallocates_rc" | "consumes_rc" => {
            let (_, resource, _, amount, _) = cut_err((p("("), ident, p(","), amount, p(")"))).parse_next(i)?;
            FnDesc::Resource { op: word, resource, amount }
        }
        "contextual_argument" => {
            let (ty, name, _, value) = cut_err((c_type, ident, p("="), expr)).parse_next(i)?;
            FnDesc::Contextual { ty, name, value }
        }
        "precondition" => {
            let (_, cond, _, error, _) = cut_err((p("("), expr, p(","), ident, p(")"))).parse_next(i)?;
            FnDesc::Precondition { cond, error }
        }
        "implemented_by" => FnDesc::ImplementedBy(cut_err(delimited(p("("), ident, p(")"))).parse_next(i)?),
        "on_success" => FnDesc::OnSuccess(cut_err(delimited(p("("), ident, p(")"))).parse_next(i)?),
        "fast_path" => FnDesc::FastPath(cut_err(delimited(p("("), ident, p(")"))).parse_next(i)?),
        "async_when_live" => {
            let names = cut_err(delimited(p("("), separated(1.., ident, p(",")), p(")"))).parse_next(i)?;
            FnDesc::AsyncWhenLive(names, word.span)
        }
        "argument" => {
            let name = cut_err(delimited(p("("), ident, p(")"))).parse_next(i)?;
            let descs = cut_err(delimited(p("{"), repeat(0.., val_desc), p("}")))
                .context(label("argument block"))
                .parse_next(i)?;
            return Ok(FnDesc::Argument { name, descs });
        }
        "if" => {
            let cond = cut_err(delimited(p("("), expr, p(")"))).parse_next(i)?;
            let then = cut_err(delimited(p("{"), repeat(0.., fn_desc), p("}"))).parse_next(i)?;
            let els = opt(preceded(kw("else"), cut_err(else_fn))).parse_next(i)?.unwrap_or_default();
            return Ok(FnDesc::If { cond, then, els });
        }
        _ => FnDesc::Flag(word),
    };
    cut_err(p(";")).parse_next(i)?;
    Ok(d)
}

fn else_fn(i: &mut Input<'_>) -> PResult<Vec<FnDesc>> {
    alt((
        delimited(p("{"), repeat(0.., fn_desc), p("}")),
        // `else if (...)` chains: parse the nested `if` as the one descriptor of the else block.
        (|i: &mut Input<'_>| {
            let cp = i.checkpoint();
            kw("if").parse_next(i)?;
            i.reset(&cp);
            fn_desc.parse_next(i)
        })
        .map(|d| vec![d]),
    ))
    .parse_next(i)
}

fn amount(i: &mut Input<'_>) -> PResult<Amount> {
    alt((kw("reported").map(Amount::Reported), kw("measured").map(Amount::Measured), expr.map(Amount::Expr)))
        .parse_next(i)
}

fn val_desc(i: &mut Input<'_>) -> PResult<ValDesc> {
    let word = ident.context(expected("a value descriptor")).parse_next(i)?;
    let span = word.span;
    let d = match word.name.as_str() {
        "buffer" => ValDesc::Buffer(cut_err(delimited(p("("), expr, p(")"))).parse_next(i)?, span),
        "device_pointer" => ValDesc::DevicePointer(opt(delimited(p("("), expr, p(")"))).parse_next(i)?, span),
        "obj_depends_on" => ValDesc::DependsOn(cut_err(delimited(p("("), ident, p(")"))).parse_next(i)?),
        "element" => {
            let descs = cut_err(delimited(p("{"), repeat(0.., val_desc), p("}")))
                .context(label("element block"))
                .parse_next(i)?;
            return Ok(ValDesc::Element(descs, span));
        }
        "if" => {
            let cond = cut_err(delimited(p("("), expr, p(")"))).parse_next(i)?;
            let then = cut_err(delimited(p("{"), repeat(0.., val_desc), p("}"))).parse_next(i)?;
            let els = opt(preceded(kw("else"), cut_err(else_val))).parse_next(i)?.unwrap_or_default();
            return Ok(ValDesc::If { cond, then, els, span });
        }
        _ => ValDesc::Flag(word),
    };
    cut_err(p(";")).parse_next(i)?;
    Ok(d)
}

fn else_val(i: &mut Input<'_>) -> PResult<Vec<ValDesc>> {
    alt((
        delimited(p("{"), repeat(0.., val_desc), p("}")),
        (|i: &mut Input<'_>| {
            let cp = i.checkpoint();
            kw("if").parse_next(i)?;
            i.reset(&cp);
            val_desc.parse_next(i)
        })
        .map(|d| vec![d]),
    ))
    .parse_next(i)
}

// ---------------------------------------------------------------------------------------------
// Expressions: precedence climbing over C's binary operators.
// ---------------------------------------------------------------------------------------------

fn expr(i: &mut Input<'_>) -> PResult<Expr> {
    binary(i, 0)
}

const LEVELS: &[&[BinOp]] = &[
    &[BinOp::Or],
    &[BinOp::And],
    &[BinOp::BitOr],
    &[BinOp::BitXor],
    &[BinOp::BitAnd],
    &[BinOp::Eq, BinOp::Ne],
    &[BinOp::Lt, BinOp::Le, BinOp::Gt, BinOp::Ge],
    &[BinOp::Shl, BinOp::Shr],
    &[BinOp::Add, BinOp::Sub],
    &[BinOp::Mul, BinOp::Div, BinOp::Rem],
];

/// The longest binary operator at the start of `rest` (so `<` never eats `<<` or `<=`).
fn operator_at(rest: &str) -> Option<BinOp> {
    const OPS: &[BinOp] = &[
        BinOp::Or,
        BinOp::And,
        BinOp::Eq,
        BinOp::Ne,
        BinOp::Le,
        BinOp::Ge,
        BinOp::Shl,
        BinOp::Shr,
        BinOp::BitOr,
        BinOp::BitXor,
        BinOp::BitAnd,
        BinOp::Lt,
        BinOp::Gt,
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Rem,
    ];
    OPS.iter().copied().find(|op| rest.starts_with(op.symbol()))
}

fn binary(i: &mut Input<'_>, level: usize) -> PResult<Expr> {
    if level == LEVELS.len() {
        return unary(i);
    }
    let mut lhs = binary(i, level + 1)?;
    loop {
        let cp = i.checkpoint();
        ws.parse_next(i)?;
        let rest: &str = i.as_ref();
        match operator_at(rest).filter(|op| LEVELS[level].contains(op)) {
            Some(op) => {
                let _ = winnow::token::take(op.symbol().len()).parse_next(i)?;
                let rhs =
                    cut_err(|i: &mut Input<'_>| binary(i, level + 1)).context(expected("an operand")).parse_next(i)?;
                let span = Span::new(lhs.span().start, rhs.span().end);
                lhs = Expr::Binary(op, Box::new(lhs), Box::new(rhs), span);
            }
            None => {
                i.reset(&cp);
                return Ok(lhs);
            }
        }
    }
}

fn unary(i: &mut Input<'_>) -> PResult<Expr> {
    ws.parse_next(i)?;
    let start = i.current_token_start();
    let op = opt(alt(("!".value(UnOp::Not), "~".value(UnOp::BitNot), "-".value(UnOp::Neg)))).parse_next(i)?;
    match op {
        Some(op) => {
            let e = unary(i)?;
            let span = Span::new(start, e.span().end);
            Ok(Expr::Unary(op, Box::new(e), span))
        }
        None => primary(i),
    }
}

fn primary(i: &mut Input<'_>) -> PResult<Expr> {
    ws.parse_next(i)?;
    let start = i.current_token_start();
    let rest: &str = i.as_ref();
    if rest.starts_with('(') {
        return delimited(p("("), expr, cut_err(p(")"))).parse_next(i);
    }
    if rest.starts_with(|c: char| c.is_ascii_digit()) {
        let (v, span) = integer.parse_next(i)?;
        return Ok(Expr::Int(v, span));
    }
    let name = ident.context(expected("an expression")).parse_next(i)?;
    if name.name == "sizeof" {
        let ty = cut_err(delimited(p("("), c_type, p(")"))).parse_next(i)?;
        return Ok(Expr::SizeOf(ty, Span::new(start, i.previous_token_end())));
    }
    let cp = i.checkpoint();
    if p("(").parse_next(i).is_ok() {
        let args = separated(0.., expr, p(",")).parse_next(i)?;
        cut_err(p(")")).parse_next(i)?;
        return Ok(Expr::Call(name, args, Span::new(start, i.previous_token_end())));
    }
    i.reset(&cp);
    Ok(Expr::Name(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_fn(src: &str) -> FunctionDecl {
        match parse_spec(src).unwrap().items.remove(0) {
            Item::Function(f) => f,
            other => panic!("not a function: {other:?}"),
        }
    }

    #[test]
    fn parses_types_and_pointers() {
        let f = one_fn(
            "cudaError_t cudaMemcpy(void *dst, const void * const src, unsigned long long n, enum cudaMemcpyKind kind);",
        );
        assert_eq!(f.proto.name.name, "cudaMemcpy");
        assert_eq!(f.proto.params.len(), 4);
        assert_eq!(f.proto.params[0].ty.pointers, vec![false]);
        assert!(f.proto.params[1].ty.is_const);
        assert_eq!(f.proto.params[1].ty.pointers, vec![true]);
        assert_eq!(f.proto.params[2].ty.base, BaseType::UnsignedLongLong);
        assert_eq!(f.proto.params[3].ty.base, BaseType::Named("cudaMemcpyKind".into()));
    }

    #[test]
    fn void_parameter_list() {
        let f = one_fn("cudaError_t cudaDeviceSynchronize(void) { sync; }");
        assert!(f.proto.params.is_empty());
        assert_eq!(f.body.len(), 1);
    }

    #[test]
    fn parses_descriptors_and_conditionals() {
        let f = one_fn(
            r#"
            cudaError_t f(void *dst, size_t count, int kind) {
                async; success(cudaSuccess);
                allocates_rc(device_memory, count * 2);
                deallocates_rc(device_memory, reported);
                argument(dst) {
                    if (kind == 2 || kind == 0) { out; buffer(count); }
                    else if (kind == 3) { device_pointer(count); }
                    else { in; buffer(count); }
                }
            }"#,
        );
        assert_eq!(f.body.len(), 5);
        match &f.body[4] {
            FnDesc::Argument { name, descs } => {
                assert_eq!(name.name, "dst");
                match &descs[0] {
                    ValDesc::If { els, .. } => assert!(matches!(els[0], ValDesc::If { .. })),
                    d => panic!("{d:?}"),
                }
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn expression_precedence() {
        let f = one_fn("int f(int a) { precondition(a + 2 * 3 == 8 && !(a < 0), e); }");
        let FnDesc::Precondition { cond, .. } = &f.body[0] else { panic!() };
        let Expr::Binary(BinOp::And, lhs, _, _) = cond else { panic!("{cond:?}") };
        let Expr::Binary(BinOp::Eq, sum, _, _) = &**lhs else { panic!() };
        let Expr::Binary(BinOp::Add, _, prod, _) = &**sum else { panic!() };
        assert!(matches!(**prod, Expr::Binary(BinOp::Mul, ..)));
    }

    #[test]
    fn shifts_and_comparisons() {
        let f = one_fn("int f(int a) { precondition((1 << a) <= 64 && a >= 0, e); }");
        let FnDesc::Precondition { cond, .. } = &f.body[0] else { panic!() };
        let Expr::Binary(BinOp::And, lhs, rhs, _) = cond else { panic!("{cond:?}") };
        assert!(matches!(**lhs, Expr::Binary(BinOp::Le, ..)));
        assert!(matches!(**rhs, Expr::Binary(BinOp::Ge, ..)));
    }

    #[test]
    fn top_level_items() {
        let spec = parse_spec(
            r#"
            // resources
            api cudart;
            continuous_rc device_memory; /* block
               comment */
            instantaneous_rc kernel_launches;
            type(cudaStream_t) { handle(stream); }
            type(dim3) { pod(Dim3, 12); }
            enum cudaMemcpyKind : i32 { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, };
            errors cudaError_t {
                cudaSuccess = 0 "no error";
                cudaErrorX = 27 "new text" abi(11) "old text";
            }
            utility(guest) size_t symbol_size(const void *symbol);
            alias cudaGetDeviceProperties_v2 = cudaGetDeviceProperties;
            "#,
        )
        .unwrap();
        assert_eq!(spec.items.len(), 9);
        let Item::Errors { entries, .. } = &spec.items[6] else { panic!() };
        assert_eq!(entries[1].abi_texts, vec![(11, "old text".to_string())]);
        let Item::Enum { variants, .. } = &spec.items[5] else { panic!() };
        assert_eq!(variants.len(), 2);
    }

    #[test]
    fn error_points_at_the_line() {
        let src = "api cudart;\n\ncudaError_t f(int a) {\n  argument(a) { in }\n}\n";
        let err = parse_spec(src).unwrap_err();
        let (line, _) = crate::diag::line_col(src, err.span.start);
        assert_eq!(line, 4, "{err:?}");
    }

    #[test]
    fn unterminated_comment_is_an_error() {
        assert!(parse_spec("api x; /* never closed").is_err());
    }
}
