//! Syntax tree of a spec file, as written. Every node keeps the byte span it came from so
//! that the checker can point at the line that is wrong.

/// A byte range in the spec source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Self {
        Span { start, end }
    }
}

/// A name with the place it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpecFile {
    pub items: Vec<Item>,
}

/// `@id(17)`, `@version(2)`: a number attached to the declaration that follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub name: Ident,
    pub value: i128,
    pub span: Span,
}

/// One top-level declaration.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `@id(0) @version(1) api cudart;`
    Api { name: Ident, attrs: Vec<Attr> },
    /// `@id(42) retired cudaThreadExit;`: a function id that was carried once and may never
    /// be given to another function.
    Retired { name: Ident, attrs: Vec<Attr> },
    /// `@id(7) handle_kind stream;`: a kind of API object, with the tag its handles carry.
    HandleKind { name: Ident, attrs: Vec<Attr> },
    /// `coverage_note "...";` a paragraph for the coverage document.
    CoverageNote(String),
    /// `continuous_rc device_memory;` / `instantaneous_rc kernel_launches;` /
    /// `measured_rc device_time;`
    /// A continuous one may say which error a call gets when a quota of it is exhausted:
    /// `continuous_rc device_memory exhausted(cudaErrorMemoryAllocation);`
    Resource { kind: ResourceKind, name: Ident, exhausted: Option<Ident> },
    /// `type(cudaStream_t) { handle(stream); }`
    Type { name: Ident, descs: Vec<TypeDesc> },
    /// `enum cudaMemcpyKind : i32 { cudaMemcpyHostToHost = 0, ... };`
    Enum { name: Ident, repr: Option<Ident>, variants: Vec<(Ident, i64)> },
    /// `errors cudaError_t { cudaSuccess = 0 "no error"; ... }`
    Errors { ty: Ident, entries: Vec<ErrorEntry> },
    /// `utility(guest) size_t device_symbol_size(const void *symbol);`
    Utility { side: Ident, decl: Prototype },
    /// `alias cudaGetDeviceProperties_v2 = cudaGetDeviceProperties;`
    /// `alias A = F;` or `alias A = F per_thread_stream(cudaStreamPerThread);`, where a null
    /// stream argument stands for that constant.
    Alias { name: Ident, target: Ident, per_thread_stream: Option<Ident> },
    /// A C prototype with its descriptor block.
    Function(FunctionDecl),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    /// Held for a while and given back (device memory).
    Continuous,
    /// Used once per call (launches, bytes moved).
    Instantaneous,
    /// Used once per call, in an amount only the server learns afterwards (device time).
    Measured,
}

/// A descriptor inside `type(T) { ... }`.
#[derive(Debug, Clone, PartialEq)]
pub enum TypeDesc {
    /// `handle(stream);` values of this type are API objects of kind `stream`.
    Handle(Ident),
    /// `int_handle(cufft_plan);` API objects of that kind that the C API passes as an `int`
    /// (cuFFT's `cufftHandle`): the guest carries the handle's number in the int.
    IntHandle(Ident),
    /// `enum(i32);` values are plain integers of this width.
    Scalar(Ident),
    /// `pod(Dim3, 12);` a plain C struct copied by value, with its wire type and size.
    Pod { wire: Ident, size: i64 },
    /// `abi_struct(DeviceProperties);` a struct whose layout depends on the CUDA ABI; the wire
    /// carries an ABI-neutral type and the guest converts by hand.
    AbiStruct(Ident),
    /// `struct;` a C struct only hand-written guest code reads or writes; exports take it by
    /// pointer as `void *`.
    Struct,
    /// `return_code(CudaError);` the type every function returns its status in, and the
    /// name of the Rust type generated for it.
    ReturnCode(Option<Ident>),
    /// `invalid_value(E);`, `internal_error(E);`, `no_device(E);`, `session_lost(E);` on the
    /// return code type: the error a call gets when Phos itself fails it for that reason.
    Failure { reason: Ident, error: Ident },
    /// `success(cudaSuccess);` the success value of a return-code type.
    Success(Ident),
    /// `not_supported(cudaErrorNotSupported);` what unsupported functions return.
    NotSupported(Ident),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ErrorEntry {
    pub name: Ident,
    pub code: i64,
    pub text: String,
    /// `abi(11) "older text"`: the text the given CUDA major version returns instead.
    pub abi_texts: Vec<(i64, String)>,
}

/// A C type as written: `const void **`.
#[derive(Debug, Clone, PartialEq)]
pub struct CType {
    pub is_const: bool,
    pub base: BaseType,
    /// One entry per `*`, true where that pointer level is itself `const`.
    pub pointers: Vec<bool>,
    pub span: Span,
}

impl CType {
    pub fn is_pointer(&self) -> bool {
        !self.pointers.is_empty()
    }

