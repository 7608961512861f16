//! The CUDA runtime API (`spec/cudart.lapis`): the generated exports, the hand-written half
//! ([`hand`]: per-thread error and device state, page-locked memory, fat binary registration,
//! kernel launches, and the composition of much of the API over a few remote calls), and
//! [`rt`], which records each call's error as the thread's last error, as the runtime does.

pub(crate) mod arrays;
mod attributes;
mod batch;
mod capture;
mod copies;
mod device;
mod execution;
mod graph_extra;
pub(crate) mod graphs;
pub mod hand;
mod ipc;
pub mod launch;
pub(crate) mod library;
pub(crate) mod managed;
pub(crate) mod memory;
mod memsets;
mod pools;
pub(crate) mod proofs;
pub mod rt;
mod user_objects;

/// The spec-generated exports (`cudaMalloc`, `cudaMemcpy`, ...) and the trait of
/// hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cudart_guest.rs"));
}
