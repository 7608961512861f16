//! The wire emitter: everything both ends of a connection must agree on about one API. Included
//! by `phos-protocol` as the API's module (`phos_protocol::cudart`), next to `crate::spec` (the
//! table types), `crate::types` (hand-written wire structs), `crate::Ptr`, `crate::apis`
//! (what the APIs share, [`super::apis`]) and `crate::Failure`.

use super::{W, error_prefix, header, lit};
use crate::model::*;

pub fn emit(api: &Api) -> String {
    let mut w = W::default();
    w.line("#[allow(unused_imports)]");
    w.line("use crate::spec::{ErrorInfo, Exec, FunctionInfo, ObjectRules};");
    w.line("");
    w.line("/// Name of the API this module was generated from.");
    w.line(format!("pub const API_NAME: &str = {};", lit(&api.name)));
    w.line("/// The API's id in frame headers.");
    w.line(format!("pub const API_ID: u16 = {};", api.id));
    w.line("/// The API's wire version: guests and images of another version are refused.");
    w.line(format!("pub const API_VERSION: u32 = {};", api.version));
    w.line("/// Hash of the API's wire facts (ids, names, layouts, handle kinds, errors, constants,");
    w.line("/// resources): what a guest names in its `Hello` and an image in its manifest.");
    w.line(format!("pub const SPEC_HASH: u64 = 0x{:016x};", api.spec_hash));
    w.line("/// Every hash this build serves: its own, then earlier revisions of this version whose");
    w.line("/// functions it still carries with the same layouts (the lock file's `accepts`).");
    let served: Vec<String> = api.served_hashes().iter().map(|h| format!("0x{h:016x}")).collect();
    w.line(format!("pub const SERVED_HASHES: &[u64] = &[{}];", served.join(", ")));
    w.line("/// Spec-text hashes that guests from before explicit function ids announced, whose");
    w.line("/// functions this build carries with the same ids and layouts.");
    let legacy: Vec<String> = api.legacy_text_hashes.iter().map(|h| format!("0x{h:016x}")).collect();
    w.line(format!("pub const LEGACY_TEXT_HASHES: &[u64] = &[{}];", legacy.join(", ")));
    w.line("");
    function_ids(&mut w, api);
    errors(&mut w, api);
    constants(&mut w, api);
    for f in api.remote_functions() {
        messages(&mut w, api, f);
    }
    let mut out = header("wire", api);
    out.push_str(&w.finish());
    out
}

