//! The checkpoint image reader: an image directory made from the input (see
//! `phos_fuzz::image`) is opened, verified, and its chunks read both ways (up to a budget).
//! A forged image must be refused with an error; a chunk of a verified image must read.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use phos_checkpoint::Encoding;

/// Bytes of chunk contents one input may have read (a chunk may be 256 MiB, and a zero one or
/// a small Zstandard frame costs nothing to describe): far more than any seed needs, little
/// enough for every input to end well inside the timeout.
const READ_BUDGET: u64 = 64 << 20;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(phos_fuzz::image::scratch_dir)
}

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    phos_fuzz::image::write(input, dir());
    let Ok(mut image) = phos_checkpoint::Image::open(dir()) else { return };
    let chunks: Vec<_> = image.manifest.memory.iter().flat_map(|r| r.chunks.iter().copied()).collect();
    let stored: u64 = chunks.iter().filter(|c| c.encoding != Encoding::Zero).map(|c| c.len).sum();
    let verified = stored <= READ_BUDGET && image.verify().is_ok();
    let mut budget = READ_BUDGET;
    let mut buf = Vec::new();
    for chunk in &chunks {
        let Some(left) = budget.checked_sub(chunk.len) else { break };
        budget = left;
        let read = image.read_chunk(chunk, &mut buf);
        assert!(read.is_ok() || !verified, "a chunk of a verified image fails: {read:?}");
        if read.is_ok() {
            assert_eq!(buf.len() as u64, chunk.len);
            let mut into = vec![0xa5; buf.len()];
            image.read_chunk_into(chunk, &mut into).expect("read_chunk_into reads what read_chunk read");
            assert_eq!(into, buf);
        }
    }
});
