//! Fat binary containers, their entries, and the wrapper nvcc registers them with.

use std::borrow::Cow;
use std::ffi::c_void;

use crate::FatbinError;
use crate::bytes::{u16_at, u32_at, u64_at};
use crate::decompress;

/// `magic` of `__fatBinC_Wrapper_t`.
pub const WRAPPER_MAGIC: u32 = 0x4662_43b1;
/// `magic` of a fat binary container header (bytes `50 ed 55 ba`).
pub const FATBIN_MAGIC: u32 = 0xba55_ed50;
/// Size of the container header that nvcc writes (the header's own size field may say more).
pub const CONTAINER_HEADER_SIZE: usize = 16;
/// The fixed part of an entry header, up to and including the uncompressed size.
pub const ENTRY_HEADER_MIN_SIZE: usize = 64;

/// Entry flag: 64-bit code.
pub const FLAG_64BIT: u64 = 0x1;
/// Entry flag: compiled with `-G` (debug).
pub const FLAG_DEBUG: u64 = 0x2;
/// Entry flag: built for a Linux host (set on every entry nvcc writes on Linux).
pub const FLAG_HOST_LINUX: u64 = 0x10;
/// Entry flag: payload is one LZ4 block.
pub const FLAG_COMPRESSED_LZ4: u64 = 0x2000;
/// Entry flag: payload is one Zstandard frame (CUDA 13).
pub const FLAG_COMPRESSED_ZSTD: u64 = 0x8000;

/// Largest uncompressed entry size this crate accepts from a header (1 GiB); larger claims are
/// treated as corruption rather than honoured with an allocation.
pub const MAX_DECOMPRESSED_SIZE: u64 = 1 << 30;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// Kind 1: PTX assembly text.
    Ptx,
    /// Kind 2: a cubin (ELF image of SASS for one SM architecture).
    Cubin,
    /// Any other kind, e.g. 8: NVVM IR for link-time optimisation (`code=lto_80`).
    Other(u16),
}

impl EntryKind {
    /// The kind for an entry header's `kind` field.
    pub fn from_raw(kind: u16) -> Self {
        match kind {
            1 => EntryKind::Ptx,
            2 => EntryKind::Cubin,
            other => EntryKind::Other(other),
        }
    }

    /// The entry header's `kind` field for this kind.
    pub fn raw(self) -> u16 {
        match self {
            EntryKind::Ptx => 1,
            EntryKind::Cubin => 2,
            EntryKind::Other(kind) => kind,
        }
    }
}

/// How an entry's payload is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Stored as is.
    None,
    /// Flag 0x2000: a raw LZ4 block (nvcc 11.8, and CUDA 13 with `-compress-mode=speed`).
    Lz4,
    /// Flag 0x8000: a Zstandard frame (CUDA 13 default, `size` and `balance` modes).
    Zstd,
}

/// One fat binary container: a 16-byte header followed by `fat_size` bytes of entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatBinary<'a> {
    bytes: &'a [u8],
    version: u16,
    header_size: u16,
}

impl<'a> FatBinary<'a> {
    /// Parses the container starting at `bytes[0]`. Bytes after it are ignored. Only the
    /// header is checked here; entries are checked as [`entries`](Self::entries) reaches them.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, FatbinError> {
        let (version, header_size, total) = parse_container_header(bytes)?;
        if total > bytes.len() as u64 {
            return Err(FatbinError::truncated("fat binary container", 0, total, bytes.len()));
        }
        Ok(FatBinary { bytes: &bytes[..total as usize], version, header_size })
    }

    /// The container's size: header plus entries. This is what has to be shipped to a server.
    #[allow(clippy::len_without_is_empty, reason = "a container always has at least its header")]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Exactly the container's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The container format version (1).
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The header's size field (16).
    pub fn header_size(&self) -> u16 {
        self.header_size
    }

    /// The entries in file order. After an error the iterator ends; zero bytes after the last
    /// entry are taken as padding.
    pub fn entries(&self) -> Entries<'a> {
        Entries { container: self.bytes, pos: usize::from(self.header_size), failed: false }
    }
}

