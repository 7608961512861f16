//! The vendor's library as the API server calls it, for an API the server runs with the
//! vendor's own library loaded at run time (cuBLAS with NVIDIA's libcublas; the math libraries
//! the same way). For the spec's remote functions whose arguments are values and device or
//! host buffers (the library's compute calls), it writes:
//!
//! - `Library`: the vendor's entry points, each looked up by name when the library is opened
//!   (one the file lacks is `None`, and its call answers the API's not-supported status);
//! - `VendorCall` for each such request: the call made with it once the dispatch has checked it: handles given to
//!   [`Translate`] for the vendor's own objects, device addresses as they are (the session's
//!   memory is at the same addresses on the device), host buffers from the frame, outputs
//!   into buffers of the size the guest asked for, which become the reply, and a number the
//!   call writes through a pointer (a workspace query's size) into a reply field.
//!
//! Functions that create, destroy or change objects are the service's own (it keeps the
//! objects' state), and so are functions with other kinds of arguments.

use super::guest::ffi_type;
use super::guest::int_handle_kind;
use super::guest::rust_ident;
use super::wire::request_type;
use super::{W, header};

const P: &str = "::phos_protocol";
use crate::model::*;

/// Whether the server can call `f` through the generated path.
pub fn callable(f: &Function) -> bool {
    f.exec == Exec::Remote
        && !f.internal
        && f.objects.creates.is_empty()
        && f.objects.destroys.is_empty()
        && f.objects.mutates.is_empty()
        && f.params.iter().all(|p| match f.arg(&p.name.name).map(|a| &a.class) {
            Some(ArgClass::Value(ValueType::Scalar(_) | ValueType::Handle(_))) => true,
            // A shape chosen per call (`Ptr`), or one device address or host input.
            Some(ArgClass::Pointer(branches)) if branches.len() > 1 => branches.iter().all(|b| {
                matches!(b.shape, Shape::Device { .. } | Shape::In { .. } | Shape::Out { .. } | Shape::InOut { .. })
            }),
            Some(ArgClass::Pointer(branches)) => matches!(
                branches[0].shape,
                Shape::Device { .. }
                    | Shape::In { .. }
                    | Shape::OutElement { elem: ElemType::Scalar(_), null_ok: false }
            ),
            _ => false,
        })
        && f.params.iter().any(|p| matches!(f.arg(&p.name.name).map(|a| &a.class), Some(ArgClass::Pointer(_))))
}

