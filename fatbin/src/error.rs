//! The crate's single error type.

use crate::Compression;

/// Everything that can be wrong with a fat binary, one of its entries or a cubin.
///
/// Offsets are byte offsets into the buffer that was being parsed: the fat binary container for
/// container and entry errors (the entry header's offset for entry-level problems), the
/// compressed input for decompression errors, the ELF image for ELF errors and the `.nv.info`
/// section for attribute errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FatbinError {
    /// A structure runs past the end of the bytes available.
    #[error("{what} at offset {offset:#x} needs {needed} bytes but only {available} are available")]
    Truncated { what: &'static str, offset: usize, needed: u64, available: usize },

    /// A magic number did not match.
    #[error("{what} at offset {offset:#x} has magic {found:#x}, expected {expected:#x}")]
    BadMagic { what: &'static str, offset: usize, found: u32, expected: u32 },

    /// A version field holds a value this crate does not understand.
    #[error("{what} at offset {offset:#x} has unsupported version {version}")]
    UnsupportedVersion { what: &'static str, offset: usize, version: u32 },

    /// A field is inconsistent with the format (a header shorter than its fixed part, a name
    /// that points outside its header, ...).
    #[error("{what} at offset {offset:#x} is malformed: {reason}")]
    Malformed { what: &'static str, offset: usize, reason: String },

    /// A size claimed by a header exceeds what this crate is willing to allocate or map.
    #[error("{what} at offset {offset:#x} claims {size} bytes, more than the limit of {limit}")]
    TooLarge { what: &'static str, offset: usize, size: u64, limit: u64 },

    /// A pointer handed to [`crate::container_from_wrapper`] was null.
    #[error("null pointer: {what}")]
    NullPointer { what: &'static str },

    /// An entry's flags ask for a compression method this crate does not know.
    #[error("entry at offset {entry_offset:#x} has unsupported compression flags {flags:#x}")]
    UnknownCompression { entry_offset: usize, flags: u64 },

    /// Compressed data is corrupt. `input_offset` is the position in the compressed stream
    /// where decoding failed, when the decoder can tell.
    #[error("{method:?} data of the entry at offset {entry_offset:#x} is corrupt{}: {reason}",
        input_offset.map(|o| format!(" at input byte {o:#x}")).unwrap_or_default())]
    Decompress { method: Compression, entry_offset: usize, input_offset: Option<usize>, reason: String },

    /// Decompression produced a different number of bytes than the entry header announced.
    #[error("entry at offset {entry_offset:#x} decompressed to {actual} bytes, its header says {expected}")]
    SizeMismatch { entry_offset: usize, expected: u64, actual: u64 },

    /// A PTX entry's text is not UTF-8.
    #[error("PTX text of the entry at offset {entry_offset:#x} is not UTF-8 (bad byte at {offset:#x})")]
    InvalidPtxText { entry_offset: usize, offset: usize },

    /// An ELF image (host object or cubin) is malformed.
    #[error("ELF image is malformed at offset {offset:#x}: {reason}")]
    Elf { offset: usize, reason: String },

    /// [`crate::cubin::kernels`] was given an ELF image for another machine.
    #[error("ELF machine is {machine}, not 190 (EM_CUDA): not a cubin")]
    NotCubin { machine: u16 },

    /// An `.nv.info` attribute stream is malformed.
    #[error("section {section} is malformed at offset {offset:#x}: {reason}")]
    NvInfo { section: String, offset: usize, reason: String },

    /// A kernel's parameter metadata is inconsistent (duplicate ordinals, a parameter outside
    /// the parameter buffer, ...).
    #[error("kernel {kernel}: {reason}")]
    KernelParams { kernel: String, reason: String },

    /// [`crate::cubin::KernelParams::pack`] was given arguments that do not match the layout.
    #[error("kernel {kernel}: {reason}")]
    Arguments { kernel: String, reason: String },
}

impl FatbinError {
    pub(crate) fn truncated(what: &'static str, offset: usize, needed: u64, available: usize) -> Self {
        FatbinError::Truncated { what, offset, needed, available }
    }

    pub(crate) fn malformed(what: &'static str, offset: usize, reason: impl Into<String>) -> Self {
        FatbinError::Malformed { what, offset, reason: reason.into() }
    }

    /// The same error with its container-relative offset moved by `base` (for containers
    /// found inside a larger section).
    pub(crate) fn shifted(mut self, base: usize) -> Self {
        match &mut self {
            FatbinError::Truncated { offset, .. }
            | FatbinError::BadMagic { offset, .. }
            | FatbinError::UnsupportedVersion { offset, .. }
            | FatbinError::Malformed { offset, .. }
            | FatbinError::TooLarge { offset, .. } => *offset = offset.saturating_add(base),
            _ => {}
        }
        self
    }

    pub(crate) fn elf(offset: usize, reason: impl Into<String>) -> Self {
        FatbinError::Elf { offset, reason: reason.into() }
    }
}
