//! NVIDIA's libcudnn (cuDNN 9), which a GPU backend runs cuDNN's calls with, loaded at run time
//! from where [`find_library`] looks (Python's `nvidia/cudnn/lib` among them). Every cuDNN call
//! Phos carries names objects the session translates (handles, descriptors, the elements of
//! attributes), so none is a generated vendor call: the entry points are here, each with its
//! prototype from cudnn_graph.h, and the service makes the calls with translated arguments.
//! libcudnn loads its sub-libraries (`libcudnn_graph.so.9`, the engines) itself, from its own
//! directory.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};

use super::vendor::{VendorOpenError, find_library};
use crate::registry::dnn::{LegacyKind, LegacyState};

/// The environment variable naming the libcudnn file to load.
pub const CUDNN_LIB_VAR: &str = "PHOS_CUDNN_LIB";

/// cuDNN's soname (cuDNN 9, for CUDA 11.8, 12 and 13).
const CUDNN_SONAMES: [&str; 1] = ["libcudnn.so.9"];

type Raw = *mut c_void;
type CreateFn = unsafe extern "C" fn(*mut Raw) -> i32;
type ObjectFn = unsafe extern "C" fn(Raw) -> i32;
type SetStreamFn = unsafe extern "C" fn(Raw, Raw) -> i32;
type VersionFn = unsafe extern "C" fn() -> usize;
type CreateDescriptorFn = unsafe extern "C" fn(i32, *mut Raw) -> i32;
type SetAttributeFn = unsafe extern "C" fn(Raw, i32, i32, i64, *const c_void) -> i32;
type GetAttributeFn = unsafe extern "C" fn(Raw, i32, i32, i64, *mut i64, *mut c_void) -> i32;
type ExecuteFn = unsafe extern "C" fn(Raw, Raw, Raw) -> i32;
type SetTensorNdFn = unsafe extern "C" fn(Raw, i32, i32, *const i32, *const i32) -> i32;
type FwdWorkspaceFn = unsafe extern "C" fn(Raw, i32, i32, Raw, Raw, Raw, Raw, Raw, *mut usize) -> i32;
type BwdWorkspaceFn = unsafe extern "C" fn(Raw, i32, i32, Raw, Raw, Raw, Raw, Raw, Raw, Raw, *mut usize) -> i32;
type ReserveFn = unsafe extern "C" fn(Raw, i32, i32, Raw, Raw, *mut usize) -> i32;
type P = *const c_void;
type M = *mut c_void;
type FwdTrainingFn = unsafe extern "C" fn(Raw, i32, P, P, Raw, P, Raw, M, Raw, P, P, f64, M, M, f64, M, M) -> i32;
type FwdTrainingExFn = unsafe extern "C" fn(
    Raw,
    i32,
    i32,
    P,
    P,
    Raw,
    P,
    Raw,
    P,
    Raw,
    M,
    Raw,
    P,
    P,
    f64,
    M,
    M,
    f64,
    M,
    M,
    Raw,
    M,
    usize,
    M,
    usize,
) -> i32;
type FwdInferenceFn = unsafe extern "C" fn(Raw, i32, P, P, Raw, P, Raw, M, Raw, P, P, P, P, f64) -> i32;
type BwdFn = unsafe extern "C" fn(Raw, i32, P, P, P, P, Raw, P, Raw, P, Raw, M, Raw, P, M, M, f64, P, P) -> i32;
type BwdExFn = unsafe extern "C" fn(
    Raw,
    i32,
    i32,
    P,
    P,
    P,
    P,
    Raw,
    P,
    Raw,
    P,
    Raw,
    P,
    Raw,
    M,
    Raw,
    M,
    Raw,
    P,
    P,
    M,
    M,
    f64,
    P,
    P,
    Raw,
    M,
    usize,
    M,
    usize,
) -> i32;

/// One batch normalization call in cuDNN's terms: cuDNN's handle and descriptors, device
/// addresses the session checked (0 for NULL), the scaling factors as host floats.
#[derive(Debug, Clone, Copy, Default)]
pub struct BnCall {
    pub handle: u64,
    pub mode: i32,
    pub ops: i32,
    /// alpha and beta of the data (y or dx).
    pub data_scaling: [f32; 2],
    /// alpha and beta of the parameter gradients.
    pub param_scaling: [f32; 2],
    pub x_desc: u64,
    pub x: u64,
    pub z_desc: u64,
    pub z: u64,
    pub y_desc: u64,
    pub y: u64,
    pub dy_desc: u64,
    pub dy: u64,
    pub dz_desc: u64,
    pub dz: u64,
    pub dx_desc: u64,
    pub dx: u64,
    pub bn_desc: u64,
    pub scale: u64,
    pub bias: u64,
    pub dscale: u64,
    pub dbias: u64,
    pub running_mean: u64,
    pub running_var: u64,
    pub saved_mean: u64,
    pub saved_inv_var: u64,
    pub factor: f64,
    pub epsilon: f64,
    pub workspace: u64,
    pub workspace_size: u64,
    pub reserve: u64,
    pub reserve_size: u64,
}

fn r(v: u64) -> Raw {
    v as Raw
}
fn p(v: u64) -> P {
    v as P
}

/// NVIDIA's libcudnn: the functions the session calls.
pub struct Cudnn {
    pub path: PathBuf,
    _library: libloading::Library,
    create: CreateFn,
    destroy: ObjectFn,
    set_stream: SetStreamFn,
    get_version: VersionFn,
    get_max_device_version: VersionFn,
    get_cudart_version: VersionFn,
    create_descriptor: CreateDescriptorFn,
    destroy_descriptor: ObjectFn,
    finalize: ObjectFn,
    set_attribute: SetAttributeFn,
    get_attribute: GetAttributeFn,
    execute: ExecuteFn,
    create_tensor: CreateFn,
    destroy_tensor: ObjectFn,
    set_tensor_nd: SetTensorNdFn,
    fwd_workspace: FwdWorkspaceFn,
    bwd_workspace: BwdWorkspaceFn,
    reserve_size: ReserveFn,
    fwd_training: FwdTrainingFn,
    fwd_training_ex: FwdTrainingExFn,
    fwd_inference: FwdInferenceFn,
    bwd: BwdFn,
    bwd_ex: BwdExFn,
    /// The legacy entry points of [`LEGACY_SYMBOLS`] the library has, by name.
    legacy: HashMap<&'static str, usize>,
}

