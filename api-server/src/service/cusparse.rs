//! cuSPARSE's remote functions (`spec/cusparse.lapis`) on the session: handles and descriptors
//! live in [`crate::registry::sparse`], a handle's stream is a runtime stream, a descriptor's
//! arrays the session's device memory. The spec checks what a call names directly; what a
//! descriptor names is checked here, when a setter changes it and again by every compute call
//! (an allocation may have been freed since), for the extent its sizes and types give. The
//! calls run with the backend's libcusparse where it has one (the generated calls of
//! `crate::vendor::cusparse`, after checking each external buffer against libcusparse's own size
//! query), and otherwise on [`crate::cpu_sparse`], reading and writing through the backend's
//! copies on the handle's stream (emu).

use phos_protocol::apis::Function;
use phos_protocol::blas;
use phos_protocol::cusparse::*;
use phos_protocol::spec::{CallAccess, DeviceAccess, RecordFacts};
use phos_protocol::{CudaError, Ptr};

use super::device_io::{self, device_address};
use super::{CallCx, Session};
use crate::backend::StreamRef;
use crate::backend::vendor_cusparse::{ATTRIBUTE_DIAG_TYPE, ATTRIBUTE_FILL_MODE, Cusparse, SpGemmStep};
use crate::cpu_sparse::{self, Entry, Layout};
use crate::dispatch::cusparse::CusparseService;
use crate::registry::handles::NewHandle;
use crate::registry::sparse::{
    DnMat, DnVec, FORMAT_COO, FORMAT_CSC, FORMAT_CSR, MAX_SPARSE_OBJECTS, ORDER_COL, Product, SpGemm, SpMat, SpSv,
    SparseHandle,
};
use crate::vendor::cusparse::{Translate, VendorCall};

const CUDA_R_32F: i32 = 0;
const CUDA_R_64F: i32 = 1;
const INDEX_64I: i32 = 3;
const OP_NON_TRANSPOSE: i32 = 0;
const FILL_MODE_LOWER: i32 = 0;
const DIAG_TYPE_UNIT: i32 = 1;
/// What the CPU answers SpGEMM's buffer queries with: it needs none, but a program passes a
/// buffer only when told a size, and the step runs only when given one.
const CPU_SPGEMM_BUFFER: u64 = 8;

/// A runtime failure as cuSPARSE reports it: an unknown object or a bad address or size
/// `INVALID_VALUE`, a table at its limit `ALLOC_FAILED`, a failed device access
/// `EXECUTION_FAILED`.
fn sparse_status(e: CudaError) -> CusparseStatus {
    match e {
        CudaError::InvalidResourceHandle | CudaError::InvalidValue => CusparseStatus::INVALID_VALUE,
        CudaError::MemoryAllocation => CusparseStatus::ALLOC_FAILED,
        CudaError::NotSupported => CusparseStatus::NOT_SUPPORTED,
        _ => CusparseStatus::EXECUTION_FAILED,
    }
}

fn vendor_status(code: i32) -> Result<(), CusparseStatus> {
    if code == SUCCESS { Ok(()) } else { Err(CusparseStatus(code)) }
}

/// Bytes of one index of a `cusparseIndexType_t`.
fn index_bytes(t: i32) -> u64 {
    match t {
        1 => 2,
        INDEX_64I => 8,
        _ => 4,
    }
}

/// Bytes of one value of a `cudaDataType` (0 for a type no descriptor can have: the spec
/// refuses it at creation).
fn value_bytes(t: i32) -> u64 {
    blas::data_type_bytes(t).unwrap_or(0)
}

/// An extent of `count` elements of `bytes` each, or `None` when it cannot be one.
fn extent(count: i64, bytes: u64) -> Option<u64> {
    u64::try_from(count).ok()?.checked_mul(bytes)
}

fn size(v: i64) -> Result<usize, CusparseStatus> {
    usize::try_from(v).map_err(|_| CusparseStatus::INVALID_VALUE)
}

/// The vendor's objects behind the session's handles, for a generated call.
struct VendorObjects<'s>(&'s Session);

impl Translate for VendorObjects<'_> {
    fn object(&self, kind: &'static str, handle: u64) -> Result<*mut std::ffi::c_void, CusparseStatus> {
        let sparse = &self.0.objects.sparse;
        let raw = match kind {
            "cusparse_handle" => sparse.handle(handle).map(|h| h.raw),
            "cusparse_sp_mat" => sparse.sp_mat(handle).map(|m| m.raw),
            "cusparse_dn_vec" => sparse.dn_vec(handle).map(|v| v.raw),
            "cusparse_dn_mat" => sparse.dn_mat(handle).map(|m| m.raw),
            "cusparse_spgemm" => sparse.spgemms.lock().get(handle).map(|g| g.raw),
            "cusparse_spsv" => sparse.spsvs.lock().get(handle).map(|d| d.raw),
            _ => return Err(CusparseStatus::INTERNAL_ERROR),
        };
        Ok(raw.map_err(sparse_status)? as *mut std::ffi::c_void)
    }
}

/// What one CPU call works with: the session, the name of the call (for what it logs) and the
/// stream its handle's work is ordered on.
struct Call<'s> {
    session: &'s Session,
    name: &'static str,
    stream: StreamRef,
}

impl Call<'_> {
    fn read(&self, addr: u64, bytes: u64) -> Result<Vec<u8>, CusparseStatus> {
        let bytes = usize::try_from(bytes).map_err(|_| CusparseStatus::ALLOC_FAILED)?;
        device_io::read(self.session, self.stream, addr, bytes).map_err(sparse_status)
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), CusparseStatus> {
        device_io::write(self.session, self.stream, addr, bytes).map_err(sparse_status)
    }

    /// `n` values of `value_type` at `addr`, as f64.
    fn load_values(&self, addr: u64, n: i64, value_type: i32) -> Result<Vec<f64>, CusparseStatus> {
        let raw = self.read(addr, extent(n, value_bytes(value_type)).ok_or(CusparseStatus::INVALID_VALUE)?)?;
        Ok(match value_type {
            CUDA_R_64F => raw.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())).collect(),
            _ => raw.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap_or_default()))).collect(),
        })
    }

    fn store_values(&self, addr: u64, values: &[f64], value_type: i32) -> Result<(), CusparseStatus> {
        let bytes: Vec<u8> = match value_type {
            CUDA_R_64F => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
        };
        self.write(addr, &bytes)
    }

    fn load_indices(&self, addr: u64, n: i64, index_type: i32) -> Result<Vec<i64>, CusparseStatus> {
        let raw = self.read(addr, extent(n, index_bytes(index_type)).ok_or(CusparseStatus::INVALID_VALUE)?)?;
        Ok(match index_type {
            INDEX_64I => raw.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default())).collect(),
            _ => raw.chunks_exact(4).map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap_or_default()))).collect(),
        })
    }

    fn store_indices(&self, addr: u64, values: &[i64], index_type: i32) -> Result<(), CusparseStatus> {
        let bytes: Vec<u8> = match index_type {
            INDEX_64I => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        };
        self.write(addr, &bytes)
    }

    /// A structure error of the program's arrays: `INVALID_VALUE`, logged.
    fn refuse(&self, what: &str, e: impl std::fmt::Display) -> CusparseStatus {
        crate::guest_warn!(self.session.id, "{}: {what}: {e}: CUSPARSE_STATUS_INVALID_VALUE", self.name);
        CusparseStatus::INVALID_VALUE
    }

    /// A sparse matrix's entries, its structure checked.
    fn entries(&self, m: &SpMat) -> Result<Vec<Entry>, CusparseStatus> {
        let values = self.load_values(m.values, m.nnz, m.value_type)?;
        let second = self.load_indices(m.second, m.nnz, m.second_type)?;
        let first = self.load_indices(m.first, m.first_len(), m.first_type)?;
        let (rows, cols, base) = (size(m.rows)?, size(m.cols)?, i64::from(m.base));
        match m.format {
            FORMAT_CSR => cpu_sparse::compressed_entries(rows, cols, &first, &second, &values, base, true),
            FORMAT_CSC => cpu_sparse::compressed_entries(cols, rows, &first, &second, &values, base, false),
            _ => cpu_sparse::coo_entries(rows, cols, &first, &second, &values, base),
        }
        .map_err(|e| self.refuse("the sparse matrix's arrays", e))
    }

    /// A scalar argument, as f64.
    fn scalar(&self, p: &Ptr<'_>, compute_type: i32) -> Result<f64, CusparseStatus> {
        let raw = match p {
            Ptr::In(b) => b.to_vec(),
            Ptr::Device(addr) => self.read(*addr, value_bytes(compute_type))?,
            _ => return Err(CusparseStatus::INVALID_VALUE),
        };
        Ok(match (compute_type, raw.len()) {
            (CUDA_R_64F, 8) => f64::from_le_bytes(raw.try_into().unwrap_or_default()),
            (CUDA_R_32F, 4) => f64::from(f32::from_le_bytes(raw.try_into().unwrap_or_default())),
            _ => return Err(CusparseStatus::INVALID_VALUE),
        })
    }
}

impl Session {
    fn vendor_cusparse(&self) -> Option<&Cusparse> {
        self.backend.cusparse()
    }

