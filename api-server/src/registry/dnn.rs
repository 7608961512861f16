//! The session's cuDNN objects: handles (kind `cudnn_handle`: a device, a stream and cuDNN's
//! handle) and backend descriptors (kind `cudnn_backend_descriptor`: cuDNN's type, cuDNN's
//! descriptor, the attributes the program set and whether it was finalized), and the legacy
//! API's tensor descriptors (kind `cudnn_tensor_descriptor`: the shape the program set and
//! cuDNN's descriptor) and its other descriptors (filter, convolution, activation, pooling,
//! LRN, op-tensor and reduce-tensor: [`LegacyDesc`], one handle kind each).
//!
//! A descriptor another descriptor refers to (an attribute names it, or it was filled from it)
//! lives on after the program destroys it, hidden from the program, until nothing live refers
//! to it: cuDNN's objects stay valid, and a restore can replay what referred to it.

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Backend;

/// cuDNN handles a session may hold at once.
pub const MAX_DNN_HANDLES: u64 = 1024;
/// Backend descriptors a session may hold at once (PyTorch caches plans, each a handful).
pub const MAX_DNN_DESCRIPTORS: u64 = 1 << 18;

/// One handle's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DnnHandle {
    /// The device current when it was made.
    pub device: i32,
    /// The stream its work goes on (a stream handle; 0 is the legacy default stream).
    pub stream: u64,
    /// cuDNN's handle, 0 where there is no cuDNN (emu).
    pub raw: u64,
}

/// One attribute as the program set it (its elements hold the session's handles).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    pub ty: i32,
    pub count: i64,
    pub elements: Vec<u8>,
}

/// One backend descriptor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// cuDNN's descriptor type (`cudnnBackendDescriptorType_t`).
    pub kind: i32,
    /// cuDNN's descriptor, 0 where there is no cuDNN (emu).
    pub raw: u64,
    pub attributes: BTreeMap<i32, Attribute>,
    pub finalized: bool,
    /// The descriptors it refers to.
    pub references: BTreeSet<u64>,
    /// How many live descriptors refer to it.
    pub referrers: u32,
    /// The program destroyed it; it lives on for its referrers.
    pub released: bool,
    /// A variant pack in the guest's pool (`phosCudnnVariantPackPark`): holds nothing and is
    /// refused by every call until the guest makes it again (`phosCudnnVariantPackReinit`).
    pub parked: bool,
}

/// Legacy tensor descriptors a session may hold at once (PyTorch makes a few per call).
pub const MAX_DNN_TENSORS: u64 = 1 << 16;

/// A tensor descriptor's shape, as checked by the service (and by the guest: the rules are
/// shared).
pub use phos_protocol::dnn::TensorShape;

/// One legacy tensor descriptor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorDesc {
    /// cuDNN's descriptor, 0 where there is no cuDNN (emu).
    pub raw: u64,
    /// None until a setter gave it a shape.
    pub shape: Option<TensorShape>,
}

/// The legacy descriptors other than tensors, one handle kind each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyKind {
    Filter,
    Convolution,
    Activation,
    Pooling,
    Lrn,
    OpTensor,
    ReduceTensor,
}

impl LegacyKind {
    pub const ALL: [LegacyKind; 7] = [
        LegacyKind::Filter,
        LegacyKind::Convolution,
        LegacyKind::Activation,
        LegacyKind::Pooling,
        LegacyKind::Lrn,
        LegacyKind::OpTensor,
        LegacyKind::ReduceTensor,
    ];

    pub fn handle_kind(self) -> HandleKind {
        match self {
            LegacyKind::Filter => HandleKind::CudnnFilterDescriptor,
            LegacyKind::Convolution => HandleKind::CudnnConvolutionDescriptor,
            LegacyKind::Activation => HandleKind::CudnnActivationDescriptor,
            LegacyKind::Pooling => HandleKind::CudnnPoolingDescriptor,
            LegacyKind::Lrn => HandleKind::CudnnLrnDescriptor,
            LegacyKind::OpTensor => HandleKind::CudnnOpTensorDescriptor,
            LegacyKind::ReduceTensor => HandleKind::CudnnReduceTensorDescriptor,
        }
    }

