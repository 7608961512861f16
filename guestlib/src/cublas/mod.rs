//! cuBLAS (`spec/cublas.lapis`): the generated exports, the hand-written half ([`hand`]: the
//! pointer mode each handle has, versions and texts, vector and matrix transfers over the
//! runtime's 2D copies) and [`rt`]. Everything else is the guest core's: a cuBLAS handle is a
//! virtual handle of the session, its stream a runtime stream, its matrices the runtime's
//! device memory.

pub mod hand;
pub mod rt;

/// The spec-generated exports (`cublasCreate_v2`, `cublasSgemm_v2`, ...) and the trait of
/// hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cublas_guest.rs"));
}
