//! The registry emitter: what the APIs of a build share, for `phos-protocol` (`apis.rs`,
//! included at the crate root). It declares one module per API (each including that API's
//! [`wire`](super::wire) code) and `apis`: the API ids, [`Function`] naming any function of any
//! API (what a frame's API and function fields decode to), the one handle-kind namespace and
//! the one resource table ([`crate::apis`] says why they are shared).

use super::{W, header_all, lit};
use crate::model::*;

pub fn emit(apis: &[Api]) -> String {
    let mut w = W::default();
    for api in apis {
        w.line(format!("/// The `{}` API (id {}), generated from its spec.", api.name, api.id));
        w.line("#[allow(clippy::all, unused_parens)]");
        w.open(format!("pub mod {} {{", api.name));
        w.line(format!("include!(concat!(env!(\"OUT_DIR\"), \"/{}_wire.rs\"));", api.name));
        w.close("}");
        w.line("");
    }
    w.line("/// What every API of this build shares.");
    w.open("pub mod apis {");
    w.line("use crate::spec::{FunctionInfo, ResourceInfo, ResourceKind};");
    w.line("");
    api_enum(&mut w, apis);
    function_enum(&mut w, apis);
    handle_kinds(&mut w, apis);
    resources(&mut w, apis);
    w.line("/// What eBPF policies are built against (`PHOS_SPEC_HASH`): every API's hash and the");
    w.line("/// resources' order.");
    w.line(format!("pub const POLICY_HASH: u64 = 0x{:016x};", crate::apis::policy_hash(apis)));
    w.close("}");
    let mut out = header_all("apis", apis);
    out.push_str(&w.finish());
    out
}

fn api_enum(w: &mut W, apis: &[Api]) {
    w.line("/// The APIs; the discriminant is the id in frame headers.");
    w.line("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]");
    w.line("#[repr(u16)]");
    w.open("pub enum Api {");
    for a in apis {
        w.line(format!("{} = {},", a.type_name(), a.id));
    }
    w.close("}");
    w.line("");
    w.open("impl Api {");
    w.open("pub const ALL: &'static [Api] = &[");
    for a in apis {
        w.line(format!("Api::{},", a.type_name()));
    }
    w.close("];");
    w.line("");
    w.line("#[inline]");
    w.open("pub fn from_id(id: u16) -> Option<Api> {");
    w.open("match id {");
    for a in apis {
        w.line(format!("{} => Some(Api::{}),", a.id, a.type_name()));
    }
    w.line("_ => None,");
    w.close("}");
    w.close("}");
    w.line("");
    w.open("pub fn id(self) -> u16 {");
    w.line("self as u16");
    w.close("}");
    w.line("");
    let per_api = |w: &mut W, sig: &str, doc: &str, value: &dyn Fn(&Api) -> String| {
        w.line(format!("/// {doc}"));
        w.open(format!("pub fn {sig} {{"));
        w.open("match self {");
        for a in apis {
            w.line(format!("Api::{} => {},", a.type_name(), value(a)));
        }
        w.close("}");
        w.close("}");
        w.line("");
    };
    per_api(w, "name(self) -> &'static str", "The spec's name (`cudart`).", &|a| lit(&a.name));
    per_api(w, "version(self) -> u32", "The wire version.", &|a| format!("crate::{}::API_VERSION", a.name));
    per_api(w, "spec_hash(self) -> u64", "The hash of this build's wire facts.", &|a| {
        format!("crate::{}::SPEC_HASH", a.name)
    });
    per_api(
        w,
        "served_hashes(self) -> &'static [u64]",
        "Every hash whose guests and images this build serves (its own first).",
        &|a| format!("crate::{}::SERVED_HASHES", a.name),
    );
    per_api(
        w,
        "legacy_text_hashes(self) -> &'static [u64]",
        "Spec-text hashes of guests from before explicit ids that this build serves.",
        &|a| format!("crate::{}::LEGACY_TEXT_HASHES", a.name),
    );
    per_api(w, "retired(self) -> &'static [(u32, &'static str)]", "Retired function ids and names.", &|a| {
        format!("crate::{}::RETIRED", a.name)
    });
    let status =
        |a: &Api, c: &str| format!("<crate::{}::{} as crate::ApiStatus>::{c}.code()", a.name, a.errors.rust_type);
    per_api(w, "invalid_value(self) -> i32", "The API's status for a request Phos cannot take.", &|a| {
        status(a, "INVALID_VALUE")
    });
    per_api(w, "not_supported(self) -> i32", "The API's status for a function Phos does not carry.", &|a| {
        status(a, "NOT_SUPPORTED")
    });
    per_api(w, "internal_error(self) -> i32", "The API's status for a failure of Phos's own.", &|a| {
        status(a, "INTERNAL_ERROR")
    });
    per_api(w, "status_name(self, code: i32) -> &'static str", "The C name of one of the API's status codes.", &|a| {
        format!(
            "if code == crate::{0}::SUCCESS {{ {1} }} else {{ crate::{0}::{2}(code).name() }}",
            a.name,
            lit(&a.errors.success),
            a.errors.rust_type
        )
    });
    w.close("}");
    w.line("");
}

