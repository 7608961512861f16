//! API error codes and the reasons a server refuses a call.

use std::fmt;

use crate::cudart::CudaError;
use crate::eval::EvalError;

/// The status type of an API (`cudart::CudaError`, `cuda::CuError`), generated from its spec:
/// what a call of it returns, and what Phos's own failures of it are.
pub trait ApiStatus: Copy + fmt::Debug + fmt::Display + From<Failure> {
    /// The success code (`cudaSuccess`).
    const SUCCESS: i32;
    /// An argument Phos cannot carry or a request that does not decode.
    const INVALID_VALUE: Self;
    /// What a function Phos does not support answers.
    const NOT_SUPPORTED: Self;
    /// A bug, or a reply Phos does not understand.
    const INTERNAL_ERROR: Self;
    fn from_code(code: i32) -> Self;
    fn code(self) -> i32;
}

/// Why a call failed, before the calling API's status code is chosen for it: the guest core
/// serves every API, and each maps these to its own codes (the `invalid_value`,
/// `internal_error`, `no_device` and `session_lost` errors of its spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The server (or the router) answered with this status of the call's API.
    Status(i32),
    /// An argument Phos cannot carry (a size that overflows, a request past the router's limit).
    InvalidValue,
    /// A bug, or a reply that does not decode.
    Internal,
    /// No router to reach, or it refused the session.
    NoDevice,
    /// The session ended and did not come back.
    SessionLost,
}

impl From<EvalError> for Failure {
    fn from(_: EvalError) -> Self {
        Failure::InvalidValue
    }
}

impl CudaError {
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
}

/// Why the server's dispatch refused or failed a call of an API whose status is `S`.
/// Everything except `Failed` is the guest's fault (or a server bug) and is logged; all of them
/// answer with [`Rejection::code`].
#[derive(Debug)]
pub enum Rejection<S: ApiStatus = CudaError> {
    /// The payload does not decode as the function's request.
    Malformed(bincode::error::DecodeError),
    /// The function is implemented in the guest library and is never sent.
    NotRemote(&'static str),
    /// A spec check failed: which error, and what was wrong.
    Invalid(S, &'static str),
    /// The call ran and failed, as it would natively.
    Failed(S),
    /// The service answered with a reply the spec does not allow.
    ServerBug(&'static str),
}

impl<S: ApiStatus> Rejection<S> {
    /// The error the guest receives.
    pub fn code(&self) -> S {
        match self {
            Rejection::Malformed(_) => S::INVALID_VALUE,
            Rejection::NotRemote(_) => S::NOT_SUPPORTED,
            Rejection::Invalid(c, _) | Rejection::Failed(c) => *c,
            Rejection::ServerBug(_) => S::INTERNAL_ERROR,
        }
    }

    /// True when the guest sent something the spec does not allow (worth a log line).
    pub fn is_guest_fault(&self) -> bool {
        matches!(self, Rejection::Malformed(_) | Rejection::NotRemote(_) | Rejection::Invalid(..))
    }
}

impl<S: ApiStatus> fmt::Display for Rejection<S> {
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

impl<S: ApiStatus> std::error::Error for Rejection<S> {}

impl<S: ApiStatus> From<EvalError> for Rejection<S> {
    fn from(_: EvalError) -> Self {
        Rejection::Invalid(S::INVALID_VALUE, "size or offset out of range")
    }
}

/// A runtime status as the driver API says it. The two APIs share their numbers for what they
/// both have (`cudaErrorInvalidDevice` is `CUDA_ERROR_INVALID_DEVICE`, 101); a runtime error
/// the driver has no code for (`cudaErrorInvalidDevicePointer`) is an invalid value to it.
/// Used wherever a driver function runs a runtime one: the server's driver methods and the
/// guest's driver functions composed over the runtime's.
pub fn driver_status(e: CudaError) -> crate::cuda::CuError {
    use crate::cuda::{CuError, ERRORS};
    if ERRORS.iter().any(|d| d.code == i64::from(e.0)) { CuError(e.0) } else { CuError::INVALID_VALUE }
}
