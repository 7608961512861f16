//! The checked model of a spec: what the emitters work from. Everything here has been
//! resolved (types, names, conditions), so emitters never have to report errors.

use std::collections::BTreeMap;

use crate::ast::{CType, Expr, Param, ResourceKind};

#[derive(Debug, Clone)]
pub struct Api {
    pub name: String,
    /// The API's id in frame headers (`@id` of the `api` declaration).
    pub id: u16,
    /// The wire version (`@version`): raised when a change deliberately breaks deployed guests
    /// and images.
    pub version: u32,
    /// Hash of the wire facts ([`crate::wire_facts`]): what the functions' ids, names and
    /// layouts, the handle kinds, errors, constants and resources are. Comments, coverage notes
    /// and anything else that does not travel leave it unchanged.
    pub spec_hash: u64,
    /// Hashes of earlier revisions of this version that a build of this spec still serves
    /// (from the lock file; see `docs/compatibility.md`).
    pub accepted_hashes: Vec<u64>,
    /// FNV-1a hashes of spec texts that guests from before explicit ids sent in their `Hello`
    /// (from the lock file).
    pub legacy_text_hashes: Vec<u64>,
    pub resources: Vec<Resource>,
    pub types: BTreeMap<String, NamedType>,
    pub enums: Vec<EnumDef>,
    pub constants: BTreeMap<String, i64>,
    pub errors: ErrorTable,
    pub utilities: Vec<Utility>,
    /// Handle kinds, by id.
    pub handle_kinds: Vec<HandleKindDecl>,
    /// Function ids that were carried once and are never given again.
    pub retired: Vec<Retired>,
    /// Every function, in spec order.
    pub functions: Vec<Function>,
    /// Paragraphs for the coverage document (`coverage_note`).
    pub coverage_notes: Vec<String>,
}

impl Api {
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Functions whose calls travel to the server.
    pub fn remote_functions(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(|f| f.exec == Exec::Remote)
    }

    /// `cudart` -> `Cudart`: how generated code names the API (the `Function` variant, the
    /// `CudartService` trait).
    pub fn type_name(&self) -> String {
        camel(&self.name)
    }

    /// Every hash whose guests and images this build serves: its own and the accepted ones.
    pub fn served_hashes(&self) -> Vec<u64> {
        let mut all = vec![self.spec_hash];
        all.extend(self.accepted_hashes.iter().copied().filter(|h| *h != self.spec_hash));
        all
    }
}

/// `@id(7) handle_kind stream;`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleKindDecl {
    pub name: String,
    pub id: u16,
}

/// `@id(42) retired cudaThreadExit;`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    pub id: u32,
    pub name: String,
}

#[derive(Debug, Clone)]
pub struct Resource {
    pub name: String,
    pub kind: ResourceKind,
    /// The error a call gets when the tenant's quota of this resource is exhausted.
    pub exhausted: Option<String>,
}

#[derive(Debug, Clone)]
pub struct NamedType {
    pub name: String,
    pub kind: TypeKind,
    /// A handle the C API passes as an `int` (`int_handle`): the guest's value is the handle's
    /// number within its kind, the wire's the whole handle.
    pub int_handle: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TypeKind {
    /// Enum or integer typedef with this representation.
    Scalar(Scalar),
    /// An API object behind a virtual handle.
    Handle(String),
    /// A plain C struct with the same layout everywhere; the wire type has this name.
    Pod { wire: String, size: u64 },
    /// A struct whose layout depends on the CUDA ABI; carried as this ABI-neutral wire type.
    AbiStruct(String),
    /// A C struct handled only by hand-written guest code (`struct;`).
    Struct,
}

#[derive(Debug, Clone)]
pub struct EnumDef {
    pub name: String,
    pub repr: Scalar,
    pub variants: Vec<(String, i64)>,
}

#[derive(Debug, Clone)]
pub struct ErrorTable {
    /// The C type errors are returned in (`cudaError_t`).
    pub ty: String,
    /// The Rust type generated for it (`return_code(CudaError)`).
    pub rust_type: String,
    pub success: String,
    pub not_supported: String,
    /// The errors of the failures Phos itself causes.
    pub failures: Failures,
    pub entries: Vec<ErrorEntry>,
}

/// What a call returns when Phos, not the API, fails it (names of errors of the table).
#[derive(Debug, Clone)]
pub struct Failures {
    /// An argument Phos cannot carry (a size that overflows, a malformed request).
    pub invalid_value: String,
    /// A bug or a reply Phos does not understand.
    pub internal_error: String,
    /// No router to reach, or it refused the session.
    pub no_device: String,
    /// The session is gone (its server ended and did not come back).
    pub session_lost: String,
}

#[derive(Debug, Clone)]
pub struct ErrorEntry {
    pub name: String,
    pub code: i64,
    pub text: String,
    pub abi_texts: Vec<(i64, String)>,
}

#[derive(Debug, Clone)]
pub struct Utility {
    /// `guest` or `both`: where an implementation exists.
    pub side: UtilitySide,
    pub name: String,
    pub ret: CType,
    pub params: Vec<Param>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UtilitySide {
    Guest,
}

/// Plain numbers as they travel on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

impl Scalar {
    pub fn rust(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::I8 => "i8",
            Scalar::U8 => "u8",
            Scalar::I16 => "i16",
            Scalar::U16 => "u16",
            Scalar::I32 => "i32",
            Scalar::U32 => "u32",
            Scalar::I64 => "i64",
            Scalar::U64 => "u64",
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
        }
    }