/// Checks a container header and returns (version, header size, total size).
fn parse_container_header(bytes: &[u8]) -> Result<(u16, u16, u64), FatbinError> {
    let (Some(magic), Some(version), Some(header_size), Some(fat_size)) =
        (u32_at(bytes, 0), u16_at(bytes, 4), u16_at(bytes, 6), u64_at(bytes, 8))
    else {
        return Err(FatbinError::truncated("fat binary header", 0, CONTAINER_HEADER_SIZE as u64, bytes.len()));
    };
    if magic != FATBIN_MAGIC {
        return Err(FatbinError::BadMagic {
            what: "fat binary header",
            offset: 0,
            found: magic,
            expected: FATBIN_MAGIC,
        });
    }
    if version != 1 {
        return Err(FatbinError::UnsupportedVersion { what: "fat binary header", offset: 0, version: version.into() });
    }
    if usize::from(header_size) < CONTAINER_HEADER_SIZE {
        return Err(FatbinError::malformed("fat binary header", 0, format!("header size {header_size} is below 16")));
    }
    let total = fat_size.checked_add(u64::from(header_size)).filter(|&t| t <= isize::MAX as u64).ok_or(
        FatbinError::TooLarge { what: "fat binary container", offset: 0, size: fat_size, limit: isize::MAX as u64 },
    )?;
    Ok((version, header_size, total))
}

/// Iterator over the entries of a container; see [`FatBinary::entries`].
#[derive(Debug, Clone)]
pub struct Entries<'a> {
    container: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>, FatbinError>;

    fn next(&mut self) -> Option<Self::Item> {
        // Zero bytes after the last entry are padding, not an entry of kind 0.
        if self.failed || self.container[self.pos.min(self.container.len())..].iter().all(|&b| b == 0) {
            return None;
        }
        match Entry::parse(self.container, self.pos) {
            Ok((entry, next)) => {
                self.pos = next;
                Some(Ok(entry))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for Entries<'_> {}

/// Iterator over consecutive containers in a section; see [`containers`].
#[derive(Debug, Clone)]
pub struct Containers<'a> {
    section: &'a [u8],
    pos: usize,
    failed: bool,
}

/// The containers stored back to back in a `.nv_fatbin` (or `__nv_relfatbin`) section: a linked
/// host binary has one per translation unit plus one for the device-link step. Zero bytes
/// between containers are skipped. Errors carry offsets relative to the section start; after an
/// error the iterator ends.
pub fn containers(section: &[u8]) -> Containers<'_> {
    Containers { section, pos: 0, failed: false }
}

impl<'a> Containers<'a> {
    /// Offset in the section where the next container is looked for.
    pub fn offset(&self) -> usize {
        self.pos
    }
}

impl<'a> Iterator for Containers<'a> {
    type Item = Result<FatBinary<'a>, FatbinError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let rest = &self.section[self.pos.min(self.section.len())..];
        let start = rest.iter().position(|&b| b != 0)?;
        let at = self.pos + start;
        match FatBinary::parse(&self.section[at..]) {
            Ok(fatbin) => {
                self.pos = at + fatbin.len();
                Some(Ok(fatbin))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e.shifted(at)))
            }
        }
    }
}

impl std::iter::FusedIterator for Containers<'_> {}

