//! cuFFT's remote functions (`spec/cufft.lapis`) on the session: plans live in
//! [`crate::registry::fft`], their stream is a runtime stream, their data and work areas the
//! session's device memory. What an exec reads and writes depends on the plan's layout, which
//! the spec cannot see: the service computes both extents from the plan it holds, checks them
//! (and the work area) against the session's allocations, and shows them to the C/R engine's
//! hook before anything runs. The transforms run with the backend's libcufft where it has one
//! (the generated calls of `crate::vendor::cufft`, on a vendor plan made on the session's
//! context), otherwise on [`crate::cpu_fft`], reading and writing through the backend's copies
//! on the plan's stream (emu).

use phos_protocol::CudaError;
use phos_protocol::apis::Function;
use phos_protocol::cufft::*;
use phos_protocol::spec::{CallAccess, DeviceAccess};

use super::device_io;
use super::{CallCx, Session};
use crate::backend::vendor_cufft::Cufft;
use crate::cpu_fft::{FftType, Layout, LayoutError, PlanParams};
use crate::dispatch::cudart::CudartService;
use crate::dispatch::cufft::CufftService;
use crate::registry::fft::{MAX_PLANS, Plan};
use crate::registry::handles::NewHandle;
use crate::vendor::cufft::{Library, Translate, VendorCall};

/// A runtime failure as cuFFT reports it: an unknown plan is `INVALID_PLAN`, a table at its
/// limit `ALLOC_FAILED`, a bad address or size `INVALID_VALUE`, a failed device access
/// `EXEC_FAILED`.
fn fft_status(e: CudaError) -> CufftResult {
    match e {
        CudaError::InvalidResourceHandle => CufftResult::INVALID_PLAN,
        CudaError::MemoryAllocation => CufftResult::ALLOC_FAILED,
        CudaError::InvalidValue => CufftResult::INVALID_VALUE,
        CudaError::NotSupported => NOT_SUPPORTED,
        _ => CufftResult::EXEC_FAILED,
    }
}

/// A vendor status as the call's result.
fn vendor_status(code: i32) -> Result<(), CufftResult> {
    if code == SUCCESS { Ok(()) } else { Err(CufftResult(code)) }
}

/// The `int`s of an `in` buffer (`n`, an embedding); an empty one (NULL) is `None`.
fn ints(bytes: &[u8]) -> Option<Vec<i64>> {
    (!bytes.is_empty())
        .then(|| bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect())
}

