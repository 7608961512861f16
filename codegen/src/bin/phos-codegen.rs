//! Command-line front end of the spec compiler: checks a spec and prints what an emitter
//! writes, for reading generated code and for regenerating `docs/api-coverage.md`.
//!
//! `phos-codegen <wire|guest|server|costs|docs|check> <spec.lapis>`

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(what), Some(path)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: phos-codegen <wire|guest|server|costs|docs|check> <spec.lapis>");
        return ExitCode::from(2);
    };
    let source = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    let api = match phos_codegen::load(path, &source) {
        Ok(api) => api,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let out = match what.as_str() {
        "wire" => phos_codegen::emit::wire::emit(&api),
        "guest" => phos_codegen::emit::guest::emit(&api),
        "server" => phos_codegen::emit::server::emit(&api),
        "costs" => phos_codegen::emit::costs::emit(&api),
        "docs" => phos_codegen::emit::docs::emit(&api),
        "check" => format!("{}: {} functions, spec hash {:016x}\n", path, api.functions.len(), api.spec_hash),
        other => {
            eprintln!("unknown output `{other}`");
            return ExitCode::from(2);
        }
    };
    print!("{out}");
    ExitCode::SUCCESS
}
