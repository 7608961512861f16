//! Facts of cuDNN's legacy tensor descriptors that the guest (which checks a setter before
//! sending it without waiting, and answers the getters from what was set) and the server
//! (which checks every setter again) share: the data types, the shape rules, the strides a
//! format gives and the parameters' shape of a batch normalization. One copy, so the guest's
//! answer is the server's.

use crate::cudnn::CudnnStatus;

/// cuDNN's most dimensions (CUDNN_DIM_MAX).
pub const DIM_MAX: usize = 8;
/// The most elements a tensor may span, padding included (cuDNN's 2 Giga-elements).
pub const MAX_ELEMENTS: u64 = 1 << 31;

// cudnnDataType_t.
pub const DATA_FLOAT: i32 = 0;
pub const DATA_DOUBLE: i32 = 1;
pub const DATA_HALF: i32 = 2;
pub const DATA_BFLOAT16: i32 = 9;

// cudnnTensorFormat_t.
pub const FORMAT_NCHW: i32 = 0;
pub const FORMAT_NHWC: i32 = 1;
pub const FORMAT_NCHW_VECT_C: i32 = 2;

// cudnnBatchNormMode_t.
pub const BN_PER_ACTIVATION: i32 = 0;
pub const BN_SPATIAL_PERSISTENT: i32 = 2;

/// A tensor descriptor's shape, as checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorShape {
    /// `cudnnDataType_t`.
    pub data_type: i32,
    pub dims: Vec<i32>,
    pub strides: Vec<i32>,
}

/// Bytes of one element of a plain (not vectorised) data type; `Err` says whether cuDNN
/// knows the type (NOT_SUPPORTED here) or not (BAD_PARAM).
pub fn element_bytes(data_type: i32) -> Result<u64, CudnnStatus> {
    match data_type {
        DATA_FLOAT | 4 => Ok(4),
        DATA_DOUBLE | 10 => Ok(8),
        DATA_HALF | DATA_BFLOAT16 => Ok(2),
        3 | 6 | 12 | 13 => Ok(1),
        // Vectorised int8, boolean, fast-float and the narrow floats: not carried.
        5 | 7 | 8 | 11 | 14..=16 => Err(CudnnStatus::NOT_SUPPORTED),
        _ => Err(CudnnStatus::BAD_PARAM),
    }
}

/// A data type cuDNN knows and Phos carries, or the status and why.
pub fn checked_type(data_type: i32) -> Result<(), (CudnnStatus, String)> {
    element_bytes(data_type).map(|_| ()).map_err(|s| (s, format!("data type {data_type}")))
}

/// A checked shape, or the status and why.
pub fn checked_shape(data_type: i32, dims: &[i32], strides: &[i32]) -> Result<TensorShape, (CudnnStatus, String)> {
    checked_type(data_type)?;
    if dims.is_empty() || dims.len() != strides.len() {
        return Err((CudnnStatus::BAD_PARAM, format!("{} dimensions", dims.len())));
    }
    if dims.len() < 3 || dims.len() > DIM_MAX {
        return Err((CudnnStatus::NOT_SUPPORTED, format!("{} dimensions (cuDNN takes 3 to {DIM_MAX})", dims.len())));
    }
    if let Some(d) = dims.iter().find(|&&d| d < 1) {
        return Err((CudnnStatus::BAD_PARAM, format!("dimension {d}")));
    }
    if let Some(s) = strides.iter().find(|&&s| s < 1) {
        return Err((CudnnStatus::BAD_PARAM, format!("stride {s}")));
    }
    let shape = TensorShape { data_type, dims: dims.to_vec(), strides: strides.to_vec() };
    let (spanned, elements) = (span(&shape), elements(&shape));
    if spanned > MAX_ELEMENTS || elements > MAX_ELEMENTS {
        return Err((CudnnStatus::NOT_SUPPORTED, format!("{elements} elements over {spanned} (more than 2^31)")));
    }
    Ok(shape)
}

/// A shape given by a format (`cudnnSetTensor4dDescriptor`, `cudnnSetTensorNdDescriptorEx`).
pub fn checked_format_shape(format: i32, data_type: i32, dims: &[i32]) -> Result<TensorShape, (CudnnStatus, String)> {
    let strides = format_strides(format, dims).map_err(|s| (s, format!("tensor format {format}")))?;
    checked_shape(data_type, dims, &strides)
}

