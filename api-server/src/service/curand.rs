//! cuRAND's remote functions (`spec/curand.lapis`) on the session: generators live in
//! [`crate::registry::rand`], their stream is a runtime stream, their output the session's
//! device memory (the generated dispatch has checked the range) or, for a host generator, a
//! buffer of the reply. The numbers come from the backend's vendor library where it has one
//! (NVIDIA's libcurand on a GPU: the generated calls of `crate::vendor::curand`, on a vendor
//! generator made on the session's context), and otherwise from [`crate::cpu_rand`], written
//! through the backend's copies on the generator's stream (emu).
//!
//! A generator's position (its offset plus what it has drawn since its seed, offset or
//! ordering was set) is kept as a record of `curandSetGeneratorOffset` on it, so a restore
//! replays the generator to where it was.

use phos_protocol::apis::Function;
use phos_protocol::curand::*;
use phos_protocol::spec::RecordFacts;
use phos_protocol::{CudaError, Ptr};

use super::library_capture::NotNow;
use super::{CallCx, Session};
use crate::backend::vendor_curand::Curand;
use crate::cpu_rand::{self, Words};
use crate::dispatch::cudart::CudartService;
use crate::dispatch::curand::CurandService;
use crate::registry::handles::NewHandle;
use crate::registry::rand::{Generator, MAX_GENERATORS};
use crate::vendor::curand::{Library, Translate, VendorCall};

/// A runtime failure as cuRAND reports it: an unknown generator is `NOT_INITIALIZED`, a table
/// at its limit `ALLOCATION_FAILED`, a bad address or size `OUT_OF_RANGE`, a failed device
/// access `LAUNCH_FAILURE`.
fn rand_status(e: CudaError) -> CurandStatus {
    match e {
        CudaError::InvalidResourceHandle => CurandStatus::NOT_INITIALIZED,
        CudaError::MemoryAllocation => CurandStatus::ALLOCATION_FAILED,
        CudaError::InvalidValue => CurandStatus::OUT_OF_RANGE,
        CudaError::NotSupported => NOT_SUPPORTED,
        _ => CurandStatus::LAUNCH_FAILURE,
    }
}

/// A vendor status as the call's result.
fn vendor_status(code: i32) -> Result<(), CurandStatus> {
    if code == SUCCESS { Ok(()) } else { Err(CurandStatus(code)) }
}

/// The pseudo-random types (`curandRngType_t`) the CPU generator serves, defaults included.
fn is_pseudo(rng_type: i32) -> bool {
    matches!(rng_type, 100 | 101 | 121 | 141 | 142 | 161)
}

/// `CURAND_RNG_PSEUDO_PHILOX4_32_10`.
const PHILOX: i32 = 161;

/// cuRAND's quasi-random types.
fn is_quasi(rng_type: i32) -> bool {
    (200..=204).contains(&rng_type)
}

/// The quasi-random types the CPU serves: `CURAND_RNG_QUASI_DEFAULT` and `_SOBOL32`.
fn is_cpu_quasi(rng_type: i32) -> bool {
    matches!(rng_type, 200 | 201)
}

/// The orderings of pseudo-random generators (BEST, DEFAULT, SEEDED, LEGACY, DYNAMIC).
fn is_pseudo_ordering(ordering: i32) -> bool {
    (100..=104).contains(&ordering)
}

/// What one generation draws.
#[derive(Clone, Copy)]
enum Draw {
    Bits32,
    Bits64,
    Uniform,
    UniformDouble,
    Normal { mean: f64, stddev: f64, wide: bool, log: bool },
    Poisson { lambda: f64 },
}

impl Draw {
    /// Bytes of one number.
    fn width(self) -> usize {
        match self {
            Draw::Bits64 | Draw::UniformDouble => 8,
            Draw::Normal { wide: true, .. } => 8,
            _ => 4,
        }
    }

