//! `phos-codegen`: the spec compiler.
//!
//! It parses a LAPIS-style API spec (see `docs/spec-language.md`), checks it, and emits Rust
//! for each component that speaks the API:
//!
//! | emitter | used by | what it writes |
//! |---|---|---|
//! | [`emit::wire`] | `phos-protocol` | function ids, request/reply types, error codes, constants, object rules |
//! | [`emit::guest`] | `phos-guestlib` | the `extern "C"` exports and the trait of hand-written pieces |
//! | [`emit::server`] | `phos-api-server` | the service trait and the checked dispatch |
//! | [`emit::costs`] | `phos-router` | the per-call resource table of every API |
//! | [`emit::apis`] | `phos-protocol` | what every API shares: API ids, `Function` (API and function id), handle kinds, resources |
//! | [`emit::docs`] | `docs/` | the API coverage tables |
//! | [`emit::policy_header`] | `phos-policy` | `phos_spec.h` for eBPF policies |
//!
//! Each crate runs its emitters from `build.rs` (see [`build_support`]); nothing generated is
//! committed. Each spec has a lock file of its wire facts ([`lock`], [`wire_facts`]) that
//! every build compares it with.

pub mod apis;
pub mod ast;
pub mod check;
pub mod diag;
pub mod emit;
pub mod lock;
pub mod model;
pub mod parse;
pub mod wire_facts;

pub use check::load;
pub use diag::SpecError;
pub use model::Api;

/// Where a spec's lock file is: `spec/cudart.lapis` -> `spec/cudart.lock`.
pub fn lock_path(spec: &std::path::Path) -> std::path::PathBuf {
    spec.with_extension("lock")
}

/// Helpers for `build.rs` scripts.
pub mod build_support {
    use std::path::{Path, PathBuf};

    use crate::Api;
    use crate::lock::{Lock, Standing};

    /// Load and check a spec file against its lock file, printing the rerun directives; on
    /// error (an invalid spec, a change the lock forbids), print what is wrong and fail the
    /// build.
    pub fn load_spec(path: &Path) -> Api {
        println!("cargo:rerun-if-changed={}", path.display());
        let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut api = match crate::load(&path.display().to_string(), &source) {
            Ok(api) => api,
            Err(e) => {
                // Cargo shows build script stderr on failure; make it the rendered diagnostics.
                eprintln!("{e}");
                panic!("the spec {} has errors (see above)", path.display());
            }
        };
        let lock_path = crate::lock_path(path);
        println!("cargo:rerun-if-changed={}", lock_path.display());
        let lock = std::fs::read_to_string(&lock_path)
            .map_err(|e| e.to_string())
            .and_then(|text| Lock::parse(&text))
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}\n(write it with `cargo run -p phos-codegen -- lock {}`)",
                    lock_path.display(),
                    path.display()
                )
            });
        let standing = crate::lock::compare(&lock, &api).unwrap_or_else(|e| {
            eprintln!("{}: changes that break deployed guests or images:\n{e}", path.display());
            panic!("the spec {} is incompatible with {} (see above)", path.display(), lock_path.display());
        });
        match &standing {
            Standing::Current => {}
            Standing::Grown(added) => println!(
                "cargo:warning={} is not recorded in {} yet ({}): run `cargo run -p phos-codegen -- lock {}`",
                path.display(),
                lock_path.display(),
                added.join("; "),
                path.display()
            ),
            Standing::NewVersion => println!(
                "cargo:warning={} raised its version to {}: record it with `cargo run -p phos-codegen -- lock {}`",
                path.display(),
                api.version,
                path.display()
            ),
        }
        if standing != Standing::NewVersion {
            let bad = |e: String| -> Vec<u64> { panic!("{}: {e}", lock_path.display()) };
            api.accepted_hashes = lock.served().unwrap_or_else(bad);
            api.legacy_text_hashes = lock.legacy().unwrap_or_else(bad);
        }
        api
    }

    /// Load every spec of `paths` ([`load_spec`]), ordered by API id, and check that they fit
    /// together (one id and name each, one handle kind and resource namespace).
    pub fn load_specs(paths: &[&str]) -> Vec<Api> {
        let mut apis: Vec<Api> = paths.iter().map(|p| load_spec(Path::new(p))).collect();
        apis.sort_by_key(|a| a.id);
        if let Err(problems) = crate::apis::check(&apis) {
            panic!("the specs do not fit together:\n{}", problems.join("\n"));
        }
        apis
    }

    /// Write generated code into `OUT_DIR`.
    pub fn write_out(name: &str, code: &str) -> PathBuf {
        let dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
        let path = dir.join(name);
        std::fs::write(&path, code).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Write each API's code (`<api>_<suffix>.rs`, from `emit`) and `<name>`, which declares
    /// one module per API including it: `pub mod cudart { include!(...cudart_wire.rs) }`.
    pub fn write_modules(name: &str, apis: &[Api], suffix: &str, emit: impl Fn(&Api) -> String) {
        let mut modules = String::new();
        for api in apis {
            let file = format!("{}_{suffix}.rs", api.name);
            write_out(&file, &emit(api));
            modules.push_str(&format!(
                "/// Generated from the `{}` spec.\n#[allow(clippy::all, unused_parens)]\npub mod {} {{\n    include!(concat!(env!(\"OUT_DIR\"), \"/{file}\"));\n}}\n",
                api.name, api.name
            ));
        }
        write_out(name, &modules);
    }
}

