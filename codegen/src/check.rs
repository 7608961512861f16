//! Semantic checks: turns the syntax tree into the checked [`model`](crate::model), or a list
//! of diagnostics that each name the spec line at fault.

use std::collections::{BTreeMap, BTreeSet};

use crate::ast::*;
use crate::diag::{Diagnostic, line_col};
use crate::model::ErrorEntry;
use crate::model::*;

/// Check a parsed spec. `source` is only used for line numbers.
pub fn check(spec: &SpecFile, source: &str) -> Result<Api, Vec<Diagnostic>> {
    let mut cx = Checker { source, diags: Vec::new(), ..Default::default() };
    cx.collect_declarations(spec);
    let functions = cx.check_functions(spec);
    if cx.diags.is_empty() {
        let mut api = Api {
            name: cx.api_name.clone().unwrap_or_default(),
            id: cx.api_id,
            version: cx.api_version,
            spec_hash: 0,
            accepted_hashes: Vec::new(),
            legacy_text_hashes: Vec::new(),
            resources: cx.resource_order.iter().filter_map(|n| cx.resources.get(n).cloned()).collect(),
            types: cx.types.clone(),
            enums: cx.enums.clone(),
            constants: cx.constants.clone(),
            errors: cx.errors.clone().expect("checked"),
            utilities: cx.utilities.values().cloned().collect(),
            handle_kinds: cx
                .handle_kinds
                .iter()
                .map(|(n, (id, _))| HandleKindDecl { name: n.clone(), id: *id })
                .collect(),
            retired: cx.retired.iter().map(|(id, (name, _))| Retired { id: *id, name: name.clone() }).collect(),
            functions,
            coverage_notes: cx.coverage_notes.clone(),
        };
        api.handle_kinds.sort_by_key(|k| k.id);
        api.spec_hash = crate::wire_facts::WireFacts::of(&api).hash();
        Ok(api)
    } else {
        Err(cx.diags)
    }
}

/// FNV-1a of a spec's text: what builds from before explicit function ids sent as the spec's
/// identity (`Hello` of handshake version 1). Kept to recognise those guests.
pub fn legacy_text_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The largest handle kind id: a handle's top 16 bits are `0x7e00 | id`.
pub const MAX_HANDLE_KIND_ID: i128 = 0xff;

#[derive(Default)]
struct Checker<'s> {
    source: &'s str,
    diags: Vec<Diagnostic>,
    api_name: Option<String>,
    api_id: u16,
    api_version: u32,
    /// Declared handle kinds: name -> (id, where).
    handle_kinds: BTreeMap<String, (u16, Span)>,
    /// Retired function ids: id -> (name, where).
    retired: BTreeMap<u32, (String, Span)>,
    /// One past the largest function id the spec gives or retires (what an error suggests).
    next_free_id: u32,
    /// Handle kinds named by `handle(...)` types, checked once every kind is declared.
    handle_uses: Vec<Ident>,
    resources: BTreeMap<String, Resource>,
    /// Resource names in declaration order: a resource's index on the wire and in policies.
    resource_order: Vec<String>,
    types: BTreeMap<String, NamedType>,
    enums: Vec<EnumDef>,
    constants: BTreeMap<String, i64>,
    errors: Option<ErrorTable>,
    utilities: BTreeMap<String, Utility>,
    aliases: Vec<(Ident, Ident, Option<Ident>)>,
    coverage_notes: Vec<String>,
}

/// The `return_code` type's declaration, until the errors table is known.
struct ReturnCodeDecl {
    ty: Ident,
    rust: Option<Ident>,
    success: Option<Ident>,
    not_supported: Option<Ident>,
    failures: Vec<(Ident, Ident)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Int,
    Bool,
}

/// Where an expression can be evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reach {
    /// The server (and router) can evaluate it from wire values.
    wire: bool,
}

const FN_FLAGS: &[&str] = &["sync", "async", "internal", "unsupported", "obj_record", "device_output"];
const VAL_FLAGS: &[&str] =
    &["in", "out", "inout", "string", "null_ok", "opaque", "local", "no_copy", "obj_record", "allocate", "deallocate"];

impl<'s> Checker<'s> {
    fn err(&mut self, span: Span, msg: impl Into<String>) {
        self.diags.push(Diagnostic::new(span, msg));
    }

    /// The `@` attributes of a declaration, by name; each must be one of `allowed`, given
    /// once, and every one of `required` must be there (`what` names the declaration).
    fn attrs(
        &mut self,
        attrs: &[Attr],
        allowed: &[&str],
        required: &[&str],
        what: &str,
        at: Span,
    ) -> BTreeMap<String, (i128, Span)> {
        let mut found: BTreeMap<String, (i128, Span)> = BTreeMap::new();
        for a in attrs {
            if !allowed.contains(&a.name.name.as_str()) {
                self.err(
                    a.span,
                    format!("`@{}` does not apply to {what} (it takes {})", a.name.name, allowed.join(", ")),
                );
            } else if found.insert(a.name.name.clone(), (a.value, a.span)).is_some() {
                self.err(a.span, format!("`@{}` given twice", a.name.name));
            }
        }
        for r in required {
            if !found.contains_key(*r) {
                self.err(at, format!("{what} needs `@{r}(<n>)` before it"));
            }
        }
        found
    }

    /// An attribute's value as an integer of type `T` within `range`, or an error at it.
    fn attr_value<T: TryFrom<i128>>(
        &mut self,
        attr: Option<&(i128, Span)>,
        range: std::ops::RangeInclusive<i128>,
        what: &str,
    ) -> Option<T> {
        let (v, span) = attr?;
        if !range.contains(v) {
            self.err(*span, format!("{what} must be in {}..={}", range.start(), range.end()));
            return None;
        }
        T::try_from(*v).ok()
    }

    // -----------------------------------------------------------------------------------------
    // Declarations
    // -----------------------------------------------------------------------------------------

    fn collect_declarations(&mut self, spec: &SpecFile) {
        let mut return_code: Option<ReturnCodeDecl> = None;
        let mut error_items = Vec::new();
        let mut exhausted_errors: Vec<Ident> = Vec::new();
        for item in &spec.items {
            match item {
                Item::CoverageNote(text) => self.coverage_notes.push(text.clone()),
                Item::Api { name, attrs } => {
                    if self.api_name.is_some() {
                        self.err(name.span, "second `api` declaration");
                    }
                    self.api_name = Some(name.name.clone());
                    let found = self.attrs(attrs, &["id", "version"], &["id", "version"], "`api`", name.span);
                    self.api_id = self.attr_value(found.get("id"), 0..=i128::from(u16::MAX), "an API id").unwrap_or(0);
                    self.api_version =
                        self.attr_value(found.get("version"), 1..=i128::from(u32::MAX), "an API version").unwrap_or(1);
                }
                Item::Retired { name, attrs } => {
                    let found = self.attrs(attrs, &["id"], &["id"], "`retired`", name.span);
                    if let Some(id) = self.attr_value::<u32>(found.get("id"), 0..=i128::from(u32::MAX), "a function id")
                        && self.retired.insert(id, (name.name.clone(), name.span)).is_some()
                    {
                        self.err(name.span, format!("function id {id} is retired twice"));
                    }
                }
                Item::HandleKind { name, attrs } => {
                    let found = self.attrs(attrs, &["id"], &["id"], "`handle_kind`", name.span);
                    if let Some(id) =
                        self.attr_value::<u16>(found.get("id"), 0..=MAX_HANDLE_KIND_ID, "a handle kind id")
                    {
                        if let Some((other, _)) = self.handle_kinds.iter().find(|(_, (i, _))| *i == id) {
                            let other = other.clone();
                            self.err(name.span, format!("handle kind id {id} is already `{other}`'s"));
                        }
                        if self.handle_kinds.insert(name.name.clone(), (id, name.span)).is_some() {
                            self.err(name.span, format!("handle kind `{}` declared twice", name.name));
                        }
                    }
                }
                Item::Resource { kind, name, exhausted } => {
                    if self.resources.contains_key(&name.name) {
                        self.err(name.span, format!("resource `{}` declared twice", name.name));
                    } else {
                        self.resource_order.push(name.name.clone());
                    }
                    if let Some(e) = exhausted
                        && *kind != ResourceKind::Continuous
                    {
                        self.err(e.span, "only a `continuous_rc` resource can have a quota, so `exhausted(...)`");
                    }
                    self.resources.insert(
                        name.name.clone(),
                        Resource { name: name.name.clone(), kind: *kind, exhausted: exhausted.clone().map(|e| e.name) },
                    );
                    if let Some(e) = exhausted {
                        exhausted_errors.push(e.clone());
                    }
                }
                Item::Type { name, descs } => {
                    if let Some(rc) = self.type_decl(name, descs) {
                        if return_code.is_some() {
                            self.err(name.span, "only one type can be the `return_code`");
                        }
                        return_code = Some(rc);
                    }
                }
                Item::Enum { name, repr, variants } => self.enum_decl(name, repr.as_ref(), variants),
                Item::Errors { ty, entries } => error_items.push((ty, entries)),
                Item::Utility { side, decl } => self.utility_decl(side, decl),
                Item::Alias { name, target, per_thread_stream } => {
                    self.aliases.push((name.clone(), target.clone(), per_thread_stream.clone()))
                }
                Item::Function(_) => {}
            }
        }
        if self.api_name.is_none() {
            self.err(Span::default(), "the spec has no `api <name>;` declaration");
        }
        for k in std::mem::take(&mut self.handle_uses) {
            if !self.handle_kinds.contains_key(&k.name) {
                self.err(
                    k.span,
                    format!("handle kind `{}` is not declared: add `@id(<n>) handle_kind {};`", k.name, k.name),
                );
            }
        }
        // Error tables come last so that their names can be checked against the return code.
        let Some(ReturnCodeDecl { ty: rc_name, rust, success, not_supported, failures }) = return_code else {
            self.err(Span::default(), "no type is declared `return_code`; functions need a status type");
            return;
        };
        let mut entries: Vec<ErrorEntry> = Vec::new();
        let mut codes = BTreeSet::new();
        for (ty, items) in error_items {
            if ty.name != rc_name.name {
                self.err(
                    ty.span,
                    format!("errors are declared for `{}` but the return code type is `{}`", ty.name, rc_name.name),
                );
            }
            for e in items {
                if !codes.insert(e.code) {
                    self.err(e.name.span, format!("error code {} listed twice", e.code));
                }
                if self.constants.insert(e.name.name.clone(), e.code).is_some() {
                    self.err(e.name.span, format!("`{}` is already defined", e.name.name));
                }
                entries.push(ErrorEntry {
                    name: e.name.name.clone(),
                    code: e.code,
                    text: e.text.clone(),
                    abi_texts: e.abi_texts.clone(),
                });
            }
        }
        let need = |id: Option<Ident>, what: &str, cx: &mut Self| -> String {
            match id {
                Some(id) => {
                    if !entries.iter().any(|e| e.name == id.name) {
                        cx.err(id.span, format!("`{}` is not in the errors table", id.name));
                    }
                    id.name
                }
                None => {
                    cx.err(rc_name.span, format!("the return code type needs `{what}(<error>);`"));
                    String::new()
                }
            }
        };
        let success = need(success, "success", self);
        let not_supported = need(not_supported, "not_supported", self);
        let failure = |reason: &str, cx: &mut Self| {
            let given = failures.iter().find(|(r, _)| r.name == reason).map(|(_, e)| e.clone());
            need(given, reason, cx)
        };
        let failures = Failures {
            invalid_value: failure("invalid_value", self),
            internal_error: failure("internal_error", self),
            no_device: failure("no_device", self),
            session_lost: failure("session_lost", self),
        };
        for e in exhausted_errors {
            need(Some(e), "exhausted", self);
        }
        let rust_type = match rust {
            Some(r) => r.name,
            None => {
                self.err(rc_name.span, "name the Rust type of the status: `return_code(<RustName>);`");
                String::new()
            }
        };
        self.errors =
            Some(ErrorTable { ty: rc_name.name.clone(), rust_type, success, not_supported, failures, entries });
    }

