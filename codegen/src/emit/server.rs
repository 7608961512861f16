//! The server emitter, per API: the `<Api>Service` trait (`CudartService`: one method per
//! remote function, written by hand in the API server) and `dispatch`, which decodes a
//! request, re-checks everything the spec says about it (preconditions, buffer sizes, argument
//! shapes, device ranges) and only then calls the service. A guest is never trusted.

use super::guest::rust_ident;
use super::wire::request_type;
use super::{Names, W, expr, header, is_bool, status_const};
use crate::model::*;

const P: &str = "::phos_protocol";

pub fn emit(api: &Api) -> String {
    let mut w = W::default();
    w.line("#[allow(unused_imports)]");
    w.line(format!("use {P}::{}::*;", api.name));
    w.line("#[allow(unused_imports)]");
    w.line(format!("use {P}::{{Ptr, Rejection}};"));
    w.line(format!("pub type Status = {};", api.errors.rust_type));
    w.line("");
    service_trait(&mut w, api);
    dispatch(&mut w, api);
    for f in api.remote_functions() {
        handler(&mut w, api, f);
    }
    let mut out = header("server", api);
    out.push_str(&w.finish());
    out
}

/// `CudartService` for the `cudart` API.
pub fn service_trait_name(api: &Api) -> String {
    format!("{}Service", api.type_name())
}

fn service_trait(w: &mut W, api: &Api) {
    w.line("/// The API server's implementation of every remote function. Requests reach these");
    w.line("/// methods only after `dispatch` has checked them against the spec.");
    w.line("#[allow(clippy::too_many_arguments)]");
    w.open(format!("pub trait {} {{", service_trait_name(api)));
    w.line("/// Per-call context (session, channel, device).");
    w.line("type Cx;");
    w.line("/// `Ok` when `[addr, addr + len)` is device memory this session may use (a zero");
    w.line("/// address is accepted only when `null_ok`).");
    w.line("fn check_device_range(&self, cx: &Self::Cx, addr: u64, len: u64, null_ok: bool) -> Result<(), Status>;");
    w.line("/// The largest reply buffer a call may ask for.");
    w.line("fn max_reply_bytes(&self) -> u64;");
    w.line("/// Called after each successful call that creates or destroys objects (per the spec's");
    w.line("/// object descriptors), with the request as sent.");
    w.line(format!(
        "fn record(&self, cx: &Self::Cx, id: FunctionId, payload: &[u8], facts: &{P}::spec::RecordFacts<'_>) {{"
    ));
    w.line("    let _ = (cx, id, payload, facts);");
    w.line("}");
    w.line("/// Whether `before_call` wants to see calls now. Asked before every call, so it must cost");
    w.line("/// next to nothing (the C/R engine's hook: one relaxed atomic load while none is installed).");
    w.line("fn intercepting(&self) -> bool {");
    w.line("    false");
    w.line("}");
    w.line("/// Called while `intercepting`, once a call's checks have passed and before it runs, with");
    w.line("/// what the spec says it will read and write. It may block (the call waits); an error");
    w.line("/// fails the call before it runs.");
    w.line(format!(
        "fn before_call(&self, cx: &Self::Cx, id: FunctionId, access: &{P}::spec::CallAccess<'_>) -> Result<(), Status> {{"
    ));
    w.line("    let _ = (cx, id, access);");
    w.line("    Ok(())");
    w.line("}");
    w.line("/// Asked when the service answered an error: whether that answer meant the call was");
    w.line("/// checked and taken into a stream capture instead of run (the service keeps the request,");
    w.line("/// as sent, to run it when the graph is launched). The guest then gets the call's success");
    w.line("/// with no results (a captured call has none on the host).");
    w.line("/// Called before the service runs a call whose request asks for results on the host (a");
    w.line("/// reply buffer): such a call cannot be taken into a stream capture.");
    w.line("fn note_host_results(&self, cx: &Self::Cx) {");
    w.line("    let _ = cx;");
    w.line("}");
    w.line("fn deferred(&self, cx: &Self::Cx, id: FunctionId, payload: &[u8]) -> bool {");
    w.line("    let _ = (cx, id, payload);");
    w.line("    false");
    w.line("}");
    for f in api.remote_functions() {
        w.line(format!("/// `{}` (spec line {}).", f.name, f.line));
        w.line(format!(
            "fn {}(&self, cx: &Self::Cx, req: {}) -> Result<{}Reply, Status>;",
            f.method_name(),
            request_type(f, "'_"),
            f.type_name()
        ));
    }
    w.close("}");
    w.line("");
}

