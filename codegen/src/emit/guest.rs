//! The guest emitter, per API: one `extern "C"` export per spec function (and alias), plus the
//! trait `HandWritten` that lists every piece the guest library must write by hand (functions
//! `implemented_by(guest)`, utilities, ABI struct writers, hooks). The generated code is
//! included as the `stubs` module of the API's module in the guest library, whose `rt` (the
//! calls through the guest core, how a status is recorded) and `hand::Hand` (the
//! implementation) it expects as siblings: `super::rt`, `super::hand::Hand`.

use std::collections::BTreeSet;

use super::{Names, W, error_const, expr, header, is_bool, narrow};
use crate::ast::{BaseType, CType};
use crate::model::*;

const P: &str = "::phos_protocol";

pub fn emit(api: &Api) -> String {
    let mut w = W::default();
    w.line("#[allow(unused_imports)]");
    w.line(format!("use {P}::{} as wire;", api.name));
    w.line("#[allow(unused_imports)]");
    w.line(format!("use {P}::Ptr;"));
    w.line("use super::rt;");
    w.line(format!("/// The `{}` API's status.", api.name));
    w.line(format!("pub type Status = wire::{};", api.errors.rust_type));
    w.line("");
    hand_trait(&mut w, api);
    for f in &api.functions {
        if f.internal {
            continue;
        }
        match f.exec {
            Exec::Remote => remote_stub(&mut w, api, f),
            Exec::Guest => guest_stub(&mut w, api, f),
            Exec::Unsupported => unsupported_stub(&mut w, api, f, &f.name),
        }
        for alias in &f.aliases {
            alias_stub(&mut w, api, f, alias, false);
        }
        for alias in &f.per_thread_aliases {
            alias_stub(&mut w, api, f, alias, true);
        }
    }
    let mut out = header("guest", api);
    out.push_str(&w.finish());
    out
}

/// Rust keywords that C parameter names may collide with.
pub(crate) fn rust_ident(name: &str) -> String {
    const KW: &[&str] = &[
        "type", "ref", "fn", "match", "move", "mut", "impl", "loop", "mod", "self", "struct", "trait", "use", "where",
        "box", "dyn", "async", "await", "crate", "super", "static", "extern", "in", "as", "gen",
    ];
    if KW.contains(&name) { format!("r#{name}") } else { name.to_string() }
}

/// The Rust FFI type of a C type as the guest export sees it.
pub(crate) fn ffi_type(api: &Api, t: &CType) -> String {
    let mut base = match &t.base {
        BaseType::Void => {
            if t.pointers.is_empty() {
                return "()".into();
            }
            "::std::ffi::c_void".to_string()
        }
        BaseType::Bool => "bool".into(),
        BaseType::Char | BaseType::SignedChar => "::std::ffi::c_char".into(),
        BaseType::UnsignedChar => "u8".into(),
        BaseType::Short => "i16".into(),
        BaseType::UnsignedShort => "u16".into(),
        BaseType::Int => "i32".into(),
        BaseType::UnsignedInt => "u32".into(),
        BaseType::Long | BaseType::LongLong => "i64".into(),
        BaseType::UnsignedLong | BaseType::UnsignedLongLong => "u64".into(),
        BaseType::SizeT => "usize".into(),
        BaseType::Float => "f32".into(),
        BaseType::Double => "f64".into(),
        BaseType::Named(n) => match api.types.get(n).map(|t| &t.kind) {
            Some(TypeKind::Scalar(s)) => s.rust().into(),
            Some(TypeKind::Handle(_)) if api.types[n].int_handle => "i32".into(),
            Some(TypeKind::Handle(_)) => "*mut ::std::ffi::c_void".into(),
            Some(TypeKind::Pod { wire, .. }) => format!("{P}::types::{wire}"),
            Some(TypeKind::AbiStruct(_)) | Some(TypeKind::Struct) | None => "::std::ffi::c_void".into(),
        },
    };
    let mut pointee_const = t.is_const;
    for &level_const in &t.pointers {
        base = format!("{} {base}", if pointee_const { "*const" } else { "*mut" });
        pointee_const = level_const;
    }
    base
}

