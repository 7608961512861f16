//! A shared-memory ring region made by a hostile peer from the input, attached with
//! [`ShmTransport::attach`] (the path a guest and an API server take) and read from:
//!
//! ```text
//! flags: u8    bit 0: magic, version and ring size come from the input too
//! ring:  u8    ring bytes: 4096 << (byte % 3), so at most [`MAX_RING_BYTES`]
//! head:  u64   the consumer index the region starts with
//! tail:  u64   only with flag bit 1: the producer index (else head + the data's length)
//! data:  the rest, written into the ring from `head` on, wrapping (at most one ring)
//! ```
//!
//! The ring is marked closed by its producer, so that the reader ends at the data's end
//! instead of sleeping for more.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;

use phos_protocol::shm::{ShmTransport, send_fd};

use crate::Fields;

// The region's layout (protocol/src/shm.rs).
const CONTROL_BYTES: u64 = 4096;
const RING0_CONTROL: u64 = 1024;
const TAIL: u64 = RING0_CONTROL;
const HEAD: u64 = RING0_CONTROL + 64;
const CLOSED: u64 = RING0_CONTROL + 128;
const CLOSED_BY_PRODUCER: u32 = 1;

/// The largest ring an input makes.
pub const MAX_RING_BYTES: usize = 4096 << 2;

/// The region an input describes, as a sealed memfd.
pub fn region(input: &[u8]) -> io::Result<OwnedFd> {
    let mut f = Fields::new(input);
    let flags = f.u8();
    let ring = 4096u64 << (f.u8() % 3);
    let (magic, version, size) =
        if flags & 1 != 0 { (f.bytes(8).to_vec(), f.u32(), f.u64()) } else { (b"PHOSRING".to_vec(), 1, ring) };
    let head = f.u64();
    let explicit_tail = (flags & 2 != 0).then(|| f.u64());
    let data = f.rest();
    let data = &data[..data.len().min(ring as usize)];
    let tail = explicit_tail.unwrap_or(head.wrapping_add(data.len() as u64));

    // SAFETY: a plain system call with a valid C string.
    let fd = unsafe { libc::memfd_create(c"phos-fuzz-ring".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(CONTROL_BYTES + 2 * ring)?;
    file.write_all_at(&magic, 0)?;
    file.write_all_at(&version.to_le_bytes(), 8)?;
    file.write_all_at(&size.to_le_bytes(), 16)?;
    file.write_all_at(&tail.to_le_bytes(), TAIL)?;
    file.write_all_at(&head.to_le_bytes(), HEAD)?;
    file.write_all_at(&CLOSED_BY_PRODUCER.to_le_bytes(), CLOSED)?;
    let start = head % ring;
    let first = data.len().min((ring - start) as usize);
    file.write_all_at(&data[..first], CONTROL_BYTES + start)?;
    file.write_all_at(&data[first..], CONTROL_BYTES)?;
    // SAFETY: `fcntl` on a descriptor this function owns.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file.into())
}

/// Attach to the region an input describes, as a peer that received it over its socket.
pub fn attach(input: &[u8], max_payload: u64) -> io::Result<ShmTransport> {
    let fd = region(input)?;
    let (ours, theirs) = UnixStream::pair()?;
    send_fd(&ours, &fd)?;
    let (transport, _) = ShmTransport::attach(theirs, max_payload)?;
    Ok(transport)
}
