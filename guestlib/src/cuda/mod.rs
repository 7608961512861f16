//! The CUDA driver API (`spec/cuda.lapis`): the generated exports, the hand-written half
//! ([`hand`], over [`context`], [`entry_points`], [`memory`], [`modules`] and [`vmm`]; the driver
//! functions that are runtime functions under another name run the runtime's code through
//! [`bridge`]) and [`rt`]. It shares everything else with the runtime API through the guest
//! core: the session, its channels, and its handles (a `CUstream` is a `cudaStream_t`, a
//! `CUdeviceptr` the runtime's device pointer, a `CUmodule` a module the server loaded).

mod arrays;
mod bridge;
pub mod context;
pub mod entry_points;
mod graphs;
pub mod hand;
mod link;
mod memops;
mod memory;
pub(crate) mod modules;
mod queries;
pub mod rt;
mod tensor_map;
mod vmm;

/// The spec-generated exports (`cuInit`, `cuDeviceGet`, ...) and the trait of hand-written
/// pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cuda_guest.rs"));
}