/// Elements from the first to the last, gaps included (saturating: the shape check refuses
/// more than 2^31).
pub fn span(shape: &TensorShape) -> u64 {
    let sum: u128 =
        shape.dims.iter().zip(&shape.strides).map(|(&d, &s)| (d.max(1) as u128 - 1) * s.max(0) as u128).sum();
    u64::try_from(1 + sum).unwrap_or(u64::MAX)
}

/// Elements the dimensions hold (saturating, as `span`).
pub fn elements(shape: &TensorShape) -> u64 {
    let product = shape.dims.iter().try_fold(1u128, |acc, &d| acc.checked_mul(d.max(0) as u128));
    product.and_then(|p| u64::try_from(p).ok()).unwrap_or(u64::MAX)
}

/// Bytes a tensor of this shape spans (`cudnnGetTensorSizeInBytes`).
pub fn span_bytes(shape: &TensorShape) -> u64 {
    span(shape) * element_bytes(shape.data_type).unwrap_or(0)
}

/// Packed strides of `dims` in `format`: NCHW is row-major; NHWC puts the channels innermost,
/// then the spatial dimensions from the last, then the batch. Strides past an int are
/// NOT_SUPPORTED (the shape's own check refuses bad dimensions after).
pub fn format_strides(format: i32, dims: &[i32]) -> Result<Vec<i32>, CudnnStatus> {
    let n = dims.len();
    let mut order: Vec<usize> = (0..n).rev().collect();
    match format {
        FORMAT_NCHW => {}
        FORMAT_NHWC if n >= 3 => {
            // Innermost first: C, the spatial dimensions from the last, N.
            order = std::iter::once(1).chain((2..n).rev()).chain(std::iter::once(0)).collect();
        }
        FORMAT_NHWC => return Err(CudnnStatus::BAD_PARAM),
        FORMAT_NCHW_VECT_C => return Err(CudnnStatus::NOT_SUPPORTED),
        _ => return Err(CudnnStatus::BAD_PARAM),
    }
    let mut strides = vec![0i32; n];
    let mut next: i32 = 1;
    for i in order {
        strides[i] = next;
        next = next.checked_mul(dims[i].max(1)).ok_or(CudnnStatus::NOT_SUPPORTED)?;
    }
    Ok(strides)
}

