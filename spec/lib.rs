//! The API specs Phos is generated from. Build scripts read them through these paths so that
//! cargo rebuilds whatever depends on a spec when it changes.

/// Path of the CUDA runtime API spec.
pub const CUDART_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cudart.lapis");

/// Text of the CUDA runtime API spec.
pub const CUDART_SPEC: &str = include_str!("cudart.lapis");