/// One entry of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry<'a> {
    pub kind: EntryKind,
    /// SM architecture, e.g. 52, 80, 90: the target of a cubin, the virtual architecture of PTX.
    pub sm_arch: u32,
    /// Whether the payload is compressed ([`compression`](Self::compression) says how).
    pub compressed: bool,
    pub compression: Compression,
    /// Offset of the entry header from the start of the container.
    pub offset: usize,
    /// Entry header format version (0x0101 in every binary seen).
    pub header_version: u16,
    /// `FLAG_*` bits.
    pub flags: u64,
    /// For PTX the PTX ISA version (7.8 from CUDA 11.8, 9.0 from CUDA 13.0); for cubins the
    /// ELF ABI version (1.7, 1.8).
    pub version_major: u16,
    pub version_minor: u16,
    /// Size of the compressed data at the start of the payload (0 when uncompressed).
    pub compressed_size: u32,
    /// Size after decompression (0 when uncompressed).
    pub uncompressed_size: u64,
    /// The whole entry header, for fields this crate does not name.
    pub header: &'a [u8],
    /// The payload as stored: compressed or not, followed by padding to a multiple of 8.
    pub raw_payload: &'a [u8],
    /// The source file the entry was compiled from, when the header records it (`-G` builds).
    pub identifier: Option<&'a [u8]>,
    /// Compiler options recorded in the header (PTX and LTO IR entries; often empty).
    pub options: Option<&'a [u8]>,
}

impl<'a> Entry<'a> {
    /// Parses the entry whose header starts at `at`; returns it and the offset of the next one.
    fn parse(container: &'a [u8], at: usize) -> Result<(Self, usize), FatbinError> {
        let available = container.len() - at;
        let (Some(kind), Some(header_version), Some(header_size), Some(padded_size)) =
            (u16_at(container, at), u16_at(container, at + 2), u32_at(container, at + 4), u64_at(container, at + 8))
        else {
            return Err(FatbinError::truncated("entry header", at, 16, available));
        };
        let header_size = header_size as usize;
        if header_size < ENTRY_HEADER_MIN_SIZE {
            return Err(FatbinError::malformed(
                "entry header",
                at,
                format!("header size {header_size} is below the {ENTRY_HEADER_MIN_SIZE} bytes of its fixed fields"),
            ));
        }
        if header_size > available {
            return Err(FatbinError::truncated("entry header", at, header_size as u64, available));
        }
        let header = &container[at..at + header_size];
        let payload_at = at + header_size;
        let Some(raw_payload) = crate::bytes::slice(container, payload_at as u64, padded_size) else {
            return Err(FatbinError::truncated("entry payload", payload_at, padded_size, container.len() - payload_at));
        };
        // In bounds: the header is at least 64 bytes long.
        let field32 = |off| u32_at(header, off).unwrap_or_default();
        let field64 = |off| u64_at(header, off).unwrap_or_default();
        let compressed_size = field32(16);
        let flags = field64(40);
        let uncompressed_size = field64(56);

        let compression = match (flags & FLAG_COMPRESSED_LZ4 != 0, flags & FLAG_COMPRESSED_ZSTD != 0) {
            (false, false) => Compression::None,
            (true, false) => Compression::Lz4,
            (false, true) => Compression::Zstd,
            (true, true) => return Err(FatbinError::UnknownCompression { entry_offset: at, flags }),
        };
        if compression != Compression::None {
            if compressed_size == 0 || u64::from(compressed_size) > padded_size {
                return Err(FatbinError::malformed(
                    "compressed entry",
                    at,
                    format!("compressed size {compressed_size} does not fit the payload of {padded_size} bytes"),
                ));
            }
            if uncompressed_size > MAX_DECOMPRESSED_SIZE {
                return Err(FatbinError::TooLarge {
                    what: "entry uncompressed size",
                    offset: at,
                    size: uncompressed_size,
                    limit: MAX_DECOMPRESSED_SIZE,
                });
            }
        }

        let kind = EntryKind::from_raw(kind);
        let (identifier_at, identifier_len) = (field32(32), field32(36));
        let identifier = header_string(header, at, "entry identifier", identifier_at, identifier_len)?;
        // PTX and LTO IR headers have a 72-byte fixed part ending with the options string's
        // (offset, length); cubin headers stop at 64, and with `-G` their identifier string
        // starts right there, so bytes 64..72 are text, not fields.
        let has_options_fields =
            kind != EntryKind::Cubin && header_size >= 72 && (identifier_len == 0 || identifier_at >= 72);
        let options = if has_options_fields {
            header_string(header, at, "entry options", field32(64), field32(68))?
        } else {
            None
        };
        let entry = Entry {
            kind,
            sm_arch: field32(28),
            compressed: compression != Compression::None,
            compression,
            offset: at,
            header_version,
            flags,
            version_major: u16_at(header, 26).unwrap_or_default(),
            version_minor: u16_at(header, 24).unwrap_or_default(),
            compressed_size,
            uncompressed_size,
            header,
            raw_payload,
            identifier,
            options,
        };
        Ok((entry, payload_at + raw_payload.len()))
    }

