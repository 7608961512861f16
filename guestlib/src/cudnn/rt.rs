//! How cuDNN's exports go through the guest core: a call's status is its return value, as for
//! cuBLAS; the runtime's last error is left alone. The last failure of the thread is kept for
//! `cudnnGetLastErrorString`.

use std::cell::RefCell;

use phos_protocol::RemoteCall;
use phos_protocol::apis::Function;
use phos_protocol::cudnn::{self as wire, CudnnStatus, FunctionId};

use super::known;
use crate::runtime;
pub use crate::runtime::{byte_len, call, check_out, copy_out, in_bytes};

thread_local! {
    /// What the thread's last failed cuDNN call was: its name and status.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The thread's last failure in words, and forget it (cuDNN clears it once read).
pub fn take_last_error() -> String {
    LAST_ERROR.try_with(|e| std::mem::take(&mut *e.borrow_mut())).unwrap_or_default()
}

fn note_failure(id: FunctionId, status: CudnnStatus) {
    let text = format!("{}: {}", id.name(), status.name());
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = text);
}

/// Run one cuDNN function; a panic becomes `CUDNN_STATUS_INTERNAL_ERROR`. A refusal
/// (`CUDNN_STATUS_NOT_SUPPORTED`, from the server or the guest) is logged once by name.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CudnnStatus>) -> i32 {
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => wire::SUCCESS,
        Err(e) => {
            if e == wire::NOT_SUPPORTED {
                runtime::log_refusal_once(Function::Cudnn(id), wire::NOT_SUPPORTED.name());
            }
            note_failure(id, e);
            e.0
        }
    }
}

/// A function Phos does not support: logged once, answers `CUDNN_STATUS_NOT_SUPPORTED`.
pub fn unsupported(id: FunctionId) -> i32 {
    runtime::log_unsupported_once(Function::Cudnn(id), wire::NOT_SUPPORTED.name());
    note_failure(id, wire::NOT_SUPPORTED);
    wire::NOT_SUPPORTED.0
}

/// A request with an async id: its key (`known`: what makes two calls the same for cuDNN's
/// checks, after its function and handle: its descriptors, modes, algorithms, sizes and which
/// of its pointers are NULL), the descriptors among them, and the variant packs it names.
pub trait Keyed {
    fn key(&self) -> (Vec<u64>, Vec<u64>, Vec<u64>);
    /// A tensor descriptor's setter or destruction, or a backend descriptor's setting,
    /// finalization or destruction: the guest sends it without waiting from its fast path
    /// where it knows the descriptor (`tensors`, `packs`); what reaches the generated path
    /// waits.
    const WAITS_HERE: bool = false;
}

/// A value of a key.
trait KeyValue {
    fn key(self) -> u64;
}

impl KeyValue for i32 {
    fn key(self) -> u64 {
        u64::from(self as u32)
    }
}

impl KeyValue for u64 {
    fn key(self) -> u64 {
        self
    }
}

impl KeyValue for i64 {
    fn key(self) -> u64 {
        self as u64
    }
}

impl KeyValue for f64 {
    fn key(self) -> u64 {
        self.to_bits()
    }
}

