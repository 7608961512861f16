//! A checkpoint image directory made from the input:
//!
//! ```text
//! flags:    u8     bit 0: the manifest file is the body as it is (else the body is wrapped
//!                  in the magic, version, length and a right checksum)
//! body_len: u32
//! body:     body_len bytes (fewer if the input ends first)
//! memory:   the rest: the memory file
//! ```
//!
//! Without the wrapping almost no mutation would get past the manifest's checksum, and the
//! decoder behind it would never be reached.

use std::path::{Path, PathBuf};

use crate::Fields;

/// The manifest file for a manifest body, as the image writer frames it.
pub fn framed_manifest(body: &[u8]) -> Vec<u8> {
    let mut bytes = phos_checkpoint::MAGIC.to_vec();
    bytes.extend_from_slice(&phos_checkpoint::FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(body);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// The input for an image directory written by the image writer (its manifest unwrapped),
/// which must open: a seed the reader refuses outright would reach none of what follows.
pub fn input_of(dir: &Path) -> Vec<u8> {
    let mut image = match phos_checkpoint::Image::open(dir) {
        Ok(image) => image,
        Err(e) => panic!("the seed image {} does not open: {e}", dir.display()),
    };
    // An input holds one memory file: an image its checkpoint wrote in several (one per
    // writer) is stored again in one, in order, compressed if it was.
    let chunks = image.manifest.memory.iter().flat_map(|r| r.chunks.iter());
    let compression = if chunks.clone().any(|c| c.encoding == phos_checkpoint::Encoding::Zstd) {
        phos_checkpoint::Compression::Zstd(1)
    } else {
        phos_checkpoint::Compression::None
    };
    let one = dir.with_extension("one");
    let mut sink =
        phos_checkpoint::ImageWriter::create(&one, compression, 1 << 20).expect("creating the single-file copy");
    phos_checkpoint::copy_image(&mut image, &mut sink, compression)
        .expect("copying the seed image into one memory file");
    let dir = one.as_path();
    let manifest = std::fs::read(dir.join(phos_checkpoint::MANIFEST_FILE)).expect("the image has a manifest");
    let memory = std::fs::read(dir.join(phos_checkpoint::MEMORY_FILE)).expect("the image has a memory file");
    let body = &manifest[20..manifest.len() - 4];
    assert_eq!(framed_manifest(body), manifest, "the writer frames manifests as this harness does");
    let mut input = vec![0u8];
    input.extend_from_slice(&(body.len() as u32).to_le_bytes());
    input.extend_from_slice(body);
    input.extend_from_slice(&memory);
    input
}

/// A scratch directory of this process, for the image under test.
pub fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let dir = root.join(format!("phos-fuzz-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// Write the image an input describes into `dir`.
pub fn write(input: &[u8], dir: &Path) {
    let mut f = Fields::new(input);
    let flags = f.u8();
    let body_len = f.u32() as usize;
    let body = f.bytes(body_len);
    let manifest = if flags & 1 != 0 { body.to_vec() } else { framed_manifest(body) };
    std::fs::write(dir.join(phos_checkpoint::MANIFEST_FILE), manifest).expect("writing the manifest");
    std::fs::write(dir.join(phos_checkpoint::MEMORY_FILE), f.rest()).expect("writing the memory file");
}