/// cuDNN's versions, as its three version functions answer them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudnnVersions {
    pub version: usize,
    pub max_device_version: usize,
    pub cudart_version: usize,
}

impl Cudnn {
    /// Load the first libcudnn of [`find_library`] that opens and has the functions.
    pub fn open() -> Result<Cudnn, VendorOpenError> {
        let mut last = VendorOpenError::NotFound { library: "libcudnn", var: CUDNN_LIB_VAR };
        for path in find_library(CUDNN_LIB_VAR, "cudnn", &CUDNN_SONAMES) {
            match Cudnn::open_at(&path) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<Cudnn, VendorOpenError> {
        let err = |error| VendorOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's libcudnn; loading it runs its initialisers, which is
        // what using it means.
        let library = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point, with its prototype from cudnn_graph.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the callers name each function with its prototype in cudnn_graph.h.
            unsafe { lib.get::<T>(name) }.map(|s| *s)
        }
        Ok(Cudnn {
            create: get(&library, b"cudnnCreate\0").map_err(err)?,
            destroy: get(&library, b"cudnnDestroy\0").map_err(err)?,
            set_stream: get(&library, b"cudnnSetStream\0").map_err(err)?,
            get_version: get(&library, b"cudnnGetVersion\0").map_err(err)?,
            get_max_device_version: get(&library, b"cudnnGetMaxDeviceVersion\0").map_err(err)?,
            get_cudart_version: get(&library, b"cudnnGetCudartVersion\0").map_err(err)?,
            create_descriptor: get(&library, b"cudnnBackendCreateDescriptor\0").map_err(err)?,
            destroy_descriptor: get(&library, b"cudnnBackendDestroyDescriptor\0").map_err(err)?,
            finalize: get(&library, b"cudnnBackendFinalize\0").map_err(err)?,
            set_attribute: get(&library, b"cudnnBackendSetAttribute\0").map_err(err)?,
            get_attribute: get(&library, b"cudnnBackendGetAttribute\0").map_err(err)?,
            execute: get(&library, b"cudnnBackendExecute\0").map_err(err)?,
            create_tensor: get(&library, b"cudnnCreateTensorDescriptor\0").map_err(err)?,
            destroy_tensor: get(&library, b"cudnnDestroyTensorDescriptor\0").map_err(err)?,
            set_tensor_nd: get(&library, b"cudnnSetTensorNdDescriptor\0").map_err(err)?,
            fwd_workspace: get(&library, b"cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize\0").map_err(err)?,
            bwd_workspace: get(&library, b"cudnnGetBatchNormalizationBackwardExWorkspaceSize\0").map_err(err)?,
            reserve_size: get(&library, b"cudnnGetBatchNormalizationTrainingExReserveSpaceSize\0").map_err(err)?,
            fwd_training: get(&library, b"cudnnBatchNormalizationForwardTraining\0").map_err(err)?,
            fwd_training_ex: get(&library, b"cudnnBatchNormalizationForwardTrainingEx\0").map_err(err)?,
            fwd_inference: get(&library, b"cudnnBatchNormalizationForwardInference\0").map_err(err)?,
            bwd: get(&library, b"cudnnBatchNormalizationBackward\0").map_err(err)?,
            bwd_ex: get(&library, b"cudnnBatchNormalizationBackwardEx\0").map_err(err)?,
            legacy: Cudnn::legacy_symbols(&library),
            _library: library,
            path: path.to_path_buf(),
        })
    }

    /// A new handle, on the context current on the calling thread.
    pub fn create(&self) -> Result<u64, i32> {
        let mut h: Raw = std::ptr::null_mut();
        // SAFETY: cudnnCreate writes the handle to a valid out pointer.
        let code = unsafe { (self.create)(&mut h) };
        if code == 0 { Ok(h as u64) } else { Err(code) }
    }

    pub fn destroy(&self, handle: u64) -> i32 {
        // SAFETY: a handle `create` made and the session has not destroyed.
        unsafe { (self.destroy)(handle as Raw) }
    }

    /// The stream a handle's work goes on (a `CUstream`; 0 the legacy default stream).
    pub fn set_stream(&self, handle: u64, stream: u64) -> i32 {
        // SAFETY: a live handle, and a stream of the session's context (or a special one).
        unsafe { (self.set_stream)(handle as Raw, stream as Raw) }
    }

    pub fn versions(&self) -> CudnnVersions {
        // SAFETY: the version functions take nothing and only read the library's constants.
        let version = unsafe { (self.get_version)() };
        // SAFETY: as above.
        let max_device_version = unsafe { (self.get_max_device_version)() };
        // SAFETY: as above.
        let cudart_version = unsafe { (self.get_cudart_version)() };
        CudnnVersions { version, max_device_version, cudart_version }
    }

    /// A new backend descriptor of cuDNN's type `kind`.
    pub fn create_descriptor(&self, kind: i32) -> Result<u64, i32> {
        let mut d: Raw = std::ptr::null_mut();
        // SAFETY: the call writes the descriptor to a valid out pointer; cuDNN checks `kind`.
        let code = unsafe { (self.create_descriptor)(kind, &mut d) };
        if code == 0 { Ok(d as u64) } else { Err(code) }
    }

    pub fn destroy_descriptor(&self, descriptor: u64) -> i32 {
        // SAFETY: a descriptor `create_descriptor` made and the session has not destroyed.
        unsafe { (self.destroy_descriptor)(descriptor as Raw) }
    }

    pub fn finalize(&self, descriptor: u64) -> i32 {
        // SAFETY: a live descriptor of the session.
        unsafe { (self.finalize)(descriptor as Raw) }
    }

    /// Set an attribute: `count` elements of `ty` in `elements`, already translated (cuDNN's
    /// own objects in place of the session's handles).
    pub fn set_attribute(&self, descriptor: u64, name: i32, ty: i32, count: i64, elements: &[u8]) -> i32 {
        let data = if elements.is_empty() { std::ptr::null() } else { elements.as_ptr().cast::<c_void>() };
        // SAFETY: a live descriptor; `elements` holds `count` elements of `ty` (the dispatch
        // checked its size against the type, the service translated its objects), and cuDNN
        // copies what it keeps.
        unsafe { (self.set_attribute)(descriptor as Raw, name, ty, count, data) }
    }

    /// Read an attribute into `elements` (room for `requested` elements of `ty`, descriptors
    /// to fill already translated); answers the element count cuDNN has.
    pub fn get_attribute(
        &self,
        descriptor: u64,
        name: i32,
        ty: i32,
        requested: i64,
        elements: &mut [u8],
    ) -> Result<i64, i32> {
        let mut count: i64 = 0;
        let data = if elements.is_empty() { std::ptr::null_mut() } else { elements.as_mut_ptr().cast::<c_void>() };
        let requested = if elements.is_empty() { 0 } else { requested };
        // SAFETY: a live descriptor; `elements` has room for `requested` elements of `ty` (the
        // dispatch checked its size), a valid out pointer for the count.
        let code = unsafe { (self.get_attribute)(descriptor as Raw, name, ty, requested, &mut count, data) };
        if code == 0 { Ok(count) } else { Err(code) }
    }

    /// Run an execution plan with a variant pack whose pointers the session has checked.
    pub fn execute(&self, handle: u64, plan: u64, variant_pack: u64) -> i32 {
        let profiled = phos_protocol::call_profile::start();
        // SAFETY: live objects of the session, on its context; the pack's device pointers
        // lie in the session's memory (checked by the caller).
        let code = unsafe { (self.execute)(handle as Raw, plan as Raw, variant_pack as Raw) };
        phos_protocol::call_profile::vendor_ended(profiled);
        code
    }

    /// A new legacy tensor descriptor.
    pub fn create_tensor(&self) -> Result<u64, i32> {
        let mut d: Raw = std::ptr::null_mut();
        // SAFETY: the call writes the descriptor to a valid out pointer.
        let code = unsafe { (self.create_tensor)(&mut d) };
        if code == 0 { Ok(d as u64) } else { Err(code) }
    }

    pub fn destroy_tensor(&self, descriptor: u64) -> i32 {
        // SAFETY: a descriptor `create_tensor` made and the session has not destroyed.
        unsafe { (self.destroy_tensor)(r(descriptor)) }
    }

    /// Give a tensor descriptor its type, dimensions and strides (as many of each).
    pub fn set_tensor_nd(&self, descriptor: u64, data_type: i32, dims: &[i32], strides: &[i32]) -> i32 {
        let n = dims.len().min(strides.len()) as i32;
        // SAFETY: a live descriptor; both arrays hold `n` elements, which cuDNN reads and copies.
        unsafe { (self.set_tensor_nd)(r(descriptor), data_type, n, dims.as_ptr(), strides.as_ptr()) }
    }

    /// The workspace cudnnBatchNormalizationForwardTrainingEx needs with these descriptors.
    pub fn forward_training_workspace(&self, c: &BnCall) -> Result<u64, i32> {
        let mut size = 0usize;
        // SAFETY: live objects of the session (null where the call passes none), a valid out
        // pointer.
        let code = unsafe {
            (self.fwd_workspace)(
                r(c.handle),
                c.mode,
                c.ops,
                r(c.x_desc),
                r(c.z_desc),
                r(c.y_desc),
                r(c.bn_desc),
                std::ptr::null_mut(),
                &mut size,
            )
        };
        if code == 0 { Ok(size as u64) } else { Err(code) }
    }

    /// The workspace cudnnBatchNormalizationBackwardEx needs with these descriptors.
    pub fn backward_workspace(&self, c: &BnCall) -> Result<u64, i32> {
        let mut size = 0usize;
        // SAFETY: as in `forward_training_workspace`.
        let code = unsafe {
            (self.bwd_workspace)(
                r(c.handle),
                c.mode,
                c.ops,
                r(c.x_desc),
                r(c.y_desc),
                r(c.dy_desc),
                r(c.dz_desc),
                r(c.dx_desc),
                r(c.bn_desc),
                std::ptr::null_mut(),
                &mut size,
            )
        };
        if code == 0 { Ok(size as u64) } else { Err(code) }
    }

    /// The reserve space a training step and its backward pass share.
    pub fn training_reserve(&self, c: &BnCall) -> Result<u64, i32> {
        let mut size = 0usize;
        // SAFETY: as in `forward_training_workspace`.
        let code =
            unsafe { (self.reserve_size)(r(c.handle), c.mode, c.ops, std::ptr::null_mut(), r(c.x_desc), &mut size) };
        if code == 0 { Ok(size as u64) } else { Err(code) }
    }

    pub fn forward_training(&self, c: &BnCall) -> i32 {
        let [alpha, beta] = &c.data_scaling;
        // SAFETY: live objects of the session on its context; every device range the
        // descriptors make the call touch was checked against the session's memory; the
        // scaling factors live on this frame for the call.
        unsafe {
            (self.fwd_training)(
                r(c.handle),
                c.mode,
                std::ptr::from_ref(alpha).cast(),
                std::ptr::from_ref(beta).cast(),
                r(c.x_desc),
                p(c.x),
                r(c.y_desc),
                r(c.y),
                r(c.bn_desc),
                p(c.scale),
                p(c.bias),
                c.factor,
                r(c.running_mean),
                r(c.running_var),
                c.epsilon,
                r(c.saved_mean),
                r(c.saved_inv_var),
            )
        }
    }

    pub fn forward_training_ex(&self, c: &BnCall) -> i32 {
        let [alpha, beta] = &c.data_scaling;
        // SAFETY: as in `forward_training`; the workspace and reserve were checked for the
        // sizes given, which are at least what cuDNN asked for.
        unsafe {
            (self.fwd_training_ex)(
                r(c.handle),
                c.mode,
                c.ops,
                std::ptr::from_ref(alpha).cast(),
                std::ptr::from_ref(beta).cast(),
                r(c.x_desc),
                p(c.x),
                r(c.z_desc),
                p(c.z),
                r(c.y_desc),
                r(c.y),
                r(c.bn_desc),
                p(c.scale),
                p(c.bias),
                c.factor,
                r(c.running_mean),
                r(c.running_var),
                c.epsilon,
                r(c.saved_mean),
                r(c.saved_inv_var),
                std::ptr::null_mut(),
                r(c.workspace),
                c.workspace_size as usize,
                r(c.reserve),
                c.reserve_size as usize,
            )
        }
    }

    pub fn forward_inference(&self, c: &BnCall) -> i32 {
        let [alpha, beta] = &c.data_scaling;
        // SAFETY: as in `forward_training`.
        unsafe {
            (self.fwd_inference)(
                r(c.handle),
                c.mode,
                std::ptr::from_ref(alpha).cast(),
                std::ptr::from_ref(beta).cast(),
                r(c.x_desc),
                p(c.x),
                r(c.y_desc),
                r(c.y),
                r(c.bn_desc),
                p(c.scale),
                p(c.bias),
                p(c.running_mean),
                p(c.running_var),
                c.epsilon,
            )
        }
    }

    pub fn backward(&self, c: &BnCall) -> i32 {
        let [alpha_d, beta_d] = &c.data_scaling;
        let [alpha_p, beta_p] = &c.param_scaling;
        // SAFETY: as in `forward_training`.
        unsafe {
            (self.bwd)(
                r(c.handle),
                c.mode,
                std::ptr::from_ref(alpha_d).cast(),
                std::ptr::from_ref(beta_d).cast(),
                std::ptr::from_ref(alpha_p).cast(),
                std::ptr::from_ref(beta_p).cast(),
                r(c.x_desc),
                p(c.x),
                r(c.dy_desc),
                p(c.dy),
                r(c.dx_desc),
                r(c.dx),
                r(c.bn_desc),
                p(c.scale),
                r(c.dscale),
                r(c.dbias),
                c.epsilon,
                p(c.saved_mean),
                p(c.saved_inv_var),
            )
        }
    }

    pub fn backward_ex(&self, c: &BnCall) -> i32 {
        let [alpha_d, beta_d] = &c.data_scaling;
        let [alpha_p, beta_p] = &c.param_scaling;
        // SAFETY: as in `forward_training_ex`.
        unsafe {
            (self.bwd_ex)(
                r(c.handle),
                c.mode,
                c.ops,
                std::ptr::from_ref(alpha_d).cast(),
                std::ptr::from_ref(beta_d).cast(),
                std::ptr::from_ref(alpha_p).cast(),
                std::ptr::from_ref(beta_p).cast(),
                r(c.x_desc),
                p(c.x),
                r(c.y_desc),
                p(c.y),
                r(c.dy_desc),
                p(c.dy),
                r(c.dz_desc),
                r(c.dz),
                r(c.dx_desc),
                r(c.dx),
                r(c.bn_desc),
                p(c.scale),
                p(c.bias),
                r(c.dscale),
                r(c.dbias),
                c.epsilon,
                p(c.saved_mean),
                p(c.saved_inv_var),
                std::ptr::null_mut(),
                r(c.workspace),
                c.workspace_size as usize,
                r(c.reserve),
                c.reserve_size as usize,
            )
        }
    }
}

/// The legacy API's entry points beyond tensors and batch normalization, looked up by name when
/// the library opens; a libcudnn without one answers CUDNN_STATUS_NOT_SUPPORTED for the calls
/// that need it. Each is called through [`legacy_call!`] with its prototype from cudnn_ops.h or
/// cudnn_cnn.h.
const LEGACY_SYMBOLS: &[&str] = &[
    "cudnnCreateFilterDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnSetFilterNdDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnSetConvolutionNdDescriptor",
    "cudnnSetConvolutionMathType",
    "cudnnSetConvolutionGroupCount",
    "cudnnSetConvolutionReorderType",
    "cudnnCreateActivationDescriptor",
    "cudnnDestroyActivationDescriptor",
    "cudnnSetActivationDescriptor",
    "cudnnSetActivationDescriptorSwishBeta",
    "cudnnGetConvolutionForwardWorkspaceSize",
    "cudnnGetConvolutionBackwardDataWorkspaceSize",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnFindConvolutionForwardAlgorithm",
    "cudnnFindConvolutionBackwardDataAlgorithm",
    "cudnnFindConvolutionBackwardFilterAlgorithm",
    "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnFindConvolutionBackwardFilterAlgorithmEx",
    "cudnnConvolutionForward",
    "cudnnConvolutionBackwardData",
    "cudnnConvolutionBackwardFilter",
    "cudnnConvolutionBackwardBias",
    "cudnnConvolutionBiasActivationForward",
    "cudnnActivationForward",
    "cudnnActivationBackward",
    "cudnnGetConvolutionForwardAlgorithmMaxCount",
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
    "cudnnCreatePoolingDescriptor",
    "cudnnDestroyPoolingDescriptor",
    "cudnnSetPoolingNdDescriptor",
    "cudnnCreateLRNDescriptor",
    "cudnnDestroyLRNDescriptor",
    "cudnnSetLRNDescriptor",
    "cudnnCreateOpTensorDescriptor",
    "cudnnDestroyOpTensorDescriptor",
    "cudnnSetOpTensorDescriptor",
    "cudnnAddTensor",
    "cudnnSetTensor",
    "cudnnScaleTensor",
    "cudnnTransformTensor",
    "cudnnOpTensor",
    "cudnnPoolingForward",
    "cudnnPoolingBackward",
    "cudnnSoftmaxForward",
    "cudnnSoftmaxBackward",
    "cudnnLRNCrossChannelForward",
    "cudnnLRNCrossChannelBackward",
    "cudnnCreateReduceTensorDescriptor",
    "cudnnDestroyReduceTensorDescriptor",
    "cudnnSetReduceTensorDescriptor",
    "cudnnGetReductionIndicesSize",
    "cudnnGetReductionWorkspaceSize",
    "cudnnReduceTensor",
];

/// The create and destroy entry points of each legacy descriptor kind.
fn legacy_lifecycle(kind: LegacyKind) -> (&'static str, &'static str) {
    match kind {
        LegacyKind::Filter => ("cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor"),
        LegacyKind::Convolution => ("cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor"),
        LegacyKind::Activation => ("cudnnCreateActivationDescriptor", "cudnnDestroyActivationDescriptor"),
        LegacyKind::Pooling => ("cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor"),
        LegacyKind::Lrn => ("cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor"),
        LegacyKind::OpTensor => ("cudnnCreateOpTensorDescriptor", "cudnnDestroyOpTensorDescriptor"),
        LegacyKind::ReduceTensor => ("cudnnCreateReduceTensorDescriptor", "cudnnDestroyReduceTensorDescriptor"),
    }
}

/// cuDNN's CUDNN_STATUS_NOT_SUPPORTED, for an entry point the loaded libcudnn lacks.
const NOT_SUPPORTED: i32 = 3000;

/// Call the legacy entry point `$name` with the prototype `fn($t, ...)` (returning the status).
macro_rules! legacy_call {
    ($self:expr, $name:expr, fn($($t:ty),* $(,)?), $($a:expr),* $(,)?) => {{
        match $self.legacy.get($name) {
            Some(&address) => {
                // SAFETY: `address` is libcudnn's export `$name`, whose prototype in cuDNN's
                // headers is the one written at this call.
                let f: unsafe extern "C" fn($($t),*) -> i32 = unsafe { std::mem::transmute::<usize, _>(address) };
                // SAFETY: the caller passes live objects of the session and device ranges it
                // checked against the session's memory; host pointers live for the call.
                unsafe { f($($a),*) }
            }
            None => NOT_SUPPORTED,
        }
    }};
}

/// Which convolution: forward (x, w -> y), backward data (w, dy -> dx: `x` is dx, `y` is dy)
/// or backward filter (x, dy -> dw: `w` is dw, `y` is dy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvDirection {
    Forward,
    BackwardData,
    BackwardFilter,
}

