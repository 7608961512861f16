//! The wire emitter: everything both ends of a connection must agree on. Included by
//! `phos-protocol` inside a module that has `crate::spec` (the table types), `crate::types`
//! (hand-written wire structs), `crate::Ptr` and `crate::CudaError` in scope.

use super::{W, error_prefix, header, lit};
use crate::model::*;

pub fn emit(api: &Api) -> String {
    let mut w = W::default();
    w.line("#[allow(unused_imports)]");
    w.line("use crate::spec::{ErrorInfo, Exec, FunctionInfo, ObjectRules, ResourceInfo, ResourceKind};");
    w.line("");
    w.line("/// Name of the API this module was generated from.");
    w.line(format!("pub const API_NAME: &str = {};", lit(&api.name)));
    w.line("/// Hash of the spec text: both ends of a session must have been built from the same spec.");
    w.line(format!("pub const SPEC_HASH: u64 = 0x{:016x};", api.spec_hash));
    w.line("");
    function_ids(&mut w, api);
    handle_kinds(&mut w, api);
    resources(&mut w, api);
    errors(&mut w, api);
    constants(&mut w, api);
    for f in api.remote_functions() {
        messages(&mut w, f);
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
    w.open("impl FunctionId {");
    w.line("/// All functions, in id order.");
    w.open("pub const ALL: &'static [FunctionId] = &[");
    for f in &api.functions {
        w.line(format!("FunctionId::{},", f.type_name()));
    }
    w.close("];");
    w.line("");
    w.line("/// The function with this wire id.");
    w.open("pub fn from_u32(id: u32) -> Option<FunctionId> {");
    w.line("FunctionId::ALL.get(id as usize).copied()");
    w.close("}");
    w.line("");
    w.line("/// What the spec says about this function.");
    w.open("pub fn info(self) -> &'static FunctionInfo {");
    w.line("&FUNCTIONS[self as usize]");
    w.close("}");
    w.line("");
    w.line("/// The C name.");
    w.open("pub fn name(self) -> &'static str {");
    w.line("self.info().name");
    w.close("}");
    w.close("}");
    w.line("");
    w.line("/// Per-function facts from the spec, indexed by function id.");
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

fn handle_kinds(w: &mut W, api: &Api) {
    let kinds = api.handle_kinds();
    w.line("/// Kinds of API objects that the guest sees through virtual handles.");
    w.line("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]");
    w.open("pub enum HandleKind {");
    for k in &kinds {
        w.line(format!("{},", camel(k)));
    }
    w.close("}");
    w.open("impl HandleKind {");
    w.open("pub const ALL: &'static [HandleKind] = &[");
    for k in &kinds {
        w.line(format!("HandleKind::{},", camel(k)));
    }
    w.close("];");
    w.open("pub fn name(self) -> &'static str {");
    w.open("match self {");
    for k in &kinds {
        w.line(format!("HandleKind::{} => {},", camel(k), lit(k)));
    }
    w.close("}");
    w.close("}");
    w.close("}");
    w.line("");
}

fn resources(w: &mut W, api: &Api) {
    w.line("/// Resources the spec accounts for, in declaration order.");
    w.open("pub static RESOURCES: &[ResourceInfo] = &[");
    for r in &api.resources {
        let kind = match r.kind {
            crate::ast::ResourceKind::Continuous => "Continuous",
            crate::ast::ResourceKind::Instantaneous => "Instantaneous",
            crate::ast::ResourceKind::Measured => "Measured",
        };
        let exhausted = match &r.exhausted {
            Some(e) => format!("Some({})", api.constants.get(e).copied().unwrap_or_default()),
            None => "None".to_string(),
        };
        w.line(format!(
            "ResourceInfo {{ name: {}, kind: ResourceKind::{kind}, exhausted: {exhausted} }},",
            lit(&r.name)
        ));
    }
    w.close("];");
    w.line("");
}

fn errors(w: &mut W, api: &Api) {
    let t = &api.errors;
    let prefix = error_prefix(t);
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
    w.line("#[allow(non_upper_case_globals)]");
    w.open("impl crate::CudaError {");
    for e in &t.entries {
        if e.name == t.success {
            continue;
        }
        let short = e.name.strip_prefix(&prefix).unwrap_or(&e.name);
        w.line(format!("/// `{}`: {}", e.name, e.text));
        w.line(format!("pub const {short}: crate::CudaError = crate::CudaError({});", e.code));
    }
    w.close("}");
    w.line(format!("/// The success value of `{}`.", t.ty));
    w.line(format!(
        "pub const SUCCESS: i32 = {};",
        t.entries.iter().find(|e| e.name == t.success).map(|e| e.code).unwrap_or(0)
    ));
    w.line("/// What functions the project does not support return.");
    w.line(format!(
        "pub const NOT_SUPPORTED: crate::CudaError = crate::CudaError({});",
        t.entries.iter().find(|e| e.name == t.not_supported).map(|e| e.code).unwrap_or(0)
    ));
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

fn messages(w: &mut W, f: &Function) {
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
    w.line(format!("const FUNCTION: FunctionId = FunctionId::{t};"));
    w.line(format!("type Reply = {t}Reply;"));
    w.close("}");
    w.line("");
}
