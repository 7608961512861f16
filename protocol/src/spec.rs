//! The types of the tables the generator emits (per-function facts, errors, resources,
//! object rules, resource charges).

/// How a function is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// Marshalled to the API server.
    Remote,
    /// Implemented by hand in the guest library.
    Guest,
    /// Answers the not-supported error.
    Unsupported,
}

/// What the C/R engine records about a call (`obj_record`, `allocate`, `deallocate`,
/// `obj_depends_on`): argument names paired with object kinds.
#[derive(Debug, Clone, Copy)]
pub struct ObjectRules {
    pub creates: &'static [(&'static str, &'static str)],
    pub destroys: &'static [(&'static str, &'static str)],
    pub mutates: &'static [(&'static str, &'static str)],
    pub depends_on: &'static [(&'static str, &'static str)],
    pub global_record: bool,
}

/// Facts about one function of the spec.
#[derive(Debug, Clone, Copy)]
pub struct FunctionInfo {
    pub id: u32,
    pub name: &'static str,
    pub exec: Exec,
    /// Only called by the guest library itself, not exported.
    pub internal: bool,
    pub is_async: bool,
    /// A second wire id under which the guest sends this synchronous function without
    /// waiting (`@async_id`): the server runs it as an async call and keeps a failure for the
    /// next synchronous call on the handle it names first.
    pub async_id: Option<u32>,
    /// The call delivers pending device `printf` output (synchronising calls deliver what
    /// the work before them printed; an async call delivers only what earlier work printed).
    pub device_output: bool,
    pub aliases: &'static [&'static str],
    pub spec_line: u32,
    pub objects: ObjectRules,
}

/// One entry of the error table.
#[derive(Debug, Clone, Copy)]
pub struct ErrorInfo {
    pub code: i64,
    pub name: &'static str,
    pub text: &'static str,
    /// Text under other CUDA major versions, where it differs.
    pub abi_texts: &'static [(i64, &'static str)],
}

/// A resource the router accounts for.
#[derive(Debug, Clone, Copy)]
pub struct ResourceInfo {
    pub name: &'static str,
    pub kind: ResourceKind,
    /// The error code a call gets when the tenant's quota of this resource is exhausted
    /// (the spec's `exhausted(...)`); resources without one have no quota.
    pub exhausted: Option<i32>,
}

/// How a resource is used (the spec's `continuous_rc`, `instantaneous_rc`, `measured_rc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    /// Held until given back (device memory); the server reports how much is held.
    Continuous,
    /// Used once per call, in an amount the request says (launches, bytes copied).
    Instantaneous,
    /// Used once per call, in an amount the server measures afterwards (device time).
    Measured,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcOp {
    Allocates,
    Deallocates,
    Consumes,
}

/// One resource use of one call, as the generated cost table computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// Index into `cudart::RESOURCES`.
    pub resource: usize,
    pub op: RcOp,
    /// `None` when only the server knows the amount (what a free gives back).
    pub amount: Option<u64>,
}

/// What one successful call did to the session's objects, as the spec's `obj_record`,
/// `allocate`, `deallocate` and `obj_depends_on` descriptors say; the server's checkpoint
/// recorder keeps the calls that created live objects.
#[derive(Debug, Clone, Copy)]
pub struct RecordFacts<'a> {
    /// (object kind, handle or device address) the call created.
    pub created: &'a [(&'static str, u64)],
    /// (object kind, handle or device address) the call destroyed.
    pub destroyed: &'a [(&'static str, u64)],
    /// (object kind, handle) whose state the call changed (a library handle's setting): the
    /// call is recorded on it, replacing its last call of the same function.
    pub mutated: &'a [(&'static str, u64)],
    /// Objects the created ones depend on.
    pub depends_on: &'a [u64],
    /// The call changed session-wide state (`obj_record` on the function).
    pub global: bool,
}

/// One range of device memory a call will touch, as the spec's `device_pointer(extent)`
/// says. A pointer to `const` is only read; any other may be read and written (the
/// conservative answer where the prototype does not say which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAccess {
    pub addr: u64,
    pub len: u64,
    pub writes: bool,
}

impl DeviceAccess {
    /// A placeholder for arrays the generated dispatch fills.
    pub const NONE: DeviceAccess = DeviceAccess { addr: 0, len: 0, writes: false };
}

/// What a call will do to an object it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectEffect {
    /// Uses it (a stream it runs on, a function it launches).
    Uses,
    /// Changes its state (`obj_record` on the argument).
    Changes,
    /// Destroys it (`deallocate`).
    Destroys,
}

/// An object a call names: (object kind, handle or device address), and what it does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectAccess {
    pub kind: &'static str,
    pub value: u64,
    pub effect: ObjectEffect,
}

/// What one call will read and write, known before it runs: the generated dispatch hands it to
/// the C/R engine's pre-call hook once the call's checks have passed. Calls whose accesses the
/// spec cannot describe (a kernel launch reaches memory through its parameters) are
/// described further by the service that runs them.
#[derive(Debug, Clone, Copy)]
pub struct CallAccess<'a> {
    /// The function's name.
    pub function: &'static str,
    pub device: &'a [DeviceAccess],
    pub objects: &'a [ObjectAccess],
}