impl ConvDirection {
    /// How many algorithms cuDNN 9 has (CUDNN_CONVOLUTION_*_ALGO_COUNT): the algorithms a
    /// call may name.
    pub fn algorithm_count(self) -> i32 {
        match self {
            ConvDirection::Forward => 8,
            ConvDirection::BackwardData => 6,
            ConvDirection::BackwardFilter => 7,
        }
    }

    /// What libcudnn 9's `cudnnGetConvolution*AlgorithmMaxCount` answers (more than the
    /// enumerations' counts: it counts algorithms the enumerations do not name).
    pub fn library_max_count(self) -> i32 {
        match self {
            ConvDirection::Forward => 10,
            ConvDirection::BackwardData => 8,
            ConvDirection::BackwardFilter => 9,
        }
    }

    /// The `...AlgorithmMaxCount` entry point of the direction.
    fn max_count_symbol(self) -> &'static str {
        match self {
            ConvDirection::Forward => "cudnnGetConvolutionForwardAlgorithmMaxCount",
            ConvDirection::BackwardData => "cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
            ConvDirection::BackwardFilter => "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
        }
    }

    /// A call's (x, w, y) in the order the direction's queries take them: forward x, w, y;
    /// backward data w, dy, dx; backward filter x, dy, dw.
    fn operands<T>(self, x: T, w: T, y: T) -> (T, T, T) {
        match self {
            ConvDirection::Forward => (x, w, y),
            ConvDirection::BackwardData => (w, y, x),
            ConvDirection::BackwardFilter => (x, y, w),
        }
    }
}

