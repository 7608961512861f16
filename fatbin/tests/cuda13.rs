//! Checks against fat binaries built by the optional CUDA 13.0 toolchain (see
//! `common::cuda13`); every test is skipped with a notice when it is absent.
//!
//! CUDA 13 differs from 11.8 in ways this crate must handle: Zstandard compression (flag
//! 0x8000) by default, 80-byte PTX entry headers, cubins with `EI_OSABI` 0x41, and
//! `EIATTR_KPARAM_INFO_V2` for kernels with very large by-value parameters.

mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use common::*;
use phos_fatbin::{Compression, EntryKind, FatBinary, elf::Elf};

/// `.nv_fatbin` sections of `kernels.cu` objects, by `-Xfatbin` option set.
struct Builds {
    tc: Toolchain,
    sections: BTreeMap<&'static str, Vec<u8>>,
}

const MODES: [(&str, &[&str]); 6] = [
    ("none", &["-Xfatbin", "-compress-mode=none"]),
    ("default", &[]),
    ("size", &["-Xfatbin", "-compress-mode=size"]),
    ("speed", &["-Xfatbin", "-compress-mode=speed"]),
    ("all", &["-Xfatbin", "-compress-all"]),
    ("all-speed", &["-Xfatbin", "-compress-all", "-Xfatbin", "-compress-mode=speed"]),
];

