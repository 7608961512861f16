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
/// Empty where clang was not available.
pub mod shipped {
    include!(concat!(env!("OUT_DIR"), "/shipped.rs"));

    /// A shipped policy's object by name.
    pub fn get(name: &str) -> Option<&'static [u8]> {
        SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, elf)| *elf)
    }
}

/// The headers a policy is compiled with: (file name, contents).
pub const HEADERS: &[(&str, &str)] = &[
    ("phos_policy.h", include_str!("../include/phos_policy.h")),
    ("phos_spec.h", include_str!(concat!(env!("OUT_DIR"), "/include/phos_spec.h"))),
];

/// A policy object named on a command line or in a configuration file: `builtin:NAME` or a
/// path to an ELF object. Returns (what to call its source, the object).
pub fn resolve(spec: &str) -> Result<(String, Vec<u8>), String> {
    if let Some(name) = spec.strip_prefix("builtin:") {
        return match shipped::get(name) {
            Some(elf) => Ok((spec.to_string(), elf.to_vec())),
            None if shipped::SHIPPED.is_empty() => {
                Err(format!("no shipped policies in this build (clang was missing when it was built): {spec}"))
            }
            None => Err(format!(
                "no shipped policy `{name}`; there are: {}",
                shipped::SHIPPED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            )),
        };
    }
    let path = std::path::Path::new(spec);
    let elf = std::fs::read(path).map_err(|e| format!("{spec}: {e}"))?;
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
pub fn build(source: &std::path::Path, output: &std::path::Path, clang: &str) -> Result<(), String> {
    // One directory per build: builds on several threads must not remove each other's.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let include = std::env::temp_dir().join(format!("phos-policy-include-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&include).map_err(|e| format!("{}: {e}", include.display()))?;
    for (name, text) in HEADERS {
        std::fs::write(include.join(name), text).map_err(|e| format!("{name}: {e}"))?;
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
        Ok(s) => Err(format!("{clang} failed ({s})")),
        Err(e) => Err(format!("{clang}: {e} (install clang to build policies)")),
    }
}
pub mod runtime;