fn function_enum(w: &mut W, apis: &[Api]) {
    w.line("/// A function of one of the APIs: what a frame's API id and function id name.");
    w.line("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]");
    w.open("pub enum Function {");
    for a in apis {
        w.line(format!("{}(crate::{}::FunctionId),", a.type_name(), a.name));
    }
    w.close("}");
    w.line("");
    w.open("impl Function {");
    w.line("/// The function a frame names; `None` for an unknown API or function id.");
    w.line("#[inline]");
    w.open("pub fn from_wire(api: u16, id: u32) -> Option<Function> {");
    w.open("match api {");
    for a in apis {
        w.line(format!("{} => crate::{}::FunctionId::from_u32(id).map(Function::{}),", a.id, a.name, a.type_name()));
    }
    w.line("_ => None,");
    w.close("}");
    w.close("}");
    w.line("");
    // `value` is the arm's expression for each API, where `f` is its `FunctionId` when `uses_f`.
    let per_fn = |w: &mut W, sig: &str, doc: &str, uses_f: bool, value: &dyn Fn(&Api) -> String| {
        w.line(format!("/// {doc}"));
        w.line("#[inline]");
        w.open(format!("pub fn {sig} {{"));
        w.open("match self {");
        for a in apis {
            let bind = if uses_f { "f" } else { "_" };
            w.line(format!("Function::{}({bind}) => {},", a.type_name(), value(a)));
        }
        w.close("}");
        w.close("}");
        w.line("");
    };
    per_fn(w, "api(self) -> Api", "The API it belongs to.", false, &|a| format!("Api::{}", a.type_name()));
    per_fn(w, "id(self) -> u32", "Its id within its API.", true, &|_| "f as u32".into());
    per_fn(w, "info(self) -> &'static FunctionInfo", "What its spec says about it.", true, &|_| "f.info()".into());
    w.line("/// The C name.");
    w.open("pub fn name(self) -> &'static str {");
    w.line("self.info().name");
    w.close("}");
    w.line("");
    w.line("/// What an eBPF policy sees as `phos_call.function`: the API id above the function id");
    w.line("/// (`PHOS_FN_*`).");
    w.open("pub fn policy_id(self) -> u64 {");
    w.line("(u64::from(self.api().id()) << 32) | u64::from(self.id())");
    w.close("}");
    w.close("}");
    w.line("");
    for a in apis {
        w.open(format!("impl From<crate::{}::FunctionId> for Function {{", a.name));
        w.open(format!("fn from(f: crate::{}::FunctionId) -> Function {{", a.name));
        w.line(format!("Function::{}(f)", a.type_name()));
        w.close("}");
        w.close("}");
        w.line("");
    }
    w.open("impl ::std::fmt::Display for Function {");
    w.open("fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {");
    w.line("f.write_str(self.name())");
    w.close("}");
    w.close("}");
    w.line("");
}

fn handle_kinds(w: &mut W, apis: &[Api]) {
    let kinds = crate::apis::handle_kinds(apis);
    w.line("/// Kinds of API objects the guest sees through virtual handles, for every API: a handle");
    w.line("/// one API hands out is valid in another that takes that kind. The discriminant is the");
    w.line("/// kind's id (`@id` of `handle_kind`), the low byte of a handle's tag.");
    w.line("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]");
    w.line("#[repr(u16)]");
    w.open("pub enum HandleKind {");
    for k in &kinds {
        w.line(format!("{} = {},", camel(&k.name), k.id));
    }
    w.close("}");
    w.open("impl HandleKind {");
    w.open("pub const ALL: &'static [HandleKind] = &[");
    for k in &kinds {
        w.line(format!("HandleKind::{},", camel(&k.name)));
    }
    w.close("];");
    w.open("pub fn id(self) -> u16 {");
    w.line("self as u16");
    w.close("}");
    w.open("pub fn name(self) -> &'static str {");
    w.open("match self {");
    for k in &kinds {
        w.line(format!("HandleKind::{} => {},", camel(&k.name), lit(&k.name)));
    }
    w.close("}");
    w.close("}");
    w.open("pub fn from_name(name: &str) -> Option<HandleKind> {");
    w.line("HandleKind::ALL.iter().copied().find(|k| k.name() == name)");
    w.close("}");
    w.close("}");
    w.line("");
}

fn resources(w: &mut W, apis: &[Api]) {
    w.line("/// Resources the router accounts, for every API, in index order.");
    w.open("pub static RESOURCES: &[ResourceInfo] = &[");
    for (r, exhausted) in crate::apis::resources(apis) {
        let kind = match r.kind {
            crate::ast::ResourceKind::Continuous => "Continuous",
            crate::ast::ResourceKind::Instantaneous => "Instantaneous",
            crate::ast::ResourceKind::Measured => "Measured",
        };
        let exhausted = match exhausted {
            Some(code) => format!("Some({code})"),
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