    /// The spec's name of the kind (a checkpoint's counters are named so).
    pub fn name(self) -> &'static str {
        match self {
            LegacyKind::Filter => "cudnn_filter_descriptor",
            LegacyKind::Convolution => "cudnn_convolution_descriptor",
            LegacyKind::Activation => "cudnn_activation_descriptor",
            LegacyKind::Pooling => "cudnn_pooling_descriptor",
            LegacyKind::Lrn => "cudnn_lrn_descriptor",
            LegacyKind::OpTensor => "cudnn_op_tensor_descriptor",
            LegacyKind::ReduceTensor => "cudnn_reduce_tensor_descriptor",
        }
    }

    /// What a new descriptor holds before a setter runs.
    fn initial(self) -> LegacyState {
        match self {
            LegacyKind::Filter => LegacyState::Filter(None),
            LegacyKind::Convolution => LegacyState::Convolution(ConvSettings::default()),
            LegacyKind::Activation => LegacyState::Activation(None),
            LegacyKind::Pooling => LegacyState::Pooling(None),
            // cuDNN's defaults for a new LRN descriptor.
            LegacyKind::Lrn => LegacyState::Lrn(LrnSettings { n: 5, alpha: 1e-4, beta: 0.75, k: 2.0 }),
            LegacyKind::OpTensor => LegacyState::OpTensor(None),
            LegacyKind::ReduceTensor => LegacyState::ReduceTensor(None),
        }
    }
}

/// A filter descriptor's shape (packed in `format`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterShape {
    pub data_type: i32,
    pub format: i32,
    /// K, C, then the spatial dimensions.
    pub dims: Vec<i32>,
}

/// A convolution descriptor's settings; `pads` is empty until a setter gave the geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvSettings {
    pub pads: Vec<i32>,
    pub strides: Vec<i32>,
    pub dilations: Vec<i32>,
    /// `cudnnConvolutionMode_t`: 0 convolution (the filter flipped), 1 cross-correlation.
    pub mode: i32,
    pub compute_type: i32,
    pub math_type: i32,
    pub groups: i32,
    pub reorder: i32,
}

impl Default for ConvSettings {
    fn default() -> Self {
        ConvSettings {
            pads: Vec::new(),
            strides: Vec::new(),
            dilations: Vec::new(),
            mode: 0,
            compute_type: 0,
            math_type: 0,
            groups: 1,
            reorder: 0,
        }
    }
}

/// An activation descriptor's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationSettings {
    /// `cudnnActivationMode_t`.
    pub mode: i32,
    pub nan_propagation: i32,
    pub coef: f64,
    pub swish_beta: f64,
}

/// A pooling descriptor's settings (one window, padding and stride per spatial dimension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolingSettings {
    /// `cudnnPoolingMode_t`.
    pub mode: i32,
    pub nan_propagation: i32,
    pub window: Vec<i32>,
    pub pads: Vec<i32>,
    pub strides: Vec<i32>,
}

/// An LRN descriptor's settings (cuDNN divides `alpha` by `n` itself).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrnSettings {
    pub n: u32,
    pub alpha: f64,
    pub beta: f64,
    pub k: f64,
}

/// An op-tensor descriptor's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpTensorSettings {
    /// `cudnnOpTensorOp_t`.
    pub op: i32,
    pub compute_type: i32,
    pub nan_propagation: i32,
}

/// A reduce-tensor descriptor's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceSettings {
    /// `cudnnReduceTensorOp_t`.
    pub op: i32,
    pub compute_type: i32,
    pub nan_propagation: i32,
    /// `cudnnReduceTensorIndices_t` and `cudnnIndicesType_t`.
    pub indices: i32,
    pub indices_type: i32,
}

/// What one legacy descriptor holds.
#[derive(Debug, Clone, PartialEq)]
pub enum LegacyState {
    Filter(Option<FilterShape>),
    Convolution(ConvSettings),
    Activation(Option<ActivationSettings>),
    Pooling(Option<PoolingSettings>),
    Lrn(LrnSettings),
    OpTensor(Option<OpTensorSettings>),
    ReduceTensor(Option<ReduceSettings>),
}

