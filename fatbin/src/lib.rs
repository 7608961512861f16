//! CUDA fat binaries: containers, entries, decompression and cubin kernel metadata.
//!
//! When a CUDA program starts, code that nvcc generated calls
//! `__cudaRegisterFatBinary(void *fatCubin)` once per translation unit. The argument points to a
//! *wrapper*, which points to a *fat binary container*, which holds *entries*: one cubin per SM
//! architecture the program was built for, PTX text for the virtual architectures it embeds, and
//! possibly other kinds. The guest library needs all of it in process: the container's bytes to
//! ship to the API server, and each kernel's parameter layout (from the cubins) to turn the
//! `void **args` of a launch into one flat parameter buffer. This crate provides both without
//! any `unsafe` code except [`container_from_wrapper`], which has to read raw memory.
//!
//! ```no_run
//! # fn demo(fat_cubin: *const std::ffi::c_void) -> Result<(), phos_fatbin::FatbinError> {
//! use phos_fatbin::{EntryKind, FatBinary, container_from_wrapper, cubin};
//! // SAFETY: `fat_cubin` is the argument nvcc's registration code passed us.
//! let bytes = unsafe { container_from_wrapper(fat_cubin)? };
//! for entry in FatBinary::parse(bytes)?.entries() {
//!     let entry = entry?;
//!     if entry.kind == EntryKind::Cubin {
//!         for kernel in cubin::kernels(&entry.payload()?)? {
//!             println!("sm_{} {} {:?} {}", entry.sm_arch, kernel.name, kernel.params, kernel.buffer_size);
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # The format, as verified
//!
//! All of the following was checked against binaries built by nvcc 11.8 (V11.8.89) and nvcc
//! 13.0 (V13.0.88) on x86-64 Linux, by hex dumps and by comparison with the listings and
//! extracted files of CUDA 11.8's `cuobjdump` (which cannot read CUDA 13 cubins); the tests in
//! `tests/` rebuild such binaries and check it again. All integers are little-endian.
//!
//! ## Wrapper (`__fatBinC_Wrapper_t`, host section `.nvFatBinSegment`)
//!
//! | offset | type | field |
//! |--------|------|-------|
//! | 0 | `u32` | magic `0x466243b1` |
//! | 4 | `u32` | version: 1 for a translation unit, 2 for the device-link stub |
//! | 8 | pointer | the container (in `.nv_fatbin`) |
//! | 16 | pointer | version 1: "offline file name" (null in practice); version 2: array of prelinked fat binaries |
//!
//! This matches the declaration in CUDA's public `fatbinary_section.h`. A linked executable has
//! one wrapper per translation unit plus a version-2 wrapper for the container nvlink produced
//! (whole-program builds too), all registered the same way. CUDA 13 uses the same wrapper layout
//! and versions.
//!
//! ## Container (section `.nv_fatbin`; `__nv_relfatbin` in `-rdc` objects)
//!
//! | offset | type | field |
//! |--------|------|-------|
//! | 0 | `u32` | magic `0xba55ed50` |
//! | 4 | `u16` | version 1 |
//! | 6 | `u16` | header size, 16 |
//! | 8 | `u64` | size of the entries that follow the header |
//!
//! Containers of different translation units sit back to back in `.nv_fatbin`; a wrapper points
//! at one, and [`containers`] walks them all. Entries follow each other without gaps: the next
//! entry starts `header_size + payload_size` bytes after the current one.
//!
//! ## Entry header
//!
//! | offset | type | field |
//! |--------|------|-------|
//! | 0 | `u16` | kind: 1 PTX, 2 cubin, 8 NVVM IR for LTO (`code=lto_XX`) |
//! | 2 | `u16` | header version, 0x0101 |
//! | 4 | `u32` | header size: 64 for cubins, 72 for PTX from 11.8, 80 for PTX from 13.0, more when strings are stored |
//! | 8 | `u64` | payload size, padded to a multiple of 8 (the next entry follows) |
//! | 16 | `u32` | compressed size (0 when not compressed) |
//! | 20 | `u32` | 64 for PTX and LTO IR, 0 for cubins (meaning not established) |
//! | 24 | `u16` | minor version: PTX ISA for PTX (7.8, 9.0), ELF ABI for cubins (1.7, 1.8) |
//! | 26 | `u16` | major version |
//! | 28 | `u32` | SM architecture (52, 70, 80, 90, ...) |
//! | 32 | `u32` | offset, from the entry header's start, of an identifier string (the source path, `-G` builds) |
//! | 36 | `u32` | its length (0: none) |
//! | 40 | `u64` | flags: 0x1 64-bit, 0x2 debug (`-G`), 0x10 Linux host, 0x2000 LZ4, 0x8000 Zstandard |
//! | 48 | `u64` | 0 in every binary seen |
//! | 56 | `u64` | uncompressed size (0 when not compressed) |
//! | 64 | `u32` | PTX and LTO IR only: offset of a compiler options string, e.g. `-g --dont-merge-basicblocks --return-at-end` for PTX from `-G` |
//! | 68 | `u32` | its length |
//!
//! Strings (identifier, options) are stored inside the header after the fixed fields, which
//! end at 64 for cubins and at 72 for PTX and LTO IR; a cubin header built with `-G` is thus 104
//! bytes, its identifier at offset 64. Uncompressed payloads are stored as is and padded with
//! NULs; PTX is NUL-terminated text.
//!
//! ## Compression
//!
//! * **LZ4** (flag 0x2000): the first `compressed size` bytes of the payload are exactly one
//!   standard LZ4 *block* (token, literals, 16-bit offset, extended lengths; no frame header, no
//!   checksum) that decodes to `uncompressed size` bytes. nvcc 11.8 compresses PTX by default
//!   (`fatbinary --compress` defaults to true, "compress ptx and debug images") and cubins too
//!   with `-Xfatbin -compress-all`; `-Xfatbin -compress=false` turns it off. The decoded cubin is
//!   byte-for-byte the uncompressed build's cubin and `cuobjdump -xelf`'s output; decoded PTX
//!   is the uncompressed PTX including its terminating NUL (the uncompressed payload adds padding).
//! * **Zstandard** (flag 0x8000): one standard Zstandard frame (magic `28 b5 2f fd`; the frames
//!   seen carry the content size and no checksum). This is CUDA 13's default. `-Xfatbin -compress-mode=` takes
//!   `default`/`balance` (Zstandard, PTX only), `size` (Zstandard, PTX and cubins), `speed`
//!   (LZ4, flag 0x2000, PTX only) or `none`; `-Xfatbin -compress-all` compresses cubins too
//!   with whichever method the mode selects.
//!
//! ## Cubins
//!
//! Cubins are ELF64 images with `e_machine` 190; see [`cubin`] for how kernels and their
//! `.nv.info.<kernel>` attributes are found and decoded, and [`elf`] for the ELF reader (also
//! used on host objects). CUDA 11.8 cubins have `EI_OSABI` 0x33, CUDA 13 ones 0x41; the
//! attribute encoding is the same, but CUDA 13 orders attributes differently and, for kernels
//! with a by-value parameter too large for the old 14-bit size field, describes parameters with
//! `EIATTR_KPARAM_INFO_V2` instead of `EIATTR_KPARAM_INFO`. Both are supported.
//!
//! # Robustness
//!
//! Parsing never panics and never reads outside the given slice, whatever the input: every read
//! is bounds-checked, sizes from headers are compared with the bytes actually present before
//! use, and decompression writes into a buffer limited by the entry's declared uncompressed
//! size, itself capped at [`MAX_DECOMPRESSED_SIZE`] and, for LZ4, at the largest expansion a
//! block of the given length can produce. The test suite feeds thousands of mutated real fat
//! binaries through every entry point.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

mod bytes;
mod container;
pub mod cubin;
mod decompress;
pub mod elf;
mod error;

pub use container::{
    CONTAINER_HEADER_SIZE, Compression, Containers, ENTRY_HEADER_MIN_SIZE, Entries, Entry, EntryKind, FATBIN_MAGIC,
    FLAG_64BIT, FLAG_COMPRESSED_LZ4, FLAG_COMPRESSED_ZSTD, FLAG_DEBUG, FLAG_HOST_LINUX, FatBinary,
    MAX_DECOMPRESSED_SIZE, WRAPPER_MAGIC, Wrapper, container_from_wrapper, containers,
};
pub use error::FatbinError;

#[cfg(test)]
mod tests;
