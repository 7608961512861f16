//! The names of a module's variables (`__device__`, `__constant__`), read from the module
//! image. A GPU driver keeps module variables in memory of its own and offers no way to list
//! them, but a checkpoint must capture all of them (a kernel may have changed one the guest
//! never asked about), so the server finds them in the image: symbols of a cubin's
//! `.nv.global`/`.nv.constant` sections, or else the `.global`/`.const` variables of the PTX.

use std::collections::BTreeSet;

const STT_OBJECT: u8 = 1;

/// Variable names of a module image (a fat binary container, a cubin or a PTX text). An
/// image that cannot be read gives no names: the variables the guest asks for are still
/// captured.
pub fn variable_names(image: &[u8]) -> Vec<String> {
    let mut names = BTreeSet::new();
    if let Ok(fatbin) = phos_fatbin::FatBinary::parse(image) {
        let mut ptx = None;
        for entry in fatbin.entries().flatten() {
            match entry.kind {
                phos_fatbin::EntryKind::Cubin => {
                    if let Ok(elf) = entry.payload() {
                        cubin_names(&elf, &mut names);
                    }
                }
                phos_fatbin::EntryKind::Ptx if ptx.is_none() => ptx = entry.ptx_text().ok().flatten(),
                _ => {}
            }
        }
        if names.is_empty()
            && let Some(text) = ptx
        {
            ptx_names(&text, &mut names);
        }
    } else if image.starts_with(b"\x7fELF") {
        cubin_names(image, &mut names);
    } else if let Ok(text) = std::str::from_utf8(image.split(|&b| b == 0).next().unwrap_or(&[])) {
        ptx_names(text, &mut names);
    }
    names.into_iter().collect()
}

fn cubin_names(elf: &[u8], names: &mut BTreeSet<String>) {
    let Ok(elf) = phos_fatbin::elf::Elf::parse(elf) else { return };
    let Ok(symbols) = elf.symbols() else { return };
    for s in symbols {
        if s.kind() != STT_OBJECT || s.name.is_empty() {
            continue;
        }
        let section = elf.sections().get(s.shndx as usize).map(|sec| sec.name).unwrap_or("");
        if section.starts_with(".nv.global") || section.starts_with(".nv.constant") {
            names.insert(s.name.to_string());
        }
    }
}

fn ptx_names(text: &str, names: &mut BTreeSet<String>) {
    let Ok(module) = phos_ptx::parse(text) else { return };
    for v in module.variables() {
        if matches!(v.space, phos_ptx::StateSpace::Global | phos_ptx::StateSpace::Const) {
            for d in &v.declarators {
                names.insert(d.name.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_ptx_text() {
        let ptx = ".version 7.0\n.target sm_70\n.address_size 64\n.global .align 4 .u32 counter = 1;\n.const .align 4 .b8 table[16];\n.shared .align 4 .b8 tile[64];\n";
        assert_eq!(variable_names(ptx.as_bytes()), vec!["counter".to_string(), "table".to_string()]);
    }

    /// A fat binary built by nvcc: names come from its cubin (and its PTX where there is no
    /// cubin).
    #[test]
    fn from_nvcc_fat_binaries() {
        let Some(nvcc) = std::env::var_os("PATH")
            .and_then(|p| std::env::split_paths(&p).map(|d| d.join("nvcc")).find(|p| p.exists()))
        else {
            assert!(std::env::var("PHOS_REQUIRE_NVCC").as_deref() != Ok("1"), "nvcc required");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/cuda/symbols.cu");
        let inc = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/cuda");
        for arch in ["-arch=sm_70", "-arch=compute_70"] {
            let obj = dir.path().join("symbols.o");
            let ok = std::process::Command::new(&nvcc)
                .args(["-c", arch, "-I", inc, "-o"])
                .arg(&obj)
                .arg(src)
                .status()
                .unwrap();
            assert!(ok.success());
            let bytes = std::fs::read(&obj).unwrap();
            let elf = phos_fatbin::elf::Elf::parse(&bytes).unwrap();
            let section = elf.section(".nv_fatbin").expect("a fat binary section").data;
            let names = variable_names(section);
            for want in ["coefficients", "counter", "table"] {
                assert!(names.iter().any(|n| n.contains(want)), "{arch}: {want} not in {names:?}");
            }
        }
    }
}
