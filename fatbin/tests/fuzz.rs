//! Robustness: thousands of randomly mutated and truncated copies of real fat binaries and
//! cubins go through every parser; none may panic (the checks inside `common::exercise` also
//! hold the API's promises on whatever still parses). Reproducible: fixed xorshift seeds.

mod common;

use common::*;
use phos_fatbin::{EntryKind, FatBinary};

/// Mutations per input.
const ROUNDS: usize = 3000;

/// `.nv_fatbin` sections worth mutating: LZ4-compressed and uncompressed, from `toolchain`.
fn inputs(tc: &Toolchain, modes: &[(&str, &[&str])]) -> Vec<Vec<u8>> {
    let scratch = Scratch::new(&format!("{}-fuzz", tc.label));
    modes
        .iter()
        .map(|(name, extra)| section(&object(tc, scratch.path(), &format!("{name}.o"), extra), ".nv_fatbin"))
        .collect()
}

/// The cubins of a section, decompressed.
fn cubins(section: &[u8]) -> Vec<Vec<u8>> {
    let fatbin = FatBinary::parse(section).unwrap();
    fatbin
        .entries()
        .map(Result::unwrap)
        .filter(|e| e.kind == EntryKind::Cubin)
        .map(|e| e.payload().unwrap().into_owned())
        .collect()
}

fn mutate_all(label: &str, originals: &[Vec<u8>], seed: u64) {
    let mut rng = XorShift(seed);
    for original in originals {
        // The unmodified input parses completely.
        assert!(exercise(original) > 0, "{label}: the original parses");
        let mut parsed = 0;
        for _ in 0..ROUNDS {
            parsed += exercise(&rng.mutate(original));
        }
        eprintln!("{label}: {ROUNDS} mutations of {} bytes, {parsed} structures parsed", original.len());
    }
}

#[test]
fn mutated_cuda11_fat_binaries_never_panic() {
    let Some(tc) = cuda11() else { return };
    let sections = inputs(
        &tc,
        &[("compress-all", &["-Xfatbin", "-compress-all"]), ("uncompressed", &["-Xfatbin", "-compress=false"])],
    );
    mutate_all("cuda11 fatbin", &sections, 0x0123_4567_89ab_cdef);
    mutate_all("cuda11 cubin", &cubins(&sections[1]), 0xfeed_f00d_dead_beef);
}

#[test]
fn truncated_cuda11_fat_binaries_never_panic() {
    let Some(tc) = cuda11() else { return };
    let sections = inputs(&tc, &[("compress-all", &["-Xfatbin", "-compress-all"])]);
    let section = &sections[0];
    for len in 0..section.len() {
        exercise(&section[..len]);
    }
    for cubin in cubins(section) {
        for len in (0..cubin.len()).step_by(3) {
            exercise_cubin(&cubin[..len]);
        }
    }
}

/// Zstandard-compressed input needs the CUDA 13 toolchain; skipped without it.
#[test]
fn mutated_cuda13_fat_binaries_never_panic() {
    let Some(tc) = cuda13() else { return };
    let sections = inputs(
        &tc,
        &[
            ("zstd-all", &["-Xfatbin", "-compress-all"]),
            ("lz4-all", &["-Xfatbin", "-compress-all", "-Xfatbin", "-compress-mode=speed"]),
        ],
    );
    mutate_all("cuda13 fatbin", &sections, 0x5eed_5eed_5eed_5eed);
    mutate_all("cuda13 cubin", &cubins(&sections[0])[..1], 0x1357_9bdf_2468_ace0);
}