    /// Returns the return-code declaration when this is it.
    fn type_decl(&mut self, name: &Ident, descs: &[TypeDesc]) -> Option<ReturnCodeDecl> {
        let mut kind: Option<TypeKind> = None;
        let mut int_handle = false;
        let mut is_rc = false;
        let mut rust = None;
        let (mut success, mut not_supported) = (None, None);
        let mut failures: Vec<(Ident, Ident)> = Vec::new();
        for d in descs {
            let k = match d {
                TypeDesc::Handle(k) => {
                    self.handle_uses.push(k.clone());
                    Some(TypeKind::Handle(k.name.clone()))
                }
                TypeDesc::IntHandle(k) => {
                    self.handle_uses.push(k.clone());
                    int_handle = true;
                    Some(TypeKind::Handle(k.name.clone()))
                }
                TypeDesc::Scalar(s) => match Scalar::from_name(&s.name) {
                    Some(sc) if !sc.is_float() => Some(TypeKind::Scalar(sc)),
                    _ => {
                        self.err(s.span, format!("`{}` is not an integer type (i8..u64)", s.name));
                        None
                    }
                },
                TypeDesc::Pod { wire, size } => Some(TypeKind::Pod { wire: wire.name.clone(), size: *size as u64 }),
                TypeDesc::AbiStruct(w) => Some(TypeKind::AbiStruct(w.name.clone())),
                TypeDesc::Struct => Some(TypeKind::Struct),
                TypeDesc::ReturnCode(r) => {
                    is_rc = true;
                    rust = r.clone();
                    None
                }
                TypeDesc::Failure { reason, error } => {
                    failures.push((reason.clone(), error.clone()));
                    None
                }
                TypeDesc::Success(s) => {
                    success = Some(s.clone());
                    None
                }
                TypeDesc::NotSupported(s) => {
                    not_supported = Some(s.clone());
                    None
                }
            };
            if let Some(k) = k {
                if kind.is_some() {
                    self.err(name.span, format!("type `{}` is given two kinds", name.name));
                }
                kind = Some(k);
            }
        }
        match kind {
            Some(kind) => {
                if self
                    .types
                    .insert(name.name.clone(), NamedType { name: name.name.clone(), kind, int_handle })
                    .is_some()
                {
                    self.err(name.span, format!("type `{}` declared twice", name.name));
                }
            }
            None => self.err(
                name.span,
                format!("type `{}` needs one of handle(..), enum(..), pod(..), abi_struct(..)", name.name),
            ),
        }
        if is_rc {
            if !matches!(self.types.get(&name.name).map(|t| &t.kind), Some(TypeKind::Scalar(Scalar::I32))) {
                self.err(name.span, "the return code type must be `enum(i32)`");
            }
            return Some(ReturnCodeDecl { ty: name.clone(), rust, success, not_supported, failures });
        }
        if success.is_some() || not_supported.is_some() || !failures.is_empty() {
            self.err(
                name.span,
                "`success`, `not_supported` and the failure errors only apply to the `return_code` type",
            );
        }
        None
    }

    fn enum_decl(&mut self, name: &Ident, repr: Option<&Ident>, variants: &[(Ident, i64)]) {
        let repr = match repr {
            None => Scalar::I32,
            Some(r) => match Scalar::from_name(&r.name) {
                Some(s) if !s.is_float() => s,
                _ => {
                    self.err(r.span, format!("`{}` is not an integer type", r.name));
                    Scalar::I32
                }
            },
        };
        if self.types.contains_key(&name.name) {
            self.err(name.span, format!("type `{}` declared twice", name.name));
        }
        self.types.insert(
            name.name.clone(),
            NamedType { name: name.name.clone(), kind: TypeKind::Scalar(repr), int_handle: false },
        );
        for (v, value) in variants {
            if self.constants.insert(v.name.clone(), *value).is_some() {
                self.err(v.span, format!("constant `{}` defined twice", v.name));
            }
        }
        self.enums.push(EnumDef {
            name: name.name.clone(),
            repr,
            variants: variants.iter().map(|(n, v)| (n.name.clone(), *v)).collect(),
        });
    }

    fn utility_decl(&mut self, side: &Ident, decl: &Prototype) {
        let side = match side.name.as_str() {
            "guest" => UtilitySide::Guest,
            other => {
                self.err(side.span, format!("unknown utility side `{other}` (expected `guest`)"));
                UtilitySide::Guest
            }
        };
        if self.utilities.contains_key(&decl.name.name) {
            self.err(decl.name.span, format!("utility `{}` declared twice", decl.name.name));
        }
        self.utilities.insert(
            decl.name.name.clone(),
            Utility { side, name: decl.name.name.clone(), ret: decl.ret.clone(), params: decl.params.clone() },
        );
    }

    // -----------------------------------------------------------------------------------------
    // Types
    // -----------------------------------------------------------------------------------------

    fn scalar_of_base(&self, base: &BaseType) -> Option<Scalar> {
        Some(match base {
            BaseType::Bool => Scalar::Bool,
            BaseType::Char | BaseType::SignedChar => Scalar::I8,
            BaseType::UnsignedChar => Scalar::U8,
            BaseType::Short => Scalar::I16,
            BaseType::UnsignedShort => Scalar::U16,
            BaseType::Int => Scalar::I32,
            BaseType::UnsignedInt => Scalar::U32,
            BaseType::Long | BaseType::LongLong => Scalar::I64,
            BaseType::UnsignedLong | BaseType::UnsignedLongLong | BaseType::SizeT => Scalar::U64,
            BaseType::Float => Scalar::F32,
            BaseType::Double => Scalar::F64,
            BaseType::Void => return None,
            BaseType::Named(n) => match &self.types.get(n)?.kind {
                TypeKind::Scalar(s) => *s,
                _ => return None,
            },
        })
    }

    /// Checks that every named type in `ty` is declared.
    fn check_type(&mut self, ty: &CType) -> bool {
        if let BaseType::Named(n) = &ty.base
            && !self.types.contains_key(n)
        {
            self.err(ty.span, format!("unknown type `{n}`: declare it with `type({n}) {{ ... }}` or an `enum`"));
            return false;
        }
        true
    }

    /// The value type of a non-pointer argument.
    fn value_type(&mut self, ty: &CType, span: Span, name: &str) -> Option<ValueType> {
        if let Some(s) = self.scalar_of_base(&ty.base) {
            return Some(ValueType::Scalar(s));
        }
        match &ty.base {
            BaseType::Named(n) => match self.types.get(n).map(|t| t.kind.clone()) {
                Some(TypeKind::Handle(k)) => Some(ValueType::Handle(k)),
                Some(TypeKind::Pod { wire, .. }) => Some(ValueType::Pod(wire)),
                Some(TypeKind::AbiStruct(_)) => {
                    self.err(span, format!("`{name}`: ABI structs can only be passed by pointer"));
                    None
                }
                _ => None,
            },
            _ => {
                self.err(span, format!("`{name}` has type void"));
                None
            }
        }
    }