pub fn emit(api: &Api) -> String {
    let mut w = W::default();
    w.line(header("vendor", api));
    let status = &api.errors.rust_type;
    w.line(format!("use {P}::{}::*;", api.name));
    w.line(format!("use {P}::Ptr;"));
    w.line("use ::std::ffi::c_void;");
    w.line("");
    let functions: Vec<&Function> = api.functions.iter().filter(|f| callable(f)).collect();

    w.line("/// A request the vendor's library can run (`call_vendor`: the call with its arguments).");
    w.open("pub trait VendorCall {");
    w.line("type Reply;");
    w.line("/// # Safety");
    w.line("/// The request's device ranges are the session's memory (the dispatch checked them),");
    w.line("/// and `t` gives the vendor's live objects.");
    w.line(format!(
        "unsafe fn call_vendor(&self, lib: &Library, t: &impl Translate) -> Result<Self::Reply, {status}>;"
    ));
    w.close("}");
    w.line("");
    w.line("/// The session's side of a vendor call: the vendor's object behind a virtual handle.");
    w.open("pub trait Translate {");
    w.line(format!("fn object(&self, kind: &'static str, handle: u64) -> Result<*mut c_void, {status}>;"));
    w.close("}");
    w.line("");

    w.line("/// The vendor library's entry points, by name.");
    w.line("#[allow(non_snake_case)]");
    w.open("pub struct Library {");
    w.line("_library: ::libloading::Library,");
    for f in &functions {
        w.line(format!("{}: Option<{}>,", f.name, fn_type(api, f)));
    }
    w.close("}");
    w.line("");
    w.open("impl Library {");
    w.line("/// Open the vendor's library at `path` and look up its entry points.");
    w.line("///");
    w.line("/// # Safety");
    w.line("/// Opening a library runs its initialisers: `path` must be the vendor's library.");
    w.open("pub unsafe fn open(path: &::std::path::Path) -> Result<Library, ::libloading::Error> {");
    w.line("// SAFETY: this function's contract.");
    w.line("let library = unsafe { ::libloading::Library::new(path) }?;");
    w.open("Ok(Library {");
    for f in &functions {
        w.line(format!("// SAFETY: `{0}` has this prototype in the vendor's header (spec line {1}).", f.name, f.line));
        w.line(format!("{0}: unsafe {{ library.get::<{1}>(b\"{0}\\0\") }}.ok().map(|s| *s),", f.name, fn_type(api, f)));
    }
    w.line("_library: library,");
    w.close("})");
    w.close("}");
    w.line("");
    w.line("/// How many of the entry points the library has.");
    w.open("pub fn found(&self) -> usize {");
    let found: Vec<String> = functions.iter().map(|f| format!("usize::from(self.{}.is_some())", f.name)).collect();
    w.line(if found.is_empty() { "0".to_string() } else { found.join(" + ") });
    w.close("}");
    w.close("}");
    w.line("");
    w.line("/// A pointer argument as the vendor takes it: a device address, or host bytes.");
    w.line("/// (Unused by an API whose calls have no argument of a shape chosen per call.)");
    w.line("#[allow(dead_code)]");
    w.open("fn arg_ptr(p: &Ptr<'_>, out: &mut Option<Vec<u8>>) -> *mut c_void {");
    w.open("match p {");
    w.line("Ptr::Device(a) => *a as *mut c_void,");
    w.line("Ptr::In(b) => b.as_ptr() as *mut c_void,");
    w.open("Ptr::Out(_) | Ptr::InOut(_) => match out {");
    w.line("Some(v) => v.as_mut_ptr().cast(),");
    w.line("None => ::std::ptr::null_mut(),");
    w.close("},");
    w.close("}");
    w.close("}");
    w.line("");
    w.line("/// The reply buffer of an output argument: what the guest sent (in and out), or zeros.");
    w.line("/// (Unused by an API whose calls have no output of a shape chosen per call.)");
    w.line("#[allow(dead_code)]");
    w.open(format!("fn out_buffer(p: &Ptr<'_>) -> Result<Option<Vec<u8>>, {status}> {{"));
    w.open("Ok(match p {");
    w.line("Ptr::InOut(b) => Some(b.to_vec()),");
    w.open("Ptr::Out(n) => {");
    w.line(format!("let n = usize::try_from(*n).map_err(|_| <{status} as {P}::ApiStatus>::INVALID_VALUE)?;"));
    w.line("let mut v = Vec::new();");
    w.line(format!("v.try_reserve_exact(n).map_err(|_| <{status} as {P}::ApiStatus>::INTERNAL_ERROR)?;"));
    w.line("v.resize(n, 0);");
    w.line("Some(v)");
    w.close("}");
    w.line("_ => None,");
    w.close("})");
    w.close("}");
    w.line("");

    for f in &functions {
        call_fn(&mut w, api, f);
    }
    w.finish()
}

/// The Rust type of the vendor's entry point.
fn fn_type(api: &Api, f: &Function) -> String {
    let params: Vec<String> = f
        .params
        .iter()
        .map(|p| match f.arg(&p.name.name).map(|a| &a.class) {
            Some(ArgClass::Pointer(_)) => "*mut c_void".to_string(),
            _ => ffi_type(api, &p.ty),
        })
        .collect();
    format!("unsafe extern \"C\" fn({}) -> i32", params.join(", "))
}