    /// The payload, decompressed if needed. Uncompressed payloads are borrowed and keep their
    /// padding; decompressed ones are exactly `uncompressed_size` bytes.
    pub fn payload(&self) -> Result<Cow<'a, [u8]>, FatbinError> {
        let method = self.compression;
        // Both were validated by `parse`: the compressed size fits the payload and the
        // uncompressed size is at most MAX_DECOMPRESSED_SIZE.
        let input = self.raw_payload.get(..self.compressed_size as usize).unwrap_or(self.raw_payload);
        let expected = usize::try_from(self.uncompressed_size.min(MAX_DECOMPRESSED_SIZE)).unwrap_or(usize::MAX);
        let decoded = match method {
            Compression::None => return Ok(Cow::Borrowed(self.raw_payload)),
            Compression::Lz4 => decompress::lz4_block(input, expected),
            Compression::Zstd => decompress::zstd_frame(input, expected),
        };
        let out = decoded.map_err(|e| FatbinError::Decompress {
            method,
            entry_offset: self.offset,
            input_offset: e.input_offset,
            reason: e.reason,
        })?;
        if out.len() as u64 != self.uncompressed_size {
            return Err(FatbinError::SizeMismatch {
                entry_offset: self.offset,
                expected: self.uncompressed_size,
                actual: out.len() as u64,
            });
        }
        Ok(Cow::Owned(out))
    }

    /// For PTX entries, the text up to its terminating NUL; `None` for other kinds.
    pub fn ptx_text(&self) -> Result<Option<String>, FatbinError> {
        if self.kind != EntryKind::Ptx {
            return Ok(None);
        }
        let payload = self.payload()?;
        let text = payload.split(|&b| b == 0).next().unwrap_or_default();
        match std::str::from_utf8(text) {
            Ok(text) => Ok(Some(text.to_owned())),
            Err(e) => Err(FatbinError::InvalidPtxText { entry_offset: self.offset, offset: e.valid_up_to() }),
        }
    }

    /// Whether the entry holds 64-bit code.
    pub fn is_64bit(&self) -> bool {
        self.flags & FLAG_64BIT != 0
    }

    /// Whether the entry was compiled with debug information (`-G`).
    pub fn is_debug(&self) -> bool {
        self.flags & FLAG_DEBUG != 0
    }
}

/// A (offset, length) string stored inside an entry header, without trailing NULs.
fn header_string<'a>(
    header: &'a [u8],
    entry_at: usize,
    what: &'static str,
    offset: u32,
    len: u32,
) -> Result<Option<&'a [u8]>, FatbinError> {
    if len == 0 {
        return Ok(None);
    }
    match crate::bytes::slice(header, offset.into(), len.into()) {
        Some(bytes) => Ok(Some(crate::bytes::trim_trailing_nuls(bytes))),
        None => Err(FatbinError::malformed(
            what,
            entry_at,
            format!("{len} bytes at {offset:#x} lie outside the {}-byte entry header", header.len()),
        )),
    }
}

