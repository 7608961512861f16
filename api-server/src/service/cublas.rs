//! cuBLAS's remote functions (`spec/cublas.lapis`) on the session: handles live in
//! [`crate::registry::blas`], their stream is a runtime stream, their matrices the session's
//! device memory (the generated dispatch has checked every range the spec gives, and the
//! pointer arrays of the batched GEMMs are checked here, element by element). The BLAS itself
//! runs with the backend's vendor library where it has one (NVIDIA's libcublas on a GPU: the
//! generated calls of `crate::vendor::cublas`, on a vendor handle made on the session's
//! context), and otherwise on [`crate::cpu_blas`], reading operands through the backend's
//! copies on the handle's stream (emu).

use phos_protocol::apis::Function;
use phos_protocol::blas;
use phos_protocol::cublas::*;
use phos_protocol::spec::{CallAccess, DeviceAccess};
use phos_protocol::{CudaError, Ptr};

use super::device_io::{self, device_address};
use super::{CallCx, Session};
use crate::backend::StreamRef;
use crate::backend::vendor::Cublas;
use crate::cpu_blas::{self, Real};
use crate::dispatch::cublas::CublasService;
use crate::dispatch::cudart::CudartService;
use crate::registry::blas::BlasHandle;
use crate::vendor::cublas::{Translate, VendorCall};

/// A runtime failure as cuBLAS reports it: an unknown handle is `NOT_INITIALIZED` (cuBLAS's
/// answer for a handle it did not make), a table at its limit `ALLOC_FAILED`, a bad address
/// or size `INVALID_VALUE`, a failed device access `MAPPING_ERROR`.
fn blas_status(e: CudaError) -> CublasStatus {
    match e {
        CudaError::InvalidResourceHandle => CublasStatus::NOT_INITIALIZED,
        CudaError::MemoryAllocation => CublasStatus::ALLOC_FAILED,
        CudaError::InvalidValue => CublasStatus::INVALID_VALUE,
        CudaError::NotSupported => CublasStatus::NOT_SUPPORTED,
        _ => CublasStatus::MAPPING_ERROR,
    }
}

/// A size from a call's integer (the dispatch has checked it is not negative).
fn count(v: impl TryInto<usize>) -> Result<usize, CublasStatus> {
    v.try_into().map_err(|_| CublasStatus::INVALID_VALUE)
}

/// What one call on the CPU works with: the session, and the stream its handle's work is
/// ordered on.
struct Call<'s> {
    session: &'s Session,
    stream: StreamRef,
}

impl Call<'_> {
    fn read(&self, addr: u64, bytes: usize) -> Result<Vec<u8>, CublasStatus> {
        device_io::read(self.session, self.stream, addr, bytes).map_err(blas_status)
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), CublasStatus> {
        device_io::write(self.session, self.stream, addr, bytes).map_err(blas_status)
    }

    fn values<T: Real>(&self, p: &Ptr<'_>, elements: usize) -> Result<Vec<T>, CublasStatus> {
        Ok(cpu_blas::decode(&self.read(device_address(p), elements * T::BYTES)?))
    }

    fn store<T: Real>(&self, p: &Ptr<'_>, values: &[T]) -> Result<(), CublasStatus> {
        self.write(device_address(p), &cpu_blas::encode(values))
    }

    /// A scalar argument: host bytes in the request, or device memory (device pointer mode).
    fn scalar_bytes(&self, p: &Ptr<'_>, bytes: usize) -> Result<Vec<u8>, CublasStatus> {
        match p {
            Ptr::In(b) if b.len() == bytes => Ok(b.to_vec()),
            Ptr::Device(a) => self.read(*a, bytes),
            _ => Err(CublasStatus::INVALID_VALUE),
        }
    }

    fn scalar<T: Real>(&self, p: &Ptr<'_>) -> Result<T, CublasStatus> {
        Ok(T::from_le(&self.scalar_bytes(p, T::BYTES)?))
    }

    /// A result: to the host in the reply, or to device memory (device pointer mode).
    fn result(&self, p: &Ptr<'_>, bytes: Vec<u8>) -> Result<Option<Vec<u8>>, CublasStatus> {
        match p {
            Ptr::Device(a) => self.write(*a, &bytes).map(|()| None),
            _ => Ok(Some(bytes)),
        }
    }

    /// The device pointers of a batched GEMM's array, each checked to hold `bytes` of the
    /// session's memory (the spec checked the array itself).
    fn pointer_array(&self, p: &Ptr<'_>, batch: usize, bytes: usize) -> Result<Vec<u64>, CublasStatus> {
        let raw = self.read(device_address(p), batch * 8)?;
        let pointers: Vec<u64> =
            raw.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        for (i, &ptr) in pointers.iter().enumerate() {
            if bytes > 0 && !self.session.objects.memory.contains(ptr, bytes as u64) {
                crate::guest_warn!(
                    self.session.id,
                    "a batched GEMM's matrix {i} at {ptr:#x} ({bytes} bytes) is not the session's memory: \
                     CUBLAS_STATUS_INVALID_VALUE"
                );
                return Err(CublasStatus::INVALID_VALUE);
            }
        }
        Ok(pointers)
    }
}

/// One GEMM's shape: op(A) m x k, op(B) k x n, C m x n.
#[derive(Clone, Copy)]
struct Gemm {
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
}

impl Gemm {
    #[allow(clippy::too_many_arguments)]
    fn new(
        transa: i32,
        transb: i32,
        m: i32,
        n: i32,
        k: i32,
        lda: i32,
        ldb: i32,
        ldc: i32,
    ) -> Result<Gemm, CublasStatus> {
        Ok(Gemm {
            ta: transa != consts::CUBLAS_OP_N,
            tb: transb != consts::CUBLAS_OP_N,
            m: count(m)?,
            n: count(n)?,
            k: count(k)?,
            lda: count(lda)?,
            ldb: count(ldb)?,
            ldc: count(ldc)?,
        })
    }

    /// Elements of A, B and C.
    fn lens(&self) -> (usize, usize, usize) {
        let (ar, ac) = if self.ta { (self.k, self.m) } else { (self.m, self.k) };
        let (br, bc) = if self.tb { (self.n, self.k) } else { (self.k, self.n) };
        (
            cpu_blas::matrix_len(ar, ac, self.lda),
            cpu_blas::matrix_len(br, bc, self.ldb),
            cpu_blas::matrix_len(self.m, self.n, self.ldc),
        )
    }