    pub fn size(self) -> u64 {
        match self {
            Scalar::Bool | Scalar::I8 | Scalar::U8 => 1,
            Scalar::I16 | Scalar::U16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 => 4,
            Scalar::I64 | Scalar::U64 | Scalar::F64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Scalar::F32 | Scalar::F64)
    }

    pub fn from_name(name: &str) -> Option<Scalar> {
        Some(match name {
            "bool" => Scalar::Bool,
            "i8" => Scalar::I8,
            "u8" => Scalar::U8,
            "i16" => Scalar::I16,
            "u16" => Scalar::U16,
            "i32" => Scalar::I32,
            "u32" => Scalar::U32,
            "i64" => Scalar::I64,
            "u64" => Scalar::U64,
            "f32" => Scalar::F32,
            "f64" => Scalar::F64,
            _ => return None,
        })
    }
}

/// How a function is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// Marshalled to the API server.
    Remote,
    /// Written by hand in the guest library (guest-local state, registration, launches).
    Guest,
    /// Exported, answers `not_supported` and logs its name once.
    Unsupported,
}

#[derive(Debug, Clone)]
pub struct Function {
    /// Wire function id.
    pub id: u32,
    pub name: String,
    pub line: usize,
    pub ret: CType,
    pub params: Vec<Param>,
    pub exec: Exec,
    /// Not exported from the guest library; called by hand-written guest code.
    pub internal: bool,
    pub is_async: bool,
    /// `@async_id(N)`: a second wire id under which the guest sends the call without waiting
    /// for it (the function's own id stays synchronous, for guests built before). Only for
    /// carried functions whose reply is empty and whose first parameter is a handle: the
    /// server defers such a call's failure to the next synchronous call on that handle.
    pub async_id: Option<u32>,
    /// The call delivers pending device `printf` output to the guest (`device_output;`).
    pub device_output: bool,
    pub success: Option<Expr>,
    /// Parameters followed by contextual arguments, each with how it travels.
    pub args: Vec<Arg>,
    pub preconditions: Vec<Precondition>,
    pub resources: Vec<ResourceUse>,
    pub on_success: Option<String>,
    /// `fast_path(hook)`: a hand-written guest hook with the function's parameters, tried
    /// first; it answers the call itself or leaves it to the generated path.
    pub fast_path: Option<String>,
    /// `async_when_live(h, ...)`: handle arguments that, once a synchronous call with the same
    /// handles and values (and device) has succeeded and none of them was destroyed since, let
    /// the guest send the call without waiting (`rt::call_when_live`). Empty: no such rule.
    pub async_when_live: Vec<String>,
    pub aliases: Vec<String>,
    /// Aliases declared `per_thread_stream` (the `_ptsz` entry points of programs built with
    /// `--default-stream per-thread`): a null stream argument means `cudaStreamPerThread`.
    pub per_thread_aliases: Vec<String>,
    /// The constant a null stream argument of the per-thread aliases becomes.
    pub per_thread_stream: Option<String>,
    pub objects: ObjectRules,
}

impl Function {
    pub fn arg(&self, name: &str) -> Option<&Arg> {
        self.args.iter().find(|a| a.name == name)
    }

    /// `cudaMalloc` -> `CudaMalloc`
    pub fn type_name(&self) -> String {
        camel(&self.name)
    }

    /// `cudaMalloc` -> `cuda_malloc`
    pub fn method_name(&self) -> String {
        snake(&self.name)
    }
}

