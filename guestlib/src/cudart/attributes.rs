//! Stream and launch attributes (`cudaLaunchAttributeID`).
//!
//! A stream's attributes are hints that change no result (an L2 access policy window, how a
//! synchronising thread waits, memory-synchronisation domains) or its priority. The guest
//! checks and records them per stream, and `cudaStreamGetAttribute` answers what was set:
//! the priority a stream was created with comes from the server, which honours it on a GPU.
//! Launch attributes of `cudaLaunchKernelExC` are honoured where they change what a launch
//! does (a cooperative launch), accepted where they are hints, and refused with
//! `cudaErrorNotSupported`, logged once by name, where Phos cannot give their effect.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use phos_protocol::CudaError;

use crate::runtime;

pub const IGNORE: i32 = 0;
pub const ACCESS_POLICY_WINDOW: i32 = 1;
pub const COOPERATIVE: i32 = 2;
pub const SYNCHRONIZATION_POLICY: i32 = 3;
pub const CLUSTER_DIMENSION: i32 = 4;
pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: i32 = 5;
pub const PROGRAMMATIC_STREAM_SERIALIZATION: i32 = 6;
pub const PROGRAMMATIC_EVENT: i32 = 7;
pub const PRIORITY: i32 = 8;
pub const MEM_SYNC_DOMAIN_MAP: i32 = 9;
pub const MEM_SYNC_DOMAIN: i32 = 10;
pub const PREFERRED_CLUSTER_DIMENSION: i32 = 11;
pub const LAUNCH_COMPLETION_EVENT: i32 = 12;
pub const DEVICE_UPDATABLE_KERNEL_NODE: i32 = 13;
pub const PREFERRED_SHARED_MEMORY_CARVEOUT: i32 = 14;
pub const NVLINK_UTIL_CENTRIC_SCHEDULING: i32 = 16;

/// The attributes a stream takes (CUDA's headers: "valid for streams").
const STREAM_ATTRIBUTES: [i32; 6] = [
    ACCESS_POLICY_WINDOW,
    SYNCHRONIZATION_POLICY,
    PRIORITY,
    MEM_SYNC_DOMAIN_MAP,
    MEM_SYNC_DOMAIN,
    NVLINK_UTIL_CENTRIC_SCHEDULING,
];

/// The name CUDA's headers give attribute `id`, for logs.
pub fn name(id: i32) -> String {
    let known = match id {
        IGNORE => "cudaLaunchAttributeIgnore",
        ACCESS_POLICY_WINDOW => "cudaLaunchAttributeAccessPolicyWindow",
        COOPERATIVE => "cudaLaunchAttributeCooperative",
        SYNCHRONIZATION_POLICY => "cudaLaunchAttributeSynchronizationPolicy",
        CLUSTER_DIMENSION => "cudaLaunchAttributeClusterDimension",
        CLUSTER_SCHEDULING_POLICY_PREFERENCE => "cudaLaunchAttributeClusterSchedulingPolicyPreference",
        PROGRAMMATIC_STREAM_SERIALIZATION => "cudaLaunchAttributeProgrammaticStreamSerialization",
        PROGRAMMATIC_EVENT => "cudaLaunchAttributeProgrammaticEvent",
        PRIORITY => "cudaLaunchAttributePriority",
        MEM_SYNC_DOMAIN_MAP => "cudaLaunchAttributeMemSyncDomainMap",
        MEM_SYNC_DOMAIN => "cudaLaunchAttributeMemSyncDomain",
        PREFERRED_CLUSTER_DIMENSION => "cudaLaunchAttributePreferredClusterDimension",
        LAUNCH_COMPLETION_EVENT => "cudaLaunchAttributeLaunchCompletionEvent",
        DEVICE_UPDATABLE_KERNEL_NODE => "cudaLaunchAttributeDeviceUpdatableKernelNode",
        PREFERRED_SHARED_MEMORY_CARVEOUT => "cudaLaunchAttributePreferredSharedMemoryCarveout",
        NVLINK_UTIL_CENTRIC_SCHEDULING => "cudaLaunchAttributeNvlinkUtilCentricScheduling",
        _ => return format!("launch attribute {id}"),
    };
    known.to_string()
}

/// `cudaLaunchAttributeValue`: a 64-byte union.
pub type Value = [u8; 64];

fn word(v: &Value, k: usize) -> u32 {
    u32::from_ne_bytes([v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]])
}

