//! Generates `phos_spec.h` (function ids and resource indices of the spec) next to the
//! hand-written `include/phos_policy.h`, and builds the shipped policies (`policies/*.c`)
//! with clang where it is installed. Without clang the crate still builds: the shipped
//! policies are then missing (`shipped()` is empty) and `phosctl policy build` says why.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let api = phos_codegen::build_support::load_spec(Path::new(phos_spec::CUDART_SPEC_PATH));
    let include = out.join("include");
    std::fs::create_dir_all(&include).expect("creating OUT_DIR/include");
    std::fs::write(include.join("phos_spec.h"), phos_codegen::emit::policy_header::emit(&api))
        .expect("writing phos_spec.h");
    std::fs::copy("include/phos_policy.h", include.join("phos_policy.h")).expect("copying phos_policy.h");
    println!("cargo::rerun-if-changed=include/phos_policy.h");
    println!("cargo::rerun-if-changed=policies");
    println!("cargo::rerun-if-env-changed=PHOS_CLANG");

    let policies = out.join("policies");
    std::fs::create_dir_all(&policies).expect("creating OUT_DIR/policies");
    let clang = std::env::var("PHOS_CLANG").unwrap_or_else(|_| "clang".into());
    let mut sources: Vec<PathBuf> = std::fs::read_dir("policies")
        .expect("reading policies/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    sources.sort();
    let mut built = Vec::new();
    for src in &sources {
        println!("cargo::rerun-if-changed={}", src.display());
        let name = src.file_stem().unwrap().to_string_lossy().into_owned();
        let obj = policies.join(format!("{name}.o"));
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror", "-I"])
            .arg(&include)
            .arg("-c")
            .arg(src)
            .arg("-o")
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => built.push((name, obj)),
            Ok(s) => panic!("clang failed on {} ({s})", src.display()),
            Err(e) => {
                println!("cargo::warning=shipped policies not built: {clang}: {e}");
                built.clear();
                break;
            }
        }
    }
    let mut table = String::from("/// The shipped policies, built from `policies/*.c`: (name, ELF object).\n");
    table.push_str("pub static SHIPPED: &[(&str, &[u8])] = &[\n");
    for (name, obj) in &built {
        table.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", obj.display().to_string()));
    }
    table.push_str("];\n");
    std::fs::write(out.join("shipped.rs"), table).expect("writing shipped.rs");
}
