//! What the APIs of one build share. A session speaks every API through the same channels
//! and the same server, so:
//!
//! - each API has its own id (the frame header's API field) and name;
//! - handle kinds are one namespace: a kind two specs both declare (`stream`: the runtime's
//!   `cudaStream_t` and the driver's `CUstream`) has one id, so a handle one API hands out is
//!   valid in the other;
//! - resources are one namespace too: the router accounts a tenant's `device_memory` the same
//!   whichever API allocated it. Their indices are the first API's order, then what later
//!   APIs add.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::model::{Api, HandleKindDecl, Resource};
use crate::wire_facts::resource_kind;

/// Check that `apis` (ordered by id) fit together; each problem is a sentence.
pub fn check(apis: &[Api]) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let mut ids: BTreeMap<u16, &str> = BTreeMap::new();
    let mut names: BTreeMap<String, &str> = BTreeMap::new();
    let mut statuses: BTreeMap<&str, &str> = BTreeMap::new();
    let mut kinds: BTreeMap<&str, (u16, &str)> = BTreeMap::new();
    let mut kind_ids: BTreeMap<u16, (&str, &str)> = BTreeMap::new();
    let mut resources: BTreeMap<&str, (&Resource, &Api)> = BTreeMap::new();
    for api in apis {
        if let Some(other) = ids.insert(api.id, &api.name) {
            problems.push(format!("APIs `{other}` and `{}` both have id {}", api.name, api.id));
        }
        if let Some(other) = names.insert(api.type_name(), &api.name) {
            problems.push(format!("APIs `{other}` and `{}` would get the same generated names", api.name));
        }
        if let Some(other) = statuses.insert(&api.errors.rust_type, &api.name) {
            problems.push(format!(
                "APIs `{other}` and `{}` both name their status type `{}`",
                api.name, api.errors.rust_type
            ));
        }
        for k in &api.handle_kinds {
            match kinds.get(k.name.as_str()) {
                Some(&(id, other)) if id != k.id => problems.push(format!(
                    "handle kind `{}` has id {id} in `{other}` and {} in `{}`: a kind is one across APIs",
                    k.name, k.id, api.name
                )),
                _ => {}
            }
            match kind_ids.get(&k.id) {
                Some(&(name, other)) if name != k.name => problems.push(format!(
                    "handle kind id {} is `{name}` in `{other}` and `{}` in `{}`",
                    k.id, k.name, api.name
                )),
                _ => {}
            }
            kinds.insert(&k.name, (k.id, &api.name));
            kind_ids.insert(k.id, (&k.name, &api.name));
        }
        for r in &api.resources {
            if let Some((first, other)) = resources.get(r.name.as_str()) {
                let code = |api: &Api, r: &Resource| r.exhausted.as_ref().and_then(|e| api.constants.get(e)).copied();
                if first.kind != r.kind || code(other, first) != code(api, r) {
                    problems.push(format!(
                        "resource `{}` is {} in `{}` and {} in `{}`: a resource is one across APIs (same kind, same \
                         exhausted code)",
                        r.name,
                        resource_kind(first.kind),
                        other.name,
                        resource_kind(r.kind),
                        api.name
                    ));
                }
            } else {
                resources.insert(&r.name, (r, api));
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}

/// The resources of all APIs, in index order: the first API's, then each later one's new ones.
pub fn resources(apis: &[Api]) -> Vec<(Resource, Option<i64>)> {
    let mut out: Vec<(Resource, Option<i64>)> = Vec::new();
    for api in apis {
        for r in &api.resources {
            if !out.iter().any(|(o, _)| o.name == r.name) {
                let code = r.exhausted.as_ref().and_then(|e| api.constants.get(e)).copied();
                out.push((r.clone(), code));
            }
        }
    }
    out
}

/// The index of resource `name` among [`resources`].
pub fn resource_index(apis: &[Api], name: &str) -> usize {
    resources(apis).iter().position(|(r, _)| r.name == name).expect("a resource of a checked spec")
}

/// The handle kinds of all APIs, by id.
pub fn handle_kinds(apis: &[Api]) -> Vec<HandleKindDecl> {
    let mut out: Vec<HandleKindDecl> = Vec::new();
    for k in apis.iter().flat_map(|a| &a.handle_kinds) {
        if !out.contains(k) {
            out.push(k.clone());
        }
    }
    out.sort_by_key(|k| k.id);
    out
}

/// What eBPF policies are built against: every API's id and hash, and the resources' order.
/// A policy records it, and a router of another build refuses the policy.
pub fn policy_hash(apis: &[Api]) -> u64 {
    let mut h = Sha256::new();
    for api in apis {
        h.update(format!("api {} {} {:016x}\n", api.id, api.name, api.spec_hash));
    }
    for (i, (r, _)) in resources(apis).iter().enumerate() {
        h.update(format!("resource {i} {}\n", r.name));
    }
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}