    fn run<T: Real>(&self, alpha: T, a: &[T], b: &[T], beta: T, c: &mut [T]) {
        T::gemm(
            self.m,
            self.k,
            self.n,
            alpha,
            a,
            cpu_blas::strides(self.ta, self.lda),
            b,
            cpu_blas::strides(self.tb, self.ldb),
            beta,
            c,
            (1, self.ldc as isize),
        );
    }

    /// One GEMM of the session's memory at (a, b, c).
    fn on_device<T: Real>(
        &self,
        call: &Call<'_>,
        alpha: T,
        beta: T,
        a: u64,
        b: u64,
        c: u64,
    ) -> Result<(), CublasStatus> {
        let (la, lb, lc) = self.lens();
        if lc == 0 {
            return Ok(());
        }
        let a: Vec<T> = cpu_blas::decode(&call.read(a, la * T::BYTES)?);
        let b: Vec<T> = cpu_blas::decode(&call.read(b, lb * T::BYTES)?);
        let mut cv: Vec<T> = cpu_blas::decode(&call.read(c, lc * T::BYTES)?);
        self.run(alpha, &a, &b, beta, &mut cv);
        call.write(c, &cpu_blas::encode(&cv))
    }

    /// One GemmEx of the session's memory, the data converted to f64 and computed in `T`.
    #[allow(clippy::too_many_arguments)]
    fn typed_on_device<T: Real>(
        &self,
        call: &Call<'_>,
        alpha: f64,
        beta: f64,
        (a, at): (u64, i32),
        (b, bt): (u64, i32),
        (c, ct): (u64, i32),
    ) -> Result<(), CublasStatus> {
        let (la, lb, lc) = self.lens();
        if lc == 0 {
            return Ok(());
        }
        let size = |t: i32| blas::data_type_bytes(t).unwrap_or(0) as usize;
        let load = |addr: u64, t: i32, len: usize| -> Result<Vec<T>, CublasStatus> {
            let values =
                cpu_blas::decode_typed(t, &call.read(addr, len * size(t))?).ok_or(CublasStatus::NOT_SUPPORTED)?;
            Ok(values.into_iter().map(T::from_f64).collect())
        };
        let (a, b, mut cv) = (load(a, at, la)?, load(b, bt, lb)?, load(c, ct, lc)?);
        self.run(T::from_f64(alpha), &a, &b, T::from_f64(beta), &mut cv);
        let out: Vec<f64> = cv.into_iter().map(Real::to_f64).collect();
        call.write(c, &cpu_blas::encode_typed(ct, &out))
    }
}

/// The data types the CPU implementation runs GemmEx on (fp32, fp64, fp16, bf16).
fn cpu_type(t: i32) -> bool {
    matches!(t, 0 | 1 | 2 | 14)
}

/// The vendor's objects of one call: its handle.
struct VendorObjects {
    handle: u64,
}

impl Translate for VendorObjects {
    fn object(&self, kind: &'static str, _: u64) -> Result<*mut std::ffi::c_void, CublasStatus> {
        match kind {
            "cublas_handle" => Ok(self.handle as *mut std::ffi::c_void),
            // No compute call takes another object (the stream is the handle's setting).
            _ => Err(CublasStatus::INTERNAL_ERROR),
        }
    }
}

/// A vendor status as the call's result.
fn vendor_status(code: i32) -> Result<(), CublasStatus> {
    if code == SUCCESS { Ok(()) } else { Err(CublasStatus(code)) }
}

impl Session {
    /// The vendor's libcublas, where the backend has it.
    fn vendor_cublas(&self) -> Option<&Cublas> {
        self.backend.cublas()
    }

    /// Run a checked request with the vendor's library, on the handle's vendor handle with the
    /// pointer mode the request's scalars are in; `None` where the backend has no libcublas.
    fn on_vendor<R: VendorCall>(
        &self,
        cx: &CallCx,
        handle: u64,
        mode: Option<i32>,
        req: &R,
    ) -> Option<Result<R::Reply, CublasStatus>> {
        let cublas = self.vendor_cublas()?;
        Some((|| {
            let h = self.blas_handle(handle)?;
            self.blas_work(cx, &h)?;
            self.backend.bind(h.device).map_err(blas_status)?;
            if let Some(mode) = mode.filter(|&m| m != h.raw_pointer_mode) {
                vendor_status(cublas.set_pointer_mode(h.raw, mode))?;
                self.objects.blas.update(handle, |h| h.raw_pointer_mode = mode).map_err(blas_status)?;
            }
            // SAFETY: the dispatch checked every range of the request against the session's
            // memory (and the service the pointer arrays), and `h.raw` is the live handle.
            unsafe { req.call_vendor(&cublas.library, &VendorObjects { handle: h.raw }) }
        })())
    }

    /// Where a compute call starts its work on the handle's stream: taken into the stream's
    /// capture instead, or refused there (`library_work`).
    fn blas_work(&self, cx: &CallCx, h: &BlasHandle) -> Result<(), CublasStatus> {
        self.library_work(cx, h.stream, None, "CUBLAS_STATUS_NOT_SUPPORTED").map_err(|_| CublasStatus::NOT_SUPPORTED)
    }

    /// A handle's settings; an unknown handle is `NOT_INITIALIZED`, logged.
    fn blas_handle(&self, handle: u64) -> Result<BlasHandle, CublasStatus> {
        self.objects.blas.get(handle).map_err(|e| {
            crate::guest_warn!(
                self.id,
                "{handle:#x} is not a cuBLAS handle of the session: CUBLAS_STATUS_NOT_INITIALIZED"
            );
            blas_status(e)
        })
    }

