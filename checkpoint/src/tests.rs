use super::*;

fn sample_manifest() -> Manifest {
    Manifest {
        apis: vec![ImageApi { id: 0, name: "cudart".into(), version: 1, hash: 0x1234 }],
        created_ms: 1,
        session: SessionMeta {
            id: 7,
            token: [9; 16],
            tenant: "uid:0".into(),
            abi_major: 12,
            backend: "emu".into(),
            device_base: 0x6000_0000_0000,
            device_size: 1 << 40,
            ..Default::default()
        },
        handle_counters: vec![("stream".into(), 5)],
        records: vec![Record {
            api: 0,
            function: 3,
            name: "cudaMalloc".into(),
            device: 0,
            payload: vec![1, 2, 3],
            creates: vec![("device_memory".into(), 0x6000_0000_0000)],
        }],
        ..Default::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn write(dir: &Path, compression: Compression) -> Vec<Vec<u8>> {
    let mut w = ImageWriter::create(dir, compression, 4096).unwrap();
    let a = pattern(10_000, 1);
    let zeros = vec![0u8; 3 * 4096];
    let mut b = zeros.clone();
    b[4096 * 2 + 5] = 1; // one non-zero byte in the last chunk
    w.begin_region(0x6000_0000_0000, a.len() as u64, 0, RegionKind::Allocation);
    for c in a.chunks(4096) {
        w.add_chunk(c).unwrap();
    }
    w.begin_region(0x6000_0020_0000, b.len() as u64, 0, RegionKind::ModuleVariable { module: 1, name: "table".into() });
    for c in b.chunks(4096) {
        w.add_chunk(c).unwrap();
    }
    let summary = w.finish(sample_manifest()).unwrap();
    assert_eq!(summary.memory_bytes, (a.len() + b.len()) as u64);
    assert!(summary.stored_bytes < summary.memory_bytes, "zero chunks are not stored");
    vec![a, b]
}

fn read_back(dir: &Path) -> Result<Vec<Vec<u8>>, ImageError> {
    let mut img = Image::open(dir)?;
    let regions = img.manifest.memory.clone();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for r in regions {
        let mut data = Vec::new();
        for c in &r.chunks {
            img.read_chunk(c, &mut buf)?;
            data.extend_from_slice(&buf);
        }
        out.push(data);
    }
    Ok(out)
}

#[test]
fn round_trip_raw_and_zstd() {
    for compression in [Compression::None, Compression::Zstd(1)] {
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path(), compression);
        assert_eq!(read_back(dir.path()).unwrap(), written);
        let mut img = Image::open(dir.path()).unwrap();
        img.verify().unwrap();
        assert_eq!(img.manifest.session.id, 7);
        assert_eq!(img.manifest.records[0].name, "cudaMalloc");
        assert_eq!(img.manifest.memory[1].chunks[0].encoding, Encoding::Zero);
    }
}

#[test]
fn a_corrupted_manifest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Compression::None);
    let path = dir.path().join(MANIFEST_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(Image::open(dir.path()), Err(ImageError::Corrupted(_))));
}

#[test]
fn a_corrupted_memory_chunk_is_found() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Compression::Zstd(1));
    let path = dir.path().join(MEMORY_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let mut img = Image::open(dir.path()).unwrap();
    assert!(matches!(img.verify(), Err(ImageError::Corrupted(_))));
}

#[test]
fn truncated_images_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Compression::None);
    // Memory file cut short.
    let mpath = dir.path().join(MEMORY_FILE);
    let len = std::fs::metadata(&mpath).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&mpath).unwrap().set_len(len - 100).unwrap();
    assert!(matches!(Image::open(dir.path()), Err(ImageError::Truncated(_))));
    // Manifest cut short.
    let path = dir.path().join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    assert!(matches!(Image::open(dir.path()), Err(ImageError::Truncated(_))));
    // No manifest at all.
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(Image::open(dir.path()), Err(ImageError::NotAnImage(_))));
}

