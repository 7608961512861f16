//! JIT linking on `emu` (`cuLinkComplete`): the emulator runs PTX, so a link of PTX inputs
//! (or fat binaries, by their PTX) is one PTX module made of them all: their `.extern`
//! declarations resolved against the others' visible definitions, checked as a linker checks
//! (an undefined reference or a second definition is an error, in the error log). The image
//! is that module's text, which `cuModuleLoadData` loads on `emu` like any PTX. Machine code
//! (cubins, objects, libraries, LTO IR) is not something `emu` can run: such a link answers
//! `CUDA_ERROR_NOT_SUPPORTED`, saying why in its error log.

use std::collections::HashMap;

use phos_protocol::jit_link::{LinkInputs, input_type};
use phos_ptx::{Directive, Linkage, Module, StateSpace};

use super::{LINK_NOT_SUPPORTED, LinkOutcome};

/// `CUDA_ERROR_INVALID_PTX` and `CUDA_ERROR_INVALID_IMAGE`.
const INVALID_PTX: i32 = 218;
const INVALID_IMAGE: i32 = 200;

/// Functions the driver provides to every module (device `printf`, `malloc`, assertions, the
/// device runtime's entry points), which no input defines.
fn provided(name: &str) -> bool {
    matches!(name, "vprintf" | "malloc" | "free" | "__assertfail") || name.starts_with("cuda")
}

fn input_name(name: &[u8], index: usize) -> String {
    if name.is_empty() { format!("input {index}") } else { String::from_utf8_lossy(name).into_owned() }
}

/// The symbol a module-scope directive defines (`Some((name, visible))`), if any.
fn definitions(d: &Directive) -> Vec<(String, bool)> {
    match d {
        Directive::Function(f) if f.body.is_some() => {
            vec![(f.name.clone(), matches!(f.linkage, Some(Linkage::Visible | Linkage::Weak)))]
        }
        Directive::Variable(v) if v.linkage != Some(Linkage::Extern) && v.space != StateSpace::Shared => v
            .declarators
            .iter()
            .map(|x| (x.name.clone(), matches!(v.linkage, Some(Linkage::Visible | Linkage::Weak | Linkage::Common))))
            .collect(),
        _ => Vec::new(),
    }
}

/// The names a directive declares `.extern` (to be defined by another input).
fn references(d: &Directive) -> Vec<String> {
    match d {
        Directive::Function(f) if f.body.is_none() && f.linkage == Some(Linkage::Extern) => vec![f.name.clone()],
        Directive::Variable(v) if v.linkage == Some(Linkage::Extern) && v.space != StateSpace::Shared => {
            v.declarators.iter().map(|x| x.name.clone()).collect()
        }
        _ => Vec::new(),
    }
}

fn weak(d: &Directive) -> bool {
    match d {
        Directive::Function(f) => f.linkage == Some(Linkage::Weak),
        Directive::Variable(v) => matches!(v.linkage, Some(Linkage::Weak | Linkage::Common)),
        _ => false,
    }
}

/// Links `inputs` as described above.
pub fn link(inputs: &LinkInputs<'_>) -> LinkOutcome {
    let mut modules: Vec<(String, String, Module)> = Vec::new();
    for (i, input) in inputs.inputs.iter().enumerate() {
        let name = input_name(input.name, i);
        let text = match input.kind {
            input_type::PTX => {
                let end = input.data.iter().position(|&b| b == 0).unwrap_or(input.data.len());
                match std::str::from_utf8(&input.data[..end]) {
                    Ok(t) => t.to_string(),
                    Err(_) => return LinkOutcome::failed(INVALID_PTX, format!("{name}: PTX is not text")),
                }
            }
            input_type::FATBINARY => match super::emu::ptx_of(input.data) {
                Ok(Some(t)) => t,
                Ok(None) => {
                    return LinkOutcome::failed(
                        LINK_NOT_SUPPORTED,
                        format!("emu: {name} is a fat binary without PTX, which the emulator cannot run"),
                    );
                }
                Err(e) => return LinkOutcome::failed(INVALID_IMAGE, format!("{name}: {e}")),
            },
            other => {
                let kind = match other {
                    input_type::CUBIN => "a cubin",
                    input_type::OBJECT => "an object",
                    input_type::LIBRARY => "a library",
                    _ => "LTO IR",
                };
                return LinkOutcome::failed(
                    LINK_NOT_SUPPORTED,
                    format!("emu links PTX only: {name} is {kind}, machine code the emulator cannot run"),
                );
            }
        };
        match phos_ptx::parse(&text) {
            Ok(m) => modules.push((name, text, m)),
            Err(e) => {
                return LinkOutcome::failed(INVALID_PTX, format!("ptxas application ptx input, {name}: {e}"));
            }
        }
    }
    if modules.is_empty() {
        return LinkOutcome::failed(INVALID_IMAGE, "nothing to link");
    }
    merge(&modules)
}