/// One legacy descriptor: cuDNN's (0 where there is no cuDNN) and what the program set.
#[derive(Debug, Clone, PartialEq)]
pub struct LegacyDesc {
    pub raw: u64,
    pub state: LegacyState,
}

/// Legacy descriptors of each kind a session may hold at once.
pub const MAX_DNN_LEGACY: u64 = 1 << 16;

pub struct DnnRegistry {
    handles: Mutex<HandleTable<DnnHandle>>,
    descriptors: Mutex<HandleTable<Descriptor>>,
    tensors: Mutex<HandleTable<TensorDesc>>,
    /// Tensor descriptors in the guest's pool (`phosCudnnTensorDescriptorPark`): refused by
    /// every call until the guest makes them again (`phosCudnnTensorDescriptorReinit`).
    parked_tensors: Mutex<std::collections::HashSet<u64>>,
    /// One table per [`LegacyKind`], in [`LegacyKind::ALL`]'s order.
    legacy: [Mutex<HandleTable<LegacyDesc>>; 7],
}

impl Default for DnnRegistry {
    fn default() -> Self {
        DnnRegistry {
            handles: Mutex::new(HandleTable::new(HandleKind::CudnnHandle, MAX_DNN_HANDLES)),
            descriptors: Mutex::new(HandleTable::new(HandleKind::CudnnBackendDescriptor, MAX_DNN_DESCRIPTORS)),
            tensors: Mutex::new(HandleTable::new(HandleKind::CudnnTensorDescriptor, MAX_DNN_TENSORS)),
            parked_tensors: Mutex::default(),
            legacy: LegacyKind::ALL.map(|k| Mutex::new(HandleTable::new(k.handle_kind(), MAX_DNN_LEGACY))),
        }
    }
}

impl DnnRegistry {
    pub fn create_handle(&self, h: DnnHandle, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.handles.lock().add(h, new)
    }

    pub fn destroy_handle(&self, handle: u64) -> Result<DnnHandle, CudaError> {
        self.handles.lock().remove(handle)
    }

    pub fn handle(&self, handle: u64) -> Result<DnnHandle, CudaError> {
        self.handles.lock().get(handle).copied()
    }

    pub fn set_stream(&self, handle: u64, stream: u64) -> Result<(), CudaError> {
        self.handles.lock().get_mut(handle)?.stream = stream;
        Ok(())
    }

    /// The handle whose cuDNN handle is `raw`.
    pub fn handle_of_raw(&self, raw: u64) -> Option<u64> {
        self.handles.lock().iter().find(|(_, h)| h.raw == raw && raw != 0).map(|(v, _)| v)
    }

    pub fn create_descriptor(&self, d: Descriptor, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.descriptors.lock().add(d, new)
    }

    /// A descriptor the program holds (not one it destroyed).
    pub fn descriptor(&self, handle: u64) -> Result<Descriptor, CudaError> {
        let table = self.descriptors.lock();
        let d = table.get(handle)?;
        if d.released || d.parked {
            return Err(CudaError::InvalidResourceHandle);
        }
        Ok(d.clone())
    }

    /// A descriptor the session keeps, the program's or one it destroyed that lives on for
    /// its referrers (what the server reads of a plan's graph).
    pub fn kept_descriptor(&self, handle: u64) -> Result<Descriptor, CudaError> {
        Ok(self.descriptors.lock().get(handle)?.clone())
    }

    /// The descriptor whose cuDNN descriptor is `raw`.
    pub fn descriptor_of_raw(&self, raw: u64) -> Option<u64> {
        self.descriptors.lock().iter().find(|(_, d)| d.raw == raw && raw != 0).map(|(v, _)| v)
    }

    /// Keep an attribute the program set, and what it refers to.
    pub fn set_attribute(&self, handle: u64, name: i32, attribute: Attribute, refers_to: &[u64]) {
        self.refer(handle, refers_to);
        if let Ok(d) = self.descriptors.lock().get_mut(handle) {
            d.attributes.insert(name, attribute);
        }
    }