#[test]
fn another_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Compression::None);
    let path = dir.path().join(MANIFEST_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    for (found, says) in [(1u32, "version 1 images come from builds before"), (3, "it reads version 2")] {
        bytes[8..12].copy_from_slice(&found.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let e = Image::open(dir.path()).err().expect("refused");
        assert!(matches!(e, ImageError::Version { found: f } if f == found), "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
}

#[test]
fn regions_must_be_complete() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = ImageWriter::create(dir.path(), Compression::None, 4096).unwrap();
    w.begin_region(0x1000, 8192, 0, RegionKind::Allocation);
    w.add_chunk(&[1u8; 4096]).unwrap();
    assert!(w.add_chunk(&[1u8; 8192]).is_err(), "past the end");
    assert!(w.finish(Manifest::default()).is_err(), "half the region missing");
}

/// An image whose checksums are all right but whose manifest says what no session could be
/// (each edit made on a good image, its checksum recomputed) is refused when opened.
#[test]
fn impossible_manifests_are_refused_despite_good_checksums() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Compression::None);
    let good = Image::open(dir.path()).unwrap().manifest;
    let forge = |edit: &dyn Fn(&mut Manifest)| {
        let mut m = good.clone();
        edit(&mut m);
        write_manifest(dir.path(), &m).unwrap();
        let r = Image::open(dir.path()).map(|_| ());
        write_manifest(dir.path(), &good).unwrap();
        r
    };
    type Edit = Box<dyn Fn(&mut Manifest)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("counter near 2^64", Box::new(|m| m.handle_counters[0].1 = u64::MAX - 1)),
        ("counter 0", Box::new(|m| m.handle_counters[0].1 = 0)),
        ("counter twice", Box::new(|m| m.handle_counters.push(("stream".into(), 9)))),
        ("session id 0", Box::new(|m| m.session.id = 0)),
        ("session id near 2^64", Box::new(|m| m.session.id = u64::MAX)),
        ("epoch near 2^64", Box::new(|m| m.session.epoch = u64::MAX)),
        ("abi 9999", Box::new(|m| m.session.abi_major = 9999)),
        ("no tenant", Box::new(|m| m.session.tenant.clear())),
        ("tenant with a newline", Box::new(|m| m.session.tenant = "alice\nbob".into())),
        ("backend", Box::new(|m| m.session.backend = "quantum".into())),
        ("empty device range", Box::new(|m| m.session.device_size = 0)),
        ("range overflows", Box::new(|m| m.session.device_base = u64::MAX - 10)),
        ("allocation outside the range", Box::new(|m| m.memory[0].addr = 0x1000)),
        ("allocation past the range", Box::new(|m| m.memory[0].addr = 0x6000_0000_0000 + (1 << 40) - 16)),
        (
            "overlapping allocations",
            Box::new(|m| {
                let mut twin = m.memory[0].clone();
                twin.addr += 16;
                m.memory.push(twin);
            }),
        ),
        ("a huge chunk", Box::new(|m| m.memory[1].chunks[0].len = 1 << 40)),
        ("a record on device -1", Box::new(|m| m.records[0].device = -1)),
        ("too many created objects", Box::new(|m| m.records[0].creates = vec![("stream".into(), 1); 9])),
    ];
    for (what, edit) in cases {
        match forge(&*edit) {
            Err(ImageError::Impossible(_)) | Err(ImageError::Corrupted(_)) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    // The good manifest, written back, opens.
    Image::open(dir.path()).unwrap();
}

/// Write `body` as the manifest of `dir`, framed and checksummed as the writer does, next
/// to an empty memory file: what a forged image that passes the checksum looks like.
fn forge_body(dir: &Path, body: &[u8]) {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(body);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(dir.join(MANIFEST_FILE), bytes).unwrap();
    std::fs::write(dir.join(MEMORY_FILE), b"").unwrap();
}

#[test]
fn a_length_in_the_manifest_cannot_make_the_reader_allocate() {
    // The tenant's name claims 2.4 GB in a manifest of a few hundred bytes (found by the
    // `checkpoint_image` fuzz target): refused before the string is allocated, where the
    // 4 GiB decode limit alone let it be allocated first and found missing after.
    let dir = tempfile::tempdir().unwrap();
    let manifest = sample_manifest();
    let mut body = bincode::encode_to_vec(&manifest, config()).unwrap();
    // The format, the APIs, the time, then the session's id and token.
    let apis = bincode::encode_to_vec(&manifest.apis, config()).unwrap().len();
    let at = 4 + apis + 8 + 8 + 16;
    assert_eq!(body[at..at + 8], 5u64.to_le_bytes(), "the tenant's length");
    body[at..at + 8].copy_from_slice(&0x9a00_0000u64.to_le_bytes());
    forge_body(dir.path(), &body);
    match Image::open(dir.path()) {
        Err(ImageError::Corrupted(why)) => assert!(why.contains("LimitExceeded"), "{why}"),
        other => panic!("{:?}", other.map(|i| i.manifest)),
    }
}

#[test]
fn a_manifest_length_near_2_to_the_64_is_refused() {
    // Adding the header's size to a length field of 2^64 - 5 overflowed (found by the
    // `checkpoint_image` fuzz target).
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(u64::MAX - 4).to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    std::fs::write(dir.path().join(MANIFEST_FILE), bytes).unwrap();
    match Image::open(dir.path()) {
        Err(ImageError::Corrupted(why)) => assert!(why.contains("over the limit"), "{why}"),
        other => panic!("{:?}", other.map(|i| i.manifest)),
    }
}
