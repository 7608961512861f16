//! The object records of a session: for each live object (module, function, stream, event,
//! allocation), the call that created it, as the guest sent it. What is recorded comes from
//! the spec alone: the generated dispatch reports, after each successful call, which objects
//! the spec's `allocate`/`obj_record` descriptors say it created, which `deallocate` says it
//! destroyed, and which `obj_depends_on` says the new ones need. A destroyed object's record
//! goes, and so do the records of objects that depended on it (a module's functions).
//!
//! A restore replays the records in order through the same dispatch, so every object comes
//! back the way it was made, under the handle (or at the address) it had.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

use phos_protocol::apis::Function;
use phos_protocol::spec::RecordFacts;

use crate::fast_hash::FastMap;

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The function and its API.
    pub function: Function,
    pub device: i32,
    pub payload: Vec<u8>,
    /// (kind, handle or address) of what it created.
    pub creates: Vec<(&'static str, u64)>,
}

/// What a setter's record is kept under: (setter, what it sets, object).
type SettingKey = (Function, u64, (&'static str, u64));
/// What a session-wide setting's record is kept under: (function, device, the call's payload).
type GlobalKey = (Function, i32, Vec<u8>);

/// One record and what keeps it.
struct Entry {
    record: Record,
    /// The records whose dropping drops this one.
    deps: Vec<u64>,
    /// The settings it is the last call of.
    settings: Vec<SettingKey>,
    global: Option<GlobalKey>,
}

/// Every operation costs what it touches, not the session's history: a framework makes and
/// drops descriptors by the thousand a second (PyTorch's cuBLASLt and cuDNN descriptors for
/// each matmul and convolution), and each of those calls is recorded. The maps keyed by
/// objects and records hash fast ([`crate::fast_hash`]): their keys are values the server gave
/// out and function ids, hashed several times on every recorded call. The session-wide
/// settings' map, keyed by the guest's bytes, keeps the default hasher.
#[derive(Default)]
struct Records {
    /// Live records by a number given in creation order (the replay order).
    entries: BTreeMap<u64, Entry>,
    next: u64,
    /// Live object (kind, value) -> its record.
    by_object: FastMap<(&'static str, u64), u64>,
    /// An object's value -> its record (dependencies name values alone).
    by_value: FastMap<u64, u64>,
    /// Record -> the records that depend on it.
    dependents: FastMap<u64, Vec<u64>>,
    /// (setter, what it sets, object) -> the object's last record of that setter for that key
    /// (0 for a setter whose call is the whole setting).
    settings: FastMap<SettingKey, u64>,
    /// Session-wide settings (`obj_record` on a function: `cudaDeviceSetLimit`...): the same
    /// call made again replaces the earlier record, and the rest replay in their order, so the
    /// last setting of each kind wins on restore as it did in the session.
    global: HashMap<GlobalKey, u64>,
}

#[derive(Default)]
pub struct Recorder {
    inner: Mutex<Records>,
}

impl Recorder {
    pub fn record(&self, function: Function, device: i32, payload: &[u8], facts: &RecordFacts<'_>) {
        self.record_keyed(function, 0, device, payload, facts);
    }

    /// [`record`](Self::record) for a setter that sets one of several things per call (a cuDNN
    /// or cuBLASLt descriptor's attribute, by name): its last call is kept per `key`.
    pub fn record_keyed(&self, function: Function, key: u64, device: i32, payload: &[u8], facts: &RecordFacts<'_>) {
        self.record_with(function, key, device, || payload.to_vec(), facts);
    }

    /// [`record_keyed`](Self::record_keyed) with the payload made only if the call is kept (a
    /// request the service encodes again).
    pub fn record_with(
        &self,
        function: Function,
        key: u64,
        device: i32,
        payload: impl FnOnce() -> Vec<u8>,
        facts: &RecordFacts<'_>,
    ) {
        let mut r = self.inner.lock();
        if facts.global {
            if function == Function::Cudart(phos_protocol::cudart::FunctionId::CudaDeviceReset) {
                // Everything the session made is gone (its settings too).
                *r = Records::default();
                return;
            }
            // A session-wide setting: kept and replayed in its place (it creates nothing).
            let payload = payload();
            let key = (function, device, payload.clone());
            if let Some(old) = r.global.get(&key).copied() {
                r.prune(old);
            }
            let record = Record { function, device, payload, creates: Vec::new() };
            r.push(Entry { record, deps: Vec::new(), settings: Vec::new(), global: Some(key) });
            return;
        }
        for &(kind, value) in facts.destroyed {
            if let Some(i) = r.by_object.get(&(kind, value)).copied() {
                r.prune(i);
            }
        }
        let created: Vec<(&'static str, u64)> =
            facts.created.iter().copied().filter(|&(k, v)| v != 0 && !r.by_object.contains_key(&(k, v))).collect();
        // A setting of a live object: it depends on the object (and goes with it), and the
        // object's earlier call of the same function is replaced, so a setter called on every
        // use (PyTorch sets a cuBLAS handle's stream each time) keeps one record.
        let mutated: Vec<(&'static str, u64)> =
            facts.mutated.iter().copied().filter(|o| r.by_object.contains_key(o)).collect();
        if created.is_empty() && mutated.is_empty() {
            return;
        }
        for &obj in &mutated {
            if let Some(old) = r.settings.get(&(function, key, obj)).copied() {
                r.prune(old);
            }
        }
        let mut deps: Vec<u64> = facts.depends_on.iter().filter_map(|v| r.by_value.get(v).copied()).collect();
        deps.extend(mutated.iter().filter_map(|o| r.by_object.get(o).copied()));
        deps.sort_unstable();
        deps.dedup();
        let settings = mutated.iter().map(|&obj| (function, key, obj)).collect();
        let record = Record { function, device, payload: payload(), creates: created };
        r.push(Entry { record, deps, settings, global: None });
    }

    /// The live records, in the order to replay them.
    pub fn live(&self) -> Vec<Record> {
        self.inner.lock().entries.values().map(|e| e.record.clone()).collect()
    }

    pub fn clear(&self) {
        *self.inner.lock() = Records::default();
    }
}

impl Records {
    /// Keep `entry` as the newest record, indexed by what it creates, sets and depends on.
    fn push(&mut self, entry: Entry) -> u64 {
        let id = self.next;
        self.next += 1;
        for &obj in &entry.record.creates {
            self.by_object.insert(obj, id);
            self.by_value.insert(obj.1, id);
        }
        for &d in &entry.deps {
            self.dependents.entry(d).or_default().push(id);
        }
        for k in &entry.settings {
            self.settings.insert(*k, id);
        }
        if let Some(k) = &entry.global {
            self.global.insert(k.clone(), id);
        }
        self.entries.insert(id, entry);
        id
    }

    /// Drop record `i` and, transitively, every record that depends on it.
    fn prune(&mut self, i: u64) {
        // Most records have no dependents (a setting): the stack is only made for those that do.
        let mut stack = Vec::new();
        let mut next = Some(i);
        while let Some(i) = next.take().or_else(|| stack.pop()) {
            let Some(e) = self.entries.remove(&i) else { continue };
            for k in &e.settings {
                if let std::collections::hash_map::Entry::Occupied(o) = self.settings.entry(*k)
                    && *o.get() == i
                {
                    o.remove();
                }
            }
            if let Some(k) = &e.global
                && self.global.get(k) == Some(&i)
            {
                self.global.remove(k);
            }
            for obj in &e.record.creates {
                if self.by_object.get(obj) == Some(&i) {
                    self.by_object.remove(obj);
                }
                if self.by_value.get(&obj.1) == Some(&i) {
                    self.by_value.remove(&obj.1);
                }
            }
            for d in &e.deps {
                if let Some(v) = self.dependents.get_mut(d) {
                    v.retain(|&j| j != i);
                }
            }
            if let Some(children) = self.dependents.remove(&i) {
                stack.extend(children);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::cudart::FunctionId;

    fn facts<'a>(
        created: &'a [(&'static str, u64)],
        destroyed: &'a [(&'static str, u64)],
        depends_on: &'a [u64],
    ) -> RecordFacts<'a> {
        RecordFacts { created, destroyed, mutated: &[], depends_on, global: false }
    }

    #[test]
    fn creation_destruction_and_dependencies() {
        let r = Recorder::default();
        r.record(Function::Cudart(FunctionId::PhosModuleLoad), 0, b"m", &facts(&[("module", 10)], &[], &[]));
        r.record(Function::Cudart(FunctionId::PhosModuleGetFunction), 0, b"f", &facts(&[("function", 20)], &[], &[10]));
        r.record(Function::Cudart(FunctionId::CudaMalloc), 0, b"a", &facts(&[("device_memory", 0x6000)], &[], &[]));
        r.record(Function::Cudart(FunctionId::CudaStreamCreate), 0, b"s", &facts(&[("stream", 30)], &[], &[]));
        assert_eq!(r.live().len(), 4);
        // Freeing memory drops its record.
        r.record(Function::Cudart(FunctionId::CudaFree), 0, b"", &facts(&[], &[("device_memory", 0x6000)], &[]));
        assert_eq!(r.live().len(), 3);
        // Unloading the module drops its functions too.
        r.record(Function::Cudart(FunctionId::PhosModuleUnload), 0, b"", &facts(&[], &[("module", 10)], &[]));
        let live = r.live();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].function, Function::Cudart(FunctionId::CudaStreamCreate));
        // A zero-size allocation (null pointer) creates nothing.
        r.record(Function::Cudart(FunctionId::CudaMalloc), 0, b"z", &facts(&[("device_memory", 0)], &[], &[]));
        assert_eq!(r.live().len(), 1);
        // Session-wide settings are kept, once per distinct call, in their order.
        let global = RecordFacts { created: &[], destroyed: &[], mutated: &[], depends_on: &[], global: true };
        r.record(Function::Cudart(FunctionId::CudaDeviceSetLimit), 0, b"heap 8", &global);
        r.record(Function::Cudart(FunctionId::CudaDeviceSetLimit), 0, b"stack 2", &global);
        r.record(Function::Cudart(FunctionId::CudaDeviceSetLimit), 0, b"heap 8", &global);
        let payloads: Vec<Vec<u8>> = r.live().into_iter().map(|rec| rec.payload).collect();
        assert_eq!(payloads, [b"s".to_vec(), b"stack 2".to_vec(), b"heap 8".to_vec()]);
        // A device reset forgets everything.
        r.record(
            Function::Cudart(FunctionId::CudaDeviceReset),
            0,
            b"",
            &RecordFacts { created: &[], destroyed: &[], mutated: &[], depends_on: &[], global: true },
        );
        assert!(r.live().is_empty());
    }

    /// A framework's churn (a descriptor made, set and dropped for every matmul, a handle's
    /// stream set before each) leaves only what lives, and costs what it touches: with the
    /// whole history scanned per drop, as before, this loop took minutes.
    #[test]
    fn churn_leaves_only_what_lives() {
        use phos_protocol::cublas::FunctionId as Blas;
        use phos_protocol::cublaslt::FunctionId as Lt;
        let r = Recorder::default();
        r.record(Function::Cublas(Blas::CublasCreateV2), 0, b"h", &facts(&[("cublas_handle", 7)], &[], &[]));
        for i in 0..100_000u64 {
            let d = 1_000 + i;
            r.record(Function::Cublaslt(Lt::CublasLtMatmulDescCreate), 0, b"d", &facts(&[("lt", d)], &[], &[]));
            let set =
                RecordFacts { created: &[], destroyed: &[], mutated: &[("lt", d)], depends_on: &[], global: false };
            r.record_keyed(Function::Cublaslt(Lt::CublasLtMatmulDescSetAttribute), 3, 0, b"a", &set);
            let stream = RecordFacts {
                created: &[],
                destroyed: &[],
                mutated: &[("cublas_handle", 7)],
                depends_on: &[],
                global: false,
            };
            r.record(Function::Cublas(Blas::CublasSetStreamV2), 0, b"s", &stream);
            r.record(Function::Cublaslt(Lt::CublasLtMatmulDescDestroy), 0, b"", &facts(&[], &[("lt", d)], &[]));
        }
        let live: Vec<Vec<u8>> = r.live().into_iter().map(|rec| rec.payload).collect();
        assert_eq!(live, [b"h".to_vec(), b"s".to_vec()]);
    }

    #[test]
    fn each_setting_of_a_setter_is_kept_once() {
        use phos_protocol::cublaslt::FunctionId as Lt;
        let r = Recorder::default();
        let set = |which: u64, payload: &[u8]| {
            let facts = RecordFacts {
                created: &[],
                destroyed: &[],
                mutated: &[("cublaslt_matmul_desc", 50)],
                depends_on: &[],
                global: false,
            };
            r.record_keyed(Function::Cublaslt(Lt::CublasLtMatmulDescSetAttribute), which, 0, payload, &facts)
        };
        r.record(
            Function::Cublaslt(Lt::CublasLtMatmulDescCreate),
            0,
            b"d",
            &facts(&[("cublaslt_matmul_desc", 50)], &[], &[]),
        );
        set(3, b"transa 1");
        set(7, b"epilogue 1");
        set(3, b"transa 2");
        let payloads: Vec<Vec<u8>> = r.live().into_iter().map(|rec| rec.payload).collect();
        assert_eq!(payloads, [b"d".to_vec(), b"epilogue 1".to_vec(), b"transa 2".to_vec()]);
        r.record(
            Function::Cublaslt(Lt::CublasLtMatmulDescDestroy),
            0,
            b"",
            &facts(&[], &[("cublaslt_matmul_desc", 50)], &[]),
        );
        assert!(r.live().is_empty());
    }

    #[test]
    fn a_setting_is_kept_once_and_goes_with_its_object() {
        use phos_protocol::cublas::FunctionId as Blas;
        let r = Recorder::default();
        let blas = |id| Function::Cublas(id);
        let setting = |payload: &[u8], handle: u64, stream: u64| {
            r.record(
                blas(Blas::CublasSetStreamV2),
                0,
                payload,
                &RecordFacts {
                    created: &[],
                    destroyed: &[],
                    mutated: &[("cublas_handle", handle)],
                    depends_on: &[stream],
                    global: false,
                },
            )
        };
        r.record(Function::Cudart(FunctionId::CudaStreamCreate), 0, b"s", &facts(&[("stream", 30)], &[], &[]));
        r.record(blas(Blas::CublasCreateV2), 0, b"h", &facts(&[("cublas_handle", 40)], &[], &[]));
        // A setting of an object that is not live is not recorded.
        setting(b"x", 41, 30);
        assert_eq!(r.live().len(), 2);
        // The last call of a setter replaces the one before.
        setting(b"1", 40, 0);
        setting(b"2", 40, 30);
        let live = r.live();
        assert_eq!(live.len(), 3);
        assert_eq!(live[2].payload, b"2");
        // Destroying the stream the setting names drops the setting, not the handle.
        r.record(Function::Cudart(FunctionId::CudaStreamDestroy), 0, b"", &facts(&[], &[("stream", 30)], &[]));
        let live = r.live();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].payload, b"h");
        // Destroying the handle drops the rest.
        setting(b"3", 40, 0);
        r.record(blas(Blas::CublasDestroyV2), 0, b"", &facts(&[], &[("cublas_handle", 40)], &[]));
        assert!(r.live().is_empty());
    }

    #[test]
    fn a_keyed_setting_is_kept_once_per_key() {
        use phos_protocol::cudnn::FunctionId as Dnn;
        let r = Recorder::default();
        let set = Function::Cudnn(Dnn::CudnnBackendSetAttribute);
        let mutated = [("cudnn_backend_descriptor", 50)];
        let setting = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
        let create = Function::Cudnn(Dnn::CudnnBackendCreateDescriptor);
        r.record(create, 0, b"d", &facts(&[("cudnn_backend_descriptor", 50)], &[], &[]));
        r.record_keyed(set, 1, 0, b"dims", &setting);
        r.record_keyed(set, 2, 0, b"strides", &setting);
        r.record_keyed(set, 1, 0, b"dims again", &setting);
        let payloads: Vec<Vec<u8>> = r.live().into_iter().map(|rec| rec.payload).collect();
        assert_eq!(payloads, [b"d".to_vec(), b"strides".to_vec(), b"dims again".to_vec()]);
    }

    /// The cuDNN backend flow of a framework, as the service reports it: heuristics fill one of
    /// two engine configs, a plan is made from it, and the program destroys the other config
    /// (gone), the heuristics, the filled config and the graph (each hidden: the service
    /// records the destroy on the descriptor). Every record of a hidden descriptor stays, in
    /// its order, the destroys after what they hide; the plan's destruction takes them all.
    #[test]
    fn a_destroyed_descriptor_stays_recorded_while_what_was_made_from_it_lives() {
        use phos_protocol::cudnn::FunctionId as Dnn;
        const D: &str = "cudnn_backend_descriptor";
        let r = Recorder::default();
        let f = Function::Cudnn;
        let create =
            |h: u64| r.record(f(Dnn::CudnnBackendCreateDescriptor), 0, &h.to_le_bytes(), &facts(&[(D, h)], &[], &[]));
        let on = |id, key, payload: &[u8], h: u64, names: &[u64]| {
            let mutated = [(D, h)];
            let facts =
                RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: names, global: false };
            r.record_keyed(f(id), key, 0, payload, &facts);
        };
        let gone = |hs: &[u64]| {
            let destroyed: Vec<_> = hs.iter().map(|&h| (D, h)).collect();
            r.record(f(Dnn::CudnnBackendDestroyDescriptor), 0, b"", &facts(&[], &destroyed, &[]));
        };
        let (graph, heur, used, other, plan) = (1, 2, 3, 4, 5);
        create(graph);
        on(Dnn::CudnnBackendFinalize, 0, b"finalize graph", graph, &[]);
        create(heur);
        on(Dnn::CudnnBackendSetAttribute, 201, b"heur graph", heur, &[graph]);
        on(Dnn::CudnnBackendFinalize, 0, b"finalize heur", heur, &[]);
        create(used);
        create(other);
        // One fill of the array [used, other]; heuristics offered one config.
        on(Dnn::CudnnBackendGetAttribute, 202, b"fill", used, &[heur]);
        create(plan);
        on(Dnn::CudnnBackendSetAttribute, 401, b"plan config", plan, &[used]);
        on(Dnn::CudnnBackendFinalize, 0, b"finalize plan", plan, &[]);
        gone(&[other]);
        on(Dnn::CudnnBackendDestroyDescriptor, 0, b"hide used", used, &[]);
        on(Dnn::CudnnBackendDestroyDescriptor, 0, b"hide heur", heur, &[]);
        on(Dnn::CudnnBackendDestroyDescriptor, 0, b"hide graph", graph, &[]);
        let payloads: Vec<Vec<u8>> = r.live().into_iter().map(|rec| rec.payload).collect();
        let want: Vec<Vec<u8>> = [
            &graph.to_le_bytes()[..],
            b"finalize graph",
            &heur.to_le_bytes(),
            b"heur graph",
            b"finalize heur",
            &used.to_le_bytes(),
            b"fill",
            &plan.to_le_bytes(),
            b"plan config",
            b"finalize plan",
            b"hide used",
            b"hide heur",
            b"hide graph",
        ]
        .iter()
        .map(|p| p.to_vec())
        .collect();
        assert_eq!(payloads, want);
        // The plan goes, and with it (the service says) every descriptor it kept.
        gone(&[plan, used, heur, graph]);
        assert!(r.live().is_empty());
    }

    #[test]
    fn a_module_loaded_twice_is_recorded_once() {
        let r = Recorder::default();
        r.record(Function::Cudart(FunctionId::PhosModuleLoad), 0, b"m", &facts(&[("module", 10)], &[], &[]));
        r.record(Function::Cudart(FunctionId::PhosModuleLoad), 0, b"m", &facts(&[("module", 10)], &[], &[]));
        assert_eq!(r.live().len(), 1);
    }
}
