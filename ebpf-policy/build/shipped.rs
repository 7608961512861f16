//! Building the shipped policies (`policies/*.c`) with clang, for build.rs. A build that
//! cannot compile them fails and says what to install: a binary without them would refuse
//! `builtin:` policies on the GPU machine, long after the build. `PHOS_WITHOUT_POLICIES=1`
//! builds without them on purpose, and `phosctl` then says so. Also compiled into the
//! crate's unit tests, which run it against a clang that is not there.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable that builds without the shipped policies.
pub const OPT_OUT: &str = "PHOS_WITHOUT_POLICIES";

/// Whether `PHOS_WITHOUT_POLICIES` (its value, if set) asks for a build without the shipped
/// policies: `1` yes; unset, empty or `0` no; anything else is refused, so that a typo does
/// not decide.
pub fn opted_out(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("{OPT_OUT}={other}: use 1 to build without the shipped policies, or 0")),
    }
}

/// The policy sources in `dir`, sorted: (name, path).
pub fn sources(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .map(|p| (p.file_stem().expect("a .c file has a stem").to_string_lossy().into_owned(), p))
        .collect();
    found.sort();
    found
}

/// Compile each source into `out` (`NAME.o`) with `clang -target bpf`; the objects, or why
/// they cannot be built (clang's own errors go to the build's output).
pub fn compile(
    clang: &str,
    include: &Path,
    sources: &[(String, PathBuf)],
    out: &Path,
) -> Result<Vec<(String, PathBuf)>, String> {
    let mut built = Vec::new();
    for (name, src) in sources {
        let obj = out.join(format!("{name}.o"));
        let status = Command::new(clang)
            .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror", "-I"])
            .arg(include)
            .arg("-c")
            .arg(src)
            .arg("-o")
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => built.push((name.clone(), obj)),
            Ok(s) => {
                return Err(format!(
                    "`{clang}` could not compile the shipped policy {} for the BPF target ({s}; its errors are above): \
                     a clang with the BPF target is needed (Debian/Ubuntu: apt-get install clang)",
                    src.display()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing_clang(clang)),
            Err(e) => return Err(format!("running `{clang}` for the shipped policies: {e}")),
        }
    }
    Ok(built)
}

/// What a builder without clang is told.
pub fn missing_clang(clang: &str) -> String {
    format!(
        "the shipped eBPF policies (ebpf-policy/policies/*.c) are compiled with clang, and `{clang}` was not found. \
         Install clang (Debian/Ubuntu: apt-get install clang llvm; or run scripts/setup.sh), or set PHOS_CLANG to a \
         clang with the BPF target. To build Phos without the shipped policies on purpose, set {OPT_OUT}=1: \
         `builtin:` policies are then refused, and phosctl says at start that they are not in the build."
    )
}

/// The generated `shipped.rs`: every policy's name, and the objects built (none when opted out).
pub fn table(names: &[String], built: &[(String, PathBuf)]) -> String {
    let mut t = String::from("/// The shipped policies' names (built or not).\n");
    t.push_str(&format!("pub static NAMES: &[&str] = &{names:?};\n"));
    t.push_str("/// The shipped policies in this build: (name, ELF object); empty when built with ");
    t.push_str(&format!("{OPT_OUT}=1.\n"));
    t.push_str("pub static SHIPPED: &[(&str, &[u8])] = &[\n");
    for (name, obj) in built {
        t.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", obj.display().to_string()));
    }
    t.push_str("];\n");
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_clang_the_build_fails_and_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let policies = sources(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/policies")));
        assert!(!policies.is_empty());
        let err = compile("/nonexistent/clang", dir.path(), &policies, dir.path()).unwrap_err();
        assert_eq!(err, missing_clang("/nonexistent/clang"));
        for needed in ["apt-get install clang", "PHOS_CLANG", "PHOS_WITHOUT_POLICIES=1", "scripts/setup.sh"] {
            assert!(err.contains(needed), "`{needed}` not in: {err}");
        }
    }

    #[test]
    fn only_an_explicit_1_opts_out() {
        assert_eq!(opted_out(None), Ok(false));
        assert_eq!(opted_out(Some("0")), Ok(false));
        assert_eq!(opted_out(Some("")), Ok(false));
        assert_eq!(opted_out(Some("1")), Ok(true));
        assert!(opted_out(Some("yes")).unwrap_err().contains("PHOS_WITHOUT_POLICIES=yes"));
    }

    #[test]
    fn the_table_of_a_build_without_policies_still_names_them() {
        let names = vec!["fair_share".to_string(), "rate_limit".to_string()];
        let t = table(&names, &[]);
        assert!(t.contains(r#"NAMES: &[&str] = &["fair_share", "rate_limit"];"#), "{t}");
        assert!(t.contains("SHIPPED: &[(&str, &[u8])] = &[\n];"), "{t}");
    }
}
