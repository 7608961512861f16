//! The guest `libcudart`: what an unmodified CUDA application links instead of NVIDIA's
//! runtime. One build is installed as `libcudart.so.11.0`, `libcudart.so.12` and
//! `libcudart.so.13`.
//!
//! Every export comes from `spec/cudart.lapis` through the generated [`stubs`]; functions the
//! spec marks remote are marshalled to the API server over the process's [`runtime`]
//! channels, and the rest are the hand-written pieces in [`hand`]: per-thread error and
//! device state, page-locked host memory ([`hostmem`]), the fat binary [`registry`] and kernel
//! [`launch`]es. Struct layouts that differ between CUDA versions are in [`abi`]; which one
//! applies comes from the soname the application loaded ([`soname`]).

pub mod abi;
mod callbacks;
mod copier;
mod device;
mod execution;
mod graphs;
pub mod hand;
pub mod hostmem;
pub mod launch;
pub mod log;
mod memory;
mod pools;
pub mod registry;
pub mod runtime;
pub mod soname;

/// The spec-generated exports (`cudaMalloc`, `cudaMemcpy`, ...) and the trait of
/// hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cudart_guest.rs"));
}
