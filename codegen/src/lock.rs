//! The lock file of a spec (`spec/<api>.lock`): its wire facts as deployed guests and
//! checkpoint images know them, and the hashes of the earlier revisions a build still serves.
//! Every build compares the spec with it ([`compare`]): a change that would break a deployed
//! guest or an existing image stops the build and says what changed and how to make it
//! right; a compatible change (a new function, error, constant, handle kind or resource, a
//! retired function) is allowed, and `phos-codegen lock` records it ([`updated`]).
//! The rules are in `docs/compatibility.md`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::Api;
use crate::wire_facts::{
    ConstantFacts, ErrorFacts, FunctionFacts, HandleKindFacts, ResourceFacts, RetiredFacts, WireFacts,
};

/// A lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    pub api: String,
    pub id: u16,
    pub version: u32,
    /// The hash of these facts (16 hex digits).
    pub hash: String,
    /// Hashes of earlier revisions of this version: guests and images of those are served.
    #[serde(default)]
    pub accepts: Vec<String>,
    /// FNV-1a hashes of spec texts from before explicit function ids, whose guests announced
    /// them in a version-1 `Hello` and whose wire facts are these (without what was added
    /// since).
    #[serde(default)]
    pub legacy_text_hashes: Vec<String>,
    #[serde(default)]
    pub functions: Vec<FunctionFacts>,
    #[serde(default)]
    pub retired: Vec<RetiredFacts>,
    #[serde(default)]
    pub handle_kinds: Vec<HandleKindFacts>,
    #[serde(default)]
    pub errors: Vec<ErrorFacts>,
    #[serde(default)]
    pub constants: Vec<ConstantFacts>,
    #[serde(default)]
    pub resources: Vec<ResourceFacts>,
}

/// How a spec stands against its lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The lock records exactly the spec's wire facts.
    Current,
    /// The spec adds to the lock compatibly (listed); the lock should be updated.
    Grown(Vec<String>),
    /// The spec raised its version: everything may change, and nothing older is served.
    NewVersion,
}

/// Why a spec cannot be built against its lock: each entry says what changed and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct Incompatible(pub Vec<String>);

const HOW_TO_BREAK: &str = "or raise the API's version (`@version(..)` on `api`) to break compatibility on purpose";

impl Lock {
    pub fn parse(text: &str) -> Result<Lock, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The lock of `api` as it is now, serving `accepts` and `legacy_text_hashes` too.
    pub fn of(api: &Api, accepts: Vec<String>, legacy_text_hashes: Vec<String>) -> Lock {
        let f = WireFacts::of(api);
        Lock {
            api: f.api,
            id: f.id,
            version: f.version,
            hash: hex(api.spec_hash),
            accepts,
            legacy_text_hashes,
            functions: f.functions,
            retired: f.retired,
            handle_kinds: f.handle_kinds,
            errors: f.errors,
            constants: f.constants,
            resources: f.resources,
        }
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let body = toml::to_string(self).expect("a lock serialises");
        format!(
            "# The wire facts of the `{}` API as deployed guests and checkpoint images know them.\n\
             # Written by `cargo run -p phos-codegen -- lock <spec>`; every build compares the spec\n\
             # with it (docs/compatibility.md). Do not edit by hand.\n\n{body}",
            self.api
        )
    }

    /// Hashes this lock says a build serves besides the spec's own: `accepts`, and the lock's
    /// own hash when the spec has grown past it.
    pub fn served(&self) -> Result<Vec<u64>, String> {
        let mut all = Vec::new();
        for h in self.accepts.iter().chain(std::iter::once(&self.hash)) {
            all.push(parse_hex(h)?);
        }
        Ok(all)
    }

    pub fn legacy(&self) -> Result<Vec<u64>, String> {
        self.legacy_text_hashes.iter().map(|h| parse_hex(h)).collect()
    }
}

pub fn hex(h: u64) -> String {
    format!("{h:016x}")
}

fn parse_hex(h: &str) -> Result<u64, String> {
    u64::from_str_radix(h, 16).map_err(|_| format!("`{h}` is not a hash of 16 hex digits"))
}

