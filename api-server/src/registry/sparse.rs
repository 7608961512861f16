//! The session's cuSPARSE objects: handles (kind `cusparse_handle`), the generic API's
//! descriptors (sparse matrices `cusparse_sp_mat`, dense vectors `cusparse_dn_vec`, dense
//! matrices `cusparse_dn_mat`), SpGEMM descriptors (`cusparse_spgemm`) and SpSV descriptors
//! (`cusparse_spsv`). What each stands for
//! is its settings: a descriptor's sizes, types and the device addresses of its arrays (the
//! session's memory, at the same addresses after a restore), so a restore makes it again by
//! replaying its creation and the last call of each setter. On a GPU each also holds the
//! vendor's object (`raw`), made again by the replay.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Backend;

/// Objects of each kind a session may hold at once.
pub const MAX_SPARSE_OBJECTS: u64 = 65536;

/// A cuSPARSE handle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SparseHandle {
    /// The device current when it was made.
    pub device: i32,
    /// The stream its work goes on (a stream handle; 0 is the legacy default stream).
    pub stream: u64,
    /// `cusparsePointerMode_t`: where its scalars live.
    pub pointer_mode: i32,
    /// NVIDIA's `cusparseHandle_t`, 0 where the server computes the calls itself.
    pub raw: u64,
}

/// `cusparseFormat_t` values of the formats Phos carries.
pub const FORMAT_CSR: i32 = 1;
pub const FORMAT_CSC: i32 = 2;
pub const FORMAT_COO: i32 = 3;

/// A sparse matrix descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpMat {
    pub format: i32,
    pub rows: i64,
    pub cols: i64,
    pub nnz: i64,
    /// CSR's row offsets, CSC's column offsets, COO's row indices.
    pub first: u64,
    /// CSR's column indices, CSC's row indices, COO's column indices.
    pub second: u64,
    pub values: u64,
    /// `cusparseIndexType_t` of `first` and of `second` (COO's one type for both).
    pub first_type: i32,
    pub second_type: i32,
    pub base: i32,
    /// `cudaDataType` of the values.
    pub value_type: i32,
    /// Its attributes (`cusparseFillMode_t`, `cusparseDiagType_t`; 0, 0 until set): the
    /// triangle SpSV reads and whether it takes the diagonal as ones.
    pub fill_mode: i32,
    pub diag_type: i32,
    /// NVIDIA's `cusparseSpMatDescr_t`, 0 on the CPU.
    pub raw: u64,
}

impl SpMat {
    /// Elements of the `first` array: offsets (one per row or column, plus one) or indices.
    pub fn first_len(&self) -> i64 {
        match self.format {
            FORMAT_CSR => self.rows.saturating_add(1),
            FORMAT_CSC => self.cols.saturating_add(1),
            _ => self.nnz,
        }
    }
}

/// A dense vector descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DnVec {
    pub size: i64,
    pub values: u64,
    pub value_type: i32,
    pub raw: u64,
}

/// `cusparseOrder_t`: column-major.
pub const ORDER_COL: i32 = 1;

/// A dense matrix descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DnMat {
    pub rows: i64,
    pub cols: i64,
    pub ld: i64,
    pub values: u64,
    pub value_type: i32,
    pub order: i32,
    pub raw: u64,
}

impl DnMat {
    /// Elements from the first to the last one the matrix covers.
    pub fn span(&self) -> i64 {
        if self.rows == 0 || self.cols == 0 {
            return 0;
        }
        let (major, minor) = if self.order == ORDER_COL { (self.cols, self.rows) } else { (self.rows, self.cols) };
        self.ld.saturating_mul(major - 1).saturating_add(minor)
    }
}

/// The product a CPU SpGEMM computed, kept on its descriptor from `compute` to `copy`: C in
/// CSR, 0-based, in f64.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Product {
    pub offsets: Vec<i64>,
    pub columns: Vec<i64>,
    pub values: Vec<f64>,
}

/// An SpGEMM descriptor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpGemm {
    /// NVIDIA's `cusparseSpGEMMDescr_t`, 0 on the CPU.
    pub raw: u64,
    /// The CPU's product, once computed.
    pub product: Option<Product>,
}

/// An SpSV descriptor: the vendor's (which holds an analysis), 0 on the CPU (which needs
/// none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpSv {
    pub raw: u64,
}

pub struct SparseRegistry {
    pub handles: Mutex<HandleTable<SparseHandle>>,
    pub sp_mats: Mutex<HandleTable<SpMat>>,
    pub dn_vecs: Mutex<HandleTable<DnVec>>,
    pub dn_mats: Mutex<HandleTable<DnMat>>,
    pub spgemms: Mutex<HandleTable<SpGemm>>,
    pub spsvs: Mutex<HandleTable<SpSv>>,
}