/// Check a hint's value as CUDA checks it: `cudaErrorInvalidValue` for one out of range.
fn check_hint(id: i32, v: &Value) -> Result<(), CudaError> {
    let ok = match id {
        // { base_ptr, num_bytes, hitRatio (float), hitProp, missProp }
        ACCESS_POLICY_WINDOW => {
            let hit_ratio = f32::from_bits(word(v, 4));
            (0.0..=1.0).contains(&hit_ratio) && word(v, 5) <= 2 && word(v, 6) <= 2
        }
        // cudaSyncPolicyAuto .. cudaSyncPolicyBlockingSync
        SYNCHRONIZATION_POLICY => (1..=4).contains(&word(v, 0)),
        MEM_SYNC_DOMAIN => word(v, 0) <= 1,
        PRIORITY | MEM_SYNC_DOMAIN_MAP => true,
        NVLINK_UTIL_CENTRIC_SCHEDULING => word(v, 0) <= 1,
        _ => false,
    };
    if ok { Ok(()) } else { Err(CudaError::InvalidValue) }
}

/// Attributes set on each stream, by (session, stream handle).
type StreamAttributes = HashMap<(u64, u64), BTreeMap<i32, Value>>;

static STREAMS: Mutex<Option<StreamAttributes>> = Mutex::new(None);

fn streams() -> MutexGuard<'static, Option<StreamAttributes>> {
    // A poisoned lock: each update is one insertion, so the map stays consistent.
    STREAMS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The stream's priority from the server; this also checks that the handle is a stream.
fn priority_of(stream: *mut c_void) -> Result<i32, CudaError> {
    let mut priority = 0;
    // SAFETY: `priority` is a writable int; the stream travels as a handle.
    let code = unsafe { super::stubs::cudaStreamGetPriority(stream, &mut priority) };
    if code == phos_protocol::cudart::SUCCESS { Ok(priority) } else { Err(CudaError(code)) }
}

fn key(stream: *mut c_void) -> Result<(u64, u64), CudaError> {
    Ok((runtime::session()?.id, stream as u64))
}