/// One convolution in cuDNN's terms: cuDNN's handle and descriptors, device addresses the
/// session checked, the scaling factors as host floats. For a fused forward, `z`, `bias` and
/// `activation` too (and `scaling` is alpha1, alpha2).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConvCall {
    pub handle: u64,
    pub x_desc: u64,
    pub x: u64,
    pub w_desc: u64,
    pub w: u64,
    pub conv_desc: u64,
    pub y_desc: u64,
    pub y: u64,
    pub algo: i32,
    pub workspace: u64,
    pub workspace_size: u64,
    pub scaling: [f32; 2],
    pub z_desc: u64,
    pub z: u64,
    pub bias_desc: u64,
    pub bias: u64,
    pub activation: u64,
}

fn done(code: i32) -> Result<(), i32> {
    if code == 0 { Ok(()) } else { Err(code) }
}

impl Cudnn {
    fn legacy_symbols(library: &libloading::Library) -> HashMap<&'static str, usize> {
        let mut found = HashMap::new();
        for &name in LEGACY_SYMBOLS {
            let symbol = format!("{name}\0");
            // SAFETY: only the address is taken; it is called with its prototype by
            // `legacy_call!`.
            if let Ok(s) = unsafe { library.get::<*const c_void>(symbol.as_bytes()) } {
                found.insert(name, *s as usize);
            }
        }
        found
    }

    /// A new legacy descriptor of `kind`.
    pub fn create_legacy(&self, kind: LegacyKind) -> Result<u64, i32> {
        let mut d: Raw = std::ptr::null_mut();
        let out = &mut d as *mut Raw;
        done(legacy_call!(self, legacy_lifecycle(kind).0, fn(*mut Raw), out)).map(|()| d as u64)
    }

    pub fn destroy_legacy(&self, kind: LegacyKind, raw: u64) -> i32 {
        legacy_call!(self, legacy_lifecycle(kind).1, fn(Raw), r(raw))
    }

    /// Give cuDNN's descriptor what the session keeps of it (checked by the session).
    pub fn apply_legacy(&self, raw: u64, state: &LegacyState) -> Result<(), i32> {
        match state {
            LegacyState::Filter(None)
            | LegacyState::Activation(None)
            | LegacyState::Pooling(None)
            | LegacyState::OpTensor(None)
            | LegacyState::ReduceTensor(None) => Ok(()),
            LegacyState::ReduceTensor(Some(t)) => done(legacy_call!(
                self,
                "cudnnSetReduceTensorDescriptor",
                fn(Raw, i32, i32, i32, i32, i32),
                r(raw),
                t.op,
                t.compute_type,
                t.nan_propagation,
                t.indices,
                t.indices_type
            )),
            LegacyState::Pooling(Some(pool)) => done(legacy_call!(
                self,
                "cudnnSetPoolingNdDescriptor",
                fn(Raw, i32, i32, i32, *const i32, *const i32, *const i32),
                r(raw),
                pool.mode,
                pool.nan_propagation,
                pool.window.len() as i32,
                pool.window.as_ptr(),
                pool.pads.as_ptr(),
                pool.strides.as_ptr()
            )),
            LegacyState::Lrn(l) => done(legacy_call!(
                self,
                "cudnnSetLRNDescriptor",
                fn(Raw, u32, f64, f64, f64),
                r(raw),
                l.n,
                l.alpha,
                l.beta,
                l.k
            )),
            LegacyState::OpTensor(Some(o)) => done(legacy_call!(
                self,
                "cudnnSetOpTensorDescriptor",
                fn(Raw, i32, i32, i32),
                r(raw),
                o.op,
                o.compute_type,
                o.nan_propagation
            )),
            LegacyState::Filter(Some(f)) => done(legacy_call!(
                self,
                "cudnnSetFilterNdDescriptor",
                fn(Raw, i32, i32, i32, *const i32),
                r(raw),
                f.data_type,
                f.format,
                f.dims.len() as i32,
                f.dims.as_ptr()
            )),
            LegacyState::Convolution(c) => {
                if !c.pads.is_empty() {
                    done(legacy_call!(
                        self,
                        "cudnnSetConvolutionNdDescriptor",
                        fn(Raw, i32, *const i32, *const i32, *const i32, i32, i32),
                        r(raw),
                        c.pads.len() as i32,
                        c.pads.as_ptr(),
                        c.strides.as_ptr(),
                        c.dilations.as_ptr(),
                        c.mode,
                        c.compute_type
                    ))?;
                }
                done(legacy_call!(self, "cudnnSetConvolutionMathType", fn(Raw, i32), r(raw), c.math_type))?;
                done(legacy_call!(self, "cudnnSetConvolutionGroupCount", fn(Raw, i32), r(raw), c.groups))?;
                done(legacy_call!(self, "cudnnSetConvolutionReorderType", fn(Raw, i32), r(raw), c.reorder))
            }
            LegacyState::Activation(Some(a)) => {
                done(legacy_call!(
                    self,
                    "cudnnSetActivationDescriptor",
                    fn(Raw, i32, i32, f64),
                    r(raw),
                    a.mode,
                    a.nan_propagation,
                    a.coef
                ))?;
                done(legacy_call!(self, "cudnnSetActivationDescriptorSwishBeta", fn(Raw, f64), r(raw), a.swish_beta))
            }
        }
    }

    /// The workspace a convolution's algorithm needs with these descriptors.
    pub fn conv_workspace(&self, dir: ConvDirection, c: &ConvCall) -> Result<u64, i32> {
        let mut size = 0usize;
        let out = &mut size as *mut usize;
        let (h, x, w, conv, y) = (r(c.handle), r(c.x_desc), r(c.w_desc), r(c.conv_desc), r(c.y_desc));
        let name = match dir {
            ConvDirection::Forward => "cudnnGetConvolutionForwardWorkspaceSize",
            ConvDirection::BackwardData => "cudnnGetConvolutionBackwardDataWorkspaceSize",
            ConvDirection::BackwardFilter => "cudnnGetConvolutionBackwardFilterWorkspaceSize",
        };
        let (a, b, d) = dir.operands(x, w, y);
        let code =
            legacy_call!(self, name, fn(Raw, Raw, Raw, Raw, Raw, i32, *mut usize), h, a, b, conv, d, c.algo, out);
        done(code).map(|()| size as u64)
    }

    /// cuDNN's heuristics (`measure` false: the _v7 queries) or its measured search (Find,
    /// with cuDNN's own buffers): up to `results.len() / 48` results; answers how many.
    pub fn conv_algorithms(
        &self,
        dir: ConvDirection,
        measure: bool,
        c: &ConvCall,
        results: &mut [u8],
    ) -> Result<i32, i32> {
        let requested = (results.len() / PERF_BYTES) as i32;
        let mut returned = 0i32;
        let (count, perf) = (&mut returned as *mut i32, results.as_mut_ptr().cast::<c_void>());
        let (h, x, w, conv, y) = (r(c.handle), r(c.x_desc), r(c.w_desc), r(c.conv_desc), r(c.y_desc));
        let name = match (dir, measure) {
            (ConvDirection::Forward, false) => "cudnnGetConvolutionForwardAlgorithm_v7",
            (ConvDirection::Forward, true) => "cudnnFindConvolutionForwardAlgorithm",
            (ConvDirection::BackwardData, false) => "cudnnGetConvolutionBackwardDataAlgorithm_v7",
            (ConvDirection::BackwardData, true) => "cudnnFindConvolutionBackwardDataAlgorithm",
            (ConvDirection::BackwardFilter, false) => "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
            (ConvDirection::BackwardFilter, true) => "cudnnFindConvolutionBackwardFilterAlgorithm",
        };
        // The six share one prototype: handle, the three operands in the direction's order,
        // the convolution between the second and third.
        let (a, b, d) = dir.operands(x, w, y);
        let code = legacy_call!(
            self,
            name,
            fn(Raw, Raw, Raw, Raw, Raw, i32, *mut i32, M),
            h,
            a,
            b,
            conv,
            d,
            requested,
            count,
            perf
        );
        done(code).map(|()| returned)
    }

    /// cuDNN's measured search on the program's buffers and workspace (checked by the session).
    pub fn conv_find_ex(&self, dir: ConvDirection, c: &ConvCall, results: &mut [u8]) -> Result<i32, i32> {
        let requested = (results.len() / PERF_BYTES) as i32;
        let mut returned = 0i32;
        let (count, perf) = (&mut returned as *mut i32, results.as_mut_ptr().cast::<c_void>());
        let (h, conv, ws, wss) = (r(c.handle), r(c.conv_desc), r(c.workspace), c.workspace_size as usize);
        let name = match dir {
            ConvDirection::Forward => "cudnnFindConvolutionForwardAlgorithmEx",
            ConvDirection::BackwardData => "cudnnFindConvolutionBackwardDataAlgorithmEx",
            ConvDirection::BackwardFilter => "cudnnFindConvolutionBackwardFilterAlgorithmEx",
        };
        let (a, b, d) = dir.operands((c.x_desc, c.x), (c.w_desc, c.w), (c.y_desc, c.y));
        let code = legacy_call!(
            self,
            name,
            fn(Raw, Raw, P, Raw, P, Raw, Raw, M, i32, *mut i32, M, M, usize),
            h,
            r(a.0),
            p(a.1),
            r(b.0),
            p(b.1),
            conv,
            r(d.0),
            r(d.1),
            requested,
            count,
            perf,
            ws,
            wss
        );
        done(code).map(|()| returned)
    }

    /// Run a convolution whose every range the session checked.
    pub fn convolution(&self, dir: ConvDirection, c: &ConvCall) -> i32 {
        let [alpha, beta] = &c.scaling;
        let (alpha, beta): (P, P) = (std::ptr::from_ref(alpha).cast(), std::ptr::from_ref(beta).cast());
        let (h, conv, ws, wss) = (r(c.handle), r(c.conv_desc), r(c.workspace), c.workspace_size as usize);
        let name = match dir {
            ConvDirection::Forward => "cudnnConvolutionForward",
            ConvDirection::BackwardData => "cudnnConvolutionBackwardData",
            ConvDirection::BackwardFilter => "cudnnConvolutionBackwardFilter",
        };
        let (a, b, d) = dir.operands((c.x_desc, c.x), (c.w_desc, c.w), (c.y_desc, c.y));
        legacy_call!(
            self,
            name,
            fn(Raw, P, Raw, P, Raw, P, Raw, i32, M, usize, P, Raw, M),
            h,
            alpha,
            r(a.0),
            p(a.1),
            r(b.0),
            p(b.1),
            conv,
            c.algo,
            ws,
            wss,
            beta,
            r(d.0),
            r(d.1)
        )
    }

    /// y = act(alpha1 * conv(x, w) + alpha2 * z + bias).
    pub fn conv_bias_activation(&self, c: &ConvCall) -> i32 {
        let [alpha1, alpha2] = &c.scaling;
        legacy_call!(
            self,
            "cudnnConvolutionBiasActivationForward",
            fn(Raw, P, Raw, P, Raw, P, Raw, i32, M, usize, P, Raw, P, Raw, P, Raw, Raw, M),
            r(c.handle),
            std::ptr::from_ref(alpha1).cast::<c_void>(),
            r(c.x_desc),
            p(c.x),
            r(c.w_desc),
            p(c.w),
            r(c.conv_desc),
            c.algo,
            r(c.workspace),
            c.workspace_size as usize,
            std::ptr::from_ref(alpha2).cast::<c_void>(),
            r(c.z_desc),
            p(c.z),
            r(c.bias_desc),
            p(c.bias),
            r(c.activation),
            r(c.y_desc),
            r(c.y)
        )
    }

    /// db = alpha * sum(dy over all but the channels) + beta * db (`x` is dy, `y` is db).
    pub fn conv_backward_bias(&self, c: &ConvCall) -> i32 {
        let [alpha, beta] = &c.scaling;
        legacy_call!(
            self,
            "cudnnConvolutionBackwardBias",
            fn(Raw, P, Raw, P, P, Raw, M),
            r(c.handle),
            std::ptr::from_ref(alpha).cast::<c_void>(),
            r(c.x_desc),
            p(c.x),
            std::ptr::from_ref(beta).cast::<c_void>(),
            r(c.y_desc),
            r(c.y)
        )
    }

    /// An activation forward (`dy`, `dx` 0) or backward, in cuDNN's terms.
    pub fn activation(&self, a: &ActivationCall) -> i32 {
        let [alpha, beta] = &a.scaling;
        let (alpha, beta): (P, P) = (std::ptr::from_ref(alpha).cast(), std::ptr::from_ref(beta).cast());
        if a.backward {
            legacy_call!(
                self,
                "cudnnActivationBackward",
                fn(Raw, Raw, P, Raw, P, Raw, P, Raw, P, P, Raw, M),
                r(a.handle),
                r(a.activation),
                alpha,
                r(a.y_desc),
                p(a.y),
                r(a.dy_desc),
                p(a.dy),
                r(a.x_desc),
                p(a.x),
                beta,
                r(a.dx_desc),
                r(a.dx)
            )
        } else {
            legacy_call!(
                self,
                "cudnnActivationForward",
                fn(Raw, Raw, P, Raw, P, P, Raw, M),
                r(a.handle),
                r(a.activation),
                alpha,
                r(a.x_desc),
                p(a.x),
                beta,
                r(a.y_desc),
                r(a.y)
            )
        }
    }
}

