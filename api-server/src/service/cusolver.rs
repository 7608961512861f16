//! cuSOLVER's dense functions (`spec/cusolver.lapis`) on the session: handles live in
//! [`crate::registry::solver`], their stream is a runtime stream, their matrices, pivots,
//! workspaces and `devInfo` the session's device memory (the generated dispatch has checked
//! every range the spec gives). The factorisations run with the backend's libcusolver where it
//! has one (the generated calls of `crate::vendor::cusolver`, on a vendor handle made on the
//! session's context), after the service has asked libcusolver's own workspace query and
//! checked the program's workspace against it; otherwise on [`crate::cpu_solver`], reading and
//! writing operands through the backend's copies on the handle's stream (emu).

use phos_protocol::CudaError;
use phos_protocol::apis::Function;
use phos_protocol::cusolver::*;
use phos_protocol::spec::{CallAccess, DeviceAccess};

use super::device_io::{self, device_address};
use super::{CallCx, Session};
use crate::backend::StreamRef;
use crate::backend::vendor::Cusolver;
use crate::cpu_blas::{self, Real};
use crate::cpu_solver::{self, Apply, Job};
use crate::dispatch::cudart::CudartService;
use crate::dispatch::cusolver::CusolverService;
use crate::registry::solver::SolverHandle;
use crate::vendor::cusolver::{Translate, VendorCall};

/// A runtime failure as cuSOLVER reports it: an unknown handle is `NOT_INITIALIZED`, a table at
/// its limit `ALLOC_FAILED`, a bad address or size `INVALID_VALUE`, a failed device access
/// `MAPPING_ERROR`.
fn solver_status(e: CudaError) -> CusolverStatus {
    match e {
        CudaError::InvalidResourceHandle => CusolverStatus::NOT_INITIALIZED,
        CudaError::MemoryAllocation => CusolverStatus::ALLOC_FAILED,
        CudaError::InvalidValue => CusolverStatus::INVALID_VALUE,
        CudaError::NotSupported => CusolverStatus::NOT_SUPPORTED,
        _ => CusolverStatus::MAPPING_ERROR,
    }
}

/// A size from a call's integer (the dispatch has checked it is not negative).
fn count(v: i32) -> Result<usize, CusolverStatus> {
    usize::try_from(v).map_err(|_| CusolverStatus::INVALID_VALUE)
}

/// What one call on the CPU works with: the session, and the stream its handle's work is
/// ordered on.
struct Call<'s> {
    session: &'s Session,
    stream: StreamRef,
}

impl Call<'_> {
    fn read(&self, addr: u64, bytes: usize) -> Result<Vec<u8>, CusolverStatus> {
        device_io::read(self.session, self.stream, addr, bytes).map_err(solver_status)
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), CusolverStatus> {
        device_io::write(self.session, self.stream, addr, bytes).map_err(solver_status)
    }

    /// `elements` values of type `T` at `addr`, as `f64`.
    fn load<T: Real>(&self, addr: u64, elements: usize) -> Result<Vec<f64>, CusolverStatus> {
        let values: Vec<T> = cpu_blas::decode(&self.read(addr, elements * T::BYTES)?);
        Ok(values.into_iter().map(Real::to_f64).collect())
    }

    fn store<T: Real>(&self, addr: u64, values: &[f64]) -> Result<(), CusolverStatus> {
        let values: Vec<T> = values.iter().map(|&v| T::from_f64(v)).collect();
        self.write(addr, &cpu_blas::encode(&values))
    }

    fn load_ints(&self, addr: u64, n: usize) -> Result<Vec<i32>, CusolverStatus> {
        let raw = self.read(addr, n * 4)?;
        Ok(raw.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    fn store_ints(&self, addr: u64, values: &[i32]) -> Result<(), CusolverStatus> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(addr, &bytes)
    }

    /// LAPACK's `info`, into `devInfo`.
    fn info(&self, dev_info: u64, info: i32) -> Result<(), CusolverStatus> {
        self.store_ints(dev_info, &[info])
    }
}

/// The vendor's objects of one call: its handle.
struct VendorObjects {
    handle: u64,
}

