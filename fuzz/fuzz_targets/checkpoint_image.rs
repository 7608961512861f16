//! The checkpoint image reader: an image directory made from the input (see
//! `phos_fuzz::image`) is opened, verified, and every chunk read both ways. A forged image
//! must be refused with an error.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(phos_fuzz::image::scratch_dir)
}

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    phos_fuzz::image::write(input, dir());
    let Ok(mut image) = phos_checkpoint::Image::open(dir()) else { return };
    let verified = image.verify().is_ok();
    let chunks: Vec<_> = image.manifest.memory.iter().flat_map(|r| r.chunks.iter().copied()).collect();
    let mut buf = Vec::new();
    for chunk in &chunks {
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