fn image(text: String) -> LinkOutcome {
    let mut image = text.into_bytes();
    image.push(0);
    LinkOutcome { status: 0, image, ..Default::default() }
}

fn merge(modules: &[(String, String, Module)]) -> LinkOutcome {
    // Where each symbol is defined: (input, visible, weak).
    let mut defined: HashMap<String, (usize, bool, bool)> = HashMap::new();
    for (i, (name, _, m)) in modules.iter().enumerate() {
        for d in &m.directives {
            for (symbol, visible) in definitions(d) {
                match defined.get(&symbol) {
                    None => {
                        defined.insert(symbol, (i, visible, weak(d)));
                    }
                    Some(&(first, _, first_weak)) if first != i => {
                        if !visible || !defined[&symbol].1 {
                            return LinkOutcome::failed(
                                LINK_NOT_SUPPORTED,
                                format!(
                                    "emu: '{symbol}' is defined in both '{}' and '{name}' (an internal symbol: the emulator's linker does not rename them)",
                                    modules[first].0
                                ),
                            );
                        }
                        if !first_weak && !weak(d) {
                            return LinkOutcome::failed(
                                INVALID_IMAGE,
                                format!(
                                    "error   : Multiple definition of '{symbol}' in '{name}', first defined in '{}'",
                                    modules[first].0
                                ),
                            );
                        }
                    }
                    Some(_) => {}
                }
            }
        }
    }
    for (name, _, m) in modules {
        for d in &m.directives {
            for symbol in references(d) {
                if !provided(&symbol) && !defined.get(&symbol).is_some_and(|&(_, visible, _)| visible) {
                    return LinkOutcome::failed(
                        INVALID_IMAGE,
                        format!("error   : Undefined reference to '{symbol}' in '{name}'"),
                    );
                }
            }
        }
    }
    if let [(_, text, _)] = modules {
        return image(text.clone()); // one module, loaded as it came
    }
    let mut out = Module { directives: Vec::new() };
    // The header: the newest PTX version of the inputs, the first input's target.
    let version = modules
        .iter()
        .flat_map(|(_, _, m)| m.directives.iter())
        .filter_map(|d| match d {
            Directive::Version { major, minor } => Some((*major, *minor)),
            _ => None,
        })
        .max();
    if let Some((major, minor)) = version {
        out.directives.push(Directive::Version { major, minor });
    }
    for d in &modules[0].2.directives {
        if matches!(d, Directive::Target(_) | Directive::AddressSize(_)) {
            out.directives.push(d.clone());
        }
    }
    let mut shared_seen = std::collections::HashSet::new();
    for (i, (_, _, m)) in modules.iter().enumerate() {
        for d in &m.directives {
            match d {
                // Headers were merged; file tables and debug sections of several inputs would
                // clash by number, and nothing the emulator runs reads them.
                Directive::Version { .. }
                | Directive::Target(_)
                | Directive::AddressSize(_)
                | Directive::File(_)
                | Directive::Section(_) => continue,
                // One declaration of each dynamic shared memory name.
                Directive::Variable(v)
                    if v.linkage == Some(Linkage::Extern)
                        && v.space == StateSpace::Shared
                        && !v.declarators.iter().all(|x| shared_seen.insert(x.name.clone())) =>
                {
                    continue;
                }
                _ => {}
            }
            if !references(d).is_empty() && references(d).iter().all(|s| defined.contains_key(s)) {
                continue; // resolved: the definition is in the module
            }
            if definitions(d).iter().any(|(s, _)| defined.get(s).is_some_and(|&(at, _, _)| at != i)) {
                continue; // a weak definition another input made first
            }
            out.directives.push(d.clone());
        }
    }
    let text = out.to_string();
    if let Err(e) = phos_ptx::parse(&text) {
        return LinkOutcome::failed(INVALID_PTX, format!("emu: the linked module does not read back: {e}"));
    }
    image(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::jit_link::Input;

    const USER: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
        .extern .func (.param .b32 func_retval0) twice(.param .b32 twice_param_0);\n\
        .visible .entry run(.param .u64 out)\n{\n .reg .b32 %r<3>;\n .reg .b64 %rd<2>;\n\
        ld.param.u64 %rd1, [out];\n mov.u32 %r1, 21;\n\
        { .param .b32 p0; st.param.b32 [p0+0], %r1; .param .b32 rv; call.uni (rv), twice, (p0); ld.param.b32 %r2, [rv+0]; }\n\
        st.global.u32 [%rd1], %r2;\n ret;\n}\n";
    const LIB: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
        .visible .func (.param .b32 func_retval0) twice(.param .b32 twice_param_0)\n{\n .reg .b32 %r<3>;\n\
        ld.param.b32 %r1, [twice_param_0];\n add.s32 %r2, %r1, %r1;\n st.param.b32 [func_retval0+0], %r2;\n ret;\n}\n";

    fn ptx<'a>(name: &'a str, text: &'a str) -> Input<'a> {
        Input { kind: input_type::PTX, name: name.as_bytes(), options: Vec::new(), data: text.as_bytes() }
    }

    fn inputs<'a>(list: Vec<Input<'a>>) -> LinkInputs<'a> {
        LinkInputs { options: Vec::new(), info_log: 0, error_log: 0, inputs: list }
    }

    #[test]
    fn externs_resolve_across_inputs_and_missing_ones_are_named() {
        let linked = link(&inputs(vec![ptx("user.ptx", USER), ptx("lib.ptx", LIB)]));
        assert_eq!(linked.status, 0, "{}", String::from_utf8_lossy(&linked.error_log));
        let text = std::str::from_utf8(&linked.image[..linked.image.len() - 1]).unwrap();
        let m = phos_ptx::parse(text).unwrap();
        let functions: Vec<_> = m
            .directives
            .iter()
            .filter_map(|d| match d {
                Directive::Function(f) => Some((f.name.as_str(), f.body.is_some())),
                _ => None,
            })
            .collect();
        assert_eq!(functions, vec![("run", true), ("twice", true)]);

        let alone = link(&inputs(vec![ptx("lib.ptx", LIB)]));
        assert_eq!(alone.image, format!("{LIB}\0").into_bytes(), "one module is loaded as it came");
        let missing = link(&inputs(vec![ptx("user.ptx", USER)]));
        assert_eq!(missing.status, INVALID_IMAGE);
        assert!(String::from_utf8_lossy(&missing.error_log).contains("Undefined reference to 'twice' in 'user.ptx'"));

        let twice = link(&inputs(vec![ptx("a.ptx", LIB), ptx("b.ptx", LIB)]));
        assert_eq!(twice.status, INVALID_IMAGE);
        assert!(String::from_utf8_lossy(&twice.error_log).contains("Multiple definition of 'twice'"));

        let cubin = Input { kind: input_type::CUBIN, name: b"k.cubin", options: Vec::new(), data: b"\x7fELF" };
        assert_eq!(link(&inputs(vec![cubin])).status, LINK_NOT_SUPPORTED);
        assert_eq!(link(&inputs(vec![ptx("bad.ptx", ".version 7.0\n.target sm_70\nbogus")])).status, INVALID_PTX);
    }
}
