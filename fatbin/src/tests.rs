//! Unit tests of containers and entries on synthetic fat binaries, built here with the layout
//! documented in the crate docs (the integration tests use real nvcc output).

use super::*;

/// One entry as nvcc would write it: `data` is the logical payload, stored compressed or not.
fn entry(kind: u16, arch: u32, data: &[u8], compression: Compression) -> Vec<u8> {
    let (stored, flag) = match compression {
        Compression::None => (data.to_vec(), 0),
        Compression::Lz4 => (lz4_flex::block::compress(data), FLAG_COMPRESSED_LZ4),
        Compression::Zstd => {
            (ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest), FLAG_COMPRESSED_ZSTD)
        }
    };
    let compressed = compression != Compression::None;
    let header_size: u32 = if kind == 1 { 72 } else { 64 };
    let padded = stored.len().div_ceil(8) * 8;
    let mut out = Vec::new();
    out.extend(kind.to_le_bytes());
    out.extend(0x0101u16.to_le_bytes());
    out.extend(header_size.to_le_bytes());
    out.extend((padded as u64).to_le_bytes());
    out.extend((if compressed { stored.len() as u32 } else { 0 }).to_le_bytes());
    out.extend((if kind == 1 { 64u32 } else { 0 }).to_le_bytes());
    out.extend(8u16.to_le_bytes()); // minor
    out.extend(7u16.to_le_bytes()); // major
    out.extend(arch.to_le_bytes());
    out.extend([0u8; 8]); // no identifier
    out.extend((FLAG_64BIT | FLAG_HOST_LINUX | flag).to_le_bytes());
    out.extend([0u8; 8]);
    out.extend((if compressed { data.len() as u64 } else { 0 }).to_le_bytes());
    out.resize(header_size as usize, 0);
    out.extend(&stored);
    out.resize(header_size as usize + padded, 0);
    out
}

fn container(entries: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = entries.concat();
    let mut out = Vec::new();
    out.extend(FATBIN_MAGIC.to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(16u16.to_le_bytes());
    out.extend((body.len() as u64).to_le_bytes());
    out.extend(body);
    out
}

const PTX: &[u8] = b"//\n.version 7.8\n.target sm_52\n.address_size 64\n\n.visible .entry k()\n{\n\tret;\n}\n\0";

fn cubin_like() -> Vec<u8> {
    let mut elf = b"\x7fELF\x02\x01\x01\x33".to_vec();
    elf.extend((0..3000u32).map(|i| (i % 13) as u8 * (i % 3 == 0) as u8));
    elf
}

fn sample() -> Vec<u8> {
    container(&[
        entry(2, 52, &cubin_like(), Compression::Lz4),
        entry(1, 52, PTX, Compression::Lz4),
        entry(2, 70, &cubin_like(), Compression::None),
        entry(2, 90, &cubin_like(), Compression::Zstd),
        entry(1, 90, PTX, Compression::None),
        entry(8, 80, b"lto ir", Compression::None),
    ])
}

#[test]
fn parses_synthetic_container() {
    let bytes = sample();
    let mut with_tail = bytes.clone();
    with_tail.extend([0xaa; 40]);
    let fatbin = FatBinary::parse(&with_tail).unwrap();
    assert_eq!(fatbin.len(), bytes.len());
    assert_eq!(fatbin.bytes(), &bytes[..]);
    assert_eq!((fatbin.version(), fatbin.header_size()), (1, 16));

    let entries: Vec<Entry<'_>> = fatbin.entries().collect::<Result<_, _>>().unwrap();
    let summary: Vec<_> = entries.iter().map(|e| (e.kind, e.sm_arch, e.compression)).collect();
    assert_eq!(
        summary,
        [
            (EntryKind::Cubin, 52, Compression::Lz4),
            (EntryKind::Ptx, 52, Compression::Lz4),
            (EntryKind::Cubin, 70, Compression::None),
            (EntryKind::Cubin, 90, Compression::Zstd),
            (EntryKind::Ptx, 90, Compression::None),
            (EntryKind::Other(8), 80, Compression::None),
        ]
    );
    assert_eq!(entries[0].offset, 16);
    for e in &entries {
        assert!(e.is_64bit() && !e.is_debug());
        assert_eq!(e.compressed, e.compression != Compression::None);
        assert_eq!((e.version_major, e.version_minor, e.header_version), (7, 8, 0x0101));
        assert_eq!(e.identifier, None);
        if e.kind == EntryKind::Cubin {
            let payload = e.payload().unwrap();
            assert_eq!(&payload[..cubin_like().len()], &cubin_like()[..]);
            assert_eq!(matches!(payload, std::borrow::Cow::Borrowed(_)), !e.compressed);
            assert_eq!(e.ptx_text().unwrap(), None);
        }
    }
    let ptx = std::str::from_utf8(&PTX[..PTX.len() - 1]).unwrap();
    assert_eq!(entries[1].ptx_text().unwrap().as_deref(), Some(ptx));
    assert_eq!(entries[4].ptx_text().unwrap().as_deref(), Some(ptx));
    assert_eq!(entries[1].payload().unwrap().len(), PTX.len());
    assert_eq!(entries[5].payload().unwrap().as_ref(), b"lto ir\0\0");
}

#[test]
fn container_header_errors() {
    let good = sample();
    assert!(matches!(FatBinary::parse(&good[..15]), Err(FatbinError::Truncated { offset: 0, needed: 16, .. })));
    let mut bad = good.clone();
    bad[0] ^= 1;
    assert!(matches!(FatBinary::parse(&bad), Err(FatbinError::BadMagic { found: 0xba55ed51, .. })));
    let mut bad = good.clone();
    bad[4] = 2;
    assert!(matches!(FatBinary::parse(&bad), Err(FatbinError::UnsupportedVersion { version: 2, .. })));
    let mut bad = good.clone();
    bad[6] = 8;
    assert!(matches!(FatBinary::parse(&bad), Err(FatbinError::Malformed { .. })));
    assert!(matches!(FatBinary::parse(&good[..good.len() - 1]), Err(FatbinError::Truncated { .. })));
    let mut bad = good.clone();
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(FatBinary::parse(&bad), Err(FatbinError::TooLarge { .. })));
}