fn params_sig(api: &Api, f: &Function) -> String {
    f.params
        .iter()
        .map(|p| format!("{}: {}", rust_ident(&p.name.name), ffi_type(api, &p.ty)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ret_sig(api: &Api, f: &Function) -> String {
    let r = ffi_type(api, &f.ret);
    if r == "()" { String::new() } else { format!(" -> {r}") }
}

fn hand_trait(w: &mut W, api: &Api) {
    w.line("/// Everything the guest library implements by hand, as the spec names it.");
    w.line("#[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]");
    w.open("pub trait HandWritten {");
    for f in api.functions.iter().filter(|f| f.exec == Exec::Guest) {
        w.line(format!("/// `{}` (spec line {}).", f.name, f.line));
        w.line(format!("unsafe fn {}({}){};", f.name, params_sig(api, f), ret_sig(api, f)));
    }
    for u in &api.utilities {
        let params: Vec<String> =
            u.params.iter().map(|p| format!("{}: {}", rust_ident(&p.name.name), util_ty(&p.ty))).collect();
        w.line(format!("/// Utility `{}` used by spec expressions.", u.name));
        w.line(format!("fn {}({}) -> Result<{}, Status>;", u.name, params.join(", "), util_ty(&u.ret)));
    }
    let mut abi = BTreeSet::new();
    for t in api.types.values() {
        if let TypeKind::AbiStruct(wire) = &t.kind {
            abi.insert((t.name.clone(), wire.clone()));
        }
    }
    for (c, wire) in abi {
        w.line(format!("/// Write a `{c}` in the layout this entry point has under the CUDA ABI this process loaded."));
        w.line(format!("unsafe fn write_{c}(dst: *mut ::std::ffi::c_void, value: &{P}::types::{wire});"));
    }
    for f in api.functions.iter().filter(|f| f.fast_path.is_some()) {
        let h = f.fast_path.as_deref().expect("filtered");
        w.line(format!("/// Tried before `{}` is marshalled (`fast_path({h})`): `Some` answers the call,", f.name));
        w.line("/// `None` leaves it to the generated path.");
        w.line(format!("unsafe fn {h}({}) -> Option<Result<(), Status>>;", params_sig(api, f)));
    }
    let hooks: BTreeSet<&str> = api.functions.iter().filter_map(|f| f.on_success.as_deref()).collect();
    for h in hooks {
        w.line(format!("/// Hook run after a successful call (`on_success({h})`)."));
        w.line(format!("fn {h}();"));
    }
    w.close("}");
    w.line("");
}

fn util_ty(t: &CType) -> &'static str {
    if matches!(t.base, BaseType::Bool) && !t.is_pointer() { "bool" } else { "i128" }
}

fn export_attrs(w: &mut W) {
    w.line("#[unsafe(no_mangle)]");
    w.line("#[allow(non_snake_case, unused_variables, unused_mut, unused_parens, clippy::missing_safety_doc, clippy::too_many_arguments, clippy::unnecessary_cast, clippy::nonminimal_bool, clippy::needless_late_init, clippy::useless_conversion)]");
}

fn guest_stub(w: &mut W, api: &Api, f: &Function) {
    w.line(format!("/// `{}`: implemented by hand in the guest library (spec line {}).", f.name, f.line));
    export_attrs(w);
    w.open(format!("pub unsafe extern \"C\" fn {}({}){} {{", f.name, params_sig(api, f), ret_sig(api, f)));
    let args: Vec<String> = f.params.iter().map(|p| rust_ident(&p.name.name)).collect();
    w.line(format!("// SAFETY: the export's own arguments, unchanged: the hand-written `{}` has the", f.name));
    w.line("// export's contract with its caller.");
    let call = format!("unsafe {{ <super::hand::Hand as HandWritten>::{}({}) }}", f.name, args.join(", "));
    // The functions that answer the thread's last error report an earlier call's refusal,
    // which that call named: naming them would blame the wrong function.
    let reports_earlier_errors = ["cudaGetLastError", "cudaPeekAtLastError"].contains(&f.name.as_str());
    if matches!(&f.ret.base, BaseType::Named(n) if *n == api.errors.ty)
        && !f.ret.is_pointer()
        && !reports_earlier_errors
    {
        // Every refusal names its function: a hand-written refusal is logged here, once.
        w.line(format!("let status = {call};"));
        w.open("if status == wire::NOT_SUPPORTED.0 {");
        w.line(format!(
            "crate::runtime::log_refusal_once({P}::apis::Function::{}(wire::FunctionId::{}), wire::NOT_SUPPORTED.name());",
            api.type_name(),
            f.type_name()
        ));
        w.close("}");
        w.line("status");
    } else {
        w.line(call);
    }
    w.close("}");
    w.line("");
}

/// The export of an unsupported function takes no parameters: it reads none, and under the C
/// calling conventions of the targets Phos builds for (x86-64 System V, AArch64) a callee may
/// ignore arguments the caller passed. It returns the status type, so no hidden result
/// pointer is involved. Its parameter types therefore need no declaration in the spec.
fn unsupported_stub(w: &mut W, api: &Api, f: &Function, export: &str) {
    w.line(format!("/// `{export}`: not supported; answers the not-supported error (spec line {}).", f.line));
    export_attrs(w);
    w.open(format!("pub unsafe extern \"C\" fn {export}(){} {{", ret_sig(api, f)));
    w.line(format!("rt::unsupported(wire::FunctionId::{})", f.type_name()));
    w.close("}");
    w.line("");
}

fn alias_stub(w: &mut W, api: &Api, f: &Function, alias: &str, per_thread: bool) {
    if f.exec == Exec::Unsupported {
        return unsupported_stub(w, api, f, alias);
    }
    if per_thread {
        w.line(format!("/// `{alias}`: `{}` where a null stream is the calling thread's default stream.", f.name));
    } else {
        w.line(format!("/// `{alias}`: another name of `{}`.", f.name));
    }
    export_attrs(w);
    w.open(format!("pub unsafe extern \"C\" fn {alias}({}){} {{", params_sig(api, f), ret_sig(api, f)));
    if per_thread {
        let constant = f.per_thread_stream.as_deref().expect("checked: a per-thread alias names its constant");
        let per_thread_value = api.constants.get(constant).copied().expect("checked: a constant");
        for p in f.params.iter().filter(|p| is_stream(api, &p.ty)) {
            let id = rust_ident(&p.name.name);
            w.line(format!(
                "let {id} = if {id}.is_null() {{ {per_thread_value}usize as *mut ::std::ffi::c_void }} else {{ {id} }};"
            ));
        }
    }
    let args: Vec<String> = f.params.iter().map(|p| rust_ident(&p.name.name)).collect();
    let changed = if per_thread { " (a null stream made the per-thread one, a value, not a pointer)" } else { "" };
    w.line(format!("// SAFETY: `{alias}` is `{}` under another name: the same arguments{changed},", f.name));
    w.line("// under the same contract with the caller.");
    w.line(format!("unsafe {{ {}({}) }}", f.name, args.join(", ")));
    w.close("}");
    w.line("");
}

/// The SAFETY comment of reading `n` bytes of input at the parameter `id`.
fn in_bytes_safety(w: &mut W, id: &str, n: &str, null_ok: bool, line: usize) {
    let null = if null_ok { "null (read as no bytes) or points to" } else { "null (refused) or points to" };
    w.line(format!("// SAFETY: `{id}` is {null} `{n}` readable bytes, the extent spec line {line} gives it: what the"));
    w.line("// API asks of its caller (a bad pointer faults as it would in the vendor's library).");
}

/// Copying a reply's bytes out through the parameter `id`: the SAFETY comment and the
/// statement.
fn copy_out(id: &str, src: &str, data: &str, n: &str, line: usize) -> String {
    format!(
        "// SAFETY: `{id}` points to `{n}` writable bytes, the extent spec line {line} gives it (what the API asks of its caller; copied only when not null).\nunsafe {{ rt::copy_out({src} as *mut u8, {data}, {n}) }}?;"
    )
}

/// A by-value parameter that is a handle of kind `stream`.
pub(crate) fn is_stream(api: &Api, t: &CType) -> bool {
    !t.is_pointer()
        && matches!(&t.base, BaseType::Named(n) if matches!(api.types.get(n).map(|t| &t.kind), Some(TypeKind::Handle(k)) if k == "stream"))
}

/// Names in guest expressions: parameters are the FFI arguments, contextual arguments are
/// locals computed before.
struct GuestNames<'a> {
    api: &'a Api,
}

impl Names for GuestNames<'_> {
    fn arg(&self, a: &Arg) -> String {
        let id = rust_ident(&a.name);
        if a.contextual.is_some() {
            return format!("c_{}", a.name);
        }
        if is_bool(a) {
            return id;
        }
        if a.ty.is_pointer() || (is_handle(self.api, &a.ty) && int_handle_kind(self.api, &a.ty).is_none()) {
            return format!("({id} as usize as i128)");
        }
        format!("({id} as i128)")
    }

    fn call(&self, utility: &str, args: &[String]) -> String {
        format!("<super::hand::Hand as HandWritten>::{utility}({})?", args.join(", "))
    }
}