/// Leading underscores (`__cudaRegisterFunction`) become a `Priv` prefix so that names stay
/// distinct from their public twins.
pub fn camel(name: &str) -> String {
    let trimmed = name.trim_start_matches('_');
    let mut out = String::new();
    if trimmed.len() != name.len() {
        out.push_str("Priv");
    }
    let mut upper = true;
    for c in trimmed.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// `cudaMemcpy3DPeerAsync` -> `cuda_memcpy_3d_peer_async`. Words start at a capital after a
/// lower-case letter (`cudaMalloc`), at the last capital of a run that a lower-case letter
/// follows (`GLGet` -> `gl_get`), and at a number after a lower-case word of two letters or
/// more (`Memcpy3D` -> `memcpy_3d`); a number stays with the capitals it is part of (`3D`,
/// `D3D11`) and with a one-letter word (`_v2`). Leading underscores (`__cudaLaunchKernel`)
/// become a `priv_` prefix.
pub fn snake(name: &str) -> String {
    let trimmed = name.trim_start_matches('_');
    let mut out = String::new();
    if trimmed.len() != name.len() {
        out.push_str("priv_");
    }
    let chars: Vec<char> = trimmed.chars().collect();
    // Letters of the word being written, to tell `v2` from `memcpy2`.
    let mut word_len = 0usize;
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' {
            if !out.ends_with('_') && !out.is_empty() {
                out.push('_');
            }
            word_len = 0;
            continue;
        }
        let prev = i.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(i + 1).copied();
        let starts_word = match prev {
            None | Some('_') => false,
            Some(p) if c.is_ascii_uppercase() => {
                p.is_ascii_lowercase()
                    || ((p.is_ascii_uppercase() || p.is_ascii_digit()) && next.is_some_and(|n| n.is_ascii_lowercase()))
            }
            Some(p) if c.is_ascii_digit() => p.is_ascii_lowercase() && word_len > 1,
            Some(_) => false,
        };
        if starts_word && !out.ends_with('_') {
            out.push('_');
            word_len = 0;
        }
        out.push(c.to_ascii_lowercase());
        word_len += 1;
    }
    out
}