/// The error the first entry of `sample()` yields after `mutate` edits its header (at 16).
fn first_entry_error(mutate: impl FnOnce(&mut Vec<u8>)) -> FatbinError {
    let mut bytes = sample();
    mutate(&mut bytes);
    let fatbin = FatBinary::parse(&bytes).unwrap();
    let first = fatbin.entries().next().unwrap();
    match first {
        Err(e) => e,
        Ok(e) => e.payload().unwrap_err(),
    }
}

#[test]
fn entry_errors_name_the_entry_offset() {
    let set_u32 = |at: usize, v: u32| move |b: &mut Vec<u8>| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let set_u64 = |at: usize, v: u64| move |b: &mut Vec<u8>| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let e = first_entry_error(set_u32(16 + 4, 40));
    assert!(matches!(e, FatbinError::Malformed { what: "entry header", offset: 16, .. }), "{e}");
    let e = first_entry_error(set_u32(16 + 4, 1 << 30));
    assert!(matches!(e, FatbinError::Truncated { what: "entry header", offset: 16, .. }), "{e}");
    let e = first_entry_error(set_u64(16 + 8, 1 << 40));
    assert!(matches!(e, FatbinError::Truncated { what: "entry payload", offset: 80, .. }), "{e}");
    let e = first_entry_error(set_u32(16 + 16, 1 << 20));
    assert!(matches!(e, FatbinError::Malformed { what: "compressed entry", offset: 16, .. }), "{e}");
    let e = first_entry_error(set_u32(16 + 16, 0));
    assert!(matches!(e, FatbinError::Malformed { what: "compressed entry", .. }), "{e}");
    let e = first_entry_error(set_u64(16 + 40, FLAG_COMPRESSED_LZ4 | FLAG_COMPRESSED_ZSTD));
    assert!(matches!(e, FatbinError::UnknownCompression { entry_offset: 16, .. }), "{e}");
    let e = first_entry_error(set_u64(16 + 56, MAX_DECOMPRESSED_SIZE + 1));
    assert!(matches!(e, FatbinError::TooLarge { offset: 16, .. }), "{e}");
    let e = first_entry_error(|b| {
        set_u32(16 + 32, 60)(b);
        set_u32(16 + 36, 8)(b);
    });
    assert!(matches!(e, FatbinError::Malformed { what: "entry identifier", .. }), "{e}");
    // A wrong uncompressed size: too small is caught while decoding, too large afterwards.
    let e = first_entry_error(set_u64(16 + 56, 100));
    assert!(matches!(e, FatbinError::Decompress { method: Compression::Lz4, entry_offset: 16, .. }), "{e}");
    let e = first_entry_error(set_u64(16 + 56, cubin_like().len() as u64 + 1));
    assert!(matches!(e, FatbinError::SizeMismatch { entry_offset: 16, actual: 3008, .. }), "{e}");
    // Corrupt LZ4: the first token promises more literals than the block holds.
    let e = first_entry_error(|b| b[80..100].fill(0xff));
    assert!(matches!(e, FatbinError::Decompress { input_offset: Some(_), .. }), "{e}");
}