/// Bytes of one cudnnConvolution*AlgoPerf_t.
pub const PERF_BYTES: usize = 48;

/// An activation call in cuDNN's terms.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActivationCall {
    pub backward: bool,
    pub handle: u64,
    pub activation: u64,
    pub scaling: [f32; 2],
    pub x_desc: u64,
    pub x: u64,
    pub y_desc: u64,
    pub y: u64,
    pub dy_desc: u64,
    pub dy: u64,
    pub dx_desc: u64,
    pub dx: u64,
}

/// The tensor computations without a convolution, each in cuDNN's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorOp {
    /// cudnnAddTensor: t[0] is A, t[1] C.
    Add,
    /// cudnnSetTensor: t[0] is y; `value` the element.
    Set,
    /// cudnnScaleTensor: t[0] is y; `scaling[0]` alpha.
    Scale,
    /// cudnnTransformTensor: t[0] is x, t[1] y.
    Transform,
    /// cudnnOpTensor: `desc` the op-tensor descriptor; t[0] A, t[1] B, t[2] C; `scaling`
    /// alpha1, alpha2, beta.
    Op,
    /// cudnnPoolingForward: `desc` the pooling descriptor; t[0] x, t[1] y.
    PoolingForward,
    /// cudnnPoolingBackward: t[0] y, t[1] dy, t[2] x, t[3] dx.
    PoolingBackward,
    /// cudnnSoftmaxForward: `algo`, `mode`; t[0] x, t[1] y.
    SoftmaxForward,
    /// cudnnSoftmaxBackward: t[0] y, t[1] dy, t[2] dx.
    SoftmaxBackward,
    /// cudnnLRNCrossChannelForward: `desc` the LRN descriptor, `mode`; t[0] x, t[1] y.
    LrnForward,
    /// cudnnLRNCrossChannelBackward: t[0] y, t[1] dy, t[2] x, t[3] dx.
    LrnBackward,
}

