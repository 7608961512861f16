//! Contexts, which live in the guest. A session has one address space per device: memory,
//! streams, events and modules belong to the device, whatever context made them. So a
//! context here is a name for a device plus the driver's bookkeeping around it:
//!
//! - each device has its **primary context**, retained and released by count
//!   (`cuDevicePrimaryCtx*`); the runtime API uses it, as NVIDIA's runtime does, so it is
//!   active once the process has used the runtime or retained it;
//! - `cuCtxCreate` makes a further context on a device, current on the calling thread until
//!   popped, which shares the device's objects with the primary context (on NVIDIA's driver
//!   it would have its own address space; programs that rely on that are not served);
//! - each thread has a stack of current contexts. A thread that has not set one but has used
//!   the runtime API has its device's primary context current, as after the runtime's own
//!   initialisation. Making a context current makes its device the thread's runtime device.
//!
//! Context handles are small tagged values, never addresses (nothing dereferences them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

use phos_protocol::cuda::CuError;

use super::bridge;
use crate::runtime;

/// The tag of every context handle (`0xC7C7...`), so a stray pointer is not taken for one.
const TAG: u64 = 0xC7C7_0000_0000_0000;
const TAG_MASK: u64 = 0xFFFF_0000_0000_0000;
/// Primary contexts are `TAG | device + 1`; created ones count on from here.
const FIRST_CREATED: u64 = 0x1_0000;

/// The driver API version `cuCtxGetApiVersion` reports (CUDA 3.2's context API and later).
const API_VERSION: u32 = 3020;

#[derive(Debug, Clone, Copy)]
struct Context {
    device: i32,
    flags: u32,
}

#[derive(Default)]
struct Contexts {
    /// Retain counts and flags of the primary contexts, by device.
    primary: HashMap<i32, Primary>,
    /// Contexts made by `cuCtxCreate`, by handle.
    created: HashMap<u64, Context>,
    next: u64,
}

#[derive(Default, Clone, Copy)]
struct Primary {
    retained: u32,
    flags: u32,
}

static CONTEXTS: Mutex<Option<Contexts>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Contexts) -> T) -> T {
    let mut g = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Contexts::default))
}

thread_local! {
    /// The thread's stack of current contexts (`None`: never set, see the module's doc).
    static STACK: RefCell<Option<Vec<u64>>> = const { RefCell::new(None) };
}

pub fn primary_handle(device: i32) -> u64 {
    TAG | (device as u32 as u64 + 1)
}

/// The device and flags of a live context, or `CUDA_ERROR_INVALID_CONTEXT`.
fn lookup(ctx: u64) -> Result<Context, CuError> {
    if ctx & TAG_MASK != TAG || ctx == TAG {
        return Err(CuError::INVALID_CONTEXT);
    }
    if let Some(device) = primary_device(ctx) {
        let flags = with(|c| c.primary.get(&device).map_or(0, |p| p.flags));
        return Ok(Context { device, flags });
    }
    with(|c| c.created.get(&ctx).copied()).ok_or(CuError::CONTEXT_IS_DESTROYED)
}

/// The thread's current context, if any.
pub fn current() -> Option<u64> {
    let explicit = STACK.try_with(|s| s.borrow().as_ref().map(|v| v.last().copied())).ok().flatten();
    match explicit {
        Some(top) => top,
        None if runtime::runtime_used_on_this_thread() => Some(primary_handle(runtime::current_device())),
        None => None,
    }
}

/// The device of the thread's current context: `CUDA_ERROR_INVALID_CONTEXT` without one.
/// A primary context's device is in its handle (no lock on the launch path).
pub fn current_device() -> Result<i32, CuError> {
    let ctx = current().ok_or(CuError::INVALID_CONTEXT)?;
    match primary_device(ctx) {
        Some(device) => Ok(device),
        None => lookup(ctx).map(|c| c.device),
    }
}

/// The device of a primary context's handle.
fn primary_device(ctx: u64) -> Option<i32> {
    let id = ctx & !TAG_MASK;
    (ctx & TAG_MASK == TAG && (1..FIRST_CREATED).contains(&id)).then(|| (id - 1) as i32)
}

/// Calls that work on the current context need one, as on NVIDIA's driver.
pub fn require_current() -> Result<(), CuError> {
    current_device().map(|_| ())
}