fn call_fn(w: &mut W, api: &Api, f: &Function) {
    let status = &api.errors.rust_type;
    let t = f.type_name();
    w.line(format!("/// `{}` of the vendor's library (spec line {}).", f.name, f.line));
    w.open(format!("impl VendorCall for {} {{", request_type(f, "'_")));
    w.line(format!("type Reply = {t}Reply;"));
    w.line("#[allow(non_snake_case, clippy::useless_conversion, clippy::unnecessary_cast)]");
    let takes_objects = f
        .params
        .iter()
        .any(|p| matches!(f.arg(&p.name.name).map(|a| &a.class), Some(ArgClass::Value(ValueType::Handle(_)))));
    let translate = if takes_objects { "t" } else { "_t" };
    w.open(format!(
        "unsafe fn call_vendor(&self, lib: &Library, {translate}: &impl Translate) -> Result<{t}Reply, {status}> {{"
    ));
    w.line("let req = self;");
    w.line(format!(
        "let Some(entry) = lib.{} else {{ return Err(<{status} as {P}::ApiStatus>::NOT_SUPPORTED) }};",
        f.name
    ));
    let mut call_args = Vec::new();
    let mut reply_fields = Vec::new();
    for p in &f.params {
        let name = &p.name.name;
        let id = rust_ident(name);
        match f.arg(name).map(|a| (&a.class, a.wire())) {
            // An `int` handle (a cuFFT plan): the vendor's int, kept as the object's address.
            Some((ArgClass::Value(ValueType::Handle(kind)), _)) if int_handle_kind(api, &p.ty).is_some() => {
                w.line(format!("let {id} = t.object({}, req.{id})? as usize as i32;", super::lit(kind)));
                call_args.push(id.clone());
            }
            Some((ArgClass::Value(ValueType::Handle(kind)), _)) => {
                w.line(format!("let {id} = t.object({}, req.{id})?;", super::lit(kind)));
                call_args.push(id.clone());
            }
            // The wire's width (`u64` for a `size_t`) cast to the prototype's.
            Some((ArgClass::Value(_), _)) => call_args.push(format!("req.{id} as {}", ffi_type(api, &p.ty))),
            Some((ArgClass::Pointer(_), WireRepr::Chosen { has_out })) => {
                if has_out {
                    w.line(format!("let mut {id}_out = out_buffer(&req.{id})?;"));
                    w.line(format!("let {id}_ptr = arg_ptr(&req.{id}, &mut {id}_out);"));
                    reply_fields.push(format!("{id}: {id}_out"));
                } else {
                    w.line(format!("let {id}_ptr = arg_ptr(&req.{id}, &mut None);"));
                }
                call_args.push(format!("{id}_ptr"));
            }
            Some((ArgClass::Pointer(_), WireRepr::Request(ty))) if ty == "u64" => {
                call_args.push(format!("req.{id} as *mut c_void"));
            }
            // A NULL the program passed travels as an empty buffer, and is NULL again here.
            Some((ArgClass::Pointer(b), WireRepr::Request(_)))
                if matches!(b[0].shape, Shape::In { null_ok: true, .. }) =>
            {
                call_args.push(format!(
                    "(if req.{id}.is_empty() {{ ::std::ptr::null_mut() }} else {{ req.{id}.as_ptr() as *mut c_void }})"
                ));
            }
            Some((ArgClass::Pointer(_), WireRepr::Request(_))) => {
                // An empty buffer is a null pointer (an optional input the program left out).
                call_args.push(format!(
                    "if req.{id}.is_empty() {{ ::std::ptr::null_mut() }} else {{ req.{id}.as_ptr() as *mut c_void }}"
                ));
            }
            // One number the call writes (a workspace size): a local, then a reply field.
            Some((ArgClass::Pointer(_), WireRepr::Reply(ty))) => {
                w.line(format!("let mut {id}: {ty} = Default::default();"));
                call_args.push(format!("(&mut {id} as *mut {ty}).cast::<c_void>()"));
                reply_fields.push(id.clone());
            }
            _ => unreachable!("`callable` admits no other argument"),
        }
    }
    // `PHOS_PROFILE`: the library's own share of the call.
    w.line(format!("let profiled = {P}::call_profile::start();"));
    w.line(format!(
        "// SAFETY: the vendor's `{}` with arguments the dispatch checked (this function's contract).",
        f.name
    ));
    w.line(format!("let code = unsafe {{ entry({}) }};", call_args.join(", ")));
    w.line(format!("{P}::call_profile::vendor_ended(profiled);"));
    w.line(format!("if code != {P}::{}::SUCCESS {{ return Err({status}(code)); }}", api.name));
    w.line(format!("Ok({t}Reply {{ {} }})", reply_fields.join(", ")));
    w.close("}");
    w.close("}");
    w.line("");
}