fn function_ids(w: &mut W, api: &Api) {
    w.line("/// Every function of the spec. The discriminant is the wire function id.");
    w.line("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]");
    w.line("#[repr(u32)]");
    w.open("pub enum FunctionId {");
    for f in &api.functions {
        w.line(format!("/// `{}` (spec line {})", f.name, f.line));
        w.line(format!("{} = {},", f.type_name(), f.id));
    }
    w.close("}");
    w.line("");
    // Where each id's function is in `ALL` (`u16::MAX`: no function has the id).
    // A function's async id (`@async_id`) names the same function.
    let max_id = api.functions.iter().flat_map(|f| [Some(f.id), f.async_id]).flatten().max().unwrap_or(0) as usize;
    let mut position = vec![u16::MAX; max_id + 1];
    for (i, f) in api.functions.iter().enumerate() {
        for id in [Some(f.id), f.async_id].into_iter().flatten() {
            position[id as usize] = u16::try_from(i).expect("fewer than 65535 functions");
        }
    }
    w.line("/// Position in [`FunctionId::ALL`] and [`FUNCTIONS`] of the function of each id (`u16::MAX`:");
    w.line("/// none, a retired or unused id).");
    w.open("static POSITION: &[u16] = &[");
    for chunk in position.chunks(16) {
        w.line(chunk.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ") + ",");
    }
    w.close("];");
    w.line("");
    w.open("impl FunctionId {");
    w.line("/// All functions, in spec order.");
    w.open("pub const ALL: &'static [FunctionId] = &[");
    for f in &api.functions {
        w.line(format!("FunctionId::{},", f.type_name()));
    }
    w.close("];");
    w.line("");
    w.line("/// The function with this wire id.");
    w.line("#[inline]");
    w.open("pub fn from_u32(id: u32) -> Option<FunctionId> {");
    w.line("let position = *POSITION.get(id as usize)?;");
    w.line("FunctionId::ALL.get(usize::from(position)).copied()");
    w.close("}");
    w.line("");
    w.line("/// What the spec says about this function.");
    w.open("pub fn info(self) -> &'static FunctionInfo {");
    w.line("&FUNCTIONS[usize::from(POSITION[self as usize])]");
    w.close("}");
    w.line("");
    w.line("/// The C name.");
    w.open("pub fn name(self) -> &'static str {");
    w.line("self.info().name");
    w.close("}");
    w.close("}");
    w.line("");
    w.line("/// Function ids that were carried once and are never given again, with their names.");
    let retired: Vec<String> = api.retired.iter().map(|r| format!("({}, {})", r.id, lit(&r.name))).collect();
    w.line(format!("pub static RETIRED: &[(u32, &str)] = &[{}];", retired.join(", ")));
    w.line("");
    w.line("/// Per-function facts from the spec, in spec order (see [`FunctionId::info`]).");
    w.open("pub static FUNCTIONS: &[FunctionInfo] = &[");
    for f in &api.functions {
        let exec = match f.exec {
            Exec::Remote => "Exec::Remote",
            Exec::Guest => "Exec::Guest",
            Exec::Unsupported => "Exec::Unsupported",
        };
        let pairs = |v: &[(String, String)]| -> String {
            let items: Vec<String> = v.iter().map(|(a, b)| format!("({}, {})", lit(a), lit(b))).collect();
            format!("&[{}]", items.join(", "))
        };
        let aliases: Vec<String> = f.aliases.iter().chain(&f.per_thread_aliases).map(|a| lit(a)).collect();
        w.open("FunctionInfo {");
        w.line(format!("id: {},", f.id));
        w.line(format!("name: {},", lit(&f.name)));
        w.line(format!("exec: {exec},"));
        w.line(format!("internal: {},", f.internal));
        w.line(format!("is_async: {},", f.is_async));
        w.line(format!("async_id: {:?},", f.async_id));
        w.line(format!("device_output: {},", f.device_output));
        w.line(format!("aliases: &[{}],", aliases.join(", ")));
        w.line(format!("spec_line: {},", f.line));
        w.open("objects: ObjectRules {");
        w.line(format!("creates: {},", pairs(&f.objects.creates)));
        w.line(format!("destroys: {},", pairs(&f.objects.destroys)));
        w.line(format!("mutates: {},", pairs(&f.objects.mutates)));
        w.line(format!("depends_on: {},", pairs(&f.objects.depends_on)));
        w.line(format!("global_record: {},", f.objects.global_record));
        w.close("},");
        w.close("},");
    }
    w.close("];");
    w.line("");
}

/// The error table and the API's status type (`CudaError`): a code of the table that is not
/// success, with a constant per entry and the failures Phos itself causes.
fn errors(w: &mut W, api: &Api) {
    let t = &api.errors;
    let prefix = error_prefix(t);
    let status = &t.rust_type;
    let code_of = |name: &str| t.entries.iter().find(|e| e.name == name).map(|e| e.code).unwrap_or(0);
    w.line(format!("/// The `{}` table: code, C name, and the text `GetErrorString` returns.", t.ty));
    w.open("pub static ERRORS: &[ErrorInfo] = &[");
    for e in &t.entries {
        let abi: Vec<String> = e.abi_texts.iter().map(|(v, s)| format!("({v}, {})", lit(s))).collect();
        w.line(format!(
            "ErrorInfo {{ code: {}, name: {}, text: {}, abi_texts: &[{}] }},",
            e.code,
            lit(&e.name),
            lit(&e.text),
            abi.join(", ")
        ));
    }
    w.close("];");
    w.line("");
    w.line(format!(
        "/// A `{}` of the `{}` API that is not `{}`. The named constants are the",
        t.ty, api.name, t.success
    ));
    w.line("/// errors table's.");
    w.line("#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]");
    w.line(format!("pub struct {status}(pub i32);"));
    w.line("");
    w.line("#[allow(non_upper_case_globals)]");
    w.open(format!("impl {status} {{"));
    for e in &t.entries {
        if e.name == t.success {
            continue;
        }
        let short = e.name.strip_prefix(&prefix).unwrap_or(&e.name);
        w.line(format!("/// `{}`: {}", e.name, e.text));
        w.line(format!("pub const {short}: {status} = {status}({});", e.code));
    }
    w.line("");
    w.open("pub fn code(self) -> i32 {");
    w.line("self.0");
    w.close("}");
    w.line("");
    w.open("fn entry(self) -> Option<&'static ErrorInfo> {");
    w.line("ERRORS.iter().find(|e| e.code == i64::from(self.0))");
    w.close("}");
    w.line("");
    w.line(format!("/// The C name (`{}`), or \"unrecognized error code\".", t.not_supported));
    w.open("pub fn name(self) -> &'static str {");
    w.line("self.entry().map_or(\"unrecognized error code\", |e| e.name)");
    w.close("}");
    w.line("");
    w.line("/// The text `GetErrorString` gives under the given CUDA major version.");
    w.open("pub fn text(self, abi_major: u32) -> &'static str {");
    w.open("match self.entry() {");
    w.line("Some(e) => e.abi_texts.iter().find(|(v, _)| *v == i64::from(abi_major)).map_or(e.text, |(_, t)| t),");
    w.line("None => \"unrecognized error code\",");
    w.close("}");
    w.close("}");
    w.line("");
    w.line("/// `Ok(())` for the success code, the error otherwise.");
    w.open(format!("pub fn check(code: i32) -> Result<(), {status}> {{"));
    w.line(format!("if code == SUCCESS {{ Ok(()) }} else {{ Err({status}(code)) }}"));
    w.close("}");
    w.close("}");
    w.line("");
    w.open(format!("impl ::std::fmt::Debug for {status} {{"));
    w.open("fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {");
    w.line("write!(f, \"{} ({})\", self.name(), self.0)");
    w.close("}");
    w.close("}");
    w.line("");
    w.open(format!("impl ::std::fmt::Display for {status} {{"));
    w.open("fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {");
    w.line("let text = self.entry().map_or(\"unrecognized error code\", |e| e.text);");
    w.line("write!(f, \"{} ({}): {text}\", self.name(), self.0)");
    w.close("}");
    w.close("}");
    w.line("");
    w.line(format!("impl ::std::error::Error for {status} {{}}"));
    w.line("");
    let failure = |name: &str| format!("{status}({})", code_of(name));
    w.open(format!("impl crate::ApiStatus for {status} {{"));
    w.line("const SUCCESS: i32 = SUCCESS;");
    w.line(format!("const INVALID_VALUE: Self = {};", failure(&t.failures.invalid_value)));
    w.line(format!("const NOT_SUPPORTED: Self = {};", failure(&t.not_supported)));
    w.line(format!("const INTERNAL_ERROR: Self = {};", failure(&t.failures.internal_error)));
    w.open("fn from_code(code: i32) -> Self {");
    w.line(format!("{status}(code)"));
    w.close("}");
    w.open("fn code(self) -> i32 {");
    w.line("self.0");
    w.close("}");
    w.close("}");
    w.line("");
    w.line("/// The error each failure of Phos's own is answered with (the spec's `invalid_value`,");
    w.line("/// `internal_error`, `no_device`, `session_lost`); a status from the server stays as it is.");
    w.open(format!("impl From<crate::Failure> for {status} {{"));
    w.open("fn from(f: crate::Failure) -> Self {");
    w.open("match f {");
    w.line(format!("crate::Failure::Status(code) => {status}(code),"));
    w.line(format!("crate::Failure::InvalidValue => {},", failure(&t.failures.invalid_value)));
    w.line(format!("crate::Failure::Internal => {},", failure(&t.failures.internal_error)));
    w.line(format!("crate::Failure::NoDevice => {},", failure(&t.failures.no_device)));
    w.line(format!("crate::Failure::SessionLost => {},", failure(&t.failures.session_lost)));
    w.close("}");
    w.close("}");
    w.close("}");
    w.line("");
    w.line("/// Arithmetic that overflows in a spec expression is an invalid argument.");
    w.open(format!("impl From<crate::EvalError> for {status} {{"));
    w.open("fn from(_: crate::EvalError) -> Self {");
    w.line(failure(&t.failures.invalid_value));
    w.close("}");
    w.close("}");
    w.line("");
    w.line(format!("/// The success value of `{}`.", t.ty));
    w.line(format!("pub const SUCCESS: i32 = {};", code_of(&t.success)));
    w.line("/// What functions the project does not support return.");
    w.line(format!("pub const NOT_SUPPORTED: {status} = {};", failure(&t.not_supported)));
    w.line("");
}

fn constants(w: &mut W, api: &Api) {
    w.line("/// Enumerators declared in the spec.");
    w.line("#[allow(non_upper_case_globals, dead_code)]");
    w.open("pub mod consts {");
    for e in &api.enums {
        w.line(format!("// enum {}", e.name));
        for (n, v) in &e.variants {
            w.line(format!("pub const {n}: {} = {v};", e.repr.rust()));
        }
    }
    w.close("}");
    w.line("");
}

/// The request and reply structs of one remote function.
pub(crate) fn needs_lifetime(f: &Function) -> bool {
    f.args.iter().any(|a| match a.wire() {
        WireRepr::Request(t) => t.contains("'a"),
        WireRepr::Both | WireRepr::Chosen { .. } => true,
        _ => false,
    })
}

/// `CudaMemcpyRequest<'a>` or `CudaMallocRequest`, with the given lifetime name.
pub fn request_type(f: &Function, lifetime: &str) -> String {
    if needs_lifetime(f) {
        format!("{}Request<{lifetime}>", f.type_name())
    } else {
        format!("{}Request", f.type_name())
    }
}

fn messages(w: &mut W, api: &Api, f: &Function) {
    let t = f.type_name();
    let lt = needs_lifetime(f);
    w.line(format!("/// Arguments of `{}` as they travel to the server.", f.name));
    w.line("#[allow(non_snake_case)]");
    w.line("#[derive(Debug, Clone, bincode::Encode, bincode::BorrowDecode)]");
    w.open(format!("pub struct {}Request{} {{", t, if lt { "<'a>" } else { "" }));
    for a in &f.args {
        match a.wire() {
            WireRepr::Request(ty) => w.line(format!("pub {}: {ty},", a.name)),
            WireRepr::Both => w.line(format!("pub {}: &'a [u8],", a.name)),
            WireRepr::Chosen { .. } => w.line(format!("pub {}: crate::Ptr<'a>,", a.name)),
            WireRepr::Reply(_) | WireRepr::None => {}
        }
    }
    w.close("}");
    w.line("");
    w.line(format!("/// Results of `{}` as they travel back.", f.name));
    w.line("#[allow(non_snake_case)]");
    w.line("#[derive(Debug, Clone, Default, PartialEq, bincode::Encode, bincode::Decode)]");
    w.open(format!("pub struct {t}Reply {{"));
    for a in &f.args {
        match a.wire() {
            WireRepr::Reply(ty) => w.line(format!("pub {}: {ty},", a.name)),
            WireRepr::Both => w.line(format!("pub {}: Vec<u8>,", a.name)),
            WireRepr::Chosen { has_out: true } => w.line(format!("pub {}: Option<Vec<u8>>,", a.name)),
            _ => {}
        }
    }
    w.close("}");
    w.line("");
    w.open(format!("impl crate::RemoteCall for {} {{", request_type(f, "'_")));
    w.line(format!(
        "const FUNCTION: crate::apis::Function = crate::apis::Function::{}(FunctionId::{t});",
        api.type_name()
    ));
    w.line(format!("type Reply = {t}Reply;"));
    w.line(format!("type Status = {};", api.errors.rust_type));
    w.close("}");
    w.line("");
}
