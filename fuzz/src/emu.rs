//! An API server session on the `emu` backend, in this process, driven by a script of calls
//! taken from the input; and the script format.
//!
//! A script is a sequence of calls, each
//!
//! ```text
//! function:    u16 LE, an index into every API's functions (`reencode::FUNCTIONS`: the
//!              runtime's, then the driver's), modulo their number
//! device:      u8 (below 0xf0: device 0; else the device (byte - 0xf8), so -8..=7)
//! length:      u32 LE
//! payload:     that many bytes (fewer if the input ends first)
//! ```
//!
//! Every input runs on a fresh session, so handles and addresses are the same on every run
//! of the same input (what the seeds rely on, and what makes a crash reproduce). The harness
//! plays the guest's part where the protocol needs one: a host function enqueued on a stream
//! has run (is marked done) by the next call that is not about host functions, or all later
//! work of the session would wait for it forever, as it would on a GPU; and a module load
//! carries the right digest of its image, which a real guest computes and a mutated input
//! rarely would.

use std::cell::RefCell;
use std::sync::Arc;

use phos_api_server::backend::emu::EmuBackend;
use phos_api_server::output::DeviceOutput;
use phos_api_server::server::ApiServer;
use phos_api_server::service::Session;
use phos_protocol::apis::Function;
use phos_protocol::cudart::{FunctionId, PhosHostFuncDoneRequest, PhosHostFuncEnqueueRequest, PhosModuleLoadRequest};
use phos_protocol::limits::{LimitKind, SessionLimits};
use phos_protocol::{CudaError, RemoteCall};
use sha2::{Digest, Sha256};

use crate::Fields;
use crate::reencode::FUNCTIONS;

/// Where the session's device memory lives, and how much of it there is.
pub const DEVICE_BASE: u64 = phos_api_server::registry::memory::DEFAULT_BASE;
pub const DEVICE_RANGE: u64 = 1 << 30;
pub const DEVICE_MEMORY: u64 = 16 << 20;
/// The largest reply buffer a call may ask for.
pub const MAX_REPLY: u64 = 1 << 20;
/// Warp-instructions a kernel may run (per worker) before it fails as timed out: small, since
/// a script may launch kernels (or graphs of them) dozens of times and must still end within
/// the fuzzer's timeout.
pub const KERNEL_LIMIT: u64 = 20_000;
/// Calls one input may make.
pub const MAX_CALLS: usize = 64;
/// Objects of each kind a session may hold: small, so that a script of [`MAX_CALLS`] can reach
/// the limits and their refusals.
pub const OBJECT_LIMIT: u64 = 16;

/// A fresh session on `emu` and the server that runs its calls.
pub struct EmuServer {
    server: Arc<ApiServer>,
    session: Arc<Session>,
    /// Host functions enqueued and not run yet, by gate.
    gates: RefCell<Vec<u64>>,
}

impl Default for EmuServer {
    fn default() -> Self {
        Self::new()
    }
}

