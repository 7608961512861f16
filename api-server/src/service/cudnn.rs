//! cuDNN 9 (`spec/cudnn.lapis`) on the session: handles and backend descriptors live in
//! [`crate::registry::dnn`]. On a GPU each call runs with the backend's libcudnn
//! ([`crate::backend::vendor_cudnn`]) on cuDNN's own objects: the service translates every
//! handle an attribute's elements hold (descriptors and cuDNN handles, both ways), allows
//! pointer elements on variant packs only, and checks them against the session's memory when a
//! plan is executed. Without cuDNN (emu) descriptors keep and give back their attributes and
//! finalize, heuristics offer one engine config and a plan of one convolution forward runs on
//! the CPU (`cudnn_graph.rs`); what else needs cuDNN answers `CUDNN_STATUS_NOT_SUPPORTED`.
//!
//! Checkpoints: a descriptor's creation is recorded by the dispatch; the service records each
//! attribute set (the last per attribute name), each fill from `cudnnBackendGetAttribute`,
//! the finalization and a destruction the descriptor outlives (it is referred to), each after
//! what it names, so a restore replays them in that order on new cuDNN objects, and a
//! destroyed descriptor's records stay while what was made from it lives.

use phos_protocol::CudaError;
use phos_protocol::apis::Function;
use phos_protocol::cudnn::consts::*;
use phos_protocol::cudnn::*;
use phos_protocol::dnn::variant_pack_attribute;
use phos_protocol::spec::{CallAccess, DeviceAccess, RecordFacts};
use phos_protocol::{Ptr, encode};

use super::cudnn_layers::{LayerCall, Operand, ReduceCall};
use super::cudnn_legacy::{BnKind, BnSize, int_array, int_array_out, scaling_pair};
use super::cudnn_ops::checked_conv;
use super::{CallCx, Session};
use crate::backend::vendor_cudnn::{ActivationCall, BnCall, ConvCall, ConvDirection, Cudnn, CudnnVersions, TensorOp};
use crate::dispatch::cudart::CudartService;
use crate::dispatch::cudnn::CudnnService;
use crate::registry::dnn::{
    ActivationSettings, Attribute, ConvSettings, Descriptor, DnnHandle, LegacyKind, LrnSettings, MAX_DNN_DESCRIPTORS,
    MAX_DNN_HANDLES, OpTensorSettings, ReduceSettings,
};
use crate::registry::handles::NewHandle;

/// `CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR`: the one descriptor type whose attributes may hold
/// device pointers.
const VARIANT_PACK: i32 = 16;
/// `CUDNN_BACKEND_ENGINECFG_DESCRIPTOR`, `CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR` and the
/// heuristics' results (`CUDNN_ATTR_ENGINEHEUR_RESULTS`): the one fill `emu` does.
const ENGINECFG: i32 = 3;
const ENGINEHEUR: i32 = 4;
const ENGINEHEUR_RESULTS: i32 = 202;
/// The engine configs `emu`'s heuristics offer: its one engine.
const EMU_CONFIGS: i64 = 1;
/// The newest descriptor type of the cuDNN Phos's spec was written from (9.28): what `emu`
/// accepts.
const LAST_DESCRIPTOR_TYPE: i32 = 50;

/// What `emu` answers for the versions: the cuDNN of the headers the spec was written from.
const EMU_VERSIONS: CudnnVersions = CudnnVersions { version: 92800, max_device_version: 1210, cudart_version: 12090 };

/// A runtime failure as cuDNN reports it: a handle that is not the session's, or a bad value,
/// is `BAD_PARAM`; a table at its limit `INTERNAL_ERROR_HOST_ALLOCATION_FAILED`.
pub(super) fn dnn_status(e: CudaError) -> CudnnStatus {
    match e {
        CudaError::MemoryAllocation => CudnnStatus::INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
        CudaError::NotSupported => CudnnStatus::NOT_SUPPORTED,
        _ => CudnnStatus::BAD_PARAM,
    }
}

pub(super) fn vendor_status(code: i32) -> Result<(), CudnnStatus> {
    if code == SUCCESS { Ok(()) } else { Err(CudnnStatus(code)) }
}

/// Whether a failure of `id`, sent without waiting, waits for the next synchronous cuDNN call
/// whatever it names (`deferred::ANY`): a tensor descriptor's setting or destruction, or a
/// backend descriptor's (a variant pack's) setting, finalization or destruction, whose
/// descriptor the calls that use it do not name first.
pub(crate) fn defers_to_any(id: Function) -> bool {
    matches!(
        id,
        Function::Cudnn(
            FunctionId::CudnnSetTensor4dDescriptor
                | FunctionId::CudnnSetTensor4dDescriptorEx
                | FunctionId::CudnnSetTensorNdDescriptor
                | FunctionId::CudnnSetTensorNdDescriptorEx
                | FunctionId::CudnnDeriveBNTensorDescriptor
                | FunctionId::CudnnDestroyTensorDescriptor
                | FunctionId::CudnnBackendSetAttribute
                | FunctionId::CudnnBackendFinalize
                | FunctionId::CudnnBackendDestroyDescriptor
        )
    )
}

/// `cudnnSetTensor` as guests built before its value was sized by the tensor's type send it
/// (id 315, retired: always a 4-byte float).
#[allow(non_snake_case)]
#[derive(bincode::BorrowDecode)]
struct RetiredSetTensorRequest<'a> {
    handle: u64,
    yDesc: u64,
    y: u64,
    valuePtr: &'a [u8],
}

/// The retired id of `cudnnSetTensor` that deployed guests still send.
const RETIRED_SET_TENSOR: u32 = 315;

/// A call of a retired function that a deployed guest may still send and that a carried one
/// serves: its function id and request as the carried one takes them (`None` for every other
/// call, and for a request that does not decode, which the dispatch then refuses by its id).
/// `cudnnSetTensor`'s old id 315 is served by id 366's handler, its value a float (4 bytes),
/// which is what that guest sent; the handler checks it against the tensor as any.
pub(crate) fn retired_call(api: u16, function: u32, payload: &[u8]) -> Option<(u32, Vec<u8>)> {
    if api != phos_protocol::apis::Api::Cudnn.id() || function != RETIRED_SET_TENSOR {
        return None;
    }
    let old: RetiredSetTensorRequest<'_> = phos_protocol::decode_request(payload).ok()?;
    let value_bytes = old.valuePtr.len() as i64;
    let req = CudnnSetTensorRequest {
        handle: old.handle,
        yDesc: old.yDesc,
        y: old.y,
        valuePtr: old.valuePtr,
        valueBytes: value_bytes,
    };
    Some((FunctionId::CudnnSetTensor as u32, encode(&req)))
}

/// The bytes of one element of an attribute type (cudnn_graph.h's layouts).
fn element_size(ty: i32) -> Option<usize> {
    match ty {
        CUDNN_TYPE_HANDLE
        | CUDNN_TYPE_INT64
        | CUDNN_TYPE_DOUBLE
        | CUDNN_TYPE_VOID_PTR
        | CUDNN_TYPE_BACKEND_DESCRIPTOR => Some(8),
        CUDNN_TYPE_BOOLEAN | CUDNN_TYPE_CHAR => Some(1),
        CUDNN_TYPE_FRACTION => Some(16),
        CUDNN_TYPE_HANDLE..=CUDNN_TYPE_CUDA_GRAPH_RETENTION => Some(4),
        _ => None,
    }
}

/// The 64-bit elements of an attribute's bytes.
fn words(bytes: &[u8]) -> Vec<u64> {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
}

fn from_words(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The bytes of a buffer argument (the dispatch has checked its shape and size).
fn bytes_of<'a>(p: &Ptr<'a>) -> &'a [u8] {
    match p {
        Ptr::In(b) | Ptr::InOut(b) => b,
        _ => &[],
    }
}

impl Session {
    /// Where every cuDNN compute call starts its work on the handle's stream: the one place
    /// cuDNN decides about stream capture (taken into the capture, or refused there; see
    /// `library_capture`).
    pub(super) fn dnn_work(&self, cx: &CallCx, h: &DnnHandle) -> Result<(), CudnnStatus> {
        self.library_work(cx, h.stream, None, "CUDNN_STATUS_NOT_SUPPORTED").map_err(|_| CudnnStatus::NOT_SUPPORTED)
    }

    pub(super) fn vendor_cudnn(&self) -> Option<&Cudnn> {
        self.backend.cudnn()
    }

    /// A bad argument of a call: logged (bounded), `CUDNN_STATUS_BAD_PARAM`.
    pub(super) fn dnn_bad(&self, cx: &CallCx, why: std::fmt::Arguments<'_>) -> CudnnStatus {
        let name = cx.function.map_or("cuDNN", |f| f.name());
        crate::guest_warn!(self.id, "{name}: {why}: CUDNN_STATUS_BAD_PARAM");
        CudnnStatus::BAD_PARAM
    }

    /// What needs cuDNN where the backend has none: logged (bounded), `NOT_SUPPORTED`.
    fn dnn_unsupported(&self, cx: &CallCx, what: &str) -> CudnnStatus {
        let name = cx.function.map_or("cuDNN", |f| f.name());
        crate::guest_warn!(
            self.id,
            "{name}: {what} needs cuDNN, which this backend does not have: CUDNN_STATUS_NOT_SUPPORTED"
        );
        CudnnStatus::NOT_SUPPORTED
    }

    pub(super) fn dnn_handle(&self, cx: &CallCx, handle: u64) -> Result<DnnHandle, CudnnStatus> {
        self.objects
            .dnn
            .handle(handle)
            .map_err(|_| self.dnn_bad(cx, format_args!("{handle:#x} is not a cuDNN handle of the session")))
    }

    fn dnn_descriptor(&self, cx: &CallCx, handle: u64) -> Result<Descriptor, CudnnStatus> {
        self.objects
            .dnn
            .descriptor(handle)
            .map_err(|_| self.dnn_bad(cx, format_args!("{handle:#x} is not a backend descriptor of the session")))
    }

    /// The elements of an attribute as cuDNN takes them: descriptors and handles become
    /// cuDNN's own; pointers must be null or the session's device memory, on a variant pack.
    /// Also answers the descriptors the elements name.
    fn dnn_elements_in(
        &self,
        cx: &CallCx,
        owner: &Descriptor,
        ty: i32,
        elements: &[u8],
        for_output: bool,
    ) -> Result<(Vec<u8>, Vec<u64>), CudnnStatus> {
        match ty {
            CUDNN_TYPE_BACKEND_DESCRIPTOR => {
                let handles = words(elements);
                let mut raw = Vec::with_capacity(handles.len());
                for &h in &handles {
                    raw.push(self.dnn_descriptor(cx, h)?.raw);
                }
                Ok((from_words(&raw), handles))
            }
            // What a get fills in place of a handle is cuDNN's: nothing to translate in.
            CUDNN_TYPE_HANDLE if for_output => Ok((elements.to_vec(), Vec::new())),
            CUDNN_TYPE_HANDLE => {
                let mut raw = Vec::new();
                for h in words(elements) {
                    raw.push(self.dnn_handle(cx, h)?.raw);
                }
                Ok((from_words(&raw), Vec::new()))
            }
            CUDNN_TYPE_VOID_PTR if !for_output => {
                if owner.kind != VARIANT_PACK {
                    return Err(self.dnn_bad(
                        cx,
                        format_args!(
                            "pointer elements on a descriptor of type {} (only variant packs hold pointers)",
                            owner.kind
                        ),
                    ));
                }
                for addr in words(elements) {
                    if addr != 0 && !self.objects.memory.contains(addr, 1) {
                        return Err(self.dnn_bad(cx, format_args!("{addr:#x} is not device memory of the session")));
                    }
                }
                Ok((elements.to_vec(), Vec::new()))
            }
            // A bool holding anything but 0 or 1 is undefined in C++: normalised.
            CUDNN_TYPE_BOOLEAN => Ok((elements.iter().map(|&b| u8::from(b != 0)).collect(), Vec::new())),
            _ => Ok((elements.to_vec(), Vec::new())),
        }
    }