#[test]
fn entries_stop_after_an_error() {
    let mut bytes = sample();
    bytes[16 + 4..16 + 8].copy_from_slice(&8u32.to_le_bytes());
    let fatbin = FatBinary::parse(&bytes).unwrap();
    let results: Vec<_> = fatbin.entries().collect();
    assert_eq!(results.len(), 1);
    assert!(results[0].is_err());
}

#[test]
fn identifier_and_options_strings() {
    let mut e = entry(1, 52, PTX, Compression::None);
    // Grow the header to 96 bytes holding "-O3" at 72 and "a.cu" at 80.
    let payload = e.split_off(72);
    e.resize(96, 0);
    e[72..75].copy_from_slice(b"-O3");
    e[80..84].copy_from_slice(b"a.cu");
    e[4..8].copy_from_slice(&96u32.to_le_bytes());
    e[32..36].copy_from_slice(&80u32.to_le_bytes());
    e[36..40].copy_from_slice(&8u32.to_le_bytes());
    e[64..68].copy_from_slice(&72u32.to_le_bytes());
    e[68..72].copy_from_slice(&4u32.to_le_bytes());
    e.extend(payload);
    let bytes = container(&[e]);
    let fatbin = FatBinary::parse(&bytes).unwrap();
    let entry = fatbin.entries().next().unwrap().unwrap();
    assert_eq!(entry.identifier, Some(&b"a.cu"[..]));
    assert_eq!(entry.options, Some(&b"-O3"[..]));
    assert_eq!(entry.header.len(), 96);
    assert!(entry.ptx_text().unwrap().unwrap().contains(".entry k"));
}

#[test]
fn cubin_headers_have_no_options_fields() {
    // A `-G` cubin header as nvcc 11.8 writes it: 104 bytes, the source path right after the
    // 64 fixed bytes, where a PTX header would keep its options (offset, length).
    let mut e = entry(2, 70, &cubin_like(), Compression::None);
    let payload = e.split_off(64);
    let path = b"/work/kernels.cu\0";
    e.extend_from_slice(path);
    e.resize(104, 0);
    e[4..8].copy_from_slice(&104u32.to_le_bytes());
    e[32..36].copy_from_slice(&64u32.to_le_bytes());
    e[36..40].copy_from_slice(&(path.len() as u32).to_le_bytes());
    e[40..48].copy_from_slice(&(FLAG_64BIT | FLAG_DEBUG | FLAG_HOST_LINUX).to_le_bytes());
    e.extend(payload);
    let bytes = container(&[e]);
    let fatbin = FatBinary::parse(&bytes).unwrap();
    let entry = fatbin.entries().next().unwrap().unwrap();
    assert!(entry.is_debug());
    assert_eq!(entry.identifier, Some(&b"/work/kernels.cu"[..]));
    assert_eq!(entry.options, None);
}

#[test]
fn zero_padding_after_the_last_entry_is_ignored() {
    let mut bytes = sample();
    bytes.extend([0u8; 24]);
    let fat_size = (bytes.len() - 16) as u64;
    bytes[8..16].copy_from_slice(&fat_size.to_le_bytes());
    let fatbin = FatBinary::parse(&bytes).unwrap();
    assert_eq!(fatbin.entries().collect::<Result<Vec<_>, _>>().unwrap().len(), 6);
    // A non-zero byte in the padding is an entry, and a malformed one.
    let last = bytes.len() - 1;
    bytes[last] = 1;
    let fatbin = FatBinary::parse(&bytes).unwrap();
    assert!(fatbin.entries().last().unwrap().is_err());
}

#[test]
fn invalid_ptx_text_is_an_error() {
    let bytes = container(&[entry(1, 52, b".version 7.8\n\xff\xfe\0", Compression::None)]);
    let fatbin = FatBinary::parse(&bytes).unwrap();
    let e = fatbin.entries().next().unwrap().unwrap().ptx_text().unwrap_err();
    assert_eq!(e, FatbinError::InvalidPtxText { entry_offset: 16, offset: 13 });
}

#[test]
fn containers_back_to_back() {
    let a = sample();
    let b = container(&[entry(2, 80, &cubin_like(), Compression::Lz4)]);
    let mut section = a.clone();
    section.extend([0u8; 8]); // alignment padding
    section.extend(&b);
    section.extend([0u8; 16]);
    let found: Vec<_> = containers(&section).collect::<Result<_, _>>().unwrap();
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].bytes(), &a[..]);
    assert_eq!(found[1].bytes(), &b[..]);
    assert_eq!(found[1].entries().count(), 1);

    // Garbage after the first container: the error is located in section coordinates.
    let mut bad = a.clone();
    bad.extend([0, 0, 0, 0, 1, 2, 3, 4]);
    let results: Vec<_> = containers(&bad).collect();
    assert_eq!(results.len(), 2);
    let err = results[1].as_ref().unwrap_err();
    assert!(matches!(err, FatbinError::Truncated { offset, .. } if *offset == a.len() + 4), "{err}");
    assert_eq!(containers(&[]).count(), 0);
}

