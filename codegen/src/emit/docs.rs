//! The docs emitter: the API coverage tables (`docs/api-coverage.md`), a section per API,
//! straight from the specs.

use crate::model::*;

pub fn emit(apis: &[Api]) -> String {
    let mut s = String::new();
    s.push_str("# API coverage\n\n");
    s.push_str("Generated from the specs (`spec/*.lapis`) by `phosctl spec coverage`; do not edit by hand.\n\n");
    for api in apis {
        section(&mut s, api);
    }
    s
}

fn section(s: &mut String, api: &Api) {
    let remote = api.functions.iter().filter(|f| f.exec == Exec::Remote && !f.internal).count();
    let guest = api.functions.iter().filter(|f| f.exec == Exec::Guest).count();
    let unsupported = api.functions.iter().filter(|f| f.exec == Exec::Unsupported).count();
    let aliases: usize = api.functions.iter().map(|f| f.aliases.len() + f.per_thread_aliases.len()).sum();
    s.push_str(&format!(
        "## `{}` (`spec/{}.lapis`, API id {}, wire version {})\n\n",
        api.name, api.name, api.id, api.version
    ));
    s.push_str(&format!(
        "Implemented: **{}** exported functions ({remote} carried to the API server, {guest} implemented in the guest library), \
         plus {aliases} alternative entry points. Not supported (answer `{}`): {unsupported}.\n\n",
        remote + guest,
        api.errors.not_supported
    ));
    for note in &api.coverage_notes {
        s.push_str(&format!("- {note}\n"));
    }
    if !api.coverage_notes.is_empty() {
        s.push('\n');
    }
    s.push_str("| function | status | notes |\n|---|---|---|\n");
    for f in api.functions.iter().filter(|f| !f.internal) {
        let status = match f.exec {
            Exec::Remote => "remote",
            Exec::Guest => "guest library",
            Exec::Unsupported => "not supported",
        };
        let mut notes = Vec::new();
        if f.is_async {
            notes.push("async".to_string());
        }
        if let Some(id) = f.async_id {
            notes.push(format!(
                "async once its handle is live (id {id}), its failure returned by the next call on the handle"
            ));
        }
        for r in &f.resources {
            let op = match r.op {
                RcOp::Allocates => "allocates",
                RcOp::Deallocates => "frees",
                RcOp::Consumes => "uses",
            };
            notes.push(format!("{op} `{}`", r.resource));
        }
        if !f.aliases.is_empty() {
            notes.push(format!("also `{}`", f.aliases.join("`, `")));
        }
        if !f.per_thread_aliases.is_empty() {
            notes.push(format!("per-thread default stream: `{}`", f.per_thread_aliases.join("`, `")));
        }
        notes.push(format!("spec line {}", f.line));
        s.push_str(&format!("| `{}` | {status} | {} |\n", f.name, notes.join("; ")));
    }
    s.push('\n');
}
