//! Which kernels may touch memory that their launch's parameters do not name: the read side
//! of the speculation an on-demand restore relies on (docs/architecture.md, "On-demand
//! restore").
//!
//! A launch names the allocations its parameter words point into; a kernel that loads or
//! stores through an address the PTX analysis cannot derive from its parameters or its
//! module's variables ([`phos_ptx::access`]: a pointer read from device memory, an address
//! made from nothing it was given, an indirect call), or whose module has no PTX to analyse,
//! may touch any memory. The answer is asked only while a C/R protocol follows the session,
//! computed once per module (all its kernels at once) and kept per kernel until the module
//! is unloaded. Module images are kept for it, as loaded.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// What is known of one module's kernels.
enum ModuleReach {
    /// Not analysed yet: the module's image.
    Image(Arc<[u8]>),
    /// By kernel name: why it may touch memory its parameters do not name (`None`: it does
    /// not). A kernel not listed has no PTX body.
    Analysed(HashMap<String, Option<Arc<str>>>),
    /// The module gives no PTX (a cubin only, or PTX that does not parse): why.
    Opaque(Arc<str>),
}

/// The session's kernels' reach, kept beside its module registry.
#[derive(Default)]
pub struct KernelReach {
    /// By module handle.
    modules: Mutex<HashMap<u64, ModuleReach>>,
    /// Function handle -> (module handle, kernel name).
    functions: Mutex<HashMap<u64, (u64, String)>>,
}

impl KernelReach {
    pub fn module_loaded(&self, module: u64, image: &[u8]) {
        self.modules.lock().entry(module).or_insert_with(|| ModuleReach::Image(image.into()));
    }

    pub fn function_found(&self, function: u64, module: u64, name: &str) {
        self.functions.lock().insert(function, (module, name.to_string()));
    }

    pub fn module_unloaded(&self, module: u64) {
        self.modules.lock().remove(&module);
        self.functions.lock().retain(|_, (m, _)| *m != module);
    }

    pub fn clear(&self) {
        self.modules.lock().clear();
        self.functions.lock().clear();
    }

    /// Why a launch of `function` may touch memory its parameters and its module's variables
    /// do not name; `None` when it cannot. The first answer for a kernel that can is logged
    /// (once per kernel: the module's analysis happens once).
    pub fn untracked(&self, session: u64, function: u64) -> Option<Arc<str>> {
        let Some((module, name)) = self.functions.lock().get(&function).cloned() else {
            return Some("the server knows no module for it".into());
        };
        let image = match self.modules.lock().get(&module) {
            None => return Some("its module is not loaded".into()),
            Some(ModuleReach::Opaque(why)) => return Some(why.clone()),
            Some(ModuleReach::Analysed(kernels)) => return answer(kernels, &name),
            Some(ModuleReach::Image(image)) => image.clone(),
        };
        // Analysed without the lock: a large module takes a while, and other launches go on.
        let analysis = analyse(&image);
        match &analysis {
            Err(why) => {
                tracing::info!(
                    session,
                    "module {module:#x}: {why}: an on-demand restore loads all memory before any of its kernels runs"
                );
            }
            Ok(kernels) => {
                for (kernel, why) in kernels.iter().filter_map(|(k, w)| Some((k, w.as_ref()?))) {
                    tracing::info!(
                        session,
                        "kernel {kernel}: {why}: an on-demand restore loads all memory before it runs"
                    );
                }
            }
        }
        let found = match &analysis {
            Err(why) => Some(why.clone()),
            Ok(kernels) => answer(kernels, &name),
        };
        // Kept unless the module was unloaded meanwhile.
        if let Some(slot) = self.modules.lock().get_mut(&module) {
            *slot = match analysis {
                Ok(kernels) => ModuleReach::Analysed(kernels),
                Err(why) => ModuleReach::Opaque(why),
            };
        }
        found
    }
}

fn answer(kernels: &HashMap<String, Option<Arc<str>>>, name: &str) -> Option<Arc<str>> {
    match kernels.get(name) {
        Some(why) => why.clone(),
        None => Some("its module's PTX has no body for it".into()),
    }
}

/// What the PTX of a module image says of each of its kernels: by name, why it may touch
/// memory its parameters do not name (`None`: it cannot). `Err`: why there is no such PTX.
fn analyse(image: &[u8]) -> Result<HashMap<String, Option<Arc<str>>>, Arc<str>> {
    let text = match crate::backend::emu::ptx_of(image) {
        Ok(Some(text)) => text,
        Ok(None) => return Err("its module has no PTX".into()),
        Err(e) => return Err(format!("its module's PTX cannot be read ({e})").into()),
    };
    let module = phos_ptx::parse(&text).map_err(|e| Arc::from(format!("its module's PTX does not parse ({e})")))?;
    let kernels = phos_ptx::access::kernel_accesses(&module)
        .into_iter()
        .map(|k| {
            let loads = k.untracked_loads.first().map(|u| ("loads", u));
            let why = loads.or(k.untracked_stores.first().map(|u| ("stores", u))).map(|(what, u)| {
                Arc::from(format!(
                    "it {what} through an address not derived from its parameters ({}, {} line {})",
                    u.what, u.function, u.line
                ))
            });
            (k.kernel, why)
        })
        .collect();
    Ok(kernels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry direct(.param .u64 a, .param .u64 b)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [a];
    ld.param.u64 %rd2, [b];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    ld.global.u32 %r1, [%rd1];
    st.global.u32 [%rd2], %r1;
    ret;
}

.visible .entry chase(.param .u64 table, .param .u64 out)
{
    .reg .b64 %rd<5>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [table];
    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    ld.global.u64 %rd3, [%rd1];
    ld.global.u32 %r1, [%rd3];
    st.global.u32 [%rd2], %r1;
    ret;
}
"#;

    /// A kernel that reads only through its parameters is tracked; one that reads through a
    /// pointer loaded from memory is not, and says why; a function of a module without PTX
    /// and an unknown function are not either. Unloading forgets the module.
    #[test]
    fn kernels_reading_through_loaded_pointers_are_untracked() {
        let reach = KernelReach::default();
        reach.module_loaded(1, PTX.as_bytes());
        reach.function_found(10, 1, "direct");
        reach.function_found(11, 1, "chase");
        assert_eq!(reach.untracked(7, 10), None);
        let why = reach.untracked(7, 11).expect("chase reads through a loaded pointer");
        assert!(why.contains("loads through an address not derived"), "{why}");
        // Answered again from the analysis kept.
        assert_eq!(reach.untracked(7, 10), None);
        reach.module_loaded(2, b"\x7fELF not ptx");
        reach.function_found(20, 2, "k");
        assert!(reach.untracked(7, 20).is_some_and(|w| w.contains("PTX")));
        assert!(reach.untracked(7, 99).is_some());
        reach.module_unloaded(1);
        assert!(reach.untracked(7, 10).is_some());
    }
}
