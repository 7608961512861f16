//! The fat binary parser: containers, entries, LZ4 and Zstandard payloads, PTX text, and the
//! cubin ELF reader with its `.nv.info` attributes and kernel parameter layouts, all on the
//! same bytes. A layout that parses must pack its own parameters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phos_fatbin::{EntryKind, FatBinary, Wrapper, containers, cubin};

fn kernels(elf: &[u8]) {
    let Ok(kernels) = cubin::kernels(elf) else { return };
    for kernel in kernels {
        let args: Vec<Vec<u8>> = kernel.params.iter().map(|p| vec![0xab; usize::from(p.size)]).collect();
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let buffer = kernel.pack(&args).expect("a parsed layout packs its own parameters");
        assert_eq!(buffer.len(), kernel.buffer_size as usize);
    }
}

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    for container in containers(input).take(16).flatten() {
        assert_eq!(FatBinary::parse(container.bytes()).map(|c| c.len()), Ok(container.len()));
        for entry in container.entries().take(64).flatten() {
            if let Ok(payload) = entry.payload() {
                if entry.compressed {
                    assert_eq!(payload.len() as u64, entry.uncompressed_size);
                }
                if entry.kind == EntryKind::Cubin {
                    kernels(&payload);
                }
            }
            if let Ok(Some(text)) = entry.ptx_text() {
                assert!(!text.contains('\0'));
            }
        }
    }
    let _ = Wrapper::parse(input);
    kernels(input);
});