    /// A setting of a descriptor, for restores: kept per `key`, after what it names.
    fn dnn_record(&self, cx: &CallCx, id: FunctionId, key: u64, payload: &[u8], descriptor: u64, names: &[u64]) {
        let mutated = [("cudnn_backend_descriptor", descriptor)];
        let facts = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: names, global: false };
        self.records.record_keyed(Function::Cudnn(id), key, cx.device, payload, &facts);
    }

    /// `cudnnBackendGetAttribute` of descriptor elements: the program's descriptors are filled
    /// in place (by position), each recorded as filled from `d`, which it now refers to (so `d`
    /// lives on, hidden, if the program destroys it first).
    ///
    /// A restore replays the fill once per descriptor it filled that still lives, with the
    /// program's whole array: those the program destroyed since (their records went with
    /// them) are not the session's, and a stand-in of the same type takes each one's place for
    /// the call, so every live one gets the result of its own position again.
    fn dnn_fill(
        &self,
        cx: &CallCx,
        d: &Descriptor,
        req: &CudnnBackendGetAttributeRequest<'_>,
        given: &[u8],
    ) -> Result<CudnnBackendGetAttributeReply, CudnnStatus> {
        let handles = words(given);
        let mut targets: Vec<Option<Descriptor>> = Vec::with_capacity(handles.len());
        for &h in &handles {
            match self.objects.dnn.descriptor(h) {
                Ok(t) => targets.push(Some(t)),
                Err(_) if cx.replay.is_some() => targets.push(None),
                Err(_) => {
                    return Err(self.dnn_bad(cx, format_args!("{h:#x} is not a backend descriptor of the session")));
                }
            }
        }
        let kind = targets.iter().flatten().map(|t| t.kind).next();
        let count = match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(dnn_status)?;
                let mut stand_ins = Vec::new();
                let mut raw = Vec::with_capacity(targets.len());
                let mut made = Ok(());
                for t in &targets {
                    match (t, kind) {
                        (Some(t), _) => raw.push(t.raw),
                        (None, Some(kind)) => match cudnn.create_descriptor(kind) {
                            Ok(r) => {
                                stand_ins.push(r);
                                raw.push(r);
                            }
                            Err(code) => made = Err(CudnnStatus(code)),
                        },
                        (None, None) => made = Err(CudnnStatus::BAD_PARAM),
                    }
                }
                let mut elements = from_words(&raw);
                let got = made.and_then(|()| {
                    cudnn
                        .get_attribute(d.raw, req.attributeName, req.attributeType, req.wanted, &mut elements)
                        .map_err(CudnnStatus)
                });
                for r in stand_ins {
                    cudnn.destroy_descriptor(r);
                }
                got?
            }
            None => self.dnn_emu_fill(cx, d, req, &handles, &targets)?,
        };
        let written = usize::try_from(count).unwrap_or(0).min(handles.len());
        let payload = encode(req);
        let key = req.attributeName as u32 as u64;
        for (&f, _) in handles.iter().zip(&targets).take(written).filter(|(_, t)| t.is_some()) {
            self.objects.dnn.refer(f, &[req.descriptor]);
            self.dnn_record(cx, FunctionId::CudnnBackendGetAttribute, key, &payload, f, &[req.descriptor]);
        }
        Ok(CudnnBackendGetAttributeReply { elementCount: count, arrayOfElements: Some(given.to_vec()) })
    }

    /// `emu`'s fills: a finalized heuristics descriptor offers one engine config (its engine),
    /// filled as finalized; every other descriptor fill needs cuDNN.
    fn dnn_emu_fill(
        &self,
        cx: &CallCx,
        d: &Descriptor,
        req: &CudnnBackendGetAttributeRequest<'_>,
        handles: &[u64],
        targets: &[Option<Descriptor>],
    ) -> Result<i64, CudnnStatus> {
        if d.kind != ENGINEHEUR || req.attributeName != ENGINEHEUR_RESULTS {
            return Err(self.dnn_unsupported(
                cx,
                &format!("filling descriptors from attribute {} of a descriptor of type {}", req.attributeName, d.kind),
            ));
        }
        if !d.finalized {
            crate::guest_warn!(
                self.id,
                "cudnnBackendGetAttribute: heuristics results of a descriptor not finalized: \
                 CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED"
            );
            return Err(CudnnStatus::BAD_PARAM_NOT_FINALIZED);
        }
        // The count is the attribute's (cuDNN writes the lesser of it and the array's).
        let filled = (EMU_CONFIGS as usize).min(handles.len());
        for (h, t) in handles.iter().zip(targets).take(filled) {
            if let Some(t) = t.as_ref().filter(|t| t.kind != ENGINECFG) {
                return Err(self.dnn_bad(cx, format_args!("{h:#x} (type {}) filled with an engine config", t.kind)));
            }
        }
        for (&h, _) in handles.iter().zip(targets).take(filled).filter(|(_, t)| t.is_some()) {
            self.objects.dnn.finalize(h).map_err(dnn_status)?;
        }
        Ok(EMU_CONFIGS)
    }

    /// A variant pack's record becomes a creation's (`cudnnBackendCreateDescriptor` of a
    /// variant pack under its handle): what was recorded of it before goes.
    fn dnn_record_pack_creation(&self, cx: &CallCx, handle: u64) {
        let object = [("cudnn_backend_descriptor", handle)];
        let facts = RecordFacts { created: &object, destroyed: &object, mutated: &[], depends_on: &[], global: false };
        let payload = encode(&CudnnBackendCreateDescriptorRequest { descriptorType: VARIANT_PACK });
        self.records.record(Function::Cudnn(FunctionId::CudnnBackendCreateDescriptor), cx.device, &payload, &facts);
    }

    /// Make a parked variant pack again (the guest's pool, `phosCudnnVariantPackReinit`): a
    /// fresh one, holding nothing (and a fresh cuDNN descriptor), under the same handle,
    /// recorded as made by `cudnnBackendCreateDescriptor`. Sent without waiting: the caller
    /// keeps a failure (a handle that is not a parked variant pack of the session, cuDNN's)
    /// for the next synchronous cuDNN call.
    fn dnn_reinit_pack(&self, cx: &CallCx, handle: u64) -> Result<(), CudnnStatus> {
        let raw = match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(dnn_status)?;
                cudnn.create_descriptor(VARIANT_PACK).map_err(CudnnStatus)?
            }
            None => 0,
        };
        if self.objects.dnn.reinit_pack(handle, VARIANT_PACK, raw).is_err() {
            if let Some(cudnn) = self.vendor_cudnn().filter(|_| raw != 0) {
                cudnn.destroy_descriptor(raw);
            }
            return Err(self.dnn_bad(cx, format_args!("{handle:#x} is not a parked variant pack of the session")));
        }
        self.dnn_record_pack_creation(cx, handle);
        Ok(())
    }

    /// A variant pack goes into the guest's pool (`phosCudnnVariantPackPark`): emptied (cuDNN's
    /// descriptor destroyed, its attributes and finalization forgotten) and refused from now on
    /// until the guest makes it again. Its records become a creation's and the park's, so a
    /// restore makes it parked, holding none of the pointers it held (their memory may be gone
    /// by then). One that is not a live variant pack of the session, or that another descriptor
    /// refers to, is refused and nothing changes.
    fn dnn_park_pack(&self, cx: &CallCx, req: &PhosCudnnVariantPackParkRequest) -> Result<(), CudnnStatus> {
        let handle = req.variantPack;
        if self.vendor_cudnn().is_some() {
            self.backend.bind(cx.device).map_err(dnn_status)?;
        }
        let raw = self.objects.dnn.park_pack(handle, VARIANT_PACK).map_err(|_| {
            self.dnn_bad(
                cx,
                format_args!(
                    "{handle:#x} is not a live variant pack of the session that no other descriptor refers to"
                ),
            )
        })?;
        if let Some(cudnn) = self.vendor_cudnn().filter(|_| raw != 0) {
            // Parked whatever cuDNN answers: the program let go of it.
            cudnn.destroy_descriptor(raw);
        }
        self.dnn_record_pack_creation(cx, handle);
        let mutated = [("cudnn_backend_descriptor", handle)];
        let facts = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
        self.records.record(Function::Cudnn(FunctionId::PhosCudnnVariantPackPark), cx.device, &encode(req), &facts);
        Ok(())
    }

    /// The variant pack's pointers, checked against the session's memory now (an allocation
    /// may have been freed since they were set), each with the allocation it lies in, shown to
    /// the checkpoint engine as written (what the plan writes only cuDNN knows).
    fn dnn_variant_pack_access(&self, cx: &CallCx, pack: &Descriptor) -> Result<Vec<DeviceAccess>, CudnnStatus> {
        let mut access = Vec::new();
        for attribute in pack.attributes.values().filter(|a| a.ty == CUDNN_TYPE_VOID_PTR) {
            for addr in words(&attribute.elements).into_iter().filter(|&a| a != 0) {
                let Some(allocation) = self.objects.memory.allocation_at(addr) else {
                    return Err(self.dnn_bad(
                        cx,
                        format_args!("the variant pack names {addr:#x}, not device memory of the session"),
                    ));
                };
                access.push(DeviceAccess { addr: allocation.addr, len: allocation.size, writes: true });
            }
        }
        Ok(access)
    }
}