    /// A CPU call on a handle: the stream its work goes on.
    fn blas_call(&self, cx: &CallCx, handle: u64) -> Result<Call<'_>, CublasStatus> {
        self.blas_work(cx, &self.blas_handle(handle)?)?;
        self.blas_reader(handle)
    }

    /// A handle's stream to read a call's operands on, before the call's work starts.
    fn blas_reader(&self, handle: u64) -> Result<Call<'_>, CublasStatus> {
        let h = self.blas_handle(handle)?;
        let stream = self.objects.streams.resolve(h.stream).map_err(blas_status)?;
        Ok(Call { session: self, stream })
    }

    /// The accesses of a batched GEMM's matrices, which the spec cannot name (they are behind
    /// the pointer arrays), for the C/R engine's hook: C written, A and B read.
    fn batched_access(&self, id: FunctionId, arrays: [(&[u64], usize, bool); 3]) -> Result<(), CublasStatus> {
        if !self.hooks.active() {
            return Ok(());
        }
        let device: Vec<DeviceAccess> = arrays
            .iter()
            .flat_map(|(ptrs, len, writes)| {
                ptrs.iter().map(move |&addr| DeviceAccess { addr, len: *len as u64, writes: *writes })
            })
            .collect();
        let access = CallAccess { function: id.name(), device: &device, objects: &[] };
        self.hooks.before_call(&access).map_err(blas_status)
    }

    /// The pointer arrays of a batched GEMM, each matrix checked to lie in the session's
    /// memory (`bytes` of A, B and C), and shown to the C/R engine's hook.
    fn batched_arrays(
        &self,
        id: FunctionId,
        call: &Call<'_>,
        arrays: [&Ptr<'_>; 3],
        batch: usize,
        bytes: [usize; 3],
    ) -> Result<[Vec<u64>; 3], CublasStatus> {
        let a = call.pointer_array(arrays[0], batch, bytes[0])?;
        let b = call.pointer_array(arrays[1], batch, bytes[1])?;
        let c = call.pointer_array(arrays[2], batch, bytes[2])?;
        self.batched_access(id, [(&a, bytes[0], false), (&b, bytes[1], false), (&c, bytes[2], true)])?;
        Ok([a, b, c])
    }

    /// GemmEx's types and scalars, checked against what the guest sent: the sizes it gave
    /// (the spec's extents were computed with them) must be the types' own.
    fn gemm_ex_types(
        &self,
        types: [i32; 3],
        sizes: [i32; 3],
        compute_type: i32,
        scalar_size: i32,
    ) -> Result<(), CublasStatus> {
        let on_cpu = self.vendor_cublas().is_none();
        for (t, s) in types.iter().zip(sizes) {
            if blas::data_type_bytes(*t) != Some(s as u64) {
                return Err(CublasStatus::INVALID_VALUE);
            }
        }
        if blas::compute_scalar_bytes(compute_type, types[2]) != Some(scalar_size as u64) {
            return Err(CublasStatus::INVALID_VALUE);
        }
        if on_cpu && !types.iter().all(|&t| cpu_type(t)) {
            return Err(CublasStatus::NOT_SUPPORTED);
        }
        Ok(())
    }
}

/// Whether a GemmEx computes in double precision (CUBLAS_COMPUTE_64F(_PEDANTIC), CUDA_R_64F).
fn computes_in_f64(compute_type: i32) -> bool {
    matches!(compute_type, 70 | 71 | 1)
}

macro_rules! level1 {
    ($t:ty, $axpy:ident, $axpy_req:ident, $axpy_rep:ident,
     $scal:ident, $scal_req:ident, $scal_rep:ident,
     $copy:ident, $copy_req:ident, $copy_rep:ident,
     $swap:ident, $swap_req:ident, $swap_rep:ident,
     $dot:ident, $dot_req:ident, $dot_rep:ident,
     $nrm2:ident, $nrm2_req:ident, $nrm2_rep:ident,
     $asum:ident, $asum_req:ident, $asum_rep:ident,
     $amax:ident, $amax_req:ident, $amax_rep:ident,
     $amin:ident, $amin_req:ident, $amin_rep:ident) => {
        fn $axpy(&self, cx: &CallCx, req: $axpy_req<'_>) -> Result<$axpy_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let alpha: $t = call.scalar(&req.alpha)?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let mut y = call.values::<$t>(&req.y, cpu_blas::vector_len(n, req.incy.into()))?;
            cpu_blas::axpy(n, alpha, &x, req.incx.into(), &mut y, req.incy.into());
            call.store(&req.y, &y)?;
            Ok($axpy_rep {})
        }

        fn $scal(&self, cx: &CallCx, req: $scal_req<'_>) -> Result<$scal_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let alpha: $t = call.scalar(&req.alpha)?;
            let mut x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            cpu_blas::scal(n, alpha, &mut x, req.incx.into());
            call.store(&req.x, &x)?;
            Ok($scal_rep {})
        }

        fn $copy(&self, cx: &CallCx, req: $copy_req<'_>) -> Result<$copy_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, None, &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let mut y = call.values::<$t>(&req.y, cpu_blas::vector_len(n, req.incy.into()))?;
            cpu_blas::copy(n, &x, req.incx.into(), &mut y, req.incy.into());
            call.store(&req.y, &y)?;
            Ok($copy_rep {})
        }

        fn $swap(&self, cx: &CallCx, req: $swap_req<'_>) -> Result<$swap_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, None, &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let mut x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let mut y = call.values::<$t>(&req.y, cpu_blas::vector_len(n, req.incy.into()))?;
            cpu_blas::swap(n, &mut x, req.incx.into(), &mut y, req.incy.into());
            call.store(&req.x, &x)?;
            call.store(&req.y, &y)?;
            Ok($swap_rep {})
        }

        fn $dot(&self, cx: &CallCx, req: $dot_req<'_>) -> Result<$dot_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let y = call.values::<$t>(&req.y, cpu_blas::vector_len(n, req.incy.into()))?;
            let r = cpu_blas::dot(n, &x, req.incx.into(), &y, req.incy.into());
            Ok($dot_rep { result: call.result(&req.result, cpu_blas::encode(&[r]))? })
        }

        fn $nrm2(&self, cx: &CallCx, req: $nrm2_req<'_>) -> Result<$nrm2_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let r = cpu_blas::nrm2(n, &x, req.incx.into());
            Ok($nrm2_rep { result: call.result(&req.result, cpu_blas::encode(&[r]))? })
        }

        fn $asum(&self, cx: &CallCx, req: $asum_req<'_>) -> Result<$asum_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let r = cpu_blas::asum(n, &x, req.incx.into());
            Ok($asum_rep { result: call.result(&req.result, cpu_blas::encode(&[r]))? })
        }

        fn $amax(&self, cx: &CallCx, req: $amax_req<'_>) -> Result<$amax_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let r = cpu_blas::iamax(n, &x, req.incx.into(), true);
            Ok($amax_rep { result: call.result(&req.result, r.to_le_bytes().to_vec())? })
        }

        fn $amin(&self, cx: &CallCx, req: $amin_req<'_>) -> Result<$amin_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let n = count(req.n)?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(n, req.incx.into()))?;
            let r = cpu_blas::iamax(n, &x, req.incx.into(), false);
            Ok($amin_rep { result: call.result(&req.result, r.to_le_bytes().to_vec())? })
        }
    };
}

