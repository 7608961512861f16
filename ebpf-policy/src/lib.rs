//! Phos policies: eBPF programs the router runs on every call.
//!
//! Operators write policies in C against `include/phos_policy.h` (the context of a call,
//! the verdicts, the kernel's map helpers) and build them with `clang -target bpf` (or
//! `phosctl policy build`). The router loads the ELF objects with aya's object loader
//! ([`runtime`]), checks them, and runs them in a userspace eBPF VM of its own: no
//! privileges are needed, every memory access is bounds-checked, and each run has an
//! instruction budget. [`engine`] keeps the chain of loaded policies and turns their
//! answers into verdicts; [`kernel`] passes a policy through the kernel's verifier where
//! the router is privileged. docs/policies.md is the operator's reference.

pub mod engine;
pub mod kernel;

/// The shipped policies (`policies/*.c`), built with clang at build time: (name, object).
/// Empty only in a build made with `PHOS_WITHOUT_POLICIES=1` ([`shipped::absent`] says so).
pub mod shipped {
    include!(concat!(env!("OUT_DIR"), "/shipped.rs"));

    /// A shipped policy's object by name.
    pub fn get(name: &str) -> Option<&'static [u8]> {
        SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, elf)| *elf)
    }

    /// What to tell the operator of a build without the shipped policies; `None` in a build
    /// that has them.
    pub fn absent() -> Option<String> {
        absent_from(SHIPPED, NAMES)
    }

    pub(crate) fn absent_from(shipped: &[(&str, &[u8])], names: &[&str]) -> Option<String> {
        if !shipped.is_empty() {
            return None;
        }
        let builtins: Vec<String> = names.iter().map(|n| format!("builtin:{n}")).collect();
        Some(format!(
            "the shipped policies ({}) are not in this build: it was built with PHOS_WITHOUT_POLICIES=1; \
             rebuild with clang installed to have them",
            builtins.join(", ")
        ))
    }
}

/// The headers a policy is compiled with: (file name, contents).
pub const HEADERS: &[(&str, &str)] = &[
    ("phos_policy.h", include_str!("../include/phos_policy.h")),
    ("phos_spec.h", include_str!(concat!(env!("OUT_DIR"), "/include/phos_spec.h"))),
];

/// Why a policy object named by the operator cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A shipped policy, in a build without them (`note` says why and what to do).
    #[error("{spec}: {note}")]
    NotInThisBuild { spec: String, note: String },
    #[error("no shipped policy `{name}`; there are: {}", shipped::SHIPPED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "))]
    NoSuchBuiltin { name: String },
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
}

/// Why `phosctl policy build` failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Writing the headers to a directory for clang.
    #[error("{}: {source}", path.display())]
    Headers { path: std::path::PathBuf, source: std::io::Error },
    #[error("{clang} failed ({status})")]
    Compiler { clang: String, status: std::process::ExitStatus },
    #[error("{clang}: {source} (install clang to build policies)")]
    NoCompiler { clang: String, source: std::io::Error },
}

/// A policy object named on a command line or in a configuration file: `builtin:NAME` or a
/// path to an ELF object. Returns (what to call its source, the object).
pub fn resolve(spec: &str) -> Result<(String, Vec<u8>), SourceError> {
    if let Some(name) = spec.strip_prefix("builtin:") {
        return match (shipped::get(name), shipped::absent()) {
            (Some(elf), _) => Ok((spec.to_string(), elf.to_vec())),
            (None, Some(note)) => Err(SourceError::NotInThisBuild { spec: spec.to_string(), note }),
            (None, None) => Err(SourceError::NoSuchBuiltin { name: name.to_string() }),
        };
    }
    let path = std::path::Path::new(spec);
    let elf = std::fs::read(path).map_err(|source| SourceError::Read { path: spec.to_string(), source })?;
    let source = std::fs::canonicalize(path).map(|p| p.display().to_string()).unwrap_or_else(|_| spec.to_string());
    Ok((source, elf))
}

/// The name a policy gets when none is given: the builtin's name or the file's stem.
pub fn default_name(spec: &str) -> String {
    match spec.strip_prefix("builtin:") {
        Some(name) => name.to_string(),
        None => std::path::Path::new(spec).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
    }
}

/// Build a policy from C with clang and the policy headers (`phosctl policy build`).
pub fn build(source: &std::path::Path, output: &std::path::Path, clang: &str) -> Result<(), BuildError> {
    // One directory per build: builds on several threads must not remove each other's.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let include = std::env::temp_dir().join(format!("phos-policy-include-{}-{n}", std::process::id()));
    let headers = |path: std::path::PathBuf| move |source| BuildError::Headers { path, source };
    std::fs::create_dir_all(&include).map_err(headers(include.clone()))?;
    for (name, text) in HEADERS {
        std::fs::write(include.join(name), text).map_err(headers(include.join(name)))?;
    }
    let status = std::process::Command::new(clang)
        .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-I"])
        .arg(&include)
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(output)
        .status();
    let _ = std::fs::remove_dir_all(&include);
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(status) => Err(BuildError::Compiler { clang: clang.to_string(), status }),
        Err(source) => Err(BuildError::NoCompiler { clang: clang.to_string(), source }),
    }
}
pub mod runtime;

/// The build script's part that builds the shipped policies, under test.
#[cfg(test)]
#[path = "../build/shipped.rs"]
mod build_shipped;

#[cfg(test)]
mod tests {
    use super::shipped;

    #[test]
    fn a_build_without_the_shipped_policies_says_which_are_missing_and_why() {
        let note = shipped::absent_from(&[], &["fair_share", "rate_limit"]).expect("nothing shipped");
        assert!(note.contains("builtin:fair_share, builtin:rate_limit"), "{note}");
        assert!(note.contains("PHOS_WITHOUT_POLICIES=1"), "{note}");
        assert_eq!(shipped::absent_from(&[("fair_share", b"\x7fELF")], &["fair_share"]), None);
    }

    #[test]
    fn this_build_has_every_shipped_policy_unless_built_without() {
        match shipped::absent() {
            None => assert_eq!(shipped::SHIPPED.iter().map(|(n, _)| *n).collect::<Vec<_>>(), shipped::NAMES),
            Some(note) => assert!(shipped::SHIPPED.is_empty() && note.contains("PHOS_WITHOUT_POLICIES"), "{note}"),
        }
        assert!(shipped::NAMES.contains(&"fair_share"), "{:?}", shipped::NAMES);
    }
}