/// The packed shape cuDNN gives the parameters of data of `shape` in batch normalization
/// `mode` (`cudnnDeriveBNTensorDescriptor`): 1xCx1x1 (spatial) or 1xCxHxW (per activation),
/// float for float, half and bfloat16 data, double for double; BAD_PARAM and why otherwise.
pub fn bn_param_shape(shape: &TensorShape, mode: i32) -> Result<TensorShape, (CudnnStatus, String)> {
    if !(BN_PER_ACTIVATION..=BN_SPATIAL_PERSISTENT).contains(&mode) {
        return Err((CudnnStatus::BAD_PARAM, format!("batch normalization mode {mode}")));
    }
    if !(4..=5).contains(&shape.dims.len()) {
        return Err((
            CudnnStatus::BAD_PARAM,
            format!("{} dimensions (batch normalization takes 4 or 5)", shape.dims.len()),
        ));
    }
    let data_type = match shape.data_type {
        DATA_FLOAT | DATA_HALF | DATA_BFLOAT16 => DATA_FLOAT,
        DATA_DOUBLE => DATA_DOUBLE,
        t => return Err((CudnnStatus::BAD_PARAM, format!("data type {t} for batch normalization"))),
    };
    let dims: Vec<i32> = shape
        .dims
        .iter()
        .enumerate()
        .map(|(i, &d)| match i {
            0 => 1,
            1 => d,
            _ if mode == BN_PER_ACTIVATION => d,
            _ => 1,
        })
        .collect();
    let strides = format_strides(FORMAT_NCHW, &dims).map_err(|s| (s, "parameter strides".to_string()))?;
    Ok(TensorShape { data_type, dims, strides })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nhwc_strides_put_channels_innermost() {
        assert_eq!(format_strides(FORMAT_NHWC, &[2, 3, 4, 5]).unwrap(), vec![60, 1, 15, 3]);
        assert_eq!(format_strides(FORMAT_NCHW, &[2, 3, 4, 5]).unwrap(), vec![60, 20, 5, 1]);
        assert_eq!(format_strides(FORMAT_NCHW_VECT_C, &[2, 3, 4, 5]), Err(CudnnStatus::NOT_SUPPORTED));
        assert_eq!(format_strides(7, &[2, 3, 4, 5]), Err(CudnnStatus::BAD_PARAM));
    }

    #[test]
    fn shapes_are_checked_as_cudnn_checks_them() {
        assert!(checked_shape(DATA_FLOAT, &[1, 2, 3, 4], &[24, 12, 4, 1]).is_ok());
        assert_eq!(checked_shape(DATA_FLOAT, &[1, 0, 3, 4], &[24, 12, 4, 1]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_shape(DATA_FLOAT, &[1, 2, 3, 4], &[24, -1, 4, 1]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_shape(99, &[1, 2, 3, 4], &[24, 12, 4, 1]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_shape(DATA_FLOAT, &[4, 4], &[4, 1]).unwrap_err().0, CudnnStatus::NOT_SUPPORTED);
        let huge = checked_shape(DATA_FLOAT, &[65536, 65536, 1, 1], &[65536, 1, 1, 1]);
        assert_eq!(huge.unwrap_err().0, CudnnStatus::NOT_SUPPORTED);
        // Hostile extremes are refused, never overflowed.
        let max = [i32::MAX; 8];
        assert_eq!(checked_shape(DATA_FLOAT, &max, &max).unwrap_err().0, CudnnStatus::NOT_SUPPORTED);
        let overlapping = checked_shape(DATA_FLOAT, &[1 << 20, 1 << 20, 1, 1], &[1, 1, 1, 1]);
        assert_eq!(overlapping.unwrap_err().0, CudnnStatus::NOT_SUPPORTED);
        assert_eq!(format_strides(FORMAT_NCHW, &max), Err(CudnnStatus::NOT_SUPPORTED));
        assert_eq!(format_strides(FORMAT_NHWC, &[i32::MIN, -1, 0, 5]).unwrap()[3], 1);
    }

    #[test]
    fn batch_norm_parameters_are_one_per_channel() {
        let x = checked_format_shape(FORMAT_NCHW, DATA_HALF, &[8, 16, 4, 4]).unwrap();
        let p = bn_param_shape(&x, 1).unwrap();
        assert_eq!((p.data_type, p.dims, p.strides), (DATA_FLOAT, vec![1, 16, 1, 1], vec![16, 1, 1, 1]));
        assert_eq!(bn_param_shape(&x, 0).unwrap().dims, vec![1, 16, 4, 4]);
        assert_eq!(bn_param_shape(&x, 3).unwrap_err().0, CudnnStatus::BAD_PARAM);
    }
}

/// `CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR` (cudnnBackendDescriptorType_t).
pub const VARIANT_PACK_DESCRIPTOR: i32 = 16;

// A variant pack's attributes (cudnnBackendAttributeName_t).
pub const PACK_UNIQUE_IDS: i32 = 1000;
pub const PACK_DATA_POINTERS: i32 = 1001;
pub const PACK_INTERMEDIATES: i32 = 1002;
pub const PACK_WORKSPACE: i32 = 1003;

// Their element types (cudnnBackendAttributeType_t).
use crate::cudnn::consts::{CUDNN_TYPE_INT64 as TYPE_INT64, CUDNN_TYPE_VOID_PTR as TYPE_VOID_PTR};

/// A variant pack attribute the rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackAttribute {
    UniqueIds,
    DataPointers,
    Workspace,
}

/// cuDNN's documented rule for setting a variant pack's attribute (cuDNN 9,
/// `CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR`): `CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS` takes one or
/// more `CUDNN_TYPE_INT64`, `..._DATA_POINTERS` one or more `CUDNN_TYPE_VOID_PTR`, `..._WORKSPACE`
/// one `CUDNN_TYPE_VOID_PTR` (NULL where the plan needs none). `Ok(Some(_))`: a setting cuDNN
/// accepts on a pack not finalized (its values, device pointers, are the server's to check);
/// `Err(status)`: one it refuses (a wrong type is `CUDNN_STATUS_NOT_SUPPORTED`, as cuDNN 9.14
/// answers it, a wrong count `CUDNN_STATUS_BAD_PARAM`); `Ok(None)`: an attribute the rule leaves to cuDNN
/// (`..._INTERMEDIATES`, "currently unsupported", and names it does not document for a pack).
pub fn variant_pack_attribute(name: i32, ty: i32, count: i64) -> Result<Option<PackAttribute>, CudnnStatus> {
    let (attribute, want_ty, one) = match name {
        PACK_UNIQUE_IDS => (PackAttribute::UniqueIds, TYPE_INT64, false),
        PACK_DATA_POINTERS => (PackAttribute::DataPointers, TYPE_VOID_PTR, false),
        PACK_WORKSPACE => (PackAttribute::Workspace, TYPE_VOID_PTR, true),
        _ => return Ok(None),
    };
    if ty != want_ty {
        // What cuDNN 9.14 answers on the H100 and H200 (tests/cuda/cudnn_variant_packs.cu).
        return Err(CudnnStatus::NOT_SUPPORTED);
    }
    let count_ok = if one { count == 1 } else { count >= 1 };
    if !count_ok {
        return Err(CudnnStatus::BAD_PARAM);
    }
    Ok(Some(attribute))
}

/// What a variant pack holds of the attributes [`variant_pack_attribute`] covers: the counts
/// set (0 for one not set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackContents {
    pub unique_ids: i64,
    pub data_pointers: i64,
    pub workspace: bool,
}

impl PackContents {
    /// A setting [`variant_pack_attribute`] accepted.
    pub fn set(&mut self, attribute: PackAttribute, count: i64) {
        match attribute {
            PackAttribute::UniqueIds => self.unique_ids = count,
            PackAttribute::DataPointers => self.data_pointers = count,
            PackAttribute::Workspace => self.workspace = true,
        }
    }

    /// A setting of `name` whose outcome the rule does not know: what it held is no longer
    /// known to be set.
    pub fn unset(&mut self, name: i32) {
        match name {
            PACK_UNIQUE_IDS => self.unique_ids = 0,
            PACK_DATA_POINTERS => self.data_pointers = 0,
            PACK_WORKSPACE => self.workspace = false,
            _ => {}
        }
    }

    /// Whether a finalization succeeds, as cuDNN documents it for a variant pack (it lists no
    /// failure): its required attributes are set, a unique id for each data pointer.
    pub fn finalizes(&self) -> bool {
        self.unique_ids >= 1 && self.unique_ids == self.data_pointers && self.workspace
    }
}

#[cfg(test)]
mod pack_tests {
    use super::*;

    #[test]
    fn the_variant_pack_rule_is_cudnns() {
        assert_eq!(variant_pack_attribute(PACK_UNIQUE_IDS, TYPE_INT64, 3), Ok(Some(PackAttribute::UniqueIds)));
        assert_eq!(variant_pack_attribute(PACK_DATA_POINTERS, TYPE_VOID_PTR, 3), Ok(Some(PackAttribute::DataPointers)));
        assert_eq!(variant_pack_attribute(PACK_WORKSPACE, TYPE_VOID_PTR, 1), Ok(Some(PackAttribute::Workspace)));
        assert_eq!(variant_pack_attribute(PACK_UNIQUE_IDS, TYPE_VOID_PTR, 3), Err(CudnnStatus::NOT_SUPPORTED));
        assert_eq!(variant_pack_attribute(PACK_WORKSPACE, TYPE_VOID_PTR, 2), Err(CudnnStatus::BAD_PARAM));
        assert_eq!(variant_pack_attribute(PACK_DATA_POINTERS, TYPE_VOID_PTR, 0), Err(CudnnStatus::BAD_PARAM));
        assert_eq!(variant_pack_attribute(PACK_INTERMEDIATES, TYPE_VOID_PTR, 1), Ok(None));
        assert_eq!(variant_pack_attribute(900, TYPE_INT64, 1), Ok(None));
        let mut c = PackContents::default();
        assert!(!c.finalizes());
        c.set(PackAttribute::UniqueIds, 3);
        c.set(PackAttribute::DataPointers, 3);
        assert!(!c.finalizes(), "no workspace");
        c.set(PackAttribute::Workspace, 1);
        assert!(c.finalizes());
        c.set(PackAttribute::DataPointers, 2);
        assert!(!c.finalizes(), "an id without a pointer");
        c.set(PackAttribute::DataPointers, 3);
        c.unset(PACK_UNIQUE_IDS);
        assert!(!c.finalizes());
    }
}
