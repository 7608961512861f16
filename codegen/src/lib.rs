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
//! | [`emit::costs`] | `phos-router` | the per-call resource table |
//! | [`emit::docs`] | `docs/` | the API coverage table |
//!
//! Each crate runs its emitter from `build.rs` (see [`build_support`]); nothing generated is
//! committed.

pub mod ast;
pub mod check;
pub mod diag;
pub mod emit;
pub mod model;
pub mod parse;

pub use check::load;
pub use diag::SpecError;
pub use model::Api;

/// Helpers for `build.rs` scripts.
pub mod build_support {
    use std::path::{Path, PathBuf};

    use crate::Api;

    /// Load and check a spec file, printing the rerun directive; on error, print the rendered
    /// diagnostics and fail the build.
    pub fn load_spec(path: &Path) -> Api {
        println!("cargo:rerun-if-changed={}", path.display());
        let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        match crate::load(&path.display().to_string(), &source) {
            Ok(api) => api,
            Err(e) => {
                // Cargo shows build script stderr on failure; make it the rendered diagnostics.
                eprintln!("{e}");
                panic!("the spec {} has errors (see above)", path.display());
            }
        }
    }

    /// Write generated code into `OUT_DIR`.
    pub fn write_out(name: &str, code: &str) -> PathBuf {
        let dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
        let path = dir.join(name);
        std::fs::write(&path, code).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }
}

#[cfg(test)]
mod tests {
    /// The project's own spec must check, and every emitter must run on it.
    #[test]
    fn cudart_spec_checks_and_emits() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../spec/cudart.lapis");
        let source = std::fs::read_to_string(path).unwrap();
        let api = crate::load(path, &source).unwrap_or_else(|e| panic!("{e}"));
        assert!(api.function("cudaMemcpy").is_some());
        for code in [
            crate::emit::wire::emit(&api),
            crate::emit::guest::emit(&api),
            crate::emit::server::emit(&api),
            crate::emit::costs::emit(&api),
            crate::emit::docs::emit(&api),
        ] {
            assert!(!code.is_empty());
        }
    }
}
