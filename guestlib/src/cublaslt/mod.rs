//! cuBLASLt (`spec/cublaslt.lapis`): the generated exports, the hand-written half ([`hand`]:
//! versions, texts, the logger, and what the guest keeps of each descriptor to size a matmul's
//! scalars and count its flops) and [`rt`]. Handles and descriptors are virtual handles of the
//! session, matrices and workspaces the runtime's device memory.

pub mod hand;
pub mod rt;

/// The spec-generated exports (`cublasLtCreate`, `cublasLtMatmul`, ...) and the trait of
/// hand-written pieces they call.
#[allow(clippy::all, unused_parens)]
pub mod stubs {
    include!(concat!(env!("OUT_DIR"), "/cublaslt_guest.rs"));
}