    /// `n` numbers from `words` for a generator of `rng_type`, little-endian, as the program's
    /// memory holds them; cuRAND's status for a request the generator cannot serve.
    fn run(self, words: &mut Words, n: usize, rng_type: i32) -> Result<Vec<u8>, CurandStatus> {
        let mut out = Vec::new();
        out.try_reserve_exact(n.saturating_mul(self.width())).map_err(|_| CurandStatus::ALLOCATION_FAILED)?;
        match self {
            // Only the 64-bit quasi-random generators make 64-bit integers (none on the CPU).
            Draw::Bits64 => return Err(CurandStatus::TYPE_ERROR),
            Draw::Bits32 => (0..n).for_each(|_| out.extend_from_slice(&words.next_u32().to_le_bytes())),
            Draw::Uniform => (0..n).for_each(|_| out.extend_from_slice(&words.uniform_f32().to_le_bytes())),
            Draw::UniformDouble => (0..n).for_each(|_| out.extend_from_slice(&words.uniform_f64().to_le_bytes())),
            Draw::Normal { mean, stddev, wide, log } => {
                // Pseudo-random normals come in pairs, as cuRAND documents, and it refuses an odd
                // count, except from Philox4x32-10, which an H100's libcurand serves an odd count
                // of (its draws are four words at a time anyway).
                if !n.is_multiple_of(2) && rng_type != PHILOX {
                    return Err(CurandStatus::LENGTH_NOT_MULTIPLE);
                }
                for v in words.normals(n, mean, stddev, wide) {
                    let v = if log { v.exp() } else { v };
                    if wide {
                        out.extend_from_slice(&v.to_le_bytes());
                    } else {
                        out.extend_from_slice(&(v as f32).to_le_bytes());
                    }
                }
            }
            Draw::Poisson { lambda } => {
                if !(lambda > 0.0 && lambda <= 400_000.0) {
                    return Err(CurandStatus::OUT_OF_RANGE);
                }
                (0..n).for_each(|_| out.extend_from_slice(&words.poisson(lambda).to_le_bytes()));
            }
        }
        Ok(out)
    }
}

impl Draw {
    /// `n` numbers of a Sobol' sequence of `dimensions` dimensions from point `start` of each
    /// (cuRAND's layout: the points of the first dimension, then of the second, ...), and the
    /// points each dimension advanced.
    fn run_quasi(self, dimensions: u32, start: u64, n: usize) -> Result<(Vec<u8>, u64), CurandStatus> {
        let dims = dimensions.max(1) as usize;
        if !n.is_multiple_of(dims) {
            return Err(CurandStatus::LENGTH_NOT_MULTIPLE);
        }
        let per_dim = n / dims;
        let mut out = Vec::new();
        out.try_reserve_exact(n.saturating_mul(self.width())).map_err(|_| CurandStatus::ALLOCATION_FAILED)?;
        for dim in 0..dims as u32 {
            for x in cpu_rand::sobol32(dim, start, per_dim) {
                let u = cpu_rand::quasi_uniform(x);
                match self {
                    Draw::Bits32 => out.extend_from_slice(&x.to_le_bytes()),
                    Draw::Uniform => out.extend_from_slice(&(u as f32).to_le_bytes()),
                    Draw::UniformDouble => out.extend_from_slice(&u.to_le_bytes()),
                    Draw::Normal { mean, stddev, wide, log } => {
                        let v = mean + stddev * cpu_rand::normal_quantile(u);
                        let v = if log { v.exp() } else { v };
                        if wide {
                            out.extend_from_slice(&v.to_le_bytes());
                        } else {
                            out.extend_from_slice(&(v as f32).to_le_bytes());
                        }
                    }
                    // 64-bit integers come from the 64-bit generators; Poisson numbers of
                    // quasi-random points are not computed on the CPU.
                    Draw::Bits64 => return Err(CurandStatus::TYPE_ERROR),
                    Draw::Poisson { .. } => return Err(NOT_SUPPORTED),
                }
            }
        }
        Ok((out, per_dim as u64))
    }
}

