//! Facts of cuBLAS's types that the guest (sizes it sends) and the server (which checks them)
//! share: the bytes of a `cudaDataType` element and of GemmEx's scalars.

/// Bytes of one element of a `cudaDataType` Phos carries; `None` for any other type.
pub fn data_type_bytes(data_type: i32) -> Option<u64> {
    Some(match data_type {
        3 => 1,               // CUDA_R_8I
        2 | 14 => 2,          // CUDA_R_16F, CUDA_R_16BF
        0 | 10 | 6 | 15 => 4, // CUDA_R_32F, CUDA_R_32I, CUDA_C_16F, CUDA_C_16BF
        1 | 4 => 8,           // CUDA_R_64F, CUDA_C_32F
        5 => 16,              // CUDA_C_64F
        _ => return None,
    })
}

/// Whether a `cudaDataType` is complex (CUDA_C_32F, CUDA_C_64F, CUDA_C_16F, CUDA_C_16BF).
pub fn is_complex(data_type: i32) -> bool {
    matches!(data_type, 4 | 5 | 6 | 15)
}

/// Bytes of GemmEx's alpha and beta for a compute type (a `cublasComputeType_t`, or the
/// `cudaDataType` CUDA 10's GemmEx took in its place) and the type of C; `None` for a compute
/// type Phos does not carry.
pub fn compute_scalar_bytes(compute_type: i32, c_type: i32) -> Option<u64> {
    let real = match compute_type {
        // CUBLAS_COMPUTE_16F(_PEDANTIC); CUDA_R_16F.
        64 | 65 | 2 => 2,
        // CUBLAS_COMPUTE_32F and its variants, CUBLAS_COMPUTE_32I(_PEDANTIC); CUDA_R_32F, CUDA_R_32I.
        68 | 69 | 74 | 75 | 77 | 72 | 73 | 0 | 10 => 4,
        // CUBLAS_COMPUTE_64F(_PEDANTIC); CUDA_R_64F.
        70 | 71 | 1 => 8,
        // CUDA_C_32F, CUDA_C_64F: complex already.
        4 => return Some(8),
        5 => return Some(16),
        _ => return None,
    };
    Some(if is_complex(c_type) { 2 * real } else { real })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(data_type_bytes(2), Some(2));
        assert_eq!(data_type_bytes(5), Some(16));
        assert_eq!(data_type_bytes(99), None);
        // fp16 data with fp32 compute: float scalars; complex C doubles them.
        assert_eq!(compute_scalar_bytes(68, 2), Some(4));
        assert_eq!(compute_scalar_bytes(68, 4), Some(8));
        assert_eq!(compute_scalar_bytes(64, 2), Some(2));
        assert_eq!(compute_scalar_bytes(1, 1), Some(8));
        assert_eq!(compute_scalar_bytes(99, 0), None);
    }
}
