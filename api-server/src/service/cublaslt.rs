//! cuBLASLt (`spec/cublaslt.lapis`) on the session: handles and descriptors live in
//! [`crate::registry::lt`], which keeps every attribute. A matmul's operands are described by
//! its descriptors, not its arguments, so the service works out what it reads and writes (A,
//! B, C and D from their layouts, the bias and the epilogue's auxiliary matrix from the matmul
//! descriptor, the scale and amax pointers) and checks every range against the session's
//! memory before anything runs; the C/R engine's hook sees the same ranges. It then runs on the
//! backend's libcublasLt where it has one (the generated calls of `crate::vendor::cublaslt`, on
//! the vendor's objects made beside the session's), otherwise on [`crate::cpu_lt`] through the
//! backend's copies on the call's stream (emu).

use phos_protocol::apis::Function;
use phos_protocol::cublaslt::*;
use phos_protocol::spec::{CallAccess, DeviceAccess, RecordFacts};
use phos_protocol::{CudaError, Ptr};

use super::device_io::{self, device_address};
use super::library_capture::NotNow;
use super::{CallCx, Session};
use crate::backend::StreamRef;
use crate::backend::vendor_lt::{Creation, CublasLt};
use crate::cpu_blas;
use crate::cpu_lt::{self, Aux, Epilogue, Operands, Shape};
use crate::dispatch::cublaslt::CublasltService;
use crate::dispatch::cudart::CudartService;
use crate::registry::handles::NewHandle;
use crate::registry::lt::{DescKind, Descriptor, LtHandle, MAX_LT_OBJECTS, layout, matmul, transform};
use crate::vendor::cublaslt::{Translate, VendorCall};

/// A runtime failure as cuBLASLt reports it.
fn lt_status(e: CudaError) -> CublasLtStatus {
    match e {
        CudaError::InvalidResourceHandle => CublasLtStatus::NOT_INITIALIZED,
        CudaError::MemoryAllocation => CublasLtStatus::ALLOC_FAILED,
        CudaError::InvalidValue => CublasLtStatus::INVALID_VALUE,
        CudaError::NotSupported => CublasLtStatus::NOT_SUPPORTED,
        _ => CublasLtStatus::MAPPING_ERROR,
    }
}

fn vendor_status(code: i32) -> Result<(), CublasLtStatus> {
    if code == SUCCESS { Ok(()) } else { Err(CublasLtStatus(code)) }
}

/// Bytes of one element of a `cudaDataType` a matrix may have (`None`: not one Phos knows).
fn element_bytes(data_type: i64) -> Option<u64> {
    Some(match data_type {
        3 | 8 | 28 | 29 => 1, // CUDA_R_8I, CUDA_R_8U, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2
        2 | 14 => 2,          // CUDA_R_16F, CUDA_R_16BF
        0 | 10 | 11 => 4,     // CUDA_R_32F, CUDA_R_32I, CUDA_R_32U
        1 | 4 => 8,           // CUDA_R_64F, CUDA_C_32F
        5 => 16,              // CUDA_C_64F
        _ => return None,
    })
}

/// Bytes of one scalar of a scale type (as the guest counts them).
fn scale_bytes(scale_type: i64) -> i64 {
    match scale_type {
        2 | 14 => 2,
        1 | 4 => 8,
        5 => 16,
        _ => 4,
    }
}

/// Whether a failure of `id`, sent without waiting, waits for the next synchronous cuBLASLt
/// call whatever it names (`deferred::ANY`): a descriptor's setting or destruction, whose
/// descriptor the calls that use it do not name first.
pub(crate) fn defers_to_any(id: Function) -> bool {
    matches!(
        id,
        Function::Cublaslt(
            FunctionId::CublasLtMatmulDescSetAttribute
                | FunctionId::CublasLtMatrixLayoutSetAttribute
                | FunctionId::CublasLtMatmulPreferenceSetAttribute
                | FunctionId::CublasLtMatmulDescDestroy
                | FunctionId::CublasLtMatrixLayoutDestroy
                | FunctionId::CublasLtMatmulPreferenceDestroy
        )
    )
}

