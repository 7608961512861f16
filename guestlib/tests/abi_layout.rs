//! The `cudaDeviceProp` mirrors of `src/abi.rs` against the real CUDA headers, and the values
//! that `write_device_prop` puts in them.
//!
//! The header tests compile `tests/abi/props_layout.c` with `cc -I<dir>` for each major
//! version and compare its offsets with the Rust structs. The directories come from
//! `PHOS_CUDA11_INCLUDE` (default `/usr/include`), `PHOS_CUDA12_INCLUDE` and
//! `PHOS_CUDA13_INCLUDE` (defaults: the CUDA pip wheels unpacked under `/tmp/wheels`). A
//! version whose directory lacks the headers is skipped with a notice, or fails when
//! `PHOS_REQUIRE_HEADERS=1`.

// The module needs nothing but std and phos-protocol, so the test compiles it by itself and
// does not depend on the library's crate type (a cdylib cannot be linked into a test).
#[path = "../src/abi.rs"]
#[allow(dead_code)]
mod abi;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use abi::{Abi, DeviceProp11, DeviceProp12, DeviceProp13, device_prop_size, write_device_prop};
use phos_protocol::types::DeviceProperties;

#[test]
fn sizes_match_the_headers() {
    // sizeof(struct cudaDeviceProp) measured on x86-64 Linux with each version's headers.
    assert_eq!(device_prop_size(Abi::V11), 728, "CUDA 11.8 driver_types.h");
    assert_eq!(device_prop_size(Abi::V12), 1032, "CUDA 12.9 driver_types.h");
    assert_eq!(device_prop_size(Abi::V13), 1008, "CUDA 13.0 and 13.5 driver_types.h");
}

#[test]
fn versions_and_library_names() {
    assert_eq!(Abi::ALL.map(Abi::major), [11, 12, 13]);
    assert_eq!(Abi::ALL.map(Abi::runtime_version), [11080, 12090, 13000]);
    let cases = [
        ("libcudart.so.11.0", Some(Abi::V11)),
        ("libcudart.so.12", Some(Abi::V12)),
        ("libcudart.so.13", Some(Abi::V13)),
        ("/usr/local/cuda/lib64/libcudart.so.12.9.79", Some(Abi::V12)),
        ("libcudart.so.13.0.96", Some(Abi::V13)),
        ("libcudart.so", None),
        ("libcudart.so.10.2", None),
        ("libcudart.so.14", None),
        ("libcudart.so.", None),
        ("/lib/libcudart.so.12/", None),
        ("", None),
    ];
    for (name, want) in cases {
        assert_eq!(Abi::from_library_name(name), want, "{name:?}");
    }
}

/// Each Rust struct's fields follow one another with only the padding C would insert and end
/// where the struct ends, so no member can be missing between two declared ones.
#[test]
fn rust_fields_leave_no_holes() {
    for abi in Abi::ALL {
        check_tiling(&rust_fields(abi), device_prop_size(abi), &format!("Rust {abi:?}"));
    }
}

#[test]
fn layout_matches_cuda11_headers() {
    check_layout_against_headers(Abi::V11);
}

#[test]
fn layout_matches_cuda12_headers() {
    check_layout_against_headers(Abi::V12);
}

#[test]
fn layout_matches_cuda13_headers() {
    check_layout_against_headers(Abi::V13);
}

/// Values read back through the Rust structs' own offsets (needs no headers).
#[test]
fn values_through_rust_layout() {
    for abi in Abi::ALL {
        check_values(abi, &fold_reserved(rust_fields(abi)), &format!("Rust {abi:?}"));
    }
}

/// Values read back through the offsets that the C compiler gives with the real headers.
#[test]
fn values_through_header_layout() {
    for abi in Abi::ALL {
        if let Some(c) = header_layout(abi) {
            check_values(abi, &fold_reserved(c.fields), &format!("CUDA {} headers", abi.major()));
        }
    }
}

#[test]
fn long_names_are_cut_and_terminated() {
    let props = DeviceProperties { name: "x".repeat(300), ..Default::default() };
    for abi in Abi::ALL {
        let bytes = write_with_guards(abi, &props, 0xA5, 0);
        assert_eq!(&bytes[..255], "x".repeat(255).as_bytes(), "{abi:?}");
        assert_eq!(bytes[255], 0, "{abi:?}: name[255] must be the terminating NUL");
    }
}

