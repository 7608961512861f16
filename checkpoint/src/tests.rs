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
    for (found, says) in [
        (1u32, "version 1 images come from builds before"),
        (2, "version 2 images come from builds that stored memory in one file"),
        (10, "it reads versions 3 to 9"),
    ] {
        bytes[8..12].copy_from_slice(&found.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let e = Image::open(dir.path()).err().expect("refused");
        assert!(matches!(e, ImageError::Version { found: f } if f == found), "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
}

/// An image of format 3 (the version 5 manifest without its last two fields, which say which
/// async calls had run and hold the graphs) is read, with no async call known to have run and
/// no graphs, and its memory reads back.
#[test]
fn a_version_3_image_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let data = write(dir.path(), Compression::Zstd(1));
    let path = dir.path().join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let mut body = bytes[20..bytes.len() - 4].to_vec();
    let mut tail = Vec::new();
    bincode::encode_into_std_write(AsyncCallsRun::default(), &mut tail, config()).unwrap();
    bincode::encode_into_std_write(Vec::<u8>::new(), &mut tail, config()).unwrap();
    bincode::encode_into_std_write(Vec::<KeptReply>::new(), &mut tail, config()).unwrap();
    v9_tail(&mut tail);
    assert!(
        body.ends_with(&tail),
        "the manifest ends with its async calls, graphs, kept replies, arrays, conditionals"
    );
    body.truncate(body.len() - tail.len());
    // The format is the manifest's first field, one byte.
    assert_eq!(body[0], FORMAT_VERSION as u8);
    body[0] = 3;
    let mut old = MAGIC.to_vec();
    old.extend_from_slice(&3u32.to_le_bytes());
    old.extend_from_slice(&(body.len() as u64).to_le_bytes());
    old.extend_from_slice(&body);
    let crc = crc32fast::hash(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &old).unwrap();
    let img = Image::open(dir.path()).expect("a version 3 image is read");
    assert_eq!(img.manifest.format, 3);
    assert_eq!(img.manifest.async_calls, AsyncCallsRun::default());
    assert_eq!(img.manifest.records, sample_manifest().records);
    assert_eq!(read_back(dir.path()).unwrap(), data);
}

/// A version 7 image (before synchronous replies were kept) reads as one without them; a
/// version 8 image keeps them.
#[test]
fn a_version_7_image_is_read_without_kept_replies() {
    let dir = tempfile::tempdir().unwrap();
    let data = write(dir.path(), Compression::Zstd(1));
    let path = dir.path().join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let mut body = bytes[20..bytes.len() - 4].to_vec();
    let mut tail = Vec::new();
    bincode::encode_into_std_write(Vec::<KeptReply>::new(), &mut tail, config()).unwrap();
    v9_tail(&mut tail);
    assert!(body.ends_with(&tail), "the manifest ends with its kept replies, arrays and conditionals");
    body.truncate(body.len() - tail.len());
    assert_eq!(body[0], FORMAT_VERSION as u8);
    body[0] = 7;
    let mut old = MAGIC.to_vec();
    old.extend_from_slice(&7u32.to_le_bytes());
    old.extend_from_slice(&(body.len() as u64).to_le_bytes());
    old.extend_from_slice(&body);
    let crc = crc32fast::hash(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &old).unwrap();
    let img = Image::open(dir.path()).expect("a version 7 image is read");
    assert_eq!(img.manifest.format, 7);
    assert!(img.manifest.sync_replies.is_empty());
    assert_eq!(img.manifest.records, sample_manifest().records);
    assert_eq!(read_back(dir.path()).unwrap(), data);

    let kept = vec![KeptReply { call_id: 12, api: 0, function: 3, status: 0, payload: vec![1, 2, 3] }];
    let dir = tempfile::tempdir().unwrap();
    let mut w = ImageWriter::create(dir.path(), Compression::None, 4096).unwrap();
    w.begin_region(0x6000_0000_0000, 4096, 0, RegionKind::Allocation);
    w.add_chunk(&pattern(4096, 3)).unwrap();
    w.finish(Manifest { sync_replies: kept.clone(), ..sample_manifest() }).unwrap();
    assert_eq!(Image::open(dir.path()).unwrap().manifest.sync_replies, kept);
    // Replies that no session could have kept are refused.
    let twice = vec![kept[0].clone(), kept[0].clone()];
    assert!(check_meaning(&Manifest { sync_replies: twice, ..sample_manifest() }).is_err());
    let other_api = vec![KeptReply { api: 9, ..kept[0].clone() }];
    assert!(check_meaning(&Manifest { sync_replies: other_api, ..sample_manifest() }).is_err());
}

/// What a version 9 manifest has at its end that a version 8 one has not, when empty.
fn v9_tail(tail: &mut Vec<u8>) {
    bincode::encode_into_std_write(Vec::<u8>::new(), &mut *tail, config()).unwrap();
    bincode::encode_into_std_write(Vec::<ConditionalHandle>::new(), &mut *tail, config()).unwrap();
}

/// A version 8 image (before arrays, texture and surface objects and conditional handles
/// were kept) reads as one without them, its kept replies and memory as they were; a version
/// 9 image keeps them, and conditional handles that are no cell of the session's are refused.
#[test]
fn a_version_8_image_is_read_without_arrays_or_conditionals() {
    let kept = vec![KeptReply { call_id: 12, api: 0, function: 3, status: 0, payload: vec![1, 2, 3] }];
    let dir = tempfile::tempdir().unwrap();
    let mut w = ImageWriter::create(dir.path(), Compression::None, 4096).unwrap();
    w.begin_region(0x6000_0000_0000, 4096, 0, RegionKind::Allocation);
    let data = pattern(4096, 5);
    w.add_chunk(&data).unwrap();
    w.finish(Manifest { sync_replies: kept.clone(), graphs: vec![7, 7], ..sample_manifest() }).unwrap();
    let path = dir.path().join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let mut body = bytes[20..bytes.len() - 4].to_vec();
    let mut tail = Vec::new();
    v9_tail(&mut tail);
    assert!(body.ends_with(&tail), "the manifest ends with its arrays and conditionals");
    body.truncate(body.len() - tail.len());
    assert_eq!(body[0], FORMAT_VERSION as u8);
    body[0] = 8;
    let mut old = MAGIC.to_vec();
    old.extend_from_slice(&8u32.to_le_bytes());
    old.extend_from_slice(&(body.len() as u64).to_le_bytes());
    old.extend_from_slice(&body);
    let crc = crc32fast::hash(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &old).unwrap();
    let img = Image::open(dir.path()).expect("a version 8 image is read");
    assert_eq!(img.manifest.format, 8);
    assert!(img.manifest.arrays.is_empty() && img.manifest.conditionals.is_empty());
    assert_eq!(img.manifest.sync_replies, kept);
    assert_eq!(img.manifest.graphs, vec![7, 7]);
    assert_eq!(img.manifest.records, sample_manifest().records);
    assert_eq!(read_back(dir.path()).unwrap(), vec![data.clone()]);
    // Streamed, it becomes a version 9 image holding none of them.
    let mut streamed = Vec::new();
    let mut sink = StreamWriter::new(&mut streamed);
    copy_image(&mut Image::open(dir.path()).unwrap(), &mut sink, Compression::None).unwrap();
    drop(sink);
    let reread = StreamReader::open(&streamed[..]).unwrap();
    assert_eq!(reread.manifest().format, 9);
    assert!(reread.manifest().arrays.is_empty() && reread.manifest().sync_replies == kept);

    let cond = ConditionalHandle { cell: 0x6000_0000_0000, device: 0, graph: 0x55, default: 1, flags: 1 };
    let dir = tempfile::tempdir().unwrap();
    let mut w = ImageWriter::create(dir.path(), Compression::None, 4096).unwrap();
    w.begin_region(0x6000_0000_0000, 4096, 0, RegionKind::Allocation);
    w.add_chunk(&data).unwrap();
    w.finish(Manifest { arrays: vec![1, 2, 3], conditionals: vec![cond], ..sample_manifest() }).unwrap();
    let img = Image::open(dir.path()).unwrap();
    assert_eq!(img.manifest.format, 9);
    assert_eq!((img.manifest.arrays.clone(), img.manifest.conditionals.clone()), (vec![1, 2, 3], vec![cond]));
    let with_memory = |conditionals| Manifest {
        conditionals,
        memory: vec![MemoryRegion {
            addr: 0x6000_0000_0000,
            size: 4096,
            device: 0,
            kind: RegionKind::Allocation,
            chunks: Vec::new(),
        }],
        ..sample_manifest()
    };
    assert!(check_meaning(&with_memory(vec![cond])).is_ok());
    assert!(check_meaning(&with_memory(vec![cond, cond])).is_err(), "twice");
    assert!(check_meaning(&with_memory(vec![ConditionalHandle { cell: 0x6000_0000_0010, ..cond }])).is_err());
    assert!(check_meaning(&with_memory(vec![ConditionalHandle { flags: 2, ..cond }])).is_err());
    assert!(check_meaning(&sample_manifest_with(vec![cond])).is_err(), "no such allocation");
}

fn sample_manifest_with(conditionals: Vec<ConditionalHandle>) -> Manifest {
    Manifest { conditionals, ..sample_manifest() }
}

/// A version 4 image (before graphs were kept) reads as one without graphs.
#[test]
fn a_version_4_image_is_read_without_graphs() {
    let dir = tempfile::tempdir().unwrap();
    let data = write(dir.path(), Compression::Zstd(1));
    let path = dir.path().join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let mut body = bytes[20..bytes.len() - 4].to_vec();
    let mut tail = Vec::new();
    bincode::encode_into_std_write(Vec::<u8>::new(), &mut tail, config()).unwrap();
    bincode::encode_into_std_write(Vec::<KeptReply>::new(), &mut tail, config()).unwrap();
    v9_tail(&mut tail);
    assert!(body.ends_with(&tail), "the manifest ends with its graphs, kept replies, arrays and conditionals");
    body.truncate(body.len() - tail.len());
    assert_eq!(body[0], FORMAT_VERSION as u8);
    body[0] = 4;
    let mut old = MAGIC.to_vec();
    old.extend_from_slice(&4u32.to_le_bytes());
    old.extend_from_slice(&(body.len() as u64).to_le_bytes());
    old.extend_from_slice(&body);
    let crc = crc32fast::hash(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &old).unwrap();
    let img = Image::open(dir.path()).expect("a version 4 image is read");
    assert_eq!(img.manifest.format, 4);
    assert!(img.manifest.graphs.is_empty());
    assert_eq!(img.manifest.records, sample_manifest().records);
    assert_eq!(read_back(dir.path()).unwrap(), data);
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

/// The head and chunks of `write`'s image, for writing through the sink traits.
fn sample_head() -> (Manifest, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let data = write(dir.path(), Compression::None);
    let mut head = Image::open(dir.path()).unwrap().manifest;
    for r in &mut head.memory {
        r.chunks.clear();
    }
    (head, data)
}

/// Send `head` and `data` (one entry per region) through `sink` in 4 KiB chunks.
fn send(sink: &mut dyn ImageSink, head: &Manifest, data: &[Vec<u8>], compression: Compression) -> ImageSummary {
    sink.begin(head).unwrap();
    for (i, region) in data.iter().enumerate() {
        for c in region.chunks(4096) {
            sink.chunk(i, c.len() as u64, prepare_chunk(c, compression).unwrap(), c).unwrap();
        }
    }
    sink.complete().unwrap()
}

/// Everything a source holds: its manifest and each region's contents.
fn receive(source: &mut dyn ImageSource) -> Result<(Manifest, Vec<Vec<u8>>), ImageError> {
    let manifest = source.manifest().clone();
    let mut data: Vec<Vec<u8>> = manifest.memory.iter().map(|r| vec![0xee; r.size as usize]).collect();
    while let Some(c) = source.next_chunk()? {
        let out = &mut data[c.region][c.offset as usize..(c.offset + c.len) as usize];
        if c.zero {
            out.fill(0);
        } else {
            source.read_chunk(out)?;
        }
    }
    Ok((manifest, data))
}

/// An image streamed through a socket pair, written on one thread while it is read on
/// another, comes out as it went in, in both encodings; zero chunks cost nothing.
#[test]
fn a_stream_round_trips_through_a_socket() {
    let (head, data) = sample_head();
    for compression in [Compression::None, Compression::Zstd(1)] {
        let (tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let (h, d) = (head.clone(), data.clone());
        let writer = std::thread::spawn(move || {
            let mut sink = StreamWriter::new(tx);
            let summary = send(&mut sink, &h, &d, compression);
            drop(sink.into_inner().unwrap());
            summary
        });
        let mut source = StreamReader::open(rx).unwrap();
        let (manifest, got) = receive(&mut source).unwrap();
        let summary = writer.join().unwrap();
        assert_eq!(got, data);
        assert_eq!(manifest.session, head.session);
        assert_eq!(manifest.records, head.records);
        assert_eq!(summary.memory_bytes, (data[0].len() + data[1].len()) as u64);
        // Region 1 is three chunks, two of them zero: only the third is stored.
        let raw = data[0].len() as u64 + 4096;
        match compression {
            Compression::None => assert_eq!(summary.stored_bytes, raw, "{summary:?}"),
            Compression::Zstd(_) => assert!(summary.stored_bytes < raw, "{summary:?}"),
        }
        assert!(source.next_chunk().unwrap().is_none(), "past the end");
    }
}

/// A stream received into a directory, and a directory sent as a stream, are the same image.
#[test]
fn streams_and_directories_convert_both_ways() {
    let (head, data) = sample_head();
    let mut bytes = Vec::new();
    let mut sink = StreamWriter::new(&mut bytes);
    send(&mut sink, &head, &data, Compression::Zstd(1));
    drop(sink);
    let dir = tempfile::tempdir().unwrap();
    let mut as_dir = ImageWriter::create(dir.path(), Compression::None, 4096).unwrap();
    copy_image(&mut StreamReader::open(&bytes[..]).unwrap(), &mut as_dir, Compression::None).unwrap();
    assert_eq!(read_back(dir.path()).unwrap(), data);
    let mut again = Vec::new();
    let mut sink = StreamWriter::new(&mut again);
    copy_image(&mut Image::open(dir.path()).unwrap(), &mut sink, Compression::None).unwrap();
    drop(sink);
    assert_eq!(receive(&mut StreamReader::open(&again[..]).unwrap()).unwrap().1, data);
}

/// Nothing in a stream is trusted: a flipped bit in a chunk's bytes, in a chunk's header or
/// in the head, a stream cut short, one that does not end, or one whose end disagrees with
/// what came, are refused with what is wrong.
#[test]
fn damaged_streams_are_refused() {
    let (head, data) = sample_head();
    let mut good = Vec::new();
    let mut sink = StreamWriter::new(&mut good);
    send(&mut sink, &head, &data, Compression::None);
    drop(sink);
    let read = |bytes: &[u8]| StreamReader::open(bytes).and_then(|mut s| receive(&mut s)).map(|_| ());
    read(&good).unwrap();
    let head_len = 20 + u64::from_le_bytes(good[12..20].try_into().unwrap()) as usize + 4;
    let first_chunk = head_len;
    let flipped = |at: usize| {
        let mut b = good.clone();
        b[at] ^= 0x10;
        b
    };
    // A data byte of the first chunk (after its 30-byte header).
    assert!(matches!(read(&flipped(first_chunk + 30 + 7)), Err(ImageError::Corrupted(w)) if w.contains("checksum")));
    // The chunk's length, in its header.
    assert!(matches!(read(&flipped(first_chunk + 6)), Err(ImageError::Corrupted(w)) if w.contains("header")));
    // The head.
    assert!(matches!(read(&flipped(40)), Err(ImageError::Corrupted(_))));
    assert!(matches!(read(&flipped(0)), Err(ImageError::NotAStream)));
    // Cut short, in a chunk and before the end record.
    assert!(matches!(read(&good[..first_chunk + 100]), Err(ImageError::Truncated(_))));
    assert!(matches!(read(&good[..good.len() - 21]), Err(ImageError::Truncated(_))));
    // An end record that disagrees with the chunks (its counts and checksum recomputed).
    let mut lying = good.clone();
    let end = lying.len() - 21;
    lying[end + 1..end + 9].copy_from_slice(&99u64.to_le_bytes());
    let crc = crc32fast::hash(&lying[end..end + 17]);
    lying[end + 17..].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(read(&lying), Err(ImageError::Corrupted(w)) if w.contains("says 99")));
    // Another format version.
    let mut newer = good.clone();
    newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(read(&newer), Err(ImageError::Version { .. })));
}

/// A writer refuses to send what a reader would refuse: chunks out of order or past their
/// region, an image that ends with a region short.
#[test]
fn a_stream_writer_keeps_the_order() {
    let (head, data) = sample_head();
    let mut sink = StreamWriter::new(Vec::new());
    sink.begin(&head).unwrap();
    let c = &data[1][..4096];
    assert!(sink.chunk(1, 4096, prepare_chunk(c, Compression::None).unwrap(), c).is_err(), "region 1 first");
    let c = &data[0][..4096];
    sink.chunk(0, 4096, prepare_chunk(c, Compression::None).unwrap(), c).unwrap();
    assert!(sink.complete().is_err(), "region 0 is not whole");
    let big = vec![1u8; data[0].len()];
    assert!(
        sink.chunk(0, big.len() as u64, prepare_chunk(&big, Compression::None).unwrap(), &big).is_err(),
        "past the end"
    );
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

/// What a call touches, as the dispatch shows it to a hook.
fn touching(device: &[(u64, u64, bool)]) -> Vec<phos_protocol::spec::DeviceAccess> {
    device.iter().map(|&(addr, len, writes)| phos_protocol::spec::DeviceAccess { addr, len, writes }).collect()
}

fn access(device: &[phos_protocol::spec::DeviceAccess]) -> phos_protocol::spec::CallAccess<'_> {
    phos_protocol::spec::CallAccess { function: "cudaMemcpy", device, objects: &[] }
}

/// Pending memory is kept as pieces: loading part of a range leaves the rest pending,
/// overlapping ranges merge, and a range is pending if any byte of it is.
#[test]
fn pending_memory_is_loaded_piece_by_piece() {
    use engine::PendingMemory;
    let p = PendingMemory::new([(0x1000, 0x1000), (0x1800, 0x1000), (0x8000, 0x100), (0x9000, 0)]);
    assert_eq!(p.remaining(), 0x1800 + 0x100, "the first two merge; an empty range is nothing");
    p.loaded(0x1400, 0x400);
    assert!(p.is_pending(0x1000, 0x400) && p.is_pending(0x17ff, 2) && !p.is_pending(0x1400, 0x400));
    assert_eq!(p.remaining(), 0x1400 + 0x100);
    // A load across several pieces and the gaps between them.
    p.loaded(0x0, 0x8080);
    assert!(!p.is_pending(0, 0x8080));
    assert!(p.is_pending(0x807f, 2), "the last piece's tail");
    assert_eq!(p.remaining(), 0x80);
    assert!(!p.is_pending(0x7000, 0x1000) && !p.is_pending(0x8100, u64::MAX), "next to a piece is not in it");
    p.loaded(0x8080, 0x80);
    assert_eq!(p.remaining(), 0);
}

/// A call that touches pending memory waits until all of it is loaded, telling the loader
/// what it waits for; calls elsewhere run at once; a loader that gives up fails the calls
/// it held.
#[test]
fn pending_memory_holds_calls_until_loaded() {
    use engine::{CallHook, PendingMemory};
    use std::sync::mpsc;
    use std::time::Duration;
    let p = PendingMemory::new([(0x1000, 0x1000), (0x4000, 0x1000)]);
    let elsewhere = touching(&[(0x3000, 0x100, true)]);
    assert_eq!(p.before_call(&access(&elsewhere)), Ok(()));
    assert_eq!(p.next_wanted(), None);
    std::thread::scope(|scope| {
        let (done_tx, done) = mpsc::channel();
        let p = &p;
        let held = scope.spawn(move || {
            // Reads a piece of the first range and writes one of the second.
            let device = touching(&[(0x1800, 0x10, false), (0x4100, 0x10, true)]);
            let r = p.before_call(&access(&device));
            done_tx.send(()).unwrap();
            r
        });
        let started = std::time::Instant::now();
        while p.next_wanted().is_none() {
            assert!(started.elapsed() < Duration::from_secs(10), "the call never asked for its memory");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(p.next_wanted(), Some((0x1800, 0x10)), "the oldest wanted piece first");
        p.loaded(0x1000, 0x1000);
        assert_eq!(p.next_wanted(), Some((0x4100, 0x10)));
        assert!(done.recv_timeout(Duration::from_millis(100)).is_err(), "ran with half its memory loaded");
        p.loaded(0x4100, 0x10);
        done.recv_timeout(Duration::from_secs(10)).expect("the call still waits");
        assert_eq!(held.join().unwrap(), Ok(()));
        assert_eq!(p.next_wanted(), None);
    });
    // The rest of the second range never comes.
    std::thread::scope(|scope| {
        let held = scope.spawn(|| p.before_call(&access(&touching(&[(0x4000, 0x10, false)]))));
        while p.next_wanted().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        p.fail(phos_protocol::CudaError::Unknown);
        assert_eq!(held.join().unwrap(), Err(phos_protocol::CudaError::Unknown));
    });
    assert_eq!(p.before_call(&access(&touching(&[(0x4000, 1, false)]))), Err(phos_protocol::CudaError::Unknown));
    assert_eq!(p.before_call(&access(&elsewhere)), Ok(()), "memory that is loaded still serves");
}

/// A hook slot shows calls to its hook only while one is installed, one at a time.
#[test]
fn a_hook_slot_holds_one_hook_while_installed() {
    use engine::{HookSlot, PendingMemory};
    let slot = HookSlot::default();
    assert!(!slot.active());
    let device = touching(&[(0x1000, 4, true)]);
    assert_eq!(slot.before_call(&access(&device)), Ok(()));
    let pending = std::sync::Arc::new(PendingMemory::new([(0x1000, 4)]));
    pending.fail(phos_protocol::CudaError::Unknown);
    let installed = slot.install(pending.clone()).expect("installs");
    assert!(slot.active());
    assert!(slot.install(pending.clone()).is_none(), "a second hook");
    assert_eq!(slot.before_call(&access(&device)), Err(phos_protocol::CudaError::Unknown));
    drop(installed);
    assert!(!slot.active());
    assert_eq!(slot.before_call(&access(&device)), Ok(()));
}

/// A host buffer that grows gives its old memory back unpinned, and unpins its memory when it
/// goes: a freed buffer left page-locked would stay registered with the driver.
#[test]
fn host_buffers_unpin_what_they_pinned() {
    use std::collections::HashSet;
    #[derive(Default)]
    struct Pins(parking_lot::Mutex<HashSet<(usize, usize)>>);
    impl engine::Pinning for Pins {
        fn pin(&self, buf: &mut [u8]) {
            assert!(self.0.lock().insert((buf.as_ptr() as usize, buf.len())), "pinned twice");
        }
        fn unpin(&self, buf: &mut [u8]) {
            assert!(self.0.lock().remove(&(buf.as_ptr() as usize, buf.len())), "unpinned what was not pinned");
        }
    }
    let pins = std::sync::Arc::new(Pins::default());
    let mut buf = engine::HostBuffer::new(16, Some(pins.clone()));
    buf.reserve(8);
    assert_eq!(buf.len(), 16);
    buf.reserve(4096);
    assert_eq!(buf.len(), 4096);
    assert_eq!(pins.0.lock().len(), 1, "the old buffer is still pinned");
    drop(buf);
    assert!(pins.0.lock().is_empty());
}

/// The memory files' lengths in an image directory, `memory` first.
fn memory_file_lengths(dir: &Path) -> Vec<u64> {
    (0..MAX_MEMORY_FILES)
        .map(|i| dir.join(if i == 0 { MEMORY_FILE.to_string() } else { memory_file_name(i) }))
        .take_while(|p| p.exists())
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect()
}

#[test]
fn prepared_memory_files_are_cut_to_what_parallel_writers_wrote() {
    let (head, data) = sample_head();
    let dir = tempfile::tempdir().unwrap();
    let mut w = ImageWriter::create(dir.path(), Compression::None, 4096).unwrap();
    w.prepare(PREPARED_AT_LEAST, 3).unwrap();
    assert!(memory_file_lengths(dir.path()).iter().all(|&l| l >= PREPARED_AT_LEAST / 3), "room made ahead");
    w.begin(&head).unwrap();
    let store = ImageSink::parallel(&mut w, 2).unwrap().expect("a directory writes in parallel");
    // Region 0 by writer 1, region 1 by writer 0, chunk by chunk.
    for (region, file) in [(0usize, 1usize), (1, 0)] {
        for (k, c) in data[region].chunks(4096).enumerate() {
            let chunk = if c.iter().all(|&b| b == 0) {
                Chunk {
                    offset: (k * 4096) as u64,
                    len: c.len() as u64,
                    encoding: Encoding::Zero,
                    stored: 0,
                    file: 0,
                    at: 0,
                    crc: 0,
                }
            } else {
                let (at, crc) = parallel::store_raw(store.as_ref(), file, c).unwrap();
                let len = c.len() as u64;
                Chunk {
                    offset: (k * 4096) as u64,
                    len,
                    encoding: Encoding::Raw,
                    stored: len,
                    file: file as u32,
                    at,
                    crc,
                }
            };
            w.stored_chunk(region, chunk).unwrap();
        }
    }
    drop(store);
    let summary = ImageSink::complete(&mut w).unwrap();
    drop(w);
    let lengths = memory_file_lengths(dir.path());
    assert_eq!(lengths.iter().sum::<u64>(), summary.stored_bytes, "no room left over: {lengths:?}");
    assert_eq!(lengths[2], 0, "the third prepared file was not used");
    assert_eq!(read_back(dir.path()).unwrap(), data);
}

#[test]
fn prepared_memory_files_written_in_order_keep_only_the_image() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = ImageWriter::create(dir.path(), Compression::None, 4096).unwrap();
        w.prepare(PREPARED_AT_LEAST, 2).unwrap();
        let a = pattern(10_000, 3);
        w.begin_region(0x6000_0000_0000, a.len() as u64, 0, RegionKind::Allocation);
        for c in a.chunks(4096) {
            w.add_chunk(c).unwrap();
        }
        w.finish(sample_manifest()).unwrap();
        assert_eq!(read_back(dir.path()).unwrap(), vec![a]);
    }
    assert_eq!(memory_file_lengths(dir.path()), vec![10_000, 0]);
    // An image dropped unfinished gives its room back.
    let other = tempfile::tempdir().unwrap();
    let mut w = ImageWriter::create(other.path(), Compression::None, 4096).unwrap();
    w.prepare(PREPARED_AT_LEAST, 2).unwrap();
    assert!(memory_file_lengths(other.path()).iter().all(|&l| l > 0));
    drop(w);
    assert_eq!(memory_file_lengths(other.path()), vec![0, 0]);
    // A small image is not prepared.
    let small = tempfile::tempdir().unwrap();
    let mut w = ImageWriter::create(small.path(), Compression::None, 4096).unwrap();
    w.prepare(PREPARED_AT_LEAST - 1, 2).unwrap();
    assert_eq!(memory_file_lengths(small.path()), vec![0]);
}
