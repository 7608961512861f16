//! NVIDIA's libcudnn (cuDNN 9), which a GPU backend runs cuDNN's calls with, loaded at run time
//! from where [`find_library`] looks (Python's `nvidia/cudnn/lib` among them). Every cuDNN call
//! Phos carries names objects the session translates (handles, descriptors, the elements of
//! attributes), so none is a generated vendor call: the entry points are here, each with its
//! prototype from cudnn_graph.h, and the service makes the calls with translated arguments.
//! libcudnn loads its sub-libraries (`libcudnn_graph.so.9`, the engines) itself, from its own
//! directory.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use super::vendor::{VendorOpenError, find_library};

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
        // SAFETY: live objects of the session, on its context; the pack's device pointers
        // lie in the session's memory (checked by the caller).
        unsafe { (self.execute)(handle as Raw, plan as Raw, variant_pack as Raw) }
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
