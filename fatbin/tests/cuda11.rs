//! Checks against real fat binaries built by the CUDA 11.8 `nvcc` on `PATH`.
//!
//! Skipped with a notice when `nvcc` is missing, failed instead when `PHOS_REQUIRE_NVCC=1`.

mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use common::*;
use phos_fatbin::{Compression, EntryKind, FLAG_HOST_LINUX, FatBinary, elf::Elf};

/// Object files built from `kernels.cu` once per test binary.
struct Builds {
    tc: Toolchain,
    /// `-Xfatbin -compress=false`: nothing compressed.
    uncompressed: Vec<u8>,
    /// nvcc's default: PTX compressed.
    default: Vec<u8>,
    /// `-Xfatbin -compress-all`: everything compressed.
    compress_all: Vec<u8>,
}

fn builds() -> Option<&'static Builds> {
    static BUILDS: OnceLock<Option<Builds>> = OnceLock::new();
    BUILDS
        .get_or_init(|| {
            let tc = cuda11()?;
            let scratch = Scratch::new("cuda11-objects");
            let dir = scratch.path();
            let (uncompressed, default, compress_all) = std::thread::scope(|s| {
                let a = s.spawn(|| object(&tc, dir, "uncompressed.o", &["-Xfatbin", "-compress=false"]));
                let b = s.spawn(|| object(&tc, dir, "default.o", &[]));
                let c = object(&tc, dir, "compress_all.o", &["-Xfatbin", "-compress-all"]);
                (a.join().unwrap(), b.join().unwrap(), c)
            });
            Some(Builds { tc, uncompressed, default, compress_all })
        })
        .as_ref()
}

/// The one container of an object file's `.nv_fatbin`.
fn only_container(object: &[u8]) -> Vec<u8> {
    let section = section(object, ".nv_fatbin");
    let found = containers(&section);
    assert_eq!(found.len(), 1, "one translation unit, one container");
    assert_eq!(found[0].len(), section.len(), "the container fills the section");
    section
}

/// (kind, arch) -> (compression, payload, PTX text) for every entry of a container.
type Decoded = BTreeMap<(u16, u32), (Compression, Vec<u8>, Option<String>)>;

fn decode(section: &[u8]) -> Decoded {
    let fatbin = FatBinary::parse(section).unwrap();
    let mut out = BTreeMap::new();
    for entry in fatbin.entries() {
        let entry = entry.unwrap();
        let payload = entry.payload().unwrap().into_owned();
        if entry.compressed {
            assert_eq!(payload.len() as u64, entry.uncompressed_size);
        }
        let old =
            out.insert((entry.kind.raw(), entry.sm_arch), (entry.compression, payload, entry.ptx_text().unwrap()));
        assert!(old.is_none(), "duplicate entry {:?} sm_{}", entry.kind, entry.sm_arch);
    }
    out
}

#[test]
fn object_has_a_cubin_per_arch_and_ptx() {
    let Some(b) = builds() else { return };
    let section = only_container(&b.uncompressed);
    let fatbin = FatBinary::parse(&section).unwrap();
    assert_eq!((fatbin.version(), fatbin.header_size()), (1, 16));
    let mut cubins = Vec::new();
    let mut ptx = Vec::new();
    for entry in fatbin.entries() {
        let entry = entry.unwrap();
        assert!(!entry.compressed && entry.compression == Compression::None);
        assert!(entry.is_64bit() && !entry.is_debug());
        assert_ne!(entry.flags & FLAG_HOST_LINUX, 0);
        assert_eq!(entry.header_version, 0x0101);
        assert_eq!((entry.compressed_size, entry.uncompressed_size), (0, 0));
        match entry.kind {
            EntryKind::Cubin => {
                cubins.push(entry.sm_arch);
                assert_eq!(entry.header.len(), 64);
                assert_eq!((entry.version_major, entry.version_minor), (1, 7), "cubin ELF ABI version");
                assert!(entry.raw_payload.starts_with(b"\x7fELF"));
            }
            EntryKind::Ptx => {
                ptx.push(entry.sm_arch);
                assert_eq!(entry.header.len(), 72);
                assert_eq!((entry.version_major, entry.version_minor), (7, 8), "PTX ISA 7.8");
            }
            EntryKind::Other(kind) => panic!("unexpected entry kind {kind}"),
        }
        assert_eq!(entry.raw_payload.len() % 8, 0, "payloads are padded to 8");
    }
    assert_eq!(cubins, b.tc.cubin_archs);
    assert_eq!(ptx, b.tc.ptx_archs);
}

#[test]
fn default_build_compresses_only_ptx() {
    let Some(b) = builds() else { return };
    for ((kind, arch), (compression, ..)) in decode(&only_container(&b.default)) {
        let expected = if kind == 1 { Compression::Lz4 } else { Compression::None };
        assert_eq!(compression, expected, "kind {kind} sm_{arch}");
    }
    for ((kind, arch), (compression, ..)) in decode(&only_container(&b.compress_all)) {
        assert_eq!(compression, Compression::Lz4, "kind {kind} sm_{arch}");
    }
}