    /// The element type a pointer points to, for element-wise descriptors.
    fn elem_type(&mut self, pointee: &CType, device: bool, span: Span, name: &str) -> Option<ElemType> {
        if device {
            if !pointee.is_pointer() {
                self.err(span, format!("`{name}`: `device_pointer` on an element needs a pointer-to-pointer argument"));
                return None;
            }
            return Some(ElemType::DevicePtr);
        }
        if pointee.is_pointer() {
            self.err(
                span,
                format!("`{name}` points to a pointer: say what it is with `element {{ device_pointer; }}`"),
            );
            return None;
        }
        if let Some(s) = self.scalar_of_base(&pointee.base) {
            return Some(ElemType::Scalar(s));
        }
        match &pointee.base {
            BaseType::Named(n) => match self.types.get(n).map(|t| t.kind.clone()) {
                Some(TypeKind::Handle(k)) => Some(ElemType::Handle(k)),
                Some(TypeKind::Pod { wire, .. }) => Some(ElemType::Pod(wire)),
                Some(TypeKind::AbiStruct(w)) => Some(ElemType::Abi(n.clone(), w)),
                _ => None,
            },
            _ => {
                self.err(span, format!("`{name}` points to void: give it a `buffer(<bytes>)`"));
                None
            }
        }
    }