    /// Note that `handle` refers to each of `targets` (each counted once).
    pub fn refer(&self, handle: u64, targets: &[u64]) {
        let mut table = self.descriptors.lock();
        let Ok(d) = table.get_mut(handle) else { return };
        let new: Vec<u64> = targets.iter().copied().filter(|t| *t != handle && d.references.insert(*t)).collect();
        for t in new {
            if let Ok(target) = table.get_mut(t) {
                target.referrers += 1;
            }
        }
    }

    pub fn finalize(&self, handle: u64) -> Result<(), CudaError> {
        self.descriptors.lock().get_mut(handle)?.finalized = true;
        Ok(())
    }

    /// The program destroys a descriptor: it goes now if nothing refers to it, and so does
    /// each descriptor it referred to that the program destroyed and nothing else refers to.
    /// Answers those that went (handle, cuDNN's descriptor).
    pub fn release_descriptor(&self, handle: u64) -> Result<Vec<(u64, u64)>, CudaError> {
        let mut table = self.descriptors.lock();
        let d = table.get_mut(handle)?;
        if d.released || d.parked {
            return Err(CudaError::InvalidResourceHandle);
        }
        d.released = true;
        let mut gone = Vec::new();
        let mut candidates = vec![handle];
        while let Some(h) = candidates.pop() {
            let removable = table.get(h).is_ok_and(|d| d.released && d.referrers == 0);
            if !removable {
                continue;
            }
            let Ok(d) = table.remove(h) else { continue };
            gone.push((h, d.raw));
            for t in d.references {
                if let Ok(target) = table.get_mut(t) {
                    target.referrers = target.referrers.saturating_sub(1);
                    candidates.push(t);
                }
            }
        }
        Ok(gone)
    }

    /// A variant pack (a descriptor of `kind`) goes into the guest's pool: it is emptied (a
    /// fresh descriptor with no cuDNN descriptor, parked) and refused from now on until it is
    /// made again. Only a live descriptor of `kind` that refers to no other and that no other
    /// refers to is parked (else an error, and nothing changes). Answers the earlier cuDNN
    /// descriptor, to be destroyed.
    pub fn park_pack(&self, handle: u64, kind: i32) -> Result<u64, CudaError> {
        let mut table = self.descriptors.lock();
        let d = table.get_mut(handle)?;
        if d.released || d.parked || d.kind != kind || d.referrers != 0 || !d.references.is_empty() {
            return Err(CudaError::InvalidResourceHandle);
        }
        let old = std::mem::replace(d, Descriptor { kind, parked: true, ..Descriptor::default() });
        Ok(old.raw)
    }

    /// Make a parked variant pack (a descriptor of `kind`) again under its handle, around
    /// cuDNN's `raw`: live, holding nothing. One that is not parked is an error.
    pub fn reinit_pack(&self, handle: u64, kind: i32, raw: u64) -> Result<(), CudaError> {
        let mut table = self.descriptors.lock();
        let d = table.get_mut(handle)?;
        if !d.parked || d.kind != kind {
            return Err(CudaError::InvalidResourceHandle);
        }
        *d = Descriptor { kind, raw, ..Descriptor::default() };
        Ok(())
    }

    pub fn create_tensor(&self, t: TensorDesc, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.tensors.lock().add(t, new)
    }

    pub fn destroy_tensor(&self, handle: u64) -> Result<TensorDesc, CudaError> {
        self.tensor_not_parked(handle)?;
        self.tensors.lock().remove(handle)
    }

    pub fn tensor(&self, handle: u64) -> Result<TensorDesc, CudaError> {
        self.tensor_not_parked(handle)?;
        self.tensors.lock().get(handle).cloned()
    }

    pub fn set_tensor_shape(&self, handle: u64, shape: TensorShape) -> Result<(), CudaError> {
        self.tensor_not_parked(handle)?;
        self.tensors.lock().get_mut(handle)?.shape = Some(shape);
        Ok(())
    }

    fn tensor_not_parked(&self, handle: u64) -> Result<(), CudaError> {
        let parked = self.parked_tensors.lock();
        if !parked.is_empty() && parked.contains(&handle) {
            return Err(CudaError::InvalidResourceHandle);
        }
        Ok(())
    }

