//! NVML (`spec/nvml.lapis`): the generated exports, the hand-written queries ([`hand`]) and
//! [`rt`]. The server answers two internal calls per device (its description and its current
//! state, fixed-size replies); every query is guest code over them that checks the program's
//! buffers as NVML does. A device handle is a virtual handle the server hands out.

pub mod hand;
pub mod rt;

/// The spec-generated exports (`nvmlInit_v2`, `nvmlDeviceGetMemoryInfo`, ...) and the trait of
/// hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/nvml_guest.rs"));
}
