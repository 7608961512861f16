//! API error codes and the reasons a server refuses a call.

use std::fmt;

use crate::cudart;
use crate::eval::EvalError;

/// A CUDA runtime error code (`cudaError_t`), never `cudaSuccess`. The named constants
/// (`CudaError::InvalidValue`, ...) are generated from the spec's errors table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaError(pub i32);

impl CudaError {
    pub fn code(self) -> i32 {
        self.0
    }

    fn info(self) -> Option<&'static crate::spec::ErrorInfo> {
        cudart::ERRORS.iter().find(|e| e.code == i64::from(self.0))
    }

    /// The C name (`cudaErrorInvalidValue`), or "unrecognized error code".
    pub fn name(self) -> &'static str {
        self.info().map_or("unrecognized error code", |e| e.name)
    }

    /// The text `cudaGetErrorString` gives under the given CUDA major version.
    pub fn text(self, abi_major: u32) -> &'static str {
        match self.info() {
            Some(e) => e.abi_texts.iter().find(|(v, _)| *v == i64::from(abi_major)).map_or(e.text, |(_, t)| t),
            None => "unrecognized error code",
        }
    }

    /// Errors after which the context is unusable: every later call fails with them too.
    pub fn is_sticky(self) -> bool {
        matches!(
            self.0,
            // illegal address, launch timeout, device assert, hardware stack error, illegal
            // instruction, misaligned address, invalid address space, invalid pc, launch
            // failure, ECC uncorrectable, contained error.
            700 | 702 | 710 | 714 | 715 | 716 | 717 | 718 | 719 | 214 | 226
        )
    }

    /// `Ok(())` for the success code, the error otherwise.
    pub fn check(code: i32) -> Result<(), CudaError> {
        if code == cudart::SUCCESS { Ok(()) } else { Err(CudaError(code)) }
    }
}

impl fmt::Debug for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.name(), self.0, self.text(13))
    }
}

impl std::error::Error for CudaError {}

impl From<EvalError> for CudaError {
    fn from(_: EvalError) -> Self {
        CudaError::InvalidValue
    }
}

/// Why the server's dispatch refused or failed a call. Everything except `Failed` is the
/// guest's fault (or a server bug) and is logged; all of them answer with [`Rejection::code`].
#[derive(Debug)]
pub enum Rejection {
    /// The payload does not decode as the function's request.
    Malformed(bincode::error::DecodeError),
    /// The function is implemented in the guest library and is never sent.
    NotRemote(&'static str),
    /// A spec check failed: which error, and what was wrong.
    Invalid(CudaError, &'static str),
    /// The call ran and failed, as it would natively.
    Failed(CudaError),
    /// The service answered with a reply the spec does not allow.
    ServerBug(&'static str),
}

impl Rejection {
    /// The error the guest receives.
    pub fn code(&self) -> CudaError {
        match self {
            Rejection::Malformed(_) => CudaError::InvalidValue,
            Rejection::NotRemote(_) => cudart::NOT_SUPPORTED,
            Rejection::Invalid(c, _) | Rejection::Failed(c) => *c,
            Rejection::ServerBug(_) => CudaError::Unknown,
        }
    }

    /// True when the guest sent something the spec does not allow (worth a log line).
    pub fn is_guest_fault(&self) -> bool {
        matches!(self, Rejection::Malformed(_) | Rejection::NotRemote(_) | Rejection::Invalid(..))
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Malformed(e) => write!(f, "malformed request: {e}"),
            Rejection::NotRemote(name) => write!(f, "{name} is implemented in the guest library and is not carried"),
            Rejection::Invalid(c, what) => write!(f, "invalid {what}: {c:?}"),
            Rejection::Failed(c) => write!(f, "failed: {c:?}"),
            Rejection::ServerBug(what) => write!(f, "server bug: {what}"),
        }
    }
}

impl std::error::Error for Rejection {}

impl From<EvalError> for Rejection {
    fn from(_: EvalError) -> Self {
        Rejection::Invalid(CudaError::InvalidValue, "size or offset out of range")
    }
}