    /// A tensor descriptor goes into the guest's pool: refused from now on until it is made
    /// again. One that is not live (or parked already) is an error.
    pub fn park_tensor(&self, handle: u64) -> Result<(), CudaError> {
        self.tensor_not_parked(handle)?;
        self.tensors.lock().get(handle)?;
        self.parked_tensors.lock().insert(handle);
        Ok(())
    }

    /// Make a tensor descriptor again under its handle (the guest's pool): `t` replaces it,
    /// live again; the earlier one is answered, for its cuDNN descriptor to be destroyed.
    pub fn reinit_tensor(&self, handle: u64, t: TensorDesc) -> Result<TensorDesc, CudaError> {
        let old = std::mem::replace(self.tensors.lock().get_mut(handle)?, t);
        self.parked_tensors.lock().remove(&handle);
        Ok(old)
    }

    fn legacy_table(&self, kind: LegacyKind) -> &Mutex<HandleTable<LegacyDesc>> {
        &self.legacy[kind as usize]
    }

    /// A new legacy descriptor of `kind` around cuDNN's `raw`, holding nothing yet.
    pub fn create_legacy(&self, kind: LegacyKind, raw: u64, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.legacy_table(kind).lock().add(LegacyDesc { raw, state: kind.initial() }, new)
    }

    pub fn destroy_legacy(&self, kind: LegacyKind, handle: u64) -> Result<LegacyDesc, CudaError> {
        self.legacy_table(kind).lock().remove(handle)
    }

    pub fn legacy(&self, kind: LegacyKind, handle: u64) -> Result<LegacyDesc, CudaError> {
        self.legacy_table(kind).lock().get(handle).cloned()
    }

    pub fn set_legacy(&self, kind: LegacyKind, handle: u64, state: LegacyState) -> Result<(), CudaError> {
        self.legacy_table(kind).lock().get_mut(handle)?.state = state;
        Ok(())
    }

    /// Next counters of the legacy kinds, in [`LegacyKind::ALL`]'s order.
    pub fn legacy_counters(&self) -> Vec<(&'static str, u64)> {
        LegacyKind::ALL.iter().map(|&k| (k.name(), self.legacy_table(k).lock().next_counter())).collect()
    }

    pub fn set_legacy_counter(&self, kind: LegacyKind, next: u64) {
        self.legacy_table(kind).lock().set_next_counter(next);
    }

    /// Next counters of handles, backend descriptors and tensor descriptors.
    pub fn next_counters(&self) -> (u64, u64, u64) {
        (self.handles.lock().next_counter(), self.descriptors.lock().next_counter(), self.tensors.lock().next_counter())
    }

    pub fn set_next_counters(&self, handles: Option<u64>, descriptors: Option<u64>, tensors: Option<u64>) {
        if let Some(n) = handles {
            self.handles.lock().set_next_counter(n);
        }
        if let Some(n) = descriptors {
            self.descriptors.lock().set_next_counter(n);
        }
        if let Some(n) = tensors {
            self.tensors.lock().set_next_counter(n);
        }
    }