impl Default for SparseRegistry {
    fn default() -> Self {
        SparseRegistry {
            handles: Mutex::new(HandleTable::new(HandleKind::CusparseHandle, MAX_SPARSE_OBJECTS)),
            sp_mats: Mutex::new(HandleTable::new(HandleKind::CusparseSpMat, MAX_SPARSE_OBJECTS)),
            dn_vecs: Mutex::new(HandleTable::new(HandleKind::CusparseDnVec, MAX_SPARSE_OBJECTS)),
            dn_mats: Mutex::new(HandleTable::new(HandleKind::CusparseDnMat, MAX_SPARSE_OBJECTS)),
            spgemms: Mutex::new(HandleTable::new(HandleKind::CusparseSpgemm, MAX_SPARSE_OBJECTS)),
            spsvs: Mutex::new(HandleTable::new(HandleKind::CusparseSpsv, MAX_SPARSE_OBJECTS)),
        }
    }
}

/// The kinds whose counters a checkpoint keeps, in the order of [`SparseRegistry::next_counters`].
pub const SPARSE_KINDS: [&str; 6] =
    ["cusparse_handle", "cusparse_sp_mat", "cusparse_dn_vec", "cusparse_dn_mat", "cusparse_spgemm", "cusparse_spsv"];

impl SparseRegistry {
    pub fn add_handle(&self, h: SparseHandle, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.handles.lock().add(h, new)
    }

    pub fn handle(&self, handle: u64) -> Result<SparseHandle, CudaError> {
        self.handles.lock().get(handle).copied()
    }

    pub fn sp_mat(&self, handle: u64) -> Result<SpMat, CudaError> {
        self.sp_mats.lock().get(handle).copied()
    }

    pub fn dn_vec(&self, handle: u64) -> Result<DnVec, CudaError> {
        self.dn_vecs.lock().get(handle).copied()
    }

    pub fn dn_mat(&self, handle: u64) -> Result<DnMat, CudaError> {
        self.dn_mats.lock().get(handle).copied()
    }

    /// Next value of each kind's counter ([`SPARSE_KINDS`]).
    pub fn next_counters(&self) -> [u64; 6] {
        [
            self.handles.lock().next_counter(),
            self.sp_mats.lock().next_counter(),
            self.dn_vecs.lock().next_counter(),
            self.dn_mats.lock().next_counter(),
            self.spgemms.lock().next_counter(),
            self.spsvs.lock().next_counter(),
        ]
    }

    /// Set the counter of kind `kind` (one of [`SPARSE_KINDS`]).
    pub fn set_next_counter(&self, kind: &str, next: u64) {
        match kind {
            "cusparse_handle" => self.handles.lock().set_next_counter(next),
            "cusparse_sp_mat" => self.sp_mats.lock().set_next_counter(next),
            "cusparse_dn_vec" => self.dn_vecs.lock().set_next_counter(next),
            "cusparse_dn_mat" => self.dn_mats.lock().set_next_counter(next),
            "cusparse_spgemm" => self.spgemms.lock().set_next_counter(next),
            "cusparse_spsv" => self.spsvs.lock().set_next_counter(next),
            _ => {}
        }
    }

    /// Destroy every object (a device reset, the session's end): descriptors before handles.
    pub fn release_all(&self, backend: &dyn Backend) {
        let sp_mats = self.sp_mats.lock().drain();
        let dn_vecs = self.dn_vecs.lock().drain();
        let dn_mats = self.dn_mats.lock().drain();
        let spgemms = self.spgemms.lock().drain();
        let spsvs = self.spsvs.lock().drain();
        let handles = self.handles.lock().drain();
        let Some(vendor) = backend.cusparse() else { return };
        for (_, m) in sp_mats.into_iter().filter(|(_, m)| m.raw != 0) {
            vendor.destroy_sp_mat(m.raw);
        }
        for (_, v) in dn_vecs.into_iter().filter(|(_, v)| v.raw != 0) {
            vendor.destroy_dn_vec(v.raw);
        }
        for (_, m) in dn_mats.into_iter().filter(|(_, m)| m.raw != 0) {
            vendor.destroy_dn_mat(m.raw);
        }
        for (_, g) in spgemms.into_iter().filter(|(_, g)| g.raw != 0) {
            vendor.destroy_spgemm(g.raw);
        }
        for (_, d) in spsvs.into_iter().filter(|(_, d)| d.raw != 0) {
            vendor.destroy_spsv(d.raw);
        }
        for (_, h) in handles.into_iter().filter(|(_, h)| h.raw != 0) {
            vendor.destroy(h.raw);
        }
    }
}