#[test]
fn wrapper_from_file_bytes() {
    let mut raw = Vec::new();
    raw.extend(WRAPPER_MAGIC.to_le_bytes());
    raw.extend(2u32.to_le_bytes());
    raw.extend(0x30b0u64.to_le_bytes());
    raw.extend(0x130f0u64.to_le_bytes());
    assert_eq!(Wrapper::parse(&raw).unwrap(), Wrapper { version: 2, data: 0x30b0, filename_or_fatbins: 0x130f0 });
    assert!(matches!(Wrapper::parse(&raw[..20]), Err(FatbinError::Truncated { .. })));
    raw[4] = 3;
    assert!(matches!(Wrapper::parse(&raw), Err(FatbinError::UnsupportedVersion { version: 3, .. })));
    raw[0] = 0;
    assert!(matches!(Wrapper::parse(&raw), Err(FatbinError::BadMagic { .. })));
}

/// The in-memory layout nvcc emits, built by hand.
#[repr(C)]
struct TestWrapper {
    magic: u32,
    version: u32,
    data: *const u8,
    filename_or_fatbins: *const std::ffi::c_void,
}

#[test]
#[allow(unsafe_code)]
fn container_from_wrapper_in_memory() {
    let mut bytes = sample();
    let len = bytes.len();
    bytes.extend([0x55; 64]); // not part of the container
    let mut wrapper =
        TestWrapper { magic: WRAPPER_MAGIC, version: 1, data: bytes.as_ptr(), filename_or_fatbins: std::ptr::null() };
    let ptr = (&raw const wrapper).cast::<std::ffi::c_void>();
    // SAFETY: `wrapper` and `bytes` outlive the returned slice's uses below.
    let found = unsafe { container_from_wrapper(ptr) }.unwrap();
    assert_eq!(found.as_ptr(), bytes.as_ptr());
    assert_eq!(found.len(), len);
    assert_eq!(FatBinary::parse(found).unwrap().entries().count(), 6);

    // SAFETY: null is explicitly allowed.
    assert!(matches!(unsafe { container_from_wrapper(std::ptr::null()) }, Err(FatbinError::NullPointer { .. })));
    wrapper.version = 7;
    let ptr = (&raw const wrapper).cast::<std::ffi::c_void>();
    // SAFETY: as above; the bad version is detected before `data` is followed.
    assert!(matches!(unsafe { container_from_wrapper(ptr) }, Err(FatbinError::UnsupportedVersion { .. })));
    wrapper.version = 2;
    wrapper.data = std::ptr::null();
    let ptr = (&raw const wrapper).cast::<std::ffi::c_void>();
    // SAFETY: as above; a null `data` is detected before it is followed.
    assert!(matches!(unsafe { container_from_wrapper(ptr) }, Err(FatbinError::NullPointer { .. })));
    let header = [0u8; 16];
    wrapper.data = header.as_ptr();
    let ptr = (&raw const wrapper).cast::<std::ffi::c_void>();
    // SAFETY: as above; 16 readable bytes, whose bad magic stops the read there.
    assert!(matches!(unsafe { container_from_wrapper(ptr) }, Err(FatbinError::BadMagic { .. })));
    let _ = wrapper.filename_or_fatbins;
}

/// Runs every parser over `bytes`; used to check that no input makes them panic.
fn exercise(bytes: &[u8]) {
    for fatbin in containers(bytes).flatten() {
        for entry in fatbin.entries().flatten() {
            if let Ok(payload) = entry.payload() {
                let _ = cubin::kernels(&payload);
            }
            let _ = entry.ptx_text();
        }
    }
}

#[test]
fn mutated_synthetic_containers_never_panic() {
    let original = sample();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut bytes = original.clone();
        for _ in 0..1 + next() % 8 {
            let at = (next() % bytes.len() as u64) as usize;
            match next() % 4 {
                0 => bytes[at] ^= 1 << (next() % 8),
                1 => bytes[at] = next() as u8,
                2 => bytes[at] = [0, 0xff, 0x7f, 0x80][(next() % 4) as usize],
                _ => bytes.truncate(at.max(1)),
            }
        }
        exercise(&bytes);
    }
}
