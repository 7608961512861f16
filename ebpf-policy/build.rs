//! Generates `phos_spec.h` (function ids and resource indices of every API's spec) next to the
//! hand-written `include/phos_policy.h`, and builds the shipped policies (`policies/*.c`)
//! with clang (`PHOS_CLANG`, default `clang`). Without clang the build fails and says what
//! to install, unless `PHOS_WITHOUT_POLICIES=1` asks for a build without the shipped
//! policies (`shipped::SHIPPED` is then empty and phosctl says so); see build/shipped.rs.

#[path = "build/shipped.rs"]
mod shipped;

use std::path::{Path, PathBuf};

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let apis = phos_codegen::build_support::load_specs(phos_spec::SPEC_PATHS);
    let include = out.join("include");
    std::fs::create_dir_all(&include).expect("creating OUT_DIR/include");
    std::fs::write(include.join("phos_spec.h"), phos_codegen::emit::policy_header::emit(&apis))
        .expect("writing phos_spec.h");
    std::fs::copy("include/phos_policy.h", include.join("phos_policy.h")).expect("copying phos_policy.h");
    println!("cargo::rerun-if-changed=include/phos_policy.h");
    println!("cargo::rerun-if-changed=build/shipped.rs");
    println!("cargo::rerun-if-changed=policies");
    println!("cargo::rerun-if-env-changed=PHOS_CLANG");
    println!("cargo::rerun-if-env-changed={}", shipped::OPT_OUT);

    let sources = shipped::sources(Path::new("policies"));
    for (_, src) in &sources {
        println!("cargo::rerun-if-changed={}", src.display());
    }
    let names: Vec<String> = sources.iter().map(|(n, _)| n.clone()).collect();
    let built = match shipped::opted_out(std::env::var(shipped::OPT_OUT).ok().as_deref()) {
        Ok(true) => {
            println!("cargo::warning=built without the shipped policies ({}=1)", shipped::OPT_OUT);
            Vec::new()
        }
        Ok(false) => {
            let objects = out.join("policies");
            std::fs::create_dir_all(&objects).expect("creating OUT_DIR/policies");
            let clang = std::env::var("PHOS_CLANG").unwrap_or_else(|_| "clang".into());
            match shipped::compile(&clang, &include, &sources, &objects) {
                Ok(built) => built,
                Err(why) => fail(&why),
            }
        }
        Err(why) => fail(&why),
    };
    std::fs::write(out.join("shipped.rs"), shipped::table(&names, &built)).expect("writing shipped.rs");
}

/// Stop the build with `why` as cargo's error (cargo fails the build on `cargo::error` and
/// prints just the message, where a failing exit status would dump the script's output too).
fn fail(why: &str) -> ! {
    println!("cargo::error={why}");
    std::process::exit(0)
}
