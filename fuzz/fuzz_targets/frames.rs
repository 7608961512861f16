//! The frame reader: `read_frame_within` over a byte stream that arrives in pieces (even mode
//! byte: pieces as large as asked or of `mode - 127` bytes; odd: the shared-memory rings,
//! attached from a region the input describes, see `phos_fuzz::ring`), with the transports'
//! own payload limit, charged to a small buffer budget when bit 1 of the mode is set. Frames
//! are read until the stream ends or fails. A header that decodes must encode back the same;
//! the payload buffer may never hold more than twice what arrived (plus the reader's first
//! piece), whatever the headers claim; a budget is never overdrawn, and is whole again once
//! the channel is gone.
#![no_main]

use std::io::Read;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use phos_fuzz::Fields;
use phos_protocol::DEFAULT_MAX_PAYLOAD;
use phos_protocol::frame::{FrameHeader, HEADER_LEN};
use phos_protocol::transport::{BufferBudget, BufferClaim, FIRST_PIECE, FREE_BUFFER, Transport, read_frame_within};

/// Frames read from one input at most.
const MAX_FRAMES: usize = 64;
/// The budget a channel's payloads are charged to (when they are).
const BUDGET: u64 = 2 * FREE_BUFFER as u64;

/// A stream that hands out at most `piece` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    piece: usize,
    handed_out: usize,
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

fn check(payload: &Vec<u8>, arrived: usize, budget: &BufferBudget) {
    assert!(
        payload.capacity() <= 2 * arrived + FIRST_PIECE,
        "{} bytes set aside for {arrived} that arrived",
        payload.capacity()
    );
    assert!(budget.used() <= budget.limit(), "the budget is overdrawn: {} of {}", budget.used(), budget.limit());
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
    let budget = BufferBudget::new(BUDGET);
    let charged = mode & 2 != 0;
    let mut payload = Vec::new();
    if mode.is_multiple_of(2) {
        let piece = if mode < 128 { usize::MAX } else { usize::from(mode - 127) };
        let mut stream = Trickle { data, piece, handed_out: 0 };
        let mut claim = charged.then(|| BufferClaim::new(Arc::clone(&budget)));
        for _ in 0..MAX_FRAMES {
            let read = read_frame_within(&mut stream, &mut payload, DEFAULT_MAX_PAYLOAD, claim.as_mut());
            check(&payload, stream.handed_out, &budget);
            if read.is_err() {
                break;
            }
        }
    } else if let Ok(mut ring) = phos_fuzz::ring::attach(data, DEFAULT_MAX_PAYLOAD) {
        if charged {
            ring.charge_payloads_to(Arc::clone(&budget));
        }
        for _ in 0..MAX_FRAMES {
            let read = ring.recv(&mut payload);
            // All a ring can hand out is what it holds.
            check(&payload, phos_fuzz::ring::MAX_RING_BYTES, &budget);
            if read.is_err() {
                break;
            }
        }
    }
    assert_eq!(budget.used(), 0, "a channel that is gone still holds part of its budget");
});