#[test]
fn negative_attributes_keep_their_sign() {
    let mut props = numbered_props();
    props.attributes[134] = -1; // HOST_NUMA_ID: -1 where the host has no NUMA.
    props.attributes[8] = -2; // A size_t field takes a negative int as C converts it.
    let bytes = write_with_guards(Abi::V13, &props, 0, 0);
    let value = |name: &str| {
        let f = rust_fields(Abi::V13).into_iter().find(|f| f.name == name).unwrap();
        bytes[f.offset..f.offset + f.size].to_vec()
    };
    assert_eq!(value("hostNumaId"), (-1i32).to_ne_bytes());
    assert_eq!(value("sharedMemPerBlock"), (-2i64).to_ne_bytes());
}

// ---- layouts -------------------------------------------------------------------------------

/// One member of `cudaDeviceProp`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    name: String,
    offset: usize,
    size: usize,
    align: usize,
}

fn rust_fields(abi: Abi) -> Vec<Field> {
    let layout = match abi {
        Abi::V11 => DeviceProp11::FIELDS,
        Abi::V12 => DeviceProp12::FIELDS,
        Abi::V13 => DeviceProp13::FIELDS,
    };
    layout.iter().map(|f| Field { name: f.name.to_string(), offset: f.offset, size: f.size, align: f.align }).collect()
}

fn check_tiling(fields: &[Field], size: usize, what: &str) {
    let mut end = 0usize;
    for f in fields {
        assert_eq!(
            f.offset,
            end.next_multiple_of(f.align),
            "{what}: `{}` is not right after the previous member (one missing?)",
            f.name
        );
        end = f.offset + f.size;
    }
    assert_eq!(end.next_multiple_of(8), size, "{what}: members end at {end}, the struct has {size} bytes");
}

/// `reserved`, `reserved1`, `reserved2`, ... : the unused tail, which 12.x headers before 12.9
/// split into several arrays of the same total size. Merged into one `reserved` span so the
/// comparison does not depend on how a header names its padding.
fn is_reserved(name: &str) -> bool {
    name.strip_prefix("reserved").is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit()))
}

fn fold_reserved(fields: Vec<Field>) -> Vec<Field> {
    let mut out: Vec<Field> = Vec::new();
    for f in fields {
        if is_reserved(&f.name) {
            if let Some(last) = out.last_mut().filter(|l| l.name == "reserved") {
                last.size = f.offset + f.size - last.offset;
                continue;
            }
            out.push(Field { name: "reserved".into(), ..f });
        } else {
            out.push(f);
        }
    }
    out
}

fn check_layout_against_headers(abi: Abi) {
    let Some(c) = header_layout(abi) else { return };
    let what = format!("CUDA {} headers ({})", abi.major(), c.version);
    assert_eq!(c.version / 1000, abi.major() as i32, "{what}: CUDART_VERSION is of another major version");
    assert!(c.fields.len() > 50, "{what}: read only {} members of cudaDeviceProp from the header", c.fields.len());
    assert_eq!(c.size, device_prop_size(abi), "{what}: sizeof(cudaDeviceProp)");
    // Guards against a member the header parser below missed.
    check_tiling(&c.fields, c.size, &what);

    let header = fold_reserved(c.fields);
    let rust = fold_reserved(rust_fields(abi));
    let by_name = |fields: &[Field]| fields.iter().map(|f| (f.name.clone(), f.clone())).collect::<BTreeMap<_, _>>();
    let (header_map, rust_map) = (by_name(&header), by_name(&rust));
    let only_header: Vec<_> = header_map.keys().filter(|n| !rust_map.contains_key(*n)).collect();
    let only_rust: Vec<_> = rust_map.keys().filter(|n| !header_map.contains_key(*n)).collect();
    assert!(
        only_header.is_empty() && only_rust.is_empty(),
        "{what}: only in the header {only_header:?}, only in Rust {only_rust:?}"
    );
    for h in &header {
        assert_eq!(&rust_map[&h.name], h, "{what}: member `{}` (left: Rust, right: C)", h.name);
    }
    assert_eq!(
        rust.iter().map(|f| &f.name).collect::<Vec<_>>(),
        header.iter().map(|f| &f.name).collect::<Vec<_>>(),
        "{what}: member order"
    );
}

/// What the C compiler says about `cudaDeviceProp` with one version's headers.
#[derive(Debug, Clone)]
struct HeaderLayout {
    version: i32,
    size: usize,
    fields: Vec<Field>,
}