/// The `long long`s of an `in` buffer; an empty one (NULL) is `None`.
fn longs(bytes: &[u8]) -> Option<Vec<i64>> {
    (!bytes.is_empty())
        .then(|| bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// A plan's parameters, owned (the calls give them as `int`s, `long long`s or a few sizes).
struct Params {
    n: Vec<i64>,
    inembed: Option<Vec<i64>>,
    istride: i64,
    idist: i64,
    onembed: Option<Vec<i64>>,
    ostride: i64,
    odist: i64,
    fft_type: i32,
    batch: i64,
}

impl Params {
    /// A plan of the basic layout (cufftPlan1d/2d/3d and their Make, Estimate, GetSize forms).
    fn basic(n: &[i32], fft_type: i32, batch: i32) -> Params {
        Params {
            n: n.iter().map(|&x| i64::from(x)).collect(),
            inembed: None,
            istride: 1,
            idist: 0,
            onembed: None,
            ostride: 1,
            odist: 0,
            fft_type,
            batch: i64::from(batch),
        }
    }

    fn layout(&self) -> Result<Layout, LayoutError> {
        Layout::new(&PlanParams {
            rank: self.n.len() as i64,
            n: &self.n,
            inembed: self.inembed.as_deref(),
            istride: self.istride,
            idist: self.idist,
            onembed: self.onembed.as_deref(),
            ostride: self.ostride,
            odist: self.odist,
            fft_type: self.fft_type,
            batch: self.batch,
        })
    }
}

/// The many-plan parameters of a request, from `int` buffers (`$conv` = `ints`) or `long long`
/// ones (`longs`).
macro_rules! many {
    ($req:expr, $conv:ident) => {
        Params {
            n: $conv($req.n).unwrap_or_default(),
            inembed: $conv($req.inembed),
            istride: i64::from($req.istride),
            idist: i64::from($req.idist),
            onembed: $conv($req.onembed),
            ostride: i64::from($req.ostride),
            odist: i64::from($req.odist),
            fft_type: $req.fft_type,
            batch: i64::from($req.batch),
        }
    };
}

/// The vendor's objects of one exec: its plan.
struct VendorPlan {
    raw: i32,
}

impl Translate for VendorPlan {
    fn object(&self, kind: &'static str, _: u64) -> Result<*mut std::ffi::c_void, CufftResult> {
        match kind {
            // The vendor's int, carried as an address (the generated call casts it back).
            "cufft_plan" => Ok(self.raw as isize as *mut std::ffi::c_void),
            _ => Err(CufftResult::INTERNAL_ERROR),
        }
    }
}

/// Which exec a call is: the plan type it takes and, for complex-to-complex ones, the
/// direction.
#[derive(Clone, Copy)]
struct Exec {
    id: FunctionId,
    fft_type: FftType,
    direction: Option<i32>,
}

impl Session {
    /// The vendor's libcufft, where the backend has it.
    fn vendor_cufft(&self) -> Option<&Cufft> {
        self.backend.cufft()
    }

    /// A plan of the session's; an unknown one is `CUFFT_INVALID_PLAN`, logged.
    fn fft_plan(&self, id: FunctionId, handle: u64) -> Result<Plan, CufftResult> {
        self.objects.fft.get(handle).map_err(|e| {
            crate::guest_warn!(
                self.id,
                "{}: {handle:#x} is not a cuFFT plan of the session: CUFFT_INVALID_PLAN",
                id.name()
            );
            fft_status(e)
        })
    }

    /// The layout of a plan of these parameters, or cuFFT's status for them, logged.
    fn fft_layout(&self, id: FunctionId, params: &Params) -> Result<Layout, CufftResult> {
        params.layout().map_err(|e| {
            let status = if e.is_type() {
                CufftResult::INVALID_TYPE
            } else if e.is_size() {
                CufftResult::INVALID_SIZE
            } else {
                CufftResult::INVALID_VALUE
            };
            crate::guest_warn!(self.id, "{}: {e}: {}", id.name(), status.name());
            status
        })
    }

    /// The work size of a plan of `layout`: the vendor's (`query`), or the CPU transform's.
    fn fft_work_size(
        &self,
        id: FunctionId,
        layout: &Layout,
        query: impl FnOnce(&Cufft) -> Result<u64, i32>,
    ) -> Result<u64, CufftResult> {
        match self.vendor_cufft() {
            Some(cufft) => query(cufft).map_err(CufftResult),
            None => self.cpu_work_size(id, layout),
        }
    }

    /// The CPU transform's work size; a transform too large for it is `CUFFT_INVALID_SIZE`.
    fn cpu_work_size(&self, id: FunctionId, layout: &Layout) -> Result<u64, CufftResult> {
        layout.cpu_work_bytes().map_err(|e| {
            crate::guest_warn!(self.id, "{}: {e}: CUFFT_INVALID_SIZE", id.name());
            CufftResult::INVALID_SIZE
        })
    }

    /// A new, empty plan (cufftCreate, and the first half of a plan call).
    fn create_plan(&self, cx: &CallCx, id: FunctionId) -> Result<u64, CufftResult> {
        self.check_device(cx.device).map_err(|_| CufftResult::INVALID_DEVICE)?;
        let raw = match self.vendor_cufft() {
            Some(cufft) => {
                self.backend.bind(cx.device).map_err(fft_status)?;
                Some(cufft.create().map_err(CufftResult)?)
            }
            None => None,
        };
        let full = || {
            crate::guest_warn!(self.id, "{}: the session holds {MAX_PLANS} cuFFT plans already", id.name());
            CudaError::MemoryAllocation
        };
        self.objects.fft.create(Plan::new(cx.device, raw), &NewHandle { forced: cx.forced(), full: &full }).map_err(
            |e| {
                if let (Some(cufft), Some(raw)) = (self.vendor_cufft(), raw) {
                    cufft.destroy(raw);
                }
                fft_status(e)
            },
        )
    }

    /// Make a plan for `params` (a plan call's second half, cufftMakePlan*): its work size.
    /// Making a plan again replaces its transform, as cuFFT does.
    fn make_plan(&self, id: FunctionId, handle: u64, params: &Params) -> Result<u64, CufftResult> {
        let plan = self.fft_plan(id, handle)?;
        let layout = self.fft_layout(id, params)?;
        let work_size = match (self.vendor_cufft(), plan.raw) {
            (Some(cufft), Some(raw)) => {
                self.backend.bind(plan.device).map_err(fft_status)?;
                cufft.make_plan(raw, &layout).map_err(CufftResult)?
            }
            (None, _) => self.cpu_work_size(id, &layout)?,
            // Every plan of a backend with libcufft has the vendor's plan.
            (Some(_), None) => return Err(CufftResult::INTERNAL_ERROR),
        };
        self.objects
            .fft
            .update(handle, |p| {
                p.layout = Some(layout);
                p.work_size = work_size;
            })
            .map_err(fft_status)?;
        Ok(work_size)
    }

    /// A plan call: a new plan made for `params`; nothing is left of it when making fails.
    fn plan(&self, cx: &CallCx, id: FunctionId, params: &Params) -> Result<u64, CufftResult> {
        // Checked before a plan is created, so that a refused plan call leaves nothing behind.
        self.fft_layout(id, params)?;
        let handle = self.create_plan(cx, id)?;
        if let Err(e) = self.make_plan(id, handle, params) {
            self.destroy_plan(handle);
            return Err(e);
        }
        Ok(handle)
    }

    fn destroy_plan(&self, handle: u64) -> Option<Plan> {
        let plan = self.objects.fft.destroy(handle).ok()?;
        if let (Some(cufft), Some(raw)) = (self.vendor_cufft(), plan.raw) {
            let code = cufft.destroy(raw);
            if code != SUCCESS {
                tracing::warn!(session = %self.id, "cufftDestroy of the vendor's plan {raw}: status {code}");
            }
        }
        Some(plan)
    }

    /// A work-size query for `params` on a plan (`Some(handle)`, cufftGetSize*) or none
    /// (cufftEstimate*).
    fn size_query(
        &self,
        cx: &CallCx,
        id: FunctionId,
        handle: Option<u64>,
        params: &Params,
    ) -> Result<u64, CufftResult> {
        let raw = match handle {
            Some(h) => Some(self.fft_plan(id, h)?.raw),
            None => None,
        };
        let layout = self.fft_layout(id, params)?;
        if self.vendor_cufft().is_some() {
            self.backend.bind(cx.device).map_err(fft_status)?;
        }
        self.fft_work_size(id, &layout, |cufft| match raw {
            Some(Some(raw)) => cufft.plan_size(raw, &layout),
            _ => cufft.estimate(&layout),
        })
    }

    /// `bytes` at `addr` must be the session's memory: `CUFFT_INVALID_VALUE`, logged, if not.
    fn check_fft_range(&self, id: FunctionId, what: &str, addr: u64, bytes: u64) -> Result<(), CufftResult> {
        if self.objects.memory.contains(addr, bytes) {
            return Ok(());
        }
        crate::guest_warn!(
            self.id,
            "{}: the {what} at {addr:#x} does not hold the {bytes} bytes the plan's layout gives it: CUFFT_INVALID_VALUE",
            id.name()
        );
        Err(CufftResult::INVALID_VALUE)
    }

    /// One transform of the plan `handle` from `idata` to `odata`: checked, shown to the C/R
    /// hook, then run by the vendor (`vendor`, the generated call) or the CPU.
    fn exec(
        &self,
        cx: &CallCx,
        exec: Exec,
        handle: u64,
        idata: u64,
        odata: u64,
        vendor: impl FnOnce(&Library, &VendorPlan) -> Result<(), CufftResult>,
    ) -> Result<(), CufftResult> {
        let id = exec.id;
        let plan = self.fft_plan(id, handle)?;
        let Some(layout) = plan.layout.as_ref() else {
            crate::guest_warn!(self.id, "{}: plan {handle:#x} was never made: CUFFT_INVALID_PLAN", id.name());
            return Err(CufftResult::INVALID_PLAN);
        };
        if layout.fft_type != exec.fft_type {
            crate::guest_warn!(
                self.id,
                "{}: plan {handle:#x} is a {} plan: CUFFT_INVALID_VALUE",
                id.name(),
                layout.fft_type.name()
            );
            return Err(CufftResult::INVALID_VALUE);
        }
        if let Some(direction) = exec.direction.filter(|d| *d != -1 && *d != 1) {
            crate::guest_warn!(
                self.id,
                "{}: direction {direction} is neither CUFFT_FORWARD nor CUFFT_INVERSE: CUFFT_INVALID_VALUE",
                id.name()
            );
            return Err(CufftResult::INVALID_VALUE);
        }
        let in_place = idata == odata;
        // Extents that do not fit 64 bits were refused when the plan was made.
        let in_bytes = layout.extent_bytes(true, in_place).ok_or(CufftResult::INVALID_SIZE)?;
        let out_bytes = layout.extent_bytes(false, in_place).ok_or(CufftResult::INVALID_SIZE)?;
        self.check_fft_range(id, "input", idata, in_bytes)?;
        self.check_fft_range(id, "output", odata, out_bytes)?;
        let work_area = (!plan.auto_allocation && plan.work_size > 0).then_some(plan.work_area);
        match work_area {
            Some(0) => {
                crate::guest_warn!(
                    self.id,
                    "{}: plan {handle:#x} allocates no work area and was given none: CUFFT_NO_WORKSPACE",
                    id.name()
                );
                return Err(CufftResult::NO_WORKSPACE);
            }
            // The work area may have been freed since cufftSetWorkArea.
            Some(area) => self.check_fft_range(id, "work area", area, plan.work_size)?,
            None => {}
        }
        // Where the work starts: taken into the stream's capture instead, or refused there.
        self.library_work(cx, plan.stream, None, "CUFFT_NOT_SUPPORTED").map_err(|_| NOT_SUPPORTED)?;
        if self.hooks.active() {
            let mut device = vec![
                DeviceAccess { addr: idata, len: in_bytes, writes: in_place },
                DeviceAccess { addr: odata, len: out_bytes, writes: true },
            ];
            if let Some(area) = work_area {
                device.push(DeviceAccess { addr: area, len: plan.work_size, writes: true });
            }
            let access = CallAccess { function: id.name(), device: &device, objects: &[] };
            self.hooks.before_call(&access).map_err(fft_status)?;
        }
        match (self.vendor_cufft(), plan.raw) {
            (Some(cufft), Some(raw)) => {
                self.backend.bind(plan.device).map_err(fft_status)?;
                vendor(&cufft.library, &VendorPlan { raw })
            }
            _ => {
                let stream = self.objects.streams.resolve(plan.stream).map_err(fft_status)?;
                let to_bytes = |n: u64| usize::try_from(n).map_err(|_| CufftResult::INVALID_SIZE);
                let input = device_io::read(self, stream, idata, to_bytes(in_bytes)?).map_err(fft_status)?;
                let mut output = device_io::read(self, stream, odata, to_bytes(out_bytes)?).map_err(fft_status)?;
                layout.execute(&input, &mut output, in_place, exec.direction == Some(1)).map_err(|e| {
                    crate::guest_warn!(self.id, "{}: {e}: CUFFT_INVALID_SIZE", id.name());
                    CufftResult::INVALID_SIZE
                })?;
                device_io::write(self, stream, odata, &output).map_err(fft_status)
            }
        }
    }
}

impl CufftService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CufftResult> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(fft_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &phos_protocol::spec::RecordFacts<'_>) {
        self.records.record(Function::Cufft(id), cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CufftResult> {
        self.hooks.before_call(access).map_err(fft_status)
    }

    super::library_capture::capture_hooks!(Cufft);

    fn cufft_create(&self, cx: &CallCx, _: CufftCreateRequest) -> Result<CufftCreateReply, CufftResult> {
        Ok(CufftCreateReply { handle: self.create_plan(cx, FunctionId::CufftCreate)? })
    }

    fn cufft_destroy(&self, _: &CallCx, req: CufftDestroyRequest) -> Result<CufftDestroyReply, CufftResult> {
        self.fft_plan(FunctionId::CufftDestroy, req.plan)?;
        self.destroy_plan(req.plan).ok_or(CufftResult::INVALID_PLAN)?;
        Ok(CufftDestroyReply {})
    }

    fn cufft_plan_1d(&self, cx: &CallCx, req: CufftPlan1dRequest) -> Result<CufftPlan1dReply, CufftResult> {
        let params = Params::basic(&[req.nx], req.fft_type, req.batch);
        Ok(CufftPlan1dReply { plan: self.plan(cx, FunctionId::CufftPlan1d, &params)? })
    }

    fn cufft_plan_2d(&self, cx: &CallCx, req: CufftPlan2dRequest) -> Result<CufftPlan2dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny], req.fft_type, 1);
        Ok(CufftPlan2dReply { plan: self.plan(cx, FunctionId::CufftPlan2d, &params)? })
    }

    fn cufft_plan_3d(&self, cx: &CallCx, req: CufftPlan3dRequest) -> Result<CufftPlan3dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny, req.nz], req.fft_type, 1);
        Ok(CufftPlan3dReply { plan: self.plan(cx, FunctionId::CufftPlan3d, &params)? })
    }

    fn cufft_plan_many(&self, cx: &CallCx, req: CufftPlanManyRequest<'_>) -> Result<CufftPlanManyReply, CufftResult> {
        let params = many!(req, ints);
        Ok(CufftPlanManyReply { plan: self.plan(cx, FunctionId::CufftPlanMany, &params)? })
    }

    fn cufft_make_plan_1d(&self, _: &CallCx, req: CufftMakePlan1dRequest) -> Result<CufftMakePlan1dReply, CufftResult> {
        let params = Params::basic(&[req.nx], req.fft_type, req.batch);
        Ok(CufftMakePlan1dReply { workSize: self.make_plan(FunctionId::CufftMakePlan1d, req.plan, &params)? })
    }

    fn cufft_make_plan_2d(&self, _: &CallCx, req: CufftMakePlan2dRequest) -> Result<CufftMakePlan2dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny], req.fft_type, 1);
        Ok(CufftMakePlan2dReply { workSize: self.make_plan(FunctionId::CufftMakePlan2d, req.plan, &params)? })
    }

    fn cufft_make_plan_3d(&self, _: &CallCx, req: CufftMakePlan3dRequest) -> Result<CufftMakePlan3dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny, req.nz], req.fft_type, 1);
        Ok(CufftMakePlan3dReply { workSize: self.make_plan(FunctionId::CufftMakePlan3d, req.plan, &params)? })
    }

    fn cufft_make_plan_many(
        &self,
        _: &CallCx,
        req: CufftMakePlanManyRequest<'_>,
    ) -> Result<CufftMakePlanManyReply, CufftResult> {
        let params = many!(req, ints);
        Ok(CufftMakePlanManyReply { workSize: self.make_plan(FunctionId::CufftMakePlanMany, req.plan, &params)? })
    }

    fn cufft_make_plan_many_64(
        &self,
        _: &CallCx,
        req: CufftMakePlanMany64Request<'_>,
    ) -> Result<CufftMakePlanMany64Reply, CufftResult> {
        let params = many!(req, longs);
        Ok(CufftMakePlanMany64Reply { workSize: self.make_plan(FunctionId::CufftMakePlanMany64, req.plan, &params)? })
    }

    fn cufft_estimate_1d(&self, cx: &CallCx, req: CufftEstimate1dRequest) -> Result<CufftEstimate1dReply, CufftResult> {
        let params = Params::basic(&[req.nx], req.fft_type, req.batch);
        Ok(CufftEstimate1dReply { workSize: self.size_query(cx, FunctionId::CufftEstimate1d, None, &params)? })
    }

    fn cufft_estimate_2d(&self, cx: &CallCx, req: CufftEstimate2dRequest) -> Result<CufftEstimate2dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny], req.fft_type, 1);
        Ok(CufftEstimate2dReply { workSize: self.size_query(cx, FunctionId::CufftEstimate2d, None, &params)? })
    }

    fn cufft_estimate_3d(&self, cx: &CallCx, req: CufftEstimate3dRequest) -> Result<CufftEstimate3dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny, req.nz], req.fft_type, 1);
        Ok(CufftEstimate3dReply { workSize: self.size_query(cx, FunctionId::CufftEstimate3d, None, &params)? })
    }

    fn cufft_estimate_many(
        &self,
        cx: &CallCx,
        req: CufftEstimateManyRequest<'_>,
    ) -> Result<CufftEstimateManyReply, CufftResult> {
        let params = many!(req, ints);
        Ok(CufftEstimateManyReply { workSize: self.size_query(cx, FunctionId::CufftEstimateMany, None, &params)? })
    }

    fn cufft_get_size_1d(&self, cx: &CallCx, req: CufftGetSize1dRequest) -> Result<CufftGetSize1dReply, CufftResult> {
        let params = Params::basic(&[req.nx], req.fft_type, req.batch);
        let size = self.size_query(cx, FunctionId::CufftGetSize1d, Some(req.handle), &params)?;
        Ok(CufftGetSize1dReply { workSize: size })
    }

    fn cufft_get_size_2d(&self, cx: &CallCx, req: CufftGetSize2dRequest) -> Result<CufftGetSize2dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny], req.fft_type, 1);
        let size = self.size_query(cx, FunctionId::CufftGetSize2d, Some(req.handle), &params)?;
        Ok(CufftGetSize2dReply { workSize: size })
    }

    fn cufft_get_size_3d(&self, cx: &CallCx, req: CufftGetSize3dRequest) -> Result<CufftGetSize3dReply, CufftResult> {
        let params = Params::basic(&[req.nx, req.ny, req.nz], req.fft_type, 1);
        let size = self.size_query(cx, FunctionId::CufftGetSize3d, Some(req.handle), &params)?;
        Ok(CufftGetSize3dReply { workSize: size })
    }

    fn cufft_get_size_many(
        &self,
        cx: &CallCx,
        req: CufftGetSizeManyRequest<'_>,
    ) -> Result<CufftGetSizeManyReply, CufftResult> {
        let params = many!(req, ints);
        let size = self.size_query(cx, FunctionId::CufftGetSizeMany, Some(req.handle), &params)?;
        Ok(CufftGetSizeManyReply { workArea: size })
    }

    fn cufft_get_size_many_64(
        &self,
        cx: &CallCx,
        req: CufftGetSizeMany64Request<'_>,
    ) -> Result<CufftGetSizeMany64Reply, CufftResult> {
        let params = many!(req, longs);
        let size = self.size_query(cx, FunctionId::CufftGetSizeMany64, Some(req.plan), &params)?;
        Ok(CufftGetSizeMany64Reply { workSize: size })
    }

    fn cufft_get_size(&self, _: &CallCx, req: CufftGetSizeRequest) -> Result<CufftGetSizeReply, CufftResult> {
        Ok(CufftGetSizeReply { workSize: self.fft_plan(FunctionId::CufftGetSize, req.handle)?.work_size })
    }

    fn cufft_set_auto_allocation(
        &self,
        _: &CallCx,
        req: CufftSetAutoAllocationRequest,
    ) -> Result<CufftSetAutoAllocationReply, CufftResult> {
        let plan = self.fft_plan(FunctionId::CufftSetAutoAllocation, req.plan)?;
        let auto = req.autoAllocate != 0;
        if let (Some(cufft), Some(raw)) = (self.vendor_cufft(), plan.raw) {
            vendor_status(cufft.set_auto_allocation(raw, auto))?;
        }
        // Taken into account by the next cufftMakePlan*, as cuFFT does.
        self.objects.fft.update(req.plan, |p| p.auto_allocation = auto).map_err(fft_status)?;
        Ok(CufftSetAutoAllocationReply {})
    }

    fn cufft_set_work_area(
        &self,
        _: &CallCx,
        req: CufftSetWorkAreaRequest,
    ) -> Result<CufftSetWorkAreaReply, CufftResult> {
        let id = FunctionId::CufftSetWorkArea;
        let plan = self.fft_plan(id, req.plan)?;
        if req.workArea != 0 {
            self.check_fft_range(id, "work area", req.workArea, plan.work_size)?;
        }
        if let (Some(cufft), Some(raw)) = (self.vendor_cufft(), plan.raw) {
            self.backend.bind(plan.device).map_err(fft_status)?;
            vendor_status(cufft.set_work_area(raw, req.workArea))?;
        }
        self.objects.fft.update(req.plan, |p| p.work_area = req.workArea).map_err(fft_status)?;
        Ok(CufftSetWorkAreaReply {})
    }

    fn cufft_set_stream(&self, _: &CallCx, req: CufftSetStreamRequest) -> Result<CufftSetStreamReply, CufftResult> {
        let plan = self.fft_plan(FunctionId::CufftSetStream, req.plan)?;
        // The stream must be one of the session's (or a special one).
        let stream = self.objects.streams.resolve(req.stream).map_err(|_| {
            crate::guest_warn!(
                self.id,
                "cufftSetStream: {:#x} is not a stream of the session: CUFFT_INVALID_VALUE",
                req.stream
            );
            CufftResult::INVALID_VALUE
        })?;
        if let (Some(cufft), Some(raw)) = (self.vendor_cufft(), plan.raw) {
            vendor_status(cufft.set_stream(raw, stream.cu_stream()))?;
        }
        self.objects.fft.update(req.plan, |p| p.stream = req.stream).map_err(fft_status)?;
        Ok(CufftSetStreamReply {})
    }

    fn cufft_exec_c2c(&self, cx: &CallCx, req: CufftExecC2CRequest) -> Result<CufftExecC2CReply, CufftResult> {
        let exec = Exec { id: FunctionId::CufftExecC2C, fft_type: FftType::C2C, direction: Some(req.direction) };
        self.exec(cx, exec, req.plan, req.idata, req.odata, |lib, t| {
            // SAFETY: `exec` calls this with the checked request and the live vendor plan.
            unsafe { req.call_vendor(lib, t) }.map(drop)
        })?;
        Ok(CufftExecC2CReply {})
    }

    fn cufft_exec_r2c(&self, cx: &CallCx, req: CufftExecR2CRequest) -> Result<CufftExecR2CReply, CufftResult> {
        let exec = Exec { id: FunctionId::CufftExecR2C, fft_type: FftType::R2C, direction: None };
        self.exec(cx, exec, req.plan, req.idata, req.odata, |lib, t| {
            // SAFETY: `exec` calls this with the checked request and the live vendor plan.
            unsafe { req.call_vendor(lib, t) }.map(drop)
        })?;
        Ok(CufftExecR2CReply {})
    }

    fn cufft_exec_c2r(&self, cx: &CallCx, req: CufftExecC2RRequest) -> Result<CufftExecC2RReply, CufftResult> {
        let exec = Exec { id: FunctionId::CufftExecC2R, fft_type: FftType::C2R, direction: None };
        self.exec(cx, exec, req.plan, req.idata, req.odata, |lib, t| {
            // SAFETY: `exec` calls this with the checked request and the live vendor plan.
            unsafe { req.call_vendor(lib, t) }.map(drop)
        })?;
        Ok(CufftExecC2RReply {})
    }

    fn cufft_exec_z2z(&self, cx: &CallCx, req: CufftExecZ2ZRequest) -> Result<CufftExecZ2ZReply, CufftResult> {
        let exec = Exec { id: FunctionId::CufftExecZ2Z, fft_type: FftType::Z2Z, direction: Some(req.direction) };
        self.exec(cx, exec, req.plan, req.idata, req.odata, |lib, t| {
            // SAFETY: `exec` calls this with the checked request and the live vendor plan.
            unsafe { req.call_vendor(lib, t) }.map(drop)
        })?;
        Ok(CufftExecZ2ZReply {})
    }

    fn cufft_exec_d2z(&self, cx: &CallCx, req: CufftExecD2ZRequest) -> Result<CufftExecD2ZReply, CufftResult> {
        let exec = Exec { id: FunctionId::CufftExecD2Z, fft_type: FftType::D2Z, direction: None };
        self.exec(cx, exec, req.plan, req.idata, req.odata, |lib, t| {
            // SAFETY: `exec` calls this with the checked request and the live vendor plan.
            unsafe { req.call_vendor(lib, t) }.map(drop)
        })?;
        Ok(CufftExecD2ZReply {})
    }

    fn cufft_exec_z2d(&self, cx: &CallCx, req: CufftExecZ2DRequest) -> Result<CufftExecZ2DReply, CufftResult> {
        let exec = Exec { id: FunctionId::CufftExecZ2D, fft_type: FftType::Z2D, direction: None };
        self.exec(cx, exec, req.plan, req.idata, req.odata, |lib, t| {
            // SAFETY: `exec` calls this with the checked request and the live vendor plan.
            unsafe { req.call_vendor(lib, t) }.map(drop)
        })?;
        Ok(CufftExecZ2DReply {})
    }
}