#[cfg(test)]
mod tests {
    /// The project's own specs must check, and every emitter must run on them.
    #[test]
    fn the_specs_check_and_emit() {
        let apis: Vec<crate::Api> = phos_spec::SPECS
            .iter()
            .map(|spec| crate::load(spec.path, spec.text).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        crate::apis::check(&apis).unwrap_or_else(|e| panic!("{}", e.join("\n")));
        assert!(apis.iter().any(|a| a.function("cudaMemcpy").is_some()));
        for api in &apis {
            for code in [crate::emit::wire::emit(api), crate::emit::guest::emit(api), crate::emit::server::emit(api)] {
                assert!(!code.is_empty());
            }
        }
        for code in [
            crate::emit::apis::emit(&apis),
            crate::emit::costs::emit(&apis),
            crate::emit::docs::emit(&apis),
            crate::emit::policy_header::emit(&apis),
        ] {
            assert!(!code.is_empty());
        }
    }

    /// Each spec of this tree is what its lock file records: run
    /// `cargo run -p phos-codegen -- lock spec/<api>.lapis` after a compatible change.
    #[test]
    fn the_specs_match_their_lock_files() {
        for spec in phos_spec::SPECS {
            let api = crate::load(spec.path, spec.text).unwrap_or_else(|e| panic!("{e}"));
            let lock_path = crate::lock_path(std::path::Path::new(spec.path));
            let lock = crate::lock::Lock::parse(&std::fs::read_to_string(&lock_path).unwrap()).unwrap();
            match crate::lock::compare(&lock, &api) {
                Ok(crate::lock::Standing::Current) => {}
                Ok(other) => panic!(
                    "{} does not record {} as it is ({other:?}): run `cargo run -p phos-codegen -- lock {}`",
                    lock_path.display(),
                    spec.path,
                    spec.path
                ),
                Err(e) => panic!("{}: changes that break deployed guests or images:\n{e}", spec.path),
            }
        }
    }

    /// A carried function of the runtime's spec whose request changes while its id and the
    /// API's version stay is refused against the lock file, saying how to make the change.
    #[test]
    fn a_layout_change_under_the_same_id_is_refused_by_the_lock() {
        let path = phos_spec::CUDART_SPEC_PATH;
        let text = phos_spec::SPECS.iter().find(|s| s.path == path).unwrap().text;
        let edited =
            text.replacen("cudaMalloc(void **devPtr, size_t size)", "cudaMalloc(void **devPtr, unsigned size)", 1);
        assert_ne!(edited, text, "the edit must change the text");
        let lock_path = crate::lock_path(std::path::Path::new(path));
        let lock = crate::lock::Lock::parse(&std::fs::read_to_string(&lock_path).unwrap()).unwrap();
        let before = crate::load(path, text).unwrap();
        assert_eq!(crate::lock::compare(&lock, &before), Ok(crate::lock::Standing::Current));
        let after = crate::load(path, &edited).unwrap();
        assert_ne!(before.spec_hash, after.spec_hash);
        let e = crate::lock::compare(&lock, &after).unwrap_err().to_string();
        assert!(e.contains("the request of `cudaMalloc` (id 44) was (u64) and is now (u32)"), "{e}");
        assert!(e.contains("retire id 44"), "{e}");
    }

    /// Editing a comment or a coverage note of the runtime's spec changes neither its hash
    /// nor any function's id.
    #[test]
    fn comments_and_coverage_notes_leave_the_wire_alone() {
        let path = phos_spec::CUDART_SPEC_PATH;
        let text = phos_spec::SPECS.iter().find(|s| s.path == path).unwrap().text;
        let edited = text
            .replacen("// Device management", "// Devices,\n// and how the guest manages them", 1)
            .replacen("coverage_note \"Managed memory (", "coverage_note \"Unified memory, also called managed (", 1);
        assert_ne!(edited, text, "the edit must change the text");
        let (before, after) = (crate::load(path, text).unwrap(), crate::load(path, &edited).unwrap());
        assert_eq!(before.spec_hash, after.spec_hash);
        assert_ne!(before.coverage_notes, after.coverage_notes);
        let ids = |a: &crate::Api| a.functions.iter().map(|f| (f.name.clone(), f.id)).collect::<Vec<_>>();
        assert_eq!(ids(&before), ids(&after));
        // The functions after the comment moved a line down; their ids did not.
        let malloc = |a: &crate::Api| a.function("cudaMalloc").map(|f| (f.id, f.line)).unwrap();
        assert_eq!((malloc(&before).0, malloc(&before).1 + 1), malloc(&after));
    }
}
