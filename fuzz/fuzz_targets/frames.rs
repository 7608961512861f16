//! The frame reader: `read_frame` over a byte stream that arrives in pieces (even byte 0:
//! whole reads; odd: the shared-memory rings, from a region the input describes, see
//! `phos_fuzz::ring`), with the transports' own payload limit. Frames are read until the
//! stream ends or fails; a header that decodes must encode back the same, and the payload
//! buffer may never hold more than twice what arrived (plus the reader's first step), whatever
//! the headers claim.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use phos_fuzz::Fields;
use phos_protocol::DEFAULT_MAX_PAYLOAD;
use phos_protocol::frame::{FrameHeader, HEADER_LEN};
use phos_protocol::transport::{FIRST_READ, Transport, read_frame};

/// Frames read from one input at most.
const MAX_FRAMES: usize = 64;

/// A stream that hands out at most `piece` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    piece: usize,
    handed_out: usize,
}

fn assert_buffer_keeps_pace(payload: &Vec<u8>, arrived: usize) {
    assert!(
        payload.capacity() <= 2 * arrived + FIRST_READ,
        "{} bytes set aside for {arrived} that arrived",
        payload.capacity()
    );
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.handed_out += n;
        Ok(n)
    }
}

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    let mut f = Fields::new(input);
    let mode = f.u8();
    let data = f.rest();
    if let Some(head) = data.first_chunk::<HEADER_LEN>()
        && let Ok(h) = FrameHeader::decode(head)
    {
        assert_eq!(&h.encode(), head, "a header re-encodes differently");
    }
    let mut payload = Vec::new();
    if mode.is_multiple_of(2) {
        let piece = if mode < 128 { usize::MAX } else { usize::from(mode - 127) };
        let mut stream = Trickle { data, piece, handed_out: 0 };
        for _ in 0..MAX_FRAMES {
            let read = read_frame(&mut stream, &mut payload, DEFAULT_MAX_PAYLOAD);
            assert_buffer_keeps_pace(&payload, stream.handed_out);
            if read.is_err() {
                break;
            }
        }
    } else if let Ok(mut ring) = phos_fuzz::ring::attach(data, DEFAULT_MAX_PAYLOAD) {
        for _ in 0..MAX_FRAMES {
            let read = ring.recv(&mut payload);
            // All a ring can hand out is what it holds.
            assert_buffer_keeps_pace(&payload, phos_fuzz::ring::MAX_RING_BYTES);
            if read.is_err() {
                break;
            }
        }
    }
});