/// A call with an async id: without waiting where its handle is live and the same call (its
/// key) has succeeded since its descriptors were last set (`known`), else synchronously, which
/// proves it (a failure is then the call's own status, as on cuDNN). A failure of an async
/// call is returned by the next synchronous call of cuDNN on the handle (`FLAG_DEFERRED`).
///
/// A known tensor descriptor with a shape is named in the key by its shape (`tensors`), so a
/// fresh descriptor with the contents of a proven one (PyTorch makes them for every call) is
/// proven too; its setters need not forget the key, which no longer matches once the shape
/// changes. Every other descriptor is named by its handle, and forgets what it was proven in
/// when it is set or destroyed.
pub fn call_deferred<R: RemoteCall + Keyed>(req: &R, handle: u64) -> Result<(), R::Status> {
    if R::WAITS_HERE {
        return runtime::call(req).map(|_| ());
    }
    let (values, descriptors, packs) = req.key();
    let mut key = Vec::with_capacity(values.len() + 16);
    key.extend([u64::from(R::FUNCTION.id()), handle]);
    let mut by_handle = Vec::with_capacity(descriptors.len());
    for (i, v) in values.into_iter().enumerate() {
        match (i < descriptors.len()).then(|| super::tensors::content_key(v)).flatten() {
            Some(contents) => key.extend(contents),
            None => {
                key.push(v);
                if i < descriptors.len() {
                    by_handle.push(v);
                }
            }
        }
    }
    if known::proven(&key, &packs) {
        return runtime::call_deferred(req, handle);
    }
    runtime::call_proving(req, handle)?;
    known::note_proven(key, &by_handle);
    Ok(())
}

/// The tensor setters and destruction and the variant packs' settings, finalization and
/// destruction: their async ids are sent by the guest's fast path.
macro_rules! waits_here {
    ($($req:ident $(<$lt:lifetime>)?),*) => {
        $(impl Keyed for wire::$req $(<$lt>)? {
            fn key(&self) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
                (Vec::new(), Vec::new(), Vec::new())
            }
            const WAITS_HERE: bool = true;
        })*
    };
}

waits_here!(
    CudnnSetTensor4dDescriptorRequest,
    CudnnSetTensor4dDescriptorExRequest,
    CudnnSetTensorNdDescriptorRequest<'_>,
    CudnnSetTensorNdDescriptorExRequest<'_>,
    CudnnDeriveBNTensorDescriptorRequest,
    CudnnDestroyTensorDescriptorRequest,
    CudnnBackendSetAttributeRequest<'_>,
    CudnnBackendFinalizeRequest,
    CudnnBackendDestroyDescriptorRequest
);

/// Each request with an async id: its descriptors, its other values, the pointers whose
/// NULL-ness counts, and its variant packs.
macro_rules! keyed {
    ($($req:ident $(<$lt:lifetime>)? {
        descriptors: [$($d:ident),*], values: [$($v:ident),*], nulls: [$($n:ident),*] $(, packs: [$($p:ident),*])?
    })*) => {
        $(impl Keyed for wire::$req $(<$lt>)? {
            fn key(&self) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
                let descriptors: Vec<u64> = vec![$(self.$d),*];
                #[allow(unused_mut)] // Some calls have no values.
                let mut values = descriptors.clone();
                $(values.push(KeyValue::key(self.$v));)*
                $(values.push(u64::from(self.$n == 0));)*
                (values, descriptors, vec![$($(self.$p),*)?])
            }
        })*
    };
}