    /// The type one `*` down.
    pub fn pointee(&self) -> CType {
        let mut t = self.clone();
        t.pointers.pop();
        t
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaseType {
    Void,
    Bool,
    Char,
    SignedChar,
    UnsignedChar,
    Short,
    UnsignedShort,
    Int,
    UnsignedInt,
    Long,
    UnsignedLong,
    LongLong,
    UnsignedLongLong,
    SizeT,
    Float,
    Double,
    /// A typedef, `struct X` or `enum X`; the keyword is not kept.
    Named(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub ty: CType,
    pub name: Ident,
}

/// `ret name(params)`
#[derive(Debug, Clone, PartialEq)]
pub struct Prototype {
    pub ret: CType,
    pub name: Ident,
    pub params: Vec<Param>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FunctionDecl {
    /// `@id(N)` before the prototype: the function's wire id.
    pub attrs: Vec<Attr>,
    pub proto: Prototype,
    pub body: Vec<FnDesc>,
    pub span: Span,
}

/// A descriptor in a function's block.
#[derive(Debug, Clone, PartialEq)]
pub enum FnDesc {
    /// A bare keyword: `sync;`, `async;`, `internal;`, `unsupported;`, `obj_record;`.
    Flag(Ident),
    /// `success(cudaSuccess);`
    Success(Expr),
    /// `allocates_rc(device_memory, size);`
    Resource { op: Ident, resource: Ident, amount: Amount },
    /// `contextual_argument size_t n = f(x);`
    Contextual { ty: CType, name: Ident, value: Expr },
    /// `precondition(count > 0, cudaErrorInvalidValue);`
    Precondition { cond: Expr, error: Ident },
    /// `implemented_by(guest);`
    ImplementedBy(Ident),
    /// `on_success(hook);` a guest-side hook run after the call succeeded.
    OnSuccess(Ident),
    /// `fast_path(hook);` a guest-side hook tried before the call is marshalled.
    FastPath(Ident),
    /// `async_when_live(event, stream);` an `async` call the guest sends without waiting once
    /// a synchronous one with the same handles and values succeeded and none of these handles
    /// was destroyed since.
    AsyncWhenLive(Vec<Ident>, Span),
    /// `argument(x) { ... }`
    Argument { name: Ident, descs: Vec<ValDesc> },
    /// `if (c) { ... } else { ... }`
    If { cond: Expr, then: Vec<FnDesc>, els: Vec<FnDesc> },
}

/// The amount in a resource descriptor.
#[derive(Debug, Clone, PartialEq)]
pub enum Amount {
    Expr(Expr),
    /// `reported`: only the server knows (how much a free gives back).
    Reported(Span),
    /// `measured`: the server measures it after the call (a kernel's device time).
    Measured(Span),
}

/// A descriptor inside `argument(x) { ... }` or `element { ... }`.
#[derive(Debug, Clone, PartialEq)]
pub enum ValDesc {
    /// `in;`, `out;`, `inout;`, `string;`, `null_ok;`, `opaque;`, `local;`, `no_copy;`,
    /// `obj_record;`, `allocate;`, `deallocate;`
    Flag(Ident),
    /// `buffer(n);` n elements of the pointee type.
    Buffer(Expr, Span),
    /// `device_pointer;` or `device_pointer(extent_in_bytes);`
    DevicePointer(Option<Expr>, Span),
    /// `element { ... }` descriptors of the pointed-to value.
    Element(Vec<ValDesc>, Span),
    /// `obj_depends_on(other_argument);`
    DependsOn(Ident),
    /// `if (c) { ... } else { ... }`
    If { cond: Expr, then: Vec<ValDesc>, els: Vec<ValDesc>, span: Span },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Mul,
    Div,
    Rem,
    Add,
    Sub,
    Shl,
    Shr,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    BitAnd,
    BitXor,
    BitOr,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Shl => "<<",
            BinOp::Shr => ">>",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::BitAnd => "&",
            BinOp::BitXor => "^",
            BinOp::BitOr => "|",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
    BitNot,
}

/// A C-like expression over arguments, constants and utility functions.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Int(i128, Span),
    Name(Ident),
    Unary(UnOp, Box<Expr>, Span),
    Binary(BinOp, Box<Expr>, Box<Expr>, Span),
    Call(Ident, Vec<Expr>, Span),
    SizeOf(CType, Span),
}

impl Expr {
    pub fn span(&self) -> Span {
        match self {
            Expr::Int(_, s) => *s,
            Expr::Name(i) => i.span,
            Expr::Unary(_, _, s) | Expr::Binary(_, _, _, s) | Expr::Call(_, _, s) => *s,
            Expr::SizeOf(_, s) => *s,
        }
    }
}
