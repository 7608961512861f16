//! Decompression of fat binary entries.
//!
//! Two methods occur in practice (see the crate docs for how they were identified):
//!
//! * flag `0x2000`: one raw LZ4 *block* (no LZ4 frame header, no checksum), decoded here by a
//!   small hand-written decoder;
//! * flag `0x8000` (CUDA 13 default): one Zstandard frame, decoded by the pure-Rust `ruzstd`.
//!
//! Both decoders write into a buffer that never grows past the size announced by the entry
//! header, so a corrupt or hostile stream cannot make us allocate more than that (itself capped
//! by [`crate::MAX_DECOMPRESSED_SIZE`]); the caller then checks the produced length.

use std::io::Read;

/// A decoding failure: where in the compressed input (when known) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError {
    pub(crate) input_offset: Option<usize>,
    pub(crate) reason: String,
}

impl DecodeError {
    fn at(input_offset: usize, reason: &str) -> Self {
        DecodeError { input_offset: Some(input_offset), reason: reason.to_owned() }
    }
}

/// An LZ4 sequence turns at most 3 + k input bytes into at most 19 + 255 k output bytes, so no
/// valid block expands by more than this factor. Larger claims are rejected before allocating.
pub(crate) const LZ4_MAX_RATIO: usize = 255;

/// Decodes one LZ4 block. Decoding stops at the end of `input` (a block ends with a literal
/// run); the output is never longer than `capacity`. The result may be shorter than `capacity`;
/// the caller compares it with the expected size.
pub(crate) fn lz4_block(input: &[u8], capacity: usize) -> Result<Vec<u8>, DecodeError> {
    if capacity > input.len().saturating_mul(LZ4_MAX_RATIO) {
        return Err(DecodeError::at(0, "declared size is larger than any LZ4 block of this length can produce"));
    }
    let mut out: Vec<u8> = Vec::with_capacity(capacity);
    let mut pos = 0usize;
    loop {
        let token_pos = pos;
        let Some(&token) = input.get(pos) else {
            return Err(DecodeError::at(pos, "block ends where a sequence token was expected"));
        };
        pos += 1;

        let literals = extended_length(input, &mut pos, usize::from(token >> 4))?;
        let literal_end = pos.checked_add(literals).filter(|&end| end <= input.len());
        let Some(literal_end) = literal_end else {
            return Err(DecodeError::at(pos, "literal run extends past the end of the block"));
        };
        if literals > capacity - out.len() {
            return Err(DecodeError::at(pos, "literal run overflows the declared size"));
        }
        out.extend_from_slice(&input[pos..literal_end]);
        pos = literal_end;

        // The last sequence of a block carries literals only.
        if pos == input.len() {
            return Ok(out);
        }

        let Some(offset) = crate::bytes::u16_at(input, pos) else {
            return Err(DecodeError::at(pos, "block ends inside a match offset"));
        };
        let offset = usize::from(offset);
        if offset == 0 || offset > out.len() {
            return Err(DecodeError::at(pos, "match offset points before the start of the output"));
        }
        pos += 2;
        let match_len = extended_length(input, &mut pos, usize::from(token & 0x0f))?
            .checked_add(4)
            .ok_or_else(|| DecodeError::at(token_pos, "match length overflows"))?;
        if match_len > capacity - out.len() {
            return Err(DecodeError::at(token_pos, "match overflows the declared size"));
        }
        copy_match(&mut out, offset, match_len);
    }
}

/// Reads the optional length extension bytes (each 255 means "more follows") after a 4-bit
/// length nibble of 15.
fn extended_length(input: &[u8], pos: &mut usize, nibble: usize) -> Result<usize, DecodeError> {
    let mut len = nibble;
    if nibble != 15 {
        return Ok(len);
    }
    loop {
        let Some(&byte) = input.get(*pos) else {
            return Err(DecodeError::at(*pos, "block ends inside a length extension"));
        };
        *pos += 1;
        // Cannot overflow: each byte adds at most 255 and the input is far shorter than
        // usize::MAX / 255 bytes, but stay checked anyway.
        len = len.checked_add(usize::from(byte)).ok_or_else(|| DecodeError::at(*pos, "length overflows"))?;
        if byte != 255 {
            return Ok(len);
        }
    }
}

/// Appends `len` bytes copied from `offset` bytes back. The regions may overlap (offset < len
/// repeats a pattern); the copy doubles its chunk size each round, which stays correct because
/// everything from `start` on is periodic with period `offset`.
fn copy_match(out: &mut Vec<u8>, offset: usize, len: usize) {
    let start = out.len() - offset;
    let mut copied = 0;
    while copied < len {
        let chunk = (len - copied).min(offset + copied);
        out.extend_from_within(start..start + chunk);
        copied += chunk;
    }
}

/// Decodes one Zstandard frame from `input`, producing at most `capacity` + 1 bytes (one more
/// than allowed so that an over-long stream is detected as a size mismatch by the caller).
pub(crate) fn zstd_frame(input: &[u8], capacity: usize) -> Result<Vec<u8>, DecodeError> {
    // The decoder is third-party code fed untrusted bytes inside the host program: contain a
    // panic there (none was found by the fuzz tests) as a decoding error instead of letting it
    // unwind into the application.
    std::panic::catch_unwind(|| zstd_frame_inner(input, capacity)).unwrap_or_else(|_| {
        Err(DecodeError { input_offset: None, reason: "the Zstandard decoder panicked".to_owned() })
    })
}