/// Compare a spec with its lock.
pub fn compare(lock: &Lock, api: &Api) -> Result<Standing, Incompatible> {
    let now = WireFacts::of(api);
    let mut broken = Vec::new();
    if lock.api != now.api || lock.id != now.id {
        broken.push(format!(
            "the lock is of API `{}` (id {}), the spec of `{}` (id {}): an API keeps its name and id",
            lock.api, lock.id, now.api, now.id
        ));
        return Err(Incompatible(broken));
    }
    if now.version > lock.version {
        return Ok(Standing::NewVersion);
    }
    if now.version < lock.version {
        broken.push(format!(
            "the spec's version {} is below the lock's {}: a version never goes back",
            now.version, lock.version
        ));
        return Err(Incompatible(broken));
    }
    let mut grown = Vec::new();

    let functions: BTreeMap<u32, &FunctionFacts> = now.functions.iter().map(|f| (f.id, f)).collect();
    let retired: BTreeMap<u32, &RetiredFacts> = now.retired.iter().map(|r| (r.id, r)).collect();
    for old in &lock.functions {
        let Some(new) = functions.get(&old.id) else {
            if retired.contains_key(&old.id) {
                grown.push(format!("`{}` (id {}) retired", old.name, old.id));
            } else {
                broken.push(format!(
                    "`{}` (id {}) is gone: deployed guests may call it; list it as `@id({}) retired {};`",
                    old.name, old.id, old.id, old.name
                ));
            }
            continue;
        };
        let replace = format!(
            "to change it, retire id {} (`@id({}) retired {};`) and declare the new form under a new id, {HOW_TO_BREAK}",
            old.id, old.id, old.name
        );
        if new.name != old.name {
            broken.push(format!("id {} was `{}` and is now `{}`: {replace}", old.id, old.name, new.name));
            continue;
        }
        if !old.carried {
            if new.carried {
                grown.push(format!("`{}` (id {}) is now carried", new.name, new.id));
            }
            continue;
        }
        if !new.carried {
            broken.push(format!(
                "`{}` (id {}) is no longer carried to the server, but deployed guests send it: {replace}",
                old.name, old.id
            ));
            continue;
        }
        if new.is_async != old.is_async {
            broken.push(format!(
                "`{}` (id {}) was {} and is now {}: deployed guests {} for its reply; {replace}",
                old.name,
                old.id,
                if old.is_async { "async" } else { "sync" },
                if new.is_async { "async" } else { "sync" },
                if old.is_async { "do not wait" } else { "wait" }
            ));
        }
        for (what, was, is) in
            [("request", old.request_types(), new.request_types()), ("reply", old.reply_types(), new.reply_types())]
        {
            if was != is {
                broken.push(format!(
                    "the {what} of `{}` (id {}) was ({}) and is now ({}): deployed guests and images hold the old layout; {replace}",
                    old.name,
                    old.id,
                    was.join(", "),
                    is.join(", ")
                ));
            }
        }
    }
    let known: BTreeMap<u32, &str> = lock
        .functions
        .iter()
        .map(|f| (f.id, f.name.as_str()))
        .chain(lock.retired.iter().map(|r| (r.id, r.name.as_str())))
        .collect();
    for new in &now.functions {
        if !known.contains_key(&new.id) {
            grown.push(format!("`{}` (id {}) added", new.name, new.id));
        }
    }
    for old in &lock.retired {
        if !retired.contains_key(&old.id) {
            broken.push(format!(
                "id {} (`{}`) is retired in the lock but not in the spec: ids are never given again; keep `@id({}) retired {};`",
                old.id, old.name, old.id, old.name
            ));
        }
    }

    let kinds: BTreeMap<&str, u16> = now.handle_kinds.iter().map(|k| (k.name.as_str(), k.id)).collect();
    for old in &lock.handle_kinds {
        match kinds.get(old.name.as_str()) {
            Some(&id) if id == old.id => {}
            Some(&id) => broken.push(format!(
                "handle kind `{}` had id {} and now {id}: handles held by guests and images carry the old tag; {HOW_TO_BREAK}",
                old.name, old.id
            )),
            None => broken.push(format!(
                "handle kind `{}` (id {}) is gone: guests and images hold its handles; {HOW_TO_BREAK}",
                old.name, old.id
            )),
        }
    }
    let old_kinds: Vec<&str> = lock.handle_kinds.iter().map(|k| k.name.as_str()).collect();
    grown.extend(
        now.handle_kinds
            .iter()
            .filter(|k| !old_kinds.contains(&k.name.as_str()))
            .map(|k| format!("handle kind `{}` added", k.name)),
    );

    let errors: BTreeMap<&str, i64> = now.errors.iter().map(|e| (e.name.as_str(), e.code)).collect();
    for old in &lock.errors {
        match errors.get(old.name.as_str()) {
            Some(&code) if code == old.code => {}
            Some(&code) => broken.push(format!(
                "error `{}` was {} and is now {code}: deployed guests read the old code; {HOW_TO_BREAK}",
                old.name, old.code
            )),
            None => broken.push(format!(
                "error `{}` ({}) is gone: deployed guests and servers still answer it; {HOW_TO_BREAK}",
                old.name, old.code
            )),
        }
    }
    let old_errors: Vec<&str> = lock.errors.iter().map(|e| e.name.as_str()).collect();
    grown.extend(
        now.errors
            .iter()
            .filter(|e| !old_errors.contains(&e.name.as_str()))
            .map(|e| format!("error `{}` added", e.name)),
    );

    let constants: BTreeMap<&str, i64> = now.constants.iter().map(|c| (c.name.as_str(), c.value)).collect();
    for old in &lock.constants {
        match constants.get(old.name.as_str()) {
            Some(&v) if v == old.value => {}
            Some(&v) => broken.push(format!(
                "constant `{}` was {} and is now {v}: deployed guests send the old value; {HOW_TO_BREAK}",
                old.name, old.value
            )),
            None => broken.push(format!(
                "constant `{}` ({}) is gone: deployed guests still send it; {HOW_TO_BREAK}",
                old.name, old.value
            )),
        }
    }
    let old_constants: Vec<&str> = lock.constants.iter().map(|c| c.name.as_str()).collect();
    grown.extend(
        now.constants
            .iter()
            .filter(|c| !old_constants.contains(&c.name.as_str()))
            .map(|c| format!("constant `{}` added", c.name)),
    );

    for (i, old) in lock.resources.iter().enumerate() {
        if now.resources.get(i) != Some(old) {
            broken.push(format!(
                "resource {i} was `{}` ({}) and is now {}: resources keep their place (policies and usage reports \
                 index them); declare new ones after the others, {HOW_TO_BREAK}",
                old.name,
                old.kind,
                now.resources.get(i).map_or("gone".to_string(), |r| format!("`{}` ({})", r.name, r.kind))
            ));
        }
    }
    grown.extend(now.resources.iter().skip(lock.resources.len()).map(|r| format!("resource `{}` added", r.name)));

    if !broken.is_empty() {
        return Err(Incompatible(broken));
    }
    if grown.is_empty() && lock.hash == hex(api.spec_hash) {
        return Ok(Standing::Current);
    }
    Ok(Standing::Grown(grown))
}