/// The vendor's objects of one call: (kind, virtual handle, vendor object).
struct VendorObjects<'a>(&'a [(&'static str, u64, u64)]);

impl Translate for VendorObjects<'_> {
    fn object(&self, kind: &'static str, handle: u64) -> Result<*mut std::ffi::c_void, CublasLtStatus> {
        self.0
            .iter()
            .find(|(k, h, _)| *k == kind && *h == handle)
            .map(|&(_, _, raw)| raw as *mut std::ffi::c_void)
            .ok_or(CublasLtStatus::INTERNAL_ERROR)
    }
}

/// One operand's matrices: where, in which element type, in which shape.
#[derive(Debug, Clone, Copy)]
struct Matrix {
    addr: u64,
    data_type: i64,
    shape: Shape,
}

impl Matrix {
    fn bytes(&self) -> Option<u64> {
        (self.shape.extent()? as u64).checked_mul(element_bytes(self.data_type)?)
    }
}

/// A matmul as its descriptors describe it, checked for consistency.
struct Plan {
    k: usize,
    trans_a: bool,
    trans_b: bool,
    a: Matrix,
    b: Matrix,
    c: Matrix,
    d: Matrix,
    epilogue: i64,
    /// Device ranges besides A, B, C and D (bias, auxiliary matrix, scale and amax pointers):
    /// (what, access).
    extra: Vec<(&'static str, DeviceAccess)>,
    flops: u64,
}

/// A layout's shape and element type; `what` names it in refusals.
fn layout_of(l: &Descriptor, what: &str) -> Result<(Shape, i64), String> {
    let size = |v: i64, name: &str| usize::try_from(v).map_err(|_| format!("{what}'s {name} is {v}"));
    let order = l.int(layout::ORDER);
    if order != 0 && order != 1 {
        return Err(format!("{what}'s order {order} is not COL or ROW (the tiled orders are not carried)"));
    }
    let shape = Shape {
        rows: size(l.int(layout::ROWS), "rows")?,
        cols: size(l.int(layout::COLS), "cols")?,
        ld: size(l.int(layout::LD), "ld")?,
        row_major: order == 1,
        batch: size(l.int(layout::BATCH_COUNT), "batch count")?,
        stride: size(l.int(layout::STRIDED_BATCH_OFFSET), "batch stride")?,
    };
    if shape.batch == 0 {
        return Err(format!("{what}'s batch count is 0"));
    }
    if !shape.ld_ok() {
        return Err(format!(
            "{what}'s ld {} is smaller than its {}",
            shape.ld,
            if shape.row_major { "cols" } else { "rows" }
        ));
    }
    Ok((shape, l.int(layout::TYPE)))
}

/// Which epilogues the server knows the reads and writes of: (code, reads a bias, writes a
/// bias gradient of m (or, for BGRADB, n) values, auxiliary matrix: 0 none, 1 elements, 2 a
/// bit mask).
const EPILOGUES: [(i64, bool, bool, u8); 16] = [
    (1, false, false, 0),   // DEFAULT
    (2, false, false, 0),   // RELU
    (4, true, false, 0),    // BIAS
    (6, true, false, 0),    // RELU_BIAS
    (32, false, false, 0),  // GELU
    (36, true, false, 0),   // GELU_BIAS
    (130, false, false, 2), // RELU_AUX
    (134, true, false, 2),  // RELU_AUX_BIAS
    (160, false, false, 1), // GELU_AUX
    (164, true, false, 1),  // GELU_AUX_BIAS
    (136, false, false, 2), // DRELU
    (152, false, true, 2),  // DRELU_BGRAD
    (192, false, false, 1), // DGELU
    (208, false, true, 1),  // DGELU_BGRAD
    (256, false, true, 0),  // BGRADA
    (512, false, true, 0),  // BGRADB
];

impl Plan {
    /// Check the descriptors against each other and work out every range the matmul touches.
    fn new(desc: &Descriptor, layouts: [&Descriptor; 4], addrs: [u64; 4]) -> Result<Plan, (CublasLtStatus, String)> {
        let invalid = |s: String| (CublasLtStatus::INVALID_VALUE, s);
        let unsupported = |s: String| (CublasLtStatus::NOT_SUPPORTED, s);
        let op = |v: i64, what: &str| match v {
            0 => Ok(false),
            1 | 2 => Ok(true),
            _ => Err(invalid(format!("{what} is {v}"))),
        };
        let trans_a = op(desc.int(matmul::TRANSA), "TRANSA")?;
        let trans_b = op(desc.int(matmul::TRANSB), "TRANSB")?;
        let mut matrices = Vec::with_capacity(4);
        for ((l, what), addr) in layouts.iter().zip(["A", "B", "C", "D"]).zip(addrs) {
            let (shape, data_type) = layout_of(l, what).map_err(unsupported)?;
            if element_bytes(data_type).is_none() {
                return Err(unsupported(format!("{what}'s type {data_type} is not one Phos carries")));
            }
            matrices.push(Matrix { addr, data_type, shape });
        }
        let (a, b, c, d) = (matrices[0], matrices[1], matrices[2], matrices[3]);
        let (m, n) = (d.shape.rows, d.shape.cols);
        let opped = |s: Shape, t: bool| if t { (s.cols, s.rows) } else { (s.rows, s.cols) };
        let (am, k) = opped(a.shape, trans_a);
        let (bk, bn) = opped(b.shape, trans_b);
        if am != m || bk != k || bn != n || (c.shape.rows, c.shape.cols) != (m, n) {
            return Err(invalid(format!(
                "the layouts do not agree: op(A) is {am}x{k}, op(B) {bk}x{bn}, C {}x{}, D {m}x{n}",
                c.shape.rows, c.shape.cols
            )));
        }
        let batch = d.shape.batch;
        if [a, b, c].iter().any(|x| x.shape.batch != batch) {
            return Err(invalid(format!("the batch counts differ from D's {batch}")));
        }
        let epilogue = desc.int(matmul::EPILOGUE);
        let Some(&(_, reads_bias, writes_bias, aux)) = EPILOGUES.iter().find(|e| e.0 == epilogue) else {
            return Err(unsupported(format!("epilogue {epilogue} is not carried")));
        };
        let overflow = || invalid("a size overflows".to_string());
        let mut extra = Vec::new();
        let range = |what, addr, len, writes| (what, DeviceAccess { addr, len, writes });
        if reads_bias || writes_bias {
            let bias_type = match desc.int(matmul::BIAS_DATA_TYPE) {
                -1 => d.data_type,
                t => t,
            };
            let elem = element_bytes(bias_type).ok_or_else(|| unsupported(format!("bias type {bias_type}")))?;
            let len = if epilogue == 512 { n } else { m } as u64;
            let stride = u64::try_from(desc.int(matmul::BIAS_BATCH_STRIDE)).map_err(|_| overflow())?;
            let elems = (batch as u64 - 1).checked_mul(stride).and_then(|s| s.checked_add(len)).ok_or_else(overflow)?;
            let bytes = elems.checked_mul(elem).ok_or_else(overflow)?;
            extra.push(range("bias", desc.u64(matmul::BIAS_POINTER), bytes, writes_bias));
        }
        if aux != 0 {
            let ld = u64::try_from(desc.int(matmul::EPILOGUE_AUX_LD)).map_err(|_| overflow())?;
            let stride = u64::try_from(desc.int(matmul::EPILOGUE_AUX_BATCH_STRIDE)).map_err(|_| overflow())?;
            if ld < m as u64 {
                return Err(invalid(format!("EPILOGUE_AUX_LD {ld} is smaller than m = {m}")));
            }
            // Elements of the batch, as a column-major m x n matrix ld apart; a bit mask
            // takes a bit each.
            let one = (n as u64).saturating_sub(1).checked_mul(ld).and_then(|x| x.checked_add(m as u64));
            let elems = one
                .and_then(|one| (batch as u64 - 1).checked_mul(stride).and_then(|s| s.checked_add(one)))
                .ok_or_else(overflow)?;
            let bytes = if aux == 2 {
                elems.div_ceil(8)
            } else {
                let aux_type = match desc.int(matmul::EPILOGUE_AUX_DATA_TYPE) {
                    -1 => d.data_type,
                    t => t,
                };
                let elem = element_bytes(aux_type).ok_or_else(|| unsupported(format!("aux type {aux_type}")))?;
                elems.checked_mul(elem).ok_or_else(overflow)?
            };
            // The forward epilogues write it, the backward ones (D...) read it.
            extra.push(range(
                "EPILOGUE_AUX_POINTER",
                desc.u64(matmul::EPILOGUE_AUX_POINTER),
                bytes,
                epilogue < 136 || epilogue == 160 || epilogue == 164,
            ));
        }
        for (attr, what, writes) in [
            (matmul::A_SCALE_POINTER, "A_SCALE_POINTER", false),
            (matmul::B_SCALE_POINTER, "B_SCALE_POINTER", false),
            (matmul::C_SCALE_POINTER, "C_SCALE_POINTER", false),
            (matmul::D_SCALE_POINTER, "D_SCALE_POINTER", false),
            (matmul::AMAX_D_POINTER, "AMAX_D_POINTER", true),
            (matmul::EPILOGUE_AUX_SCALE_POINTER, "EPILOGUE_AUX_SCALE_POINTER", false),
            (matmul::EPILOGUE_AUX_AMAX_POINTER, "EPILOGUE_AUX_AMAX_POINTER", true),
        ] {
            let addr = desc.u64(attr);
            if addr != 0 {
                // One float each.
                extra.push(range(what, addr, 4, writes));
            }
        }
        let flops = [m, n, k, batch].iter().try_fold(2u64, |acc, &x| acc.checked_mul(x as u64)).ok_or_else(overflow)?;
        for x in [a, b, c, d] {
            x.bytes().ok_or_else(overflow)?;
        }
        Ok(Plan { k, trans_a, trans_b, a, b, c, d, epilogue, extra, flops })
    }

    /// Every device range the matmul reads or writes.
    fn accesses(&self) -> Vec<(&'static str, DeviceAccess)> {
        let whole = |x: &Matrix, writes| DeviceAccess { addr: x.addr, len: x.bytes().unwrap_or(u64::MAX), writes };
        let mut all = vec![
            ("A", whole(&self.a, false)),
            ("B", whole(&self.b, false)),
            ("C", whole(&self.c, false)),
            ("D", whole(&self.d, true)),
        ];
        all.extend(self.extra.iter().copied());
        all
    }
}

impl Session {
    fn vendor_lt(&self) -> Option<&CublasLt> {
        self.backend.cublaslt()
    }

    /// A handle's state; an unknown handle is `NOT_INITIALIZED`, logged. A cuBLAS handle of the
    /// session is one too: NVIDIA's documentation lets a `cublasHandle_t` be cast to a
    /// `cublasLtHandle_t`, and PyTorch does so for every Lt matmul (its Linear layers' bias
    /// path); on a GPU the vendor's cuBLAS handle is used the same way.
    fn lt_handle(&self, name: &str, handle: u64) -> Result<LtHandle, CublasLtStatus> {
        self.objects.lt.handle(handle).or_else(|e| {
            if let Ok(blas) = self.objects.blas.get(handle) {
                return Ok(LtHandle { device: blas.device, raw: blas.raw });
            }
            crate::guest_warn!(
                self.id,
                "{name}: {handle:#x} is not a cuBLASLt handle of the session: CUBLAS_STATUS_NOT_INITIALIZED"
            );
            Err(lt_status(e))
        })
    }

    /// A descriptor; an unknown one is `INVALID_VALUE`, logged.
    fn lt_desc(&self, name: &str, kind: DescKind, handle: u64) -> Result<Descriptor, CublasLtStatus> {
        self.objects.lt.get(kind, handle).map_err(|_| {
            crate::guest_warn!(
                self.id,
                "{name}: {handle:#x} is not a {} of the session: CUBLAS_STATUS_INVALID_VALUE",
                kind.kind_name()
            );
            CublasLtStatus::INVALID_VALUE
        })
    }

    /// A descriptor a compute call names: in a graph launch, as the call's capture kept it.
    fn lt_desc_in(&self, cx: &CallCx, name: &str, kind: DescKind, handle: u64) -> Result<Descriptor, CublasLtStatus> {
        let snapshot = cx.graph.launch.and(cx.graph.position.get());
        match snapshot {
            None => self.lt_desc(name, kind, handle),
            Some(_) => self.objects.lt.get_captured(kind, handle, snapshot).map_err(|_| {
                crate::guest_warn!(
                    self.id,
                    "{name}: {handle:#x} is not a {} of the session: CUBLAS_STATUS_INVALID_VALUE",
                    kind.kind_name()
                );
                CublasLtStatus::INVALID_VALUE
            }),
        }
    }

    /// Make the descriptor `handle` again (the guest's pool, `phosLt...Reinit`): a fresh one
    /// with cuBLASLt's defaults and what `how` sets replaces it under the same handle, and is
    /// recorded as made by `create` (the creation's request, `payload`), the earlier one's
    /// records dropped. The call was sent without waiting: a failure (a handle that is not a
    /// live descriptor of the kind of the session, the vendor's) is logged and kept for the
    /// next synchronous cuBLASLt call.
    #[allow(clippy::too_many_arguments)]
    fn lt_reinit(
        &self,
        cx: &CallCx,
        name: &'static str,
        handle: u64,
        mut desc: Descriptor,
        how: Creation,
        create: FunctionId,
        payload: &[u8],
    ) {
        let kind = desc.kind;
        let made = (|| -> Result<(), CublasLtStatus> {
            if let Some(lt) = self.vendor_lt() {
                self.backend.bind(cx.device).map_err(lt_status)?;
                desc.raw = lt.create_descriptor(how).map_err(CublasLtStatus)?;
            }
            let raw = desc.raw;
            let old = self.objects.lt.reinit(kind, handle, desc).map_err(|_| {
                if let Some(lt) = self.vendor_lt().filter(|_| raw != 0) {
                    lt.destroy_descriptor(kind, raw);
                }
                // Destroyed since (a captured call's kept one is no longer the program's).
                self.lt_refuse(
                    name,
                    CublasLtStatus::INVALID_VALUE,
                    &format!("{handle:#x} is not a live {} of the session", kind.kind_name()),
                )
            })?;
            if let Some(lt) = self.vendor_lt().filter(|_| old.raw != 0) {
                lt.destroy_descriptor(kind, old.raw);
            }
            let object = [(kind.kind_name(), handle)];
            let facts =
                RecordFacts { created: &object, destroyed: &object, mutated: &[], depends_on: &[], global: false };
            self.records.record(Function::Cublaslt(create), cx.device, payload, &facts);
            Ok(())
        })();
        if let Err(status) = made {
            self.lt_defer(name, status);
        }
    }

    /// A Phos-internal call sent without waiting failed: logged, and kept for the next
    /// synchronous cuBLASLt call of the session.
    fn lt_defer(&self, name: &'static str, status: CublasLtStatus) {
        let failed = crate::deferred::Failed { status: status.0, function: name };
        self.deferred.failed(phos_protocol::apis::Api::Cublaslt.id(), crate::deferred::ANY, failed);
        tracing::error!(
            session = self.id,
            "{name} (sent asynchronously) failed with {}: the next synchronous cuBLASLt call returns it",
            status.name()
        );
    }

    /// A descriptor goes into the guest's pool (`phosLt...Park`): refused from now on until
    /// the guest makes it again; one that is not a live descriptor of the kind of the session
    /// is refused, logged, the failure kept.
    fn lt_park(&self, name: &'static str, kind: DescKind, handle: u64) {
        if self.objects.lt.park(kind, handle).is_err() {
            let why = format!("{handle:#x} is not a live {} of the session", kind.kind_name());
            let status = self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, &why);
            self.lt_defer(name, status);
        }
    }

    /// A refusal, logged with its function.
    fn lt_refuse(&self, name: &str, status: CublasLtStatus, why: &str) -> CublasLtStatus {
        crate::guest_warn!(self.id, "{name}: {why}: {}", status.name());
        status
    }

    fn lt_create_handle(&self, cx: &CallCx) -> Result<u64, CublasLtStatus> {
        self.check_device(cx.device).map_err(|_| CublasLtStatus::NOT_INITIALIZED)?;
        let full = || {
            tracing::warn!(
                session = self.id,
                "cublasLtCreate: the session holds {MAX_LT_OBJECTS} cuBLASLt handles already"
            );
            CudaError::MemoryAllocation
        };
        let raw = match self.vendor_lt() {
            Some(lt) => {
                self.backend.bind(cx.device).map_err(lt_status)?;
                lt.create().map_err(CublasLtStatus)?
            }
            None => 0,
        };
        let made = self
            .objects
            .lt
            .create_handle(LtHandle { device: cx.device, raw }, &NewHandle { forced: cx.forced(), full: &full });
        made.map_err(|e| {
            if let Some(lt) = self.vendor_lt().filter(|_| raw != 0) {
                lt.destroy(raw);
            }
            lt_status(e)
        })
    }

    /// A new descriptor of `kind`, with cuBLASLt's defaults and what its creation sets.
    fn lt_create_desc(&self, cx: &CallCx, mut desc: Descriptor, how: Creation) -> Result<u64, CublasLtStatus> {
        let kind = desc.kind;
        let full = || {
            tracing::warn!(session = self.id, "the session holds {MAX_LT_OBJECTS} {}s already", kind.kind_name());
            CudaError::MemoryAllocation
        };
        if let Some(lt) = self.vendor_lt() {
            self.backend.bind(cx.device).map_err(lt_status)?;
            desc.raw = lt.create_descriptor(how).map_err(CublasLtStatus)?;
        }
        let raw = desc.raw;
        self.objects.lt.create(desc, &NewHandle { forced: cx.forced(), full: &full }).map_err(|e| {
            if let Some(lt) = self.vendor_lt().filter(|_| raw != 0) {
                lt.destroy_descriptor(kind, raw);
            }
            lt_status(e)
        })
    }

    fn lt_destroy_desc(&self, name: &str, kind: DescKind, handle: u64) -> Result<(), CublasLtStatus> {
        let desc = self.objects.lt.destroy(kind, handle).map_err(|_| {
            self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, &format!("{handle:#x} is not a {}", kind.kind_name()))
        })?;
        if let Some(lt) = self.vendor_lt().filter(|_| desc.raw != 0) {
            vendor_status(lt.destroy_descriptor(kind, desc.raw))?;
        }
        Ok(())
    }

    /// Set one attribute: checked against the kind's table, set on the vendor's descriptor
    /// (the generated call, `req`), kept, and recorded as the descriptor's last setting of that
    /// attribute.
    #[allow(clippy::too_many_arguments)]
    fn lt_set_attribute<R: VendorCall + bincode::Encode>(
        &self,
        cx: &CallCx,
        id: FunctionId,
        kind: DescKind,
        handle: u64,
        attr: i32,
        value: &[u8],
        req: &R,
    ) -> Result<(), CublasLtStatus> {
        let name = id.name();
        let desc = self.lt_desc(name, kind, handle)?;
        let Some(spec) = kind.attribute(attr) else {
            return Err(self.lt_refuse(
                name,
                CublasLtStatus::INVALID_VALUE,
                &format!("attribute {attr} is not one of cuBLASLt's"),
            ));
        };
        if value.len() != spec.size {
            let why = format!("attribute {attr} takes {} bytes, not {}", spec.size, value.len());
            return Err(self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, &why));
        }
        if let Some(lt) = self.vendor_lt().filter(|_| desc.raw != 0) {
            let objects = VendorObjects(&[(kind.kind_name(), handle, desc.raw)]);
            // SAFETY: a live vendor descriptor and a value of the attribute's size; device
            // pointers among the values are checked when a matmul uses them.
            unsafe { req.call_vendor(&lt.library, &objects) }?;
        }
        self.objects.lt.set(kind, handle, attr, value).map_err(lt_status)?;
        let mutated = [(kind.kind_name(), handle)];
        let facts = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
        let payload = || phos_protocol::encode(req);
        self.records.record_with(Function::Cublaslt(id), attr as u64, cx.device, payload, &facts);
        Ok(())
    }

    /// An attribute's value (`size` 0: only its size), as cuBLASLt answers it.
    fn lt_get_attribute(
        &self,
        id: FunctionId,
        kind: DescKind,
        handle: u64,
        attr: i32,
        size: u64,
    ) -> Result<(Vec<u8>, u64), CublasLtStatus> {
        let name = id.name();
        let desc = self.lt_desc(name, kind, handle)?;
        let (Some(spec), Some(value)) = (kind.attribute(attr), desc.bytes(attr)) else {
            return Err(self.lt_refuse(
                name,
                CublasLtStatus::INVALID_VALUE,
                &format!("attribute {attr} is not one of cuBLASLt's"),
            ));
        };
        match size {
            0 => Ok((Vec::new(), spec.size as u64)),
            s if s == spec.size as u64 => Ok((value, s)),
            s => Err(self.lt_refuse(
                name,
                CublasLtStatus::INVALID_VALUE,
                &format!("attribute {attr} takes {} bytes, not {s}", spec.size),
            )),
        }
    }

    /// The matmul's descriptors, and its plan.
    fn lt_matmul_plan(
        &self,
        cx: &CallCx,
        name: &str,
        desc: u64,
        layouts: [u64; 4],
        addrs: [u64; 4],
    ) -> Result<(Descriptor, [Descriptor; 4], Plan), CublasLtStatus> {
        let desc = self.lt_desc_in(cx, name, DescKind::Matmul, desc)?;
        let mut ls = Vec::with_capacity(4);
        for l in layouts {
            ls.push(self.lt_desc_in(cx, name, DescKind::Layout, l)?);
        }
        let ls: [Descriptor; 4] = ls.try_into().map_err(|_| CublasLtStatus::INTERNAL_ERROR)?;
        let plan = Plan::new(&desc, [&ls[0], &ls[1], &ls[2], &ls[3]], addrs)
            .map_err(|(status, why)| self.lt_refuse(name, status, &why))?;
        Ok((desc, ls, plan))
    }

    /// Each range must be the session's memory; the C/R engine's hook is shown them all.
    fn lt_check_ranges(
        &self,
        name: &'static str,
        ranges: &[(&'static str, DeviceAccess)],
    ) -> Result<(), CublasLtStatus> {
        // Under one look at the session's memory (a matmul has five to nine ranges).
        let sized = || ranges.iter().filter(|(_, r)| r.len > 0);
        if let Some(i) = self.objects.memory.first_outside(sized().map(|(_, r)| (r.addr, r.len)))
            && let Some((what, r)) = sized().nth(i)
        {
            let why = format!("`{what}` at {:#x} does not hold the {} bytes the descriptors say", r.addr, r.len);
            return Err(self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, &why));
        }
        if self.hooks.active() {
            let device: Vec<DeviceAccess> = ranges.iter().map(|(_, r)| *r).filter(|r| r.len > 0).collect();
            self.hooks.before_call(&CallAccess { function: name, device: &device, objects: &[] }).map_err(lt_status)?;
        }
        Ok(())
    }

    /// The call's stream, where its work starts: taken into the stream's capture instead, or
    /// refused there (`library_work`).
    /// `named`: the descriptors the call names, kept for the graph if it is captured.
    fn lt_stream(
        &self,
        cx: &CallCx,
        name: &str,
        stream: u64,
        named: &[(DescKind, u64)],
    ) -> Result<StreamRef, CublasLtStatus> {
        let resolved = self.objects.streams.resolve(stream).map_err(|_| {
            self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, &format!("{stream:#x} is not a stream of the session"))
        })?;
        match self.library_work(cx, stream, None, "CUBLAS_STATUS_NOT_SUPPORTED") {
            Ok(()) => Ok(resolved),
            Err(not_now) => {
                if not_now == NotNow::Captured {
                    // The graph keeps the call with what its descriptors are now.
                    cx.graph.position.set(self.objects.lt.snapshot(named));
                }
                Err(CublasLtStatus::NOT_SUPPORTED)
            }
        }
    }

    /// What the guest sent from its notes must be what the server's descriptors say.
    fn lt_check_notes(
        &self,
        name: &str,
        desc: &Descriptor,
        scale_attr: i32,
        mode_attr: i32,
        mode: i32,
        scalar_size: i32,
    ) -> Result<(), CublasLtStatus> {
        let want_mode = desc.int(mode_attr);
        let want_size = scale_bytes(desc.int(scale_attr));
        if i64::from(mode) != want_mode || i64::from(scalar_size) != want_size {
            let why = format!(
                "the call's pointer mode {mode} and scalar size {scalar_size} are not the descriptor's ({want_mode}, {want_size})"
            );
            return Err(self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, &why));
        }
        Ok(())
    }

    fn lt_read(&self, stream: StreamRef, addr: u64, bytes: u64) -> Result<Vec<u8>, CublasLtStatus> {
        let bytes = usize::try_from(bytes).map_err(|_| CublasLtStatus::ALLOC_FAILED)?;
        device_io::read(self, stream, addr, bytes).map_err(lt_status)
    }

    /// A matrix's elements as f32 (emu computes in f32).
    fn lt_load(&self, stream: StreamRef, m: &Matrix) -> Result<Vec<f32>, CublasLtStatus> {
        let raw = self.lt_read(stream, m.addr, m.bytes().unwrap_or(0))?;
        let values = cpu_blas::decode_typed(m.data_type as i32, &raw).ok_or(CublasLtStatus::NOT_SUPPORTED)?;
        Ok(values.into_iter().map(|v| v as f32).collect())
    }

    fn lt_store(&self, stream: StreamRef, addr: u64, data_type: i64, values: &[f32]) -> Result<(), CublasLtStatus> {
        let wide: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        device_io::write(self, stream, addr, &cpu_blas::encode_typed(data_type as i32, &wide)).map_err(lt_status)
    }

    fn lt_scalar(&self, stream: StreamRef, p: &Ptr<'_>) -> Result<f32, CublasLtStatus> {
        let bytes = match p {
            Ptr::In(b) => b.to_vec(),
            Ptr::Device(a) => self.lt_read(stream, *a, 4)?,
            _ => return Err(CublasLtStatus::INVALID_VALUE),
        };
        let b: [u8; 4] = bytes.as_slice().try_into().map_err(|_| CublasLtStatus::NOT_SUPPORTED)?;
        Ok(f32::from_le_bytes(b))
    }

    /// The matmul on the CPU: fp32, fp16 and bf16 matrices with fp32 compute and scale, and
    /// the epilogues [`cpu_lt::Epilogue`] knows.
    fn lt_matmul_on_cpu(
        &self,
        name: &str,
        req: &CublasLtMatmulRequest<'_>,
        desc: &Descriptor,
        plan: &Plan,
        stream: StreamRef,
    ) -> Result<(), CublasLtStatus> {
        let compute = desc.int(matmul::COMPUTE_TYPE);
        let float_types = [0, 2, 14];
        let supported = matches!(compute, 68 | 69 | 74 | 75 | 77)
            && desc.int(matmul::SCALE_TYPE) == 0
            && [plan.a, plan.b, plan.c, plan.d].iter().all(|x| float_types.contains(&x.data_type))
            && plan.c.data_type == plan.d.data_type
            && plan.extra.iter().all(|(what, _)| *what == "bias" || *what == "EPILOGUE_AUX_POINTER");
        let epilogue = Epilogue::from_code(plan.epilogue);
        let (true, Some(epilogue)) = (supported, epilogue) else {
            let why = format!(
                "on emu only fp32 compute and scale with fp32, fp16 or bf16 matrices (C's type D's) and the epilogues DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS are carried (compute type {compute}, epilogue {})",
                plan.epilogue
            );
            return Err(self.lt_refuse(name, CublasLtStatus::NOT_SUPPORTED, &why));
        };
        let alpha = self.lt_scalar(stream, &req.alpha)?;
        let beta = self.lt_scalar(stream, &req.beta)?;
        let a = self.lt_load(stream, &plan.a)?;
        let b = self.lt_load(stream, &plan.b)?;
        let c = self.lt_load(stream, &plan.c)?;
        let mut d = self.lt_load(stream, &plan.d)?;
        let find = |what| plan.extra.iter().find(|(w, _)| *w == what).map(|(_, r)| *r);
        let bias_type = match desc.int(matmul::BIAS_DATA_TYPE) {
            -1 => plan.d.data_type,
            t => t,
        };
        let bias = match find("bias") {
            Some(r) => {
                let raw = self.lt_read(stream, r.addr, r.len)?;
                let v = cpu_blas::decode_typed(bias_type as i32, &raw).ok_or(CublasLtStatus::NOT_SUPPORTED)?;
                Some(v.into_iter().map(|v| v as f32).collect::<Vec<f32>>())
            }
            None => None,
        };
        let bias_stride = usize::try_from(desc.int(matmul::BIAS_BATCH_STRIDE)).unwrap_or(0);
        let aux_type = match desc.int(matmul::EPILOGUE_AUX_DATA_TYPE) {
            -1 => plan.d.data_type,
            t => t,
        };
        let mut aux = match find("EPILOGUE_AUX_POINTER") {
            Some(r) => {
                let raw = self.lt_read(stream, r.addr, r.len)?;
                let v = cpu_blas::decode_typed(aux_type as i32, &raw).ok_or(CublasLtStatus::NOT_SUPPORTED)?;
                Some((r.addr, v.into_iter().map(|v| v as f32).collect::<Vec<f32>>()))
            }
            None => None,
        };
        let ops = Operands {
            a: &a,
            a_shape: plan.a.shape,
            trans_a: plan.trans_a,
            b: &b,
            b_shape: plan.b.shape,
            trans_b: plan.trans_b,
            c: &c,
            c_shape: plan.c.shape,
            alpha,
            beta,
            bias: bias.as_deref().map(|v| (v, bias_stride)),
        };
        let aux_out = aux.as_mut().map(|(_, values)| Aux {
            values,
            ld: usize::try_from(desc.int(matmul::EPILOGUE_AUX_LD)).unwrap_or(0),
            stride: usize::try_from(desc.int(matmul::EPILOGUE_AUX_BATCH_STRIDE)).unwrap_or(0),
        });
        cpu_lt::matmul(&ops, plan.k, &mut d, plan.d.shape, epilogue, aux_out);
        self.lt_store(stream, plan.d.addr, plan.d.data_type, &d)?;
        if let Some((addr, values)) = aux {
            self.lt_store(stream, addr, aux_type, &values)?;
        }
        Ok(())
    }
}

