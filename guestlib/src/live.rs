//! Calls the spec lets go without waiting once proven (`async_when_live(handles...)`: an event
//! record, a wait on an event, a graph launch). CUDA returns an error from such a call itself
//! only for what the guest can rule out: a handle that is not live (never made, destroyed), a
//! handle of another device, bad flags, a capture that refuses it, a sticky error. So the first
//! call of each shape waits for its answer; once one with the same arguments (handles and
//! flags) on the same current device has succeeded, and none of its handles was destroyed
//! since, the same call cannot fail at the call and is sent without waiting
//! (`runtime::call_async`), its failure, if the server finds one when it runs, becoming the
//! thread's last error as a launch's does. What else must hold (no capture may be open, no
//! sticky error known) the API's `rt` decides and passes as `may_go`.
//!
//! A destroy forgets its handle before it is sent (the generated stub of every function that
//! `deallocate`s a handle), so no call of any thread goes without waiting on it after; a proof
//! made by a call that was in flight while a handle was forgotten is not kept (an epoch, bumped
//! by every forgetting), since that call may have run before the destroy.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use phos_protocol::RemoteCall;
use phos_protocol::apis::Function;

use crate::runtime;

/// A call that succeeded: its function, the current device it was made on, its arguments'
/// values in order, and which of them are handles that a destroy forgets.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Proven {
    function: Function,
    device: i32,
    values: Vec<u64>,
    handles: Vec<u64>,
}

#[derive(Default)]
struct Proofs {
    calls: HashSet<Proven>,
    /// Bumped by every forgetting.
    epoch: u64,
}

fn proofs() -> MutexGuard<'static, Proofs> {
    static PROOFS: LazyLock<Mutex<Proofs>> = LazyLock::new(Default::default);
    PROOFS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Send `req` without waiting if a call of its function with these `values` on this device
/// has succeeded and none of its `handles` was destroyed since, and `may_go` (what the API
/// knows besides); else wait for its answer, whose success proves the call.
pub fn call<R: RemoteCall>(req: &R, handles: &[u64], values: &[u64], may_go: bool) -> Result<(), R::Status> {
    let key = Proven {
        function: R::FUNCTION,
        device: runtime::current_device(),
        values: values.to_vec(),
        handles: handles.to_vec(),
    };
    if may_go && proofs().calls.contains(&key) {
        return runtime::call_async(req);
    }
    let epoch = proofs().epoch;
    runtime::call(req)?;
    if may_go {
        note(key, epoch);
    }
    Ok(())
}

/// A call proven by a synchronous success that began at `epoch`: kept unless a handle was
/// forgotten meanwhile.
fn note(key: Proven, epoch: u64) {
    let mut p = proofs();
    if p.epoch == epoch {
        p.calls.insert(key);
    }
}

/// `handle` is being destroyed: calls naming it wait for their answers again. Before the
/// destroy is sent.
pub fn forget(handle: u64) {
    let mut p = proofs();
    p.epoch += 1;
    p.calls.retain(|c| !c.handles.contains(&handle));
}

/// Every handle goes (a device reset).
pub fn forget_all() {
    let mut p = proofs();
    p.epoch += 1;
    p.calls.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::cudart::FunctionId;

    fn key(handles: &[u64], device: i32) -> Proven {
        Proven {
            function: Function::Cudart(FunctionId::CudaEventRecord),
            device,
            values: handles.to_vec(),
            handles: handles.to_vec(),
        }
    }

    fn proven(k: &Proven) -> bool {
        proofs().calls.contains(k)
    }

    /// Noted as by a call that began now (tests run in parallel, forgetting their own handles).
    fn note_now(k: &Proven) {
        proofs().calls.insert(k.clone());
    }

    // The set is the process's: each test uses handles of its own.
    #[test]
    fn a_destroy_forgets_every_call_naming_the_handle() {
        let (a, b) = (key(&[0x1001, 0x2001], 0), key(&[0x1002, 0x2001], 0));
        let other = key(&[0x1003, 0x2003], 0);
        for k in [&a, &b, &other] {
            note_now(k);
        }
        assert!(proven(&a) && proven(&b) && proven(&other));
        forget(0x2001);
        assert!(!proven(&a) && !proven(&b), "both name the destroyed stream");
        assert!(proven(&other), "a call on other handles stays proven");
        forget(0x1003);
        assert!(!proven(&other));
    }

    #[test]
    fn a_proof_made_across_a_forgetting_is_not_kept() {
        let k = key(&[0x3001, 0x4001], 0);
        let epoch = proofs().epoch;
        // Another thread destroys something while the synchronous call is in flight.
        forget(0x9999);
        note(k.clone(), epoch);
        assert!(!proven(&k), "the call may have run before the destroy");
        let epoch = proofs().epoch;
        note(k.clone(), epoch);
        let kept = proven(&k);
        // Unless another test forgot something in between: then not kept, as it should be.
        assert!(kept || proofs().epoch != epoch);
        forget(0x3001);
    }

    #[test]
    fn the_device_is_part_of_the_proof() {
        let on0 = key(&[0x5001, 0x6001], 0);
        note_now(&on0);
        assert!(proven(&on0));
        assert!(!proven(&key(&[0x5001, 0x6001], 1)), "the same handles from another current device");
        forget(0x5001);
    }
}