/// The lock to write for `api`, given the one on disk (`None`: the first). Fails when the
/// spec is incompatible with it.
pub fn updated(old: Option<&Lock>, api: &Api) -> Result<Lock, Incompatible> {
    let Some(old) = old else {
        return Ok(Lock::of(api, Vec::new(), Vec::new()));
    };
    match compare(old, api)? {
        Standing::Current => Ok(old.clone()),
        Standing::Grown(_) => {
            let mut accepts = old.accepts.clone();
            if !accepts.contains(&old.hash) && old.hash != hex(api.spec_hash) {
                accepts.push(old.hash.clone());
            }
            Ok(Lock::of(api, accepts, old.legacy_text_hashes.clone()))
        }
        // A new version serves nothing older.
        Standing::NewVersion => Ok(Lock::of(api, Vec::new(), Vec::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
        @id(3) @version(1) api t;
        continuous_rc mem;
        type(err_t) {
            enum(i32); return_code(Err); success(ok); not_supported(nope);
            invalid_value(bad); internal_error(bad); no_device(bad); session_lost(bad);
        }
        @id(7) handle_kind stream;
        type(stream_t) { handle(stream); }
        enum kind_t { K_IN = 1, K_OUT = 2 };
        errors err_t { ok = 0 "no error"; bad = 1 "invalid argument"; nope = 801 "not supported"; }
        @id(0) err_t make(stream_t *s, size_t n) { allocates_rc(mem, n); argument(s) { out; } }
        @id(1) err_t use_it(stream_t s, int k);
        @id(2) err_t local_one(int k) { implemented_by(guest); }
    "#;

    fn api(src: &str) -> Api {
        crate::load("t.lapis", src).unwrap_or_else(|e| panic!("{e}"))
    }

    fn broken(src: &str, lock: &Lock) -> String {
        match compare(lock, &api(src)) {
            Err(e) => e.to_string(),
            Ok(s) => panic!("accepted as {s:?}"),
        }
    }

    #[test]
    fn the_same_spec_is_current() {
        let lock = Lock::of(&api(SPEC), Vec::new(), Vec::new());
        assert_eq!(compare(&lock, &api(SPEC)), Ok(Standing::Current));
        // The lock's text reads back as itself.
        assert_eq!(Lock::parse(&lock.render()), Ok(lock));
    }

    #[test]
    fn additions_and_retirements_are_compatible() {
        let lock = Lock::of(&api(SPEC), Vec::new(), Vec::new());
        let grown = SPEC
            .replace("@id(2) err_t local_one", "@id(5) err_t added(int k);\n@id(2) err_t local_one")
            .replace("@id(1) err_t use_it(stream_t s, int k);", "@id(1) retired use_it;")
            .replace("K_OUT = 2", "K_OUT = 2, K_BOTH = 3")
            .replace("continuous_rc mem;", "continuous_rc mem; instantaneous_rc bytes;")
            .replace("nope = 801 \"not supported\";", "nope = 801 \"not supported\"; other = 2 \"other\";")
            .replace("@id(7) handle_kind stream;", "@id(7) handle_kind stream; @id(8) handle_kind event;")
            .replace("implemented_by(guest);", "");
        let Ok(Standing::Grown(what)) = compare(&lock, &api(&grown)) else { panic!("not grown") };
        for change in [
            "`added` (id 5) added",
            "`use_it` (id 1) retired",
            "constant `K_BOTH` added",
            "resource `bytes` added",
            "error `other` added",
            "handle kind `event` added",
            "`local_one` (id 2) is now carried",
        ] {
            assert!(what.iter().any(|w| w == change), "{change:?} not in {what:?}");
        }
        // The update serves the old revision too.
        let new = updated(Some(&lock), &api(&grown)).unwrap();
        assert_eq!(new.accepts, std::slice::from_ref(&lock.hash));
        assert_eq!(compare(&new, &api(&grown)), Ok(Standing::Current));
        assert!(new.served().unwrap().contains(&parse_hex(&lock.hash).unwrap()));
    }

    #[test]
    fn changes_that_break_deployed_guests_are_refused_with_the_way_out() {
        let lock = Lock::of(&api(SPEC), Vec::new(), Vec::new());
        let e = broken(&SPEC.replace("use_it(stream_t s, int k)", "use_it(stream_t s, long long k)"), &lock);
        assert!(e.contains("the request of `use_it` (id 1) was (u64, i32) and is now (u64, i64)"), "{e}");
        assert!(e.contains("retire id 1 (`@id(1) retired use_it;`)") && e.contains("raise the API's version"), "{e}");
        let e = broken(&SPEC.replace("err_t use_it", "err_t used"), &lock);
        assert!(e.contains("id 1 was `use_it` and is now `used`"), "{e}");
        let e = broken(&SPEC.replace("@id(1) err_t use_it(stream_t s, int k);", ""), &lock);
        assert!(e.contains("`use_it` (id 1) is gone") && e.contains("`@id(1) retired use_it;`"), "{e}");
        let e = broken(&SPEC.replace("(stream_t s, int k);", "(stream_t s, int k) { async; success(ok); }"), &lock);
        assert!(e.contains("was sync and is now async"), "{e}");
        let e = broken(&SPEC.replace("(stream_t s, int k);", "(stream_t s, int k) { implemented_by(guest); }"), &lock);
        assert!(e.contains("no longer carried"), "{e}");
        let e = broken(&SPEC.replace("@id(7) handle_kind", "@id(6) handle_kind"), &lock);
        assert!(e.contains("handle kind `stream` had id 7 and now 6"), "{e}");
        let e = broken(&SPEC.replace("bad = 1", "bad = 3"), &lock);
        assert!(e.contains("error `bad` was 1 and is now 3"), "{e}");
        let e = broken(&SPEC.replace("K_OUT = 2", "K_OUT = 4"), &lock);
        assert!(e.contains("constant `K_OUT` was 2 and is now 4"), "{e}");
        let e = broken(&SPEC.replace("continuous_rc mem;", "instantaneous_rc bytes; continuous_rc mem;"), &lock);
        assert!(e.contains("resource 0 was `mem` (continuous)"), "{e}");
        let e = broken(&SPEC.replace("@id(3) @version(1) api t;", "@id(4) @version(1) api t;"), &lock);
        assert!(e.contains("an API keeps its name and id"), "{e}");
        // A retired id stays retired.
        let retired = SPEC.replace("@id(1) err_t use_it(stream_t s, int k);", "@id(1) retired use_it;");
        let lock = updated(Some(&lock), &api(&retired)).unwrap();
        let e = broken(SPEC.replace("@id(1) err_t use_it(stream_t s, int k);", "").as_str(), &lock);
        assert!(e.contains("id 1 (`use_it`) is retired in the lock but not in the spec"), "{e}");
    }

    #[test]
    fn a_new_version_may_change_anything_and_serves_nothing_older() {
        let old = updated(None, &api(SPEC)).unwrap();
        let mut grown = old.clone();
        grown.accepts = vec!["0123456789abcdef".into()];
        let v2 = SPEC.replace("@version(1)", "@version(2)").replace("int k)", "long long k)");
        assert_eq!(compare(&grown, &api(&v2)), Ok(Standing::NewVersion));
        let new = updated(Some(&grown), &api(&v2)).unwrap();
        assert_eq!((new.version, new.accepts.len()), (2, 0));
        let e = broken(SPEC, &new);
        assert!(e.contains("version 1 is below the lock's 2"), "{e}");
    }
}
