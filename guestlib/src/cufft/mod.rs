//! cuFFT (`spec/cufft.lapis`): the generated exports, the hand-written half ([`hand`]:
//! versions) and [`rt`]. A plan is a virtual handle of the session carried in cuFFT's `int`
//! (its number; `phos_protocol::handle_tag`), its stream a runtime stream, its data the
//! runtime's device memory.

pub mod hand;
pub mod rt;

/// The spec-generated exports (`cufftPlan1d`, `cufftExecC2C`, ...) and the trait of
/// hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cufft_guest.rs"));
}
