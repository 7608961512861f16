//! cuSOLVER's dense API (`spec/cusolver.lapis`): the generated exports and [`rt`]. Nothing is
//! written by hand beyond that: a handle is a virtual handle of the session, its stream a
//! runtime stream, its matrices and workspaces the runtime's device memory.

pub mod hand;
pub mod rt;

/// The spec-generated exports (`cusolverDnCreate`, `cusolverDnSgetrf`, ...) and the trait of
/// hand-written pieces they call (none).
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cusolver_guest.rs"));
}
