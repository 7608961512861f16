//! Command-line front end of the spec compiler: checks specs, prints what an emitter writes
//! (for reading generated code), and keeps the lock files.
//!
//! ```text
//! phos-codegen <wire|guest|server> <spec.lapis>        one API's code
//! phos-codegen <apis|costs|docs|policy-header> <spec.lapis>...   code of every API given
//! phos-codegen check <spec.lapis>...                   check, print ids and hashes
//! phos-codegen lock [--check] <spec.lapis>...          record each spec in its lock file
//! ```
//!
//! `lock` compares each spec with its lock file (`spec/cudart.lock`): a compatible change
//! (functions added or retired, ...) is recorded, with the old hash kept as one this build
//! still serves; an incompatible one is refused with what changed and how to make it right.
//! With `--check` nothing is written and a lock that is not current is an error.

use std::path::Path;
use std::process::ExitCode;

use phos_codegen::Api;
use phos_codegen::lock::{Lock, Standing};

const USAGE: &str =
    "usage: phos-codegen <wire|guest|server|apis|costs|docs|policy-header|check|lock [--check]> <spec.lapis>...";

fn load(path: &str) -> Result<Api, String> {
    let source = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    phos_codegen::load(path, &source).map_err(|e| e.to_string())
}

/// Record (or with `check_only`, check) `path`'s spec in its lock file.
fn lock(path: &str, check_only: bool) -> Result<(), String> {
    let api = load(path)?;
    let lock_path = phos_codegen::lock_path(Path::new(path));
    let old = match std::fs::read_to_string(&lock_path) {
        Ok(text) => Some(Lock::parse(&text).map_err(|e| format!("{}: {e}", lock_path.display()))?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", lock_path.display())),
    };
    let standing = match &old {
        Some(old) => phos_codegen::lock::compare(old, &api)
            .map_err(|e| format!("{path}: changes that break deployed guests or images:\n{e}"))?,
        None => Standing::NewVersion,
    };
    if check_only {
        return match standing {
            Standing::Current => Ok(()),
            Standing::Grown(added) => Err(format!(
                "{} is out of date ({}): run `cargo run -p phos-codegen -- lock {path}`",
                lock_path.display(),
                added.join("; ")
            )),
            Standing::NewVersion => Err(format!(
                "{} does not record version {} yet: run `cargo run -p phos-codegen -- lock {path}`",
                lock_path.display(),
                api.version
            )),
        };
    }
    let new = phos_codegen::lock::updated(old.as_ref(), &api).map_err(|e| format!("{path}:\n{e}"))?;
    if old.as_ref() != Some(&new) {
        std::fs::write(&lock_path, new.render()).map_err(|e| format!("{}: {e}", lock_path.display()))?;
        match standing {
            Standing::Grown(added) => eprintln!("{}: recorded {}", lock_path.display(), added.join("; ")),
            _ => eprintln!("{}: written for version {}", lock_path.display(), api.version),
        }
    }
    Ok(())
}

fn run(args: &[String]) -> Result<String, String> {
    let (what, mut paths) = args.split_first().ok_or(USAGE)?;
    let check_only = paths.first().is_some_and(|a| a == "--check");
    if check_only {
        paths = &paths[1..];
    }
    if paths.is_empty() {
        return Err(USAGE.into());
    }
    if what == "lock" {
        let failed: Vec<String> = paths.iter().filter_map(|p| lock(p, check_only).err()).collect();
        return if failed.is_empty() { Ok(String::new()) } else { Err(failed.join("\n")) };
    }
    let mut apis = paths.iter().map(|p| load(p)).collect::<Result<Vec<Api>, String>>()?;
    apis.sort_by_key(|a| a.id);
    phos_codegen::apis::check(&apis).map_err(|e| e.join("\n"))?;
    let one = || if apis.len() == 1 { Ok(&apis[0]) } else { Err(format!("`{what}` takes one spec")) };
    Ok(match what.as_str() {
        "wire" => phos_codegen::emit::wire::emit(one()?),
        "guest" => phos_codegen::emit::guest::emit(one()?),
        "server" => phos_codegen::emit::server::emit(one()?),
        "vendor" => phos_codegen::emit::vendor::emit(one()?),
        "apis" => phos_codegen::emit::apis::emit(&apis),
        "costs" => phos_codegen::emit::costs::emit(&apis),
        "docs" => phos_codegen::emit::docs::emit(&apis),
        "policy-header" => phos_codegen::emit::policy_header::emit(&apis),
        "check" => apis
            .iter()
            .map(|a| {
                format!(
                    "API `{}`: id {}, version {}, {} functions, spec hash {:016x}\n",
                    a.name,
                    a.id,
                    a.version,
                    a.functions.len(),
                    a.spec_hash
                )
            })
            .collect(),
        other => return Err(format!("unknown output `{other}`\n{USAGE}")),
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
