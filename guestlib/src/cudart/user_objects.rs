//! User objects (`cudaUserObjectCreate`, `cudaGraphRetainUserObject`...), kept in the guest
//! library: an object is the application's pointer and destructor with a reference count, and
//! graphs and executable graphs hold references. The destructor runs on a thread of the
//! library's once the last reference goes (CUDA runs it on a thread of its own, and allows only
//! `cudaUserObjectNoDestructorSync`): a graph's references go when it is destroyed, an
//! executable graph's once its launches are done (after the streams it was launched on have
//! finished their work).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use phos_protocol::CudaError;
use phos_protocol::cudart::{CudaStreamSynchronizeRequest, PhosGraphNodesRequest};

use crate::runtime;

/// Object handles start here (distinct, non-null, pointer-like values).
const HANDLE_BASE: u64 = 0x7100_0000_1000;
/// `cudaUserObjectNoDestructorSync`, the one flag CUDA accepts (and requires).
const NO_DESTRUCTOR_SYNC: u32 = 1;
/// `cudaGraphUserObjectMove`: the graph takes references the caller held.
const MOVE: u32 = 1;

type HostFn = unsafe extern "C" fn(*mut c_void);

struct Object {
    ptr: u64,
    destroy: u64,
    refs: u64,
}

#[derive(Default)]
struct Objects {
    objects: BTreeMap<u64, Object>,
    next: u64,
    /// References each graph or executable graph holds: owner -> object -> count.
    held: BTreeMap<u64, BTreeMap<u64, u64>>,
    /// Streams each executable graph holding references was launched on.
    launched: BTreeMap<u64, BTreeSet<u64>>,
}

static OBJECTS: Mutex<Option<Objects>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Objects) -> T) -> T {
    let mut g = OBJECTS.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(Default::default))
}

/// Run destructors of objects whose last reference went, on a thread of their own.
fn destroy(gone: Vec<(u64, u64)>) {
    if gone.is_empty() {
        return;
    }
    std::thread::spawn(move || {
        for (destroy, ptr) in gone {
            // SAFETY: the destructor the application gave `cudaUserObjectCreate`, a host
            // function `void f(void *)` (its contract), called once with its pointer.
            let f = unsafe { std::mem::transmute::<usize, HostFn>(destroy as usize) };
            // SAFETY: called as the application asked, with its own pointer.
            unsafe { f(ptr as usize as *mut c_void) };
        }
    });
}

impl Objects {
    /// Drop `count` references of `object`; the destructor, when that was the last.
    fn release(&mut self, object: u64, count: u64) -> Result<Option<(u64, u64)>, CudaError> {
        let o = self.objects.get_mut(&object).ok_or(CudaError::InvalidValue)?;
        o.refs = o.refs.saturating_sub(count);
        if o.refs > 0 {
            return Ok(None);
        }
        let o = self.objects.remove(&object).expect("present");
        Ok(Some((o.destroy, o.ptr)))
    }

    /// Drop every reference `owner` holds.
    fn release_owner(&mut self, owner: u64) -> Vec<(u64, u64)> {
        let held = self.held.remove(&owner).unwrap_or_default();
        held.into_iter().filter_map(|(object, count)| self.release(object, count).ok().flatten()).collect()
    }
}

/// `cudaUserObjectCreate`.
///
/// # Safety
/// A non-null `out` must be writable; `destroy` must be null or a host function
/// `void f(void *)` that may be called with `ptr` on another thread.
pub unsafe fn create(out: *mut u64, ptr: u64, destroy: u64, initial: u32, flags: u32) -> Result<(), CudaError> {
    if out.is_null() || destroy == 0 || initial == 0 || flags != NO_DESTRUCTOR_SYNC {
        return Err(CudaError::InvalidValue);
    }
    let h = with(|s| {
        let h = HANDLE_BASE + s.next * 0x10;
        s.next += 1;
        s.objects.insert(h, Object { ptr, destroy, refs: u64::from(initial) });
        h
    });
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { out.write_unaligned(h) };
    Ok(())
}