keyed! {
    CudnnSetStreamRequest { descriptors: [], values: [streamId], nulls: [] }
    CudnnBackendExecuteRequest { descriptors: [executionPlan], values: [], nulls: [], packs: [variantPack] }
    CudnnConvolutionForwardRequest<'_> {
        descriptors: [xDesc, wDesc, convDesc, yDesc], values: [algo, workSpaceSizeInBytes], nulls: [workSpace]
    }
    CudnnConvolutionBackwardDataRequest<'_> {
        descriptors: [wDesc, dyDesc, convDesc, dxDesc], values: [algo, workSpaceSizeInBytes], nulls: [workSpace]
    }
    CudnnConvolutionBackwardFilterRequest<'_> {
        descriptors: [xDesc, dyDesc, convDesc, dwDesc], values: [algo, workSpaceSizeInBytes], nulls: [workSpace]
    }
    CudnnConvolutionBackwardBiasRequest<'_> { descriptors: [dyDesc, dbDesc], values: [], nulls: [] }
    CudnnConvolutionBiasActivationForwardRequest<'_> {
        descriptors: [xDesc, wDesc, convDesc, zDesc, biasDesc, activationDesc, yDesc],
        values: [algo, workSpaceSizeInBytes],
        nulls: [workSpace]
    }
    CudnnBatchNormalizationForwardTrainingRequest<'_> {
        descriptors: [xDesc, yDesc, bnScaleBiasMeanVarDesc],
        values: [mode, exponentialAverageFactor, epsilon],
        nulls: [resultRunningMean, resultRunningVariance, resultSaveMean, resultSaveInvVariance]
    }
    CudnnBatchNormalizationForwardTrainingExRequest<'_> {
        descriptors: [xDesc, zDesc, yDesc, bnScaleBiasMeanVarDesc, activationDesc],
        values: [mode, bnOps, exponentialAverageFactor, epsilon, workSpaceSizeInBytes, reserveSpaceSizeInBytes],
        nulls: [zData, resultRunningMean, resultRunningVariance, resultSaveMean, resultSaveInvVariance, workspace, reserveSpace]
    }
    CudnnBatchNormalizationForwardInferenceRequest<'_> {
        descriptors: [xDesc, yDesc, bnScaleBiasMeanVarDesc], values: [mode, epsilon], nulls: []
    }
    CudnnBatchNormalizationBackwardRequest<'_> {
        descriptors: [xDesc, dyDesc, dxDesc, dBnScaleBiasDesc],
        values: [mode, epsilon],
        nulls: [savedMean, savedInvVariance]
    }
    CudnnBatchNormalizationBackwardExRequest<'_> {
        descriptors: [xDesc, yDesc, dyDesc, dzDesc, dxDesc, dBnScaleBiasDesc, activationDesc],
        values: [mode, bnOps, epsilon, workSpaceSizeInBytes, reserveSpaceSizeInBytes],
        nulls: [yData, dzData, savedMean, savedInvVariance, workSpace, reserveSpace]
    }
    CudnnActivationForwardRequest<'_> { descriptors: [activationDesc, xDesc, yDesc], values: [], nulls: [] }
    CudnnActivationBackwardRequest<'_> {
        descriptors: [activationDesc, yDesc, dyDesc, xDesc, dxDesc], values: [], nulls: []
    }
    CudnnAddTensorRequest<'_> { descriptors: [aDesc, cDesc], values: [], nulls: [] }
    CudnnSetTensorRequest<'_> { descriptors: [yDesc], values: [valueBytes], nulls: [] }
    CudnnScaleTensorRequest<'_> { descriptors: [yDesc], values: [], nulls: [] }
    CudnnTransformTensorRequest<'_> { descriptors: [xDesc, yDesc], values: [], nulls: [] }
    CudnnOpTensorRequest<'_> { descriptors: [opTensorDesc, aDesc, bDesc, cDesc], values: [], nulls: [] }
    CudnnPoolingForwardRequest<'_> { descriptors: [poolingDesc, xDesc, yDesc], values: [], nulls: [] }
    CudnnPoolingBackwardRequest<'_> {
        descriptors: [poolingDesc, yDesc, dyDesc, xDesc, dxDesc], values: [], nulls: []
    }
    CudnnSoftmaxForwardRequest<'_> { descriptors: [xDesc, yDesc], values: [algo, mode], nulls: [] }
    CudnnSoftmaxBackwardRequest<'_> { descriptors: [yDesc, dyDesc, dxDesc], values: [algo, mode], nulls: [] }
    CudnnLRNCrossChannelForwardRequest<'_> { descriptors: [normDesc, xDesc, yDesc], values: [lrnMode], nulls: [] }
    CudnnLRNCrossChannelBackwardRequest<'_> {
        descriptors: [normDesc, yDesc, dyDesc, xDesc, dxDesc], values: [lrnMode], nulls: []
    }
    CudnnReduceTensorRequest<'_> {
        descriptors: [reduceTensorDesc, aDesc, cDesc],
        values: [indicesSizeInBytes, workspaceSizeInBytes],
        nulls: [indices, workspace]
    }
}
