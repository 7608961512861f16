//! How cuBLASLt's exports go through the guest core: a call's status is its return value, as
//! for cuBLAS; the runtime's last error is left alone.

use phos_protocol::apis::Function;
use phos_protocol::cublaslt::{self, CublasLtStatus, FunctionId};

use super::hand::SetKind;
use crate::runtime;
pub use crate::runtime::{byte_len, c_str, call, check_out, copy_out, in_bytes};
use phos_protocol::RemoteCall;

/// Run one cuBLASLt function; a panic becomes `CUBLAS_STATUS_INTERNAL_ERROR`. A refusal
/// (`CUBLAS_STATUS_NOT_SUPPORTED`, from the server or the guest) is logged once by name.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CublasLtStatus>) -> i32 {
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => cublaslt::SUCCESS,
        Err(e) => {
            if e == cublaslt::NOT_SUPPORTED {
                runtime::log_refusal_once(Function::Cublaslt(id), cublaslt::NOT_SUPPORTED.name());
            }
            e.0
        }
    }
}

/// A function Phos does not support: logged once, answers `CUBLAS_STATUS_NOT_SUPPORTED`.
pub fn unsupported(id: FunctionId) -> i32 {
    runtime::log_unsupported_once(Function::Cublaslt(id), cublaslt::NOT_SUPPORTED.name());
    cublaslt::NOT_SUPPORTED.0
}

/// A request that names cuBLASLt descriptors the server looks up: it goes without waiting only
/// where the guest knows each of them (live, of the right kind).
pub trait Descriptors {
    fn descriptors_known(&self) -> bool;
    /// The call's first argument is a descriptor, which the guest knows live itself (made by
    /// a call the server accepted and not destroyed): no earlier call on it need prove it.
    const ON_DESCRIPTOR: bool = false;
}

impl Descriptors for cublaslt::CublasLtMatmulRequest<'_> {
    fn descriptors_known(&self) -> bool {
        super::hand::matmul_descriptors_known(self.computeDesc, [self.Adesc, self.Bdesc, self.Cdesc, self.Ddesc])
    }
}

impl Descriptors for cublaslt::CublasLtMatmulDescSetAttributeRequest<'_> {
    fn descriptors_known(&self) -> bool {
        super::hand::setting_known(SetKind::Matmul, self.matmulDesc, self.attr, self.sizeInBytes)
    }
    const ON_DESCRIPTOR: bool = true;
}

impl Descriptors for cublaslt::CublasLtMatrixLayoutSetAttributeRequest<'_> {
    fn descriptors_known(&self) -> bool {
        super::hand::setting_known(SetKind::Layout, self.matLayout, self.attr, self.sizeInBytes)
    }
    const ON_DESCRIPTOR: bool = true;
}

impl Descriptors for cublaslt::CublasLtMatmulPreferenceSetAttributeRequest<'_> {
    fn descriptors_known(&self) -> bool {
        super::hand::setting_known(SetKind::Preference, self.pref, self.attr, self.sizeInBytes)
    }
    const ON_DESCRIPTOR: bool = true;
}

impl Descriptors for cublaslt::CublasLtMatmulDescDestroyRequest {
    fn descriptors_known(&self) -> bool {
        super::hand::destroy_known(SetKind::Matmul, self.matmulDesc)
    }
    const ON_DESCRIPTOR: bool = true;
}

impl Descriptors for cublaslt::CublasLtMatrixLayoutDestroyRequest {
    fn descriptors_known(&self) -> bool {
        super::hand::destroy_known(SetKind::Layout, self.matLayout)
    }
    const ON_DESCRIPTOR: bool = true;
}

impl Descriptors for cublaslt::CublasLtMatmulPreferenceDestroyRequest {
    fn descriptors_known(&self) -> bool {
        super::hand::destroy_known(SetKind::Preference, self.pref)
    }
    const ON_DESCRIPTOR: bool = true;
}

/// A call with an async id (`runtime::call_deferred`: without waiting once `handle` is live),
/// sent synchronously where a descriptor it names is not known here, so that the server's
/// refusal of an unknown one is the call's own status. A setting of a known descriptor goes
/// without waiting at once: the guest's own table proves the descriptor.
pub fn call_deferred<R: RemoteCall + Descriptors>(req: &R, handle: u64) -> Result<(), R::Status> {
    if !req.descriptors_known() {
        return runtime::call(req).map(|_| ());
    }
    if R::ON_DESCRIPTOR { runtime::call_async(req) } else { runtime::call_deferred(req, handle) }
}