/// The vendor's objects of one call: its generator.
struct VendorObjects {
    generator: u64,
}

impl Translate for VendorObjects {
    fn object(&self, kind: &'static str, _: u64) -> Result<*mut std::ffi::c_void, CurandStatus> {
        match kind {
            "curand_generator" => Ok(self.generator as *mut std::ffi::c_void),
            // No generation takes another object (the stream is the generator's setting).
            _ => Err(CurandStatus::INTERNAL_ERROR),
        }
    }
}

impl Session {
    /// The vendor's libcurand, where the backend has it.
    fn vendor_curand(&self) -> Option<&Curand> {
        self.backend.curand()
    }

    /// A generator of the session's; an unknown one is `NOT_INITIALIZED`, logged.
    fn rand_generator(&self, handle: u64) -> Result<Generator, CurandStatus> {
        self.objects.rand.get(handle).map_err(|e| {
            crate::guest_warn!(
                self.id,
                "{handle:#x} is not a cuRAND generator of the session: CURAND_STATUS_NOT_INITIALIZED"
            );
            rand_status(e)
        })
    }

    fn create_generator(&self, cx: &CallCx, rng_type: i32, host: bool) -> Result<u64, CurandStatus> {
        self.check_device(cx.device).map_err(|_| CurandStatus::INITIALIZATION_FAILED)?;
        let name = if host { "curandCreateGeneratorHost" } else { "curandCreateGenerator" };
        let raw = match self.vendor_curand() {
            Some(curand) => {
                self.backend.bind(cx.device).map_err(rand_status)?;
                curand.create(rng_type, host).map_err(CurandStatus)?
            }
            None if is_pseudo(rng_type) || is_cpu_quasi(rng_type) => 0,
            None => {
                let why = if is_quasi(rng_type) {
                    "of the quasi-random generators emu serves SOBOL32 only"
                } else {
                    "no such type"
                };
                crate::guest_warn!(self.id, "{name}: generator type {rng_type}: {why}: CURAND_STATUS_TYPE_ERROR");
                return Err(CurandStatus::TYPE_ERROR);
            }
        };
        let full = || {
            crate::guest_warn!(self.id, "{name}: the session holds {MAX_GENERATORS} cuRAND generators already");
            CudaError::MemoryAllocation
        };
        let generator = Generator {
            device: cx.device,
            rng_type,
            host,
            ordering: if is_quasi(rng_type) {
                consts::CURAND_ORDERING_QUASI_DEFAULT
            } else {
                consts::CURAND_ORDERING_PSEUDO_DEFAULT
            },
            dimensions: 1,
            raw,
            ..Generator::default()
        };
        self.objects.rand.create(generator, &NewHandle { forced: cx.forced(), full: &full }).map_err(|e| {
            if let Some(curand) = self.vendor_curand().filter(|_| raw != 0) {
                curand.destroy(raw);
            }
            rand_status(e)
        })
    }

    /// Keep a generator's position as a record of `curandSetGeneratorOffset` on it (replacing
    /// the one before), so that a restore brings it back there.
    fn record_position(&self, cx: &CallCx, handle: u64, g: &Generator) {
        let payload =
            phos_protocol::encode(&CurandSetGeneratorOffsetRequest { generator: handle, offset: g.position() });
        let mutated = [("curand_generator", handle)];
        let facts = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
        self.records.record(Function::Curand(FunctionId::CurandSetGeneratorOffset), cx.device, &payload, &facts);
    }