/// The handle kind of `t` (or of what `t` points to) when the C API passes it as an `int`.
pub(crate) fn int_handle_kind<'a>(api: &'a Api, t: &CType) -> Option<&'a str> {
    let BaseType::Named(n) = &t.base else { return None };
    match api.types.get(n) {
        Some(NamedType { kind: TypeKind::Handle(k), int_handle: true, .. }) => Some(k),
        _ => None,
    }
}

/// The wire's handle for an `int` handle `value` of `kind` (its number, under the kind's tag).
fn int_handle_to_wire(kind: &str, value: &str) -> String {
    format!("{P}::handle_tag::wire_of_int({P}::apis::HandleKind::{}, {value})", camel(kind))
}

fn is_handle(api: &Api, t: &CType) -> bool {
    !t.is_pointer()
        && matches!(&t.base, BaseType::Named(n) if matches!(api.types.get(n).map(|t| &t.kind), Some(TypeKind::Handle(_))))
}

fn remote_stub(w: &mut W, api: &Api, f: &Function) {
    let names = GuestNames { api };
    let invalid = format!("Status::{}", error_const(api, &api.errors.failures.invalid_value));
    let t = f.type_name();
    w.line(format!("/// `{}`: marshalled to the API server (spec line {}).", f.name, f.line));
    export_attrs(w);
    w.open(format!("pub unsafe extern \"C\" fn {}({}){} {{", f.name, params_sig(api, f), ret_sig(api, f)));
    w.open(format!("rt::api_call(wire::FunctionId::{t}, move || -> Result<(), Status> {{"));
    // Each unsafe operation below is a block of its own, after a SAFETY comment that says
    // which of the API's promises to its caller makes it sound for this argument.
    let line = f.line;

    // Contextual arguments, in order.
    for a in f.args.iter().filter(|a| a.contextual.is_some()) {
        let value = expr(a.contextual.as_ref().unwrap(), api, f, &names);
        let ty = if is_bool(a) { "bool" } else { "i128" };
        w.line(format!("let c_{}: {ty} = {value};", a.name));
    }
    // Preconditions.
    for p in &f.preconditions {
        let c = expr(&p.cond, api, f, &names);
        w.open(format!("if !{c} {{"));
        w.line(format!("return Err(Status::{});", error_const(api, &p.error)));
        w.close("}");
    }
    // A destroyed handle is no longer proven, from before the call is sent: no call of
    // another thread goes without waiting on it after (`async_when_live`).
    if api.functions.iter().any(|g| !g.async_when_live.is_empty()) {
        for (name, _) in &f.objects.destroys {
            let Some(a) = f.arg(name).filter(|a| a.contextual.is_none()) else { continue };
            let ArgClass::Value(ValueType::Handle(k)) = &a.class else { continue };
            let id = rust_ident(name);
            let value = if int_handle_kind(api, &a.ty).is_some() {
                int_handle_to_wire(k, &id)
            } else {
                format!("{id} as usize as u64")
            };
            w.line(format!("rt::forget_live({value});"));
        }
    }
    if let Some(h) = &f.fast_path {
        let args: Vec<String> = f.params.iter().map(|p| rust_ident(&p.name.name)).collect();
        w.line(format!("// SAFETY: the export's own arguments, unchanged: `{h}` (`fast_path`, spec line {line}) has"));
        w.line("// the export's contract with its caller.");
        w.open(format!(
            "if let Some(r) = unsafe {{ <super::hand::Hand as HandWritten>::{h}({}) }} {{",
            args.join(", ")
        ));
        w.line("return r;");
        w.close("}");
    }
    // Build the request.
    let mut fields: Vec<String> = Vec::new();
    let mut outs: Vec<String> = Vec::new();
    for a in &f.args {
        let id = rust_ident(&a.name);
        let src = if a.contextual.is_some() { format!("c_{}", a.name) } else { id.clone() };
        match &a.class {
            ArgClass::Local => {}
            ArgClass::Value(v) => {
                let value = match (v, a.contextual.is_some()) {
                    (ValueType::Scalar(Scalar::Bool), _) => src.clone(),
                    (ValueType::Scalar(s), true) => narrow(P, &src, s.rust()),
                    (ValueType::Handle(_), true) => narrow(P, &src, "u64"),
                    (ValueType::Scalar(s), false) => format!("{src} as {}", s.rust()),
                    (ValueType::Handle(k), false) if int_handle_kind(api, &a.ty).is_some() => {
                        int_handle_to_wire(k, &src)
                    }
                    (ValueType::Handle(_), false) => format!("{src} as usize as u64"),
                    (ValueType::Pod(_), _) => src.clone(),
                };
                fields.push(format!("{id}: {value}"));
            }
            ArgClass::Pointer(branches) if branches.len() == 1 => {
                let shape = &branches[0].shape;
                let addr =
                    if a.contextual.is_some() { narrow(P, &src, "u64") } else { format!("{src} as usize as u64") };
                match shape {
                    Shape::Device { .. } | Shape::Opaque => fields.push(format!("{id}: {addr}")),
                    Shape::Str => {
                        w.line(format!("// SAFETY: `{id}` is null (refused) or a NUL-terminated string: what the API"));
                        w.line(format!("// asks of its caller for this argument (a string, spec line {line})."));
                        w.line(format!(
                            "let s_{}: &str = unsafe {{ rt::c_str({src} as *const ::std::ffi::c_char) }}?;",
                            a.name
                        ));
                        fields.push(format!("{id}: s_{}", a.name));
                    }
                    Shape::In { count, elem_size, null_ok } | Shape::InOut { count, elem_size, null_ok } => {
                        let n = expr(count, api, f, &names);
                        let n_id = format!("n_{}", a.name);
                        w.line(format!("let {n_id}: usize = rt::byte_len({n}, {elem_size})?;"));
                        in_bytes_safety(w, &id, &n_id, *null_ok, line);
                        w.line(format!(
                            "let b_{}: &[u8] = unsafe {{ rt::in_bytes({src} as *const u8, {n_id}, {null_ok}) }}?;",
                            a.name
                        ));
                        fields.push(format!("{id}: b_{}", a.name));
                        if matches!(shape, Shape::InOut { .. }) {
                            outs.push(copy_out(&id, &src, &format!("Some(&reply.{id})"), &n_id, line));
                        }
                    }
                    Shape::Out { count, elem_size, null_ok } => {
                        let n = expr(count, api, f, &names);
                        let n_id = format!("n_{}", a.name);
                        w.line(format!("let {n_id}: usize = rt::byte_len({n}, {elem_size})?;"));
                        w.line(format!("rt::check_out({src} as *mut u8, {n_id}, {null_ok})?;"));
                        outs.push(copy_out(&id, &src, &format!("Some(&reply.{id})"), &n_id, line));
                    }
                    Shape::InElement(elem) => {
                        w.open(format!("if {src}.is_null() {{"));
                        w.line(format!("return Err({invalid});"));
                        w.close("}");
                        let pointee = ffi_type(api, &a.ty.pointee());
                        w.line(format!(
                            "// SAFETY: `{id}` is not null (just checked) and points to a `{pointee}`, as the"
                        ));
                        w.line(format!("// API asks of its caller (spec line {line})."));
                        w.line(format!("let e_{}: {pointee} = unsafe {{ *{src} }};", a.name));
                        let e = format!("e_{}", a.name);
                        let v = match elem {
                            ElemType::Pod(_) => e,
                            ElemType::Scalar(s) => format!("{e} as {}", s.rust()),
                            ElemType::Handle(_) | ElemType::DevicePtr => format!("{e} as usize as u64"),
                            ElemType::Abi(..) => unreachable!("checked"),
                        };
                        fields.push(format!("{id}: {v}"));
                    }
                    Shape::OutElement { elem, null_ok } => {
                        if !null_ok {
                            w.open(format!("if {src}.is_null() {{"));
                            w.line(format!("return Err({invalid});"));
                            w.close("}");
                        }
                        let pointee = ffi_type(api, &a.ty.pointee());
                        let checked = if *null_ok { "tested just before" } else { "checked before the call" };
                        let (safety, store) = match elem {
                            ElemType::Scalar(_) => (
                                format!(
                                    "// SAFETY: `{id}` is not null ({checked}) and points to a writable `{pointee}`, as the API asks of its caller (spec line {line})."
                                ),
                                format!("unsafe {{ *{src} = reply.{id} as {pointee} }};"),
                            ),
                            ElemType::Handle(k) if int_handle_kind(api, &a.ty).is_some() => (
                                format!(
                                    "// SAFETY: `{id}` is not null ({checked}) and points to a writable `{pointee}`, as the API asks of its caller (spec line {line})."
                                ),
                                format!(
                                    "unsafe {{ *{src} = {P}::handle_tag::int_of_wire({P}::apis::HandleKind::{0}, reply.{id}).ok_or(Status::{1})? }};",
                                    camel(k),
                                    error_const(api, &api.errors.failures.internal_error)
                                ),
                            ),
                            ElemType::Handle(_) | ElemType::DevicePtr => (
                                format!(
                                    "// SAFETY: `{id}` is not null ({checked}) and points to a writable `{pointee}`, as the API asks of its caller (spec line {line})."
                                ),
                                format!("unsafe {{ *{src} = reply.{id} as usize as {pointee} }};"),
                            ),
                            ElemType::Pod(_) => (
                                format!(
                                    "// SAFETY: `{id}` is not null ({checked}) and points to a writable `{pointee}`, as the API asks of its caller (spec line {line})."
                                ),
                                format!("unsafe {{ *{src} = reply.{id} }};"),
                            ),
                            ElemType::Abi(c_type, _) => (
                                format!(
                                    "// SAFETY: `{id}` is not null ({checked}) and points to a writable `{c_type}` in the layout of the CUDA ABI this process loaded, which `write_{c_type}` writes (spec line {line})."
                                ),
                                format!(
                                    "unsafe {{ <super::hand::Hand as HandWritten>::write_{c_type}({src} as *mut ::std::ffi::c_void, &reply.{id}) }};"
                                ),
                            ),
                        };
                        outs.push(if *null_ok {
                            format!("if !{src}.is_null() {{\n{safety}\n{store}\n}}")
                        } else {
                            format!("{safety}\n{store}")
                        });
                    }
                }
            }
            ArgClass::Pointer(branches) => {
                // Shape chosen per call.
                let has_out = branches.iter().any(|b| matches!(b.shape, Shape::Out { .. } | Shape::InOut { .. }));
                if has_out {
                    w.line(format!("let mut out_{}: Option<usize> = None;", a.name));
                }
                w.line(format!("let w_{}: Ptr<'_>;", a.name));
                for (i, b) in branches.iter().enumerate() {
                    let head = match (&b.cond, i) {
                        (Some(c), 0) => format!("if {} {{", expr(c, api, f, &names)),
                        (Some(c), _) => format!("}} else if {} {{", expr(c, api, f, &names)),
                        (None, _) => "} else {".to_string(),
                    };
                    if i == 0 {
                        w.open(head);
                    } else {
                        w.close(head);
                        w.indent_more();
                    }
                    let len = |w: &mut W, count: &crate::ast::Expr, elem_size: u64| {
                        let n = expr(count, api, f, &names);
                        w.line(format!("let n: usize = rt::byte_len({n}, {elem_size})?;"));
                    };
                    match &b.shape {
                        Shape::Device { .. } => {
                            let addr = if a.contextual.is_some() {
                                narrow(P, &src, "u64")
                            } else {
                                format!("{src} as usize as u64")
                            };
                            w.line(format!("w_{} = Ptr::Device({addr});", a.name));
                        }
                        Shape::In { count, elem_size, null_ok } => {
                            len(w, count, *elem_size);
                            in_bytes_safety(w, &id, "n", *null_ok, line);
                            w.line(format!(
                                "w_{} = Ptr::In(unsafe {{ rt::in_bytes({src} as *const u8, n, {null_ok}) }}?);",
                                a.name
                            ));
                        }
                        Shape::Out { count, elem_size, null_ok } => {
                            len(w, count, *elem_size);
                            w.line(format!("rt::check_out({src} as *mut u8, n, {null_ok})?;"));
                            w.line(format!("out_{} = Some(n);", a.name));
                            w.line(format!("w_{} = Ptr::Out(n as u64);", a.name));
                        }
                        Shape::InOut { count, elem_size, null_ok } => {
                            len(w, count, *elem_size);
                            w.line(format!("out_{} = Some(n);", a.name));
                            in_bytes_safety(w, &id, "n", *null_ok, line);
                            w.line(format!(
                                "w_{} = Ptr::InOut(unsafe {{ rt::in_bytes({src} as *const u8, n, {null_ok}) }}?);",
                                a.name
                            ));
                        }
                        _ => unreachable!("checked: only buffer-like shapes are chosen"),
                    }
                }
                w.close("}");
                fields.push(format!("{id}: w_{}", a.name));
                if has_out {
                    let copy = copy_out(&id, &src, &format!("reply.{id}.as_deref()"), "n", line);
                    outs.push(format!("if let Some(n) = out_{} {{\n{copy}\n}}", a.name));
                }
            }
        }
    }
    w.line(format!("let req = wire::{t}Request {{ {} }};", fields.join(", ")));
    if !f.async_when_live.is_empty() {
        // Checked: its arguments are integers and handles (its reply is empty); the call
        // goes without waiting once one with the same ones has succeeded.
        let handles: Vec<String> = f.async_when_live.iter().map(|n| format!("req.{}", rust_ident(n))).collect();
        let values: Vec<String> = f
            .args
            .iter()
            .map(|a| match &a.class {
                ArgClass::Value(ValueType::Handle(_)) => format!("req.{}", rust_ident(&a.name)),
                _ => format!("req.{} as u64", rust_ident(&a.name)),
            })
            .collect();
        w.line(format!("rt::call_when_live(&req, &[{}], &[{}])?;", handles.join(", "), values.join(", ")));
    } else if f.async_id.is_some() {
        // Checked: its reply is empty and its first argument is its handle.
        let handle = rust_ident(&f.args[0].name);
        w.line(format!("rt::call_deferred(&req, {handle} as usize as u64)?;"));
    } else if outs.is_empty() {
        w.line("let _reply = rt::call(&req)?;");
    } else {
        w.line("let reply = rt::call(&req)?;");
    }
    for o in outs {
        for l in o.lines() {
            if l.starts_with('}') {
                w.close(l);
            } else if l.ends_with('{') {
                w.open(l);
            } else {
                w.line(l);
            }
        }
    }
    if let Some(h) = &f.on_success {
        w.line(format!("<super::hand::Hand as HandWritten>::{h}();"));
    }
    w.line("Ok(())");
    w.close("})");
    w.close("}");
    w.line("");
}