#[derive(Debug, Clone)]
pub struct Precondition {
    pub cond: Expr,
    pub error: String,
    /// True when the server can re-check it from the wire values alone.
    pub wire_checkable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcOp {
    Allocates,
    Deallocates,
    Consumes,
}

#[derive(Debug, Clone)]
pub struct ResourceUse {
    pub cond: Option<Expr>,
    pub op: RcOp,
    pub resource: String,
    /// `None`: the amount is reported (`reported`) or measured (`measured`) by the server.
    pub amount: Option<Expr>,
}

#[derive(Debug, Clone, Default)]
pub struct ObjectRules {
    /// (out argument, object kind): the call creates an object there and is recorded as its creation.
    pub creates: Vec<(String, String)>,
    /// (argument, object kind): the call destroys this object.
    pub destroys: Vec<(String, String)>,
    /// (argument, object kind): the call changes this object's state and is recorded with it.
    pub mutates: Vec<(String, String)>,
    /// (created argument, argument it depends on)
    pub depends_on: Vec<(String, String)>,
    /// The call changes session-wide state and is recorded on its own.
    pub global_record: bool,
}

#[derive(Debug, Clone)]
pub struct Arg {
    pub name: String,
    pub ty: CType,
    /// The guest computes it (`contextual_argument`); it is not a C parameter.
    pub contextual: Option<Expr>,
    pub class: ArgClass,
}

#[derive(Debug, Clone)]
pub enum ArgClass {
    /// A value copied onto the wire as is.
    Value(ValueType),
    /// Only the guest uses it (to compute contextual arguments).
    Local,
    /// A pointer; which shape it takes is decided per call by the conditions, in order.
    Pointer(Vec<Branch>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ValueType {
    Scalar(Scalar),
    Handle(String),
    Pod(String),
}

#[derive(Debug, Clone)]
pub struct Branch {
    /// `None` for the unconditional (last) branch.
    pub cond: Option<Expr>,
    pub shape: Shape,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A device address; `extent` bytes from it must lie in the session's device memory.
    Device { extent: Option<Expr>, null_ok: bool },
    /// Host data copied to the server: `count` elements of `elem_size` bytes.
    In { count: Expr, elem_size: u64, null_ok: bool },
    /// Host memory the server fills.
    Out { count: Expr, elem_size: u64, null_ok: bool },
    /// Both.
    InOut { count: Expr, elem_size: u64, null_ok: bool },
    /// One value read from the pointer (a struct passed by pointer).
    InElement(ElemType),
    /// One value written through the pointer.
    OutElement { elem: ElemType, null_ok: bool },
    /// A NUL-terminated string.
    Str,
    /// A host address the server keeps but never dereferences.
    Opaque,
}

impl Shape {
    /// Shapes that can be chosen between at call time share one wire field.
    pub fn is_buffer_like(&self) -> bool {
        matches!(self, Shape::Device { .. } | Shape::In { .. } | Shape::Out { .. } | Shape::InOut { .. })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ElemType {
    Scalar(Scalar),
    Handle(String),
    DevicePtr,
    Pod(String),
    /// An ABI-dependent struct: (C type name, wire type name).
    Abi(String, String),
}

impl ElemType {
    pub fn wire_type(&self) -> String {
        match self {
            ElemType::Scalar(s) => s.rust().to_string(),
            ElemType::Handle(_) | ElemType::DevicePtr => "u64".to_string(),
            ElemType::Pod(w) | ElemType::Abi(_, w) => format!("crate::types::{w}"),
        }
    }
}

/// Where a wire field of an argument lives and of what type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireRepr {
    /// Not on the wire.
    None,
    /// A plain field of this Rust type in the request.
    Request(String),
    /// A plain field of this Rust type in the reply.
    Reply(String),
    /// Bytes in the request and bytes back in the reply.
    Both,
    /// A shape chosen per call: `Ptr` in the request, optional bytes in the reply.
    Chosen { has_out: bool },
}

impl Arg {
    pub fn single_shape(&self) -> Option<&Shape> {
        match &self.class {
            ArgClass::Pointer(b) if b.len() == 1 => Some(&b[0].shape),
            _ => None,
        }
    }

    pub fn wire(&self) -> WireRepr {
        match &self.class {
            ArgClass::Local => WireRepr::None,
            ArgClass::Value(v) => WireRepr::Request(match v {
                ValueType::Scalar(s) => s.rust().to_string(),
                ValueType::Handle(_) => "u64".to_string(),
                ValueType::Pod(w) => format!("crate::types::{w}"),
            }),
            ArgClass::Pointer(branches) if branches.len() > 1 => WireRepr::Chosen {
                has_out: branches.iter().any(|b| matches!(b.shape, Shape::Out { .. } | Shape::InOut { .. })),
            },
            ArgClass::Pointer(branches) => match &branches[0].shape {
                Shape::Device { .. } | Shape::Opaque => WireRepr::Request("u64".into()),
                Shape::In { .. } => WireRepr::Request("&'a [u8]".into()),
                Shape::Out { .. } => WireRepr::Reply("Vec<u8>".into()),
                Shape::InOut { .. } => WireRepr::Both,
                Shape::InElement(e) => WireRepr::Request(e.wire_type()),
                Shape::OutElement { elem, .. } => WireRepr::Reply(elem.wire_type()),
                Shape::Str => WireRepr::Request("&'a str".into()),
            },
        }
    }

    /// True when the argument's value (not what it points to) is on the wire, so server-side
    /// expressions may use it.
    pub fn value_on_wire(&self) -> bool {
        match &self.class {
            ArgClass::Value(_) => true,
            ArgClass::Pointer(b) => b.len() == 1 && matches!(b[0].shape, Shape::Device { .. } | Shape::Opaque),
            ArgClass::Local => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(camel("cudaMalloc"), "CudaMalloc");
        assert_eq!(camel("__cudaRegisterFatBinary"), "PrivCudaRegisterFatBinary");
        assert_eq!(snake("__cudaLaunchKernel"), "priv_cuda_launch_kernel");
        assert_eq!(camel("cudaGetDeviceProperties_v2"), "CudaGetDevicePropertiesV2");
        assert_eq!(snake("cudaMalloc"), "cuda_malloc");
        assert_eq!(snake("cudaMemcpyHtoD"), "cuda_memcpy_hto_d");
        assert_eq!(snake("cudaGetDeviceProperties_v2"), "cuda_get_device_properties_v2");
        assert_eq!(snake("phosLaunchKernel"), "phos_launch_kernel");
        assert_eq!(snake("cudaIpcGetMemHandle"), "cuda_ipc_get_mem_handle");
        assert_eq!(snake("cudaMemcpy3D"), "cuda_memcpy_3d");
        assert_eq!(snake("phosMemcpy3D"), "phos_memcpy_3d");
        assert_eq!(snake("cudaMemcpy2DToArray"), "cuda_memcpy_2d_to_array");
        assert_eq!(snake("cudaMemcpy3DPeerAsync"), "cuda_memcpy_3d_peer_async");
        assert_eq!(snake("cudaGraphAddMemcpyNode1D"), "cuda_graph_add_memcpy_node_1d");
        assert_eq!(snake("cudaGLGetDevices"), "cuda_gl_get_devices");
        assert_eq!(snake("cuGraphicsD3D11RegisterResource"), "cu_graphics_d3d11_register_resource");
        assert_eq!(snake("cuDeviceTotalMem_v2"), "cu_device_total_mem_v2");
        assert_eq!(snake("cudaMallocAsync_ptsz"), "cuda_malloc_async_ptsz");
        assert_eq!(snake("cudaLaunchKernelExC"), "cuda_launch_kernel_ex_c");
    }
}