macro_rules! level23 {
    ($t:ty, $gemv:ident, $gemv_req:ident, $gemv_rep:ident,
     $ger:ident, $ger_req:ident, $ger_rep:ident,
     $gemm:ident, $gemm_req:ident, $gemm_rep:ident,
     $strided:ident, $strided_req:ident, $strided_rep:ident,
     $batched:ident, $batched_req:ident, $batched_rep:ident, $batched_id:ident) => {
        fn $gemv(&self, cx: &CallCx, req: $gemv_req<'_>) -> Result<$gemv_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let (m, n, lda) = (count(req.m)?, count(req.n)?, count(req.lda)?);
            let trans = req.trans != consts::CUBLAS_OP_N;
            let (xn, yn) = if trans { (m, n) } else { (n, m) };
            let (alpha, beta): ($t, $t) = (call.scalar(&req.alpha)?, call.scalar(&req.beta)?);
            if m == 0 || n == 0 {
                return Ok($gemv_rep {});
            }
            let a = call.values::<$t>(&req.A, cpu_blas::matrix_len(m, n, lda))?;
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(xn, req.incx.into()))?;
            let mut y = call.values::<$t>(&req.y, cpu_blas::vector_len(yn, req.incy.into()))?;
            cpu_blas::gemv(trans, m, n, alpha, &a, lda, &x, req.incx.into(), beta, &mut y, req.incy.into());
            call.store(&req.y, &y)?;
            Ok($gemv_rep {})
        }

        fn $ger(&self, cx: &CallCx, req: $ger_req<'_>) -> Result<$ger_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let (m, n, lda) = (count(req.m)?, count(req.n)?, count(req.lda)?);
            let alpha: $t = call.scalar(&req.alpha)?;
            if m == 0 || n == 0 {
                return Ok($ger_rep {});
            }
            let x = call.values::<$t>(&req.x, cpu_blas::vector_len(m, req.incx.into()))?;
            let y = call.values::<$t>(&req.y, cpu_blas::vector_len(n, req.incy.into()))?;
            let mut a = call.values::<$t>(&req.A, cpu_blas::matrix_len(m, n, lda))?;
            cpu_blas::ger(m, n, alpha, &x, req.incx.into(), &y, req.incy.into(), &mut a, lda);
            call.store(&req.A, &a)?;
            Ok($ger_rep {})
        }

        fn $gemm(&self, cx: &CallCx, req: $gemm_req<'_>) -> Result<$gemm_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let g = Gemm::new(req.transa, req.transb, req.m, req.n, req.k, req.lda, req.ldb, req.ldc)?;
            let (alpha, beta): ($t, $t) = (call.scalar(&req.alpha)?, call.scalar(&req.beta)?);
            g.on_device(&call, alpha, beta, device_address(&req.A), device_address(&req.B), device_address(&req.C))?;
            Ok($gemm_rep {})
        }

        fn $strided(&self, cx: &CallCx, req: $strided_req<'_>) -> Result<$strided_rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let g = Gemm::new(req.transa, req.transb, req.m, req.n, req.k, req.lda, req.ldb, req.ldc)?;
            let (alpha, beta): ($t, $t) = (call.scalar(&req.alpha)?, call.scalar(&req.beta)?);
            let step = |stride: i64| -> Result<u64, CublasStatus> { Ok(count(stride)? as u64 * <$t>::BYTES as u64) };
            let (sa, sb, sc) = (step(req.strideA)?, step(req.strideB)?, step(req.strideC)?);
            let (a, b, c) = (device_address(&req.A), device_address(&req.B), device_address(&req.C));
            for i in 0..count(req.batchCount)? as u64 {
                g.on_device(&call, alpha, beta, a + i * sa, b + i * sb, c + i * sc)?;
            }
            Ok($strided_rep {})
        }

        fn $batched(&self, cx: &CallCx, req: $batched_req<'_>) -> Result<$batched_rep, CublasStatus> {
            let call = self.blas_reader(req.handle)?;
            let g = Gemm::new(req.transa, req.transb, req.m, req.n, req.k, req.lda, req.ldb, req.ldc)?;
            let (la, lb, lc) = g.lens();
            let size = <$t>::BYTES;
            let arrays = [&req.Aarray, &req.Barray, &req.Carray];
            let batch = count(req.batchCount)?;
            let [a, b, c] =
                self.batched_arrays(FunctionId::$batched_id, &call, arrays, batch, [la * size, lb * size, lc * size])?;
            self.blas_work(cx, &self.blas_handle(req.handle)?)?;
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let (alpha, beta): ($t, $t) = (call.scalar(&req.alpha)?, call.scalar(&req.beta)?);
            for i in 0..batch {
                g.on_device(&call, alpha, beta, a[i], b[i], c[i])?;
            }
            Ok($batched_rep {})
        }
    };
}

/// Functions run with the vendor's library only: without one (emu) they answer
/// `CUBLAS_STATUS_NOT_SUPPORTED`, which the guest logs once by name.
/// A complex GEMM (Cgemm, Zgemm; `$half` bytes a part): the vendor's, or the CPU's in f64.
macro_rules! complex_gemm {
    ($method:ident, $req:ident, $rep:ident, $half:expr) => {
        fn $method(&self, cx: &CallCx, req: $req<'_>) -> Result<$rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let (m, n, k) = (count(req.m)?, count(req.n)?, count(req.k)?);
            let (lda, ldb, ldc) = (count(req.lda)?, count(req.ldb)?, count(req.ldc)?);
            let element = 2 * $half;
            let scalar = |p| -> Result<cpu_blas::Complex, CublasStatus> {
                let bytes = call.scalar_bytes(p, element)?;
                Ok(cpu_blas::complex_decode(&bytes, $half)[0])
            };
            let (alpha, beta) = (scalar(&req.alpha)?, scalar(&req.beta)?);
            let lc = cpu_blas::matrix_len(m, n, ldc);
            if lc == 0 {
                return Ok($rep {});
            }
            let la = if req.transa == consts::CUBLAS_OP_N {
                cpu_blas::matrix_len(m, k, lda)
            } else {
                cpu_blas::matrix_len(k, m, lda)
            };
            let lb = if req.transb == consts::CUBLAS_OP_N {
                cpu_blas::matrix_len(k, n, ldb)
            } else {
                cpu_blas::matrix_len(n, k, ldb)
            };
            let load = |p: &Ptr<'_>, len: usize| -> Result<Vec<cpu_blas::Complex>, CublasStatus> {
                Ok(cpu_blas::complex_decode(&call.read(device_address(p), len * element)?, $half))
            };
            let (a, b, mut c) = (load(&req.A, la)?, load(&req.B, lb)?, load(&req.C, lc)?);
            cpu_blas::complex_gemm(
                (req.transa, req.transb),
                (m, n, k),
                alpha,
                (&a, lda),
                (&b, ldb),
                beta,
                (&mut c, ldc),
            );
            call.write(device_address(&req.C), &cpu_blas::complex_encode(&c, $half))?;
            Ok($rep {})
        }
    };
}

