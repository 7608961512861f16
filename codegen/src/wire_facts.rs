//! The wire facts of a checked spec: everything a deployed guest or a checkpoint image
//! depends on, and nothing else. The spec hash is computed from them, and the lock file
//! ([`crate::lock`]) records them, so that an edit that would break guests or images is
//! caught; an edit of a comment, a coverage note or a precondition changes none of them.
//!
//! | fact | why it travels |
//! |---|---|
//! | function id, name, carried, async | the frame's function id; images name the functions they replay; a guest sends async calls without waiting |
//! | request and reply field types | the payload's layout (field names are kept for the reader, not compared) |
//! | retired ids | never given again |
//! | handle kinds and ids | a handle's tag |
//! | error codes | a reply's status |
//! | enum constants | values of arguments (`cudaMemcpyHostToDevice`) |
//! | resources, in order | indices in usage reports and eBPF policies |

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ast::ResourceKind;
use crate::model::{Api, Exec, Function, TypeKind, WireRepr};

/// The wire facts of one API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireFacts {
    pub api: String,
    pub id: u16,
    pub version: u32,
    /// By id.
    pub functions: Vec<FunctionFacts>,
    pub retired: Vec<RetiredFacts>,
    pub handle_kinds: Vec<HandleKindFacts>,
    /// By code.
    pub errors: Vec<ErrorFacts>,
    /// By name.
    pub constants: Vec<ConstantFacts>,
    /// In index order.
    pub resources: Vec<ResourceFacts>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionFacts {
    pub id: u32,
    pub name: String,
    /// Carried to the server (a remote function); the rest have an id but no layout.
    pub carried: bool,
    #[serde(rename = "async", default, skip_serializing_if = "is_false")]
    pub is_async: bool,
    /// `name: type` of each request field, in wire order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request: Vec<String>,
    /// `name: type` of each reply field, in wire order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reply: Vec<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl FunctionFacts {
    /// The field types alone: what the layout is (a renamed field is the same layout).
    pub fn request_types(&self) -> Vec<&str> {
        self.request.iter().map(|f| field_type(f)).collect()
    }

    pub fn reply_types(&self) -> Vec<&str> {
        self.reply.iter().map(|f| field_type(f)).collect()
    }
}

