//! The cost emitter: from each function's `allocates_rc`/`deallocates_rc`/`consumes_rc`
//! descriptors, the code the router runs on a request to learn what it costs. The router
//! itself has no CUDA-specific code: everything it knows about a call comes from here.

use super::guest::rust_ident;
use super::wire::request_type;
use super::{Names, W, expr, header_all, is_bool};
use crate::model::*;

const P: &str = "::phos_protocol";

struct CostNames;

impl Names for CostNames {
    fn arg(&self, a: &Arg) -> String {
        let id = rust_ident(&a.name);
        if is_bool(a) { format!("req.{id}") } else { format!("(req.{id} as i128)") }
    }

    fn call(&self, _: &str, _: &[String]) -> String {
        unreachable!("checked: resource expressions call no utilities")
    }
}

pub fn emit(apis: &[Api]) -> String {
    let mut w = W::default();
    w.line(format!("use {P}::apis::Function;"));
    w.line(format!("use {P}::spec::Charge;"));
    w.line("");
    w.line("/// The resources a call uses, from the spec alone. `payload` is the request as sent;");
    w.line("/// a request that does not decode is charged nothing here (the server rejects it).");
    w.line("/// Resource indices are `apis::RESOURCES`'.");
    w.line("#[inline]");
    w.open(format!(
        "pub fn charges(f: Function, payload: &[u8], out: &mut Vec<Charge>) -> Result<(), {P}::EvalError> {{"
    ));
    w.open("match f {");
    for api in apis {
        w.line(format!("Function::{}(id) => {}::charges(id, payload, out),", api.type_name(), api.name));
    }
    w.close("}");
    w.close("}");
    for api in apis {
        w.line("");
        api_charges(&mut w, apis, api);
    }
    let mut out = header_all("costs", apis);
    out.push_str(&w.finish());
    out
}

/// One API's table: a module named after it with its `charges`.
fn api_charges(w: &mut W, apis: &[Api], api: &Api) {
    w.line(format!("/// The `{}` API's calls.", api.name));
    w.open(format!("pub mod {} {{", api.name));
    w.line("#[allow(unused_imports)]");
    w.line(format!("use {P}::{}::*;", api.name));
    w.line("#[allow(unused_imports)]");
    w.line(format!("use {P}::spec::{{Charge, RcOp}};"));
    w.line("");
    w.line(
        "#[allow(non_snake_case, unused_variables, unused_parens, clippy::nonminimal_bool, clippy::unnecessary_cast, clippy::match_single_binding)]",
    );
    w.open(format!(
        "pub fn charges(id: FunctionId, payload: &[u8], out: &mut Vec<Charge>) -> Result<(), {P}::EvalError> {{"
    ));
    w.open("match id {");
    for f in api.remote_functions().filter(|f| !f.resources.is_empty()) {
        w.open(format!("FunctionId::{} => {{", f.type_name()));
        w.line(format!(
            "let Ok(req) = {P}::decode_request::<{}>(payload) else {{ return Ok(()) }};",
            request_type(f, "'_")
        ));
        for r in &f.resources {
            let index = crate::apis::resource_index(apis, &r.resource);
            let op = match r.op {
                RcOp::Allocates => "RcOp::Allocates",
                RcOp::Deallocates => "RcOp::Deallocates",
                RcOp::Consumes => "RcOp::Consumes",
            };
            let amount = match &r.amount {
                Some(e) => format!("Some({P}::eval::narrow::<u64>({})?)", expr(e, api, f, &CostNames)),
                None => "None".to_string(),
            };
            let push = format!("out.push(Charge {{ resource: {index}, op: {op}, amount: {amount} }});");
            match &r.cond {
                Some(c) => {
                    w.open(format!("if {} {{", expr(c, api, f, &CostNames)));
                    w.line(push);
                    w.close("}");
                }
                None => w.line(push),
            }
        }
        w.close("}");
    }
    w.line("_ => {}");
    w.close("}");
    w.line("Ok(())");
    w.close("}");
    w.close("}");
}