#[test]
fn compressed_payloads_equal_uncompressed_ones() {
    let Some(b) = builds() else { return };
    let reference = decode(&only_container(&b.uncompressed));
    for (label, object) in [("default", &b.default), ("compress-all", &b.compress_all)] {
        let decoded = decode(&only_container(object));
        assert_eq!(decoded.keys().collect::<Vec<_>>(), reference.keys().collect::<Vec<_>>(), "{label}");
        for (key, (_, payload, text)) in &decoded {
            let (_, expected, expected_text) = &reference[key];
            assert!(same_modulo_padding(payload, expected), "{label} {key:?}: payload differs");
            assert_eq!(text, expected_text, "{label} {key:?}");
        }
    }
}

#[test]
fn kernel_layouts_match_the_declarations() {
    let Some(b) = builds() else { return };
    for object in [&b.uncompressed, &b.default, &b.compress_all] {
        for ((kind, arch), (_, payload, _)) in decode(&only_container(object)) {
            if kind == 2 {
                assert_eq!(layouts(&payload), as_owned(expected_kernels()), "sm_{arch}");
            }
        }
    }
}

#[test]
fn ptx_declares_every_kernel() {
    let Some(b) = builds() else { return };
    for ((kind, arch), (_, _, text)) in decode(&only_container(&b.compress_all)) {
        if kind != 1 {
            continue;
        }
        let text = text.expect("PTX entries have text");
        assert!(!text.contains('\0'));
        assert!(text.contains(&format!(".target sm_{arch}")), "sm_{arch}");
        for name in expected_kernels().keys() {
            assert!(text.contains(&format!(".entry {name}(")), "sm_{arch} PTX lacks .entry {name}");
        }
    }
}

/// `cuobjdump -xelf all` / `-xptx all` extract the entries as NVIDIA's tool decodes them; our
/// decoding of the compressed build must give the same bytes.
#[test]
fn cuobjdump_extracts_the_same_bytes() {
    let Some(b) = builds() else { return };
    let Some(cuobjdump) = &b.tc.cuobjdump else {
        eprintln!("notice: no cuobjdump; skipping");
        return;
    };
    let scratch = Scratch::new("cuda11-cuobjdump-x");
    std::fs::write(scratch.path().join("k.o"), &b.compress_all).unwrap();
    run(cuobjdump, scratch.path(), &["-xelf".into(), "all".into(), "k.o".into()]);
    run(cuobjdump, scratch.path(), &["-xptx".into(), "all".into(), "k.o".into()]);
    let decoded = decode(&only_container(&b.compress_all));
    let mut compared = 0;
    for file in std::fs::read_dir(scratch.path()).unwrap() {
        let path = file.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // Names look like k.1.sm_52.cubin and k.2.sm_80.ptx.
        let Some((stem, ext)) = name.rsplit_once('.') else { continue };
        let Some(arch) = stem.rsplit_once(".sm_").and_then(|(_, a)| a.parse::<u32>().ok()) else { continue };
        let extracted = std::fs::read(&path).unwrap();
        match ext {
            "cubin" => assert_eq!(decoded[&(2, arch)].1, extracted, "{name}"),
            "ptx" => assert_eq!(decoded[&(1, arch)].2.as_deref().unwrap().as_bytes(), extracted, "{name}"),
            _ => continue,
        }
        compared += 1;
    }
    assert_eq!(compared, b.tc.cubin_archs.len() + b.tc.ptx_archs.len());
}

/// kernel -> ((ordinal, offset, size) list, parameter buffer size if any).
type ParamListing = BTreeMap<String, (Vec<(u16, u16, u16)>, Option<u32>)>;

/// Parses the `.nv.info.<kernel>` parts of `cuobjdump -elf` output; the size is
/// `EIATTR_CBANK_PARAM_SIZE`.
fn cuobjdump_params(listing: &str) -> ParamListing {
    let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let mut out = ParamListing::new();
    let mut current: Option<String> = None;
    let mut attribute = String::new();
    for line in listing.lines() {
        if let Some(name) = line.strip_prefix(".nv.info.") {
            current = Some(name.trim().to_owned());
            out.entry(name.trim().to_owned()).or_default();
            continue;
        }
        if line.starts_with('.') {
            current = None;
            continue;
        }
        let Some(kernel) = &current else { continue };
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |key: &str| words.iter().position(|w| *w == key).map(|i| hex(words[i + 2]));
        if let Some(i) = words.iter().position(|w| *w == "Attribute:") {
            attribute = words[i + 1].to_owned();
        } else if let (Some(ordinal), Some(offset), Some(size)) = (after("Ordinal"), after("Offset"), after("Size")) {
            out.get_mut(kernel).unwrap().0.push((ordinal as u16, offset as u16, size as u16));
        } else if attribute == "EIATTR_CBANK_PARAM_SIZE" && words.first() == Some(&"Value:") {
            out.get_mut(kernel).unwrap().1 = Some(hex(words[1]));
        }
    }
    out
}