fn dispatch(w: &mut W, api: &Api) {
    w.line("/// Decode, check and run one call; the encoded reply is appended to `out`.");
    w.open(format!("pub fn dispatch<S: {} + ?Sized>(svc: &S, cx: &S::Cx, id: FunctionId, payload: &[u8], out: &mut Vec<u8>) -> Result<(), Rejection<Status>> {{", service_trait_name(api)));
    w.open("match id {");
    for f in api.remote_functions() {
        w.line(format!("FunctionId::{} => {}(svc, cx, payload, out),", f.type_name(), f.method_name()));
    }
    if api.functions.iter().any(|f| f.exec != Exec::Remote) {
        w.line("other => Err(Rejection::NotRemote(other.name())),");
    }
    w.close("}");
    w.close("}");
    w.line("");
}

/// The pre-call hook: what the call will read and write (device ranges from its
/// `device_pointer` arguments, the objects its handle arguments name, those it changes or
/// destroys), built and handed over only while the service is intercepting.
fn access_hook(w: &mut W, api: &Api, f: &Function) {
    let names = ServerNames;
    let ev = |x: &crate::ast::Expr| expr(x, api, f, &names);
    // A device pointer without an extent (`cudaFree`'s) touches no memory: it names an
    // object, listed below.
    let ranged = |b: &Branch| matches!(b.shape, Shape::Device { extent: Some(_), .. });
    let device_args: Vec<&Arg> =
        f.args.iter().filter(|a| matches!(&a.class, ArgClass::Pointer(b) if b.iter().any(ranged))).collect();
    w.open("if svc.intercepting() {");
    if device_args.is_empty() {
        w.line(format!("let hook_device: [{P}::spec::DeviceAccess; 0] = [];"));
    } else {
        w.line(format!("let mut hook_device = [{P}::spec::DeviceAccess::NONE; {}];", device_args.len()));
        w.line("let mut hook_n = 0usize;");
    }
    for a in &device_args {
        let id = rust_ident(&a.name);
        // A pointer to const is only read.
        let writes = !a.ty.is_const;
        let ArgClass::Pointer(branches) = &a.class else { unreachable!() };
        let push = |w: &mut W, addr: &str, extent: &Option<crate::ast::Expr>| {
            let len = extent.as_ref().map(ev).unwrap_or_else(|| "0i128".into());
            w.line(format!(
                "hook_device[hook_n] = {P}::spec::DeviceAccess {{ addr: {addr}, len: {P}::eval::narrow::<u64>({len})?, writes: {writes} }};"
            ));
            w.line("hook_n += 1;");
        };
        if branches.len() == 1 {
            let Shape::Device { extent, null_ok } = &branches[0].shape else { unreachable!() };
            if *null_ok {
                w.open(format!("if req.{id} != 0 {{"));
            } else {
                w.open("{");
            }
            push(w, &format!("req.{id}"), extent);
            w.close("}");
            continue;
        }
        for (i, b) in branches.iter().enumerate() {
            let head = match (&b.cond, i) {
                (Some(c), 0) => format!("if {} {{", ev(c)),
                (Some(c), _) => format!("}} else if {} {{", ev(c)),
                (None, _) => "} else {".to_string(),
            };
            if i == 0 {
                w.open(head);
            } else {
                w.close(head);
                w.indent_more();
            }
            if let Shape::Device { extent: extent @ Some(_), .. } = &b.shape {
                w.open(format!("if let Ptr::Device(addr) = req.{id} {{"));
                push(w, "addr", extent);
                w.close("}");
            }
        }
        w.close("}");
    }
    // Objects named by value: handle arguments, and what the call changes or destroys.
    let mut objects = Vec::new();
    for a in &f.args {
        let plain = !matches!(&a.class, ArgClass::Pointer(b) if b.len() > 1);
        let named = |list: &[(String, String)]| list.iter().find(|(n, _)| *n == a.name).map(|(_, k)| k.clone());
        let found = match (named(&f.objects.destroys), named(&f.objects.mutates), &a.class) {
            (Some(kind), _, _) => Some((kind, "Destroys")),
            (None, Some(kind), _) => Some((kind, "Changes")),
            (None, None, ArgClass::Value(ValueType::Handle(kind))) => Some((kind.clone(), "Uses")),
            _ => None,
        };
        if let Some((kind, effect)) = found.filter(|_| plain) {
            objects.push(format!(
                "{P}::spec::ObjectAccess {{ kind: {}, value: req.{} as u64, effect: {P}::spec::ObjectEffect::{effect} }}",
                super::lit(&kind),
                rust_ident(&a.name)
            ));
        }
    }
    w.line(format!("let hook_objects: [{P}::spec::ObjectAccess; {}] = [{}];", objects.len(), objects.join(", ")));
    let device = if device_args.is_empty() { "&hook_device" } else { "&hook_device[..hook_n]" };
    w.line(format!(
        "let access = {P}::spec::CallAccess {{ function: {}, device: {device}, objects: &hook_objects }};",
        super::lit(&f.name)
    ));
    w.line(format!("svc.before_call(cx, FunctionId::{}, &access).map_err(Rejection::Failed)?;", f.type_name()));
    w.close("}");
}