/// A triangular solve with several right-hand sides (trsm): the vendor's, or the CPU's.
macro_rules! trsm {
    ($t:ty, $method:ident, $req:ident, $rep:ident) => {
        fn $method(&self, cx: &CallCx, req: $req<'_>) -> Result<$rep, CublasStatus> {
            if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
                return r;
            }
            let call = self.blas_call(cx, req.handle)?;
            let (m, n, lda, ldb) = (count(req.m)?, count(req.n)?, count(req.lda)?, count(req.ldb)?);
            let alpha: $t = call.scalar(&req.alpha)?;
            if m == 0 || n == 0 {
                return Ok($rep {});
            }
            let t = cpu_blas::Triangle {
                left: req.side == consts::CUBLAS_SIDE_LEFT,
                lower: req.uplo == consts::CUBLAS_FILL_MODE_LOWER,
                transpose: req.trans != consts::CUBLAS_OP_N,
                unit: req.diag == consts::CUBLAS_DIAG_UNIT,
            };
            let k = if t.left { m } else { n };
            let a = call.values::<$t>(&req.A, cpu_blas::matrix_len(k, k, lda))?;
            let mut b = call.values::<$t>(&req.B, cpu_blas::matrix_len(m, n, ldb))?;
            cpu_blas::trsm(t, m, n, alpha, &a, lda, &mut b, ldb);
            call.store(&req.B, &b)?;
            Ok($rep {})
        }
    };
}

/// Batched LU factorisation and inversion (getrfBatched, getriBatched): each matrix the
/// pointer arrays name checked to lie in the session's memory, then the vendor's call or the
/// CPU's, one matrix at a time.
macro_rules! lu_batched {
    ($t:ty, $getrf:ident, $getrf_req:ident, $getrf_rep:ident, $getrf_id:ident,
     $getri:ident, $getri_req:ident, $getri_rep:ident, $getri_id:ident) => {
        fn $getrf(&self, cx: &CallCx, req: $getrf_req<'_>) -> Result<$getrf_rep, CublasStatus> {
            // The arrays are checked here; where the work starts is decided once, by the vendor's
            // call or before the CPU's.
            let call = self.blas_reader(req.handle)?;
            let (n, lda, batch) = (count(req.n)?, count(req.lda)?, count(req.batchSize)?);
            let bytes = cpu_blas::matrix_len(n, n, lda) * <$t>::BYTES;
            let a = call.pointer_array(&req.Aarray, batch, bytes)?;
            self.batched_access(FunctionId::$getrf_id, [(&a, bytes, true), (&[], 0, false), (&[], 0, false)])?;
            if let Some(r) = self.on_vendor(cx, req.handle, None, &req) {
                return r;
            }
            self.blas_work(cx, &self.blas_handle(req.handle)?)?;
            let pivots_at = req.PivotArray;
            let mut pivots = vec![0i32; if pivots_at != 0 { n * batch } else { 0 }];
            let mut info = Vec::with_capacity(batch);
            for (i, &addr) in a.iter().enumerate() {
                let mut m: Vec<$t> = cpu_blas::decode(&call.read(addr, bytes)?);
                let p = (pivots_at != 0).then(|| &mut pivots[i * n..(i + 1) * n]);
                info.push(cpu_blas::getrf(n, &mut m, lda, p));
                call.write(addr, &cpu_blas::encode(&m))?;
            }
            if pivots_at != 0 {
                call.write(pivots_at, &pivots.iter().flat_map(|p| p.to_le_bytes()).collect::<Vec<u8>>())?;
            }
            call.write(
                device_address(&req.infoArray),
                &info.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>(),
            )?;
            Ok($getrf_rep {})
        }

        fn $getri(&self, cx: &CallCx, req: $getri_req<'_>) -> Result<$getri_rep, CublasStatus> {
            // The arrays are checked here; where the work starts is decided once, by the vendor's
            // call or before the CPU's.
            let call = self.blas_reader(req.handle)?;
            let (n, lda, ldc, batch) = (count(req.n)?, count(req.lda)?, count(req.ldc)?, count(req.batchSize)?);
            let (a_bytes, c_bytes) =
                (cpu_blas::matrix_len(n, n, lda) * <$t>::BYTES, cpu_blas::matrix_len(n, n, ldc) * <$t>::BYTES);
            let a = call.pointer_array(&req.Aarray, batch, a_bytes)?;
            let c = call.pointer_array(&req.Carray, batch, c_bytes)?;
            self.batched_access(FunctionId::$getri_id, [(&a, a_bytes, false), (&c, c_bytes, true), (&[], 0, false)])?;
            if let Some(r) = self.on_vendor(cx, req.handle, None, &req) {
                return r;
            }
            self.blas_work(cx, &self.blas_handle(req.handle)?)?;
            let pivots_at = req.PivotArray;
            let pivots: Vec<i32> = if pivots_at != 0 {
                let raw = call.read(pivots_at, n * batch * 4)?;
                raw.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            } else {
                Vec::new()
            };
            // Pivots name rows of the matrix (1-based): anything else would index past it.
            if let Some(bad) = pivots.iter().position(|&p| p < 1 || p as usize > n) {
                crate::guest_warn!(
                    self.id,
                    "{}: pivot {bad} is {}, outside 1..={n}: CUBLAS_STATUS_INVALID_VALUE",
                    FunctionId::$getri_id.name(),
                    pivots[bad]
                );
                return Err(CublasStatus::INVALID_VALUE);
            }
            let mut info = Vec::with_capacity(batch);
            for i in 0..batch {
                let lu: Vec<$t> = cpu_blas::decode(&call.read(a[i], a_bytes)?);
                let mut inverse: Vec<$t> = cpu_blas::decode(&call.read(c[i], c_bytes)?);
                let p = (pivots_at != 0).then(|| &pivots[i * n..(i + 1) * n]);
                info.push(cpu_blas::getri(n, &lu, lda, p, &mut inverse, ldc));
                call.write(c[i], &cpu_blas::encode(&inverse))?;
            }
            call.write(
                device_address(&req.infoArray),
                &info.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>(),
            )?;
            Ok($getri_rep {})
        }
    };
}