impl EmuServer {
    pub fn new() -> Self {
        let backend = Arc::new(EmuBackend::new(DEVICE_MEMORY).with_kernel_limit(KERNEL_LIMIT));
        let mut limits = SessionLimits::default();
        for kind in LimitKind::ALL {
            limits.set(kind, OBJECT_LIMIT);
        }
        let session = Session::new(1, backend, DEVICE_BASE, DEVICE_RANGE, MAX_REPLY, DeviceOutput::default(), limits)
            .expect("reserving the emulated device's address range");
        let session = Arc::new(session);
        EmuServer { server: ApiServer::for_session(session.clone()), session, gates: RefCell::default() }
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Run one call as a channel would (the server's own checks included); the encoded reply
    /// is appended to `out` on success.
    pub fn call(&self, function: Function, device: i32, payload: &[u8], out: &mut Vec<u8>) -> Result<(), CudaError> {
        let fixed;
        let payload = match with_true_digest(function, payload) {
            Some(p) => {
                fixed = p;
                &fixed[..]
            }
            None => payload,
        };
        let host_func = |id| function == Function::Cudart(id);
        if !host_func(FunctionId::PhosHostFuncWait) && !host_func(FunctionId::PhosHostFuncDone) {
            for gate in self.gates.take() {
                // The input may have opened it itself.
                let done = phos_protocol::encode(&PhosHostFuncDoneRequest { gate });
                let _ = self.server.call(FunctionId::PhosHostFuncDone, 0, &done, &mut Vec::new());
            }
        }
        let result = self.server.call(function, device, payload, out);
        // Printed output rides with replies in a real channel; here it is dropped.
        drop(self.session.output.take());
        if result.is_ok()
            && host_func(FunctionId::PhosHostFuncEnqueue)
            && let Ok(req) = phos_protocol::decode_request::<PhosHostFuncEnqueueRequest>(payload)
        {
            self.gates.borrow_mut().push(req.gate);
        }
        result
    }
}

/// A module load whose image decodes, with the digest of that image.
fn with_true_digest(function: Function, payload: &[u8]) -> Option<Vec<u8>> {
    if function != Function::Cudart(FunctionId::PhosModuleLoad) {
        return None;
    }
    let req = phos_protocol::decode_request::<PhosModuleLoadRequest>(payload).ok()?;
    let digest: [u8; 32] = Sha256::digest(req.image).into();
    Some(phos_protocol::encode(&PhosModuleLoadRequest { digest: &digest, ..req }))
}

/// One call of a script.
pub struct ScriptCall<'a> {
    pub function: Function,
    pub device: i32,
    pub payload: &'a [u8],
}

/// The calls of a script, at most [`MAX_CALLS`].
pub fn script(input: &[u8]) -> impl Iterator<Item = ScriptCall<'_>> {
    let mut f = Fields::new(input);
    std::iter::from_fn(move || {
        if f.is_empty() {
            return None;
        }
        let function = FUNCTIONS[f.u16() as usize % FUNCTIONS.len()];
        let device = match f.u8() {
            b @ 0xf0.. => i32::from(b) - 0xf8,
            _ => 0,
        };
        let len = f.u32() as usize;
        Some(ScriptCall { function, device, payload: f.bytes(len) })
    })
    .take(MAX_CALLS)
}

/// The index of `function` in [`FUNCTIONS`], as a script or a `requests` input names it.
pub fn function_index(function: Function) -> u16 {
    let i = FUNCTIONS.iter().position(|&f| f == function).expect("every function is in FUNCTIONS");
    u16::try_from(i).expect("fewer than 65536 functions")
}

/// Appends one call to a script.
pub fn append_call(script: &mut Vec<u8>, function: Function, payload: &[u8]) {
    script.extend_from_slice(&function_index(function).to_le_bytes());
    script.push(0);
    script.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    script.extend_from_slice(payload);
}

/// Builds a script by running it: each call runs on a live session as it is added, so a
/// seed can use the handles and addresses earlier calls returned (and a replay of the
/// script on a fresh session gets the same ones).
pub struct ScriptBuilder {
    server: EmuServer,
    pub script: Vec<u8>,
}

impl Default for ScriptBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptBuilder {
    pub fn new() -> Self {
        ScriptBuilder { server: EmuServer::new(), script: Vec::new() }
    }

    /// Add and run a call; its decoded reply, or the error it got.
    pub fn call<R: RemoteCall>(&mut self, req: &R) -> Result<R::Reply, CudaError> {
        let payload = phos_protocol::encode(req);
        append_call(&mut self.script, R::FUNCTION, &payload);
        let mut out = Vec::new();
        self.server.call(R::FUNCTION, 0, &payload, &mut out)?;
        Ok(phos_protocol::decode(&out).expect("the server's reply decodes"))
    }

    /// [`call`](Self::call), for calls a seed needs to succeed.
    pub fn ok<R: RemoteCall>(&mut self, req: &R) -> R::Reply {
        self.call(req).unwrap_or_else(|e| panic!("seed call {:?} failed: {e:?}", R::FUNCTION))
    }
}