fn zstd_frame_inner(input: &[u8], capacity: usize) -> Result<Vec<u8>, DecodeError> {
    let mut source = input;
    let decoder = ruzstd::decoding::StreamingDecoder::new(&mut source)
        .map_err(|e| DecodeError { input_offset: None, reason: e.to_string() })?;
    // Zstandard can legitimately expand far more than LZ4, so only reserve what a modest
    // ratio predicts; the vector grows as real output arrives.
    let mut out = Vec::with_capacity(capacity.min(input.len().saturating_mul(8)));
    let limit = u64::try_from(capacity).unwrap_or(u64::MAX).saturating_add(1);
    decoder.take(limit).read_to_end(&mut out).map_err(|e| DecodeError { input_offset: None, reason: e.to_string() })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_only_block() {
        // Token 0x50: five literals, no match (end of block).
        assert_eq!(lz4_block(b"\x50hello", 5).unwrap(), b"hello");
    }

    #[test]
    fn overlapping_match_repeats_pattern() {
        // 2 literals "ab", match offset 2 length 4+3=7, then 1 trailing literal "!".
        let block = [0x23, b'a', b'b', 2, 0, 0x10, b'!'];
        assert_eq!(lz4_block(&block, 10).unwrap(), b"ababababa!");
        // Offset 1 is run-length encoding.
        let rle = [0x1f, b'x', 1, 0, 200, 0x00];
        assert_eq!(lz4_block(&rle, 1 + 219).unwrap(), vec![b'x'; 220]);
    }

    #[test]
    fn extended_lengths() {
        // Literal length 15 + 255 + 3 = 273.
        let mut block = vec![0xf0, 255, 3];
        block.extend(std::iter::repeat_n(b'z', 273));
        assert_eq!(lz4_block(&block, 273).unwrap(), vec![b'z'; 273]);
    }

    #[test]
    fn real_fatbin_block_prefix() {
        // The start of an LZ4-compressed cubin written by nvcc 11.8: ten literals (the ELF
        // identification) then six zero bytes copied from offset 1, then five more literals.
        let block =
            [0xa2, 0x7f, 0x45, 0x4c, 0x46, 0x02, 0x01, 0x01, 0x33, 0x07, 0x00, 0x01, 0x00, 0x50, 2, 0, 0xbe, 0, 0x76];
        let out = lz4_block(&block, 21).unwrap();
        assert_eq!(out, [0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0x33, 7, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0xbe, 0, 0x76]);
    }

    #[test]
    fn corrupt_blocks_are_errors() {
        let cases: &[(&[u8], usize, usize)] = &[
            (b"", 0, 0),                         // no token at all
            (b"\x50hel", 5, 1),                  // literals past the end
            (b"\x10a\x05\x00", 8, 2),            // offset 5 with one byte of output
            (b"\x10a\x00\x00", 8, 2),            // offset 0
            (b"\x10a\x01", 8, 2),                // truncated offset
            (b"\xf0\xff", 300, 2),               // truncated length extension
            (b"\x1fa\x01\x00\xff\xff", 1000, 6), // truncated match extension
        ];
        for &(block, capacity, at) in cases {
            let err = lz4_block(block, capacity).unwrap_err();
            assert_eq!(err.input_offset, Some(at), "{block:?}: {err:?}");
        }
    }

    #[test]
    fn output_never_exceeds_capacity() {
        assert!(lz4_block(b"\x50hello", 4).is_err());
        let rle = [0x1f, b'x', 1, 0, 200, 0x00];
        assert!(lz4_block(&rle, 100).is_err());
        // A claim no block of this length could satisfy is refused before allocating.
        assert!(lz4_block(b"\x00", 1 << 30).is_err());
        // Shorter output than the capacity is not an error here: the caller checks the size.
        assert_eq!(lz4_block(b"\x50hello", 10).unwrap(), b"hello");
    }

    #[test]
    fn agrees_with_lz4_flex_on_random_data() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..200 {
            let len = (next() % 5000) as usize;
            // A small alphabet with runs, so the encoder emits matches of all shapes.
            let alphabet = 1 + round % 7;
            let mut data = Vec::with_capacity(len);
            while data.len() < len {
                let byte = (next() % alphabet as u64) as u8;
                let run = (next() % 40) as usize;
                data.extend(std::iter::repeat_n(byte, run.min(len - data.len())));
            }
            let block = lz4_flex::block::compress(&data);
            assert_eq!(lz4_block(&block, data.len()).unwrap(), data, "round {round}");
        }
    }

    #[test]
    fn zstd_round_trip_and_limits() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8 ^ (i / 1000) as u8).collect();
        let frame = ruzstd::encoding::compress_to_vec(&data[..], ruzstd::encoding::CompressionLevel::Fastest);
        assert_eq!(zstd_frame(&frame, data.len()).unwrap(), data);
        // Output is cut one byte past the capacity so that the caller sees a mismatch.
        assert_eq!(zstd_frame(&frame, 100).unwrap().len(), 101);
        assert!(zstd_frame(b"not zstd", 100).is_err());
        assert!(zstd_frame(&frame[..frame.len() / 2], data.len()).is_err());
    }
}