/// The header layout of `abi`, compiled once per test binary; `None` where its headers are
/// missing (and not required).
fn header_layout(abi: Abi) -> Option<HeaderLayout> {
    static CACHE: Mutex<BTreeMap<u32, Option<HeaderLayout>>> = Mutex::new(BTreeMap::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache.entry(abi.major()).or_insert_with(|| include_dir(abi).map(|dir| compile_layout(abi, &dir))).clone()
}

fn include_dir(abi: Abi) -> Option<PathBuf> {
    let (var, default) = match abi {
        Abi::V11 => ("PHOS_CUDA11_INCLUDE", "/usr/include"),
        Abi::V12 => ("PHOS_CUDA12_INCLUDE", "/tmp/wheels/cu12/nvidia/cuda_runtime/include"),
        Abi::V13 => ("PHOS_CUDA13_INCLUDE", "/tmp/wheels/cuda13/nvidia/cu13/include"),
    };
    let dir = std::env::var_os(var).filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(default), PathBuf::from);
    if dir.join("driver_types.h").is_file() && dir.join("cuda_runtime_api.h").is_file() {
        return Some(dir);
    }
    let message = format!(
        "no CUDA {} headers (driver_types.h, cuda_runtime_api.h) in {} (set {var})",
        abi.major(),
        dir.display()
    );
    if std::env::var("PHOS_REQUIRE_HEADERS").is_ok_and(|v| v == "1") {
        panic!("{message}; PHOS_REQUIRE_HEADERS=1 requires them");
    }
    eprintln!("notice: skipping the CUDA {} header checks: {message}", abi.major());
    None
}

fn compile_layout(abi: Abi, include: &Path) -> HeaderLayout {
    let members = header_members(&include.join("driver_types.h"));
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("abi-layout-cuda{}", abi.major()));
    std::fs::create_dir_all(&work).unwrap();
    let fields_h: String = members.iter().map(|m| format!("FIELD({m})\n")).collect();
    std::fs::write(work.join("props_fields.h"), fields_h).unwrap();

    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/props_layout.c");
    let exe = work.join("props_layout");
    let cc = std::env::var("CC").ok().filter(|c| !c.trim().is_empty()).unwrap_or_else(|| "cc".into());
    let mut cc_words = cc.split_whitespace();
    let status = Command::new(cc_words.next().unwrap())
        .args(cc_words)
        .args(["-std=gnu11", "-w", "-I"])
        .arg(&work)
        .arg("-I")
        .arg(include)
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "{cc} failed on {} with -I{}", source.display(), include.display());
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success(), "{} failed", exe.display());

    let mut layout = HeaderLayout { version: 0, size: 0, fields: Vec::new() };
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| words[i].parse::<usize>().unwrap();
        match words[0] {
            "version" => layout.version = words[1].parse().unwrap(),
            "size" => layout.size = num(1),
            "field" => layout.fields.push(Field { name: words[1].into(), offset: num(2), size: num(3), align: num(4) }),
            other => panic!("unexpected line from props_layout: {other}"),
        }
    }
    layout
}

/// The member names of `struct cudaDeviceProp`, in order, read from the text of
/// `driver_types.h`. (Its declarations are one simple `type name[dims];` each.)
fn header_members(driver_types: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(driver_types).unwrap();
    let start = text
        .match_indices("cudaDeviceProp")
        .map(|(i, m)| i + m.len())
        .find(|&i| text[i..].trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no struct cudaDeviceProp in {}", driver_types.display()));
    let body = &text[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
    let mut code = String::new();
    let mut rest = body;
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        rest = &rest[i + rest[i..].find("*/").unwrap() + 2..];
    }
    code.push_str(rest);
    let code: String = code.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
    let mut names = Vec::new();
    for declaration in code.split(';').map(str::trim).filter(|d| !d.is_empty()) {
        for declarator in declaration.split(',') {
            let declarator = declarator.split('[').next().unwrap();
            let name = declarator.rsplit(|c: char| c.is_whitespace() || c == '*').next().unwrap();
            assert!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "cannot read a member name from `{declaration}`"
            );
            names.push(name.to_string());
        }
    }
    names
}

// ---- values --------------------------------------------------------------------------------

const GUARD: usize = 64;
const TOTAL_GLOBAL_MEM: u64 = 0x0123_4567_89ab_cdef;
const NAME: &str = "Phos Test GPU";

/// Attribute `a` has the value `1000 + a`, so every field shows where it came from.
fn numbered_props() -> DeviceProperties {
    DeviceProperties {
        name: NAME.into(),
        uuid: std::array::from_fn(|i| 0xc0 + i as u8),
        luid: std::array::from_fn(|i| 0x50 + i as u8),
        luid_device_node_mask: 0xdead_beef,
        total_global_mem: TOTAL_GLOBAL_MEM,
        attributes: (0..200).map(|a| 1000 + a).collect(),
    }
}