/// One heuristic result as cuBLASLt lays it out (96 bytes): the algorithm (64 bytes), the
/// workspace it needs, its state, its waves count, 16 reserved bytes. The CPU's one algorithm
/// is all zeros, needs no workspace and has one wave.
fn cpu_heuristic_result() -> [u8; 96] {
    let mut r = [0u8; 96];
    r[76..80].copy_from_slice(&1.0f32.to_le_bytes());
    r
}

impl CublasltService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CublasLtStatus> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(lt_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &RecordFacts<'_>) {
        self.records.record(Function::Cublaslt(id), cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CublasLtStatus> {
        self.hooks.before_call(access).map_err(lt_status)
    }

    super::library_capture::capture_hooks!(Cublaslt);

    fn cublas_lt_create(&self, cx: &CallCx, _: CublasLtCreateRequest) -> Result<CublasLtCreateReply, CublasLtStatus> {
        Ok(CublasLtCreateReply { lightHandle: self.lt_create_handle(cx)? })
    }

    fn cublas_lt_destroy(
        &self,
        _: &CallCx,
        req: CublasLtDestroyRequest,
    ) -> Result<CublasLtDestroyReply, CublasLtStatus> {
        let h = self.objects.lt.destroy_handle(req.lightHandle).map_err(|e| {
            crate::guest_warn!(
                self.id,
                "cublasLtDestroy: {:#x} is not a cuBLASLt handle of the session",
                req.lightHandle
            );
            lt_status(e)
        })?;
        if let Some(lt) = self.vendor_lt().filter(|_| h.raw != 0) {
            vendor_status(lt.destroy(h.raw))?;
        }
        Ok(CublasLtDestroyReply {})
    }

    fn cublas_lt_matmul_desc_create(
        &self,
        cx: &CallCx,
        req: CublasLtMatmulDescCreateRequest,
    ) -> Result<CublasLtMatmulDescCreateReply, CublasLtStatus> {
        let mut desc = Descriptor::new(DescKind::Matmul);
        desc.set_int(matmul::COMPUTE_TYPE, i64::from(req.computeType));
        desc.set_int(matmul::SCALE_TYPE, i64::from(req.scaleType));
        let how = Creation::Matmul { compute_type: req.computeType, scale_type: req.scaleType };
        Ok(CublasLtMatmulDescCreateReply { matmulDesc: self.lt_create_desc(cx, desc, how)? })
    }

    fn cublas_lt_matmul_desc_destroy(
        &self,
        _: &CallCx,
        req: CublasLtMatmulDescDestroyRequest,
    ) -> Result<CublasLtMatmulDescDestroyReply, CublasLtStatus> {
        self.lt_destroy_desc("cublasLtMatmulDescDestroy", DescKind::Matmul, req.matmulDesc)?;
        Ok(CublasLtMatmulDescDestroyReply {})
    }

    fn cublas_lt_matmul_desc_set_attribute(
        &self,
        cx: &CallCx,
        req: CublasLtMatmulDescSetAttributeRequest<'_>,
    ) -> Result<CublasLtMatmulDescSetAttributeReply, CublasLtStatus> {
        self.lt_set_attribute(
            cx,
            FunctionId::CublasLtMatmulDescSetAttribute,
            DescKind::Matmul,
            req.matmulDesc,
            req.attr,
            req.buf,
            &req,
        )?;
        Ok(CublasLtMatmulDescSetAttributeReply {})
    }

    fn cublas_lt_matmul_desc_get_attribute(
        &self,
        _: &CallCx,
        req: CublasLtMatmulDescGetAttributeRequest,
    ) -> Result<CublasLtMatmulDescGetAttributeReply, CublasLtStatus> {
        let (buf, size_written) = self.lt_get_attribute(
            FunctionId::CublasLtMatmulDescGetAttribute,
            DescKind::Matmul,
            req.matmulDesc,
            req.attr,
            req.sizeInBytes,
        )?;
        Ok(CublasLtMatmulDescGetAttributeReply { buf, sizeWritten: size_written })
    }

    fn cublas_lt_matrix_layout_create(
        &self,
        cx: &CallCx,
        req: CublasLtMatrixLayoutCreateRequest,
    ) -> Result<CublasLtMatrixLayoutCreateReply, CublasLtStatus> {
        let mut desc = Descriptor::new(DescKind::Layout);
        desc.set_int(layout::TYPE, i64::from(req.dataType));
        desc.set_int(layout::ROWS, req.rows as i64);
        desc.set_int(layout::COLS, req.cols as i64);
        desc.set_int(layout::LD, req.ld);
        let how = Creation::Layout { data_type: req.dataType, rows: req.rows, cols: req.cols, ld: req.ld };
        Ok(CublasLtMatrixLayoutCreateReply { matLayout: self.lt_create_desc(cx, desc, how)? })
    }

    fn cublas_lt_matrix_layout_destroy(
        &self,
        _: &CallCx,
        req: CublasLtMatrixLayoutDestroyRequest,
    ) -> Result<CublasLtMatrixLayoutDestroyReply, CublasLtStatus> {
        self.lt_destroy_desc("cublasLtMatrixLayoutDestroy", DescKind::Layout, req.matLayout)?;
        Ok(CublasLtMatrixLayoutDestroyReply {})
    }

    fn cublas_lt_matrix_layout_set_attribute(
        &self,
        cx: &CallCx,
        req: CublasLtMatrixLayoutSetAttributeRequest<'_>,
    ) -> Result<CublasLtMatrixLayoutSetAttributeReply, CublasLtStatus> {
        self.lt_set_attribute(
            cx,
            FunctionId::CublasLtMatrixLayoutSetAttribute,
            DescKind::Layout,
            req.matLayout,
            req.attr,
            req.buf,
            &req,
        )?;
        Ok(CublasLtMatrixLayoutSetAttributeReply {})
    }

    fn cublas_lt_matrix_layout_get_attribute(
        &self,
        _: &CallCx,
        req: CublasLtMatrixLayoutGetAttributeRequest,
    ) -> Result<CublasLtMatrixLayoutGetAttributeReply, CublasLtStatus> {
        let (buf, size_written) = self.lt_get_attribute(
            FunctionId::CublasLtMatrixLayoutGetAttribute,
            DescKind::Layout,
            req.matLayout,
            req.attr,
            req.sizeInBytes,
        )?;
        Ok(CublasLtMatrixLayoutGetAttributeReply { buf, sizeWritten: size_written })
    }

    fn cublas_lt_matmul_preference_create(
        &self,
        cx: &CallCx,
        _: CublasLtMatmulPreferenceCreateRequest,
    ) -> Result<CublasLtMatmulPreferenceCreateReply, CublasLtStatus> {
        let desc = Descriptor::new(DescKind::Preference);
        Ok(CublasLtMatmulPreferenceCreateReply { pref: self.lt_create_desc(cx, desc, Creation::Preference)? })
    }

    fn cublas_lt_matmul_preference_destroy(
        &self,
        _: &CallCx,
        req: CublasLtMatmulPreferenceDestroyRequest,
    ) -> Result<CublasLtMatmulPreferenceDestroyReply, CublasLtStatus> {
        self.lt_destroy_desc("cublasLtMatmulPreferenceDestroy", DescKind::Preference, req.pref)?;
        Ok(CublasLtMatmulPreferenceDestroyReply {})
    }

    fn cublas_lt_matmul_preference_set_attribute(
        &self,
        cx: &CallCx,
        req: CublasLtMatmulPreferenceSetAttributeRequest<'_>,
    ) -> Result<CublasLtMatmulPreferenceSetAttributeReply, CublasLtStatus> {
        self.lt_set_attribute(
            cx,
            FunctionId::CublasLtMatmulPreferenceSetAttribute,
            DescKind::Preference,
            req.pref,
            req.attr,
            req.buf,
            &req,
        )?;
        Ok(CublasLtMatmulPreferenceSetAttributeReply {})
    }

    fn cublas_lt_matmul_preference_get_attribute(
        &self,
        _: &CallCx,
        req: CublasLtMatmulPreferenceGetAttributeRequest,
    ) -> Result<CublasLtMatmulPreferenceGetAttributeReply, CublasLtStatus> {
        let (buf, size_written) = self.lt_get_attribute(
            FunctionId::CublasLtMatmulPreferenceGetAttribute,
            DescKind::Preference,
            req.pref,
            req.attr,
            req.sizeInBytes,
        )?;
        Ok(CublasLtMatmulPreferenceGetAttributeReply { buf, sizeWritten: size_written })
    }

    fn cublas_lt_matrix_transform_desc_create(
        &self,
        cx: &CallCx,
        req: CublasLtMatrixTransformDescCreateRequest,
    ) -> Result<CublasLtMatrixTransformDescCreateReply, CublasLtStatus> {
        let mut desc = Descriptor::new(DescKind::Transform);
        desc.set_int(transform::SCALE_TYPE, i64::from(req.scaleType));
        let how = Creation::Transform { scale_type: req.scaleType };
        Ok(CublasLtMatrixTransformDescCreateReply { transformDesc: self.lt_create_desc(cx, desc, how)? })
    }

    fn cublas_lt_matrix_transform_desc_destroy(
        &self,
        _: &CallCx,
        req: CublasLtMatrixTransformDescDestroyRequest,
    ) -> Result<CublasLtMatrixTransformDescDestroyReply, CublasLtStatus> {
        self.lt_destroy_desc("cublasLtMatrixTransformDescDestroy", DescKind::Transform, req.transformDesc)?;
        Ok(CublasLtMatrixTransformDescDestroyReply {})
    }

    fn cublas_lt_matrix_transform_desc_set_attribute(
        &self,
        cx: &CallCx,
        req: CublasLtMatrixTransformDescSetAttributeRequest<'_>,
    ) -> Result<CublasLtMatrixTransformDescSetAttributeReply, CublasLtStatus> {
        self.lt_set_attribute(
            cx,
            FunctionId::CublasLtMatrixTransformDescSetAttribute,
            DescKind::Transform,
            req.transformDesc,
            req.attr,
            req.buf,
            &req,
        )?;
        Ok(CublasLtMatrixTransformDescSetAttributeReply {})
    }

    fn cublas_lt_matrix_transform_desc_get_attribute(
        &self,
        _: &CallCx,
        req: CublasLtMatrixTransformDescGetAttributeRequest,
    ) -> Result<CublasLtMatrixTransformDescGetAttributeReply, CublasLtStatus> {
        let (buf, size_written) = self.lt_get_attribute(
            FunctionId::CublasLtMatrixTransformDescGetAttribute,
            DescKind::Transform,
            req.transformDesc,
            req.attr,
            req.sizeInBytes,
        )?;
        Ok(CublasLtMatrixTransformDescGetAttributeReply { buf, sizeWritten: size_written })
    }

    fn cublas_lt_matmul_algo_get_heuristic(
        &self,
        cx: &CallCx,
        req: CublasLtMatmulAlgoGetHeuristicRequest<'_>,
    ) -> Result<CublasLtMatmulAlgoGetHeuristicReply, CublasLtStatus> {
        let name = "cublasLtMatmulAlgoGetHeuristic";
        let h = self.lt_handle(name, req.lightHandle)?;
        let layouts = [req.Adesc, req.Bdesc, req.Cdesc, req.Ddesc];
        // The problem must be one the matmul would take (the addresses are not known yet).
        let (desc, ls, _) = self.lt_matmul_plan(cx, name, req.operationDesc, layouts, [0; 4])?;
        let pref = self.lt_desc(name, DescKind::Preference, req.preference)?;
        let mut results = req.heuristicResultsArray.to_vec();
        if let Some(lt) = self.vendor_lt() {
            self.backend.bind(h.device).map_err(lt_status)?;
            let raw = [h.raw, desc.raw, ls[0].raw, ls[1].raw, ls[2].raw, ls[3].raw, pref.raw];
            let returned = lt.heuristic(raw, req.requestedAlgoCount, &mut results).map_err(CublasLtStatus)?;
            return Ok(CublasLtMatmulAlgoGetHeuristicReply {
                heuristicResultsArray: results,
                returnAlgoCount: returned,
            });
        }
        results[..96].copy_from_slice(&cpu_heuristic_result());
        Ok(CublasLtMatmulAlgoGetHeuristicReply { heuristicResultsArray: results, returnAlgoCount: 1 })
    }

    fn cublas_lt_matmul(
        &self,
        cx: &CallCx,
        req: CublasLtMatmulRequest<'_>,
    ) -> Result<CublasLtMatmulReply, CublasLtStatus> {
        let name = "cublasLtMatmul";
        let h = self.lt_handle(name, req.lightHandle)?;
        let layouts = [req.Adesc, req.Bdesc, req.Cdesc, req.Ddesc];
        let (desc, ls, plan) = self.lt_matmul_plan(cx, name, req.computeDesc, layouts, [req.A, req.B, req.C, req.D])?;
        self.lt_check_notes(name, &desc, matmul::SCALE_TYPE, matmul::POINTER_MODE, req.mode, req.scalar_size)?;
        if req.flops != plan.flops {
            let why = format!("the call counts {} flops where its descriptors make {}", req.flops, plan.flops);
            return Err(self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, &why));
        }
        let mut ranges = plan.accesses();
        let workspace = device_address(&req.workspace);
        ranges.push(("workspace", DeviceAccess { addr: workspace, len: req.workspaceSizeInBytes, writes: true }));
        self.lt_check_ranges(name, &ranges)?;
        let named = [
            (DescKind::Matmul, req.computeDesc),
            (DescKind::Layout, req.Adesc),
            (DescKind::Layout, req.Bdesc),
            (DescKind::Layout, req.Cdesc),
            (DescKind::Layout, req.Ddesc),
        ];
        let stream = self.lt_stream(cx, name, req.stream, &named)?;
        if let Some(lt) = self.vendor_lt() {
            self.backend.bind(h.device).map_err(lt_status)?;
            let layout = |i: usize| ("cublaslt_matrix_layout", layouts[i], ls[i].raw);
            let objects = [
                ("cublaslt_handle", req.lightHandle, h.raw),
                ("cublaslt_matmul_desc", req.computeDesc, desc.raw),
                ("stream", req.stream, stream.cu_stream()),
                layout(0),
                layout(1),
                layout(2),
                layout(3),
            ];
            // SAFETY: every range the descriptors make the call read or write was checked
            // against the session's memory above, the workspace by the dispatch, and the
            // objects are live vendor objects.
            return unsafe { req.call_vendor(&lt.library, &VendorObjects(&objects)) };
        }
        self.lt_matmul_on_cpu(name, &req, &desc, &plan, stream)?;
        Ok(CublasLtMatmulReply {})
    }

    fn phos_lt_matmul_desc_reinit(
        &self,
        cx: &CallCx,
        req: PhosLtMatmulDescReinitRequest,
    ) -> Result<PhosLtMatmulDescReinitReply, CublasLtStatus> {
        let mut desc = Descriptor::new(DescKind::Matmul);
        desc.set_int(matmul::COMPUTE_TYPE, i64::from(req.computeType));
        desc.set_int(matmul::SCALE_TYPE, i64::from(req.scaleType));
        let how = Creation::Matmul { compute_type: req.computeType, scale_type: req.scaleType };
        let create = CublasLtMatmulDescCreateRequest { computeType: req.computeType, scaleType: req.scaleType };
        let payload = phos_protocol::encode(&create);
        let id = FunctionId::CublasLtMatmulDescCreate;
        self.lt_reinit(cx, "phosLtMatmulDescReinit", req.matmulDesc, desc, how, id, &payload);
        Ok(PhosLtMatmulDescReinitReply {})
    }

    fn phos_lt_matrix_layout_reinit(
        &self,
        cx: &CallCx,
        req: PhosLtMatrixLayoutReinitRequest,
    ) -> Result<PhosLtMatrixLayoutReinitReply, CublasLtStatus> {
        let mut desc = Descriptor::new(DescKind::Layout);
        desc.set_int(layout::TYPE, i64::from(req.dataType));
        desc.set_int(layout::ROWS, req.rows as i64);
        desc.set_int(layout::COLS, req.cols as i64);
        desc.set_int(layout::LD, req.ld);
        let how = Creation::Layout { data_type: req.dataType, rows: req.rows, cols: req.cols, ld: req.ld };
        let create =
            CublasLtMatrixLayoutCreateRequest { dataType: req.dataType, rows: req.rows, cols: req.cols, ld: req.ld };
        let payload = phos_protocol::encode(&create);
        let id = FunctionId::CublasLtMatrixLayoutCreate;
        self.lt_reinit(cx, "phosLtMatrixLayoutReinit", req.matLayout, desc, how, id, &payload);
        Ok(PhosLtMatrixLayoutReinitReply {})
    }

    fn phos_lt_matmul_preference_reinit(
        &self,
        cx: &CallCx,
        req: PhosLtMatmulPreferenceReinitRequest,
    ) -> Result<PhosLtMatmulPreferenceReinitReply, CublasLtStatus> {
        let desc = Descriptor::new(DescKind::Preference);
        let payload = phos_protocol::encode(&CublasLtMatmulPreferenceCreateRequest {});
        let id = FunctionId::CublasLtMatmulPreferenceCreate;
        self.lt_reinit(cx, "phosLtMatmulPreferenceReinit", req.pref, desc, Creation::Preference, id, &payload);
        Ok(PhosLtMatmulPreferenceReinitReply {})
    }

    fn phos_lt_matmul_desc_park(
        &self,
        _: &CallCx,
        req: PhosLtMatmulDescParkRequest,
    ) -> Result<PhosLtMatmulDescParkReply, CublasLtStatus> {
        self.lt_park("phosLtMatmulDescPark", DescKind::Matmul, req.matmulDesc);
        Ok(PhosLtMatmulDescParkReply {})
    }

    fn phos_lt_matrix_layout_park(
        &self,
        _: &CallCx,
        req: PhosLtMatrixLayoutParkRequest,
    ) -> Result<PhosLtMatrixLayoutParkReply, CublasLtStatus> {
        self.lt_park("phosLtMatrixLayoutPark", DescKind::Layout, req.matLayout);
        Ok(PhosLtMatrixLayoutParkReply {})
    }

    fn phos_lt_matmul_preference_park(
        &self,
        _: &CallCx,
        req: PhosLtMatmulPreferenceParkRequest,
    ) -> Result<PhosLtMatmulPreferenceParkReply, CublasLtStatus> {
        self.lt_park("phosLtMatmulPreferencePark", DescKind::Preference, req.pref);
        Ok(PhosLtMatmulPreferenceParkReply {})
    }

    fn cublas_lt_matrix_transform(
        &self,
        cx: &CallCx,
        req: CublasLtMatrixTransformRequest<'_>,
    ) -> Result<CublasLtMatrixTransformReply, CublasLtStatus> {
        let name = "cublasLtMatrixTransform";
        let h = self.lt_handle(name, req.lightHandle)?;
        let desc = self.lt_desc_in(cx, name, DescKind::Transform, req.transformDesc)?;
        self.lt_check_notes(name, &desc, transform::SCALE_TYPE, transform::POINTER_MODE, req.mode, req.scalar_size)?;
        let mut matrices = Vec::with_capacity(3);
        for ((l, what), addr) in
            [req.Adesc, req.Bdesc, req.Cdesc].into_iter().zip(["A", "B", "C"]).zip([req.A, req.B, req.C])
        {
            let l = self.lt_desc_in(cx, name, DescKind::Layout, l)?;
            let (shape, data_type) =
                layout_of(&l, what).map_err(|why| self.lt_refuse(name, CublasLtStatus::NOT_SUPPORTED, &why))?;
            if element_bytes(data_type).is_none() {
                return Err(self.lt_refuse(name, CublasLtStatus::NOT_SUPPORTED, &format!("{what}'s type {data_type}")));
            }
            matrices.push((Matrix { addr, data_type, shape }, l.raw, what));
        }
        let (trans_a, trans_b) = (desc.int(transform::TRANSA) != 0, desc.int(transform::TRANSB) != 0);
        let c = matrices[2].0;
        let opped = |s: Shape, t: bool| if t { (s.cols, s.rows) } else { (s.rows, s.cols) };
        let (m, n) = (c.shape.rows, c.shape.cols);
        for (x, t) in [(matrices[0].0, trans_a), (matrices[1].0, trans_b)] {
            // B may be absent (null) when beta is zero.
            if x.addr != 0 && (opped(x.shape, t) != (m, n) || x.shape.batch != c.shape.batch) {
                return Err(self.lt_refuse(name, CublasLtStatus::INVALID_VALUE, "op(A), op(B) and C differ in shape"));
            }
        }
        let mut ranges = Vec::new();
        for (x, _, what) in &matrices {
            let len = x.bytes().ok_or(CublasLtStatus::INVALID_VALUE)?;
            let len = if x.addr == 0 && *what != "C" { 0 } else { len };
            ranges.push((*what, DeviceAccess { addr: x.addr, len, writes: *what == "C" }));
        }
        self.lt_check_ranges(name, &ranges)?;
        let named = [
            (DescKind::Transform, req.transformDesc),
            (DescKind::Layout, req.Adesc),
            (DescKind::Layout, req.Bdesc),
            (DescKind::Layout, req.Cdesc),
        ];
        let stream = self.lt_stream(cx, name, req.stream, &named)?;
        if let Some(lt) = self.vendor_lt() {
            self.backend.bind(h.device).map_err(lt_status)?;
            let mut objects = vec![
                ("cublaslt_handle", req.lightHandle, h.raw),
                ("cublaslt_matrix_transform_desc", req.transformDesc, desc.raw),
                ("stream", req.stream, stream.cu_stream()),
            ];
            for (l, (_, raw, _)) in [req.Adesc, req.Bdesc, req.Cdesc].into_iter().zip(&matrices) {
                objects.push(("cublaslt_matrix_layout", l, *raw));
            }
            // SAFETY: the ranges of A, B and C were checked above; live vendor objects.
            return unsafe { req.call_vendor(&lt.library, &VendorObjects(&objects)) };
        }
        if desc.int(transform::SCALE_TYPE) != 0 || matrices.iter().any(|(x, _, _)| ![0, 2, 14].contains(&x.data_type)) {
            return Err(self.lt_refuse(
                name,
                CublasLtStatus::NOT_SUPPORTED,
                "on emu only fp32 scale and fp32, fp16 or bf16 matrices are carried",
            ));
        }
        let alpha = self.lt_scalar(stream, &req.alpha)?;
        let beta = self.lt_scalar(stream, &req.beta)?;
        let load = |x: &Matrix| if x.addr == 0 { Ok(Vec::new()) } else { self.lt_load(stream, x) };
        let (a, b) = (load(&matrices[0].0)?, load(&matrices[1].0)?);
        let mut out = self.lt_load(stream, &c)?;
        let at = |s: &Shape, t: bool, i: usize, j: usize| {
            let (r, col) = if t { (j, i) } else { (i, j) };
            if s.row_major { r * s.ld + col } else { r + col * s.ld }
        };
        for batch in 0..c.shape.batch {
            for j in 0..n {
                for i in 0..m {
                    let term = |x: &Matrix, v: &[f32], t: bool, scale: f32| {
                        if x.addr == 0 || scale == 0.0 {
                            0.0
                        } else {
                            scale * v[batch * x.shape.stride + at(&x.shape, t, i, j)]
                        }
                    };
                    let value = term(&matrices[0].0, &a, trans_a, alpha) + term(&matrices[1].0, &b, trans_b, beta);
                    out[batch * c.shape.stride + at(&c.shape, false, i, j)] = value;
                }
            }
        }
        self.lt_store(stream, c.addr, c.data_type, &out)?;
        Ok(CublasLtMatrixTransformReply {})
    }
}