macro_rules! vendor_only {
    ($($method:ident, $req:ident, $rep:ident, $mode:ident);* $(;)?) => {
        $(fn $method(&self, cx: &CallCx, req: $req<'_>) -> Result<$rep, CublasStatus> {
            self.on_vendor(cx, req.handle, vendor_only!(@mode req $mode), &req).unwrap_or(Err(CublasStatus::NOT_SUPPORTED))
        })*
    };
    (@mode $req:ident scalars) => { Some($req.mode) };
    (@mode $req:ident none) => { None };
}

impl CublasService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CublasStatus> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(blas_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &phos_protocol::spec::RecordFacts<'_>) {
        self.records.record(Function::Cublas(id), cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CublasStatus> {
        // A call that reaches device memory may use the handle's workspace (cublasSetWorkspace)
        // as scratch, a range no argument names: an on-demand restore must not load the image's
        // bytes into it while a call computes there, and a concurrent checkpoint must know it is
        // written.
        let workspace = if access.device.is_empty() {
            None
        } else {
            access
                .objects
                .iter()
                .find(|o| o.kind == "cublas_handle")
                .and_then(|o| self.objects.blas.get(o.value).ok())
                .map(|h| h.workspace)
                .filter(|&(addr, len)| addr != 0 && len != 0)
        };
        let Some((addr, len)) = workspace else {
            return self.hooks.before_call(access).map_err(blas_status);
        };
        let device: Vec<DeviceAccess> =
            access.device.iter().copied().chain([DeviceAccess { addr, len, writes: true }]).collect();
        self.hooks.before_call(&CallAccess { device: &device, ..*access }).map_err(blas_status)
    }

    super::library_capture::capture_hooks!(Cublas);

    fn cublas_create_v2(&self, cx: &CallCx, _: CublasCreateV2Request) -> Result<CublasCreateV2Reply, CublasStatus> {
        self.check_device(cx.device).map_err(|_| CublasStatus::NOT_INITIALIZED)?;
        let full = || {
            tracing::warn!(
                session = self.id,
                "cublasCreate_v2: the session holds {} cuBLAS handles already",
                crate::registry::blas::MAX_BLAS_HANDLES
            );
            CudaError::MemoryAllocation
        };
        // On a GPU, NVIDIA's handle, made on the session's context.
        let raw = match self.vendor_cublas() {
            Some(cublas) => {
                self.backend.bind(cx.device).map_err(blas_status)?;
                cublas.create().map_err(CublasStatus)?
            }
            None => 0,
        };
        let made = self.objects.blas.create(
            cx.device,
            raw,
            &crate::registry::handles::NewHandle { forced: cx.forced(), full: &full },
        );
        match made {
            Ok(handle) => Ok(CublasCreateV2Reply { handle }),
            Err(e) => {
                if let Some(cublas) = self.vendor_cublas().filter(|_| raw != 0) {
                    cublas.destroy(raw);
                }
                Err(blas_status(e))
            }
        }
    }

    fn cublas_destroy_v2(&self, _: &CallCx, req: CublasDestroyV2Request) -> Result<CublasDestroyV2Reply, CublasStatus> {
        let h = self.objects.blas.destroy(req.handle).map_err(blas_status)?;
        if let Some(cublas) = self.vendor_cublas().filter(|_| h.raw != 0) {
            vendor_status(cublas.destroy(h.raw))?;
        }
        Ok(CublasDestroyV2Reply {})
    }

    fn cublas_set_stream_v2(
        &self,
        _: &CallCx,
        req: CublasSetStreamV2Request,
    ) -> Result<CublasSetStreamV2Reply, CublasStatus> {
        // The stream must be one of the session's (or a special one).
        let stream = self.objects.streams.resolve(req.streamId).map_err(|_| CublasStatus::INVALID_VALUE)?;
        let h = self.blas_handle(req.handle)?;
        if let Some(cublas) = self.vendor_cublas() {
            vendor_status(cublas.set_stream(h.raw, stream.cu_stream()))?;
        }
        // As cuBLAS does, setting the stream puts the handle back on its default workspace.
        self.objects
            .blas
            .update(req.handle, |h| {
                h.stream = req.streamId;
                h.workspace = (0, 0);
            })
            .map_err(blas_status)?;
        Ok(CublasSetStreamV2Reply {})
    }

    fn cublas_get_stream_v2(
        &self,
        _: &CallCx,
        req: CublasGetStreamV2Request,
    ) -> Result<CublasGetStreamV2Reply, CublasStatus> {
        Ok(CublasGetStreamV2Reply { streamId: self.blas_handle(req.handle)?.stream })
    }

    fn cublas_set_pointer_mode_v2(
        &self,
        _: &CallCx,
        req: CublasSetPointerModeV2Request,
    ) -> Result<CublasSetPointerModeV2Reply, CublasStatus> {
        self.objects.blas.update(req.handle, |h| h.pointer_mode = req.mode).map_err(blas_status)?;
        Ok(CublasSetPointerModeV2Reply {})
    }

    fn cublas_get_pointer_mode_v2(
        &self,
        _: &CallCx,
        req: CublasGetPointerModeV2Request,
    ) -> Result<CublasGetPointerModeV2Reply, CublasStatus> {
        Ok(CublasGetPointerModeV2Reply { mode: self.blas_handle(req.handle)?.pointer_mode })
    }

    fn cublas_set_math_mode(
        &self,
        _: &CallCx,
        req: CublasSetMathModeRequest,
    ) -> Result<CublasSetMathModeReply, CublasStatus> {
        let h = self.blas_handle(req.handle)?;
        if let Some(cublas) = self.vendor_cublas() {
            vendor_status(cublas.set_math_mode(h.raw, req.mode))?;
        }
        self.objects.blas.update(req.handle, |h| h.math_mode = req.mode).map_err(blas_status)?;
        Ok(CublasSetMathModeReply {})
    }

    fn cublas_get_math_mode(
        &self,
        _: &CallCx,
        req: CublasGetMathModeRequest,
    ) -> Result<CublasGetMathModeReply, CublasStatus> {
        Ok(CublasGetMathModeReply { mode: self.blas_handle(req.handle)?.math_mode })
    }

    fn cublas_set_atomics_mode(
        &self,
        _: &CallCx,
        req: CublasSetAtomicsModeRequest,
    ) -> Result<CublasSetAtomicsModeReply, CublasStatus> {
        let h = self.blas_handle(req.handle)?;
        if let Some(cublas) = self.vendor_cublas() {
            vendor_status(cublas.set_atomics_mode(h.raw, req.mode))?;
        }
        self.objects.blas.update(req.handle, |h| h.atomics_mode = req.mode).map_err(blas_status)?;
        Ok(CublasSetAtomicsModeReply {})
    }

    fn cublas_get_atomics_mode(
        &self,
        _: &CallCx,
        req: CublasGetAtomicsModeRequest,
    ) -> Result<CublasGetAtomicsModeReply, CublasStatus> {
        Ok(CublasGetAtomicsModeReply { mode: self.blas_handle(req.handle)?.atomics_mode })
    }

    fn cublas_set_workspace_v2(
        &self,
        _: &CallCx,
        req: CublasSetWorkspaceV2Request<'_>,
    ) -> Result<CublasSetWorkspaceV2Reply, CublasStatus> {
        let workspace = (device_address(&req.workspace), req.workspaceSizeInBytes);
        let h = self.blas_handle(req.handle)?;
        if let Some(cublas) = self.vendor_cublas() {
            vendor_status(cublas.set_workspace(h.raw, workspace.0, workspace.1))?;
        }
        self.objects.blas.update(req.handle, |h| h.workspace = workspace).map_err(blas_status)?;
        Ok(CublasSetWorkspaceV2Reply {})
    }

    level1!(
        f32,
        cublas_saxpy_v2,
        CublasSaxpyV2Request,
        CublasSaxpyV2Reply,
        cublas_sscal_v2,
        CublasSscalV2Request,
        CublasSscalV2Reply,
        cublas_scopy_v2,
        CublasScopyV2Request,
        CublasScopyV2Reply,
        cublas_sswap_v2,
        CublasSswapV2Request,
        CublasSswapV2Reply,
        cublas_sdot_v2,
        CublasSdotV2Request,
        CublasSdotV2Reply,
        cublas_snrm_2_v2,
        CublasSnrm2V2Request,
        CublasSnrm2V2Reply,
        cublas_sasum_v2,
        CublasSasumV2Request,
        CublasSasumV2Reply,
        cublas_isamax_v2,
        CublasIsamaxV2Request,
        CublasIsamaxV2Reply,
        cublas_isamin_v2,
        CublasIsaminV2Request,
        CublasIsaminV2Reply
    );
    level1!(
        f64,
        cublas_daxpy_v2,
        CublasDaxpyV2Request,
        CublasDaxpyV2Reply,
        cublas_dscal_v2,
        CublasDscalV2Request,
        CublasDscalV2Reply,
        cublas_dcopy_v2,
        CublasDcopyV2Request,
        CublasDcopyV2Reply,
        cublas_dswap_v2,
        CublasDswapV2Request,
        CublasDswapV2Reply,
        cublas_ddot_v2,
        CublasDdotV2Request,
        CublasDdotV2Reply,
        cublas_dnrm_2_v2,
        CublasDnrm2V2Request,
        CublasDnrm2V2Reply,
        cublas_dasum_v2,
        CublasDasumV2Request,
        CublasDasumV2Reply,
        cublas_idamax_v2,
        CublasIdamaxV2Request,
        CublasIdamaxV2Reply,
        cublas_idamin_v2,
        CublasIdaminV2Request,
        CublasIdaminV2Reply
    );
    level23!(
        f32,
        cublas_sgemv_v2,
        CublasSgemvV2Request,
        CublasSgemvV2Reply,
        cublas_sger_v2,
        CublasSgerV2Request,
        CublasSgerV2Reply,
        cublas_sgemm_v2,
        CublasSgemmV2Request,
        CublasSgemmV2Reply,
        cublas_sgemm_strided_batched,
        CublasSgemmStridedBatchedRequest,
        CublasSgemmStridedBatchedReply,
        cublas_sgemm_batched,
        CublasSgemmBatchedRequest,
        CublasSgemmBatchedReply,
        CublasSgemmBatched
    );
    level23!(
        f64,
        cublas_dgemv_v2,
        CublasDgemvV2Request,
        CublasDgemvV2Reply,
        cublas_dger_v2,
        CublasDgerV2Request,
        CublasDgerV2Reply,
        cublas_dgemm_v2,
        CublasDgemmV2Request,
        CublasDgemmV2Reply,
        cublas_dgemm_strided_batched,
        CublasDgemmStridedBatchedRequest,
        CublasDgemmStridedBatchedReply,
        cublas_dgemm_batched,
        CublasDgemmBatchedRequest,
        CublasDgemmBatchedReply,
        CublasDgemmBatched
    );

    lu_batched!(
        f32,
        cublas_sgetrf_batched,
        CublasSgetrfBatchedRequest,
        CublasSgetrfBatchedReply,
        CublasSgetrfBatched,
        cublas_sgetri_batched,
        CublasSgetriBatchedRequest,
        CublasSgetriBatchedReply,
        CublasSgetriBatched
    );
    lu_batched!(
        f64,
        cublas_dgetrf_batched,
        CublasDgetrfBatchedRequest,
        CublasDgetrfBatchedReply,
        CublasDgetrfBatched,
        cublas_dgetri_batched,
        CublasDgetriBatchedRequest,
        CublasDgetriBatchedReply,
        CublasDgetriBatched
    );
    complex_gemm!(cublas_cgemm_v2, CublasCgemmV2Request, CublasCgemmV2Reply, 4);
    complex_gemm!(cublas_zgemm_v2, CublasZgemmV2Request, CublasZgemmV2Reply, 8);
    trsm!(f32, cublas_strsm_v2, CublasStrsmV2Request, CublasStrsmV2Reply);
    trsm!(f64, cublas_dtrsm_v2, CublasDtrsmV2Request, CublasDtrsmV2Reply);

    vendor_only!(
        cublas_strsv_v2, CublasStrsvV2Request, CublasStrsvV2Reply, none;
        cublas_dtrsv_v2, CublasDtrsvV2Request, CublasDtrsvV2Reply, none;
        cublas_ssymm_v2, CublasSsymmV2Request, CublasSsymmV2Reply, scalars;
        cublas_dsymm_v2, CublasDsymmV2Request, CublasDsymmV2Reply, scalars;
        cublas_ssyrk_v2, CublasSsyrkV2Request, CublasSsyrkV2Reply, scalars;
        cublas_dsyrk_v2, CublasDsyrkV2Request, CublasDsyrkV2Reply, scalars;
        cublas_sgeam, CublasSgeamRequest, CublasSgeamReply, scalars;
        cublas_dgeam, CublasDgeamRequest, CublasDgeamReply, scalars;
    );

    fn cublas_gemm_ex(&self, cx: &CallCx, req: CublasGemmExRequest<'_>) -> Result<CublasGemmExReply, CublasStatus> {
        self.gemm_ex_types(
            [req.Atype, req.Btype, req.Ctype],
            [req.a_size, req.b_size, req.c_size],
            req.computeType,
            req.scalar_size,
        )?;
        if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
            return r;
        }
        let call = self.blas_call(cx, req.handle)?;
        let g = Gemm::new(req.transa, req.transb, req.m, req.n, req.k, req.lda, req.ldb, req.ldc)?;
        let scalar = |p| {
            call.scalar_bytes(p, req.scalar_size as usize)
                .and_then(|b| cpu_blas::scalar_f64(&b).ok_or(CublasStatus::NOT_SUPPORTED))
        };
        let (alpha, beta) = (scalar(&req.alpha)?, scalar(&req.beta)?);
        let operands = (
            (device_address(&req.A), req.Atype),
            (device_address(&req.B), req.Btype),
            (device_address(&req.C), req.Ctype),
        );
        if computes_in_f64(req.computeType) {
            g.typed_on_device::<f64>(&call, alpha, beta, operands.0, operands.1, operands.2)?;
        } else {
            g.typed_on_device::<f32>(&call, alpha, beta, operands.0, operands.1, operands.2)?;
        }
        Ok(CublasGemmExReply {})
    }

    fn cublas_gemm_strided_batched_ex(
        &self,
        cx: &CallCx,
        req: CublasGemmStridedBatchedExRequest<'_>,
    ) -> Result<CublasGemmStridedBatchedExReply, CublasStatus> {
        self.gemm_ex_types(
            [req.Atype, req.Btype, req.Ctype],
            [req.a_size, req.b_size, req.c_size],
            req.computeType,
            req.scalar_size,
        )?;
        if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
            return r;
        }
        let call = self.blas_call(cx, req.handle)?;
        let g = Gemm::new(req.transa, req.transb, req.m, req.n, req.k, req.lda, req.ldb, req.ldc)?;
        let scalar = |p| {
            call.scalar_bytes(p, req.scalar_size as usize)
                .and_then(|b| cpu_blas::scalar_f64(&b).ok_or(CublasStatus::NOT_SUPPORTED))
        };
        let (alpha, beta) = (scalar(&req.alpha)?, scalar(&req.beta)?);
        let step = |stride: i64, size: i32| -> Result<u64, CublasStatus> { Ok(count(stride)? as u64 * size as u64) };
        let (sa, sb, sc) =
            (step(req.strideA, req.a_size)?, step(req.strideB, req.b_size)?, step(req.strideC, req.c_size)?);
        let (a, b, c) = (device_address(&req.A), device_address(&req.B), device_address(&req.C));
        for i in 0..count(req.batchCount)? as u64 {
            let ops = ((a + i * sa, req.Atype), (b + i * sb, req.Btype), (c + i * sc, req.Ctype));
            if computes_in_f64(req.computeType) {
                g.typed_on_device::<f64>(&call, alpha, beta, ops.0, ops.1, ops.2)?;
            } else {
                g.typed_on_device::<f32>(&call, alpha, beta, ops.0, ops.1, ops.2)?;
            }
        }
        Ok(CublasGemmStridedBatchedExReply {})
    }

    fn cublas_gemm_batched_ex(
        &self,
        cx: &CallCx,
        req: CublasGemmBatchedExRequest<'_>,
    ) -> Result<CublasGemmBatchedExReply, CublasStatus> {
        self.gemm_ex_types(
            [req.Atype, req.Btype, req.Ctype],
            [req.a_size, req.b_size, req.c_size],
            req.computeType,
            req.scalar_size,
        )?;
        let call = self.blas_reader(req.handle)?;
        let g = Gemm::new(req.transa, req.transb, req.m, req.n, req.k, req.lda, req.ldb, req.ldc)?;
        let batch = count(req.batchCount)?;
        let (la, lb, lc) = g.lens();
        let bytes = [la * req.a_size as usize, lb * req.b_size as usize, lc * req.c_size as usize];
        let arrays = [&req.Aarray, &req.Barray, &req.Carray];
        let [a, b, c] = self.batched_arrays(FunctionId::CublasGemmBatchedEx, &call, arrays, batch, bytes)?;
        self.blas_work(cx, &self.blas_handle(req.handle)?)?;
        if let Some(r) = self.on_vendor(cx, req.handle, Some(req.mode), &req) {
            return r;
        }
        let scalar = |p| {
            call.scalar_bytes(p, req.scalar_size as usize)
                .and_then(|b| cpu_blas::scalar_f64(&b).ok_or(CublasStatus::NOT_SUPPORTED))
        };
        let (alpha, beta) = (scalar(&req.alpha)?, scalar(&req.beta)?);
        for i in 0..batch {
            let ops = ((a[i], req.Atype), (b[i], req.Btype), (c[i], req.Ctype));
            if computes_in_f64(req.computeType) {
                g.typed_on_device::<f64>(&call, alpha, beta, ops.0, ops.1, ops.2)?;
            } else {
                g.typed_on_device::<f32>(&call, alpha, beta, ops.0, ops.1, ops.2)?;
            }
        }
        Ok(CublasGemmBatchedExReply {})
    }
}
