//! The CUDA driver API (`spec/cuda.lapis`): the generated exports, the hand-written half
//! ([`hand`]: error names and texts, whether the driver is initialised) and [`rt`]. It shares
//! everything else with the runtime API through the guest core: the session, its channels,
//! and its handles (a `CUstream` is a `cudaStream_t`).

pub mod hand;
pub mod rt;

/// The spec-generated exports (`cuInit`, `cuDeviceGet`, ...) and the trait of hand-written
/// pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cuda_guest.rs"));
}