    /// sizeof for a C type in a buffer element or `sizeof(...)` expression.
    fn size_of(&mut self, ty: &CType) -> Option<u64> {
        if ty.is_pointer() {
            return Some(8);
        }
        if let Some(s) = self.scalar_of_base(&ty.base) {
            return Some(s.size());
        }
        match &ty.base {
            BaseType::Void => Some(1),
            BaseType::Named(n) => match self.types.get(n).map(|t| t.kind.clone()) {
                Some(TypeKind::Handle(_)) => Some(8),
                Some(TypeKind::Pod { size, .. }) => Some(size),
                _ => {
                    self.err(ty.span, format!("the size of `{n}` is not known to the spec"));
                    None
                }
            },
            _ => None,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Functions
    // -----------------------------------------------------------------------------------------

    fn check_functions(&mut self, spec: &SpecFile) -> Vec<Function> {
        let mut out: Vec<Function> = Vec::new();
        let mut seen = BTreeSet::new();
        let given = spec.items.iter().filter_map(|item| match item {
            Item::Function(f) => f.attrs.iter().find(|a| a.name.name == "id").map(|a| a.value),
            _ => None,
        });
        let async_given = spec.items.iter().filter_map(|item| match item {
            Item::Function(f) => f.attrs.iter().find(|a| a.name.name == "async_id").map(|a| a.value),
            _ => None,
        });
        let max = given.chain(async_given).chain(self.retired.keys().map(|&id| i128::from(id))).max();
        self.next_free_id = max.map_or(0, |m| u32::try_from(m + 1).unwrap_or(u32::MAX));
        for item in &spec.items {
            let Item::Function(f) = item else { continue };
            if !seen.insert(f.proto.name.name.clone()) {
                self.err(f.proto.name.span, format!("function `{}` declared twice", f.proto.name.name));
                continue;
            }
            if let Some(other) = out
                .iter()
                .find(|o| camel(&o.name) == camel(&f.proto.name.name) || snake(&o.name) == snake(&f.proto.name.name))
            {
                self.err(
                    f.proto.name.span,
                    format!("`{}` and `{}` would get the same generated name", other.name, f.proto.name.name),
                );
                continue;
            }
            let Some(id) = self.function_id(f, &out) else { continue };
            if let Some(mut func) = self.function(f, id) {
                func.async_id = self.async_id(f, &func, &out);
                out.push(func);
            }
        }
        let aliases = std::mem::take(&mut self.aliases);
        for (name, target, per_thread) in aliases {
            if let Some(c) = &per_thread
                && !self.constants.contains_key(&c.name)
            {
                self.err(c.span, format!("`{}` is not a constant (an enum value) of the spec", c.name));
            }
            if seen.contains(&name.name) {
                self.err(name.span, format!("alias `{}` is also declared as a function", name.name));
            }
            match out.iter_mut().find(|f| f.name == target.name) {
                Some(f) if !f.internal => match per_thread {
                    Some(c) => {
                        if f.per_thread_stream.as_ref().is_some_and(|other| *other != c.name) {
                            self.err(c.span, format!("`{}`'s per-thread aliases name different constants", f.name));
                        }
                        f.per_thread_stream = Some(c.name.clone());
                        f.per_thread_aliases.push(name.name.clone())
                    }
                    None => f.aliases.push(name.name.clone()),
                },
                Some(_) => self.err(target.span, "internal functions are not exported and cannot have aliases"),
                None => self.err(target.span, format!("alias of unknown function `{}`", target.name)),
            }
        }
        out
    }

    /// The function's wire id from its `@id(N)`: unique, and never a retired one.
    fn function_id(&mut self, f: &FunctionDecl, earlier: &[Function]) -> Option<u32> {
        let name = &f.proto.name;
        let found = self.attrs(&f.attrs, &["id", "async_id"], &[], "a function", name.span);
        let Some(attr) = found.get("id") else {
            let next = self.next_free_id;
            self.err(
                name.span,
                format!("`{}` has no wire id: write `@id({next})` before it (the next id never used)", name.name),
            );
            return None;
        };
        let id: u32 = self.attr_value(Some(attr), 0..=i128::from(u32::MAX), "a function id")?;
        if let Some(other) = earlier.iter().find(|g| g.id == id || g.async_id == Some(id)) {
            let other = other.name.clone();
            self.err(attr.1, format!("function id {id} is already `{other}`'s"));
            return None;
        }
        if let Some((old, _)) = self.retired.get(&id) {
            let old = old.clone();
            self.err(
                attr.1,
                format!("function id {id} was `{old}`'s and is retired: ids are never given again; take a new one"),
            );
            return None;
        }
        Some(id)
    }

    /// The function's async wire id from its `@async_id(N)`, if it has one: unique like an
    /// id, and only on a carried, synchronous function whose reply is empty and whose first
    /// argument is a handle (the handle its failure is deferred to).
    fn async_id(&mut self, f: &FunctionDecl, func: &Function, earlier: &[Function]) -> Option<u32> {
        let attr = *f.attrs.iter().find(|a| a.name.name == "async_id").map(|a| (a.value, a.span)).as_ref()?;
        let id: u32 = self.attr_value(Some(&attr), 0..=i128::from(u32::MAX), "a function id")?;
        let name = &func.name;
        if id == func.id {
            self.err(attr.1, format!("`{name}`'s async id must differ from its id"));
            return None;
        }
        if let Some(other) = earlier.iter().find(|g| g.id == id || g.async_id == Some(id)) {
            let other = other.name.clone();
            self.err(attr.1, format!("function id {id} is already `{other}`'s"));
            return None;
        }
        if let Some((old, _)) = self.retired.get(&id) {
            let old = old.clone();
            self.err(
                attr.1,
                format!("function id {id} was `{old}`'s and is retired: ids are never given again; take a new one"),
            );
            return None;
        }
        let handle_first = func
            .args
            .first()
            .is_some_and(|a| a.contextual.is_none() && matches!(a.class, ArgClass::Value(ValueType::Handle(_))));
        let reply_empty = func.args.iter().all(|a| match a.wire() {
            WireRepr::Reply(_) | WireRepr::Both => false,
            WireRepr::Chosen { has_out } => !has_out,
            _ => true,
        });
        if func.exec != Exec::Remote || func.internal || func.is_async || !handle_first || !reply_empty {
            self.err(
                attr.1,
                format!(
                    "`@async_id` is for exported, carried, synchronous functions whose first argument is a handle and whose reply is empty; `{name}` is not one"
                ),
            );
            return None;
        }
        Some(id)
    }

    fn function(&mut self, f: &FunctionDecl, id: u32) -> Option<Function> {
        let name = f.proto.name.name.clone();
        let line = line_col(self.source, f.span.start).0;
        let errors_before = self.diags.len();

        // Function-level descriptors, flattened with their conditions.
        let mut exec = Exec::Remote;
        let (mut internal, mut is_async, mut sync, mut global_record) = (false, false, false, false);
        let mut device_output = false;
        let mut success = None;
        let mut on_success = None;
        let mut fast_path = None;
        let mut when_live: Option<(Vec<Ident>, Span)> = None;
        let mut contextual: Vec<(CType, Ident, Expr)> = Vec::new();
        let mut preconds: Vec<(Expr, Ident)> = Vec::new();
        let mut rcs: Vec<(Option<Expr>, Ident, Ident, Amount)> = Vec::new();
        let mut arg_blocks: BTreeMap<String, (Ident, Vec<ValDesc>)> = BTreeMap::new();

        let mut stack: Vec<(Option<Expr>, &[FnDesc])> = vec![(None, &f.body)];
        while let Some((cond, descs)) = stack.pop() {
            for d in descs {
                match d {
                    FnDesc::Flag(w) => match w.name.as_str() {
                        "sync" => sync = true,
                        "async" => is_async = true,
                        "internal" => internal = true,
                        "unsupported" => exec = Exec::Unsupported,
                        "obj_record" => global_record = true,
                        "device_output" => device_output = true,
                        other => self.err(
                            w.span,
                            format!("unknown function descriptor `{other}` (expected one of {})", FN_FLAGS.join(", ")),
                        ),
                    },
                    FnDesc::Success(e) => success = Some(e.clone()),
                    FnDesc::Resource { op, resource, amount } => {
                        rcs.push((cond.clone(), op.clone(), resource.clone(), amount.clone()))
                    }
                    FnDesc::Contextual { ty, name, value } => {
                        if cond.is_some() {
                            self.err(name.span, "contextual arguments cannot be conditional");
                        }
                        contextual.push((ty.clone(), name.clone(), value.clone()));
                    }
                    FnDesc::Precondition { cond: c, error } => {
                        let c = match &cond {
                            // A precondition under `if (x)` holds as `!x || c`.
                            Some(outer) => Expr::Binary(
                                BinOp::Or,
                                Box::new(Expr::Unary(UnOp::Not, Box::new(outer.clone()), outer.span())),
                                Box::new(c.clone()),
                                c.span(),
                            ),
                            None => c.clone(),
                        };
                        preconds.push((c, error.clone()));
                    }
                    FnDesc::ImplementedBy(side) => match side.name.as_str() {
                        "guest" => exec = Exec::Guest,
                        other => {
                            self.err(side.span, format!("unknown implementation side `{other}` (expected `guest`)"))
                        }
                    },
                    FnDesc::OnSuccess(h) => on_success = Some(h.name.clone()),
                    FnDesc::FastPath(h) => fast_path = Some(h.clone()),
                    FnDesc::AsyncWhenLive(names, span) => {
                        if cond.is_some() {
                            self.err(*span, "`async_when_live` cannot be conditional");
                        }
                        when_live = Some((names.clone(), *span));
                    }
                    FnDesc::Argument { name: an, descs } => {
                        if cond.is_some() {
                            self.err(an.span, "argument blocks cannot sit inside a function-level `if`; put the `if` inside the argument block");
                        }
                        if arg_blocks.insert(an.name.clone(), (an.clone(), descs.clone())).is_some() {
                            self.err(an.span, format!("argument `{}` is described twice", an.name));
                        }
                    }
                    FnDesc::If { cond: c, then, els } => {
                        let and = |outer: &Option<Expr>, inner: Expr| match outer {
                            Some(o) => {
                                Expr::Binary(BinOp::And, Box::new(o.clone()), Box::new(inner.clone()), inner.span())
                            }
                            None => inner,
                        };
                        stack.push((Some(and(&cond, c.clone())), then));
                        let not = Expr::Unary(UnOp::Not, Box::new(c.clone()), c.span());
                        stack.push((Some(and(&cond, not)), els));
                    }
                }
            }
        }
        // The stack visits nested blocks after their parents; keep spec order for the rest.
        if sync && is_async {
            self.err(f.proto.name.span, "a function cannot be both `sync` and `async`");
        }
        if is_async && success.is_none() {
            self.err(
                f.proto.name.span,
                "an `async` function needs `success(<value>)`: what the guest returns before the call completes",
            );
        }

        // Types of the prototype. An unsupported function's parameters are never read (its
        // export takes none), so their types need no declaration.
        self.check_type(&f.proto.ret);
        if exec != Exec::Unsupported {
            for p in &f.proto.params {
                self.check_type(&p.ty);
            }
        }
        let rc_ty = self.errors.as_ref().map(|e| e.ty.clone()).unwrap_or_default();
        let returns_rc = matches!(&f.proto.ret.base, BaseType::Named(n) if *n == rc_ty) && !f.proto.ret.is_pointer();
        if exec != Exec::Guest && !returns_rc {
            self.err(f.proto.ret.span, format!("`{name}` must return `{rc_ty}` unless it is `implemented_by(guest)`"));
        }
        if internal && exec != Exec::Remote {
            self.err(f.proto.name.span, "an `internal` function exists only to be called remotely");
        }

        // Arguments.
        let mut args: Vec<Arg> = Vec::new();
        let mut objects = ObjectRules { global_record, ..Default::default() };
        let param_names: BTreeSet<&str> = f.proto.params.iter().map(|p| p.name.name.as_str()).collect();
        for (_, cname, _) in &contextual {
            if param_names.contains(cname.name.as_str()) {
                self.err(cname.span, format!("contextual argument `{}` shadows a parameter", cname.name));
            }
        }
        for (an, (ident, _)) in &arg_blocks {
            if !param_names.contains(an.as_str()) && !contextual.iter().any(|(_, c, _)| c.name == *an) {
                self.err(ident.span, format!("`{an}` is not a parameter or contextual argument of `{name}`"));
            }
        }

        if let Some(h) = &fast_path
            && (exec != Exec::Remote || internal)
        {
            self.err(h.span, "`fast_path` is for exported functions carried to the server");
        }
        let fast_path = fast_path.map(|h| h.name);
        if let Some((_, span)) = &when_live
            && (exec != Exec::Remote || !is_async)
        {
            self.err(*span, "`async_when_live` is for `async` functions carried to the server");
        }
        if exec == Exec::Guest || exec == Exec::Unsupported {
            if !arg_blocks.is_empty() || !contextual.is_empty() {
                let span = arg_blocks.values().next().map(|(i, _)| i.span).unwrap_or(f.proto.name.span);
                self.err(span, "functions not carried to the server take no argument descriptors");
            }
            // Their parameters still need known types for the export's signature.
            if self.diags.len() > errors_before {
                return None;
            }
            return Some(Function {
                id,
                name,
                line,
                ret: f.proto.ret.clone(),
                params: f.proto.params.clone(),
                exec,
                internal,
                is_async,
                async_id: None,
                device_output,
                success,
                args,
                preconditions: Vec::new(),
                resources: Vec::new(),
                on_success,
                fast_path,
                async_when_live: Vec::new(),
                aliases: Vec::new(),
                per_thread_aliases: Vec::new(),
                per_thread_stream: None,
                objects,
            });
        }

        let all: Vec<(CType, Ident, Option<Expr>)> = f
            .proto
            .params
            .iter()
            .map(|p| (p.ty.clone(), p.name.clone(), None))
            .chain(contextual.iter().map(|(t, n, v)| (t.clone(), n.clone(), Some(v.clone()))))
            .collect();
        for (ty, ident, value) in &all {
            if value.is_some() {
                self.check_type(ty);
            }
            let block = arg_blocks.get(&ident.name).map(|(_, d)| d.as_slice()).unwrap_or(&[]);
            let class = self.classify(ty, ident, block, &mut objects);
            if let Some(class) = class {
                args.push(Arg { name: ident.name.clone(), ty: ty.clone(), contextual: value.clone(), class });
            }
        }
        if self.diags.len() > errors_before {
            return None;
        }

        // Expressions, now that every argument has a class.
        let mut func = Function {
            id,
            name: name.clone(),
            line,
            ret: f.proto.ret.clone(),
            params: f.proto.params.clone(),
            exec,
            internal,
            is_async,
            async_id: None,
            device_output,
            success: success.clone(),
            args,
            preconditions: Vec::new(),
            resources: Vec::new(),
            on_success,
            fast_path,
            async_when_live: Vec::new(),
            aliases: Vec::new(),
            per_thread_aliases: Vec::new(),
            per_thread_stream: None,
            objects,
        };
        if let Some((names, span)) = &when_live {
            func.async_when_live = self.when_live(&func, names, *span);
        }
        // Contextual values: guest-side, each may use parameters and earlier contextual values.
        for (i, (_, cname, value)) in contextual.iter().enumerate() {
            let visible: Vec<String> = f
                .proto
                .params
                .iter()
                .map(|p| p.name.name.clone())
                .chain(contextual[..i].iter().map(|(_, n, _)| n.name.clone()))
                .collect();
            if let Some((ty, _)) = self.expr(value, &func, Some(&visible)) {
                let arg = func.arg(&cname.name).expect("classified");
                let is_bool = matches!(arg.class, ArgClass::Value(ValueType::Scalar(Scalar::Bool)));
                if (ty == Ty::Bool) != is_bool {
                    self.err(value.span(), format!("`{}` is given a value of the wrong kind", cname.name));
                }
            }
        }
        if let Some(s) = &success {
            self.want(s, &func, Ty::Int, false, "success value");
        }
        for (c, e) in &preconds {
            let reach = self.want(c, &func, Ty::Bool, false, "precondition");
            if !self.constants.contains_key(&e.name)
                || !self.errors.as_ref().is_some_and(|t| t.entries.iter().any(|x| x.name == e.name))
            {
                self.err(e.span, format!("`{}` is not an error of the errors table", e.name));
            }
            func.preconditions.push(Precondition {
                cond: c.clone(),
                error: e.name.clone(),
                wire_checkable: reach.is_some_and(|r| r.wire),
            });
        }
        // Shape conditions and sizes are evaluated on the server too, so they may only use
        // values that travel on the wire.
        let shape_exprs: Vec<(Expr, Ty, &'static str)> = func
            .args
            .iter()
            .flat_map(|a| match &a.class {
                ArgClass::Pointer(branches) => branches
                    .iter()
                    .flat_map(|b| {
                        let mut v = Vec::new();
                        if let Some(c) = &b.cond {
                            v.push((c.clone(), Ty::Bool, "argument condition"));
                        }
                        match &b.shape {
                            Shape::Device { extent: Some(e), .. } => v.push((e.clone(), Ty::Int, "device extent")),
                            Shape::In { count, .. } | Shape::Out { count, .. } | Shape::InOut { count, .. } => {
                                v.push((count.clone(), Ty::Int, "buffer size"))
                            }
                            _ => {}
                        }
                        v
                    })
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        for (e, ty, what) in shape_exprs {
            self.want(&e, &func, ty, true, what);
        }
        for (cond, op, resource, amount) in rcs {
            let op_kind = match op.name.as_str() {
                "allocates_rc" => RcOp::Allocates,
                "deallocates_rc" => RcOp::Deallocates,
                _ => RcOp::Consumes,
            };
            match self.resources.get(&resource.name) {
                None => self.err(
                    resource.span,
                    format!(
                        "unknown resource `{}`; declare it with continuous_rc/instantaneous_rc/measured_rc",
                        resource.name
                    ),
                ),
                Some(r) => {
                    let ok = match op_kind {
                        RcOp::Consumes => r.kind != ResourceKind::Continuous,
                        _ => r.kind == ResourceKind::Continuous,
                    };
                    let measured_amount = matches!(amount, Amount::Measured(_));
                    if r.kind == ResourceKind::Measured && !measured_amount {
                        self.err(
                            resource.span,
                            format!("resource `{}` is measured by the server: its amount is `measured`", resource.name),
                        );
                    }
                    if !ok {
                        self.err(
                            op.span,
                            format!("`{}` does not apply to resource `{}` of the other kind", op.name, resource.name),
                        );
                    }
                }
            }
            if let Some(c) = &cond {
                self.want(c, &func, Ty::Bool, true, "resource condition");
            }
            let amount = match amount {
                Amount::Expr(e) => {
                    self.want(&e, &func, Ty::Int, true, "resource amount");
                    Some(e)
                }
                Amount::Reported(span) => {
                    if op_kind != RcOp::Deallocates {
                        self.err(span, "only `deallocates_rc` can take a `reported` amount");
                    }
                    None
                }
                Amount::Measured(span) => {
                    if self.resources.get(&resource.name).is_some_and(|r| r.kind != ResourceKind::Measured) {
                        self.err(span, "only a `measured_rc` resource can take a `measured` amount");
                    }
                    None
                }
            };
            func.resources.push(ResourceUse { cond, op: op_kind, resource: resource.name.clone(), amount });
        }
        if self.diags.len() > errors_before {
            return None;
        }
        Some(func)
    }

    /// The handles of `async_when_live(...)`: each a handle parameter, and the call's other
    /// arguments values that can be compared (integers and handles), since the proof is a
    /// successful call with the same ones.
    fn when_live(&mut self, func: &Function, names: &[Ident], span: Span) -> Vec<String> {
        let mut handles = Vec::new();
        for n in names {
            match func.arg(&n.name) {
                Some(a) if a.contextual.is_none() && matches!(a.class, ArgClass::Value(ValueType::Handle(_))) => {
                    if handles.contains(&n.name) {
                        self.err(n.span, format!("`{}` is named twice", n.name));
                    }
                    handles.push(n.name.clone());
                }
                _ => self.err(n.span, format!("`{}` is not a handle parameter of `{}`", n.name, func.name)),
            }
        }
        for a in &func.args {
            let comparable = match &a.class {
                ArgClass::Value(ValueType::Handle(_)) => true,
                ArgClass::Value(ValueType::Scalar(s)) => !matches!(s, Scalar::F32 | Scalar::F64),
                _ => false,
            };
            if !comparable {
                self.err(
                    span,
                    format!(
                        "`async_when_live` takes calls whose arguments are integers and handles; `{}` of `{}` is not one",
                        a.name, func.name
                    ),
                );
            }
        }
        handles
    }

    /// Work out how one argument travels.
    fn classify(
        &mut self,
        ty: &CType,
        ident: &Ident,
        descs: &[ValDesc],
        objects: &mut ObjectRules,
    ) -> Option<ArgClass> {
        let name = ident.name.as_str();
        let paths = flatten(descs);
        let has_local = paths.iter().any(|(_, d)| d.iter().any(|d| matches!(d, ValDesc::Flag(f) if f.name == "local")));
        if has_local {
            if paths.len() > 1 || paths[0].1.len() > 1 {
                self.err(ident.span, format!("`{name}` is `local`: it takes no other descriptor"));
            }
            return Some(ArgClass::Local);
        }
        // Object descriptors on the argument itself (not inside `element`).
        for (_, path) in &paths {
            for d in path {
                if let ValDesc::Flag(f) = d
                    && !VAL_FLAGS.contains(&f.name.as_str())
                {
                    self.err(f.span, format!("unknown value descriptor `{}` (expected one of {}, buffer, device_pointer, element, obj_depends_on)", f.name, VAL_FLAGS.join(", ")));
                }
            }
        }
        let kind_of = |cx: &Self, t: &CType| -> String {
            match &t.base {
                BaseType::Named(n) => match cx.types.get(n).map(|t| &t.kind) {
                    Some(TypeKind::Handle(k)) if !t.is_pointer() => k.clone(),
                    _ => "device_memory".to_string(),
                },
                _ => "device_memory".to_string(),
            }
        };
        let first = &paths[0].1;
        let flag = |d: &[&ValDesc], w: &str| d.iter().any(|d| matches!(d, ValDesc::Flag(f) if f.name == w));
        if flag(first, "deallocate") {
            objects.destroys.push((name.to_string(), kind_of(self, ty)));
        }
        if flag(first, "obj_record") {
            objects.mutates.push((name.to_string(), kind_of(self, ty)));
        }

        if !ty.is_pointer() {
            for (_, path) in &paths {
                for d in path {
                    match d {
                        ValDesc::Flag(f) if ["in", "obj_record", "deallocate"].contains(&f.name.as_str()) => {}
                        ValDesc::Flag(f) => {
                            self.err(f.span, format!("`{}` applies to pointers; `{name}` is passed by value", f.name))
                        }
                        ValDesc::If { span, .. }
                        | ValDesc::Buffer(_, span)
                        | ValDesc::DevicePointer(_, span)
                        | ValDesc::Element(_, span) => {
                            self.err(*span, format!("`{name}` is passed by value and takes no pointer descriptors"))
                        }
                        ValDesc::DependsOn(i) => self.err(i.span, "`obj_depends_on` belongs in an `element` block"),
                    }
                }
            }
            return self.value_type(ty, ident.span, name).map(ArgClass::Value);
        }

        if descs.is_empty() {
            self.err(
                ident.span,
                format!("pointer argument `{name}` needs a description: in/out/inout with buffer(..) or element, device_pointer, string, opaque or local"),
            );
            return None;
        }
        let mut branches = Vec::new();
        let n = paths.len();
        for (i, (conds, path)) in paths.iter().enumerate() {
            let shape = self.shape(ty, ident, path, objects)?;
            let cond = if i + 1 == n { None } else { conjunction(conds) };
            branches.push(Branch { cond, shape });
        }
        if branches.len() > 1 && !branches.iter().all(|b| b.shape.is_buffer_like()) {
            self.err(
                ident.span,
                format!("`{name}`: conditions can only choose between device_pointer, in, out and inout buffers"),
            );
            return None;
        }
        Some(ArgClass::Pointer(branches))
    }

    fn shape(&mut self, ty: &CType, ident: &Ident, path: &[&ValDesc], objects: &mut ObjectRules) -> Option<Shape> {
        let name = ident.name.as_str();
        let flag = |w: &str| path.iter().any(|d| matches!(d, ValDesc::Flag(f) if f.name == w));
        let null_ok = flag("null_ok");
        let buffer = path.iter().find_map(|d| match d {
            ValDesc::Buffer(e, _) => Some(e.clone()),
            _ => None,
        });
        let device = path.iter().find_map(|d| match d {
            ValDesc::DevicePointer(e, s) => Some((e.clone(), *s)),
            _ => None,
        });
        let element = path.iter().find_map(|d| match d {
            ValDesc::Element(e, s) => Some((e.clone(), *s)),
            _ => None,
        });
        let dirs: Vec<&str> = ["in", "out", "inout"].into_iter().filter(|d| flag(d)).collect();
        if dirs.len() > 1 {
            self.err(ident.span, format!("`{name}` has more than one direction ({})", dirs.join(", ")));
            return None;
        }
        if let Some((extent, span)) = device {
            if !dirs.is_empty() || buffer.is_some() {
                self.err(span, format!("`{name}`: a device pointer is not copied, so it takes no direction or buffer"));
                return None;
            }
            return Some(Shape::Device { extent, null_ok });
        }
        if flag("string") {
            if !matches!(ty.pointee().base, BaseType::Char) || ty.pointers.len() != 1 {
                self.err(ident.span, format!("`{name}`: `string` needs a `char *`"));
                return None;
            }
            return Some(Shape::Str);
        }
        if flag("opaque") {
            return Some(Shape::Opaque);
        }
        let Some(dir) = dirs.first().copied() else {
            self.err(ident.span, format!("pointer argument `{name}` needs a direction (in, out or inout), device_pointer, string, opaque or local"));
            return None;
        };
        let pointee = ty.pointee();
        if let Some(count) = buffer {
            if element.is_some() {
                self.err(ident.span, format!("`{name}`: element descriptors on buffers are not supported"));
                return None;
            }
            let elem_size = self.size_of(&pointee)?;
            if dir != "in" && ty.is_const && ty.pointers.len() == 1 {
                self.err(ident.span, format!("`{name}` points to const data but is `{dir}`"));
            }
            return Some(match dir {
                "in" => Shape::In { count, elem_size, null_ok },
                "out" => Shape::Out { count, elem_size, null_ok },
                _ => Shape::InOut { count, elem_size, null_ok },
            });
        }
        // One element.
        let mut elem_device = false;
        if let Some((descs, _)) = &element {
            let mut allocate = false;
            let mut record = false;
            let mut deps = Vec::new();
            for d in descs {
                match d {
                    ValDesc::DevicePointer(None, _) => elem_device = true,
                    ValDesc::Flag(f) if f.name == "allocate" => allocate = true,
                    ValDesc::Flag(f) if f.name == "obj_record" => record = true,
                    ValDesc::DependsOn(o) => deps.push(o.clone()),
                    ValDesc::Flag(f) => self.err(f.span, format!("`{}` is not allowed in an element block", f.name)),
                    ValDesc::DevicePointer(Some(e), _) => {
                        self.err(e.span(), "an element device pointer takes no extent")
                    }
                    ValDesc::Buffer(_, s) | ValDesc::Element(_, s) | ValDesc::If { span: s, .. } => {
                        self.err(*s, "nested buffers, elements and conditions in an element block are not supported")
                    }
                }
            }
            if allocate || record {
                let kind = match &pointee.base {
                    BaseType::Named(n) if !pointee.is_pointer() => match self.types.get(n).map(|t| &t.kind) {
                        Some(TypeKind::Handle(k)) => k.clone(),
                        _ => "device_memory".into(),
                    },
                    _ => "device_memory".into(),
                };
                if dir != "out" {
                    self.err(ident.span, format!("`{name}`: only an `out` element can be created by the call"));
                }
                objects.creates.push((name.to_string(), kind));
            }
            for d in deps {
                objects.depends_on.push((name.to_string(), d.name.clone()));
            }
        }
        let elem = self.elem_type(&pointee, elem_device, ident.span, name)?;
        match dir {
            "out" => {
                if ty.is_const && ty.pointers.len() == 1 {
                    self.err(ident.span, format!("`{name}` points to const data but is `out`"));
                }
                Some(Shape::OutElement { elem, null_ok })
            }
            "in" => {
                if matches!(elem, ElemType::Abi(..)) {
                    self.err(ident.span, format!("`{name}`: ABI structs can only be `out` for now"));
                    return None;
                }
                Some(Shape::InElement(elem))
            }
            _ => {
                self.err(ident.span, format!("`{name}`: `inout` needs a `buffer(..)`"));
                None
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Expressions
    // -----------------------------------------------------------------------------------------

    /// Check an expression against the kind it must have; `wire` says it must be computable
    /// by the server. Returns where it can be evaluated.
    fn want(&mut self, e: &Expr, f: &Function, want: Ty, wire: bool, what: &str) -> Option<Reach> {
        let (ty, reach) = self.expr(e, f, None)?;
        if ty != want {
            self.err(e.span(), format!("{what} must be {}", if want == Ty::Bool { "a condition" } else { "a number" }));
        }
        if wire && !reach.wire {
            self.err(
                e.span(),
                format!("{what} is also checked by the server, so it may only use values that travel on the wire (by-value and contextual arguments, constants); compute it in a contextual_argument"),
            );
        }
        Some(reach)
    }

    fn expr(&mut self, e: &Expr, f: &Function, visible: Option<&[String]>) -> Option<(Ty, Reach)> {
        match e {
            Expr::Int(..) => Some((Ty::Int, Reach { wire: true })),
            Expr::SizeOf(t, _) => {
                if self.check_type(t) {
                    self.size_of(t)?;
                }
                Some((Ty::Int, Reach { wire: true }))
            }
            Expr::Name(id) => {
                if let Some(v) = visible
                    && !v.contains(&id.name)
                    && !self.constants.contains_key(&id.name)
                {
                    self.err(id.span, format!("`{}` is not visible here", id.name));
                    return None;
                }
                if self.constants.contains_key(&id.name) {
                    return Some((Ty::Int, Reach { wire: true }));
                }
                match f.arg(&id.name) {
                    Some(a) => {
                        if let ArgClass::Value(ValueType::Scalar(s)) = &a.class
                            && s.is_float()
                        {
                            self.err(id.span, "floating-point values cannot be used in spec expressions");
                            return None;
                        }
                        if let ArgClass::Value(ValueType::Pod(_)) = &a.class {
                            self.err(id.span, "structs cannot be used in spec expressions");
                            return None;
                        }
                        let ty = if matches!(a.class, ArgClass::Value(ValueType::Scalar(Scalar::Bool))) {
                            Ty::Bool
                        } else {
                            Ty::Int
                        };
                        Some((ty, Reach { wire: a.value_on_wire() }))
                    }
                    None => {
                        self.err(id.span, format!("unknown name `{}`", id.name));
                        None
                    }
                }
            }
            Expr::Unary(op, inner, _) => {
                let (t, r) = self.expr(inner, f, visible)?;
                let want = if *op == UnOp::Not { Ty::Bool } else { Ty::Int };
                if t != want {
                    self.err(
                        inner.span(),
                        format!(
                            "operand of `{}` has the wrong kind",
                            match op {
                                UnOp::Not => "!",
                                UnOp::Neg => "-",
                                UnOp::BitNot => "~",
                            }
                        ),
                    );
                }
                Some((want, r))
            }
            Expr::Binary(op, l, r, _) => {
                let (lt, lr) = self.expr(l, f, visible)?;
                let (rt, rr) = self.expr(r, f, visible)?;
                let reach = Reach { wire: lr.wire && rr.wire };
                let (operand, result) = match op {
                    BinOp::And | BinOp::Or => (Some(Ty::Bool), Ty::Bool),
                    BinOp::Eq | BinOp::Ne => (None, Ty::Bool),
                    BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => (Some(Ty::Int), Ty::Bool),
                    _ => (Some(Ty::Int), Ty::Int),
                };
                let ok = match operand {
                    Some(t) => lt == t && rt == t,
                    None => lt == rt,
                };
                if !ok {
                    self.err(e.span(), format!("operands of `{}` have the wrong kind", op.symbol()));
                }
                Some((result, reach))
            }
            Expr::Call(name, args, span) => {
                let Some(u) = self.utilities.get(&name.name).cloned() else {
                    self.err(
                        name.span,
                        format!("unknown utility `{}`; declare it with `utility(guest) ...;`", name.name),
                    );
                    return None;
                };
                if u.params.len() != args.len() {
                    self.err(*span, format!("`{}` takes {} arguments, not {}", u.name, u.params.len(), args.len()));
                }
                for a in args {
                    self.expr(a, f, visible)?;
                }
                let ty = if matches!(u.ret.base, BaseType::Bool) && !u.ret.is_pointer() { Ty::Bool } else { Ty::Int };
                Some((ty, Reach { wire: false }))
            }
        }
    }
}

/// Expand the `if`s in a descriptor list into paths: (conditions along the path, descriptors).
/// Paths are exhaustive and in order, so the last one needs no condition.
fn flatten(descs: &[ValDesc]) -> Vec<(Vec<Expr>, Vec<&ValDesc>)> {
    let mut paths: Vec<(Vec<Expr>, Vec<&ValDesc>)> = vec![(Vec::new(), Vec::new())];
    for d in descs {
        match d {
            ValDesc::If { cond, then, els, .. } => {
                let mut next = Vec::new();
                for (conds, ds) in &paths {
                    for (c2, d2) in flatten(then) {
                        let mut c = conds.clone();
                        c.push(cond.clone());
                        c.extend(c2);
                        let mut dd = ds.clone();
                        dd.extend(d2);
                        next.push((c, dd));
                    }
                    for (c2, d2) in flatten(els) {
                        let mut c = conds.clone();
                        c.push(Expr::Unary(UnOp::Not, Box::new(cond.clone()), cond.span()));
                        c.extend(c2);
                        let mut dd = ds.clone();
                        dd.extend(d2);
                        next.push((c, dd));
                    }
                }
                paths = next;
            }
            other => {
                for (_, ds) in &mut paths {
                    ds.push(other);
                }
            }
        }
    }
    paths
}

fn conjunction(conds: &[Expr]) -> Option<Expr> {
    let mut it = conds.iter().cloned();
    let first = it.next()?;
    Some(it.fold(first, |acc, c| {
        let span = Span::new(acc.span().start, c.span().end);
        Expr::Binary(BinOp::And, Box::new(acc), Box::new(c), span)
    }))
}

/// Parse and check in one go, with diagnostics rendered against the source.
pub fn load(path: &str, source: &str) -> Result<Api, crate::diag::SpecError> {
    let spec = crate::parse::parse_spec(source).map_err(|d| crate::diag::SpecError {
        path: path.into(),
        source: source.into(),
        diagnostics: vec![d],
    })?;
    check(&spec, source).map_err(|diagnostics| crate::diag::SpecError {
        path: path.into(),
        source: source.into(),
        diagnostics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRELUDE: &str = r#"
        @id(3) @version(1) api t;
        continuous_rc mem;
        instantaneous_rc launches;
        type(err_t) {
            enum(i32); return_code(Err); success(ok); not_supported(unsupported_err);
            invalid_value(bad); internal_error(bad); no_device(bad); session_lost(bad);
        }
        @id(7) handle_kind stream;
        type(stream_t) { handle(stream); }
        type(dim3) { pod(Dim3, 12); }
        enum kind_t { K_IN = 1, K_OUT = 2, K_DEV = 3 };
        errors err_t { ok = 0 "no error"; bad = 1 "invalid argument"; unsupported_err = 801 "not supported"; }
        utility(guest) int where_is(const void *p);
    "#;

    fn check_src(body: &str) -> Result<Api, String> {
        let src = format!("{PRELUDE}\n{body}");
        crate::load("t.lapis", &src).map_err(|e| e.to_string())
    }

    fn expect_error(body: &str, needle: &str) {
        match check_src(body) {
            Ok(_) => panic!("expected an error containing {needle:?}"),
            Err(e) => assert!(e.contains(needle), "error {e:?} does not mention {needle:?}"),
        }
    }

    #[test]
    fn unsupported_functions_need_no_parameter_types_but_a_status() {
        let api =
            check_src("@id(1) err_t f(cudaMystery_t x, struct other *y) { unsupported; }\ncoverage_note \"hello\";")
                .unwrap();
        assert_eq!(api.coverage_notes, ["hello"]);
        expect_error("@id(2) cudaMystery_t g(int x) { unsupported; }", "unknown type");
        expect_error("@id(3) err_t h(cudaMystery_t x) { }", "unknown type");
    }

    #[test]
    fn an_int_handle_is_a_handle_the_guest_passes_as_an_int() {
        let api = check_src(
            "@id(17) handle_kind plan;\ntype(plan_t) { int_handle(plan); }\n@id(1) err_t make(plan_t *p) { argument(p) { out; element { allocate; } } }\n@id(2) err_t run(plan_t p);",
        )
        .unwrap();
        let t = &api.types["plan_t"];
        assert_eq!((&t.kind, t.int_handle), (&TypeKind::Handle("plan".into()), true));
        let guest = crate::emit::guest::emit(&api);
        assert!(guest.contains("pub unsafe extern \"C\" fn run(p: i32)"), "{guest}");
        assert!(guest.contains("handle_tag::wire_of_int(::phos_protocol::apis::HandleKind::Plan, p)"), "{guest}");
        assert!(guest.contains("handle_tag::int_of_wire(::phos_protocol::apis::HandleKind::Plan, reply.p)"), "{guest}");
        expect_error("type(q_t) { int_handle(nowhere); }", "nowhere");
    }

    #[test]
    fn per_thread_aliases_need_the_per_thread_constant() {
        expect_error(
            "@id(1) err_t f(stream_t s);\nalias f_ptsz = f per_thread_stream(cudaStreamPerThread);",
            "cudaStreamPerThread",
        );
        let api = check_src(
            "enum special_t : u64 { cudaStreamPerThread = 2 };\n@id(1) err_t f(stream_t s);\nalias f_ptsz = f per_thread_stream(cudaStreamPerThread);\nalias g = f;",
        )
        .unwrap();
        let f = api.function("f").unwrap();
        assert_eq!(
            (f.aliases.as_slice(), f.per_thread_aliases.as_slice()),
            (&["g".to_string()][..], &["f_ptsz".to_string()][..])
        );
    }

    #[test]
    fn accepts_a_complete_function() {
        let api = check_src(
            r#"@id(4) err_t copy(void *dst, const void *src, size_t n, enum kind_t k, stream_t s) {
                async; success(ok);
                contextual_argument int w = where_is(dst);
                precondition(n > 0, bad);
                if (k == K_IN) { consumes_rc(launches, n); }
                argument(dst) { if (k == K_OUT) { out; buffer(n); } else { device_pointer(n); } }
                argument(src) { if (k == K_IN) { in; buffer(n); } else { device_pointer(n); } }
            }
            @id(5) err_t make(stream_t *s, void **p, size_t bytes) {
                allocates_rc(mem, bytes);
                argument(s) { out; element { allocate; obj_record; } }
                argument(p) { out; element { device_pointer; allocate; } }
            }"#,
        )
        .unwrap();
        let f = api.function("copy").unwrap();
        assert!(f.is_async);
        assert_eq!(f.args.len(), 6, "5 parameters and a contextual argument");
        assert!(matches!(f.args[0].wire(), WireRepr::Chosen { has_out: true }));
        assert!(matches!(f.args[1].wire(), WireRepr::Chosen { has_out: false }));
        assert!(f.preconditions[0].wire_checkable);
        let m = api.function("make").unwrap();
        assert_eq!(m.objects.creates, vec![("s".into(), "stream".into()), ("p".into(), "device_memory".into())]);
        assert_eq!(m.resources.len(), 1);
    }

    #[test]
    fn an_async_id_is_a_second_wire_id_of_a_synchronous_function() {
        let api = check_src(
            "@id(1) @async_id(9) err_t run(stream_t s, int n, void *p) { argument(p) { device_pointer(n); } }\n\
             @id(2) err_t other(stream_t s);",
        )
        .unwrap();
        let f = api.function("run").unwrap();
        assert_eq!((f.id, f.async_id, f.is_async), (1, Some(9), false));
        let facts = crate::wire_facts::WireFacts::of(&api);
        let ids: Vec<(u32, &str, bool)> = facts.functions.iter().map(|f| (f.id, f.name.as_str(), f.is_async)).collect();
        assert_eq!(ids, [(1, "run", false), (2, "other", false), (9, "run", true)]);
        assert_eq!(facts.functions[0].request, facts.functions[2].request, "the same layout under both ids");
        // The guest stub sends it through `call_deferred` with its handle.
        let guest = crate::emit::guest::emit(&api);
        assert!(guest.contains("rt::call_deferred(&req, s as usize as u64)?;"), "{guest}");
        // The wire id table maps both ids to the function.
        let wire = crate::emit::wire::emit(&api);
        assert!(wire.contains("async_id: Some(9),"), "{wire}");
    }

    #[test]
    fn a_hand_written_refusal_is_logged_by_its_function_but_not_by_the_last_error() {
        let api = check_src(
            "@id(0) err_t cudaGetLastError(void) { implemented_by(guest); }\n\
             @id(1) err_t cudaPeekAtLastError(void) { implemented_by(guest); }\n\
             @id(2) err_t launch(int n) { implemented_by(guest); }",
        )
        .unwrap();
        let guest = crate::emit::guest::emit(&api);
        let stub = |name: &str| {
            let start = guest.find(&format!("extern \"C\" fn {name}(")).unwrap_or_else(|| panic!("{name}: {guest}"));
            let end = guest[start..].find("\n}").map_or(guest.len(), |e| start + e);
            guest[start..end].to_string()
        };
        assert!(stub("launch").contains("log_refusal_once"), "{guest}");
        // They answer an earlier call's error, which that call named.
        assert!(!stub("cudaGetLastError").contains("log_refusal_once"), "{guest}");
        assert!(!stub("cudaPeekAtLastError").contains("log_refusal_once"), "{guest}");
    }

    #[test]
    fn an_async_id_is_only_for_what_can_go_without_waiting() {
        expect_error(
            "@id(1) @async_id(2) err_t f(stream_t s);\n@id(2) err_t g(stream_t s);",
            "function id 2 is already `f`'s",
        );
        expect_error("@id(1) @async_id(1) err_t f(stream_t s);", "must differ from its id");
        expect_error("@id(1) @async_id(5) err_t f(int n, stream_t s);", "`@async_id` is for");
        expect_error("@id(1) @async_id(5) err_t f(stream_t s, int *n) { argument(n) { out; } }", "`@async_id` is for");
        expect_error("@id(1) @async_id(5) err_t f(stream_t s) { async; success(ok); }", "`@async_id` is for");
        expect_error("@id(1) @async_id(5) err_t f(stream_t s) { implemented_by(guest); }", "`@async_id` is for");
        expect_error("@id(4) retired h;\n@id(1) @async_id(4) err_t f(stream_t s);", "is retired");
    }

    #[test]
    fn async_when_live_names_the_handles_a_destroy_forgets() {
        let api = check_src(
            "@id(1) err_t wait(stream_t s, stream_t other, unsigned int flags) { async; success(ok); async_when_live(s, other); }\n\
             @id(2) err_t destroy(stream_t s) { argument(s) { deallocate; } }",
        )
        .unwrap();
        assert_eq!(api.function("wait").unwrap().async_when_live, ["s", "other"]);
        let guest = crate::emit::guest::emit(&api);
        assert!(
            guest.contains("rt::call_when_live(&req, &[req.s, req.other], &[req.s, req.other, req.flags as u64])?;"),
            "{guest}"
        );
        assert!(guest.contains("rt::forget_live(s as usize as u64);"), "{guest}");
        // An API without the rule forgets nothing.
        let plain = check_src("@id(2) err_t destroy(stream_t s) { argument(s) { deallocate; } }").unwrap();
        assert!(!crate::emit::guest::emit(&plain).contains("forget_live"));
    }

    #[test]
    fn async_when_live_is_for_async_calls_of_handles_and_integers() {
        expect_error("@id(1) err_t f(stream_t s) { async_when_live(s); }", "`async_when_live` is for `async`");
        expect_error(
            "@id(1) err_t f(stream_t s) { implemented_by(guest); async; success(ok); async_when_live(s); }",
            "`async_when_live` is for `async`",
        );
        expect_error(
            "@id(1) err_t f(stream_t s, int n) { async; success(ok); async_when_live(n); }",
            "`n` is not a handle parameter",
        );
        expect_error(
            "@id(1) err_t f(stream_t s, void *p) { async; success(ok); async_when_live(s); argument(p) { device_pointer(4); } }",
            "`p` of `f` is not one",
        );
        expect_error(
            "@id(1) err_t f(stream_t s, float x) { async; success(ok); async_when_live(s); }",
            "`x` of `f` is not one",
        );
        expect_error("@id(1) err_t f(stream_t s) { async; success(ok); async_when_live(s, s); }", "named twice");
    }

    #[test]
    fn pointer_without_direction() {
        expect_error("@id(1) err_t f(void *p) { }", "pointer argument `p` needs a description");
        expect_error("@id(1) err_t f(int *p) { argument(p) { null_ok; } }", "needs a direction");
    }

    #[test]
    fn void_pointer_needs_a_buffer() {
        expect_error("@id(1) err_t f(void *p) { argument(p) { out; } }", "points to void");
    }

    #[test]
    fn fast_path_only_on_remote_functions() {
        let api = check_src("@id(1) err_t f(size_t n) { fast_path(quick); }").unwrap();
        assert_eq!(api.function("f").unwrap().fast_path.as_deref(), Some("quick"));
        expect_error(
            "@id(2) err_t g(size_t n) { implemented_by(guest); fast_path(quick); }",
            "`fast_path` is for exported",
        );
        expect_error("@id(3) err_t h(size_t n) { internal; fast_path(quick); }", "`fast_path` is for exported");
    }

    #[test]
    fn unknown_type() {
        expect_error("@id(1) err_t f(cudaMystery_t x) { }", "unknown type `cudaMystery_t`");
    }

    #[test]
    fn unknown_resource() {
        expect_error("@id(1) err_t f(size_t n) { consumes_rc(bandwidth, n); }", "unknown resource `bandwidth`");
    }

    #[test]
    fn resource_of_the_wrong_kind() {
        expect_error("@id(1) err_t f(size_t n) { consumes_rc(mem, n); }", "does not apply");
    }

    #[test]
    fn measured_resources_and_quota_errors() {
        let src = |decls: &str, body: &str| format!("{}\n{decls}\n{body}", PRELUDE.replace("continuous_rc mem;", ""));
        let api = crate::load(
            "t.lapis",
            &src(
                "continuous_rc mem exhausted(bad); measured_rc time;",
                "@id(6) err_t run(int n) { consumes_rc(launches, 1); consumes_rc(time, measured); }",
            ),
        )
        .unwrap();
        let mem = api.resources.iter().find(|r| r.name == "mem").unwrap();
        assert_eq!(mem.exhausted.as_deref(), Some("bad"));
        let time = api.resources.iter().find(|r| r.name == "time").unwrap();
        assert_eq!(time.kind, ResourceKind::Measured);
        assert_eq!(api.function("run").unwrap().resources.len(), 2);
        let fails = |decls: &str, body: &str, needle: &str| {
            let e = crate::load("t.lapis", &src(decls, body)).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} does not mention {needle:?}");
        };
        let measured = "continuous_rc mem; measured_rc time;";
        fails(measured, "@id(1) err_t f(int n) { consumes_rc(time, n); }", "its amount is `measured`");
        fails(measured, "@id(1) err_t f(int n) { consumes_rc(launches, measured); }", "only a `measured_rc`");
        fails(
            "continuous_rc mem; instantaneous_rc x exhausted(bad);",
            "",
            "only a `continuous_rc` resource can have a quota",
        );
        fails("continuous_rc mem exhausted(no_such_error);", "", "no_such_error");
    }

    #[test]
    fn async_needs_success() {
        expect_error("@id(1) err_t f(int a) { async; }", "needs `success(<value>)`");
    }

    #[test]
    fn unknown_descriptor_and_argument() {
        expect_error("@id(1) err_t f(int a) { frobnicate; }", "unknown function descriptor `frobnicate`");
        expect_error("@id(1) err_t f(int a) { argument(b) { in; } }", "`b` is not a parameter");
        expect_error("@id(1) err_t f(int *a) { argument(a) { sideways; } }", "unknown value descriptor `sideways`");
    }

    #[test]
    fn server_side_expressions_must_be_on_the_wire() {
        // A buffer size computed from a guest-only utility cannot be checked by the server.
        expect_error(
            "@id(1) err_t f(void *p, const void *q) { argument(p) { out; buffer(where_is(q)); } argument(q) { local; } }",
            "only use values that travel on the wire",
        );
    }

    #[test]
    fn conditions_choose_only_buffers() {
        expect_error(
            "@id(1) err_t f(int *p, int k) { argument(p) { if (k == 1) { out; } else { device_pointer; } } }",
            "conditions can only choose",
        );
    }

    #[test]
    fn precondition_error_must_exist() {
        expect_error(
            "@id(1) err_t f(int a) { precondition(a > 0, cudaErrorWhatever); }",
            "not an error of the errors table",
        );
    }

    #[test]
    fn expression_kinds() {
        expect_error("@id(1) err_t f(int a) { precondition(a + 1, bad); }", "must be a condition");
        expect_error("@id(1) err_t f(int a) { precondition(a && 1 == 1, bad); }", "wrong kind");
    }

    #[test]
    fn diagnostics_name_the_line() {
        let err = check_src("\n\n@id(1) err_t f(void *p) { }").unwrap_err();
        // The prelude ends on line 15; two blank lines, then the function on line 18.
        assert!(err.contains("t.lapis:18:"), "{err}");
        assert!(err.contains("^"), "{err}");
    }

    #[test]
    fn guest_functions_take_no_descriptors() {
        expect_error(
            "@id(1) err_t f(int *a) { implemented_by(guest); argument(a) { out; } }",
            "take no argument descriptors",
        );
    }

    #[test]
    fn return_type_must_be_the_return_code() {
        expect_error("@id(1) int f(int a) { }", "must return `err_t`");
    }

    #[test]
    fn function_ids_are_given_unique_and_never_reused() {
        let api = check_src("@id(9) err_t f(int a);\n@id(2) err_t g(int a);\n@id(4) retired h;").unwrap();
        assert_eq!((api.function("f").unwrap().id, api.function("g").unwrap().id), (9, 2));
        assert_eq!(api.retired, [Retired { id: 4, name: "h".into() }]);
        // A function without an id is told the next one never used.
        expect_error("@id(9) err_t f(int a);\n@id(12) retired h;\nerr_t g(int a);", "write `@id(13)` before it");
        expect_error("@id(1) err_t f(int a);\n@id(1) err_t g(int a);", "function id 1 is already `f`'s");
        expect_error("@id(4) retired h;\n@id(4) err_t g(int a);", "function id 4 was `h`'s and is retired");
        expect_error("@id(4) retired h;\n@id(4) retired k;", "retired twice");
        expect_error("@id(1) @version(2) err_t f(int a);", "`@version` does not apply to a function");
        expect_error("@id(1) @id(2) err_t f(int a);", "`@id` given twice");
        expect_error("@id(1) enum e_t { A = 1 };", "after `@` attributes");
    }

    #[test]
    fn the_api_and_handle_kinds_carry_ids() {
        let api = check_src("").unwrap();
        assert_eq!((api.id, api.version), (3, 1));
        assert_eq!(api.handle_kinds, [HandleKindDecl { name: "stream".into(), id: 7 }]);
        let without = |from: &str, to: &str| {
            let src = PRELUDE.replace(from, to);
            crate::load("t.lapis", &src).map(|_| ()).unwrap_err().to_string()
        };
        assert!(without("@id(3) @version(1) api t;", "@id(3) api t;").contains("`api` needs `@version(<n>)`"));
        assert!(without("@id(7) handle_kind stream;", "").contains("handle kind `stream` is not declared"));
        assert!(
            without("@id(7) handle_kind stream;", "@id(7) handle_kind stream; @id(7) handle_kind event;")
                .contains("handle kind id 7 is already `stream`'s")
        );
        assert!(without("@id(7) handle_kind stream;", "@id(256) handle_kind stream;").contains("must be in 0..=255"));
        assert!(without("session_lost(bad);", "").contains("needs `session_lost(<error>);`"));
        assert!(without("return_code(Err);", "return_code;").contains("name the Rust type"));
    }

    /// What travels decides the hash: comments, coverage notes, preconditions and parameter
    /// names do not; an id, a layout, an error code or a constant does.
    #[test]
    fn the_hash_is_of_the_wire_facts() {
        let base = "@id(1) err_t f(size_t n) { precondition(n > 0, bad); }\n@id(2) err_t g(int *v) { argument(v) { out; } }\nenum kind_t2 { K = 1 };";
        let hash = |body: &str| check_src(body).unwrap().spec_hash;
        let h = hash(base);
        assert_eq!(h, hash(&format!("// a comment\n{base}\ncoverage_note \"more\";")));
        assert_eq!(h, hash(&base.replace("precondition(n > 0, bad);", "")));
        assert_eq!(h, hash(&base.replace("size_t n) { precondition(n", "size_t count) { precondition(count")));
        assert_ne!(h, hash(&base.replace("@id(2)", "@id(3)")));
        assert_ne!(h, hash(&base.replace("size_t n", "int n")));
        assert_ne!(h, hash(&base.replace("K = 1", "K = 2")));
        assert_ne!(h, hash(&base.replace("{ out; }", "{ out; } async; success(ok);")));
    }
}
