//! cuRAND's host API (`spec/curand.lapis`): the generated exports, the hand-written half
//! ([`hand`]: which generators are host generators, versions) and [`rt`]. A generator is a
//! virtual handle of the session, its stream a runtime stream, its output the runtime's device
//! memory (or, for a host generator, the program's memory, filled from the reply).

pub mod hand;
pub mod rt;

/// The spec-generated exports (`curandCreateGenerator`, `curandGenerateUniform`, ...) and the
/// trait of hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/curand_guest.rs"));
}
