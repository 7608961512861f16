//! cuSPARSE (`spec/cusparse.lapis`): the generated exports, the hand-written half ([`hand`]:
//! the pointer mode each handle has, versions and texts, the legacy matrix descriptor, which
//! only the guest reads) and [`rt`]. Everything else is the guest core's: a handle or a
//! descriptor is a virtual handle of the session, its stream a runtime stream, its arrays the
//! runtime's device memory.

pub mod hand;
pub mod rt;

/// The spec-generated exports (`cusparseCreate`, `cusparseSpMV`, ...) and the trait of
/// hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cusparse_guest.rs"));
}