fn field_type(field: &str) -> &str {
    field.split_once(": ").map_or(field, |(_, t)| t)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredFacts {
    pub id: u32,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleKindFacts {
    pub id: u16,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorFacts {
    pub code: i64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConstantFacts {
    pub name: String,
    pub value: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceFacts {
    pub name: String,
    /// `continuous`, `instantaneous` or `measured`.
    pub kind: String,
    /// The error code a call gets past the tenant's quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exhausted: Option<i64>,
}

impl WireFacts {
    pub fn of(api: &Api) -> WireFacts {
        let mut functions: Vec<FunctionFacts> = api.functions.iter().map(|f| function_facts(api, f)).collect();
        // A function's async form (`@async_id(N)`) is a function of its own on the wire: the
        // same name and layout under its own id, sent without waiting.
        functions.extend(api.functions.iter().filter_map(|f| {
            let id = f.async_id?;
            Some(FunctionFacts { id, is_async: true, ..function_facts(api, f) })
        }));
        functions.sort_by_key(|f| f.id);
        let mut retired: Vec<RetiredFacts> =
            api.retired.iter().map(|r| RetiredFacts { id: r.id, name: r.name.clone() }).collect();
        retired.sort_by_key(|r| r.id);
        let handle_kinds =
            api.handle_kinds.iter().map(|k| HandleKindFacts { id: k.id, name: k.name.clone() }).collect();
        let mut errors: Vec<ErrorFacts> =
            api.errors.entries.iter().map(|e| ErrorFacts { code: e.code, name: e.name.clone() }).collect();
        errors.sort_by_key(|e| e.code);
        let mut constants: Vec<ConstantFacts> = api
            .enums
            .iter()
            .flat_map(|e| e.variants.iter().map(|(n, v)| ConstantFacts { name: n.clone(), value: *v }))
            .collect();
        constants.sort_by(|a, b| a.name.cmp(&b.name));
        let resources = api
            .resources
            .iter()
            .map(|r| ResourceFacts {
                name: r.name.clone(),
                kind: resource_kind(r.kind).to_string(),
                exhausted: r.exhausted.as_ref().and_then(|e| api.constants.get(e).copied()),
            })
            .collect();
        WireFacts {
            api: api.name.clone(),
            id: api.id,
            version: api.version,
            functions,
            retired,
            handle_kinds,
            errors,
            constants,
            resources,
        }
    }

    /// The facts as text, one line each, in a fixed order: what the hash is taken of. Field
    /// names are left out (a renamed parameter travels the same).
    pub fn canonical(&self) -> String {
        let mut s = format!("api {} id {} version {}\n", self.api, self.id, self.version);
        for f in &self.functions {
            s.push_str(&format!("function {} {} {}", f.id, f.name, if f.carried { "carried" } else { "local" }));
            if f.is_async {
                s.push_str(" async");
            }
            if f.carried {
                s.push_str(&format!(" request({}) reply({})", f.request_types().join(","), f.reply_types().join(",")));
            }
            s.push('\n');
        }
        for r in &self.retired {
            s.push_str(&format!("retired {} {}\n", r.id, r.name));
        }
        for k in &self.handle_kinds {
            s.push_str(&format!("handle_kind {} {}\n", k.id, k.name));
        }
        for e in &self.errors {
            s.push_str(&format!("error {} {}\n", e.code, e.name));
        }
        for c in &self.constants {
            s.push_str(&format!("constant {} {}\n", c.name, c.value));
        }
        for (i, r) in self.resources.iter().enumerate() {
            s.push_str(&format!("resource {i} {} {}", r.name, r.kind));
            if let Some(e) = r.exhausted {
                s.push_str(&format!(" exhausted {e}"));
            }
            s.push('\n');
        }
        s
    }

    /// The first 8 bytes of the SHA-256 of [`canonical`](Self::canonical), little-endian.
    pub fn hash(&self) -> u64 {
        let digest = Sha256::digest(self.canonical().as_bytes());
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

pub fn resource_kind(k: ResourceKind) -> &'static str {
    match k {
        ResourceKind::Continuous => "continuous",
        ResourceKind::Instantaneous => "instantaneous",
        ResourceKind::Measured => "measured",
    }
}

fn function_facts(api: &Api, f: &Function) -> FunctionFacts {
    let carried = f.exec == Exec::Remote;
    let (mut request, mut reply) = (Vec::new(), Vec::new());
    if carried {
        for a in &f.args {
            let field = |t: String| format!("{}: {t}", a.name);
            match a.wire() {
                WireRepr::None => {}
                WireRepr::Request(t) => request.push(field(wire_type(api, &t))),
                WireRepr::Reply(t) => reply.push(field(wire_type(api, &t))),
                WireRepr::Both => {
                    request.push(field("bytes".into()));
                    reply.push(field("bytes".into()));
                }
                WireRepr::Chosen { has_out } => {
                    request.push(field("ptr".into()));
                    if has_out {
                        reply.push(field("bytes?".into()));
                    }
                }
            }
        }
    }
    FunctionFacts { id: f.id, name: f.name.clone(), carried, is_async: f.is_async, request, reply }
}

/// A field's Rust type as the lock file writes it: `u64`, `bytes`, `str`, `Dim3(12)`.
fn wire_type(api: &Api, rust: &str) -> String {
    match rust {
        "&'a [u8]" | "Vec<u8>" => "bytes".into(),
        "&'a str" => "str".into(),
        t => match t.strip_prefix("crate::types::") {
            Some(w) => {
                let size = api.types.values().find_map(|nt| match &nt.kind {
                    TypeKind::Pod { wire, size } if wire == w => Some(*size),
                    _ => None,
                });
                match size {
                    Some(n) => format!("{w}({n})"),
                    None => w.to_string(),
                }
            }
            None => t.to_string(),
        },
    }
}