    /// The name of the call being served, for what it logs.
    fn sparse_name(cx: &CallCx) -> &'static str {
        cx.function.map_or("cuSPARSE", |f| f.name())
    }

    /// A handle of the session's; an unknown one is `NOT_INITIALIZED`, logged.
    fn sparse_handle(&self, cx: &CallCx, handle: u64) -> Result<SparseHandle, CusparseStatus> {
        self.objects.sparse.handle(handle).map_err(|_| {
            crate::guest_warn!(
                self.id,
                "{}: {handle:#x} is not a cuSPARSE handle of the session: CUSPARSE_STATUS_NOT_INITIALIZED",
                Self::sparse_name(cx)
            );
            CusparseStatus::NOT_INITIALIZED
        })
    }

    /// An unknown descriptor: `INVALID_VALUE`, logged.
    fn unknown_descr(&self, cx: &CallCx, what: &str, handle: u64) -> CusparseStatus {
        crate::guest_warn!(
            self.id,
            "{}: {handle:#x} is not a {what} descriptor of the session: CUSPARSE_STATUS_INVALID_VALUE",
            Self::sparse_name(cx)
        );
        CusparseStatus::INVALID_VALUE
    }

    fn sp_mat_of(&self, cx: &CallCx, handle: u64) -> Result<SpMat, CusparseStatus> {
        self.objects.sparse.sp_mat(handle).map_err(|_| self.unknown_descr(cx, "sparse matrix", handle))
    }

    fn dn_vec_of(&self, cx: &CallCx, handle: u64) -> Result<DnVec, CusparseStatus> {
        self.objects.sparse.dn_vec(handle).map_err(|_| self.unknown_descr(cx, "dense vector", handle))
    }

    fn dn_mat_of(&self, cx: &CallCx, handle: u64) -> Result<DnMat, CusparseStatus> {
        self.objects.sparse.dn_mat(handle).map_err(|_| self.unknown_descr(cx, "dense matrix", handle))
    }

    /// `bytes` at `addr` must be the session's memory (a null address passes unless
    /// `required`): `INVALID_VALUE`, logged, otherwise.
    fn check_sparse_array(
        &self,
        cx: &CallCx,
        what: &str,
        addr: u64,
        bytes: Option<u64>,
        required: bool,
    ) -> Result<(), CusparseStatus> {
        let ok = match (addr, bytes) {
            (0, _) => !required,
            (_, Some(bytes)) => self.objects.memory.contains(addr, bytes),
            (_, None) => false,
        };
        if !ok {
            crate::guest_warn!(
                self.id,
                "{}: the {what} at {addr:#x} is not {} bytes of the session's memory: CUSPARSE_STATUS_INVALID_VALUE",
                Self::sparse_name(cx),
                bytes.map_or("addressable".to_string(), |b| b.to_string())
            );
            return Err(CusparseStatus::INVALID_VALUE);
        }
        Ok(())
    }

    /// A sparse matrix's arrays, each for the extent its sizes give; `compute` requires every
    /// array a computation reads (all of them once the matrix has entries, and CSR/CSC offsets).
    fn check_sp_mat(&self, cx: &CallCx, m: &SpMat, compute: bool) -> Result<(), CusparseStatus> {
        let has_entries = compute && m.nnz > 0;
        let offsets_needed = compute && m.format != FORMAT_COO;
        self.check_sparse_array(
            cx,
            "first index array",
            m.first,
            extent(m.first_len(), index_bytes(m.first_type)),
            has_entries || offsets_needed,
        )?;
        self.check_sparse_array(
            cx,
            "second index array",
            m.second,
            extent(m.nnz, index_bytes(m.second_type)),
            has_entries,
        )?;
        self.check_sparse_array(cx, "values", m.values, extent(m.nnz, value_bytes(m.value_type)), has_entries)
    }

    fn check_dn_vec(&self, cx: &CallCx, v: &DnVec) -> Result<(), CusparseStatus> {
        self.check_sparse_array(cx, "dense vector", v.values, extent(v.size, value_bytes(v.value_type)), v.size > 0)
    }

    fn check_dn_mat(&self, cx: &CallCx, m: &DnMat) -> Result<(), CusparseStatus> {
        self.check_sparse_array(cx, "dense matrix", m.values, extent(m.span(), value_bytes(m.value_type)), m.span() > 0)
    }

    /// Show the C/R engine's hook what a compute call writes that the spec does not name (a
    /// descriptor's arrays, an external buffer).
    fn note_sparse_writes(&self, cx: &CallCx, writes: &[(u64, Option<u64>)]) -> Result<(), CusparseStatus> {
        if !self.hooks.active() {
            return Ok(());
        }
        let device: Vec<DeviceAccess> = writes
            .iter()
            .filter_map(|&(addr, len)| Some(DeviceAccess { addr, len: len?, writes: true }))
            .filter(|a| a.addr != 0 && a.len > 0)
            .collect();
        let access = CallAccess { function: Self::sparse_name(cx), device: &device, objects: &[] };
        self.hooks.before_call(&access).map_err(sparse_status)
    }

    fn sp_mat_writes(m: &SpMat) -> [(u64, Option<u64>); 3] {
        [
            (m.first, extent(m.first_len(), index_bytes(m.first_type))),
            (m.second, extent(m.nnz, index_bytes(m.second_type))),
            (m.values, extent(m.nnz, value_bytes(m.value_type))),
        ]
    }

    /// Where a compute call starts its work on the handle's stream: taken into the stream's
    /// capture instead, or refused there (`library_work`); `why` names what keeps a call
    /// from being captured.
    fn sparse_work(&self, cx: &CallCx, h: &SparseHandle, why: Option<&str>) -> Result<(), CusparseStatus> {
        self.library_work(cx, h.stream, why, "CUSPARSE_STATUS_NOT_SUPPORTED").map_err(|_| CusparseStatus::NOT_SUPPORTED)
    }

    /// The scalars' shape must be the handle's pointer mode and the compute type's size (the
    /// guest computed both; the server trusts neither).
    fn check_scalars(
        &self,
        cx: &CallCx,
        h: &SparseHandle,
        mode: i32,
        scalar_bytes: i32,
        compute_type: i32,
    ) -> Result<(), CusparseStatus> {
        if mode != h.pointer_mode || u64::try_from(scalar_bytes).ok() != blas::data_type_bytes(compute_type) {
            crate::guest_warn!(
                self.id,
                "{}: scalars sent as pointer mode {mode} and {scalar_bytes} bytes, where the handle's mode is {} \
                 and compute type {compute_type}'s size {:?}: CUSPARSE_STATUS_INVALID_VALUE",
                Self::sparse_name(cx),
                h.pointer_mode,
                blas::data_type_bytes(compute_type)
            );
            return Err(CusparseStatus::INVALID_VALUE);
        }
        Ok(())
    }

    /// A CPU call on a handle.
    fn sparse_cpu_call(&self, cx: &CallCx, h: &SparseHandle) -> Result<Call<'_>, CusparseStatus> {
        let stream = self.objects.streams.resolve(h.stream).map_err(sparse_status)?;
        Ok(Call { session: self, name: Self::sparse_name(cx), stream })
    }

    /// The CPU computes real single and double precision: other types are refused, logged.
    fn sparse_cpu_types(&self, cx: &CallCx, types: &[i32]) -> Result<(), CusparseStatus> {
        if types.iter().all(|t| *t == CUDA_R_32F || *t == CUDA_R_64F) {
            return Ok(());
        }
        crate::guest_warn!(
            self.id,
            "{}: value types {types:?}: the server's CPU computes CUDA_R_32F and CUDA_R_64F only: \
             CUSPARSE_STATUS_NOT_SUPPORTED",
            Self::sparse_name(cx)
        );
        Err(CusparseStatus::NOT_SUPPORTED)
    }

    /// Operand sizes that do not fit together: `INVALID_VALUE`, logged.
    fn sparse_mismatch(&self, cx: &CallCx, what: String) -> CusparseStatus {
        crate::guest_warn!(self.id, "{}: {what}: CUSPARSE_STATUS_INVALID_VALUE", Self::sparse_name(cx));
        CusparseStatus::INVALID_VALUE
    }

    /// Run a checked request with libcusparse.
    fn sparse_on_vendor<R: VendorCall>(
        &self,
        h: &SparseHandle,
        vendor: &Cusparse,
        req: &R,
    ) -> Result<R::Reply, CusparseStatus> {
        self.backend.bind(h.device).map_err(sparse_status)?;
        // SAFETY: the dispatch checked every range the request names, the service every array
        // its descriptors name and its external buffer against libcusparse's own query, and
        // the objects are the live vendor objects of the session's handles.
        unsafe { req.call_vendor(&vendor.library, &VendorObjects(self)) }
    }

    /// The external buffer of a call must hold what libcusparse's query (`needed`) asks for.
    fn check_sparse_buffer(&self, cx: &CallCx, buffer: u64, needed: u64) -> Result<(), CusparseStatus> {
        if needed == 0 {
            return Ok(());
        }
        self.check_sparse_array(cx, "external buffer", buffer, Some(needed), true)?;
        self.note_sparse_writes(cx, &[(buffer, Some(needed))])
    }

    fn new_sparse_object(
        &self,
        cx: &CallCx,
        add: impl FnOnce(&NewHandle<'_>) -> Result<u64, CudaError>,
    ) -> Result<u64, CusparseStatus> {
        let name = Self::sparse_name(cx);
        let full = || {
            crate::guest_warn!(self.id, "{name}: the session holds {MAX_SPARSE_OBJECTS} objects of this kind already");
            CudaError::MemoryAllocation
        };
        add(&NewHandle { forced: cx.forced(), full: &full }).map_err(sparse_status)
    }

    /// Keep a sparse matrix's size as a record of `phosCusparseSpMatSetSize` on it (replacing
    /// the one before), so that a restore makes it that size again.
    fn record_size(&self, cx: &CallCx, handle: u64, m: &SpMat) {
        let payload = phos_protocol::encode(&PhosCusparseSpMatSetSizeRequest {
            spMatDescr: handle,
            rows: m.rows,
            cols: m.cols,
            nnz: m.nnz,
        });
        let mutated = [("cusparse_sp_mat", handle)];
        let facts = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
        self.records.record(Function::Cusparse(FunctionId::PhosCusparseSpMatSetSize), cx.device, &payload, &facts);
    }

    /// Change a sparse matrix's size (SpGEMM's product, a dense-to-sparse analysis, a
    /// restore): the registry's, and on a GPU the vendor's descriptor made again with it.
    fn resize_sp_mat(&self, cx: &CallCx, handle: u64, rows: i64, cols: i64, nnz: i64) -> Result<SpMat, CusparseStatus> {
        let mut m = self.sp_mat_of(cx, handle)?;
        (m.rows, m.cols, m.nnz) = (rows, cols, nnz);
        if let Some(vendor) = self.vendor_cusparse() {
            let (vr, vc, vn) = vendor.sp_mat_size(m.raw).map_err(CusparseStatus)?;
            if (vr, vc, vn) != (rows, cols, nnz) {
                let raw = vendor.create_sp_mat(&m).map_err(CusparseStatus)?;
                vendor.destroy_sp_mat(m.raw);
                m.raw = raw;
            }
        }
        *self.objects.sparse.sp_mats.lock().get_mut(handle).map_err(sparse_status)? = m;
        Ok(m)
    }

    /// After a vendor call that sized a matrix: take libcusparse's size and record it.
    fn take_vendor_size(&self, cx: &CallCx, vendor: &Cusparse, handle: u64) -> Result<(), CusparseStatus> {
        let m = self.sp_mat_of(cx, handle)?;
        let (rows, cols, nnz) = vendor.sp_mat_size(m.raw).map_err(CusparseStatus)?;
        let m = self.resize_sp_mat(cx, handle, rows, cols, nnz)?;
        self.record_size(cx, handle, &m);
        Ok(())
    }

    fn create_sp_mat(&self, cx: &CallCx, m: SpMat) -> Result<u64, CusparseStatus> {
        let mut m = m;
        if let Some(vendor) = self.vendor_cusparse() {
            m.raw = vendor.create_sp_mat(&m).map_err(CusparseStatus)?;
        }
        self.new_sparse_object(cx, |new| self.objects.sparse.sp_mats.lock().add(m, new)).inspect_err(|_| {
            if let Some(vendor) = self.vendor_cusparse().filter(|_| m.raw != 0) {
                vendor.destroy_sp_mat(m.raw);
            }
        })
    }

    /// A setter's new sparse matrix: checked, set on the vendor's descriptor, kept.
    fn set_sp_mat(&self, cx: &CallCx, handle: u64, change: impl FnOnce(&mut SpMat)) -> Result<(), CusparseStatus> {
        let mut m = self.sp_mat_of(cx, handle)?;
        change(&mut m);
        self.check_sp_mat(cx, &m, false)?;
        if let Some(vendor) = self.vendor_cusparse() {
            vendor_status(vendor.set_pointers(&m))?;
        }
        *self.objects.sparse.sp_mats.lock().get_mut(handle).map_err(sparse_status)? = m;
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // The compute calls' CPU halves.
    // ---------------------------------------------------------------------------------------

    /// SpMV's vectors must fit op(A) (cuSPARSE's own check, made on the CPU).
    fn spmv_fits(&self, cx: &CallCx, op: i32, a: &SpMat, x: &DnVec, y: &DnVec) -> Result<(), CusparseStatus> {
        let (out_len, in_len) = if op != OP_NON_TRANSPOSE { (a.cols, a.rows) } else { (a.rows, a.cols) };
        if x.size != in_len || y.size != out_len {
            return Err(self.sparse_mismatch(
                cx,
                format!("op(A) is {out_len} x {in_len}, x has {} elements, y {}", x.size, y.size),
            ));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn cpu_spmv(
        &self,
        cx: &CallCx,
        h: &SparseHandle,
        op: i32,
        alpha: &Ptr<'_>,
        a: &SpMat,
        x: &DnVec,
        beta: &Ptr<'_>,
        y: &DnVec,
        compute_type: i32,
    ) -> Result<(), CusparseStatus> {
        self.sparse_cpu_types(cx, &[a.value_type, x.value_type, y.value_type, compute_type])?;
        self.spmv_fits(cx, op, a, x, y)?;
        let transpose = op != OP_NON_TRANSPOSE;
        let call = self.sparse_cpu_call(cx, h)?;
        let (alpha, beta) = (call.scalar(alpha, compute_type)?, call.scalar(beta, compute_type)?);
        let entries = call.entries(a)?;
        let xs = call.load_values(x.values, x.size, x.value_type)?;
        let mut ys = call.load_values(y.values, y.size, y.value_type)?;
        cpu_sparse::spmv(&entries, transpose, alpha, &xs, beta, &mut ys);
        call.store_values(y.values, &ys, y.value_type)
    }

    #[allow(clippy::too_many_arguments)]
    fn cpu_spmm(
        &self,
        cx: &CallCx,
        h: &SparseHandle,
        op_a: i32,
        op_b: i32,
        alpha: &Ptr<'_>,
        a: &SpMat,
        b: &DnMat,
        beta: &Ptr<'_>,
        c: &DnMat,
        compute_type: i32,
    ) -> Result<(), CusparseStatus> {
        self.sparse_cpu_types(cx, &[a.value_type, b.value_type, c.value_type, compute_type])?;
        let (a_t, b_t) = (op_a != OP_NON_TRANSPOSE, op_b != OP_NON_TRANSPOSE);
        let (m, k) = if a_t { (a.cols, a.rows) } else { (a.rows, a.cols) };
        let (bk, n) = if b_t { (b.cols, b.rows) } else { (b.rows, b.cols) };
        if bk != k || c.rows != m || c.cols != n {
            return Err(
                self.sparse_mismatch(cx, format!("op(A) is {m} x {k}, op(B) {bk} x {n}, C {} x {}", c.rows, c.cols))
            );
        }
        let call = self.sparse_cpu_call(cx, h)?;
        let (alpha, beta) = (call.scalar(alpha, compute_type)?, call.scalar(beta, compute_type)?);
        let entries = call.entries(a)?;
        let bs = call.load_values(b.values, b.span(), b.value_type)?;
        let mut cs = call.load_values(c.values, c.span(), c.value_type)?;
        let layout = |d: &DnMat| Ok::<_, CusparseStatus>(Layout { ld: size(d.ld)?, col_major: d.order == ORDER_COL });
        cpu_sparse::spmm(&entries, a_t, alpha, &bs, layout(b)?, b_t, beta, &mut cs, layout(c)?, size(m)?, size(n)?);
        call.store_values(c.values, &cs, c.value_type)
    }

    /// SpSV's operands must fit: A square, x and y of its size.
    fn spsv_fits(&self, cx: &CallCx, a: &SpMat, x: &DnVec, y: &DnVec) -> Result<(), CusparseStatus> {
        if a.rows != a.cols || x.size != a.rows || y.size != a.rows {
            return Err(self.sparse_mismatch(
                cx,
                format!("A is {} x {} (SpSV needs it square), x has {} elements, y {}", a.rows, a.cols, x.size, y.size),
            ));
        }
        Ok(())
    }

    /// The SpSV descriptor of a call.
    fn spsv_of(&self, cx: &CallCx, handle: u64) -> Result<SpSv, CusparseStatus> {
        self.objects.sparse.spsvs.lock().get(handle).copied().map_err(|_| self.unknown_descr(cx, "SpSV", handle))
    }

    /// The operands of an SpSV step, looked up and checked (their arrays against the session's
    /// memory, y noted as written when `writes`).
    #[allow(clippy::too_many_arguments)]
    fn spsv_operands(
        &self,
        cx: &CallCx,
        h: &SparseHandle,
        (mode, scalar_bytes, compute_type): (i32, i32, i32),
        mat: u64,
        vec_x: u64,
        vec_y: u64,
        descr: u64,
        writes: bool,
    ) -> Result<(SpMat, DnVec, DnVec), CusparseStatus> {
        self.check_scalars(cx, h, mode, scalar_bytes, compute_type)?;
        self.spsv_of(cx, descr)?;
        let (a, x, y) = (self.sp_mat_of(cx, mat)?, self.dn_vec_of(cx, vec_x)?, self.dn_vec_of(cx, vec_y)?);
        self.spsv_fits(cx, &a, &x, &y)?;
        self.check_sp_mat(cx, &a, true)?;
        self.check_dn_vec(cx, &x)?;
        self.check_dn_vec(cx, &y)?;
        if writes {
            self.note_sparse_writes(cx, &[(y.values, extent(y.size, value_bytes(y.value_type)))])?;
        }
        Ok((a, x, y))
    }

    /// SpSV on the CPU: y = op(A)^-1 alpha x.
    #[allow(clippy::too_many_arguments)]
    fn cpu_spsv(
        &self,
        cx: &CallCx,
        h: &SparseHandle,
        op: i32,
        alpha: &Ptr<'_>,
        a: &SpMat,
        x: &DnVec,
        y: &DnVec,
        compute_type: i32,
    ) -> Result<(), CusparseStatus> {
        self.sparse_cpu_types(cx, &[a.value_type, x.value_type, y.value_type, compute_type])?;
        let call = self.sparse_cpu_call(cx, h)?;
        let alpha = call.scalar(alpha, compute_type)?;
        let entries = call.entries(a)?;
        let xs = call.load_values(x.values, x.size, x.value_type)?;
        let t = cpu_sparse::Triangular {
            lower: a.fill_mode == FILL_MODE_LOWER,
            unit: a.diag_type == DIAG_TYPE_UNIT,
            transpose: op != OP_NON_TRANSPOSE,
        };
        let ys = cpu_sparse::spsv(&entries, size(a.rows)?, t, alpha, &xs);
        call.store_values(y.values, &ys, y.value_type)
    }

    /// Write entries (sorted by their major line) into a sparse matrix's arrays.
    fn cpu_store_sparse(&self, call: &Call<'_>, m: &SpMat, entries: &[Entry]) -> Result<(), CusparseStatus> {
        let base = i64::from(m.base);
        let values: Vec<f64> = entries.iter().map(|e| e.2).collect();
        let (first, second): (Vec<i64>, Vec<i64>) = match m.format {
            FORMAT_CSR => (
                cpu_sparse::offsets_of(entries, size(m.rows)?, true, base),
                entries.iter().map(|e| e.1 as i64 + base).collect(),
            ),
            FORMAT_CSC => (
                cpu_sparse::offsets_of(entries, size(m.cols)?, false, base),
                entries.iter().map(|e| e.0 as i64 + base).collect(),
            ),
            _ => (
                entries.iter().map(|e| e.0 as i64 + base).collect(),
                entries.iter().map(|e| e.1 as i64 + base).collect(),
            ),
        };
        call.store_indices(m.first, &first, m.first_type)?;
        call.store_indices(m.second, &second, m.second_type)?;
        call.store_values(m.values, &values, m.value_type)
    }
}

/// The CPU's product of an SpGEMM as its descriptor keeps it.
fn product_of(c: cpu_sparse::Csr) -> Product {
    Product { offsets: c.offsets, columns: c.columns, values: c.values }
}

impl CusparseService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CusparseStatus> {
        crate::dispatch::cudart::CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(sparse_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &RecordFacts<'_>) {
        self.records.record(Function::Cusparse(id), cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CusparseStatus> {
        self.hooks.before_call(access).map_err(sparse_status)
    }

    super::library_capture::capture_hooks!(Cusparse);

    // Handles.

    fn cusparse_create(&self, cx: &CallCx, _: CusparseCreateRequest) -> Result<CusparseCreateReply, CusparseStatus> {
        self.check_device(cx.device).map_err(|_| CusparseStatus::NOT_INITIALIZED)?;
        let raw = match self.vendor_cusparse() {
            Some(vendor) => {
                self.backend.bind(cx.device).map_err(sparse_status)?;
                vendor.create().map_err(CusparseStatus)?
            }
            None => 0,
        };
        let h = SparseHandle { device: cx.device, raw, ..SparseHandle::default() };
        let handle = self.new_sparse_object(cx, |new| self.objects.sparse.add_handle(h, new)).inspect_err(|_| {
            if let Some(vendor) = self.vendor_cusparse().filter(|_| raw != 0) {
                vendor.destroy(raw);
            }
        })?;
        Ok(CusparseCreateReply { handle })
    }

    fn cusparse_destroy(
        &self,
        _: &CallCx,
        req: CusparseDestroyRequest,
    ) -> Result<CusparseDestroyReply, CusparseStatus> {
        let h = self.objects.sparse.handles.lock().remove(req.handle).map_err(|_| {
            crate::guest_warn!(self.id, "cusparseDestroy: {:#x} is not a cuSPARSE handle of the session", req.handle);
            CusparseStatus::NOT_INITIALIZED
        })?;
        if let Some(vendor) = self.vendor_cusparse().filter(|_| h.raw != 0) {
            vendor_status(vendor.destroy(h.raw))?;
        }
        Ok(CusparseDestroyReply {})
    }

    fn cusparse_set_stream(
        &self,
        cx: &CallCx,
        req: CusparseSetStreamRequest,
    ) -> Result<CusparseSetStreamReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let stream = self.objects.streams.resolve(req.streamId).map_err(|_| {
            crate::guest_warn!(self.id, "cusparseSetStream: {:#x} is not a stream of the session", req.streamId);
            CusparseStatus::INVALID_VALUE
        })?;
        if let Some(vendor) = self.vendor_cusparse() {
            vendor_status(vendor.set_stream(h.raw, stream.cu_stream()))?;
        }
        self.objects.sparse.handles.lock().get_mut(req.handle).map_err(sparse_status)?.stream = req.streamId;
        Ok(CusparseSetStreamReply {})
    }

    fn cusparse_get_stream(
        &self,
        cx: &CallCx,
        req: CusparseGetStreamRequest,
    ) -> Result<CusparseGetStreamReply, CusparseStatus> {
        Ok(CusparseGetStreamReply { streamId: self.sparse_handle(cx, req.handle)?.stream })
    }

    fn cusparse_set_pointer_mode(
        &self,
        cx: &CallCx,
        req: CusparseSetPointerModeRequest,
    ) -> Result<CusparseSetPointerModeReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        if let Some(vendor) = self.vendor_cusparse() {
            vendor_status(vendor.set_pointer_mode(h.raw, req.mode))?;
        }
        self.objects.sparse.handles.lock().get_mut(req.handle).map_err(sparse_status)?.pointer_mode = req.mode;
        Ok(CusparseSetPointerModeReply {})
    }

    fn cusparse_get_pointer_mode(
        &self,
        cx: &CallCx,
        req: CusparseGetPointerModeRequest,
    ) -> Result<CusparseGetPointerModeReply, CusparseStatus> {
        Ok(CusparseGetPointerModeReply { mode: self.sparse_handle(cx, req.handle)?.pointer_mode })
    }

    // Descriptors (the dispatch has checked every array for the extent the arguments give).

    fn cusparse_create_csr(
        &self,
        cx: &CallCx,
        req: CusparseCreateCsrRequest<'_>,
    ) -> Result<CusparseCreateCsrReply, CusparseStatus> {
        let m = SpMat {
            format: FORMAT_CSR,
            rows: req.rows,
            cols: req.cols,
            nnz: req.nnz,
            first: device_address(&req.csrRowOffsets),
            second: device_address(&req.csrColInd),
            values: device_address(&req.csrValues),
            first_type: req.csrRowOffsetsType,
            second_type: req.csrColIndType,
            base: req.idxBase,
            value_type: req.valueType,
            ..SpMat::default()
        };
        Ok(CusparseCreateCsrReply { spMatDescr: self.create_sp_mat(cx, m)? })
    }

    fn cusparse_create_csc(
        &self,
        cx: &CallCx,
        req: CusparseCreateCscRequest<'_>,
    ) -> Result<CusparseCreateCscReply, CusparseStatus> {
        let m = SpMat {
            format: FORMAT_CSC,
            rows: req.rows,
            cols: req.cols,
            nnz: req.nnz,
            first: device_address(&req.cscColOffsets),
            second: device_address(&req.cscRowInd),
            values: device_address(&req.cscValues),
            first_type: req.cscColOffsetsType,
            second_type: req.cscRowIndType,
            base: req.idxBase,
            value_type: req.valueType,
            ..SpMat::default()
        };
        Ok(CusparseCreateCscReply { spMatDescr: self.create_sp_mat(cx, m)? })
    }

    fn cusparse_create_coo(
        &self,
        cx: &CallCx,
        req: CusparseCreateCooRequest<'_>,
    ) -> Result<CusparseCreateCooReply, CusparseStatus> {
        let m = SpMat {
            format: FORMAT_COO,
            rows: req.rows,
            cols: req.cols,
            nnz: req.nnz,
            first: device_address(&req.cooRowInd),
            second: device_address(&req.cooColInd),
            values: device_address(&req.cooValues),
            first_type: req.cooIdxType,
            second_type: req.cooIdxType,
            base: req.idxBase,
            value_type: req.valueType,
            ..SpMat::default()
        };
        Ok(CusparseCreateCooReply { spMatDescr: self.create_sp_mat(cx, m)? })
    }

    fn cusparse_destroy_sp_mat(
        &self,
        cx: &CallCx,
        req: CusparseDestroySpMatRequest,
    ) -> Result<CusparseDestroySpMatReply, CusparseStatus> {
        let m = self
            .objects
            .sparse
            .sp_mats
            .lock()
            .remove(req.spMatDescr)
            .map_err(|_| self.unknown_descr(cx, "sparse matrix", req.spMatDescr))?;
        if let Some(vendor) = self.vendor_cusparse().filter(|_| m.raw != 0) {
            vendor_status(vendor.destroy_sp_mat(m.raw))?;
        }
        Ok(CusparseDestroySpMatReply {})
    }

    fn cusparse_create_dn_vec(
        &self,
        cx: &CallCx,
        req: CusparseCreateDnVecRequest<'_>,
    ) -> Result<CusparseCreateDnVecReply, CusparseStatus> {
        let mut v = DnVec { size: req.size, values: device_address(&req.values), value_type: req.valueType, raw: 0 };
        if let Some(vendor) = self.vendor_cusparse() {
            v.raw = vendor.create_dn_vec(&v).map_err(CusparseStatus)?;
        }
        let handle =
            self.new_sparse_object(cx, |new| self.objects.sparse.dn_vecs.lock().add(v, new)).inspect_err(|_| {
                if let Some(vendor) = self.vendor_cusparse().filter(|_| v.raw != 0) {
                    vendor.destroy_dn_vec(v.raw);
                }
            })?;
        Ok(CusparseCreateDnVecReply { dnVecDescr: handle })
    }

    fn cusparse_destroy_dn_vec(
        &self,
        cx: &CallCx,
        req: CusparseDestroyDnVecRequest,
    ) -> Result<CusparseDestroyDnVecReply, CusparseStatus> {
        let v = self
            .objects
            .sparse
            .dn_vecs
            .lock()
            .remove(req.dnVecDescr)
            .map_err(|_| self.unknown_descr(cx, "dense vector", req.dnVecDescr))?;
        if let Some(vendor) = self.vendor_cusparse().filter(|_| v.raw != 0) {
            vendor_status(vendor.destroy_dn_vec(v.raw))?;
        }
        Ok(CusparseDestroyDnVecReply {})
    }

    fn cusparse_create_dn_mat(
        &self,
        cx: &CallCx,
        req: CusparseCreateDnMatRequest<'_>,
    ) -> Result<CusparseCreateDnMatReply, CusparseStatus> {
        let mut m = DnMat {
            rows: req.rows,
            cols: req.cols,
            ld: req.ld,
            values: device_address(&req.values),
            value_type: req.valueType,
            order: req.order,
            raw: 0,
        };
        if let Some(vendor) = self.vendor_cusparse() {
            m.raw = vendor.create_dn_mat(&m).map_err(CusparseStatus)?;
        }
        let handle =
            self.new_sparse_object(cx, |new| self.objects.sparse.dn_mats.lock().add(m, new)).inspect_err(|_| {
                if let Some(vendor) = self.vendor_cusparse().filter(|_| m.raw != 0) {
                    vendor.destroy_dn_mat(m.raw);
                }
            })?;
        Ok(CusparseCreateDnMatReply { dnMatDescr: handle })
    }

    fn cusparse_destroy_dn_mat(
        &self,
        cx: &CallCx,
        req: CusparseDestroyDnMatRequest,
    ) -> Result<CusparseDestroyDnMatReply, CusparseStatus> {
        let m = self
            .objects
            .sparse
            .dn_mats
            .lock()
            .remove(req.dnMatDescr)
            .map_err(|_| self.unknown_descr(cx, "dense matrix", req.dnMatDescr))?;
        if let Some(vendor) = self.vendor_cusparse().filter(|_| m.raw != 0) {
            vendor_status(vendor.destroy_dn_mat(m.raw))?;
        }
        Ok(CusparseDestroyDnMatReply {})
    }

    // Getters.

    fn cusparse_sp_mat_get_size(
        &self,
        cx: &CallCx,
        req: CusparseSpMatGetSizeRequest,
    ) -> Result<CusparseSpMatGetSizeReply, CusparseStatus> {
        let m = self.sp_mat_of(cx, req.spMatDescr)?;
        Ok(CusparseSpMatGetSizeReply { rows: m.rows, cols: m.cols, nnz: m.nnz })
    }

    fn cusparse_sp_mat_get_format(
        &self,
        cx: &CallCx,
        req: CusparseSpMatGetFormatRequest,
    ) -> Result<CusparseSpMatGetFormatReply, CusparseStatus> {
        Ok(CusparseSpMatGetFormatReply { format: self.sp_mat_of(cx, req.spMatDescr)?.format })
    }

    fn cusparse_sp_mat_get_index_base(
        &self,
        cx: &CallCx,
        req: CusparseSpMatGetIndexBaseRequest,
    ) -> Result<CusparseSpMatGetIndexBaseReply, CusparseStatus> {
        Ok(CusparseSpMatGetIndexBaseReply { idxBase: self.sp_mat_of(cx, req.spMatDescr)?.base })
    }

    fn cusparse_sp_mat_get_values(
        &self,
        cx: &CallCx,
        req: CusparseSpMatGetValuesRequest,
    ) -> Result<CusparseSpMatGetValuesReply, CusparseStatus> {
        Ok(CusparseSpMatGetValuesReply { values: self.sp_mat_of(cx, req.spMatDescr)?.values })
    }

    fn cusparse_csr_get(&self, cx: &CallCx, req: CusparseCsrGetRequest) -> Result<CusparseCsrGetReply, CusparseStatus> {
        let m = self.sp_mat_of(cx, req.spMatDescr)?;
        if m.format != FORMAT_CSR {
            return Err(self.sparse_mismatch(cx, format!("format {} is not CSR", m.format)));
        }
        Ok(CusparseCsrGetReply {
            rows: m.rows,
            cols: m.cols,
            nnz: m.nnz,
            csrRowOffsets: m.first,
            csrColInd: m.second,
            csrValues: m.values,
            csrRowOffsetsType: m.first_type,
            csrColIndType: m.second_type,
            idxBase: m.base,
            valueType: m.value_type,
        })
    }

    fn cusparse_csc_get(&self, cx: &CallCx, req: CusparseCscGetRequest) -> Result<CusparseCscGetReply, CusparseStatus> {
        let m = self.sp_mat_of(cx, req.spMatDescr)?;
        if m.format != FORMAT_CSC {
            return Err(self.sparse_mismatch(cx, format!("format {} is not CSC", m.format)));
        }
        Ok(CusparseCscGetReply {
            rows: m.rows,
            cols: m.cols,
            nnz: m.nnz,
            cscColOffsets: m.first,
            cscRowInd: m.second,
            cscValues: m.values,
            cscColOffsetsType: m.first_type,
            cscRowIndType: m.second_type,
            idxBase: m.base,
            valueType: m.value_type,
        })
    }

    fn cusparse_coo_get(&self, cx: &CallCx, req: CusparseCooGetRequest) -> Result<CusparseCooGetReply, CusparseStatus> {
        let m = self.sp_mat_of(cx, req.spMatDescr)?;
        if m.format != FORMAT_COO {
            return Err(self.sparse_mismatch(cx, format!("format {} is not COO", m.format)));
        }
        Ok(CusparseCooGetReply {
            rows: m.rows,
            cols: m.cols,
            nnz: m.nnz,
            cooRowInd: m.first,
            cooColInd: m.second,
            cooValues: m.values,
            idxType: m.first_type,
            idxBase: m.base,
            valueType: m.value_type,
        })
    }

    fn cusparse_dn_vec_get(
        &self,
        cx: &CallCx,
        req: CusparseDnVecGetRequest,
    ) -> Result<CusparseDnVecGetReply, CusparseStatus> {
        let v = self.dn_vec_of(cx, req.dnVecDescr)?;
        Ok(CusparseDnVecGetReply { size: v.size, values: v.values, valueType: v.value_type })
    }

    fn cusparse_dn_vec_get_values(
        &self,
        cx: &CallCx,
        req: CusparseDnVecGetValuesRequest,
    ) -> Result<CusparseDnVecGetValuesReply, CusparseStatus> {
        Ok(CusparseDnVecGetValuesReply { values: self.dn_vec_of(cx, req.dnVecDescr)?.values })
    }

    fn cusparse_dn_mat_get(
        &self,
        cx: &CallCx,
        req: CusparseDnMatGetRequest,
    ) -> Result<CusparseDnMatGetReply, CusparseStatus> {
        let m = self.dn_mat_of(cx, req.dnMatDescr)?;
        Ok(CusparseDnMatGetReply {
            rows: m.rows,
            cols: m.cols,
            ld: m.ld,
            values: m.values,
            valueType: m.value_type,
            order: m.order,
        })
    }

    fn cusparse_dn_mat_get_values(
        &self,
        cx: &CallCx,
        req: CusparseDnMatGetValuesRequest,
    ) -> Result<CusparseDnMatGetValuesReply, CusparseStatus> {
        Ok(CusparseDnMatGetValuesReply { values: self.dn_mat_of(cx, req.dnMatDescr)?.values })
    }

    // Setters: each new array checked for the extent the descriptor gives it.

    fn cusparse_sp_mat_set_values(
        &self,
        cx: &CallCx,
        req: CusparseSpMatSetValuesRequest,
    ) -> Result<CusparseSpMatSetValuesReply, CusparseStatus> {
        let mut m = self.sp_mat_of(cx, req.spMatDescr)?;
        m.values = req.values;
        self.check_sp_mat(cx, &m, false)?;
        if let Some(vendor) = self.vendor_cusparse() {
            vendor_status(vendor.sp_mat_set_values(m.raw, m.values))?;
        }
        *self.objects.sparse.sp_mats.lock().get_mut(req.spMatDescr).map_err(sparse_status)? = m;
        Ok(CusparseSpMatSetValuesReply {})
    }

    fn cusparse_dn_vec_set_values(
        &self,
        cx: &CallCx,
        req: CusparseDnVecSetValuesRequest,
    ) -> Result<CusparseDnVecSetValuesReply, CusparseStatus> {
        let mut v = self.dn_vec_of(cx, req.dnVecDescr)?;
        v.values = req.values;
        self.check_dn_vec(cx, &v)?;
        if let Some(vendor) = self.vendor_cusparse() {
            vendor_status(vendor.dn_vec_set_values(v.raw, v.values))?;
        }
        *self.objects.sparse.dn_vecs.lock().get_mut(req.dnVecDescr).map_err(sparse_status)? = v;
        Ok(CusparseDnVecSetValuesReply {})
    }

    fn cusparse_dn_mat_set_values(
        &self,
        cx: &CallCx,
        req: CusparseDnMatSetValuesRequest,
    ) -> Result<CusparseDnMatSetValuesReply, CusparseStatus> {
        let mut m = self.dn_mat_of(cx, req.dnMatDescr)?;
        m.values = req.values;
        self.check_dn_mat(cx, &m)?;
        if let Some(vendor) = self.vendor_cusparse() {
            vendor_status(vendor.dn_mat_set_values(m.raw, m.values))?;
        }
        *self.objects.sparse.dn_mats.lock().get_mut(req.dnMatDescr).map_err(sparse_status)? = m;
        Ok(CusparseDnMatSetValuesReply {})
    }

    fn cusparse_csr_set_pointers(
        &self,
        cx: &CallCx,
        req: CusparseCsrSetPointersRequest,
    ) -> Result<CusparseCsrSetPointersReply, CusparseStatus> {
        if self.sp_mat_of(cx, req.spMatDescr)?.format != FORMAT_CSR {
            return Err(self.sparse_mismatch(cx, "the matrix is not CSR".into()));
        }
        self.set_sp_mat(cx, req.spMatDescr, |m| {
            (m.first, m.second, m.values) = (req.csrRowOffsets, req.csrColInd, req.csrValues)
        })?;
        Ok(CusparseCsrSetPointersReply {})
    }

    fn cusparse_csc_set_pointers(
        &self,
        cx: &CallCx,
        req: CusparseCscSetPointersRequest,
    ) -> Result<CusparseCscSetPointersReply, CusparseStatus> {
        if self.sp_mat_of(cx, req.spMatDescr)?.format != FORMAT_CSC {
            return Err(self.sparse_mismatch(cx, "the matrix is not CSC".into()));
        }
        self.set_sp_mat(cx, req.spMatDescr, |m| {
            (m.first, m.second, m.values) = (req.cscColOffsets, req.cscRowInd, req.cscValues)
        })?;
        Ok(CusparseCscSetPointersReply {})
    }

    fn cusparse_coo_set_pointers(
        &self,
        cx: &CallCx,
        req: CusparseCooSetPointersRequest,
    ) -> Result<CusparseCooSetPointersReply, CusparseStatus> {
        if self.sp_mat_of(cx, req.spMatDescr)?.format != FORMAT_COO {
            return Err(self.sparse_mismatch(cx, "the matrix is not COO".into()));
        }
        self.set_sp_mat(cx, req.spMatDescr, |m| {
            (m.first, m.second, m.values) = (req.cooRows, req.cooColumns, req.cooValues)
        })?;
        Ok(CusparseCooSetPointersReply {})
    }

    fn phos_cusparse_sp_mat_set_size(
        &self,
        cx: &CallCx,
        req: PhosCusparseSpMatSetSizeRequest,
    ) -> Result<PhosCusparseSpMatSetSizeReply, CusparseStatus> {
        // The arrays are checked for the new size by every compute call.
        self.resize_sp_mat(cx, req.spMatDescr, req.rows, req.cols, req.nnz)?;
        Ok(PhosCusparseSpMatSetSizeReply {})
    }

    // SpMV.

    fn cusparse_sp_mv_buffer_size(
        &self,
        cx: &CallCx,
        req: CusparseSpMVBufferSizeRequest<'_>,
    ) -> Result<CusparseSpMVBufferSizeReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.check_scalars(cx, &h, req.mode, req.scalar_bytes, req.computeType)?;
        let (a, x, y) = (self.sp_mat_of(cx, req.matA)?, self.dn_vec_of(cx, req.vecX)?, self.dn_vec_of(cx, req.vecY)?);
        match self.vendor_cusparse() {
            Some(vendor) => self.sparse_on_vendor(&h, vendor, &req),
            None => {
                self.spmv_fits(cx, req.opA, &a, &x, &y)?;
                Ok(CusparseSpMVBufferSizeReply { bufferSize: 0 })
            }
        }
    }

    fn cusparse_sp_mv(&self, cx: &CallCx, req: CusparseSpMVRequest<'_>) -> Result<CusparseSpMVReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.check_scalars(cx, &h, req.mode, req.scalar_bytes, req.computeType)?;
        let (a, x, y) = (self.sp_mat_of(cx, req.matA)?, self.dn_vec_of(cx, req.vecX)?, self.dn_vec_of(cx, req.vecY)?);
        self.check_sp_mat(cx, &a, true)?;
        self.check_dn_vec(cx, &x)?;
        self.check_dn_vec(cx, &y)?;
        self.note_sparse_writes(cx, &[(y.values, extent(y.size, value_bytes(y.value_type)))])?;
        match self.vendor_cusparse() {
            Some(vendor) => {
                let query = CusparseSpMVBufferSizeRequest {
                    handle: req.handle,
                    opA: req.opA,
                    alpha: req.alpha,
                    matA: req.matA,
                    vecX: req.vecX,
                    beta: req.beta,
                    vecY: req.vecY,
                    computeType: req.computeType,
                    alg: req.alg,
                    mode: req.mode,
                    scalar_bytes: req.scalar_bytes,
                };
                let needed = self.sparse_on_vendor(&h, vendor, &query)?.bufferSize;
                self.check_sparse_buffer(cx, req.externalBuffer, needed)?;
                self.sparse_work(cx, &h, None)?;
                self.sparse_on_vendor(&h, vendor, &req)
            }
            None => {
                self.sparse_work(cx, &h, None)?;
                self.cpu_spmv(cx, &h, req.opA, &req.alpha, &a, &x, &req.beta, &y, req.computeType)?;
                Ok(CusparseSpMVReply {})
            }
        }
    }

    // SpMM.

    fn cusparse_sp_mm_buffer_size(
        &self,
        cx: &CallCx,
        req: CusparseSpMMBufferSizeRequest<'_>,
    ) -> Result<CusparseSpMMBufferSizeReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.check_scalars(cx, &h, req.mode, req.scalar_bytes, req.computeType)?;
        self.sp_mat_of(cx, req.matA)?;
        self.dn_mat_of(cx, req.matB)?;
        self.dn_mat_of(cx, req.matC)?;
        match self.vendor_cusparse() {
            Some(vendor) => self.sparse_on_vendor(&h, vendor, &req),
            None => Ok(CusparseSpMMBufferSizeReply { bufferSize: 0 }),
        }
    }

    fn cusparse_sp_mm_preprocess(
        &self,
        cx: &CallCx,
        req: CusparseSpMMPreprocessRequest<'_>,
    ) -> Result<CusparseSpMMPreprocessReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.check_scalars(cx, &h, req.mode, req.scalar_bytes, req.computeType)?;
        let (a, b, c) = (self.sp_mat_of(cx, req.matA)?, self.dn_mat_of(cx, req.matB)?, self.dn_mat_of(cx, req.matC)?);
        self.check_sp_mat(cx, &a, true)?;
        self.check_dn_mat(cx, &b)?;
        self.check_dn_mat(cx, &c)?;
        match self.vendor_cusparse() {
            Some(vendor) => {
                let query = CusparseSpMMBufferSizeRequest {
                    handle: req.handle,
                    opA: req.opA,
                    opB: req.opB,
                    alpha: req.alpha,
                    matA: req.matA,
                    matB: req.matB,
                    beta: req.beta,
                    matC: req.matC,
                    computeType: req.computeType,
                    alg: req.alg,
                    mode: req.mode,
                    scalar_bytes: req.scalar_bytes,
                };
                let needed = self.sparse_on_vendor(&h, vendor, &query)?.bufferSize;
                self.check_sparse_buffer(cx, req.externalBuffer, needed)?;
                self.sparse_work(cx, &h, None)?;
                self.sparse_on_vendor(&h, vendor, &req)
            }
            // Nothing to prepare on the CPU.
            None => Ok(CusparseSpMMPreprocessReply {}),
        }
    }

    fn cusparse_sp_mm(&self, cx: &CallCx, req: CusparseSpMMRequest<'_>) -> Result<CusparseSpMMReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.check_scalars(cx, &h, req.mode, req.scalar_bytes, req.computeType)?;
        let (a, b, c) = (self.sp_mat_of(cx, req.matA)?, self.dn_mat_of(cx, req.matB)?, self.dn_mat_of(cx, req.matC)?);
        self.check_sp_mat(cx, &a, true)?;
        self.check_dn_mat(cx, &b)?;
        self.check_dn_mat(cx, &c)?;
        self.note_sparse_writes(cx, &[(c.values, extent(c.span(), value_bytes(c.value_type)))])?;
        match self.vendor_cusparse() {
            Some(vendor) => {
                let query = CusparseSpMMBufferSizeRequest {
                    handle: req.handle,
                    opA: req.opA,
                    opB: req.opB,
                    alpha: req.alpha,
                    matA: req.matA,
                    matB: req.matB,
                    beta: req.beta,
                    matC: req.matC,
                    computeType: req.computeType,
                    alg: req.alg,
                    mode: req.mode,
                    scalar_bytes: req.scalar_bytes,
                };
                let needed = self.sparse_on_vendor(&h, vendor, &query)?.bufferSize;
                self.check_sparse_buffer(cx, req.externalBuffer, needed)?;
                self.sparse_work(cx, &h, None)?;
                self.sparse_on_vendor(&h, vendor, &req)
            }
            None => {
                self.sparse_work(cx, &h, None)?;
                self.cpu_spmm(cx, &h, req.opA, req.opB, &req.alpha, &a, &b, &req.beta, &c, req.computeType)?;
                Ok(CusparseSpMMReply {})
            }
        }
    }

    // SpGEMM.

    fn cusparse_sp_gemm_create_descr(
        &self,
        cx: &CallCx,
        _: CusparseSpGEMMCreateDescrRequest,
    ) -> Result<CusparseSpGEMMCreateDescrReply, CusparseStatus> {
        let mut g = SpGemm::default();
        if let Some(vendor) = self.vendor_cusparse() {
            g.raw = vendor.create_spgemm().map_err(CusparseStatus)?;
        }
        let raw = g.raw;
        let descr =
            self.new_sparse_object(cx, |new| self.objects.sparse.spgemms.lock().add(g, new)).inspect_err(|_| {
                if let Some(vendor) = self.vendor_cusparse().filter(|_| raw != 0) {
                    vendor.destroy_spgemm(raw);
                }
            })?;
        Ok(CusparseSpGEMMCreateDescrReply { descr })
    }

    fn cusparse_sp_gemm_destroy_descr(
        &self,
        cx: &CallCx,
        req: CusparseSpGEMMDestroyDescrRequest,
    ) -> Result<CusparseSpGEMMDestroyDescrReply, CusparseStatus> {
        let g = self
            .objects
            .sparse
            .spgemms
            .lock()
            .remove(req.descr)
            .map_err(|_| self.unknown_descr(cx, "SpGEMM", req.descr))?;
        if let Some(vendor) = self.vendor_cusparse().filter(|_| g.raw != 0) {
            vendor_status(vendor.destroy_spgemm(g.raw))?;
        }
        Ok(CusparseSpGEMMDestroyDescrReply {})
    }

    fn cusparse_sp_gemm_work_estimation(
        &self,
        cx: &CallCx,
        req: CusparseSpGEMMWorkEstimationRequest<'_>,
    ) -> Result<CusparseSpGEMMWorkEstimationReply, CusparseStatus> {
        let step = SpGemmCall {
            handle: req.handle,
            op_a: req.opA,
            op_b: req.opB,
            alpha: req.alpha,
            a: req.matA,
            b: req.matB,
            beta: req.beta,
            c: req.matC,
            compute_type: req.computeType,
            alg: req.alg,
            descr: req.spgemmDescr,
            buffer_size: req.bufferSize1,
            buffer: req.externalBuffer1,
            mode: req.mode,
            scalar_bytes: req.scalar_bytes,
        };
        Ok(CusparseSpGEMMWorkEstimationReply { bufferSize1: self.spgemm_step(cx, &step, false)? })
    }

    fn cusparse_sp_gemm_compute(
        &self,
        cx: &CallCx,
        req: CusparseSpGEMMComputeRequest<'_>,
    ) -> Result<CusparseSpGEMMComputeReply, CusparseStatus> {
        let step = SpGemmCall {
            handle: req.handle,
            op_a: req.opA,
            op_b: req.opB,
            alpha: req.alpha,
            a: req.matA,
            b: req.matB,
            beta: req.beta,
            c: req.matC,
            compute_type: req.computeType,
            alg: req.alg,
            descr: req.spgemmDescr,
            buffer_size: req.bufferSize2,
            buffer: req.externalBuffer2,
            mode: req.mode,
            scalar_bytes: req.scalar_bytes,
        };
        Ok(CusparseSpGEMMComputeReply { bufferSize2: self.spgemm_step(cx, &step, true)? })
    }

    fn cusparse_sp_gemm_copy(
        &self,
        cx: &CallCx,
        req: CusparseSpGEMMCopyRequest<'_>,
    ) -> Result<CusparseSpGEMMCopyReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.sparse_work(cx, &h, Some("SpGEMM's steps hand sizes to the host"))?;
        self.check_scalars(cx, &h, req.mode, req.scalar_bytes, req.computeType)?;
        let (a, b, c) = (self.sp_mat_of(cx, req.matA)?, self.sp_mat_of(cx, req.matB)?, self.sp_mat_of(cx, req.matC)?);
        self.check_sp_mat(cx, &a, true)?;
        self.check_sp_mat(cx, &b, true)?;
        self.check_sp_mat(cx, &c, true)?;
        self.note_sparse_writes(cx, &Self::sp_mat_writes(&c))?;
        let g = self
            .objects
            .sparse
            .spgemms
            .lock()
            .get(req.spgemmDescr)
            .cloned()
            .map_err(|_| self.unknown_descr(cx, "SpGEMM", req.spgemmDescr))?;
        if let Some(vendor) = self.vendor_cusparse() {
            return self.sparse_on_vendor(&h, vendor, &req);
        }
        let Some(product) = g.product else {
            return Err(self.sparse_mismatch(
                cx,
                "no product computed on this SpGEMM descriptor (cusparseSpGEMM_compute first)".into(),
            ));
        };
        if c.format != FORMAT_CSR || product.columns.len() as i64 != c.nnz || c.rows + 1 != product.offsets.len() as i64
        {
            return Err(self.sparse_mismatch(
                cx,
                format!(
                    "C ({} x {}, nnz {}) is not the computed product's CSR (nnz {})",
                    c.rows,
                    c.cols,
                    c.nnz,
                    product.columns.len()
                ),
            ));
        }
        let call = self.sparse_cpu_call(cx, &h)?;
        let base = i64::from(c.base);
        let offsets: Vec<i64> = product.offsets.iter().map(|o| o + base).collect();
        let columns: Vec<i64> = product.columns.iter().map(|o| o + base).collect();
        call.store_indices(c.first, &offsets, c.first_type)?;
        call.store_indices(c.second, &columns, c.second_type)?;
        call.store_values(c.values, &product.values, c.value_type)?;
        Ok(CusparseSpGEMMCopyReply {})
    }

    // Conversions.

    fn cusparse_sparse_to_dense_buffer_size(
        &self,
        cx: &CallCx,
        req: CusparseSparseToDenseBufferSizeRequest,
    ) -> Result<CusparseSparseToDenseBufferSizeReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.sp_mat_of(cx, req.matA)?;
        self.dn_mat_of(cx, req.matB)?;
        match self.vendor_cusparse() {
            Some(vendor) => self.sparse_on_vendor(&h, vendor, &req),
            None => Ok(CusparseSparseToDenseBufferSizeReply { bufferSize: 0 }),
        }
    }

    fn cusparse_sparse_to_dense(
        &self,
        cx: &CallCx,
        req: CusparseSparseToDenseRequest,
    ) -> Result<CusparseSparseToDenseReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let (a, b) = (self.sp_mat_of(cx, req.matA)?, self.dn_mat_of(cx, req.matB)?);
        self.check_sp_mat(cx, &a, true)?;
        self.check_dn_mat(cx, &b)?;
        self.note_sparse_writes(cx, &[(b.values, extent(b.span(), value_bytes(b.value_type)))])?;
        if let Some(vendor) = self.vendor_cusparse() {
            let query = CusparseSparseToDenseBufferSizeRequest {
                handle: req.handle,
                matA: req.matA,
                matB: req.matB,
                alg: req.alg,
            };
            let needed = self.sparse_on_vendor(&h, vendor, &query)?.bufferSize;
            self.check_sparse_buffer(cx, req.externalBuffer, needed)?;
            self.sparse_work(cx, &h, None)?;
            return self.sparse_on_vendor(&h, vendor, &req);
        }
        self.sparse_cpu_types(cx, &[a.value_type, b.value_type])?;
        if (a.rows, a.cols) != (b.rows, b.cols) {
            return Err(self.sparse_mismatch(cx, format!("A is {} x {}, B {} x {}", a.rows, a.cols, b.rows, b.cols)));
        }
        self.sparse_work(cx, &h, None)?;
        let call = self.sparse_cpu_call(cx, &h)?;
        let entries = call.entries(&a)?;
        let layout = Layout { ld: size(b.ld)?, col_major: b.order == ORDER_COL };
        let mut dense = call.load_values(b.values, b.span(), b.value_type)?;
        for r in 0..size(b.rows)? {
            for c in 0..size(b.cols)? {
                dense[layout.at(r, c)] = 0.0;
            }
        }
        for (r, c, v) in entries {
            dense[layout.at(r, c)] += v;
        }
        call.store_values(b.values, &dense, b.value_type)?;
        Ok(CusparseSparseToDenseReply {})
    }

    fn cusparse_dense_to_sparse_buffer_size(
        &self,
        cx: &CallCx,
        req: CusparseDenseToSparseBufferSizeRequest,
    ) -> Result<CusparseDenseToSparseBufferSizeReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.dn_mat_of(cx, req.matA)?;
        self.sp_mat_of(cx, req.matB)?;
        match self.vendor_cusparse() {
            Some(vendor) => self.sparse_on_vendor(&h, vendor, &req),
            None => Ok(CusparseDenseToSparseBufferSizeReply { bufferSize: 0 }),
        }
    }

    fn cusparse_dense_to_sparse_analysis(
        &self,
        cx: &CallCx,
        req: CusparseDenseToSparseAnalysisRequest,
    ) -> Result<CusparseDenseToSparseAnalysisReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        self.sparse_work(cx, &h, Some("its count of entries goes to the host (through the matrix descriptor)"))?;
        let (a, b) = (self.dn_mat_of(cx, req.matA)?, self.sp_mat_of(cx, req.matB)?);
        self.check_dn_mat(cx, &a)?;
        self.check_sp_mat(cx, &b, false)?;
        if let Some(vendor) = self.vendor_cusparse() {
            let query = CusparseDenseToSparseBufferSizeRequest {
                handle: req.handle,
                matA: req.matA,
                matB: req.matB,
                alg: req.alg,
            };
            let needed = self.sparse_on_vendor(&h, vendor, &query)?.bufferSize;
            self.check_sparse_buffer(cx, req.externalBuffer, needed)?;
            // The analysis writes the offsets of a compressed matrix.
            self.note_sparse_writes(cx, &Self::sp_mat_writes(&b)[..1])?;
            let reply = self.sparse_on_vendor(&h, vendor, &req)?;
            self.take_vendor_size(cx, vendor, req.matB)?;
            return Ok(reply);
        }
        self.sparse_cpu_types(cx, &[a.value_type, b.value_type])?;
        if (a.rows, a.cols) != (b.rows, b.cols) {
            return Err(self.sparse_mismatch(cx, format!("A is {} x {}, B {} x {}", a.rows, a.cols, b.rows, b.cols)));
        }
        let call = self.sparse_cpu_call(cx, &h)?;
        let dense = call.load_values(a.values, a.span(), a.value_type)?;
        let layout = Layout { ld: size(a.ld)?, col_major: a.order == ORDER_COL };
        let nnz = cpu_sparse::dense_entries(&dense, layout, size(a.rows)?, size(a.cols)?, true).len() as i64;
        let b = self.resize_sp_mat(cx, req.matB, b.rows, b.cols, nnz)?;
        self.record_size(cx, req.matB, &b);
        Ok(CusparseDenseToSparseAnalysisReply {})
    }

    fn cusparse_dense_to_sparse_convert(
        &self,
        cx: &CallCx,
        req: CusparseDenseToSparseConvertRequest,
    ) -> Result<CusparseDenseToSparseConvertReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let (a, b) = (self.dn_mat_of(cx, req.matA)?, self.sp_mat_of(cx, req.matB)?);
        self.check_dn_mat(cx, &a)?;
        self.check_sp_mat(cx, &b, true)?;
        self.note_sparse_writes(cx, &Self::sp_mat_writes(&b))?;
        if let Some(vendor) = self.vendor_cusparse() {
            let query = CusparseDenseToSparseBufferSizeRequest {
                handle: req.handle,
                matA: req.matA,
                matB: req.matB,
                alg: req.alg,
            };
            let needed = self.sparse_on_vendor(&h, vendor, &query)?.bufferSize;
            self.check_sparse_buffer(cx, req.externalBuffer, needed)?;
            self.sparse_work(cx, &h, None)?;
            return self.sparse_on_vendor(&h, vendor, &req);
        }
        self.sparse_cpu_types(cx, &[a.value_type, b.value_type])?;
        self.sparse_work(cx, &h, None)?;
        let call = self.sparse_cpu_call(cx, &h)?;
        let dense = call.load_values(a.values, a.span(), a.value_type)?;
        let layout = Layout { ld: size(a.ld)?, col_major: a.order == ORDER_COL };
        let entries = cpu_sparse::dense_entries(&dense, layout, size(a.rows)?, size(a.cols)?, b.format != FORMAT_CSC);
        if entries.len() as i64 != b.nnz || (a.rows, a.cols) != (b.rows, b.cols) {
            return Err(self.sparse_mismatch(
                cx,
                format!(
                    "B ({} x {}, nnz {}) does not hold A's {} nonzeros (analysis first)",
                    b.rows,
                    b.cols,
                    b.nnz,
                    entries.len()
                ),
            ));
        }
        self.cpu_store_sparse(&call, &b, &entries)?;
        Ok(CusparseDenseToSparseConvertReply {})
    }

    // Index conversions.

    // Attributes.

    fn cusparse_sp_mat_set_attribute(
        &self,
        cx: &CallCx,
        req: CusparseSpMatSetAttributeRequest<'_>,
    ) -> Result<CusparseSpMatSetAttributeReply, CusparseStatus> {
        let value = i32::from_le_bytes(req.data.try_into().map_err(|_| CusparseStatus::INVALID_VALUE)?);
        // Both attributes are 0 or 1 (lower/upper, non-unit/unit).
        if !(0..=1).contains(&value) {
            crate::guest_warn!(
                self.id,
                "cusparseSpMatSetAttribute: attribute {} set to {value}, not 0 or 1: CUSPARSE_STATUS_INVALID_VALUE",
                req.attribute
            );
            return Err(CusparseStatus::INVALID_VALUE);
        }
        let mut m = self.sp_mat_of(cx, req.spMatDescr)?;
        if req.attribute == ATTRIBUTE_FILL_MODE {
            m.fill_mode = value;
        } else {
            m.diag_type = value;
        }
        if let Some(vendor) = self.vendor_cusparse() {
            vendor_status(vendor.sp_mat_set_attribute(m.raw, req.attribute, value))?;
        }
        *self.objects.sparse.sp_mats.lock().get_mut(req.spMatDescr).map_err(sparse_status)? = m;
        // Recorded under the attribute: a restore sets each one again.
        let payload = phos_protocol::encode(&req);
        let mutated = [("cusparse_sp_mat", req.spMatDescr)];
        let facts = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
        let id = Function::Cusparse(FunctionId::CusparseSpMatSetAttribute);
        self.records.record_keyed(id, req.attribute as u64, cx.device, &payload, &facts);
        Ok(CusparseSpMatSetAttributeReply {})
    }

    fn cusparse_sp_mat_get_attribute(
        &self,
        cx: &CallCx,
        req: CusparseSpMatGetAttributeRequest,
    ) -> Result<CusparseSpMatGetAttributeReply, CusparseStatus> {
        let m = self.sp_mat_of(cx, req.spMatDescr)?;
        let value = if req.attribute == ATTRIBUTE_DIAG_TYPE { m.diag_type } else { m.fill_mode };
        Ok(CusparseSpMatGetAttributeReply { data: value.to_le_bytes().to_vec() })
    }

    // SpSV.

    fn cusparse_sp_sv_create_descr(
        &self,
        cx: &CallCx,
        _: CusparseSpSVCreateDescrRequest,
    ) -> Result<CusparseSpSVCreateDescrReply, CusparseStatus> {
        let mut d = SpSv::default();
        if let Some(vendor) = self.vendor_cusparse() {
            d.raw = vendor.create_spsv().map_err(CusparseStatus)?;
        }
        let descr =
            self.new_sparse_object(cx, |new| self.objects.sparse.spsvs.lock().add(d, new)).inspect_err(|_| {
                if let Some(vendor) = self.vendor_cusparse().filter(|_| d.raw != 0) {
                    vendor.destroy_spsv(d.raw);
                }
            })?;
        Ok(CusparseSpSVCreateDescrReply { descr })
    }

    fn cusparse_sp_sv_destroy_descr(
        &self,
        cx: &CallCx,
        req: CusparseSpSVDestroyDescrRequest,
    ) -> Result<CusparseSpSVDestroyDescrReply, CusparseStatus> {
        let d = self
            .objects
            .sparse
            .spsvs
            .lock()
            .remove(req.descr)
            .map_err(|_| self.unknown_descr(cx, "SpSV", req.descr))?;
        if let Some(vendor) = self.vendor_cusparse().filter(|_| d.raw != 0) {
            vendor_status(vendor.destroy_spsv(d.raw))?;
        }
        Ok(CusparseSpSVDestroyDescrReply {})
    }

    fn cusparse_sp_sv_buffer_size(
        &self,
        cx: &CallCx,
        req: CusparseSpSVBufferSizeRequest<'_>,
    ) -> Result<CusparseSpSVBufferSizeReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let scalars = (req.mode, req.scalar_bytes, req.computeType);
        self.spsv_operands(cx, &h, scalars, req.matA, req.vecX, req.vecY, req.spsvDescr, false)?;
        match self.vendor_cusparse() {
            Some(vendor) => self.sparse_on_vendor(&h, vendor, &req),
            // The CPU needs no buffer.
            None => Ok(CusparseSpSVBufferSizeReply { bufferSize: 0 }),
        }
    }

    fn cusparse_sp_sv_analysis(
        &self,
        cx: &CallCx,
        req: CusparseSpSVAnalysisRequest<'_>,
    ) -> Result<CusparseSpSVAnalysisReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let scalars = (req.mode, req.scalar_bytes, req.computeType);
        let (a, _, _) = self.spsv_operands(cx, &h, scalars, req.matA, req.vecX, req.vecY, req.spsvDescr, false)?;
        self.sparse_work(cx, &h, Some("its analysis is kept in the descriptor when it runs"))?;
        match self.vendor_cusparse() {
            Some(vendor) => {
                let query = CusparseSpSVBufferSizeRequest {
                    handle: req.handle,
                    opA: req.opA,
                    alpha: req.alpha,
                    matA: req.matA,
                    vecX: req.vecX,
                    vecY: req.vecY,
                    computeType: req.computeType,
                    alg: req.alg,
                    spsvDescr: req.spsvDescr,
                    mode: req.mode,
                    scalar_bytes: req.scalar_bytes,
                };
                let needed = self.sparse_on_vendor(&h, vendor, &query)?.bufferSize;
                self.check_sparse_buffer(cx, req.externalBuffer, needed)?;
                let reply = self.sparse_on_vendor(&h, vendor, &req)?;
                // libcusparse keeps the analysis in the descriptor: a restore reruns it.
                let payload = phos_protocol::encode(&req);
                let mutated = [("cusparse_spsv", req.spsvDescr)];
                let facts =
                    RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
                self.records.record(Function::Cusparse(FunctionId::CusparseSpSVAnalysis), cx.device, &payload, &facts);
                Ok(reply)
            }
            None => {
                // What the analysis would find wrong, found now: the structure and the types.
                self.sparse_cpu_types(cx, &[a.value_type, req.computeType])?;
                self.sparse_cpu_call(cx, &h)?.entries(&a)?;
                Ok(CusparseSpSVAnalysisReply {})
            }
        }
    }

    fn cusparse_sp_sv_solve(
        &self,
        cx: &CallCx,
        req: CusparseSpSVSolveRequest<'_>,
    ) -> Result<CusparseSpSVSolveReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let scalars = (req.mode, req.scalar_bytes, req.computeType);
        let (a, x, y) = self.spsv_operands(cx, &h, scalars, req.matA, req.vecX, req.vecY, req.spsvDescr, true)?;
        self.sparse_work(cx, &h, None)?;
        match self.vendor_cusparse() {
            Some(vendor) => self.sparse_on_vendor(&h, vendor, &req),
            None => {
                self.cpu_spsv(cx, &h, req.opA, &req.alpha, &a, &x, &y, req.computeType)?;
                Ok(CusparseSpSVSolveReply {})
            }
        }
    }

    fn cusparse_xcoo_2csr(
        &self,
        cx: &CallCx,
        req: CusparseXcoo2csrRequest<'_>,
    ) -> Result<CusparseXcoo2csrReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let call = self.sparse_cpu_call(cx, &h)?;
        let base = i64::from(req.idxBase);
        let rows = call.load_indices(device_address(&req.cooRowInd), i64::from(req.nnz), 2)?;
        let m = size(i64::from(req.m))?;
        // Every row index must name a row: libcusparse counts each into the offsets.
        let entries = cpu_sparse::coo_entries(m, 1, &rows, &vec![base; rows.len()], &vec![0.0; rows.len()], base)
            .map_err(|e| call.refuse("cooRowInd", e))?;
        self.sparse_work(cx, &h, None)?;
        if let Some(vendor) = self.vendor_cusparse() {
            return self.sparse_on_vendor(&h, vendor, &req);
        }
        call.store_indices(req.csrSortedRowPtr, &cpu_sparse::offsets_of(&entries, m, true, base), 2)?;
        Ok(CusparseXcoo2csrReply {})
    }

    fn cusparse_xcsr_2coo(
        &self,
        cx: &CallCx,
        req: CusparseXcsr2cooRequest<'_>,
    ) -> Result<CusparseXcsr2cooReply, CusparseStatus> {
        let h = self.sparse_handle(cx, req.handle)?;
        let call = self.sparse_cpu_call(cx, &h)?;
        let base = i64::from(req.idxBase);
        let m = size(i64::from(req.m))?;
        let offsets = call.load_indices(req.csrSortedRowPtr, i64::from(req.m) + 1, 2)?;
        // The offsets decide where libcusparse writes each row's indices: they must stay
        // inside the nnz of cooRowInd.
        let nnz = size(i64::from(req.nnz))?;
        let entries = cpu_sparse::compressed_entries(m, 1, &offsets, &vec![base; nnz], &vec![0.0; nnz], base, true)
            .map_err(|e| call.refuse("csrSortedRowPtr", e))?;
        self.sparse_work(cx, &h, None)?;
        if let Some(vendor) = self.vendor_cusparse() {
            return self.sparse_on_vendor(&h, vendor, &req);
        }
        let rows: Vec<i64> = entries.iter().map(|e| e.0 as i64 + base).collect();
        call.store_indices(device_address(&req.cooRowInd), &rows, 2)?;
        Ok(CusparseXcsr2cooReply {})
    }
}