#[test]
fn cuobjdump_lists_the_same_parameters() {
    let Some(b) = builds() else { return };
    let Some(cuobjdump) = &b.tc.cuobjdump else {
        eprintln!("notice: no cuobjdump; skipping");
        return;
    };
    let scratch = Scratch::new("cuda11-cuobjdump-elf");
    for ((kind, arch), (_, payload, _)) in decode(&only_container(&b.compress_all)) {
        if kind != 2 {
            continue;
        }
        let file = format!("sm_{arch}.cubin");
        std::fs::write(scratch.path().join(&file), &payload).unwrap();
        let listing = run(cuobjdump, scratch.path(), &["-elf".into(), file]);
        let theirs = cuobjdump_params(&listing);
        let ours: ParamListing = phos_fatbin::cubin::kernels(&payload)
            .unwrap()
            .into_iter()
            .map(|k| {
                let params = k.params.iter().map(|p| (p.ordinal, p.offset, p.size)).collect();
                (k.name, (params, Some(k.buffer_size).filter(|&s| s > 0)))
            })
            .collect();
        let theirs: ParamListing = theirs
            .into_iter()
            .map(|(name, (mut params, size))| {
                params.sort();
                (name, (params, size))
            })
            .collect();
        assert_eq!(ours, theirs, "sm_{arch}");
    }
}

/// In a linked executable every translation unit contributes a container to `.nv_fatbin` and
/// a version-1 wrapper to `.nvFatBinSegment`; the device-link step adds a version-2 pair.
#[test]
fn executable_wrappers_point_at_containers() {
    let Some(b) = builds() else { return };
    let scratch = Scratch::new("cuda11-exe");
    let mut extra = vec!["-cudart", "shared"];
    let link: Vec<&str> = b.tc.link_args.iter().map(String::as_str).collect();
    extra.extend(link);
    let exe = build(&b.tc, scratch.path(), "app", &extra, &["kernels.cu", "second.cu", "main.cu"]);
    check_executable(&exe, 80);
}

/// With `-rdc=true` the fat binary lands in `__nv_relfatbin`, and the non-inlined device
/// function gets an `.nv.info` section of its own; it must not be reported as a kernel.
#[test]
fn relocatable_objects_report_kernels_but_not_device_functions() {
    let Some(b) = builds() else { return };
    let scratch = Scratch::new("cuda11-rdc");
    let obj = object(&b.tc, scratch.path(), "rdc.o", &["-rdc=true"]);
    let section = section(&obj, "__nv_relfatbin");
    let mut cubins = 0;
    for container in containers(&section) {
        for entry in container.entries() {
            let entry = entry.unwrap();
            if entry.kind != EntryKind::Cubin {
                continue;
            }
            cubins += 1;
            let payload = entry.payload().unwrap();
            let elf = Elf::parse(&payload).unwrap();
            assert!(elf.section(".nv.info._Z6scaledfi").is_some(), "the device function has attributes");
            assert_eq!(layouts(&payload), as_owned(expected_kernels()), "sm_{}", entry.sm_arch);
        }
    }
    assert_eq!(cubins, b.tc.cubin_archs.len());
}

/// `-G` sets the debug flag, compresses the cubin too, and records the source path and the
/// PTX compile options in the entry headers.
#[test]
fn debug_builds_record_source_and_options() {
    let Some(b) = builds() else { return };
    let scratch = Scratch::new("cuda11-debug");
    let args: Vec<String> =
        ["-G", "-gencode", "arch=compute_70,code=[sm_70,compute_70]", "-c", &data("kernels.cu"), "-o", "debug.o"]
            .map(String::from)
            .to_vec();
    run(&b.tc.nvcc, scratch.path(), &args);
    let obj = std::fs::read(scratch.path().join("debug.o")).unwrap();
    let section = only_container(&obj);
    let fatbin = FatBinary::parse(&section).unwrap();
    let mut kinds = Vec::new();
    for entry in fatbin.entries() {
        let entry = entry.unwrap();
        kinds.push(entry.kind);
        assert!(entry.is_debug());
        assert!(entry.compressed, "debug images are compressed by default");
        let identifier = String::from_utf8_lossy(entry.identifier.expect("source path recorded")).into_owned();
        assert!(identifier.ends_with("tests/data/kernels.cu"), "{identifier}");
        match entry.kind {
            EntryKind::Ptx => {
                let options = String::from_utf8_lossy(entry.options.expect("PTX options recorded")).into_owned();
                assert!(options.split_whitespace().any(|o| o == "-g"), "{options}");
            }
            _ => assert_eq!(layouts(&entry.payload().unwrap()), as_owned(expected_kernels())),
        }
    }
    assert_eq!(kinds, [EntryKind::Cubin, EntryKind::Ptx]);
}