/// `cudaUserObjectRetain`.
pub fn retain(object: u64, count: u32) -> Result<(), CudaError> {
    if count == 0 {
        return Err(CudaError::InvalidValue);
    }
    with(|s| {
        let o = s.objects.get_mut(&object).ok_or(CudaError::InvalidValue)?;
        o.refs = o.refs.saturating_add(u64::from(count));
        Ok(())
    })
}

/// `cudaUserObjectRelease`.
pub fn release(object: u64, count: u32) -> Result<(), CudaError> {
    if count == 0 {
        return Err(CudaError::InvalidValue);
    }
    let gone = with(|s| s.release(object, u64::from(count)))?;
    destroy(gone.into_iter().collect());
    Ok(())
}

/// `cudaGraphRetainUserObject`: the graph holds `count` more references, new ones or (with
/// `cudaGraphUserObjectMove`) the caller's.
pub fn graph_retain(graph: u64, object: u64, count: u32, flags: u32) -> Result<(), CudaError> {
    if count == 0 || flags & !MOVE != 0 {
        return Err(CudaError::InvalidValue);
    }
    // The graph must exist.
    runtime::call(&PhosGraphNodesRequest { graph, max: 0 })?;
    with(|s| {
        let o = s.objects.get_mut(&object).ok_or(CudaError::InvalidValue)?;
        if flags & MOVE == 0 {
            o.refs = o.refs.saturating_add(u64::from(count));
        }
        *s.held.entry(graph).or_default().entry(object).or_default() += u64::from(count);
        Ok(())
    })
}

/// `cudaGraphReleaseUserObject`: of the references the graph holds.
pub fn graph_release(graph: u64, object: u64, count: u32) -> Result<(), CudaError> {
    if count == 0 {
        return Err(CudaError::InvalidValue);
    }
    let gone = with(|s| {
        let held = s.held.get_mut(&graph).and_then(|h| h.get_mut(&object)).ok_or(CudaError::InvalidValue)?;
        if *held < u64::from(count) {
            return Err(CudaError::InvalidValue);
        }
        *held -= u64::from(count);
        if *held == 0 {
            s.held.get_mut(&graph).expect("present").remove(&object);
        }
        s.release(object, u64::from(count))
    })?;
    destroy(gone.into_iter().collect());
    Ok(())
}

/// A new graph or executable graph `to` made from `from` (a clone, an instantiation) holds
/// references to what `from` holds.
pub fn copy_references(from: u64, to: u64) {
    with(|s| {
        let Some(held) = s.held.get(&from).cloned() else { return };
        for (object, count) in &held {
            if let Some(o) = s.objects.get_mut(object) {
                o.refs = o.refs.saturating_add(*count);
            }
        }
        s.held.insert(to, held);
    })
}

/// A launch of `exec` on `stream`: its references stay until that stream's work is done.
pub fn note_launch(exec: u64, stream: u64) {
    let mut g = OBJECTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(s) = g.as_mut()
        && s.held.contains_key(&exec)
    {
        s.launched.entry(exec).or_default().insert(stream);
    }
}

/// `cudaGraphDestroy`: the graph's references go.
pub fn graph_destroyed(graph: u64) {
    let mut g = OBJECTS.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(s) = g.as_mut() else { return };
    let gone = s.release_owner(graph);
    drop(g);
    destroy(gone);
}

/// `cudaGraphExecDestroy`: the executable graph's references go once the streams it was
/// launched on have done their work (waited for on another thread).
pub fn exec_destroyed(exec: u64) {
    let mut g = OBJECTS.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(s) = g.as_mut() else { return };
    if !s.held.contains_key(&exec) {
        return;
    }
    let streams = s.launched.remove(&exec).unwrap_or_default();
    let held = s.held.remove(&exec).unwrap_or_default();
    drop(g);
    std::thread::spawn(move || {
        for stream in streams {
            // A stream destroyed since is done with its work.
            let _ = runtime::call(&CudaStreamSynchronizeRequest { stream });
        }
        let gone =
            with(|s| held.into_iter().filter_map(|(object, count)| s.release(object, count).ok().flatten()).collect());
        destroy(gone);
    });
}