    /// Destroy every object (a device reset, the session's end): descriptors first, then the
    /// handles they may name.
    pub fn release_all(&self, backend: &dyn Backend) {
        let descriptors = self.descriptors.lock().drain();
        let tensors = self.tensors.lock().drain();
        self.parked_tensors.lock().clear();
        let legacy: Vec<_> = LegacyKind::ALL.map(|k| (k, self.legacy_table(k).lock().drain())).into();
        let handles = self.handles.lock().drain();
        if let Some(cudnn) = backend.cudnn() {
            for (kind, table) in legacy {
                for (_, d) in table.into_iter().filter(|(_, d)| d.raw != 0) {
                    cudnn.destroy_legacy(kind, d.raw);
                }
            }
            for (_, d) in descriptors.into_iter().filter(|(_, d)| d.raw != 0) {
                cudnn.destroy_descriptor(d.raw);
            }
            for (_, t) in tensors.into_iter().filter(|(_, t)| t.raw != 0) {
                cudnn.destroy_tensor(t.raw);
            }
            for (_, h) in handles.into_iter().filter(|(_, h)| h.raw != 0) {
                cudnn.destroy(h.raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_handle() -> NewHandle<'static> {
        NewHandle { forced: None, full: &|| CudaError::MemoryAllocation }
    }

    #[test]
    fn a_parked_tensor_is_refused_until_it_is_made_again() {
        let r = DnnRegistry::default();
        let t = r.create_tensor(TensorDesc { raw: 7, shape: None }, &new_handle()).unwrap();
        let shape = TensorShape { data_type: 0, dims: vec![1, 2, 3, 4], strides: vec![24, 12, 4, 1] };
        r.set_tensor_shape(t, shape.clone()).unwrap();
        r.park_tensor(t).unwrap();
        assert!(r.tensor(t).is_err(), "parked: as destroyed");
        assert!(r.set_tensor_shape(t, shape).is_err());
        assert!(r.destroy_tensor(t).is_err());
        assert!(r.park_tensor(t).is_err(), "parked twice");
        let old = r.reinit_tensor(t, TensorDesc { raw: 8, shape: None }).unwrap();
        assert_eq!((old.raw, old.shape.is_some()), (7, true));
        assert_eq!(r.tensor(t).unwrap(), TensorDesc { raw: 8, shape: None }, "fresh, under the same handle");
        assert!(r.reinit_tensor(t + 1, TensorDesc::default()).is_err(), "not a tensor of the session");
    }

    #[test]
    fn a_parked_pack_is_refused_until_it_is_made_again() {
        let r = DnnRegistry::default();
        let pack = Descriptor { kind: 16, raw: 7, ..Descriptor::default() };
        let p = r.create_descriptor(pack.clone(), &new_handle()).unwrap();
        let other = r.create_descriptor(Descriptor { kind: 17, ..Descriptor::default() }, &new_handle()).unwrap();
        assert!(r.reinit_pack(p, 16, 8).is_err(), "not parked");
        assert!(r.park_pack(other, 16).is_err(), "not a variant pack");
        r.set_attribute(p, 1000, Attribute { ty: 5, count: 1, elements: vec![0; 8] }, &[]);
        assert_eq!(r.park_pack(p, 16).unwrap(), 7, "cuDNN's descriptor to destroy");
        assert!(r.descriptor(p).is_err(), "parked: as destroyed");
        assert!(r.release_descriptor(p).is_err(), "parked: not destroyed again");
        assert!(r.park_pack(p, 16).is_err(), "parked twice");
        r.reinit_pack(p, 16, 9).unwrap();
        let fresh = r.descriptor(p).unwrap();
        assert_eq!((fresh.raw, fresh.attributes.len(), fresh.finalized), (9, 0, false), "made fresh");
        r.refer(other, &[p]);
        assert!(r.park_pack(p, 16).is_err(), "referred to");
    }

    #[test]
    fn a_referred_descriptor_lives_until_its_referrers_go() {
        let r = DnnRegistry::default();
        let tensor = r.create_descriptor(Descriptor::default(), &new_handle()).unwrap();
        let op = r.create_descriptor(Descriptor::default(), &new_handle()).unwrap();
        r.refer(op, &[tensor, tensor]);
        // Destroyed by the program, but the operation refers to it: hidden, not gone.
        assert_eq!(r.release_descriptor(tensor).unwrap(), vec![]);
        assert!(r.descriptor(tensor).is_err(), "the program no longer reaches it");
        assert!(r.release_descriptor(tensor).is_err(), "destroyed twice");
        // The operation goes, and takes the tensor with it.
        let gone: Vec<u64> = r.release_descriptor(op).unwrap().into_iter().map(|(h, _)| h).collect();
        assert_eq!(gone, vec![op, tensor]);
    }

    #[test]
    fn a_descriptor_still_held_by_the_program_stays() {
        let r = DnnRegistry::default();
        let tensor = r.create_descriptor(Descriptor::default(), &new_handle()).unwrap();
        let op = r.create_descriptor(Descriptor::default(), &new_handle()).unwrap();
        r.refer(op, &[tensor]);
        assert_eq!(r.release_descriptor(op).unwrap().len(), 1);
        assert!(r.descriptor(tensor).is_ok());
        assert_eq!(r.descriptor(tensor).unwrap().referrers, 0);
    }
}