impl CudnnService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CudnnStatus> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(dnn_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &RecordFacts<'_>) {
        self.records.record(Function::Cudnn(id), cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CudnnStatus> {
        self.hooks.before_call(access).map_err(dnn_status)
    }

    super::library_capture::capture_hooks!(Cudnn);

    fn cudnn_create(&self, cx: &CallCx, _: CudnnCreateRequest) -> Result<CudnnCreateReply, CudnnStatus> {
        self.check_device(cx.device).map_err(|_| CudnnStatus::NOT_INITIALIZED)?;
        let full = || {
            crate::guest_warn!(self.id, "cudnnCreate: the session holds {MAX_DNN_HANDLES} cuDNN handles already");
            CudaError::MemoryAllocation
        };
        // On a GPU, NVIDIA's handle, made on the session's context.
        let raw = match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(dnn_status)?;
                cudnn.create().map_err(CudnnStatus)?
            }
            None => 0,
        };
        let h = DnnHandle { device: cx.device, stream: 0, raw };
        self.objects
            .dnn
            .create_handle(h, &NewHandle { forced: cx.forced(), full: &full })
            .map(|handle| CudnnCreateReply { handle })
            .map_err(|e| {
                if let Some(cudnn) = self.vendor_cudnn().filter(|_| raw != 0) {
                    cudnn.destroy(raw);
                }
                dnn_status(e)
            })
    }

    fn cudnn_destroy(&self, cx: &CallCx, req: CudnnDestroyRequest) -> Result<CudnnDestroyReply, CudnnStatus> {
        let h =
            self.objects.dnn.destroy_handle(req.handle).map_err(|_| {
                self.dnn_bad(cx, format_args!("{:#x} is not a cuDNN handle of the session", req.handle))
            })?;
        if let Some(cudnn) = self.vendor_cudnn().filter(|_| h.raw != 0) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            vendor_status(cudnn.destroy(h.raw))?;
        }
        Ok(CudnnDestroyReply {})
    }

    fn cudnn_set_stream(&self, cx: &CallCx, req: CudnnSetStreamRequest) -> Result<CudnnSetStreamReply, CudnnStatus> {
        let h = self.dnn_handle(cx, req.handle)?;
        // The stream must be one of the session's (or a special one).
        let stream = self
            .objects
            .streams
            .resolve(req.streamId)
            .map_err(|_| self.dnn_bad(cx, format_args!("{:#x} is not a stream of the session", req.streamId)))?;
        if let Some(cudnn) = self.vendor_cudnn().filter(|_| h.raw != 0) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            vendor_status(cudnn.set_stream(h.raw, stream.cu_stream()))?;
        }
        self.objects.dnn.set_stream(req.handle, req.streamId).map_err(dnn_status)?;
        Ok(CudnnSetStreamReply {})
    }

    fn cudnn_get_stream(&self, cx: &CallCx, req: CudnnGetStreamRequest) -> Result<CudnnGetStreamReply, CudnnStatus> {
        Ok(CudnnGetStreamReply { streamId: self.dnn_handle(cx, req.handle)?.stream })
    }

    fn phos_cudnn_get_versions(
        &self,
        _: &CallCx,
        _: PhosCudnnGetVersionsRequest,
    ) -> Result<PhosCudnnGetVersionsReply, CudnnStatus> {
        let v = self.vendor_cudnn().map_or(EMU_VERSIONS, Cudnn::versions);
        Ok(PhosCudnnGetVersionsReply {
            version: v.version as u64,
            max_device_version: v.max_device_version as u64,
            cudart_version: v.cudart_version as u64,
        })
    }

    fn cudnn_backend_create_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnBackendCreateDescriptorRequest,
    ) -> Result<CudnnBackendCreateDescriptorReply, CudnnStatus> {
        let full = || {
            crate::guest_warn!(
                self.id,
                "cudnnBackendCreateDescriptor: the session holds {MAX_DNN_DESCRIPTORS} backend descriptors already"
            );
            CudaError::MemoryAllocation
        };
        let raw = match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(dnn_status)?;
                cudnn.create_descriptor(req.descriptorType).map_err(CudnnStatus)?
            }
            None if (0..=LAST_DESCRIPTOR_TYPE).contains(&req.descriptorType) => 0,
            None => return Err(self.dnn_bad(cx, format_args!("descriptor type {}", req.descriptorType))),
        };
        let d = Descriptor { kind: req.descriptorType, raw, ..Descriptor::default() };
        self.objects
            .dnn
            .create_descriptor(d, &NewHandle { forced: cx.forced(), full: &full })
            .map(|descriptor| CudnnBackendCreateDescriptorReply { descriptor })
            .map_err(|e| {
                if let Some(cudnn) = self.vendor_cudnn().filter(|_| raw != 0) {
                    cudnn.destroy_descriptor(raw);
                }
                dnn_status(e)
            })
    }

    fn cudnn_backend_destroy_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnBackendDestroyDescriptorRequest,
    ) -> Result<CudnnBackendDestroyDescriptorReply, CudnnStatus> {
        let gone = self.objects.dnn.release_descriptor(req.descriptor).map_err(|_| {
            self.dnn_bad(cx, format_args!("{:#x} is not a backend descriptor of the session", req.descriptor))
        })?;
        if gone.is_empty() {
            // Referred to: it lives on, and a restore must hide it again.
            let payload = encode(&req);
            self.dnn_record(cx, FunctionId::CudnnBackendDestroyDescriptor, 0, &payload, req.descriptor, &[]);
            return Ok(CudnnBackendDestroyDescriptorReply {});
        }
        let destroyed: Vec<(&'static str, u64)> = gone.iter().map(|&(h, _)| ("cudnn_backend_descriptor", h)).collect();
        let facts = RecordFacts { created: &[], destroyed: &destroyed, mutated: &[], depends_on: &[], global: false };
        self.records.record(Function::Cudnn(FunctionId::CudnnBackendDestroyDescriptor), cx.device, &[], &facts);
        if let Some(cudnn) = self.vendor_cudnn() {
            self.backend.bind(cx.device).map_err(dnn_status)?;
            for (_, raw) in gone.into_iter().filter(|&(_, raw)| raw != 0) {
                vendor_status(cudnn.destroy_descriptor(raw))?;
            }
        }
        Ok(CudnnBackendDestroyDescriptorReply {})
    }

    fn cudnn_backend_finalize(
        &self,
        cx: &CallCx,
        req: CudnnBackendFinalizeRequest,
    ) -> Result<CudnnBackendFinalizeReply, CudnnStatus> {
        let d = self.dnn_descriptor(cx, req.descriptor)?;
        match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(dnn_status)?;
                vendor_status(cudnn.finalize(d.raw))?;
            }
            None if d.finalized => {
                return Err(self.dnn_bad(cx, format_args!("{:#x} is finalized already", req.descriptor)));
            }
            None => {}
        }
        self.objects.dnn.finalize(req.descriptor).map_err(dnn_status)?;
        self.dnn_record(cx, FunctionId::CudnnBackendFinalize, 0, &encode(&req), req.descriptor, &[]);
        Ok(CudnnBackendFinalizeReply {})
    }

    fn cudnn_backend_set_attribute(
        &self,
        cx: &CallCx,
        req: CudnnBackendSetAttributeRequest<'_>,
    ) -> Result<CudnnBackendSetAttributeReply, CudnnStatus> {
        let d = self.dnn_descriptor(cx, req.descriptor)?;
        if d.kind == VARIANT_PACK {
            // A variant pack's documented attributes as cuDNN checks them (the rule the guest
            // applies before it sends one without waiting). On a GPU cuDNN answers a wrong
            // count itself; a wrong type is answered here, before the elements are taken for
            // what the type says (unique ids as pointers would fail the pointer check first).
            let rule = variant_pack_attribute(req.attributeName, req.attributeType, req.elementCount);
            let answered_here = self.vendor_cudnn().is_none() || rule == Err(CudnnStatus::NOT_SUPPORTED);
            if let (Err(status), true) = (rule, answered_here) {
                crate::guest_warn!(
                    self.id,
                    "cudnnBackendSetAttribute: attribute {} of a variant pack as {} elements of type {}: {}",
                    req.attributeName,
                    req.elementCount,
                    req.attributeType,
                    status.name()
                );
                return Err(status);
            }
        }
        let elements = bytes_of(&req.arrayOfElements);
        let (translated, refers_to) = self.dnn_elements_in(cx, &d, req.attributeType, elements, false)?;
        match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(dnn_status)?;
                let code =
                    cudnn.set_attribute(d.raw, req.attributeName, req.attributeType, req.elementCount, &translated);
                vendor_status(code)?;
            }
            None if d.finalized => {
                return Err(
                    self.dnn_bad(cx, format_args!("{:#x} is finalized (its attributes are read-only)", req.descriptor))
                );
            }
            None => {}
        }
        let mut names = refers_to.clone();
        if req.attributeType == CUDNN_TYPE_HANDLE {
            names.extend(words(elements));
        }
        let attribute = Attribute { ty: req.attributeType, count: req.elementCount, elements: elements.to_vec() };
        self.objects.dnn.set_attribute(req.descriptor, req.attributeName, attribute, &refers_to);
        let key = req.attributeName as u32 as u64;
        self.dnn_record(cx, FunctionId::CudnnBackendSetAttribute, key, &encode(&req), req.descriptor, &names);
        Ok(CudnnBackendSetAttributeReply {})
    }

    fn cudnn_backend_get_attribute(
        &self,
        cx: &CallCx,
        req: CudnnBackendGetAttributeRequest<'_>,
    ) -> Result<CudnnBackendGetAttributeReply, CudnnStatus> {
        let d = self.dnn_descriptor(cx, req.descriptor)?;
        let given = bytes_of(&req.arrayOfElements);
        let size = element_size(req.attributeType).ok_or(CudnnStatus::BAD_PARAM)?;
        if req.attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR {
            return self.dnn_fill(cx, &d, &req, given);
        }
        let Some(cudnn) = self.vendor_cudnn() else {
            // emu: what the program set, as it set it.
            let Some(a) = d.attributes.get(&req.attributeName) else {
                return Err(self.dnn_unsupported(
                    cx,
                    &format!(
                        "attribute {} of a descriptor of type {} (not set by the program)",
                        req.attributeName, d.kind
                    ),
                ));
            };
            if a.ty != req.attributeType {
                return Err(CudnnStatus::BAD_PARAM_ATTRIBUTE_TYPE);
            }
            let mut out = given.to_vec();
            let n = (a.elements.len()).min(out.len());
            out[..n].copy_from_slice(&a.elements[..n]);
            return Ok(CudnnBackendGetAttributeReply { elementCount: a.count, arrayOfElements: Some(out) });
        };
        let (mut elements, _) = self.dnn_elements_in(cx, &d, req.attributeType, given, true)?;
        self.backend.bind(cx.device).map_err(dnn_status)?;
        let count = cudnn
            .get_attribute(d.raw, req.attributeName, req.attributeType, req.wanted, &mut elements)
            .map_err(CudnnStatus)?;
        let written = usize::try_from(count).unwrap_or(0).min(elements.len() / size);
        if req.attributeType == CUDNN_TYPE_HANDLE {
            // cuDNN's handles, as the session's.
            let mut out = words(given);
            for (i, raw) in words(&elements).into_iter().take(written).enumerate() {
                out[i] = self.objects.dnn.handle_of_raw(raw).ok_or(CudnnStatus::INTERNAL_ERROR)?;
            }
            elements = from_words(&out);
        }
        Ok(CudnnBackendGetAttributeReply { elementCount: count, arrayOfElements: Some(elements) })
    }

    fn cudnn_backend_execute(
        &self,
        cx: &CallCx,
        req: CudnnBackendExecuteRequest,
    ) -> Result<CudnnBackendExecuteReply, CudnnStatus> {
        let h = self.dnn_handle(cx, req.handle)?;
        let plan = self.dnn_descriptor(cx, req.executionPlan)?;
        let pack = self.dnn_descriptor(cx, req.variantPack)?;
        if pack.kind != VARIANT_PACK {
            return Err(self.dnn_bad(cx, format_args!("{:#x} is not a variant pack", req.variantPack)));
        }
        // cuDNN 9.14 executes a variant pack that was never finalized (its attributes are
        // read at the execution), so only the plan must be.
        if !plan.finalized {
            crate::guest_warn!(
                self.id,
                "cudnnBackendExecute: an execution plan not finalized: CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED"
            );
            return Err(CudnnStatus::BAD_PARAM_NOT_FINALIZED);
        }
        let access = self.dnn_variant_pack_access(cx, &pack)?;
        let Some(cudnn) = self.vendor_cudnn() else {
            self.dnn_graph_cpu(cx, &h, &plan, &pack, &access)?;
            return Ok(CudnnBackendExecuteReply {});
        };
        self.dnn_work(cx, &h)?;
        self.before_work("cudnnBackendExecute", &access).map_err(dnn_status)?;
        self.backend.bind(h.device).map_err(dnn_status)?;
        vendor_status(cudnn.execute(h.raw, plan.raw, pack.raw))?;
        Ok(CudnnBackendExecuteReply {})
    }

    fn phos_cudnn_variant_pack_reinit(
        &self,
        cx: &CallCx,
        req: PhosCudnnVariantPackReinitRequest,
    ) -> Result<PhosCudnnVariantPackReinitReply, CudnnStatus> {
        if let Err(status) = self.dnn_reinit_pack(cx, req.variantPack) {
            self.dnn_defer_any("phosCudnnVariantPackReinit", status);
        }
        Ok(PhosCudnnVariantPackReinitReply {})
    }

    fn phos_cudnn_variant_pack_park(
        &self,
        cx: &CallCx,
        req: PhosCudnnVariantPackParkRequest,
    ) -> Result<PhosCudnnVariantPackParkReply, CudnnStatus> {
        if let Err(status) = self.dnn_park_pack(cx, &req) {
            self.dnn_defer_any("phosCudnnVariantPackPark", status);
        }
        Ok(PhosCudnnVariantPackParkReply {})
    }

    // The legacy API: tensor descriptors (service/cudnn_legacy.rs).

    fn cudnn_create_tensor_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreateTensorDescriptorRequest,
    ) -> Result<CudnnCreateTensorDescriptorReply, CudnnStatus> {
        Ok(CudnnCreateTensorDescriptorReply { tensorDesc: self.dnn_create_tensor(cx)? })
    }

    fn cudnn_destroy_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyTensorDescriptorRequest,
    ) -> Result<CudnnDestroyTensorDescriptorReply, CudnnStatus> {
        self.dnn_destroy_tensor(cx, req.tensorDesc)?;
        Ok(CudnnDestroyTensorDescriptorReply {})
    }

    fn phos_cudnn_tensor_descriptor_reinit(
        &self,
        cx: &CallCx,
        req: PhosCudnnTensorDescriptorReinitRequest,
    ) -> Result<PhosCudnnTensorDescriptorReinitReply, CudnnStatus> {
        self.dnn_reinit_tensor(cx, req.tensorDesc);
        Ok(PhosCudnnTensorDescriptorReinitReply {})
    }

    fn phos_cudnn_tensor_descriptor_park(
        &self,
        cx: &CallCx,
        req: PhosCudnnTensorDescriptorParkRequest,
    ) -> Result<PhosCudnnTensorDescriptorParkReply, CudnnStatus> {
        self.dnn_park_tensor(cx, req.tensorDesc);
        Ok(PhosCudnnTensorDescriptorParkReply {})
    }

    fn cudnn_set_tensor_4d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetTensor4dDescriptorRequest,
    ) -> Result<CudnnSetTensor4dDescriptorReply, CudnnStatus> {
        let dims = [req.n, req.c, req.h, req.w];
        self.dnn_set_tensor_format(cx, req.tensorDesc, req.format, req.dataType, &dims)?;
        Ok(CudnnSetTensor4dDescriptorReply {})
    }

    fn cudnn_set_tensor_4d_descriptor_ex(
        &self,
        cx: &CallCx,
        req: CudnnSetTensor4dDescriptorExRequest,
    ) -> Result<CudnnSetTensor4dDescriptorExReply, CudnnStatus> {
        let dims = [req.n, req.c, req.h, req.w];
        let strides = [req.nStride, req.cStride, req.hStride, req.wStride];
        self.dnn_set_tensor(cx, req.tensorDesc, req.dataType, &dims, &strides)?;
        Ok(CudnnSetTensor4dDescriptorExReply {})
    }

    fn cudnn_set_tensor_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetTensorNdDescriptorRequest<'_>,
    ) -> Result<CudnnSetTensorNdDescriptorReply, CudnnStatus> {
        self.dnn_set_tensor(cx, req.tensorDesc, req.dataType, &int_array(req.dimA), &int_array(req.strideA))?;
        Ok(CudnnSetTensorNdDescriptorReply {})
    }

    fn cudnn_set_tensor_nd_descriptor_ex(
        &self,
        cx: &CallCx,
        req: CudnnSetTensorNdDescriptorExRequest<'_>,
    ) -> Result<CudnnSetTensorNdDescriptorExReply, CudnnStatus> {
        self.dnn_set_tensor_format(cx, req.tensorDesc, req.format, req.dataType, &int_array(req.dimA))?;
        Ok(CudnnSetTensorNdDescriptorExReply {})
    }

    fn cudnn_get_tensor_4d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetTensor4dDescriptorRequest,
    ) -> Result<CudnnGetTensor4dDescriptorReply, CudnnStatus> {
        let s = self.dnn_get_tensor(cx, req.tensorDesc)?;
        let ([n, c, h, w], [ns, cs, hs, ws]) = (
            <[i32; 4]>::try_from(s.dims.as_slice())
                .map_err(|_| self.dnn_bad(cx, format_args!("{} dimensions, not 4", s.dims.len())))?,
            <[i32; 4]>::try_from(s.strides.as_slice()).map_err(|_| CudnnStatus::INTERNAL_ERROR)?,
        );
        Ok(CudnnGetTensor4dDescriptorReply {
            dataType: s.data_type,
            n,
            c,
            h,
            w,
            nStride: ns,
            cStride: cs,
            hStride: hs,
            wStride: ws,
        })
    }

    fn cudnn_get_tensor_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetTensorNdDescriptorRequest,
    ) -> Result<CudnnGetTensorNdDescriptorReply, CudnnStatus> {
        let s = self.dnn_get_tensor(cx, req.tensorDesc)?;
        let room = usize::try_from(req.nbDimsRequested).map_err(|_| CudnnStatus::BAD_PARAM)?;
        Ok(CudnnGetTensorNdDescriptorReply {
            dataType: s.data_type,
            nbDims: s.dims.len() as i32,
            dimA: int_array_out(&s.dims, room),
            strideA: int_array_out(&s.strides, room),
        })
    }

    fn cudnn_get_tensor_size_in_bytes(
        &self,
        cx: &CallCx,
        req: CudnnGetTensorSizeInBytesRequest,
    ) -> Result<CudnnGetTensorSizeInBytesReply, CudnnStatus> {
        Ok(CudnnGetTensorSizeInBytesReply { size: self.dnn_tensor_size(cx, req.tensorDesc)? })
    }

    fn cudnn_derive_bn_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDeriveBNTensorDescriptorRequest,
    ) -> Result<CudnnDeriveBNTensorDescriptorReply, CudnnStatus> {
        self.dnn_derive_bn(cx, req.derivedBnDesc, req.xDesc, req.mode)?;
        Ok(CudnnDeriveBNTensorDescriptorReply {})
    }

    // Batch normalization.

    fn cudnn_get_batch_normalization_forward_training_ex_workspace_size(
        &self,
        cx: &CallCx,
        req: CudnnGetBatchNormalizationForwardTrainingExWorkspaceSizeRequest,
    ) -> Result<CudnnGetBatchNormalizationForwardTrainingExWorkspaceSizeReply, CudnnStatus> {
        let call = BnCall {
            handle: req.handle,
            mode: req.mode,
            ops: req.bnOps,
            x_desc: req.xDesc,
            z_desc: req.zDesc,
            y_desc: req.yDesc,
            bn_desc: req.bnScaleBiasMeanVarDesc,
            ..BnCall::default()
        };
        let size = self.dnn_bn_size(cx, BnSize::ForwardWorkspace, call)?;
        Ok(CudnnGetBatchNormalizationForwardTrainingExWorkspaceSizeReply { sizeInBytes: size })
    }

    fn cudnn_get_batch_normalization_backward_ex_workspace_size(
        &self,
        cx: &CallCx,
        req: CudnnGetBatchNormalizationBackwardExWorkspaceSizeRequest,
    ) -> Result<CudnnGetBatchNormalizationBackwardExWorkspaceSizeReply, CudnnStatus> {
        let call = BnCall {
            handle: req.handle,
            mode: req.mode,
            ops: req.bnOps,
            x_desc: req.xDesc,
            y_desc: req.yDesc,
            dy_desc: req.dyDesc,
            dz_desc: req.dzDesc,
            dx_desc: req.dxDesc,
            bn_desc: req.dBnScaleBiasDesc,
            ..BnCall::default()
        };
        let size = self.dnn_bn_size(cx, BnSize::BackwardWorkspace, call)?;
        Ok(CudnnGetBatchNormalizationBackwardExWorkspaceSizeReply { sizeInBytes: size })
    }

    fn cudnn_get_batch_normalization_training_ex_reserve_space_size(
        &self,
        cx: &CallCx,
        req: CudnnGetBatchNormalizationTrainingExReserveSpaceSizeRequest,
    ) -> Result<CudnnGetBatchNormalizationTrainingExReserveSpaceSizeReply, CudnnStatus> {
        let call =
            BnCall { handle: req.handle, mode: req.mode, ops: req.bnOps, x_desc: req.xDesc, ..BnCall::default() };
        let size = self.dnn_bn_size(cx, BnSize::Reserve, call)?;
        Ok(CudnnGetBatchNormalizationTrainingExReserveSpaceSizeReply { sizeInBytes: size })
    }

    fn cudnn_batch_normalization_forward_training(
        &self,
        cx: &CallCx,
        req: CudnnBatchNormalizationForwardTrainingRequest<'_>,
    ) -> Result<CudnnBatchNormalizationForwardTrainingReply, CudnnStatus> {
        let call = BnCall {
            handle: req.handle,
            mode: req.mode,
            data_scaling: scaling_pair(req.alpha, req.beta),
            x_desc: req.xDesc,
            x: req.x,
            y_desc: req.yDesc,
            y: req.y,
            bn_desc: req.bnScaleBiasMeanVarDesc,
            scale: req.bnScale,
            bias: req.bnBias,
            factor: req.exponentialAverageFactor,
            running_mean: req.resultRunningMean,
            running_var: req.resultRunningVariance,
            epsilon: req.epsilon,
            saved_mean: req.resultSaveMean,
            saved_inv_var: req.resultSaveInvVariance,
            ..BnCall::default()
        };
        self.dnn_batch_norm(cx, BnKind::ForwardTraining, call)?;
        Ok(CudnnBatchNormalizationForwardTrainingReply {})
    }

    fn cudnn_batch_normalization_forward_training_ex(
        &self,
        cx: &CallCx,
        req: CudnnBatchNormalizationForwardTrainingExRequest<'_>,
    ) -> Result<CudnnBatchNormalizationForwardTrainingExReply, CudnnStatus> {
        let call = BnCall {
            handle: req.handle,
            mode: req.mode,
            ops: req.bnOps,
            data_scaling: scaling_pair(req.alpha, req.beta),
            x_desc: req.xDesc,
            x: req.xData,
            z_desc: req.zDesc,
            z: req.zData,
            y_desc: req.yDesc,
            y: req.yData,
            bn_desc: req.bnScaleBiasMeanVarDesc,
            scale: req.bnScale,
            bias: req.bnBias,
            factor: req.exponentialAverageFactor,
            running_mean: req.resultRunningMean,
            running_var: req.resultRunningVariance,
            epsilon: req.epsilon,
            saved_mean: req.resultSaveMean,
            saved_inv_var: req.resultSaveInvVariance,
            workspace: req.workspace,
            workspace_size: req.workSpaceSizeInBytes,
            reserve: req.reserveSpace,
            reserve_size: req.reserveSpaceSizeInBytes,
            ..BnCall::default()
        };
        self.dnn_batch_norm(cx, BnKind::ForwardTrainingEx, call)?;
        Ok(CudnnBatchNormalizationForwardTrainingExReply {})
    }

    fn cudnn_batch_normalization_forward_inference(
        &self,
        cx: &CallCx,
        req: CudnnBatchNormalizationForwardInferenceRequest<'_>,
    ) -> Result<CudnnBatchNormalizationForwardInferenceReply, CudnnStatus> {
        let call = BnCall {
            handle: req.handle,
            mode: req.mode,
            data_scaling: scaling_pair(req.alpha, req.beta),
            x_desc: req.xDesc,
            x: req.x,
            y_desc: req.yDesc,
            y: req.y,
            bn_desc: req.bnScaleBiasMeanVarDesc,
            scale: req.bnScale,
            bias: req.bnBias,
            running_mean: req.estimatedMean,
            running_var: req.estimatedVariance,
            epsilon: req.epsilon,
            ..BnCall::default()
        };
        self.dnn_batch_norm(cx, BnKind::ForwardInference, call)?;
        Ok(CudnnBatchNormalizationForwardInferenceReply {})
    }

    fn cudnn_batch_normalization_backward(
        &self,
        cx: &CallCx,
        req: CudnnBatchNormalizationBackwardRequest<'_>,
    ) -> Result<CudnnBatchNormalizationBackwardReply, CudnnStatus> {
        let call = BnCall {
            handle: req.handle,
            mode: req.mode,
            data_scaling: scaling_pair(req.alphaDataDiff, req.betaDataDiff),
            param_scaling: scaling_pair(req.alphaParamDiff, req.betaParamDiff),
            x_desc: req.xDesc,
            x: req.x,
            dy_desc: req.dyDesc,
            dy: req.dy,
            dx_desc: req.dxDesc,
            dx: req.dx,
            bn_desc: req.dBnScaleBiasDesc,
            scale: req.bnScale,
            dscale: req.dBnScaleResult,
            dbias: req.dBnBiasResult,
            epsilon: req.epsilon,
            saved_mean: req.savedMean,
            saved_inv_var: req.savedInvVariance,
            ..BnCall::default()
        };
        self.dnn_batch_norm(cx, BnKind::Backward, call)?;
        Ok(CudnnBatchNormalizationBackwardReply {})
    }

    fn cudnn_batch_normalization_backward_ex(
        &self,
        cx: &CallCx,
        req: CudnnBatchNormalizationBackwardExRequest<'_>,
    ) -> Result<CudnnBatchNormalizationBackwardExReply, CudnnStatus> {
        let call = BnCall {
            handle: req.handle,
            mode: req.mode,
            ops: req.bnOps,
            data_scaling: scaling_pair(req.alphaDataDiff, req.betaDataDiff),
            param_scaling: scaling_pair(req.alphaParamDiff, req.betaParamDiff),
            x_desc: req.xDesc,
            x: req.xData,
            y_desc: req.yDesc,
            y: req.yData,
            dy_desc: req.dyDesc,
            dy: req.dyData,
            dz_desc: req.dzDesc,
            dz: req.dzData,
            dx_desc: req.dxDesc,
            dx: req.dxData,
            bn_desc: req.dBnScaleBiasDesc,
            scale: req.bnScaleData,
            bias: req.bnBiasData,
            dscale: req.dBnScaleData,
            dbias: req.dBnBiasData,
            epsilon: req.epsilon,
            saved_mean: req.savedMean,
            saved_inv_var: req.savedInvVariance,
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            reserve: req.reserveSpace,
            reserve_size: req.reserveSpaceSizeInBytes,
            ..BnCall::default()
        };
        self.dnn_batch_norm(cx, BnKind::BackwardEx, call)?;
        Ok(CudnnBatchNormalizationBackwardExReply {})
    }

    // The legacy API: filters, convolutions, activations (service/cudnn_ops.rs).

    fn cudnn_create_filter_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreateFilterDescriptorRequest,
    ) -> Result<CudnnCreateFilterDescriptorReply, CudnnStatus> {
        Ok(CudnnCreateFilterDescriptorReply { filterDesc: self.dnn_legacy_create(cx, LegacyKind::Filter)? })
    }

    fn cudnn_destroy_filter_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyFilterDescriptorRequest,
    ) -> Result<CudnnDestroyFilterDescriptorReply, CudnnStatus> {
        self.dnn_legacy_destroy(cx, LegacyKind::Filter, req.filterDesc)?;
        Ok(CudnnDestroyFilterDescriptorReply {})
    }

    fn cudnn_set_filter_4d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetFilter4dDescriptorRequest,
    ) -> Result<CudnnSetFilter4dDescriptorReply, CudnnStatus> {
        self.dnn_set_filter(cx, req.filterDesc, req.dataType, req.format, &[req.k, req.c, req.h, req.w])?;
        Ok(CudnnSetFilter4dDescriptorReply {})
    }

    fn cudnn_set_filter_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetFilterNdDescriptorRequest<'_>,
    ) -> Result<CudnnSetFilterNdDescriptorReply, CudnnStatus> {
        self.dnn_set_filter(cx, req.filterDesc, req.dataType, req.format, &int_array(req.filterDimA))?;
        Ok(CudnnSetFilterNdDescriptorReply {})
    }

    fn cudnn_get_filter_4d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetFilter4dDescriptorRequest,
    ) -> Result<CudnnGetFilter4dDescriptorReply, CudnnStatus> {
        let f = self.dnn_filter(cx, req.filterDesc)?;
        let [k, c, h, w] = <[i32; 4]>::try_from(f.dims.as_slice())
            .map_err(|_| self.dnn_bad(cx, format_args!("{} dimensions, not 4", f.dims.len())))?;
        Ok(CudnnGetFilter4dDescriptorReply { dataType: f.data_type, format: f.format, k, c, h, w })
    }

    fn cudnn_get_filter_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetFilterNdDescriptorRequest,
    ) -> Result<CudnnGetFilterNdDescriptorReply, CudnnStatus> {
        let f = self.dnn_filter(cx, req.filterDesc)?;
        let room = usize::try_from(req.nbDimsRequested).map_err(|_| CudnnStatus::BAD_PARAM)?;
        Ok(CudnnGetFilterNdDescriptorReply {
            dataType: f.data_type,
            format: f.format,
            nbDims: f.dims.len() as i32,
            filterDimA: int_array_out(&f.dims, room),
        })
    }

    fn cudnn_get_filter_size_in_bytes(
        &self,
        cx: &CallCx,
        req: CudnnGetFilterSizeInBytesRequest,
    ) -> Result<CudnnGetFilterSizeInBytesReply, CudnnStatus> {
        Ok(CudnnGetFilterSizeInBytesReply { size: self.dnn_filter_bytes(cx, req.filterDesc)? })
    }

    fn cudnn_create_convolution_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreateConvolutionDescriptorRequest,
    ) -> Result<CudnnCreateConvolutionDescriptorReply, CudnnStatus> {
        Ok(CudnnCreateConvolutionDescriptorReply { convDesc: self.dnn_legacy_create(cx, LegacyKind::Convolution)? })
    }

    fn cudnn_destroy_convolution_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyConvolutionDescriptorRequest,
    ) -> Result<CudnnDestroyConvolutionDescriptorReply, CudnnStatus> {
        self.dnn_legacy_destroy(cx, LegacyKind::Convolution, req.convDesc)?;
        Ok(CudnnDestroyConvolutionDescriptorReply {})
    }

    fn cudnn_set_convolution_2d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetConvolution2dDescriptorRequest,
    ) -> Result<CudnnSetConvolution2dDescriptorReply, CudnnStatus> {
        self.dnn_change_conv(cx, req.convDesc, |now| {
            let (pads, strides, dilations) = ([req.pad_h, req.pad_w], [req.u, req.v], [req.dilation_h, req.dilation_w]);
            checked_conv(now, &pads, &strides, &dilations, req.mode, req.computeType)
        })?;
        Ok(CudnnSetConvolution2dDescriptorReply {})
    }

    fn cudnn_set_convolution_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetConvolutionNdDescriptorRequest<'_>,
    ) -> Result<CudnnSetConvolutionNdDescriptorReply, CudnnStatus> {
        let (pads, strides, dilations) = (int_array(req.padA), int_array(req.filterStrideA), int_array(req.dilationA));
        self.dnn_change_conv(cx, req.convDesc, |now| {
            checked_conv(now, &pads, &strides, &dilations, req.mode, req.computeType)
        })?;
        Ok(CudnnSetConvolutionNdDescriptorReply {})
    }

    fn cudnn_set_convolution_math_type(
        &self,
        cx: &CallCx,
        req: CudnnSetConvolutionMathTypeRequest,
    ) -> Result<CudnnSetConvolutionMathTypeReply, CudnnStatus> {
        self.dnn_change_conv(cx, req.convDesc, |now| match req.mathType {
            0..=3 => Ok(ConvSettings { math_type: req.mathType, ..now.clone() }),
            m => Err((CudnnStatus::BAD_PARAM, format!("math type {m}"))),
        })?;
        Ok(CudnnSetConvolutionMathTypeReply {})
    }

    fn cudnn_set_convolution_group_count(
        &self,
        cx: &CallCx,
        req: CudnnSetConvolutionGroupCountRequest,
    ) -> Result<CudnnSetConvolutionGroupCountReply, CudnnStatus> {
        self.dnn_change_conv(cx, req.convDesc, |now| match req.groupCount {
            1.. => Ok(ConvSettings { groups: req.groupCount, ..now.clone() }),
            g => Err((CudnnStatus::BAD_PARAM, format!("group count {g}"))),
        })?;
        Ok(CudnnSetConvolutionGroupCountReply {})
    }

    fn cudnn_set_convolution_reorder_type(
        &self,
        cx: &CallCx,
        req: CudnnSetConvolutionReorderTypeRequest,
    ) -> Result<CudnnSetConvolutionReorderTypeReply, CudnnStatus> {
        self.dnn_change_conv(cx, req.convDesc, |now| match req.reorderType {
            0..=1 => Ok(ConvSettings { reorder: req.reorderType, ..now.clone() }),
            r => Err((CudnnStatus::BAD_PARAM, format!("reorder type {r}"))),
        })?;
        Ok(CudnnSetConvolutionReorderTypeReply {})
    }

    fn cudnn_get_convolution_2d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolution2dDescriptorRequest,
    ) -> Result<CudnnGetConvolution2dDescriptorReply, CudnnStatus> {
        let c = self.dnn_conv(cx, req.convDesc)?;
        if c.pads.len() != 2 {
            return Err(self.dnn_bad(cx, format_args!("{} spatial dimensions, not 2", c.pads.len())));
        }
        Ok(CudnnGetConvolution2dDescriptorReply {
            pad_h: c.pads[0],
            pad_w: c.pads[1],
            u: c.strides[0],
            v: c.strides[1],
            dilation_h: c.dilations[0],
            dilation_w: c.dilations[1],
            mode: c.mode,
            computeType: c.compute_type,
        })
    }

    fn cudnn_get_convolution_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionNdDescriptorRequest,
    ) -> Result<CudnnGetConvolutionNdDescriptorReply, CudnnStatus> {
        let c = self.dnn_conv(cx, req.convDesc)?;
        let room = usize::try_from(req.arrayLengthRequested).map_err(|_| CudnnStatus::BAD_PARAM)?;
        Ok(CudnnGetConvolutionNdDescriptorReply {
            arrayLength: c.pads.len() as i32,
            padA: int_array_out(&c.pads, room),
            strideA: int_array_out(&c.strides, room),
            dilationA: int_array_out(&c.dilations, room),
            mode: c.mode,
            computeType: c.compute_type,
        })
    }

    fn cudnn_get_convolution_math_type(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionMathTypeRequest,
    ) -> Result<CudnnGetConvolutionMathTypeReply, CudnnStatus> {
        Ok(CudnnGetConvolutionMathTypeReply { mathType: self.dnn_conv(cx, req.convDesc)?.math_type })
    }

    fn cudnn_get_convolution_group_count(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionGroupCountRequest,
    ) -> Result<CudnnGetConvolutionGroupCountReply, CudnnStatus> {
        Ok(CudnnGetConvolutionGroupCountReply { groupCount: self.dnn_conv(cx, req.convDesc)?.groups })
    }

    fn cudnn_get_convolution_reorder_type(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionReorderTypeRequest,
    ) -> Result<CudnnGetConvolutionReorderTypeReply, CudnnStatus> {
        Ok(CudnnGetConvolutionReorderTypeReply { reorderType: self.dnn_conv(cx, req.convDesc)?.reorder })
    }

    fn cudnn_get_convolution_2d_forward_output_dim(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolution2dForwardOutputDimRequest,
    ) -> Result<CudnnGetConvolution2dForwardOutputDimReply, CudnnStatus> {
        let dims = self.dnn_conv_output(cx, req.convDesc, req.inputTensorDesc, req.filterDesc)?;
        let [n, c, h, w] = <[i32; 4]>::try_from(dims.as_slice())
            .map_err(|_| self.dnn_bad(cx, format_args!("{} dimensions, not 4", dims.len())))?;
        Ok(CudnnGetConvolution2dForwardOutputDimReply { n, c, h, w })
    }

    fn cudnn_get_convolution_nd_forward_output_dim(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionNdForwardOutputDimRequest,
    ) -> Result<CudnnGetConvolutionNdForwardOutputDimReply, CudnnStatus> {
        let dims = self.dnn_conv_output(cx, req.convDesc, req.inputTensorDesc, req.filterDesc)?;
        if usize::try_from(req.nbDims).ok() != Some(dims.len()) {
            return Err(self.dnn_bad(cx, format_args!("nbDims {}, where the output has {}", req.nbDims, dims.len())));
        }
        Ok(CudnnGetConvolutionNdForwardOutputDimReply { tensorOuputDimA: int_array_out(&dims, dims.len()) })
    }

    fn cudnn_get_convolution_forward_algorithm_max_count(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionForwardAlgorithmMaxCountRequest,
    ) -> Result<CudnnGetConvolutionForwardAlgorithmMaxCountReply, CudnnStatus> {
        Ok(CudnnGetConvolutionForwardAlgorithmMaxCountReply {
            count: self.dnn_algorithm_max_count(cx, ConvDirection::Forward, req.handle)?,
        })
    }

    fn cudnn_get_convolution_backward_data_algorithm_max_count(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionBackwardDataAlgorithmMaxCountRequest,
    ) -> Result<CudnnGetConvolutionBackwardDataAlgorithmMaxCountReply, CudnnStatus> {
        Ok(CudnnGetConvolutionBackwardDataAlgorithmMaxCountReply {
            count: self.dnn_algorithm_max_count(cx, ConvDirection::BackwardData, req.handle)?,
        })
    }

    fn cudnn_get_convolution_backward_filter_algorithm_max_count(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionBackwardFilterAlgorithmMaxCountRequest,
    ) -> Result<CudnnGetConvolutionBackwardFilterAlgorithmMaxCountReply, CudnnStatus> {
        Ok(CudnnGetConvolutionBackwardFilterAlgorithmMaxCountReply {
            count: self.dnn_algorithm_max_count(cx, ConvDirection::BackwardFilter, req.handle)?,
        })
    }

    fn cudnn_get_convolution_forward_algorithm_v7(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionForwardAlgorithmV7Request,
    ) -> Result<CudnnGetConvolutionForwardAlgorithmV7Reply, CudnnStatus> {
        let call = conv_call(req.handle, (req.srcDesc, 0), (req.filterDesc, 0), req.convDesc, (req.destDesc, 0));
        let (n, perf) =
            self.dnn_conv_algorithms(cx, ConvDirection::Forward, (false, false), &call, req.requestedAlgoCount)?;
        Ok(CudnnGetConvolutionForwardAlgorithmV7Reply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_get_convolution_backward_data_algorithm_v7(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionBackwardDataAlgorithmV7Request,
    ) -> Result<CudnnGetConvolutionBackwardDataAlgorithmV7Reply, CudnnStatus> {
        let call = conv_call(req.handle, (req.gradDesc, 0), (req.filterDesc, 0), req.convDesc, (req.diffDesc, 0));
        let dir = ConvDirection::BackwardData;
        let (n, perf) = self.dnn_conv_algorithms(cx, dir, (false, false), &call, req.requestedAlgoCount)?;
        Ok(CudnnGetConvolutionBackwardDataAlgorithmV7Reply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_get_convolution_backward_filter_algorithm_v7(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionBackwardFilterAlgorithmV7Request,
    ) -> Result<CudnnGetConvolutionBackwardFilterAlgorithmV7Reply, CudnnStatus> {
        let call = conv_call(req.handle, (req.srcDesc, 0), (req.gradDesc, 0), req.convDesc, (req.diffDesc, 0));
        let dir = ConvDirection::BackwardFilter;
        let (n, perf) = self.dnn_conv_algorithms(cx, dir, (false, false), &call, req.requestedAlgoCount)?;
        Ok(CudnnGetConvolutionBackwardFilterAlgorithmV7Reply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_find_convolution_forward_algorithm(
        &self,
        cx: &CallCx,
        req: CudnnFindConvolutionForwardAlgorithmRequest,
    ) -> Result<CudnnFindConvolutionForwardAlgorithmReply, CudnnStatus> {
        let call = conv_call(req.handle, (req.xDesc, 0), (req.wDesc, 0), req.convDesc, (req.yDesc, 0));
        let (n, perf) =
            self.dnn_conv_algorithms(cx, ConvDirection::Forward, (true, false), &call, req.requestedAlgoCount)?;
        Ok(CudnnFindConvolutionForwardAlgorithmReply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_find_convolution_backward_data_algorithm(
        &self,
        cx: &CallCx,
        req: CudnnFindConvolutionBackwardDataAlgorithmRequest,
    ) -> Result<CudnnFindConvolutionBackwardDataAlgorithmReply, CudnnStatus> {
        let call = conv_call(req.handle, (req.dxDesc, 0), (req.wDesc, 0), req.convDesc, (req.dyDesc, 0));
        let dir = ConvDirection::BackwardData;
        let (n, perf) = self.dnn_conv_algorithms(cx, dir, (true, false), &call, req.requestedAlgoCount)?;
        Ok(CudnnFindConvolutionBackwardDataAlgorithmReply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_find_convolution_backward_filter_algorithm(
        &self,
        cx: &CallCx,
        req: CudnnFindConvolutionBackwardFilterAlgorithmRequest,
    ) -> Result<CudnnFindConvolutionBackwardFilterAlgorithmReply, CudnnStatus> {
        let call = conv_call(req.handle, (req.xDesc, 0), (req.dwDesc, 0), req.convDesc, (req.dyDesc, 0));
        let dir = ConvDirection::BackwardFilter;
        let (n, perf) = self.dnn_conv_algorithms(cx, dir, (true, false), &call, req.requestedAlgoCount)?;
        Ok(CudnnFindConvolutionBackwardFilterAlgorithmReply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_find_convolution_forward_algorithm_ex(
        &self,
        cx: &CallCx,
        req: CudnnFindConvolutionForwardAlgorithmExRequest,
    ) -> Result<CudnnFindConvolutionForwardAlgorithmExReply, CudnnStatus> {
        let call = ConvCall {
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            ..conv_call(req.handle, (req.xDesc, req.x), (req.wDesc, req.w), req.convDesc, (req.yDesc, req.y))
        };
        let (n, perf) =
            self.dnn_conv_algorithms(cx, ConvDirection::Forward, (true, true), &call, req.requestedAlgoCount)?;
        Ok(CudnnFindConvolutionForwardAlgorithmExReply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_find_convolution_backward_data_algorithm_ex(
        &self,
        cx: &CallCx,
        req: CudnnFindConvolutionBackwardDataAlgorithmExRequest,
    ) -> Result<CudnnFindConvolutionBackwardDataAlgorithmExReply, CudnnStatus> {
        let call = ConvCall {
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            ..conv_call(req.handle, (req.dxDesc, req.dx), (req.wDesc, req.w), req.convDesc, (req.dyDesc, req.dy))
        };
        let dir = ConvDirection::BackwardData;
        let (n, perf) = self.dnn_conv_algorithms(cx, dir, (true, true), &call, req.requestedAlgoCount)?;
        Ok(CudnnFindConvolutionBackwardDataAlgorithmExReply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_find_convolution_backward_filter_algorithm_ex(
        &self,
        cx: &CallCx,
        req: CudnnFindConvolutionBackwardFilterAlgorithmExRequest,
    ) -> Result<CudnnFindConvolutionBackwardFilterAlgorithmExReply, CudnnStatus> {
        let call = ConvCall {
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            ..conv_call(req.handle, (req.xDesc, req.x), (req.dwDesc, req.dw), req.convDesc, (req.dyDesc, req.y))
        };
        let dir = ConvDirection::BackwardFilter;
        let (n, perf) = self.dnn_conv_algorithms(cx, dir, (true, true), &call, req.requestedAlgoCount)?;
        Ok(CudnnFindConvolutionBackwardFilterAlgorithmExReply { returnedAlgoCount: n, perfResults: perf })
    }

    fn cudnn_get_convolution_forward_workspace_size(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionForwardWorkspaceSizeRequest,
    ) -> Result<CudnnGetConvolutionForwardWorkspaceSizeReply, CudnnStatus> {
        let call = ConvCall {
            algo: req.algo,
            ..conv_call(req.handle, (req.xDesc, 0), (req.wDesc, 0), req.convDesc, (req.yDesc, 0))
        };
        Ok(CudnnGetConvolutionForwardWorkspaceSizeReply {
            sizeInBytes: self.dnn_conv_workspace(cx, ConvDirection::Forward, &call)?,
        })
    }

    fn cudnn_get_convolution_backward_data_workspace_size(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionBackwardDataWorkspaceSizeRequest,
    ) -> Result<CudnnGetConvolutionBackwardDataWorkspaceSizeReply, CudnnStatus> {
        let call = ConvCall {
            algo: req.algo,
            ..conv_call(req.handle, (req.dxDesc, 0), (req.wDesc, 0), req.convDesc, (req.dyDesc, 0))
        };
        Ok(CudnnGetConvolutionBackwardDataWorkspaceSizeReply {
            sizeInBytes: self.dnn_conv_workspace(cx, ConvDirection::BackwardData, &call)?,
        })
    }

    fn cudnn_get_convolution_backward_filter_workspace_size(
        &self,
        cx: &CallCx,
        req: CudnnGetConvolutionBackwardFilterWorkspaceSizeRequest,
    ) -> Result<CudnnGetConvolutionBackwardFilterWorkspaceSizeReply, CudnnStatus> {
        let call = ConvCall {
            algo: req.algo,
            ..conv_call(req.handle, (req.xDesc, 0), (req.gradDesc, 0), req.convDesc, (req.dyDesc, 0))
        };
        Ok(CudnnGetConvolutionBackwardFilterWorkspaceSizeReply {
            sizeInBytes: self.dnn_conv_workspace(cx, ConvDirection::BackwardFilter, &call)?,
        })
    }

    fn cudnn_convolution_forward(
        &self,
        cx: &CallCx,
        req: CudnnConvolutionForwardRequest<'_>,
    ) -> Result<CudnnConvolutionForwardReply, CudnnStatus> {
        let call = ConvCall {
            algo: req.algo,
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            scaling: scaling_pair(req.alpha, req.beta),
            ..conv_call(req.handle, (req.xDesc, req.x), (req.wDesc, req.w), req.convDesc, (req.yDesc, req.y))
        };
        self.dnn_convolution(cx, ConvDirection::Forward, call)?;
        Ok(CudnnConvolutionForwardReply {})
    }

    fn cudnn_convolution_backward_data(
        &self,
        cx: &CallCx,
        req: CudnnConvolutionBackwardDataRequest<'_>,
    ) -> Result<CudnnConvolutionBackwardDataReply, CudnnStatus> {
        let call = ConvCall {
            algo: req.algo,
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            scaling: scaling_pair(req.alpha, req.beta),
            ..conv_call(req.handle, (req.dxDesc, req.dx), (req.wDesc, req.w), req.convDesc, (req.dyDesc, req.dy))
        };
        self.dnn_convolution(cx, ConvDirection::BackwardData, call)?;
        Ok(CudnnConvolutionBackwardDataReply {})
    }

    fn cudnn_convolution_backward_filter(
        &self,
        cx: &CallCx,
        req: CudnnConvolutionBackwardFilterRequest<'_>,
    ) -> Result<CudnnConvolutionBackwardFilterReply, CudnnStatus> {
        let call = ConvCall {
            algo: req.algo,
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            scaling: scaling_pair(req.alpha, req.beta),
            ..conv_call(req.handle, (req.xDesc, req.x), (req.dwDesc, req.dw), req.convDesc, (req.dyDesc, req.dy))
        };
        self.dnn_convolution(cx, ConvDirection::BackwardFilter, call)?;
        Ok(CudnnConvolutionBackwardFilterReply {})
    }

    fn cudnn_convolution_backward_bias(
        &self,
        cx: &CallCx,
        req: CudnnConvolutionBackwardBiasRequest<'_>,
    ) -> Result<CudnnConvolutionBackwardBiasReply, CudnnStatus> {
        let call = ConvCall {
            scaling: scaling_pair(req.alpha, req.beta),
            ..conv_call(req.handle, (req.dyDesc, req.dy), (0, 0), 0, (req.dbDesc, req.db))
        };
        self.dnn_backward_bias(cx, call)?;
        Ok(CudnnConvolutionBackwardBiasReply {})
    }

    fn cudnn_convolution_bias_activation_forward(
        &self,
        cx: &CallCx,
        req: CudnnConvolutionBiasActivationForwardRequest<'_>,
    ) -> Result<CudnnConvolutionBiasActivationForwardReply, CudnnStatus> {
        let call = ConvCall {
            algo: req.algo,
            workspace: req.workSpace,
            workspace_size: req.workSpaceSizeInBytes,
            scaling: scaling_pair(req.alpha1, req.alpha2),
            z_desc: req.zDesc,
            z: req.z,
            bias_desc: req.biasDesc,
            bias: req.bias,
            activation: req.activationDesc,
            ..conv_call(req.handle, (req.xDesc, req.x), (req.wDesc, req.w), req.convDesc, (req.yDesc, req.y))
        };
        self.dnn_conv_bias_activation(cx, call)?;
        Ok(CudnnConvolutionBiasActivationForwardReply {})
    }

    fn cudnn_create_activation_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreateActivationDescriptorRequest,
    ) -> Result<CudnnCreateActivationDescriptorReply, CudnnStatus> {
        Ok(CudnnCreateActivationDescriptorReply { activationDesc: self.dnn_legacy_create(cx, LegacyKind::Activation)? })
    }

    fn cudnn_destroy_activation_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyActivationDescriptorRequest,
    ) -> Result<CudnnDestroyActivationDescriptorReply, CudnnStatus> {
        self.dnn_legacy_destroy(cx, LegacyKind::Activation, req.activationDesc)?;
        Ok(CudnnDestroyActivationDescriptorReply {})
    }

    fn cudnn_set_activation_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetActivationDescriptorRequest,
    ) -> Result<CudnnSetActivationDescriptorReply, CudnnStatus> {
        self.dnn_change_activation(cx, req.activationDesc, |a| ActivationSettings {
            mode: req.mode,
            nan_propagation: req.reluNanOpt,
            coef: req.coef,
            ..a
        })?;
        Ok(CudnnSetActivationDescriptorReply {})
    }

    fn cudnn_set_activation_descriptor_swish_beta(
        &self,
        cx: &CallCx,
        req: CudnnSetActivationDescriptorSwishBetaRequest,
    ) -> Result<CudnnSetActivationDescriptorSwishBetaReply, CudnnStatus> {
        self.dnn_change_activation(cx, req.activationDesc, |a| ActivationSettings { swish_beta: req.swish_beta, ..a })?;
        Ok(CudnnSetActivationDescriptorSwishBetaReply {})
    }

    fn cudnn_get_activation_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetActivationDescriptorRequest,
    ) -> Result<CudnnGetActivationDescriptorReply, CudnnStatus> {
        let a = self.dnn_activation(cx, req.activationDesc)?;
        Ok(CudnnGetActivationDescriptorReply { mode: a.mode, reluNanOpt: a.nan_propagation, coef: a.coef })
    }

    fn cudnn_get_activation_descriptor_swish_beta(
        &self,
        cx: &CallCx,
        req: CudnnGetActivationDescriptorSwishBetaRequest,
    ) -> Result<CudnnGetActivationDescriptorSwishBetaReply, CudnnStatus> {
        Ok(CudnnGetActivationDescriptorSwishBetaReply {
            swish_beta: self.dnn_activation(cx, req.activationDesc)?.swish_beta,
        })
    }

    fn cudnn_activation_forward(
        &self,
        cx: &CallCx,
        req: CudnnActivationForwardRequest<'_>,
    ) -> Result<CudnnActivationForwardReply, CudnnStatus> {
        self.dnn_activate(
            cx,
            ActivationCall {
                backward: false,
                handle: req.handle,
                activation: req.activationDesc,
                scaling: scaling_pair(req.alpha, req.beta),
                x_desc: req.xDesc,
                x: req.x,
                y_desc: req.yDesc,
                y: req.y,
                ..ActivationCall::default()
            },
        )?;
        Ok(CudnnActivationForwardReply {})
    }

    fn cudnn_activation_backward(
        &self,
        cx: &CallCx,
        req: CudnnActivationBackwardRequest<'_>,
    ) -> Result<CudnnActivationBackwardReply, CudnnStatus> {
        self.dnn_activate(
            cx,
            ActivationCall {
                backward: true,
                handle: req.handle,
                activation: req.activationDesc,
                scaling: scaling_pair(req.alpha, req.beta),
                x_desc: req.xDesc,
                x: req.x,
                y_desc: req.yDesc,
                y: req.y,
                dy_desc: req.dyDesc,
                dy: req.dy,
                dx_desc: req.dxDesc,
                dx: req.dx,
            },
        )?;
        Ok(CudnnActivationBackwardReply {})
    }

    // The legacy API: tensor operations, pooling, softmax, LRN (service/cudnn_layers.rs).

    fn cudnn_add_tensor(
        &self,
        cx: &CallCx,
        req: CudnnAddTensorRequest<'_>,
    ) -> Result<CudnnAddTensorReply, CudnnStatus> {
        let operands = vec![Operand::read("A", 0, (req.aDesc, req.A)), Operand::write("C", 1, (req.cDesc, req.C))];
        let [alpha, beta] = scaling_pair(req.alpha, req.beta);
        let call = LayerCall { scaling: [alpha, beta, 0.0], ..LayerCall::new(TensorOp::Add, req.handle, operands) };
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnAddTensorReply {})
    }

    fn cudnn_set_tensor(
        &self,
        cx: &CallCx,
        req: CudnnSetTensorRequest<'_>,
    ) -> Result<CudnnSetTensorReply, CudnnStatus> {
        let operands = vec![Operand::write("y", 0, (req.yDesc, req.y))];
        // 4 or 8 bytes (a float, or a double for a double tensor), checked against the tensor's type.
        let mut value = [0u8; 8];
        let value_len = req.valuePtr.len();
        value.get_mut(..value_len).ok_or(CudnnStatus::BAD_PARAM)?.copy_from_slice(req.valuePtr);
        let call = LayerCall { value, value_len, ..LayerCall::new(TensorOp::Set, req.handle, operands) };
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnSetTensorReply {})
    }

    fn cudnn_scale_tensor(
        &self,
        cx: &CallCx,
        req: CudnnScaleTensorRequest<'_>,
    ) -> Result<CudnnScaleTensorReply, CudnnStatus> {
        let operands = vec![Operand::write("y", 0, (req.yDesc, req.y))];
        let [alpha, _] = scaling_pair(req.alpha, &[]);
        let call = LayerCall { scaling: [alpha, 0.0, 0.0], ..LayerCall::new(TensorOp::Scale, req.handle, operands) };
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnScaleTensorReply {})
    }

    fn cudnn_transform_tensor(
        &self,
        cx: &CallCx,
        req: CudnnTransformTensorRequest<'_>,
    ) -> Result<CudnnTransformTensorReply, CudnnStatus> {
        let call = LayerCall::forward(
            TensorOp::Transform,
            (req.handle, 0),
            (0, 0),
            scaling_pair(req.alpha, req.beta),
            (req.xDesc, req.x),
            (req.yDesc, req.y),
        );
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnTransformTensorReply {})
    }

    fn cudnn_create_op_tensor_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreateOpTensorDescriptorRequest,
    ) -> Result<CudnnCreateOpTensorDescriptorReply, CudnnStatus> {
        Ok(CudnnCreateOpTensorDescriptorReply { opTensorDesc: self.dnn_legacy_create(cx, LegacyKind::OpTensor)? })
    }

    fn cudnn_destroy_op_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyOpTensorDescriptorRequest,
    ) -> Result<CudnnDestroyOpTensorDescriptorReply, CudnnStatus> {
        self.dnn_legacy_destroy(cx, LegacyKind::OpTensor, req.opTensorDesc)?;
        Ok(CudnnDestroyOpTensorDescriptorReply {})
    }

    fn cudnn_set_op_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetOpTensorDescriptorRequest,
    ) -> Result<CudnnSetOpTensorDescriptorReply, CudnnStatus> {
        let settings = OpTensorSettings {
            op: req.opTensorOp,
            compute_type: req.opTensorCompType,
            nan_propagation: req.opTensorNanOpt,
        };
        self.dnn_set_op_tensor(cx, req.opTensorDesc, settings)?;
        Ok(CudnnSetOpTensorDescriptorReply {})
    }

    fn cudnn_get_op_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetOpTensorDescriptorRequest,
    ) -> Result<CudnnGetOpTensorDescriptorReply, CudnnStatus> {
        let o = self.dnn_op_tensor(cx, req.opTensorDesc)?;
        Ok(CudnnGetOpTensorDescriptorReply {
            opTensorOp: o.op,
            opTensorCompType: o.compute_type,
            opTensorNanOpt: o.nan_propagation,
        })
    }

    fn cudnn_op_tensor(&self, cx: &CallCx, req: CudnnOpTensorRequest<'_>) -> Result<CudnnOpTensorReply, CudnnStatus> {
        // The unary operations read A alone: B is neither checked nor read.
        let unary = crate::cpu_dnn::op_is_unary(self.dnn_op_tensor(cx, req.opTensorDesc)?.op);
        let mut operands = vec![Operand::read("A", 0, (req.aDesc, req.A))];
        if !unary {
            operands.push(Operand::read("B", 1, (req.bDesc, req.B)));
        }
        operands.push(Operand::write("C", 2, (req.cDesc, req.C)));
        let [alpha1, alpha2] = scaling_pair(req.alpha1, req.alpha2);
        let [beta, _] = scaling_pair(req.beta, &[]);
        let call = LayerCall {
            desc: req.opTensorDesc,
            scaling: [alpha1, alpha2, beta],
            ..LayerCall::new(TensorOp::Op, req.handle, operands)
        };
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnOpTensorReply {})
    }

    fn cudnn_create_pooling_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreatePoolingDescriptorRequest,
    ) -> Result<CudnnCreatePoolingDescriptorReply, CudnnStatus> {
        Ok(CudnnCreatePoolingDescriptorReply { poolingDesc: self.dnn_legacy_create(cx, LegacyKind::Pooling)? })
    }

    fn cudnn_destroy_pooling_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyPoolingDescriptorRequest,
    ) -> Result<CudnnDestroyPoolingDescriptorReply, CudnnStatus> {
        self.dnn_legacy_destroy(cx, LegacyKind::Pooling, req.poolingDesc)?;
        Ok(CudnnDestroyPoolingDescriptorReply {})
    }

    fn cudnn_set_pooling_2d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetPooling2dDescriptorRequest,
    ) -> Result<CudnnSetPooling2dDescriptorReply, CudnnStatus> {
        self.dnn_set_pooling(
            cx,
            req.poolingDesc,
            (req.mode, req.maxpoolingNanOpt),
            &[req.windowHeight, req.windowWidth],
            &[req.verticalPadding, req.horizontalPadding],
            &[req.verticalStride, req.horizontalStride],
        )?;
        Ok(CudnnSetPooling2dDescriptorReply {})
    }

    fn cudnn_set_pooling_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetPoolingNdDescriptorRequest<'_>,
    ) -> Result<CudnnSetPoolingNdDescriptorReply, CudnnStatus> {
        let (window, pads, strides) = (int_array(req.windowDimA), int_array(req.paddingA), int_array(req.strideA));
        self.dnn_set_pooling(cx, req.poolingDesc, (req.mode, req.maxpoolingNanOpt), &window, &pads, &strides)?;
        Ok(CudnnSetPoolingNdDescriptorReply {})
    }

    fn cudnn_get_pooling_2d_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetPooling2dDescriptorRequest,
    ) -> Result<CudnnGetPooling2dDescriptorReply, CudnnStatus> {
        let p = self.dnn_pooling(cx, req.poolingDesc)?;
        if p.window.len() != 2 {
            return Err(self.dnn_bad(cx, format_args!("{} spatial dimensions, not 2", p.window.len())));
        }
        Ok(CudnnGetPooling2dDescriptorReply {
            mode: p.mode,
            maxpoolingNanOpt: p.nan_propagation,
            windowHeight: p.window[0],
            windowWidth: p.window[1],
            verticalPadding: p.pads[0],
            horizontalPadding: p.pads[1],
            verticalStride: p.strides[0],
            horizontalStride: p.strides[1],
        })
    }

    fn cudnn_get_pooling_nd_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetPoolingNdDescriptorRequest,
    ) -> Result<CudnnGetPoolingNdDescriptorReply, CudnnStatus> {
        let p = self.dnn_pooling(cx, req.poolingDesc)?;
        let room = usize::try_from(req.nbDimsRequested).map_err(|_| CudnnStatus::BAD_PARAM)?;
        Ok(CudnnGetPoolingNdDescriptorReply {
            mode: p.mode,
            maxpoolingNanOpt: p.nan_propagation,
            nbDims: p.window.len() as i32,
            windowDimA: int_array_out(&p.window, room),
            paddingA: int_array_out(&p.pads, room),
            strideA: int_array_out(&p.strides, room),
        })
    }

    fn cudnn_get_pooling_2d_forward_output_dim(
        &self,
        cx: &CallCx,
        req: CudnnGetPooling2dForwardOutputDimRequest,
    ) -> Result<CudnnGetPooling2dForwardOutputDimReply, CudnnStatus> {
        let dims = self.dnn_pooling_output(cx, req.poolingDesc, req.inputTensorDesc)?;
        let [n, c, h, w] = <[i32; 4]>::try_from(dims.as_slice())
            .map_err(|_| self.dnn_bad(cx, format_args!("{} dimensions, not 4", dims.len())))?;
        Ok(CudnnGetPooling2dForwardOutputDimReply { n, c, h, w })
    }

    fn cudnn_get_pooling_nd_forward_output_dim(
        &self,
        cx: &CallCx,
        req: CudnnGetPoolingNdForwardOutputDimRequest,
    ) -> Result<CudnnGetPoolingNdForwardOutputDimReply, CudnnStatus> {
        let dims = self.dnn_pooling_output(cx, req.poolingDesc, req.inputTensorDesc)?;
        if usize::try_from(req.nbDims).ok() != Some(dims.len()) {
            return Err(self.dnn_bad(cx, format_args!("nbDims {}, where the output has {}", req.nbDims, dims.len())));
        }
        Ok(CudnnGetPoolingNdForwardOutputDimReply { outputTensorDimA: int_array_out(&dims, dims.len()) })
    }

    fn cudnn_pooling_forward(
        &self,
        cx: &CallCx,
        req: CudnnPoolingForwardRequest<'_>,
    ) -> Result<CudnnPoolingForwardReply, CudnnStatus> {
        let call = LayerCall::forward(
            TensorOp::PoolingForward,
            (req.handle, req.poolingDesc),
            (0, 0),
            scaling_pair(req.alpha, req.beta),
            (req.xDesc, req.x),
            (req.yDesc, req.y),
        );
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnPoolingForwardReply {})
    }

    fn cudnn_pooling_backward(
        &self,
        cx: &CallCx,
        req: CudnnPoolingBackwardRequest<'_>,
    ) -> Result<CudnnPoolingBackwardReply, CudnnStatus> {
        let tensors = [(req.yDesc, req.y), (req.dyDesc, req.dy), (req.xDesc, req.x), (req.dxDesc, req.dx)];
        let scaling = scaling_pair(req.alpha, req.beta);
        let call =
            LayerCall::backward(TensorOp::PoolingBackward, (req.handle, req.poolingDesc), (0, 0), scaling, tensors);
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnPoolingBackwardReply {})
    }

    fn cudnn_softmax_forward(
        &self,
        cx: &CallCx,
        req: CudnnSoftmaxForwardRequest<'_>,
    ) -> Result<CudnnSoftmaxForwardReply, CudnnStatus> {
        let call = LayerCall::forward(
            TensorOp::SoftmaxForward,
            (req.handle, 0),
            (req.algo, req.mode),
            scaling_pair(req.alpha, req.beta),
            (req.xDesc, req.x),
            (req.yDesc, req.y),
        );
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnSoftmaxForwardReply {})
    }

    fn cudnn_softmax_backward(
        &self,
        cx: &CallCx,
        req: CudnnSoftmaxBackwardRequest<'_>,
    ) -> Result<CudnnSoftmaxBackwardReply, CudnnStatus> {
        let tensors = [(req.yDesc, req.y), (req.dyDesc, req.dy), (0, 0), (req.dxDesc, req.dx)];
        let scaling = scaling_pair(req.alpha, req.beta);
        let call =
            LayerCall::backward(TensorOp::SoftmaxBackward, (req.handle, 0), (req.algo, req.mode), scaling, tensors);
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnSoftmaxBackwardReply {})
    }

    fn cudnn_create_lrn_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreateLRNDescriptorRequest,
    ) -> Result<CudnnCreateLRNDescriptorReply, CudnnStatus> {
        Ok(CudnnCreateLRNDescriptorReply { normDesc: self.dnn_legacy_create(cx, LegacyKind::Lrn)? })
    }

    fn cudnn_destroy_lrn_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyLRNDescriptorRequest,
    ) -> Result<CudnnDestroyLRNDescriptorReply, CudnnStatus> {
        self.dnn_legacy_destroy(cx, LegacyKind::Lrn, req.lrnDesc)?;
        Ok(CudnnDestroyLRNDescriptorReply {})
    }

    fn cudnn_set_lrn_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetLRNDescriptorRequest,
    ) -> Result<CudnnSetLRNDescriptorReply, CudnnStatus> {
        let settings = LrnSettings { n: req.lrnN, alpha: req.lrnAlpha, beta: req.lrnBeta, k: req.lrnK };
        self.dnn_set_lrn(cx, req.normDesc, settings)?;
        Ok(CudnnSetLRNDescriptorReply {})
    }

    fn cudnn_get_lrn_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetLRNDescriptorRequest,
    ) -> Result<CudnnGetLRNDescriptorReply, CudnnStatus> {
        let l = self.dnn_lrn(cx, req.normDesc)?;
        Ok(CudnnGetLRNDescriptorReply { lrnN: l.n, lrnAlpha: l.alpha, lrnBeta: l.beta, lrnK: l.k })
    }

    fn cudnn_lrn_cross_channel_forward(
        &self,
        cx: &CallCx,
        req: CudnnLRNCrossChannelForwardRequest<'_>,
    ) -> Result<CudnnLRNCrossChannelForwardReply, CudnnStatus> {
        let call = LayerCall::forward(
            TensorOp::LrnForward,
            (req.handle, req.normDesc),
            (0, req.lrnMode),
            scaling_pair(req.alpha, req.beta),
            (req.xDesc, req.x),
            (req.yDesc, req.y),
        );
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnLRNCrossChannelForwardReply {})
    }

    fn cudnn_lrn_cross_channel_backward(
        &self,
        cx: &CallCx,
        req: CudnnLRNCrossChannelBackwardRequest<'_>,
    ) -> Result<CudnnLRNCrossChannelBackwardReply, CudnnStatus> {
        let tensors = [(req.yDesc, req.y), (req.dyDesc, req.dy), (req.xDesc, req.x), (req.dxDesc, req.dx)];
        let scaling = scaling_pair(req.alpha, req.beta);
        let call =
            LayerCall::backward(TensorOp::LrnBackward, (req.handle, req.normDesc), (0, req.lrnMode), scaling, tensors);
        self.dnn_tensor_op(cx, call)?;
        Ok(CudnnLRNCrossChannelBackwardReply {})
    }

    fn cudnn_create_reduce_tensor_descriptor(
        &self,
        cx: &CallCx,
        _: CudnnCreateReduceTensorDescriptorRequest,
    ) -> Result<CudnnCreateReduceTensorDescriptorReply, CudnnStatus> {
        Ok(CudnnCreateReduceTensorDescriptorReply {
            reduceTensorDesc: self.dnn_legacy_create(cx, LegacyKind::ReduceTensor)?,
        })
    }

    fn cudnn_destroy_reduce_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnDestroyReduceTensorDescriptorRequest,
    ) -> Result<CudnnDestroyReduceTensorDescriptorReply, CudnnStatus> {
        self.dnn_legacy_destroy(cx, LegacyKind::ReduceTensor, req.reduceTensorDesc)?;
        Ok(CudnnDestroyReduceTensorDescriptorReply {})
    }

    fn cudnn_set_reduce_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnSetReduceTensorDescriptorRequest,
    ) -> Result<CudnnSetReduceTensorDescriptorReply, CudnnStatus> {
        let settings = ReduceSettings {
            op: req.reduceTensorOp,
            compute_type: req.reduceTensorCompType,
            nan_propagation: req.reduceTensorNanOpt,
            indices: req.reduceTensorIndices,
            indices_type: req.reduceTensorIndicesType,
        };
        self.dnn_set_reduce(cx, req.reduceTensorDesc, settings)?;
        Ok(CudnnSetReduceTensorDescriptorReply {})
    }

    fn cudnn_get_reduce_tensor_descriptor(
        &self,
        cx: &CallCx,
        req: CudnnGetReduceTensorDescriptorRequest,
    ) -> Result<CudnnGetReduceTensorDescriptorReply, CudnnStatus> {
        let r = self.dnn_reduce_settings(cx, req.reduceTensorDesc)?;
        Ok(CudnnGetReduceTensorDescriptorReply {
            reduceTensorOp: r.op,
            reduceTensorCompType: r.compute_type,
            reduceTensorNanOpt: r.nan_propagation,
            reduceTensorIndices: r.indices,
            reduceTensorIndicesType: r.indices_type,
        })
    }

    fn cudnn_get_reduction_indices_size(
        &self,
        cx: &CallCx,
        req: CudnnGetReductionIndicesSizeRequest,
    ) -> Result<CudnnGetReductionIndicesSizeReply, CudnnStatus> {
        let size = self.dnn_reduce_size(cx, true, req.handle, req.reduceTensorDesc, req.aDesc, req.cDesc)?;
        Ok(CudnnGetReductionIndicesSizeReply { sizeInBytes: size })
    }

    fn cudnn_get_reduction_workspace_size(
        &self,
        cx: &CallCx,
        req: CudnnGetReductionWorkspaceSizeRequest,
    ) -> Result<CudnnGetReductionWorkspaceSizeReply, CudnnStatus> {
        let size = self.dnn_reduce_size(cx, false, req.handle, req.reduceTensorDesc, req.aDesc, req.cDesc)?;
        Ok(CudnnGetReductionWorkspaceSizeReply { sizeInBytes: size })
    }

    fn cudnn_reduce_tensor(
        &self,
        cx: &CallCx,
        req: CudnnReduceTensorRequest<'_>,
    ) -> Result<CudnnReduceTensorReply, CudnnStatus> {
        let call = ReduceCall {
            handle: req.handle,
            desc: req.reduceTensorDesc,
            indices: req.indices,
            indices_size: req.indicesSizeInBytes,
            workspace: req.workspace,
            workspace_size: req.workspaceSizeInBytes,
            scaling: scaling_pair(req.alpha, req.beta),
            a: (req.aDesc, req.A),
            c: (req.cDesc, req.C),
        };
        self.dnn_reduce(cx, call)?;
        Ok(CudnnReduceTensorReply {})
    }
}

/// A convolution's handle and (descriptor, address) pairs: x, w, the convolution, y (for a
/// backward data dx and dy, for a backward filter dw and dy).
fn conv_call(handle: u64, x: (u64, u64), w: (u64, u64), conv_desc: u64, y: (u64, u64)) -> ConvCall {
    ConvCall { handle, x_desc: x.0, x: x.1, w_desc: w.0, w: w.1, conv_desc, y_desc: y.0, y: y.1, ..ConvCall::default() }
}