impl Translate for VendorObjects {
    fn object(&self, kind: &'static str, _: u64) -> Result<*mut std::ffi::c_void, CusolverStatus> {
        match kind {
            "cusolver_dn_handle" => Ok(self.handle as *mut std::ffi::c_void),
            // No call takes another object (the stream is the handle's setting).
            _ => Err(CusolverStatus::INTERNAL_ERROR),
        }
    }
}

fn vendor_status(code: i32) -> Result<(), CusolverStatus> {
    if code == SUCCESS { Ok(()) } else { Err(CusolverStatus(code)) }
}

/// LAPACK's smallest workspaces (in elements), which the CPU implementation answers the
/// `_bufferSize` queries with: it needs none, and a program allocates what it is told.
mod lapack_lwork {
    pub fn getrf(_: usize, n: usize) -> usize {
        n.max(1)
    }
    pub fn potrf(n: usize) -> usize {
        n.max(1)
    }
    pub fn geqrf(n: usize) -> usize {
        n.max(1)
    }
    pub fn ormqr(left: bool, m: usize, n: usize) -> usize {
        (if left { n } else { m }).max(1)
    }
    pub fn syevd(vectors: bool, n: usize) -> usize {
        if vectors { 1 + 6 * n + 2 * n * n } else { 2 * n + 1 }
    }
    pub fn gesvd(m: usize, n: usize) -> usize {
        (3 * n + m).max(5 * n).max(1)
    }
}

impl Session {
    fn vendor_cusolver(&self) -> Option<&Cusolver> {
        self.backend.cusolver()
    }

    /// A handle's state; an unknown handle is `NOT_INITIALIZED`, logged.
    fn solver_handle(&self, handle: u64) -> Result<SolverHandle, CusolverStatus> {
        self.objects.solver.get(handle).map_err(|e| {
            crate::guest_warn!(
                self.id,
                "{handle:#x} is not a cuSOLVER handle of the session: CUSOLVER_STATUS_NOT_INITIALIZED"
            );
            solver_status(e)
        })
    }

    /// Where a call starts its work on the handle's stream: refused while the stream is being
    /// captured (`library_work`): cuSOLVER's routines hand their outcome back through `info`
    /// and their size queries to the host, and a graph of them is not carried.
    fn solver_work(&self, cx: &CallCx, h: &SolverHandle) -> Result<(), CusolverStatus> {
        let why =
            "cuSOLVER's routines are not carried in graphs (they report through info, which a program reads back)";
        self.library_work(cx, h.stream, Some(why), "CUSOLVER_STATUS_NOT_SUPPORTED")
            .map_err(|_| CusolverStatus::NOT_SUPPORTED)
    }

    /// A CPU call on a handle: the stream its work goes on.
    fn solver_call(&self, cx: &CallCx, handle: u64) -> Result<Call<'_>, CusolverStatus> {
        let h = self.solver_handle(handle)?;
        self.solver_work(cx, &h)?;
        let stream = self.objects.streams.resolve(h.stream).map_err(solver_status)?;
        Ok(Call { session: self, stream })
    }

    /// Run a checked request with the vendor's library on the handle's vendor handle; `None`
    /// where the backend has no libcusolver.
    fn solver_on_vendor<R: VendorCall>(
        &self,
        cx: &CallCx,
        handle: u64,
        req: &R,
    ) -> Option<Result<R::Reply, CusolverStatus>> {
        let solver = self.vendor_cusolver()?;
        Some((|| {
            let h = self.solver_handle(handle)?;
            self.solver_work(cx, &h)?;
            self.backend.bind(h.device).map_err(solver_status)?;
            // SAFETY: the dispatch checked every range of the request against the session's
            // memory, the service checked the workspace against libcusolver's own query, and
            // `h.raw` is the live handle.
            unsafe { req.call_vendor(&solver.library, &VendorObjects { handle: h.raw }) }
        })())
    }

    /// The workspace a compute call gives libcusolver must hold what libcusolver's own query
    /// asks for (`needed` elements of `bytes` each): a smaller one would let the vendor write
    /// past the program's allocation. `given` is the program's `Lwork`.
    fn check_workspace(&self, cx: &CallCx, needed: i32, given: i32) -> Result<(), CusolverStatus> {
        let name = cx.function.map_or("cuSOLVER", |f| f.name());
        if given < needed {
            crate::guest_warn!(
                self.id,
                "{name}: a workspace of {given} elements where libcusolver asks for {needed}: \
                 CUSOLVER_STATUS_INVALID_VALUE"
            );
            return Err(CusolverStatus::INVALID_VALUE);
        }
        Ok(())
    }

    /// getrf takes no workspace size: the workspace at `addr` must be the session's memory for
    /// what libcusolver's query asks, and is shown to the C/R engine's hook as written.
    fn check_getrf_workspace(&self, id: FunctionId, addr: u64, bytes: u64) -> Result<(), CusolverStatus> {
        if bytes > 0 && !self.objects.memory.contains(addr, bytes) {
            crate::guest_warn!(
                self.id,
                "{}: the workspace at {addr:#x} does not hold the {bytes} bytes libcusolver asks for: \
                 CUSOLVER_STATUS_INVALID_VALUE",
                id.name()
            );
            return Err(CusolverStatus::INVALID_VALUE);
        }
        if bytes > 0 && self.hooks.active() {
            let device = [DeviceAccess { addr, len: bytes, writes: true }];
            let access = CallAccess { function: id.name(), device: &device, objects: &[] };
            self.hooks.before_call(&access).map_err(solver_status)?;
        }
        Ok(())
    }
}

