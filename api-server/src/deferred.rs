//! Failures of library calls that ran asynchronously (functions with an `@async_id`, sent
//! by the guest without waiting), kept for the next synchronous call of the same API on the
//! same handle, as CUDA keeps an asynchronous error for a later call.
//!
//! Such a function's first argument is its handle (the spec compiler checks it), so the first
//! eight bytes of its request name it; a synchronous call of the API whose request starts
//! with a handle that has a failure waiting returns that failure instead of running (and the
//! guest logs which earlier call it belongs to). Handles carry their kind in their tag, so
//! no other argument of another function takes the value of a live handle by chance.
//! A failure waiting at a checkpoint is not in the image: it was logged when it happened.
//!
//! A failure of a call on an object no later call names first (a cuBLASLt descriptor's
//! setting: matmuls and heuristic queries name the handle first, and the guest may never send
//! the descriptor's destruction) waits under [`ANY`]: the next synchronous call of the API,
//! whatever it names, returns it.

use std::collections::HashMap;

use parking_lot::Mutex;

/// One failure waiting: the status and the function that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    pub status: i32,
    pub function: &'static str,
}

/// The failures waiting, by (API id, handle).
#[derive(Default)]
pub struct Deferred {
    waiting: Mutex<HashMap<(u16, u64), Failed>>,
}

/// The key of a failure any synchronous call of its API returns (no handle is 0).
pub const ANY: u64 = 0;

/// The handle a request names first, if it is long enough to have one.
pub fn first_handle(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.get(..8)?.try_into().ok()?))
}

impl Deferred {
    /// An async call on `handle` failed: keep its failure (the first one since the handle's
    /// last synchronous call; later ones are logged only).
    pub fn failed(&self, api: u16, handle: u64, failed: Failed) -> bool {
        let mut waiting = self.waiting.lock();
        if waiting.contains_key(&(api, handle)) {
            return false;
        }
        waiting.insert((api, handle), failed);
        true
    }

    /// A synchronous call of `api` with `payload`: the failure it returns, if one waits for
    /// the handle it names first, or for any call of the API ([`ANY`]).
    pub fn take(&self, api: u16, payload: &[u8]) -> Option<Failed> {
        let mut waiting = self.waiting.lock();
        if waiting.is_empty() {
            return None;
        }
        if let Some(failed) = first_handle(payload).and_then(|h| waiting.remove(&(api, h))) {
            return Some(failed);
        }
        waiting.remove(&(api, ANY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_waits_for_the_next_synchronous_call_on_its_handle() {
        let d = Deferred::default();
        let f = Failed { status: 7, function: "cublasSgemm_v2" };
        assert!(d.failed(2, 0x1610, f));
        assert!(!d.failed(2, 0x1610, Failed { status: 13, function: "cublasGemmEx" }), "the first one is kept");
        // Another API, another handle, a short request: not theirs.
        assert_eq!(d.take(3, &0x1610u64.to_le_bytes()), None);
        assert_eq!(d.take(2, &0x1710u64.to_le_bytes()), None);
        assert_eq!(d.take(2, &[0x10, 0x16]), None);
        let mut req = 0x1610u64.to_le_bytes().to_vec();
        req.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(d.take(2, &req), Some(f));
        assert_eq!(d.take(2, &req), None, "returned once");
    }

    #[test]
    fn a_failure_for_any_call_goes_to_the_next_synchronous_call_of_its_api() {
        let d = Deferred::default();
        let f = Failed { status: 7, function: "cublasLtMatmulDescSetAttribute" };
        assert!(d.failed(7, ANY, f));
        assert_eq!(d.take(2, &0x1610u64.to_le_bytes()), None, "another API");
        assert_eq!(d.take(7, &[]), Some(f), "any request, a short one too");
        assert_eq!(d.take(7, &[]), None);
    }
}