    /// A setting that restarts a generator's sequence at its offset (seed, ordering,
    /// dimensions): the vendor's call, then the registry's change, then the position's record.
    fn restart(
        &self,
        cx: &CallCx,
        handle: u64,
        vendor: impl FnOnce(&Curand, u64) -> i32,
        change: impl FnOnce(&mut Generator),
    ) -> Result<(), CurandStatus> {
        let g = self.rand_generator(handle)?;
        if let Some(curand) = self.vendor_curand() {
            vendor_status(vendor(curand, g.raw))?;
        }
        let g = self
            .objects
            .rand
            .update(handle, |g| {
                change(g);
                g.drawn = 0;
            })
            .map_err(rand_status)?;
        self.record_position(cx, handle, &g);
        Ok(())
    }

    /// Where a device generator's generation starts its work on the generator's stream:
    /// whether it is taken into the stream's capture (`library_work`), or refused there.
    fn rand_work(&self, cx: &CallCx, g: &Generator) -> Result<bool, CurandStatus> {
        if g.host {
            return Ok(false);
        }
        match self.library_work(cx, g.stream, None, "CURAND_STATUS_ARCH_MISMATCH") {
            Ok(()) => Ok(false),
            Err(NotNow::Captured) => Ok(true),
            Err(NotNow::Refused) => Err(NOT_SUPPORTED),
        }
    }

    /// One generation of `n` numbers into `output`: with the vendor's library (`vendor`, the
    /// generated call) or the CPU generator (`draw`). The reply's buffer for a host generator.
    ///
    /// In a capture, as with CUDA's graphs, the generation keeps the generator's position as
    /// it was, which every launch of the graph draws from (each launch makes the same
    /// numbers), and the generator moves on as if it had drawn them now; a launch leaves the
    /// generator where it is.
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        cx: &CallCx,
        handle: u64,
        on_host: i32,
        output: &Ptr<'_>,
        n: u64,
        draw: Draw,
        vendor: impl FnOnce(&Library, &VendorObjects) -> Result<Option<Vec<u8>>, CurandStatus>,
    ) -> Result<Option<Vec<u8>>, CurandStatus> {
        let g = self.rand_generator(handle)?;
        // The guest's word on where the numbers go must be the generator's.
        if g.host != (on_host != 0) {
            crate::guest_warn!(
                self.id,
                "{handle:#x}: a {} generator's numbers sent as {} memory: CURAND_STATUS_OUT_OF_RANGE",
                if g.host { "host" } else { "device" },
                if g.host { "device" } else { "host" }
            );
            return Err(CurandStatus::OUT_OF_RANGE);
        }
        let captured = self.rand_work(cx, &g)?;
        let launched = cx.graph.launch.is_some();
        let from = cx.graph.position.get().filter(|_| launched).unwrap_or(g.position());
        if captured {
            cx.graph.position.set(Some(from));
        }
        let (out, drawn) = match self.vendor_curand() {
            Some(_) if captured => (None, n),
            Some(curand) => {
                self.backend.bind(g.device).map_err(rand_status)?;
                if launched {
                    vendor_status(curand.set_offset(g.raw, from))?;
                }
                // The generated call, with the output range the dispatch checked (or the reply's
                // buffer it sized) and the live vendor generator.
                let out = vendor(&curand.library, &VendorObjects { generator: g.raw });
                if launched {
                    vendor_status(curand.set_offset(g.raw, g.position()))?;
                }
                (out?, n)
            }
            None => {
                let count = usize::try_from(n).map_err(|_| CurandStatus::OUT_OF_RANGE)?;
                let (bytes, drawn) = if is_quasi(g.rng_type) {
                    draw.run_quasi(g.dimensions, from, count).inspect_err(|e| {
                        if *e == NOT_SUPPORTED {
                            crate::guest_warn!(
                                self.id,
                                "{}: Poisson numbers of a quasi-random generator are not computed on emu: \
                                 CURAND_STATUS_ARCH_MISMATCH",
                                cx.function.map_or("cuRAND", |f| f.name())
                            );
                        }
                    })?
                } else {
                    let mut words = Words::new(g.seed, from);
                    let bytes = draw.run(&mut words, count, g.rng_type)?;
                    (bytes, words.position() - from)
                };
                let out = match output {
                    // Drawn (and checked) only to learn how far the generator moves.
                    _ if captured => None,
                    Ptr::Device(addr) if !bytes.is_empty() => {
                        let stream = self.objects.streams.resolve(g.stream).map_err(rand_status)?;
                        self.backend.memcpy_htod(*addr, &bytes, Some(stream)).map_err(rand_status)?;
                        None
                    }
                    Ptr::Device(_) => None,
                    Ptr::Out(len) if *len == bytes.len() as u64 => Some(bytes),
                    _ => return Err(CurandStatus::OUT_OF_RANGE),
                };
                (out, drawn)
            }
        };
        if launched {
            return Ok(out);
        }
        let g = self.objects.rand.update(handle, |g| g.drawn = g.drawn.saturating_add(drawn)).map_err(rand_status)?;
        self.record_position(cx, handle, &g);
        if captured {
            // NVIDIA's generator moves on too; the call is the capture's (the dispatch asks).
            if let Some(curand) = self.vendor_curand() {
                vendor_status(curand.set_offset(g.raw, g.position()))?;
            }
            return Err(NOT_SUPPORTED);
        }
        Ok(out)
    }
}