/// `cudaStreamSetAttribute`.
///
/// # Safety
/// `value` must be null or a readable `cudaLaunchAttributeValue`.
pub unsafe fn stream_set(stream: *mut c_void, id: i32, value: *const c_void) -> Result<(), CudaError> {
    if value.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaLaunchAttributeValue` of 64 bytes (this
    // function's contract), read without assuming alignment.
    let v = unsafe { (value as *const Value).read_unaligned() };
    priority_of(stream)?;
    if !STREAM_ATTRIBUTES.contains(&id) {
        return Err(CudaError::InvalidValue);
    }
    check_hint(id, &v)?;
    let key = key(stream)?;
    streams().get_or_insert_with(HashMap::new).entry(key).or_default().insert(id, v);
    Ok(())
}

/// `cudaStreamGetAttribute`: what was set, else the stream's own value (its priority,
/// the default policy).
///
/// # Safety
/// `out` must be null or a writable `cudaLaunchAttributeValue`.
pub unsafe fn stream_get(stream: *mut c_void, id: i32, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let priority = priority_of(stream)?;
    if !STREAM_ATTRIBUTES.contains(&id) {
        return Err(CudaError::InvalidValue);
    }
    let key = key(stream)?;
    let set = streams().as_ref().and_then(|m| m.get(&key).and_then(|a| a.get(&id).copied()));
    let v = set.unwrap_or_else(|| {
        let mut v = [0u8; 64];
        match id {
            PRIORITY => v[..4].copy_from_slice(&priority.to_ne_bytes()),
            // cudaSyncPolicyAuto
            SYNCHRONIZATION_POLICY => v[..4].copy_from_slice(&1u32.to_ne_bytes()),
            // the default map: default domain 0, remote domain 1
            MEM_SYNC_DOMAIN_MAP => v[1] = 1,
            _ => {}
        }
        v
    });
    // SAFETY: not null (checked above): 64 writable bytes (this function's contract).
    unsafe { (out as *mut Value).write_unaligned(v) };
    Ok(())
}

/// `cudaStreamCopyAttributes`: `dst` takes `src`'s attributes.
pub fn stream_copy(dst: *mut c_void, src: *mut c_void) -> Result<(), CudaError> {
    priority_of(dst)?;
    priority_of(src)?;
    let (dst, src) = (key(dst)?, key(src)?);
    let mut g = streams();
    let map = g.get_or_insert_with(HashMap::new);
    let attrs = map.get(&src).cloned().unwrap_or_default();
    map.insert(dst, attrs);
    Ok(())
}

/// One launch attribute of `cudaLaunchKernelExC`: whether it asks for a cooperative launch;
/// `cudaErrorNotSupported` (logged once with its name) for one whose effect Phos cannot give.
pub fn launch_attribute(id: i32, v: &Value) -> Result<bool, CudaError> {
    match id {
        COOPERATIVE => Ok(word(v, 0) != 0),
        // Hints; a kernel must be correct with its regular cluster shape whatever the
        // preferred one.
        IGNORE
        | CLUSTER_SCHEDULING_POLICY_PREFERENCE
        | PREFERRED_SHARED_MEMORY_CARVEOUT
        | PREFERRED_CLUSTER_DIMENSION => Ok(false),
        // Without it the launch waits for the work before it: what the kernel may not rely on
        // anyway, so serialising is always correct.
        PROGRAMMATIC_STREAM_SERIALIZATION => Ok(false),
        id if STREAM_ATTRIBUTES.contains(&id) => check_hint(id, v).map(|_| false),
        // Only the trivial cluster (0 is "unset").
        CLUSTER_DIMENSION if matches!((word(v, 0), word(v, 1), word(v, 2)), (1, 1, 1) | (0, 0, 0)) => Ok(false),
        _ => {
            crate::log::not_supported_once(
                &format!("cudaLaunchKernelExC with {}", describe(id, v)),
                "cudaErrorNotSupported",
            );
            Err(CudaError::NotSupported)
        }
    }
}

fn describe(id: i32, v: &Value) -> String {
    if id == CLUSTER_DIMENSION {
        format!("{} {}x{}x{}", name(id), word(v, 0), word(v, 1), word(v, 2))
    } else {
        name(id)
    }
}

// ---- Kernel node attributes (`cudaGraphKernelNodeSetAttribute` and the driver's)

/// The attributes a graph's kernel node keeps here: hints that change no result. The
/// cooperative attribute is the server's (it changes the launch), and the rest of those CUDA
/// takes for kernel nodes are `cudaErrorNotSupported`, logged once by name.
const NODE_HINTS: [i32; 8] = [
    ACCESS_POLICY_WINDOW,
    PRIORITY,
    MEM_SYNC_DOMAIN_MAP,
    MEM_SYNC_DOMAIN,
    CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    PREFERRED_SHARED_MEMORY_CARVEOUT,
    PREFERRED_CLUSTER_DIMENSION,
    NVLINK_UTIL_CENTRIC_SCHEDULING,
];

/// Attributes set on each kernel node, by (session, node handle).
type NodeAttributes = HashMap<(u64, u64), BTreeMap<i32, Value>>;

static NODES: Mutex<Option<NodeAttributes>> = Mutex::new(None);

fn nodes() -> MutexGuard<'static, Option<NodeAttributes>> {
    // A poisoned lock: each update is one insertion or removal, so the map stays consistent.
    NODES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The node's cooperative attribute, set to `set` (0 or 1) or only asked (-1); this also
/// checks that the handle is a kernel node (`cudaErrorInvalidValue` when not).
fn cooperative(node: u64, set: i32) -> Result<bool, CudaError> {
    let request = phos_protocol::cudart::PhosGraphKernelNodeCooperativeRequest { node, set };
    Ok(runtime::call(&request)?.cooperative != 0)
}

/// Whether a kernel node takes attribute `id` here: `cudaErrorNotSupported` (logged once) for
/// one whose effect Phos cannot give, `cudaErrorInvalidValue` for one CUDA does not know.
fn node_attribute(caller: &str, id: i32, v: Option<&Value>) -> Result<(), CudaError> {
    let hint = NODE_HINTS.contains(&id)
        // Only the trivial cluster (0 is "unset").
        || (id == CLUSTER_DIMENSION
            && v.is_none_or(|v| matches!((word(v, 0), word(v, 1), word(v, 2)), (1, 1, 1) | (0, 0, 0))));
    if hint || id == COOPERATIVE || id == IGNORE {
        return Ok(());
    }
    if !(0..=NVLINK_UTIL_CENTRIC_SCHEDULING).contains(&id) {
        return Err(CudaError::InvalidValue);
    }
    let what = match v {
        Some(v) => describe(id, v),
        None => name(id),
    };
    crate::log::not_supported_once(&format!("{caller} with {what}"), "cudaErrorNotSupported");
    Err(CudaError::NotSupported)
}

/// `cudaGraphKernelNodeSetAttribute`.
///
/// # Safety
/// `value` must be null or a readable `cudaLaunchAttributeValue`.
pub unsafe fn node_set(node: u64, id: i32, value: *const c_void) -> Result<(), CudaError> {
    if value.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaLaunchAttributeValue` of 64 bytes (this
    // function's contract), read without assuming alignment.
    let v = unsafe { (value as *const Value).read_unaligned() };
    cooperative(node, -1)?;
    node_attribute("cudaGraphKernelNodeSetAttribute", id, Some(&v))?;
    match id {
        IGNORE => Ok(()),
        COOPERATIVE => cooperative(node, i32::from(word(&v, 0) != 0)).map(|_| ()),
        _ => {
            if id != CLUSTER_DIMENSION {
                check_node_hint(id, &v)?;
            }
            let key = (runtime::session()?.id, node);
            nodes().get_or_insert_with(HashMap::new).entry(key).or_default().insert(id, v);
            Ok(())
        }
    }
}

/// A kernel node's hint checked as CUDA checks it.
fn check_node_hint(id: i32, v: &Value) -> Result<(), CudaError> {
    match id {
        ACCESS_POLICY_WINDOW | PRIORITY | MEM_SYNC_DOMAIN_MAP | MEM_SYNC_DOMAIN | NVLINK_UTIL_CENTRIC_SCHEDULING => {
            check_hint(id, v)
        }
        // cudaClusterSchedulingPolicyDefault .. LoadBalancing
        CLUSTER_SCHEDULING_POLICY_PREFERENCE if word(v, 0) > 2 => Err(CudaError::InvalidValue),
        _ => Ok(()),
    }
}

/// `cudaGraphKernelNodeGetAttribute`: what was set, else the node's own value (its
/// cooperative launch, priority 0, the default domain map).
///
/// # Safety
/// `out` must be null or a writable `cudaLaunchAttributeValue`.
pub unsafe fn node_get(node: u64, id: i32, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let coop = cooperative(node, -1)?;
    node_attribute("cudaGraphKernelNodeGetAttribute", id, None)?;
    let key = (runtime::session()?.id, node);
    let set = nodes().as_ref().and_then(|m| m.get(&key).and_then(|a| a.get(&id).copied()));
    let v = set.unwrap_or_else(|| {
        let mut v = [0u8; 64];
        match id {
            COOPERATIVE => v[..4].copy_from_slice(&u32::from(coop).to_ne_bytes()),
            // the default map: default domain 0, remote domain 1
            MEM_SYNC_DOMAIN_MAP => v[1] = 1,
            _ => {}
        }
        v
    });
    // SAFETY: not null (checked above): 64 writable bytes (this function's contract).
    unsafe { (out as *mut Value).write_unaligned(v) };
    Ok(())
}

/// `cudaGraphKernelNodeCopyAttributes`: `dst` takes `src`'s attributes (both kernel nodes).
pub fn node_copy(dst: u64, src: u64) -> Result<(), CudaError> {
    let coop = cooperative(src, -1)?;
    cooperative(dst, -1)?;
    cooperative(dst, i32::from(coop))?;
    let session = runtime::session()?.id;
    let mut g = nodes();
    let map = g.get_or_insert_with(HashMap::new);
    match map.get(&(session, src)).cloned() {
        Some(attrs) => map.insert((session, dst), attrs),
        None => map.remove(&(session, dst)),
    };
    Ok(())
}

/// A graph was cloned: each node of `clone` takes the attributes of the node of `original` at
/// its place (a clone keeps its original's nodes in order).
pub fn clone_nodes(original: &[u64], clone: &[u64]) {
    let Some(session) = runtime::session_if_open().map(|s| s.id) else { return };
    let mut g = nodes();
    let Some(map) = g.as_mut().filter(|m| !m.is_empty()) else { return };
    for (a, b) in original.iter().zip(clone) {
        if let Some(attrs) = map.get(&(session, *a)).cloned() {
            map.insert((session, *b), attrs);
        }
    }
}

/// Whether any kernel node has attributes kept here (a clone then copies them).
pub fn nodes_have_attributes() -> bool {
    nodes().as_ref().is_some_and(|m| !m.is_empty())
}

/// A node was destroyed: its attributes go.
pub fn forget_node(node: u64) {
    let Some(session) = runtime::session_if_open().map(|s| s.id) else { return };
    if let Some(m) = nodes().as_mut() {
        m.remove(&(session, node));
    }
}