/// The factorisations of one precision, on the CPU (`emu`) or with libcusolver.
macro_rules! precision {
    ($t:ty,
     $getrf_bs:ident, $getrf_bs_req:ident, $getrf_bs_rep:ident,
     $getrf:ident, $getrf_req:ident, $getrf_rep:ident, $getrf_id:ident,
     $getrs:ident, $getrs_req:ident, $getrs_rep:ident,
     $potrf_bs:ident, $potrf_bs_req:ident, $potrf_bs_rep:ident,
     $potrf:ident, $potrf_req:ident, $potrf_rep:ident,
     $potrs:ident, $potrs_req:ident, $potrs_rep:ident,
     $geqrf_bs:ident, $geqrf_bs_req:ident, $geqrf_bs_rep:ident,
     $geqrf:ident, $geqrf_req:ident, $geqrf_rep:ident,
     $ormqr_bs:ident, $ormqr_bs_req:ident, $ormqr_bs_rep:ident,
     $ormqr:ident, $ormqr_req:ident, $ormqr_rep:ident,
     $syevd_bs:ident, $syevd_bs_req:ident, $syevd_bs_rep:ident,
     $syevd:ident, $syevd_req:ident, $syevd_rep:ident,
     $gesvd_bs:ident, $gesvd_bs_req:ident, $gesvd_bs_rep:ident,
     $gesvd:ident, $gesvd_req:ident, $gesvd_rep:ident) => {
        fn $getrf_bs(&self, cx: &CallCx, req: $getrf_bs_req) -> Result<$getrf_bs_rep, CusolverStatus> {
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            self.solver_handle(req.handle)?;
            let lwork = lapack_lwork::getrf(count(req.m)?, count(req.n)?);
            Ok($getrf_bs_rep { Lwork: lwork.try_into().map_err(|_| CusolverStatus::INVALID_VALUE)? })
        }

        fn $getrf(&self, cx: &CallCx, req: $getrf_req<'_>) -> Result<$getrf_rep, CusolverStatus> {
            if self.vendor_cusolver().is_some() {
                let query =
                    $getrf_bs_req { handle: req.handle, m: req.m, n: req.n, A: device_address(&req.A), lda: req.lda };
                if let Some(needed) = self.solver_on_vendor(cx, req.handle, &query) {
                    let bytes = u64::try_from(needed?.Lwork).unwrap_or(0) * <$t>::BYTES as u64;
                    self.check_getrf_workspace(FunctionId::$getrf_id, req.work, bytes)?;
                }
            }
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let call = self.solver_call(cx, req.handle)?;
            let (m, n, lda) = (count(req.m)?, count(req.n)?, count(req.lda)?);
            let a_addr = device_address(&req.A);
            let mut a = call.load::<$t>(a_addr, cpu_blas::matrix_len(m, n, lda))?;
            let pivots = device_address(&req.devIpiv);
            let mut ipiv = vec![0i32; m.min(n)];
            let info = cpu_solver::getrf(m, n, &mut a, lda, (pivots != 0).then_some(&mut ipiv[..]));
            call.store::<$t>(a_addr, &a)?;
            if pivots != 0 {
                call.store_ints(pivots, &ipiv)?;
            }
            call.info(req.devInfo, info)?;
            Ok($getrf_rep {})
        }

        fn $getrs(&self, cx: &CallCx, req: $getrs_req<'_>) -> Result<$getrs_rep, CusolverStatus> {
            // The pivots are device memory the program may have written: each must name a row
            // of the matrix (libcusolver would swap rows of B past its end).
            let call = self.solver_call(cx, req.handle)?;
            let n = count(req.n)?;
            let rows = match cpu_solver::pivot_rows(&call.load_ints(device_address(&req.devIpiv), n)?) {
                Ok(rows) => rows,
                Err(e) => {
                    let name = cx.function.map_or("getrs", |f| f.name());
                    crate::guest_warn!(self.id, "{name}: {e}: CUSOLVER_STATUS_INVALID_VALUE");
                    return Err(CusolverStatus::INVALID_VALUE);
                }
            };
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let (nrhs, lda, ldb) = (count(req.nrhs)?, count(req.lda)?, count(req.ldb)?);
            let a = call.load::<$t>(device_address(&req.A), cpu_blas::matrix_len(n, n, lda))?;
            let b_addr = device_address(&req.B);
            let mut b = call.load::<$t>(b_addr, cpu_blas::matrix_len(n, nrhs, ldb))?;
            let trans = req.trans != consts::CUBLAS_OP_N;
            cpu_solver::getrs(trans, n, nrhs, &a, lda, &rows, &mut b, ldb);
            call.store::<$t>(b_addr, &b)?;
            call.info(req.devInfo, 0)?;
            Ok($getrs_rep {})
        }

        fn $potrf_bs(&self, cx: &CallCx, req: $potrf_bs_req) -> Result<$potrf_bs_rep, CusolverStatus> {
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            self.solver_handle(req.handle)?;
            let lwork = lapack_lwork::potrf(count(req.n)?);
            Ok($potrf_bs_rep { Lwork: lwork.try_into().map_err(|_| CusolverStatus::INVALID_VALUE)? })
        }

        fn $potrf(&self, cx: &CallCx, req: $potrf_req<'_>) -> Result<$potrf_rep, CusolverStatus> {
            if self.vendor_cusolver().is_some() {
                let query = $potrf_bs_req {
                    handle: req.handle,
                    uplo: req.uplo,
                    n: req.n,
                    A: device_address(&req.A),
                    lda: req.lda,
                };
                if let Some(needed) = self.solver_on_vendor(cx, req.handle, &query) {
                    self.check_workspace(cx, needed?.Lwork, req.Lwork)?;
                }
            }
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let call = self.solver_call(cx, req.handle)?;
            let (n, lda) = (count(req.n)?, count(req.lda)?);
            let a_addr = device_address(&req.A);
            let mut a = call.load::<$t>(a_addr, cpu_blas::matrix_len(n, n, lda))?;
            let info = cpu_solver::potrf(req.uplo == consts::CUBLAS_FILL_MODE_LOWER, n, &mut a, lda);
            call.store::<$t>(a_addr, &a)?;
            call.info(req.devInfo, info)?;
            Ok($potrf_rep {})
        }

        fn $potrs(&self, cx: &CallCx, req: $potrs_req<'_>) -> Result<$potrs_rep, CusolverStatus> {
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let call = self.solver_call(cx, req.handle)?;
            let (n, nrhs, lda, ldb) = (count(req.n)?, count(req.nrhs)?, count(req.lda)?, count(req.ldb)?);
            let a = call.load::<$t>(device_address(&req.A), cpu_blas::matrix_len(n, n, lda))?;
            let b_addr = device_address(&req.B);
            let mut b = call.load::<$t>(b_addr, cpu_blas::matrix_len(n, nrhs, ldb))?;
            cpu_solver::potrs(req.uplo == consts::CUBLAS_FILL_MODE_LOWER, n, nrhs, &a, lda, &mut b, ldb);
            call.store::<$t>(b_addr, &b)?;
            call.info(req.devInfo, 0)?;
            Ok($potrs_rep {})
        }

        fn $geqrf_bs(&self, cx: &CallCx, req: $geqrf_bs_req) -> Result<$geqrf_bs_rep, CusolverStatus> {
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            self.solver_handle(req.handle)?;
            let lwork = lapack_lwork::geqrf(count(req.n)?);
            Ok($geqrf_bs_rep { Lwork: lwork.try_into().map_err(|_| CusolverStatus::INVALID_VALUE)? })
        }

        fn $geqrf(&self, cx: &CallCx, req: $geqrf_req<'_>) -> Result<$geqrf_rep, CusolverStatus> {
            if self.vendor_cusolver().is_some() {
                let query =
                    $geqrf_bs_req { handle: req.handle, m: req.m, n: req.n, A: device_address(&req.A), lda: req.lda };
                if let Some(needed) = self.solver_on_vendor(cx, req.handle, &query) {
                    self.check_workspace(cx, needed?.Lwork, req.Lwork)?;
                }
            }
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let call = self.solver_call(cx, req.handle)?;
            let (m, n, lda) = (count(req.m)?, count(req.n)?, count(req.lda)?);
            let a_addr = device_address(&req.A);
            let mut a = call.load::<$t>(a_addr, cpu_blas::matrix_len(m, n, lda))?;
            let mut tau = vec![0.0; m.min(n)];
            cpu_solver::geqrf(m, n, &mut a, lda, &mut tau);
            call.store::<$t>(a_addr, &a)?;
            call.store::<$t>(device_address(&req.TAU), &tau)?;
            call.info(req.devInfo, 0)?;
            Ok($geqrf_rep {})
        }

        fn $ormqr_bs(&self, cx: &CallCx, req: $ormqr_bs_req) -> Result<$ormqr_bs_rep, CusolverStatus> {
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            self.solver_handle(req.handle)?;
            let lwork = lapack_lwork::ormqr(req.side == consts::CUBLAS_SIDE_LEFT, count(req.m)?, count(req.n)?);
            Ok($ormqr_bs_rep { Lwork: lwork.try_into().map_err(|_| CusolverStatus::INVALID_VALUE)? })
        }

        fn $ormqr(&self, cx: &CallCx, req: $ormqr_req<'_>) -> Result<$ormqr_rep, CusolverStatus> {
            if self.vendor_cusolver().is_some() {
                let query = $ormqr_bs_req {
                    handle: req.handle,
                    side: req.side,
                    trans: req.trans,
                    m: req.m,
                    n: req.n,
                    k: req.k,
                    A: device_address(&req.A),
                    lda: req.lda,
                    tau: device_address(&req.tau),
                    C: device_address(&req.C),
                    ldc: req.ldc,
                };
                if let Some(needed) = self.solver_on_vendor(cx, req.handle, &query) {
                    self.check_workspace(cx, needed?.Lwork, req.Lwork)?;
                }
            }
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let call = self.solver_call(cx, req.handle)?;
            let (m, n, k, lda, ldc) = (count(req.m)?, count(req.n)?, count(req.k)?, count(req.lda)?, count(req.ldc)?);
            let left = req.side == consts::CUBLAS_SIDE_LEFT;
            let a = call.load::<$t>(device_address(&req.A), cpu_blas::matrix_len(if left { m } else { n }, k, lda))?;
            let tau = call.load::<$t>(device_address(&req.tau), k)?;
            let c_addr = device_address(&req.C);
            let mut c = call.load::<$t>(c_addr, cpu_blas::matrix_len(m, n, ldc))?;
            let how = Apply { left, trans: req.trans != consts::CUBLAS_OP_N };
            cpu_solver::ormqr(how, m, n, k, &a, lda, &tau, &mut c, ldc);
            call.store::<$t>(c_addr, &c)?;
            call.info(req.devInfo, 0)?;
            Ok($ormqr_rep {})
        }

        fn $syevd_bs(&self, cx: &CallCx, req: $syevd_bs_req) -> Result<$syevd_bs_rep, CusolverStatus> {
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            self.solver_handle(req.handle)?;
            let lwork = lapack_lwork::syevd(req.jobz == consts::CUSOLVER_EIG_MODE_VECTOR, count(req.n)?);
            Ok($syevd_bs_rep { Lwork: lwork.try_into().map_err(|_| CusolverStatus::INVALID_VALUE)? })
        }

        fn $syevd(&self, cx: &CallCx, req: $syevd_req<'_>) -> Result<$syevd_rep, CusolverStatus> {
            if self.vendor_cusolver().is_some() {
                let query = $syevd_bs_req {
                    handle: req.handle,
                    jobz: req.jobz,
                    uplo: req.uplo,
                    n: req.n,
                    A: device_address(&req.A),
                    lda: req.lda,
                    W: device_address(&req.W),
                };
                if let Some(needed) = self.solver_on_vendor(cx, req.handle, &query) {
                    self.check_workspace(cx, needed?.Lwork, req.Lwork)?;
                }
            }
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let call = self.solver_call(cx, req.handle)?;
            let (n, lda) = (count(req.n)?, count(req.lda)?);
            let a_addr = device_address(&req.A);
            let mut a = call.load::<$t>(a_addr, cpu_blas::matrix_len(n, n, lda))?;
            let mut w = vec![0.0; n];
            let vectors = req.jobz == consts::CUSOLVER_EIG_MODE_VECTOR;
            let lower = req.uplo == consts::CUBLAS_FILL_MODE_LOWER;
            let info = match cpu_solver::syevd(vectors, lower, n, &mut a, lda, &mut w) {
                Ok(()) => 0,
                // LAPACK's answer when the iteration fails: info > 0.
                Err(_) => 1,
            };
            call.store::<$t>(a_addr, &a)?;
            call.store::<$t>(device_address(&req.W), &w)?;
            call.info(req.devInfo, info)?;
            Ok($syevd_rep {})
        }

        fn $gesvd_bs(&self, cx: &CallCx, req: $gesvd_bs_req) -> Result<$gesvd_bs_rep, CusolverStatus> {
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            self.solver_handle(req.handle)?;
            let lwork = lapack_lwork::gesvd(count(req.m)?, count(req.n)?);
            Ok($gesvd_bs_rep { Lwork: lwork.try_into().map_err(|_| CusolverStatus::INVALID_VALUE)? })
        }

        fn $gesvd(&self, cx: &CallCx, req: $gesvd_req<'_>) -> Result<$gesvd_rep, CusolverStatus> {
            if self.vendor_cusolver().is_some() {
                let query = $gesvd_bs_req { handle: req.handle, m: req.m, n: req.n };
                if let Some(needed) = self.solver_on_vendor(cx, req.handle, &query) {
                    self.check_workspace(cx, needed?.Lwork, req.Lwork)?;
                }
            }
            if let Some(r) = self.solver_on_vendor(cx, req.handle, &req) {
                return r;
            }
            let call = self.solver_call(cx, req.handle)?;
            let (m, n, lda) = (count(req.m)?, count(req.n)?, count(req.lda)?);
            let (Some(jobu), Some(jobvt)) = (Job::from_char(req.jobu), Job::from_char(req.jobvt)) else {
                return Err(CusolverStatus::INVALID_VALUE);
            };
            let ucols = match jobu {
                Job::All => m,
                Job::Some | Job::Overwrite => n,
                Job::None => 0,
            };
            let a_addr = device_address(&req.A);
            let mut a = call.load::<$t>(a_addr, cpu_blas::matrix_len(m, n, lda))?;
            let svd = match cpu_solver::gesvd(m, n, &a, lda, ucols) {
                Ok(svd) => svd,
                Err(_) => {
                    call.info(req.devInfo, 1)?;
                    return Ok($gesvd_rep {});
                }
            };
            call.store::<$t>(device_address(&req.S), &svd.s)?;
            // U: into U (ldu apart), or into A's first n columns; V^T into VT or A's first n rows.
            let copy_into = |dst: &mut [f64], ld: usize, src: &[f64], src_ld: usize, rows: usize, cols: usize| {
                for j in 0..cols {
                    for i in 0..rows {
                        dst[i + j * ld] = src[i + j * src_ld];
                    }
                }
            };
            match jobu {
                Job::All | Job::Some => {
                    // What lies between the columns (ldu > m) is the program's and stays.
                    let u_addr = device_address(&req.U);
                    let ldu = count(req.ldu)?;
                    let mut u = call.load::<$t>(u_addr, cpu_blas::matrix_len(m, svd.ucols, ldu))?;
                    copy_into(&mut u, ldu, &svd.u, m, m, svd.ucols);
                    call.store::<$t>(u_addr, &u)?;
                }
                Job::Overwrite => copy_into(&mut a, lda, &svd.u, m, m, n),
                Job::None => {}
            }
            match jobvt {
                Job::All | Job::Some => {
                    let ldvt = count(req.ldvt)?;
                    let vt_addr = device_address(&req.VT);
                    let mut vt = call.load::<$t>(vt_addr, cpu_blas::matrix_len(n, n, ldvt))?;
                    copy_into(&mut vt, ldvt, &svd.vt, n, n, n);
                    call.store::<$t>(vt_addr, &vt)?;
                }
                Job::Overwrite => copy_into(&mut a, lda, &svd.vt, n, n, n),
                Job::None => {}
            }
            if jobu == Job::Overwrite || jobvt == Job::Overwrite {
                call.store::<$t>(a_addr, &a)?;
            }
            call.info(req.devInfo, 0)?;
            Ok($gesvd_rep {})
        }
    };
}