struct ServerNames;

impl Names for ServerNames {
    fn arg(&self, a: &Arg) -> String {
        let id = rust_ident(&a.name);
        if is_bool(a) { format!("req.{id}") } else { format!("(req.{id} as i128)") }
    }

    fn call(&self, _: &str, _: &[String]) -> String {
        unreachable!("checked: server-side expressions call no utilities")
    }
}

fn handler(w: &mut W, api: &Api, f: &Function) {
    let names = ServerNames;
    let invalid = status_const(api, &api.errors.failures.invalid_value);
    let t = f.type_name();
    w.line("#[allow(non_snake_case, unused_variables, unused_mut, unused_parens, clippy::nonminimal_bool, clippy::unnecessary_cast)]");
    w.open(format!(
        "fn {}<S: {} + ?Sized>(svc: &S, cx: &S::Cx, payload: &[u8], out: &mut Vec<u8>) -> Result<(), Rejection<Status>> {{",
        f.method_name(),
        service_trait_name(api)
    ));
    w.line(format!(
        "let req: {} = {P}::decode_request(payload).map_err(Rejection::Malformed)?;",
        request_type(f, "'_")
    ));

    // Preconditions the server can see, then argument shapes; any failure is the guest's.
    let mut expect_outs: Vec<(String, bool)> = Vec::new(); // (arg, chosen)
    w.open("let expected = (|| -> Result<_, Rejection<Status>> {");
    for p in f.preconditions.iter().filter(|p| p.wire_checkable) {
        let c = expr(&p.cond, api, f, &names);
        w.open(format!("if !{c} {{"));
        w.line(format!("return Err(Rejection::Invalid({}, \"precondition\"));", status_const(api, &p.error)));
        w.close("}");
    }
    let ev = |x: &crate::ast::Expr| expr(x, api, f, &names);
    let mut out_lens: Vec<String> = Vec::new();
    for a in &f.args {
        let id = rust_ident(&a.name);
        let ArgClass::Pointer(branches) = &a.class else {
            continue;
        };
        if branches.len() == 1 {
            match &branches[0].shape {
                Shape::Device { extent, null_ok } => {
                    let len = extent.as_ref().map(ev).unwrap_or_else(|| "0i128".into());
                    w.line(format!(
                        "svc.check_device_range(cx, req.{id}, {P}::eval::narrow::<u64>({len})?, {null_ok}).map_err(|c| Rejection::Invalid(c, \"device pointer `{}`\"))?;",
                        a.name
                    ));
                }
                Shape::In { count, elem_size, .. } | Shape::InOut { count, elem_size, .. } => {
                    w.line(format!("let n_{}: u64 = {P}::eval::byte_len({}, {elem_size})?;", a.name, ev(count)));
                    w.open(format!("if req.{id}.len() as u64 != n_{} {{", a.name));
                    w.line(format!("return Err(Rejection::Invalid({invalid}, \"size of buffer `{}`\"));", a.name));
                    w.close("}");
                    if matches!(branches[0].shape, Shape::InOut { .. }) {
                        out_lens.push(format!("n_{}", a.name));
                        expect_outs.push((a.name.clone(), false));
                    }
                }
                Shape::Out { count, elem_size, .. } => {
                    w.line(format!("let n_{}: u64 = {P}::eval::byte_len({}, {elem_size})?;", a.name, ev(count)));
                    w.open(format!("if n_{} > svc.max_reply_bytes() {{", a.name));
                    w.line(format!(
                        "return Err(Rejection::Invalid({invalid}, \"size of reply buffer `{}`\"));",
                        a.name
                    ));
                    w.close("}");
                    out_lens.push(format!("n_{}", a.name));
                    expect_outs.push((a.name.clone(), false));
                }
                _ => {}
            }
            continue;
        }
        // Chosen shapes: work out which one the spec expects and hold the guest to it.
        let has_out = branches.iter().any(|b| matches!(b.shape, Shape::Out { .. } | Shape::InOut { .. }));
        if has_out {
            w.line(format!("let n_{}: Option<u64>;", a.name));
        }
        let set_n = |w: &mut W, v: &str| {
            if has_out {
                w.line(format!("n_{} = {v};", a.name));
            }
        };
        for (i, b) in branches.iter().enumerate() {
            let head = match (&b.cond, i) {
                (Some(c), 0) => format!("if {} {{", ev(c)),
                (Some(c), _) => format!("}} else if {} {{", ev(c)),
                (None, _) => "} else {".to_string(),
            };
            if i == 0 {
                w.open(head);
            } else {
                w.close(head);
                w.indent_more();
            }
            let mismatch = format!("return Err(Rejection::Invalid({invalid}, \"shape of argument `{}`\"))", a.name);
            match &b.shape {
                Shape::Device { extent, null_ok } => {
                    let len = extent.as_ref().map(ev).unwrap_or_else(|| "0i128".into());
                    w.line(format!("let Ptr::Device(addr) = req.{id} else {{ {mismatch} }};"));
                    w.line(format!(
                        "svc.check_device_range(cx, addr, {P}::eval::narrow::<u64>({len})?, {null_ok}).map_err(|c| Rejection::Invalid(c, \"device pointer `{}`\"))?;",
                        a.name
                    ));
                    set_n(w, "None");
                }
                Shape::In { count, elem_size, .. } | Shape::InOut { count, elem_size, .. } => {
                    let variant = if matches!(b.shape, Shape::In { .. }) { "In" } else { "InOut" };
                    w.line(format!("let n: u64 = {P}::eval::byte_len({}, {elem_size})?;", ev(count)));
                    w.line(format!("let Ptr::{variant}(bytes) = req.{id} else {{ {mismatch} }};"));
                    w.open("if bytes.len() as u64 != n {");
                    w.line(format!("return Err(Rejection::Invalid({invalid}, \"size of buffer `{}`\"));", a.name));
                    w.close("}");
                    set_n(w, if variant == "InOut" { "Some(n)" } else { "None" });
                }
                Shape::Out { count, elem_size, .. } => {
                    w.line(format!("let n: u64 = {P}::eval::byte_len({}, {elem_size})?;", ev(count)));
                    w.line(format!("let Ptr::Out(asked) = req.{id} else {{ {mismatch} }};"));
                    w.open("if asked != n || n > svc.max_reply_bytes() {");
                    w.line(format!(
                        "return Err(Rejection::Invalid({invalid}, \"size of reply buffer `{}`\"));",
                        a.name
                    ));
                    w.close("}");
                    set_n(w, "Some(n)");
                }
                _ => unreachable!("checked"),
            }
        }
        w.close("}");
        if has_out {
            out_lens.push(format!("n_{}", a.name));
            expect_outs.push((a.name.clone(), true));
        }
    }
    if out_lens.is_empty() {
        w.line("Ok(())");
    } else {
        w.line(format!("Ok(({},))", out_lens.join(", ")));
    }
    w.close("})();");
    if expect_outs.is_empty() {
        w.line("expected?;");
    } else {
        w.line("let expected = expected?;");
        let host: Vec<String> = expect_outs
            .iter()
            .enumerate()
            .map(|(i, (_, chosen))| if *chosen { format!("expected.{i}.is_some()") } else { "true".into() })
            .collect();
        w.open(format!("if {} {{", host.join(" || ")));
        w.line("svc.note_host_results(cx);");
        w.close("}");
    }
    access_hook(w, api, f);
    // A call that changes a handle's state (`obj_record` on a handle argument: a library
    // handle's setting) is recorded on that handle, after the other handles it names.
    let mutated_handles: Vec<&(String, String)> =
        f.objects.mutates.iter().filter(|(_, k)| api.handle_kinds.iter().any(|h| &h.name == k)).collect();
    let records = !f.objects.creates.is_empty()
        || !f.objects.destroys.is_empty()
        || !mutated_handles.is_empty()
        || f.objects.global_record;
    let value_of = |name: &str| format!("req.{} as u64", rust_ident(name));
    if records {
        let destroyed: Vec<String> =
            f.objects.destroys.iter().map(|(a, k)| format!("({}, {})", super::lit(k), value_of(a))).collect();
        let mutated: Vec<String> =
            mutated_handles.iter().map(|(a, k)| format!("({}, {})", super::lit(k), value_of(a))).collect();
        let mut deps: Vec<String> = f.objects.depends_on.iter().map(|(_, dep)| value_of(dep)).collect();
        if !mutated_handles.is_empty() {
            deps.extend(
                f.args
                    .iter()
                    .filter(|a| matches!(a.class, ArgClass::Value(ValueType::Handle(_))))
                    .filter(|a| !mutated_handles.iter().any(|(m, _)| *m == a.name))
                    .map(|a| value_of(&a.name)),
            );
        }
        w.line(format!("let destroyed: [(&'static str, u64); {}] = [{}];", destroyed.len(), destroyed.join(", ")));
        w.line(format!("let mutated: [(&'static str, u64); {}] = [{}];", mutated.len(), mutated.join(", ")));
        w.line(format!("let depends_on: [u64; {}] = [{}];", deps.len(), deps.join(", ")));
    }
    w.open(format!("let reply = match svc.{}(cx, req) {{", f.method_name()));
    w.line("Ok(reply) => reply,");
    w.line(format!("Err(_) if svc.deferred(cx, FunctionId::{t}, payload) => {t}Reply::default(),"));
    w.line("Err(status) => return Err(Rejection::Failed(status)),");
    w.close("};");
    if records {
        let created: Vec<String> = f
            .objects
            .creates
            .iter()
            .map(|(a, k)| format!("({}, reply.{} as u64)", super::lit(k), rust_ident(a)))
            .collect();
        w.line(format!("let created: [(&'static str, u64); {}] = [{}];", created.len(), created.join(", ")));
        w.line(format!(
            "svc.record(cx, FunctionId::{t}, payload, &{P}::spec::RecordFacts {{ created: &created, destroyed: &destroyed, mutated: &mutated, depends_on: &depends_on, global: {} }});",
            f.objects.global_record
        ));
    }
    // The service must answer with exactly the buffers the guest asked for.
    for (i, (name, chosen)) in expect_outs.iter().enumerate() {
        let id = rust_ident(name);
        if *chosen {
            w.open(format!("if reply.{id}.as_ref().map(|b| b.len() as u64) != expected.{i} {{"));
        } else {
            w.open(format!("if reply.{id}.len() as u64 != expected.{i} {{"));
        }
        w.line(format!("return Err(Rejection::ServerBug(\"{t}: reply buffer `{name}` has the wrong size\"));"));
        w.close("}");
    }
    w.line(format!("{P}::encode_reply(&reply, out);"));
    w.line("Ok(())");
    w.close("}");
    w.line("");
}