fn make_current(stack: impl FnOnce(&mut Vec<u64>), device: Option<i32>) {
    let _ = STACK.try_with(|s| {
        let mut s = s.borrow_mut();
        let v = s.get_or_insert_with(|| current_implicit().into_iter().collect());
        stack(v);
    });
    if let Some(d) = device {
        runtime::set_current_device(d);
    }
}

/// The context current before the thread set one (its runtime device's primary context).
fn current_implicit() -> Option<u64> {
    runtime::runtime_used_on_this_thread().then(|| primary_handle(runtime::current_device()))
}

pub fn set_current(ctx: u64) -> Result<(), CuError> {
    if ctx == 0 {
        make_current(|v| v.clear(), None);
        return Ok(());
    }
    let c = lookup(ctx)?;
    make_current(
        |v| {
            v.pop();
            v.push(ctx);
        },
        Some(c.device),
    );
    Ok(())
}

pub fn push_current(ctx: u64) -> Result<(), CuError> {
    let c = lookup(ctx)?;
    make_current(|v| v.push(ctx), Some(c.device));
    Ok(())
}

/// Pop the current context; the one below becomes current (and its device the thread's).
pub fn pop_current() -> Result<u64, CuError> {
    let popped = current().ok_or(CuError::INVALID_CONTEXT)?;
    let mut below = None;
    make_current(
        |v| {
            v.pop();
            below = v.last().copied();
        },
        None,
    );
    if let Some(ctx) = below
        && let Ok(c) = lookup(ctx)
    {
        runtime::set_current_device(c.device);
    }
    Ok(popped)
}

pub fn create(flags: u32, device: i32) -> Result<u64, CuError> {
    bridge::check_device(device)?;
    let ctx = with(|c| {
        c.next += 1;
        let ctx = TAG | (FIRST_CREATED + c.next);
        c.created.insert(ctx, Context { device, flags });
        ctx
    });
    push_current(ctx)?;
    Ok(ctx)
}

/// `cuCtxDestroy`: the context's handle goes (a primary context cannot be destroyed), and
/// leaves this thread's stack; other threads that still have it current get
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED` from it.
pub fn destroy(ctx: u64) -> Result<(), CuError> {
    // A context's memory and streams go with it.
    crate::cudart::proofs::forget();
    lookup(ctx)?;
    if with(|c| c.created.remove(&ctx)).is_none() {
        return Err(CuError::INVALID_CONTEXT);
    }
    let _ = STACK.try_with(|s| {
        if let Some(v) = s.borrow_mut().as_mut() {
            v.retain(|&c| c != ctx);
        }
    });
    Ok(())
}

pub fn flags_of_current() -> Result<u32, CuError> {
    let ctx = current().ok_or(CuError::INVALID_CONTEXT)?;
    lookup(ctx).map(|c| c.flags)
}

/// The device of a live context (`CUDA_ERROR_INVALID_CONTEXT`, or
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED`, otherwise).
pub fn device_of(ctx: u64) -> Result<i32, CuError> {
    lookup(ctx).map(|c| c.device)
}

/// `cuCtxGetId`: a context's number, unique in the process for its life (its handle's: primary
/// contexts are 1 and up by device, created ones count on from 0x10001); 0 is the current
/// context.
pub fn id(ctx: u64) -> Result<u64, CuError> {
    let ctx = if ctx == 0 { current().ok_or(CuError::INVALID_CONTEXT)? } else { ctx };
    lookup(ctx)?;
    Ok(ctx & !TAG_MASK)
}

/// `cuCtxSetFlags`: the current context's flags, the values `cuDevicePrimaryCtxSetFlags` takes
/// (kept for `cuCtxGetFlags`; scheduling is the server's).
pub fn set_flags_of_current(flags: u32) -> Result<(), CuError> {
    let ctx = current().ok_or(CuError::INVALID_CONTEXT)?;
    check_flags(flags)?;
    if let Some(device) = primary_device(ctx) {
        with(|c| c.primary.entry(device).or_default().flags = flags);
        return Ok(());
    }
    lookup(ctx)?;
    with(|c| c.created.get_mut(&ctx).map(|x| x.flags = flags)).ok_or(CuError::CONTEXT_IS_DESTROYED)
}