impl CusolverService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CusolverStatus> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(solver_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &phos_protocol::spec::RecordFacts<'_>) {
        self.records.record(Function::Cusolver(id), cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CusolverStatus> {
        self.hooks.before_call(access).map_err(solver_status)
    }

    fn cusolver_dn_create(
        &self,
        cx: &CallCx,
        _: CusolverDnCreateRequest,
    ) -> Result<CusolverDnCreateReply, CusolverStatus> {
        self.check_device(cx.device).map_err(|_| CusolverStatus::NOT_INITIALIZED)?;
        let full = || {
            tracing::warn!(
                session = self.id,
                "cusolverDnCreate: the session holds {} cuSOLVER handles already",
                crate::registry::solver::MAX_SOLVER_HANDLES
            );
            CudaError::MemoryAllocation
        };
        // On a GPU, NVIDIA's handle, made on the session's context.
        let raw = match self.vendor_cusolver() {
            Some(solver) => {
                self.backend.bind(cx.device).map_err(solver_status)?;
                solver.create().map_err(CusolverStatus)?
            }
            None => 0,
        };
        let made = self.objects.solver.create(
            cx.device,
            raw,
            &crate::registry::handles::NewHandle { forced: cx.forced(), full: &full },
        );
        match made {
            Ok(handle) => Ok(CusolverDnCreateReply { handle }),
            Err(e) => {
                if let Some(solver) = self.vendor_cusolver().filter(|_| raw != 0) {
                    solver.destroy(raw);
                }
                Err(solver_status(e))
            }
        }
    }

    fn cusolver_dn_destroy(
        &self,
        _: &CallCx,
        req: CusolverDnDestroyRequest,
    ) -> Result<CusolverDnDestroyReply, CusolverStatus> {
        let h = self.objects.solver.destroy(req.handle).map_err(|e| {
            crate::guest_warn!(self.id, "cusolverDnDestroy: {:#x} is not a cuSOLVER handle of the session", req.handle);
            solver_status(e)
        })?;
        if let Some(solver) = self.vendor_cusolver().filter(|_| h.raw != 0) {
            vendor_status(solver.destroy(h.raw))?;
        }
        Ok(CusolverDnDestroyReply {})
    }

    fn cusolver_dn_set_stream(
        &self,
        _: &CallCx,
        req: CusolverDnSetStreamRequest,
    ) -> Result<CusolverDnSetStreamReply, CusolverStatus> {
        // The stream must be one of the session's (or a special one).
        let stream = self.objects.streams.resolve(req.streamId).map_err(|_| {
            crate::guest_warn!(self.id, "cusolverDnSetStream: {:#x} is not a stream of the session", req.streamId);
            CusolverStatus::INVALID_VALUE
        })?;
        let h = self.solver_handle(req.handle)?;
        if let Some(solver) = self.vendor_cusolver() {
            vendor_status(solver.set_stream(h.raw, stream.cu_stream()))?;
        }
        self.objects.solver.set_stream(req.handle, req.streamId).map_err(solver_status)?;
        Ok(CusolverDnSetStreamReply {})
    }

    fn cusolver_dn_get_stream(
        &self,
        _: &CallCx,
        req: CusolverDnGetStreamRequest,
    ) -> Result<CusolverDnGetStreamReply, CusolverStatus> {
        Ok(CusolverDnGetStreamReply { streamId: self.solver_handle(req.handle)?.stream })
    }

    precision!(
        f32,
        cusolver_dn_sgetrf_buffer_size,
        CusolverDnSgetrfBufferSizeRequest,
        CusolverDnSgetrfBufferSizeReply,
        cusolver_dn_sgetrf,
        CusolverDnSgetrfRequest,
        CusolverDnSgetrfReply,
        CusolverDnSgetrf,
        cusolver_dn_sgetrs,
        CusolverDnSgetrsRequest,
        CusolverDnSgetrsReply,
        cusolver_dn_spotrf_buffer_size,
        CusolverDnSpotrfBufferSizeRequest,
        CusolverDnSpotrfBufferSizeReply,
        cusolver_dn_spotrf,
        CusolverDnSpotrfRequest,
        CusolverDnSpotrfReply,
        cusolver_dn_spotrs,
        CusolverDnSpotrsRequest,
        CusolverDnSpotrsReply,
        cusolver_dn_sgeqrf_buffer_size,
        CusolverDnSgeqrfBufferSizeRequest,
        CusolverDnSgeqrfBufferSizeReply,
        cusolver_dn_sgeqrf,
        CusolverDnSgeqrfRequest,
        CusolverDnSgeqrfReply,
        cusolver_dn_sormqr_buffer_size,
        CusolverDnSormqrBufferSizeRequest,
        CusolverDnSormqrBufferSizeReply,
        cusolver_dn_sormqr,
        CusolverDnSormqrRequest,
        CusolverDnSormqrReply,
        cusolver_dn_ssyevd_buffer_size,
        CusolverDnSsyevdBufferSizeRequest,
        CusolverDnSsyevdBufferSizeReply,
        cusolver_dn_ssyevd,
        CusolverDnSsyevdRequest,
        CusolverDnSsyevdReply,
        cusolver_dn_sgesvd_buffer_size,
        CusolverDnSgesvdBufferSizeRequest,
        CusolverDnSgesvdBufferSizeReply,
        cusolver_dn_sgesvd,
        CusolverDnSgesvdRequest,
        CusolverDnSgesvdReply
    );
    precision!(
        f64,
        cusolver_dn_dgetrf_buffer_size,
        CusolverDnDgetrfBufferSizeRequest,
        CusolverDnDgetrfBufferSizeReply,
        cusolver_dn_dgetrf,
        CusolverDnDgetrfRequest,
        CusolverDnDgetrfReply,
        CusolverDnDgetrf,
        cusolver_dn_dgetrs,
        CusolverDnDgetrsRequest,
        CusolverDnDgetrsReply,
        cusolver_dn_dpotrf_buffer_size,
        CusolverDnDpotrfBufferSizeRequest,
        CusolverDnDpotrfBufferSizeReply,
        cusolver_dn_dpotrf,
        CusolverDnDpotrfRequest,
        CusolverDnDpotrfReply,
        cusolver_dn_dpotrs,
        CusolverDnDpotrsRequest,
        CusolverDnDpotrsReply,
        cusolver_dn_dgeqrf_buffer_size,
        CusolverDnDgeqrfBufferSizeRequest,
        CusolverDnDgeqrfBufferSizeReply,
        cusolver_dn_dgeqrf,
        CusolverDnDgeqrfRequest,
        CusolverDnDgeqrfReply,
        cusolver_dn_dormqr_buffer_size,
        CusolverDnDormqrBufferSizeRequest,
        CusolverDnDormqrBufferSizeReply,
        cusolver_dn_dormqr,
        CusolverDnDormqrRequest,
        CusolverDnDormqrReply,
        cusolver_dn_dsyevd_buffer_size,
        CusolverDnDsyevdBufferSizeRequest,
        CusolverDnDsyevdBufferSizeReply,
        cusolver_dn_dsyevd,
        CusolverDnDsyevdRequest,
        CusolverDnDsyevdReply,
        cusolver_dn_dgesvd_buffer_size,
        CusolverDnDgesvdBufferSizeRequest,
        CusolverDnDgesvdBufferSizeReply,
        cusolver_dn_dgesvd,
        CusolverDnDgesvdRequest,
        CusolverDnDgesvdReply
    );
}
