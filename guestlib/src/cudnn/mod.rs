//! cuDNN 9 (`spec/cudnn.lapis`): the generated exports, the hand-written half ([`hand`]:
//! versions, error strings) and [`rt`]. A handle and a backend descriptor are virtual handles
//! of the session, a handle's stream a runtime stream, the variant pack's pointers the
//! runtime's device memory; the server translates what an attribute's elements name.

pub mod hand;
mod known;
mod packs;
mod pool;
pub mod rt;
mod tensors;

/// The spec-generated exports (`cudnnCreate`, `cudnnBackendSetAttribute`, ...) and the trait
/// of hand-written pieces they call.
#[allow(clippy::all, unused_parens, unused_assignments)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cudnn_guest.rs"));
}