/// One SpGEMM step's arguments (work estimation and compute share them).
struct SpGemmCall<'a> {
    handle: u64,
    op_a: i32,
    op_b: i32,
    alpha: Ptr<'a>,
    a: u64,
    b: u64,
    beta: Ptr<'a>,
    c: u64,
    compute_type: i32,
    alg: i32,
    descr: u64,
    buffer_size: &'a [u8],
    buffer: u64,
    mode: i32,
    scalar_bytes: i32,
}

impl Session {
    /// SpGEMM's work estimation or compute step. With a NULL buffer it is the step's size
    /// query; with one, the buffer must hold the size the program passes. Answers the size.
    fn spgemm_step(&self, cx: &CallCx, s: &SpGemmCall<'_>, compute: bool) -> Result<Vec<u8>, CusparseStatus> {
        let h = self.sparse_handle(cx, s.handle)?;
        self.sparse_work(cx, &h, Some("SpGEMM's steps hand sizes to the host"))?;
        self.check_scalars(cx, &h, s.mode, s.scalar_bytes, s.compute_type)?;
        let given = u64::from_le_bytes(s.buffer_size.try_into().map_err(|_| CusparseStatus::INVALID_VALUE)?);
        let (a, b, c) = (self.sp_mat_of(cx, s.a)?, self.sp_mat_of(cx, s.b)?, self.sp_mat_of(cx, s.c)?);
        let g = self
            .objects
            .sparse
            .spgemms
            .lock()
            .get(s.descr)
            .cloned()
            .map_err(|_| self.unknown_descr(cx, "SpGEMM", s.descr))?;
        self.check_sp_mat(cx, &a, true)?;
        self.check_sp_mat(cx, &b, true)?;
        self.check_sp_mat(cx, &c, false)?;
        if s.buffer != 0 {
            self.check_sparse_array(cx, "external buffer", s.buffer, Some(given), true)?;
            self.note_sparse_writes(cx, &[(s.buffer, Some(given))])?;
        }
        if let Some(vendor) = self.vendor_cusparse() {
            let scalar = |p: &Ptr<'_>| match p {
                Ptr::In(bytes) => bytes.as_ptr().cast::<std::ffi::c_void>(),
                Ptr::Device(addr) => *addr as *const std::ffi::c_void,
                _ => std::ptr::null(),
            };
            let step = SpGemmStep {
                handle: h.raw,
                op_a: s.op_a,
                op_b: s.op_b,
                alpha: scalar(&s.alpha),
                a: a.raw,
                b: b.raw,
                beta: scalar(&s.beta),
                c: c.raw,
                compute_type: s.compute_type,
                alg: s.alg,
                descr: g.raw,
                buffer: s.buffer,
            };
            let mut size = usize::try_from(given).map_err(|_| CusparseStatus::INVALID_VALUE)?;
            self.backend.bind(h.device).map_err(sparse_status)?;
            // SAFETY: live vendor objects of the session's handles; scalars of the compute
            // type's size (checked) where the handle's pointer mode says; a buffer checked for
            // the size passed with it; the operands' arrays checked against the session's memory.
            vendor_status(unsafe { vendor.spgemm_step(compute, &step, &mut size) })?;
            if compute && s.buffer != 0 {
                self.take_vendor_size(cx, vendor, s.c)?;
            }
            return Ok((size as u64).to_le_bytes().to_vec());
        }
        self.sparse_cpu_types(cx, &[a.value_type, b.value_type, c.value_type, s.compute_type])?;
        if s.op_a != OP_NON_TRANSPOSE || s.op_b != OP_NON_TRANSPOSE {
            crate::guest_warn!(
                self.id,
                "{}: transposed operands (cuSPARSE's SpGEMM takes none): CUSPARSE_STATUS_NOT_SUPPORTED",
                Self::sparse_name(cx)
            );
            return Err(CusparseStatus::NOT_SUPPORTED);
        }
        if a.format != FORMAT_CSR || b.format != FORMAT_CSR || c.format != FORMAT_CSR {
            return Err(self.sparse_mismatch(cx, "SpGEMM takes CSR matrices".into()));
        }
        if a.cols != b.rows || c.rows != a.rows || c.cols != b.cols {
            return Err(self.sparse_mismatch(
                cx,
                format!("A is {} x {}, B {} x {}, C {} x {}", a.rows, a.cols, b.rows, b.cols, c.rows, c.cols),
            ));
        }
        if s.buffer == 0 {
            return Ok(CPU_SPGEMM_BUFFER.to_le_bytes().to_vec());
        }
        if !compute {
            return Ok(s.buffer_size.to_vec());
        }
        let call = self.sparse_cpu_call(cx, &h)?;
        let alpha = call.scalar(&s.alpha, s.compute_type)?;
        let product = cpu_sparse::spgemm(&call.entries(&a)?, &call.entries(&b)?, size(a.rows)?, alpha);
        let nnz = product.columns.len() as i64;
        self.objects.sparse.spgemms.lock().get_mut(s.descr).map_err(sparse_status)?.product = Some(product_of(product));
        let c = self.resize_sp_mat(cx, s.c, c.rows, c.cols, nnz)?;
        self.record_size(cx, s.c, &c);
        Ok(s.buffer_size.to_vec())
    }
}