/// `__fatBinC_Wrapper_t` as stored in a 64-bit host file (`.nvFatBinSegment`), where the
/// pointers are link-time addresses (or 0 with a relocation, in object files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wrapper {
    /// 1 for a translation unit's own fat binary, 2 for the device-link (`nvlink`) stub.
    pub version: u32,
    /// Address of the fat binary container.
    pub data: u64,
    /// Version 1: an "offline file name" (null in every binary seen). Version 2: address of the
    /// array of prelinked fat binaries that took part in device linking.
    pub filename_or_fatbins: u64,
}

impl Wrapper {
    /// Size of a wrapper on a 64-bit host.
    pub const SIZE: usize = 24;

    /// Decodes the wrapper at the start of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, FatbinError> {
        let (Some(magic), Some(version), Some(data), Some(filename_or_fatbins)) =
            (u32_at(bytes, 0), u32_at(bytes, 4), u64_at(bytes, 8), u64_at(bytes, 16))
        else {
            return Err(FatbinError::truncated("fat binary wrapper", 0, Self::SIZE as u64, bytes.len()));
        };
        check_wrapper(magic, version)?;
        Ok(Wrapper { version, data, filename_or_fatbins })
    }
}

fn check_wrapper(magic: u32, version: u32) -> Result<(), FatbinError> {
    if magic != WRAPPER_MAGIC {
        return Err(FatbinError::BadMagic {
            what: "fat binary wrapper",
            offset: 0,
            found: magic,
            expected: WRAPPER_MAGIC,
        });
    }
    if version != 1 && version != 2 {
        return Err(FatbinError::UnsupportedVersion { what: "fat binary wrapper", offset: 0, version });
    }
    Ok(())
}

/// The in-memory layout of `__fatBinC_Wrapper_t` on this host.
#[repr(C)]
struct RawWrapper {
    magic: u32,
    version: u32,
    data: *const u8,
    _filename_or_fatbins: *const c_void,
}

/// Reads the `__fatBinC_Wrapper_t` at `ptr` (the argument of `__cudaRegisterFatBinary`) and
/// returns the bytes of the container it points to, its length taken from the container header.
/// The wrapper's magic and version and the container's magic and version are checked before
/// the length is trusted; the entries are not parsed (use [`FatBinary::parse`] on the result).
///
/// # Safety
///
/// `ptr` must be null or point to a readable `__fatBinC_Wrapper_t` (two `u32` and two pointers,
/// any alignment). If its magic and version are valid, its `data` pointer must be null or point
/// to a readable 16-byte container header, and if that header is valid, the whole container
/// (`header_size + fat_size` bytes) must be readable and must not be modified for `'a`. The code
/// nvcc generates meets all of this: the wrapper and the container are static data of the
/// registering module.
#[allow(unsafe_code)]
pub unsafe fn container_from_wrapper<'a>(ptr: *const c_void) -> Result<&'a [u8], FatbinError> {
    if ptr.is_null() {
        return Err(FatbinError::NullPointer { what: "fat binary wrapper" });
    }
    // SAFETY: the caller guarantees a readable wrapper at `ptr`; the read tolerates any alignment.
    let wrapper = unsafe { ptr.cast::<RawWrapper>().read_unaligned() };
    check_wrapper(wrapper.magic, wrapper.version)?;
    if wrapper.data.is_null() {
        return Err(FatbinError::NullPointer { what: "fat binary wrapper's data" });
    }
    // SAFETY: with a valid wrapper, the caller guarantees a readable container header at `data`.
    let header = unsafe { std::slice::from_raw_parts(wrapper.data, CONTAINER_HEADER_SIZE) };
    let (_, _, total) = parse_container_header(header)?;
    if (wrapper.data as usize).checked_add(total as usize).is_none() {
        return Err(FatbinError::TooLarge {
            what: "fat binary container",
            offset: 0,
            size: total,
            limit: (usize::MAX - wrapper.data as usize) as u64,
        });
    }
    // SAFETY: with a valid header, the caller guarantees `total` readable, unchanging bytes for
    // 'a; `total` is at most isize::MAX and does not wrap the address space (checked above).
    Ok(unsafe { std::slice::from_raw_parts(wrapper.data, total as usize) })
}