impl CurandService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CurandStatus> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(rand_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &RecordFacts<'_>) {
        self.records.record(Function::Curand(id), cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(
        &self,
        _: &CallCx,
        _: FunctionId,
        access: &phos_protocol::spec::CallAccess<'_>,
    ) -> Result<(), CurandStatus> {
        self.hooks.before_call(access).map_err(rand_status)
    }

    super::library_capture::capture_hooks!(Curand);

    fn curand_create_generator(
        &self,
        cx: &CallCx,
        req: CurandCreateGeneratorRequest,
    ) -> Result<CurandCreateGeneratorReply, CurandStatus> {
        Ok(CurandCreateGeneratorReply { generator: self.create_generator(cx, req.rng_type, false)? })
    }

    fn curand_create_generator_host(
        &self,
        cx: &CallCx,
        req: CurandCreateGeneratorHostRequest,
    ) -> Result<CurandCreateGeneratorHostReply, CurandStatus> {
        Ok(CurandCreateGeneratorHostReply { generator: self.create_generator(cx, req.rng_type, true)? })
    }

    fn curand_destroy_generator(
        &self,
        _: &CallCx,
        req: CurandDestroyGeneratorRequest,
    ) -> Result<CurandDestroyGeneratorReply, CurandStatus> {
        let g = self.objects.rand.destroy(req.generator).map_err(|e| {
            crate::guest_warn!(
                self.id,
                "curandDestroyGenerator: {:#x} is not a generator of the session",
                req.generator
            );
            rand_status(e)
        })?;
        if let Some(curand) = self.vendor_curand().filter(|_| g.raw != 0) {
            vendor_status(curand.destroy(g.raw))?;
        }
        Ok(CurandDestroyGeneratorReply {})
    }

    fn curand_set_stream(&self, _: &CallCx, req: CurandSetStreamRequest) -> Result<CurandSetStreamReply, CurandStatus> {
        let g = self.rand_generator(req.generator)?;
        // The stream must be one of the session's (or a special one).
        let stream = self.objects.streams.resolve(req.stream).map_err(|_| {
            crate::guest_warn!(self.id, "curandSetStream: {:#x} is not a stream of the session", req.stream);
            CurandStatus::OUT_OF_RANGE
        })?;
        if let Some(curand) = self.vendor_curand() {
            vendor_status(curand.set_stream(g.raw, stream.cu_stream()))?;
        }
        self.objects.rand.update(req.generator, |g| g.stream = req.stream).map_err(rand_status)?;
        Ok(CurandSetStreamReply {})
    }

    fn curand_set_pseudo_random_generator_seed(
        &self,
        cx: &CallCx,
        req: CurandSetPseudoRandomGeneratorSeedRequest,
    ) -> Result<CurandSetPseudoRandomGeneratorSeedReply, CurandStatus> {
        self.restart(cx, req.generator, |c, raw| c.set_seed(raw, req.seed), |g| g.seed = req.seed)?;
        Ok(CurandSetPseudoRandomGeneratorSeedReply {})
    }

    fn curand_set_generator_offset(
        &self,
        _: &CallCx,
        req: CurandSetGeneratorOffsetRequest,
    ) -> Result<CurandSetGeneratorOffsetReply, CurandStatus> {
        // The dispatch records this call: it is the generator's position record itself.
        let g = self.rand_generator(req.generator)?;
        if let Some(curand) = self.vendor_curand() {
            vendor_status(curand.set_offset(g.raw, req.offset))?;
        }
        self.objects
            .rand
            .update(req.generator, |g| {
                g.offset = req.offset;
                g.drawn = 0;
            })
            .map_err(rand_status)?;
        Ok(CurandSetGeneratorOffsetReply {})
    }

    fn curand_set_generator_ordering(
        &self,
        cx: &CallCx,
        req: CurandSetGeneratorOrderingRequest,
    ) -> Result<CurandSetGeneratorOrderingReply, CurandStatus> {
        if self.vendor_curand().is_none() && !is_pseudo_ordering(req.order) {
            crate::guest_warn!(
                self.id,
                "curandSetGeneratorOrdering: ordering {}: CURAND_STATUS_OUT_OF_RANGE",
                req.order
            );
            return Err(CurandStatus::OUT_OF_RANGE);
        }
        self.restart(cx, req.generator, |c, raw| c.set_ordering(raw, req.order), |g| g.ordering = req.order)?;
        Ok(CurandSetGeneratorOrderingReply {})
    }

    fn curand_set_quasi_random_generator_dimensions(
        &self,
        cx: &CallCx,
        req: CurandSetQuasiRandomGeneratorDimensionsRequest,
    ) -> Result<CurandSetQuasiRandomGeneratorDimensionsReply, CurandStatus> {
        let g = self.rand_generator(req.generator)?;
        if self.vendor_curand().is_none() && !is_quasi(g.rng_type) {
            crate::guest_warn!(
                self.id,
                "curandSetQuasiRandomGeneratorDimensions: {:#x} is a pseudo-random generator: CURAND_STATUS_TYPE_ERROR",
                req.generator
            );
            return Err(CurandStatus::TYPE_ERROR);
        }
        let dimensions = req.num_dimensions;
        if self.vendor_curand().is_none() && dimensions > cpu_rand::SOBOL_DIMENSIONS {
            crate::guest_warn!(
                self.id,
                "curandSetQuasiRandomGeneratorDimensions: {dimensions} dimensions: emu serves up to {}: \
                 CURAND_STATUS_OUT_OF_RANGE",
                cpu_rand::SOBOL_DIMENSIONS
            );
            return Err(CurandStatus::OUT_OF_RANGE);
        }
        self.restart(cx, req.generator, |c, raw| c.set_dimensions(raw, dimensions), |g| g.dimensions = dimensions)?;
        Ok(CurandSetQuasiRandomGeneratorDimensionsReply {})
    }

    fn curand_generate_seeds(
        &self,
        _: &CallCx,
        req: CurandGenerateSeedsRequest,
    ) -> Result<CurandGenerateSeedsReply, CurandStatus> {
        let g = self.rand_generator(req.generator)?;
        if let Some(curand) = self.vendor_curand() {
            self.backend.bind(g.device).map_err(rand_status)?;
            vendor_status(curand.generate_seeds(g.raw))?;
        }
        Ok(CurandGenerateSeedsReply {})
    }

    fn curand_generate(
        &self,
        cx: &CallCx,
        req: CurandGenerateRequest<'_>,
    ) -> Result<CurandGenerateReply, CurandStatus> {
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.num, Draw::Bits32, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateReply { outputPtr: out })
    }

    fn curand_generate_long_long(
        &self,
        cx: &CallCx,
        req: CurandGenerateLongLongRequest<'_>,
    ) -> Result<CurandGenerateLongLongReply, CurandStatus> {
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.num, Draw::Bits64, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateLongLongReply { outputPtr: out })
    }

    fn curand_generate_uniform(
        &self,
        cx: &CallCx,
        req: CurandGenerateUniformRequest<'_>,
    ) -> Result<CurandGenerateUniformReply, CurandStatus> {
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.num, Draw::Uniform, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateUniformReply { outputPtr: out })
    }

    fn curand_generate_uniform_double(
        &self,
        cx: &CallCx,
        req: CurandGenerateUniformDoubleRequest<'_>,
    ) -> Result<CurandGenerateUniformDoubleReply, CurandStatus> {
        let draw = Draw::UniformDouble;
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.num, draw, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateUniformDoubleReply { outputPtr: out })
    }

    fn curand_generate_normal(
        &self,
        cx: &CallCx,
        req: CurandGenerateNormalRequest<'_>,
    ) -> Result<CurandGenerateNormalReply, CurandStatus> {
        let draw = Draw::Normal { mean: req.mean.into(), stddev: req.stddev.into(), wide: false, log: false };
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.n, draw, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateNormalReply { outputPtr: out })
    }

    fn curand_generate_normal_double(
        &self,
        cx: &CallCx,
        req: CurandGenerateNormalDoubleRequest<'_>,
    ) -> Result<CurandGenerateNormalDoubleReply, CurandStatus> {
        let draw = Draw::Normal { mean: req.mean, stddev: req.stddev, wide: true, log: false };
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.n, draw, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateNormalDoubleReply { outputPtr: out })
    }

    fn curand_generate_log_normal(
        &self,
        cx: &CallCx,
        req: CurandGenerateLogNormalRequest<'_>,
    ) -> Result<CurandGenerateLogNormalReply, CurandStatus> {
        let draw = Draw::Normal { mean: req.mean.into(), stddev: req.stddev.into(), wide: false, log: true };
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.n, draw, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateLogNormalReply { outputPtr: out })
    }

    fn curand_generate_log_normal_double(
        &self,
        cx: &CallCx,
        req: CurandGenerateLogNormalDoubleRequest<'_>,
    ) -> Result<CurandGenerateLogNormalDoubleReply, CurandStatus> {
        let draw = Draw::Normal { mean: req.mean, stddev: req.stddev, wide: true, log: true };
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.n, draw, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGenerateLogNormalDoubleReply { outputPtr: out })
    }

    fn curand_generate_poisson(
        &self,
        cx: &CallCx,
        req: CurandGeneratePoissonRequest<'_>,
    ) -> Result<CurandGeneratePoissonReply, CurandStatus> {
        let draw = Draw::Poisson { lambda: req.lambda };
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.n, draw, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGeneratePoissonReply { outputPtr: out })
    }

    fn curand_generate_poisson_method(
        &self,
        cx: &CallCx,
        req: CurandGeneratePoissonMethodRequest<'_>,
    ) -> Result<CurandGeneratePoissonMethodReply, CurandStatus> {
        // The CPU generator draws the same distribution whatever the method.
        let draw = Draw::Poisson { lambda: req.lambda };
        let out = self.generate(cx, req.generator, req.on_host, &req.outputPtr, req.n, draw, |lib, t| {
            // SAFETY: `generate` calls this with the checked request and the live generator.
            unsafe { req.call_vendor(lib, t) }.map(|r| r.outputPtr)
        })?;
        Ok(CurandGeneratePoissonMethodReply { outputPtr: out })
    }
}