/// One tensor computation: cuDNN's handle and descriptor (pooling, LRN or op-tensor, else 0),
/// the algorithm and mode where the call takes them, the host scaling factors (alpha, beta;
/// alpha1, alpha2, beta for cudnnOpTensor), cudnnSetTensor's element, and the tensors as
/// (cuDNN's descriptor, checked device address) in [`TensorOp`]'s order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorOpCall {
    pub op: TensorOp,
    pub handle: u64,
    pub desc: u64,
    pub algo: i32,
    pub mode: i32,
    pub scaling: [f32; 3],
    /// cudnnSetTensor's element (its first bytes, as many as the tensor's type has).
    pub value: [u8; 8],
    pub t: [(u64, u64); 4],
}

impl Cudnn {
    /// libcudnn's `cudnnGetConvolution*AlgorithmMaxCount`.
    pub fn algorithm_max_count(&self, dir: ConvDirection, handle: u64) -> Result<i32, i32> {
        let mut count = 0i32;
        let out = &mut count as *mut i32;
        done(legacy_call!(self, dir.max_count_symbol(), fn(Raw, *mut i32), r(handle), out)).map(|()| count)
    }

    /// Run a tensor computation whose every range the session checked.
    pub fn tensor_op(&self, c: &TensorOpCall) -> i32 {
        let f = |i: usize| -> P { std::ptr::from_ref(&c.scaling[i]).cast() };
        let (h, d, t) = (r(c.handle), r(c.desc), &c.t);
        let value: P = c.value.as_ptr().cast();
        match c.op {
            TensorOp::Add => legacy_call!(
                self,
                "cudnnAddTensor",
                fn(Raw, P, Raw, P, P, Raw, M),
                h,
                f(0),
                r(t[0].0),
                p(t[0].1),
                f(1),
                r(t[1].0),
                r(t[1].1)
            ),
            TensorOp::Set => legacy_call!(self, "cudnnSetTensor", fn(Raw, Raw, M, P), h, r(t[0].0), r(t[0].1), value),
            TensorOp::Scale => {
                legacy_call!(self, "cudnnScaleTensor", fn(Raw, Raw, M, P), h, r(t[0].0), r(t[0].1), f(0))
            }
            TensorOp::Transform => legacy_call!(
                self,
                "cudnnTransformTensor",
                fn(Raw, P, Raw, P, P, Raw, M),
                h,
                f(0),
                r(t[0].0),
                p(t[0].1),
                f(1),
                r(t[1].0),
                r(t[1].1)
            ),
            TensorOp::Op => legacy_call!(
                self,
                "cudnnOpTensor",
                fn(Raw, Raw, P, Raw, P, P, Raw, P, P, Raw, M),
                h,
                d,
                f(0),
                r(t[0].0),
                p(t[0].1),
                f(1),
                r(t[1].0),
                p(t[1].1),
                f(2),
                r(t[2].0),
                r(t[2].1)
            ),
            TensorOp::PoolingForward => legacy_call!(
                self,
                "cudnnPoolingForward",
                fn(Raw, Raw, P, Raw, P, P, Raw, M),
                h,
                d,
                f(0),
                r(t[0].0),
                p(t[0].1),
                f(1),
                r(t[1].0),
                r(t[1].1)
            ),
            TensorOp::PoolingBackward => legacy_call!(
                self,
                "cudnnPoolingBackward",
                fn(Raw, Raw, P, Raw, P, Raw, P, Raw, P, P, Raw, M),
                h,
                d,
                f(0),
                r(t[0].0),
                p(t[0].1),
                r(t[1].0),
                p(t[1].1),
                r(t[2].0),
                p(t[2].1),
                f(1),
                r(t[3].0),
                r(t[3].1)
            ),
            TensorOp::SoftmaxForward => legacy_call!(
                self,
                "cudnnSoftmaxForward",
                fn(Raw, i32, i32, P, Raw, P, P, Raw, M),
                h,
                c.algo,
                c.mode,
                f(0),
                r(t[0].0),
                p(t[0].1),
                f(1),
                r(t[1].0),
                r(t[1].1)
            ),
            TensorOp::SoftmaxBackward => legacy_call!(
                self,
                "cudnnSoftmaxBackward",
                fn(Raw, i32, i32, P, Raw, P, Raw, P, P, Raw, M),
                h,
                c.algo,
                c.mode,
                f(0),
                r(t[0].0),
                p(t[0].1),
                r(t[1].0),
                p(t[1].1),
                f(1),
                r(t[2].0),
                r(t[2].1)
            ),
            TensorOp::LrnForward => legacy_call!(
                self,
                "cudnnLRNCrossChannelForward",
                fn(Raw, Raw, i32, P, Raw, P, P, Raw, M),
                h,
                d,
                c.mode,
                f(0),
                r(t[0].0),
                p(t[0].1),
                f(1),
                r(t[1].0),
                r(t[1].1)
            ),
            TensorOp::LrnBackward => legacy_call!(
                self,
                "cudnnLRNCrossChannelBackward",
                fn(Raw, Raw, i32, P, Raw, P, Raw, P, Raw, P, P, Raw, M),
                h,
                d,
                c.mode,
                f(0),
                r(t[0].0),
                p(t[0].1),
                r(t[1].0),
                p(t[1].1),
                r(t[2].0),
                p(t[2].1),
                f(1),
                r(t[3].0),
                r(t[3].1)
            ),
        }
    }
}