/// Context flags a program may set: `CU_CTX_SCHED_*` (one of them at most),
/// `CU_CTX_MAP_HOST`, `CU_CTX_LMEM_RESIZE_TO_MAX`, `CU_CTX_COREDUMP_ENABLE`.
fn check_flags(flags: u32) -> Result<(), CuError> {
    const KNOWN: u32 = 0x07 | 0x08 | 0x10 | 0x20;
    if flags & !KNOWN != 0 || (flags & 0x07).count_ones() > 1 { Err(CuError::INVALID_VALUE) } else { Ok(()) }
}

pub fn api_version(ctx: u64) -> Result<u32, CuError> {
    let ctx = if ctx == 0 { current().ok_or(CuError::INVALID_CONTEXT)? } else { ctx };
    lookup(ctx).map(|_| API_VERSION)
}

pub fn primary_retain(device: i32) -> Result<u64, CuError> {
    bridge::check_device(device)?;
    with(|c| c.primary.entry(device).or_default().retained += 1);
    Ok(primary_handle(device))
}

pub fn primary_release(device: i32) -> Result<(), CuError> {
    bridge::check_device(device)?;
    with(|c| {
        let p = c.primary.entry(device).or_default();
        if p.retained == 0 {
            return Err(CuError::INVALID_CONTEXT);
        }
        p.retained -= 1;
        Ok(())
    })
}

/// `(flags, active)`: active once retained, or once the process has used the runtime API
/// (which keeps the primary context of the devices it uses).
pub fn primary_state(device: i32) -> Result<(u32, bool), CuError> {
    bridge::check_device(device)?;
    let p = with(|c| c.primary.get(&device).copied().unwrap_or_default());
    Ok((p.flags, p.retained > 0 || runtime::runtime_used()))
}

/// `cuDevicePrimaryCtxSetFlags`: the scheduling and mapping flags (`CU_CTX_SCHED_*`,
/// `CU_CTX_MAP_HOST`, `CU_CTX_LMEM_RESIZE_TO_MAX`), kept for `cuCtxGetFlags`; the device's
/// scheduling is the server's.
pub fn primary_set_flags(device: i32, flags: u32) -> Result<(), CuError> {
    bridge::check_device(device)?;
    check_flags(flags)?;
    with(|c| c.primary.entry(device).or_default().flags = flags);
    Ok(())
}

/// `cuDevicePrimaryCtxReset`: the device's objects go, as `cudaDeviceReset` does it.
pub fn primary_reset(device: i32) -> Result<(), CuError> {
    // As a device reset: memory and streams go.
    crate::cudart::proofs::forget();
    bridge::check_device(device)?;
    let previous = runtime::current_device();
    runtime::set_current_device(device);
    // SAFETY: cudaDeviceReset takes no arguments.
    let r = bridge::runtime(|| unsafe { crate::cudart::stubs::cudaDeviceReset() });
    runtime::set_current_device(previous);
    with(|c| c.primary.insert(device, Primary::default()));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_of_current_contexts() {
        // A fresh thread of a process that has not used the runtime: no context.
        std::thread::spawn(|| {
            assert_eq!(current(), None);
            assert_eq!(current_device(), Err(CuError::INVALID_CONTEXT));
            let (p0, p1) = (primary_handle(0), primary_handle(1));
            push_current(p0).unwrap();
            push_current(p1).unwrap();
            assert_eq!(current_device(), Ok(1));
            assert_eq!(pop_current(), Ok(p1));
            assert_eq!(current(), Some(p0));
            set_current(p1).unwrap();
            assert_eq!(current(), Some(p1), "set replaces the top");
            assert_eq!(pop_current(), Ok(p1));
            assert_eq!(current(), None);
            assert_eq!(pop_current(), Err(CuError::INVALID_CONTEXT));
            set_current(p0).unwrap();
            set_current(0).unwrap();
            assert_eq!(current(), None, "setting NULL empties the stack");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn handles_that_are_no_context() {
        assert_eq!(lookup(0).map(|_| ()), Err(CuError::INVALID_CONTEXT));
        assert_eq!(lookup(0x7fff_1234).map(|_| ()), Err(CuError::INVALID_CONTEXT), "a stray pointer");
        assert_eq!(lookup(TAG).map(|_| ()), Err(CuError::INVALID_CONTEXT));
        assert_eq!(lookup(TAG | (FIRST_CREATED + 999)).map(|_| ()), Err(CuError::CONTEXT_IS_DESTROYED));
        assert_eq!(push_current(0x7fff_1234), Err(CuError::INVALID_CONTEXT));
        assert_eq!(lookup(primary_handle(3)).map(|c| c.device), Ok(3));
    }
}