fn builds() -> Option<&'static Builds> {
    static BUILDS: OnceLock<Option<Builds>> = OnceLock::new();
    BUILDS
        .get_or_init(|| {
            let tc = cuda13()?;
            let scratch = Scratch::new("cuda13-objects");
            let dir = scratch.path();
            let sections = std::thread::scope(|s| {
                let handles: Vec<_> = MODES
                    .iter()
                    .map(|&(mode, extra)| {
                        let tc = &tc;
                        s.spawn(move || (mode, section(&object(tc, dir, &format!("{mode}.o"), extra), ".nv_fatbin")))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            Some(Builds { tc, sections })
        })
        .as_ref()
}

/// (kind, arch) -> (compression, payload) of the one container in `section`.
fn decode(section: &[u8]) -> BTreeMap<(u16, u32), (Compression, Vec<u8>)> {
    let found = containers(section);
    assert_eq!(found.len(), 1);
    found[0]
        .entries()
        .map(|e| {
            let e = e.unwrap();
            ((e.kind.raw(), e.sm_arch), (e.compression, e.payload().unwrap().into_owned()))
        })
        .collect()
}

#[test]
fn compression_modes_and_methods() {
    let Some(b) = builds() else { return };
    // (PTX, cubin) compression per mode.
    let expected = BTreeMap::from([
        ("none", (Compression::None, Compression::None)),
        ("default", (Compression::Zstd, Compression::None)),
        // Favouring size compresses cubins as well.
        ("size", (Compression::Zstd, Compression::Zstd)),
        ("speed", (Compression::Lz4, Compression::None)),
        ("all", (Compression::Zstd, Compression::Zstd)),
        ("all-speed", (Compression::Lz4, Compression::Lz4)),
    ]);
    for (mode, section) in &b.sections {
        for ((kind, arch), (compression, _)) in decode(section) {
            let (ptx, cubin) = expected[mode];
            assert_eq!(compression, if kind == 1 { ptx } else { cubin }, "{mode}: kind {kind} sm_{arch}");
        }
    }
}

#[test]
fn every_mode_decodes_to_the_uncompressed_payloads() {
    let Some(b) = builds() else { return };
    let reference = decode(&b.sections["none"]);
    let archs: Vec<(u16, u32)> = reference.keys().copied().collect();
    let mut expected_archs: Vec<(u16, u32)> = b.tc.cubin_archs.iter().map(|&a| (2, a)).collect();
    expected_archs.extend(b.tc.ptx_archs.iter().map(|&a| (1, a)));
    expected_archs.sort();
    assert_eq!(archs, expected_archs);
    for (mode, section) in &b.sections {
        let decoded = decode(section);
        assert_eq!(decoded.keys().copied().collect::<Vec<_>>(), archs, "{mode}");
        for (key, (_, payload)) in decoded {
            assert!(same_modulo_padding(&payload, &reference[&key].1), "{mode} {key:?}");
        }
    }
}

#[test]
fn entry_headers_and_ptx() {
    let Some(b) = builds() else { return };
    let fatbin = FatBinary::parse(&b.sections["default"]).unwrap();
    for entry in fatbin.entries() {
        let entry = entry.unwrap();
        match entry.kind {
            EntryKind::Cubin => {
                assert_eq!(entry.header.len(), 64);
                assert_eq!((entry.version_major, entry.version_minor), (1, 8));
                let payload = entry.payload().unwrap();
                assert_eq!(Elf::parse(&payload).unwrap().header().os_abi, 0x41);
            }
            EntryKind::Ptx => {
                assert_eq!(entry.header.len(), 80);
                assert_eq!((entry.version_major, entry.version_minor), (9, 0), "PTX ISA 9.0");
                assert_eq!(entry.options, None, "empty options string");
                let text = entry.ptx_text().unwrap().unwrap();
                assert!(text.contains(&format!(".target sm_{}", entry.sm_arch)));
                for name in expected_kernels().keys() {
                    assert!(text.contains(&format!(".entry {name}(")), "sm_{} PTX lacks {name}", entry.sm_arch);
                }
            }
            EntryKind::Other(kind) => panic!("unexpected kind {kind}"),
        }
    }
}

#[test]
fn kernel_layouts_match_the_declarations() {
    let Some(b) = builds() else { return };
    for (mode, section) in &b.sections {
        for ((kind, arch), (_, payload)) in decode(section) {
            if kind == 2 {
                assert_eq!(layouts(&payload), as_owned(expected_kernels()), "{mode} sm_{arch}");
            }
        }
    }
}

/// A 20000-byte by-value parameter: the cubin switches to `EIATTR_KPARAM_INFO_V2`.
#[test]
fn large_parameters_use_kparam_info_v2() {
    let Some(b) = builds() else { return };
    let scratch = Scratch::new("cuda13-large");
    let obj = build(&b.tc, scratch.path(), "large.o", &["-c"], &["large_params.cu"]);
    let section = section(&obj, ".nv_fatbin");
    let expected = BTreeMap::from([(
        "huge_param".to_owned(),
        // (char, Huge /* 20000, align 1 */, double, int *, short, Mid /* 16, align 8 */)
        (vec![(0, 1), (1, 20000), (20008, 8), (20016, 8), (20024, 2), (20032, 16)], 20048),
    )]);
    let mut cubins = 0;
    for ((kind, arch), (_, payload)) in decode(&section) {
        if kind != 2 {
            continue;
        }
        cubins += 1;
        let elf = Elf::parse(&payload).unwrap();
        let info = elf.section(".nv.info.huge_param").unwrap();
        let ids: Vec<u8> = phos_fatbin::cubin::attributes(info).map(|a| a.unwrap().id).collect();
        assert!(ids.contains(&phos_fatbin::cubin::EIATTR_KPARAM_INFO_V2), "sm_{arch}: {ids:x?}");
        assert!(!ids.contains(&phos_fatbin::cubin::EIATTR_KPARAM_INFO), "sm_{arch}: {ids:x?}");
        assert_eq!(layouts(&payload), expected, "sm_{arch}");
    }
    assert_eq!(cubins, b.tc.cubin_archs.len());
}

#[test]
fn executable_wrappers_point_at_containers() {
    let Some(b) = builds() else { return };
    let scratch = Scratch::new("cuda13-exe");
    let mut extra = vec!["-cudart", "shared"];
    extra.extend(b.tc.link_args.iter().map(String::as_str));
    let exe = build(&b.tc, scratch.path(), "app", &extra, &["kernels.cu", "second.cu", "main.cu"]);
    check_executable(&exe, 90);
}
