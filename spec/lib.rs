//! The API specs Phos is generated from. Build scripts read them through these paths so that
//! cargo rebuilds whatever depends on a spec when it changes. Each spec has a lock file next
//! to it (`cudart.lock`): its wire facts as deployed guests and images know them.

/// Path of the CUDA runtime API spec.
pub const CUDART_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cudart.lapis");

/// Path of the CUDA driver API spec.
pub const CUDA_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda.lapis");

/// Path of the cuBLAS spec.
pub const CUBLAS_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cublas.lapis");

/// Path of the cuRAND (host API) spec.
pub const CURAND_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/curand.lapis");

/// Path of the cuSOLVER (dense API) spec.
pub const CUSOLVER_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cusolver.lapis");

/// Path of the cuSPARSE spec.
pub const CUSPARSE_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cusparse.lapis");

/// Path of the cuDNN 9 spec.
pub const CUDNN_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cudnn.lapis");

/// Path of the cuBLASLt spec.
pub const CUBLASLT_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cublaslt.lapis");

/// Path of the cuFFT spec.
pub const CUFFT_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cufft.lapis");

/// Path of the NVML spec.
pub const NVML_SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/nvml.lapis");

/// Every API Phos carries, by path. Adding an API starts here (docs/architecture.md).
pub const SPEC_PATHS: &[&str] = &[
    CUDART_SPEC_PATH,
    CUDA_SPEC_PATH,
    CUBLAS_SPEC_PATH,
    CURAND_SPEC_PATH,
    CUSOLVER_SPEC_PATH,
    CUSPARSE_SPEC_PATH,
    CUDNN_SPEC_PATH,
    CUBLASLT_SPEC_PATH,
    CUFFT_SPEC_PATH,
    NVML_SPEC_PATH,
];

/// A spec built into a program (for `phosctl spec`).
pub struct Spec {
    pub path: &'static str,
    pub text: &'static str,
}

/// Every API Phos carries, with its text.
pub const SPECS: &[Spec] = &[
    Spec { path: CUDART_SPEC_PATH, text: include_str!("cudart.lapis") },
    Spec { path: CUDA_SPEC_PATH, text: include_str!("cuda.lapis") },
    Spec { path: CUBLAS_SPEC_PATH, text: include_str!("cublas.lapis") },
    Spec { path: CURAND_SPEC_PATH, text: include_str!("curand.lapis") },
    Spec { path: CUSOLVER_SPEC_PATH, text: include_str!("cusolver.lapis") },
    Spec { path: CUSPARSE_SPEC_PATH, text: include_str!("cusparse.lapis") },
    Spec { path: CUDNN_SPEC_PATH, text: include_str!("cudnn.lapis") },
    Spec { path: CUBLASLT_SPEC_PATH, text: include_str!("cublaslt.lapis") },
    Spec { path: CUFFT_SPEC_PATH, text: include_str!("cufft.lapis") },
    Spec { path: NVML_SPEC_PATH, text: include_str!("nvml.lapis") },
];