/// One reduction in cuDNN's terms: cuDNN's handle and reduce-tensor descriptor, the checked
/// device ranges and their sizes, the host scaling factors, A and C as (cuDNN's descriptor,
/// checked address).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReduceRaw {
    pub handle: u64,
    pub desc: u64,
    pub indices: u64,
    pub indices_size: u64,
    pub workspace: u64,
    pub workspace_size: u64,
    pub scaling: [f32; 2],
    pub a: (u64, u64),
    pub c: (u64, u64),
}

impl Cudnn {
    /// cudnnGetReductionIndicesSize (`indices`) or cudnnGetReductionWorkspaceSize for the
    /// (reduce-tensor, A, C) descriptors.
    pub fn reduction_size(&self, indices: bool, handle: u64, (desc, a, c): (u64, u64, u64)) -> Result<u64, i32> {
        let mut size = 0usize;
        let out = &mut size as *mut usize;
        let name = if indices { "cudnnGetReductionIndicesSize" } else { "cudnnGetReductionWorkspaceSize" };
        done(legacy_call!(self, name, fn(Raw, Raw, Raw, Raw, *mut usize), r(handle), r(desc), r(a), r(c), out))
            .map(|()| size as u64)
    }

    /// Run a reduction whose every range the session checked.
    pub fn reduce(&self, c: &ReduceRaw) -> i32 {
        let [alpha, beta] = &c.scaling;
        legacy_call!(
            self,
            "cudnnReduceTensor",
            fn(Raw, Raw, M, usize, M, usize, P, Raw, P, P, Raw, M),
            r(c.handle),
            r(c.desc),
            r(c.indices),
            c.indices_size as usize,
            r(c.workspace),
            c.workspace_size as usize,
            std::ptr::from_ref(alpha).cast::<c_void>(),
            r(c.a.0),
            p(c.a.1),
            std::ptr::from_ref(beta).cast::<c_void>(),
            r(c.c.0),
            r(c.c.1)
        )
    }
}