/// Writes `props` as `abi` into a buffer filled with `fill`, at `GUARD + misalign`, checks the
/// bytes around it were left alone, and returns the struct's bytes.
fn write_with_guards(abi: Abi, props: &DeviceProperties, fill: u8, misalign: usize) -> Vec<u8> {
    let size = device_prop_size(abi);
    let start = GUARD + misalign;
    let mut buf = vec![fill; start + size + GUARD];
    // SAFETY: the buffer holds `size` bytes from `start`.
    unsafe { write_device_prop(abi, buf[start..].as_mut_ptr().cast(), props) };
    assert!(buf[..start].iter().all(|&b| b == fill), "{abi:?}: wrote before the struct");
    assert!(buf[start + size..].iter().all(|&b| b == fill), "{abi:?}: wrote past the struct");
    buf[start..start + size].to_vec()
}

/// Where a field's value should come from.
enum Want {
    /// `int`/`unsigned int` elements from these attributes, in order.
    Attrs(&'static [i32]),
    /// A `size_t` from one attribute.
    Size(i32),
    Name,
    Uuid,
    Luid,
    LuidMask,
    TotalGlobalMem,
    Zero,
}

/// The expected source of every `cudaDeviceProp` member of any version, written from the
/// comments in driver_types.h and the `CUdevice_attribute` numbers in cuda.h.
fn want(field: &str) -> Want {
    use Want::*;
    match field {
        "name" => Name,
        "uuid" => Uuid,
        "luid" => Luid,
        "luidDeviceNodeMask" => LuidMask,
        "totalGlobalMem" => TotalGlobalMem,
        "reserved" => Zero,
        "sharedMemPerBlock" => Size(8),
        "regsPerBlock" => Attrs(&[12]),
        "warpSize" => Attrs(&[10]),
        "memPitch" => Size(11),
        "maxThreadsPerBlock" => Attrs(&[1]),
        "maxThreadsDim" => Attrs(&[2, 3, 4]),
        "maxGridSize" => Attrs(&[5, 6, 7]),
        "clockRate" => Attrs(&[13]),
        "totalConstMem" => Size(9),
        "major" => Attrs(&[75]),
        "minor" => Attrs(&[76]),
        "textureAlignment" => Size(14),
        "texturePitchAlignment" => Size(51),
        "deviceOverlap" => Attrs(&[15]),
        "multiProcessorCount" => Attrs(&[16]),
        "kernelExecTimeoutEnabled" => Attrs(&[17]),
        "integrated" => Attrs(&[18]),
        "canMapHostMemory" => Attrs(&[19]),
        "computeMode" => Attrs(&[20]),
        "maxTexture1D" => Attrs(&[21]),
        "maxTexture1DMipmap" => Attrs(&[77]),
        "maxTexture1DLinear" => Attrs(&[69]),
        "maxTexture2D" => Attrs(&[22, 23]),
        "maxTexture2DMipmap" => Attrs(&[73, 74]),
        "maxTexture2DLinear" => Attrs(&[70, 71, 72]),
        "maxTexture2DGather" => Attrs(&[45, 46]),
        "maxTexture3D" => Attrs(&[24, 25, 26]),
        "maxTexture3DAlt" => Attrs(&[47, 48, 49]),
        "maxTextureCubemap" => Attrs(&[52]),
        "maxTexture1DLayered" => Attrs(&[42, 43]),
        "maxTexture2DLayered" => Attrs(&[27, 28, 29]),
        "maxTextureCubemapLayered" => Attrs(&[53, 54]),
        "maxSurface1D" => Attrs(&[55]),
        "maxSurface2D" => Attrs(&[56, 57]),
        "maxSurface3D" => Attrs(&[58, 59, 60]),
        "maxSurface1DLayered" => Attrs(&[61, 62]),
        "maxSurface2DLayered" => Attrs(&[63, 64, 65]),
        "maxSurfaceCubemap" => Attrs(&[66]),
        "maxSurfaceCubemapLayered" => Attrs(&[67, 68]),
        "surfaceAlignment" => Size(30),
        "concurrentKernels" => Attrs(&[31]),
        "ECCEnabled" => Attrs(&[32]),
        "pciBusID" => Attrs(&[33]),
        "pciDeviceID" => Attrs(&[34]),
        "pciDomainID" => Attrs(&[50]),
        "tccDriver" => Attrs(&[35]),
        "asyncEngineCount" => Attrs(&[40]),
        "unifiedAddressing" => Attrs(&[41]),
        "memoryClockRate" => Attrs(&[36]),
        "memoryBusWidth" => Attrs(&[37]),
        "l2CacheSize" => Attrs(&[38]),
        "persistingL2CacheMaxSize" => Attrs(&[108]),
        "maxThreadsPerMultiProcessor" => Attrs(&[39]),
        "streamPrioritiesSupported" => Attrs(&[78]),
        "globalL1CacheSupported" => Attrs(&[79]),
        "localL1CacheSupported" => Attrs(&[80]),
        "sharedMemPerMultiprocessor" => Size(81),
        "regsPerMultiprocessor" => Attrs(&[82]),
        "managedMemory" => Attrs(&[83]),
        "isMultiGpuBoard" => Attrs(&[84]),
        "multiGpuBoardGroupID" => Attrs(&[85]),
        "hostNativeAtomicSupported" => Attrs(&[86]),
        "singleToDoublePrecisionPerfRatio" => Attrs(&[87]),
        "pageableMemoryAccess" => Attrs(&[88]),
        "concurrentManagedAccess" => Attrs(&[89]),
        "computePreemptionSupported" => Attrs(&[90]),
        "canUseHostPointerForRegisteredMem" => Attrs(&[91]),
        "cooperativeLaunch" => Attrs(&[95]),
        "cooperativeMultiDeviceLaunch" => Attrs(&[96]),
        "sharedMemPerBlockOptin" => Size(97),
        "pageableMemoryAccessUsesHostPageTables" => Attrs(&[100]),
        "directManagedMemAccessFromHost" => Attrs(&[101]),
        "maxBlocksPerMultiProcessor" => Attrs(&[106]),
        "accessPolicyMaxWindowSize" => Attrs(&[109]),
        "reservedSharedMemPerBlock" => Size(111),
        "hostRegisterSupported" => Attrs(&[99]),
        "sparseCudaArraySupported" => Attrs(&[112]),
        "hostRegisterReadOnlySupported" => Attrs(&[113]),
        "timelineSemaphoreInteropSupported" => Attrs(&[114]),
        "memoryPoolsSupported" => Attrs(&[115]),
        "gpuDirectRDMASupported" => Attrs(&[116]),
        "gpuDirectRDMAFlushWritesOptions" => Attrs(&[117]),
        "gpuDirectRDMAWritesOrdering" => Attrs(&[118]),
        "memoryPoolSupportedHandleTypes" => Attrs(&[119]),
        "deferredMappingCudaArraySupported" => Attrs(&[121]),
        "ipcEventSupported" => Attrs(&[125]),
        "clusterLaunch" => Attrs(&[120]),
        "unifiedFunctionPointers" => Attrs(&[129]),
        "deviceNumaConfig" => Attrs(&[130]),
        "deviceNumaId" => Attrs(&[131]),
        "mpsEnabled" => Attrs(&[133]),
        "hostNumaId" => Attrs(&[134]),
        "gpuPciDeviceID" => Attrs(&[139]),
        "gpuPciSubsystemID" => Attrs(&[140]),
        "hostNumaMultinodeIpcSupported" => Attrs(&[143]),
        other => panic!("the test has no expected value for member `{other}`"),
    }
}

/// Writes the numbered properties as `abi` (over zeroed and over non-zero memory, aligned and
/// misaligned) and reads every member back at the offsets in `fields`.
fn check_values(abi: Abi, fields: &[Field], what: &str) {
    let props = numbered_props();
    for fill in [0x00, 0xA5] {
        for misalign in [0, 3] {
            let bytes = write_with_guards(abi, &props, fill, misalign);
            let mut covered = vec![false; bytes.len()];
            for f in fields {
                let got = &bytes[f.offset..f.offset + f.size];
                covered[f.offset..f.offset + f.size].fill(true);
                let expected: Vec<u8> = match want(&f.name) {
                    Want::Attrs(attrs) => attrs.iter().flat_map(|a| (1000 + a).to_ne_bytes()).collect(),
                    Want::Size(a) => (1000 + a as u64).to_ne_bytes().to_vec(),
                    Want::Name => {
                        let mut name = NAME.as_bytes().to_vec();
                        name.resize(256, 0);
                        name
                    }
                    Want::Uuid => props.uuid.to_vec(),
                    Want::Luid => props.luid.to_vec(),
                    Want::LuidMask => props.luid_device_node_mask.to_ne_bytes().to_vec(),
                    Want::TotalGlobalMem => TOTAL_GLOBAL_MEM.to_ne_bytes().to_vec(),
                    Want::Zero => vec![0; f.size],
                };
                assert_eq!(got, expected, "{what}: member `{}` (fill {fill:#x}, misaligned by {misalign})", f.name);
            }
            for (i, _) in covered.iter().enumerate().filter(|(_, c)| !**c) {
                assert_eq!(bytes[i], 0, "{what}: padding byte {i} not zeroed (fill {fill:#x})");
            }
        }
    }
}
