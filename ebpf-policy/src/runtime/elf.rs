//! Reading a policy object: a structural check with the `object` crate, then parsing,
//! global patching and relocation with `aya_obj`.
//!
//! aya-obj trusts its input: symbol and relocation offsets are used to slice and index
//! without checks, and some unexpected combinations reach `todo!()`/`unwrap()`. Everything
//! it would index with is checked here first, so that a corrupt object is an error, not a
//! panic. As a last line of defence the aya-obj calls run under `catch_unwind`.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use object::elf::{EM_BPF, ET_REL, FileHeader64};
use object::read::elf::{ElfFile64, FileHeader as _, SectionHeader as _};
use object::{LittleEndian, Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget, SymbolKind};

use super::LoadError;
use super::insn::RawInsn;
use super::maps::MAX_MAP_STORAGE;

/// The section prefix of the program to run.
pub(crate) const PROGRAM_PREFIX: &str = "tracepoint/phos/";

/// How aya-obj classifies a section (its `EbpfSectionKind::from_name` plus the executable
/// check), mirrored here to know which sections it will slice into.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum AyaKind {
    Maps,
    BtfMaps,
    Text,
    Program,
    Bss,
    Data,
    Other,
}

fn aya_kind(name: &str, kind: object::SectionKind, size: u64) -> AyaKind {
    if name.starts_with("license") || name.starts_with("version") {
        AyaKind::Other
    } else if name.starts_with("maps") {
        AyaKind::Maps
    } else if name.starts_with(".maps") {
        AyaKind::BtfMaps
    } else if name.starts_with(".text") {
        AyaKind::Text
    } else if name.starts_with(".bss") {
        AyaKind::Bss
    } else if name.starts_with(".data") || name.starts_with(".rodata") {
        AyaKind::Data
    } else if name == ".BTF" || name == ".BTF.ext" {
        AyaKind::Other
    } else if kind == object::SectionKind::Text && size > 0 {
        AyaKind::Program
    } else {
        AyaKind::Other
    }
}

fn malformed(why: impl Into<String>) -> LoadError {
    LoadError::Malformed(why.into())
}

/// An error and its sources, joined (aya-obj's messages are terse at the top level).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(e) = src {
        s.push_str(": ");
        s.push_str(&e.to_string());
        src = e.source();
    }
    s
}

/// What the structural check learnt.
pub(crate) struct Checked {
    /// The object with its BTF sections hidden (see `precheck`).
    pub bytes: Vec<u8>,
    pub spec_hash: Option<u64>,
    /// Section names by index.
    pub section_names: HashMap<usize, String>,
}

/// Checks everything aya-obj will index with. Also hides `.BTF` and `.BTF.ext` from it (by
/// renaming them to the empty name): we use neither BTF maps nor CO-RE, and its BTF parser
/// is the largest and least defensive part.
pub(crate) fn precheck(data: &[u8]) -> Result<Checked, LoadError> {
    let file = ElfFile64::<LittleEndian>::parse(data)
        .map_err(|e| malformed(format!("not a 64-bit little-endian ELF object: {e}")))?;
    let endian = LittleEndian;
    let header: &FileHeader64<LittleEndian> = file.elf_header();
    if header.e_machine(endian) != EM_BPF {
        return Err(malformed(format!("machine is {}, not BPF ({EM_BPF})", header.e_machine(endian))));
    }
    if header.e_type(endian) != ET_REL {
        return Err(malformed("not a relocatable object (build it with `clang -target bpf -c`)"));
    }

    let mut kinds = HashMap::new();
    let mut section_names = HashMap::new();
    let mut btf_sections = Vec::new();
    let mut spec_hash = None;
    for section in file.sections() {
        let index = section.index().0;
        let name = section.name().map_err(|e| malformed(format!("section {index}: {e}")))?;
        let shdr = section.elf_section_header();
        if shdr.sh_addr(endian) != 0 {
            return Err(malformed(format!("section `{name}` has a nonzero address")));
        }
        // aya-obj reads every section's data; check it is inside the file.
        let bytes = section.data().map_err(|e| malformed(format!("section `{name}`: {e}")))?;
        let kind = aya_kind(name, section.kind(), section.size());
        match kind {
            AyaKind::BtfMaps => {
                return Err(malformed(
                    "BTF-defined maps (section `.maps`) are not supported: declare maps with PHOS_MAP",
                ));
            }
            AyaKind::Bss | AyaKind::Data if section.size() > MAX_MAP_STORAGE => {
                return Err(malformed(format!(
                    "section `{name}` is {} bytes, more than the map storage limit of {MAX_MAP_STORAGE}",
                    section.size()
                )));
            }
            _ => {}
        }
        if name == ".BTF" || name == ".BTF.ext" {
            btf_sections.push(index);
        }
        if name == "phos_spec" {
            let b: [u8; 8] = bytes
                .try_into()
                .map_err(|_| malformed(format!("section `phos_spec` is {} bytes, not 8", bytes.len())))?;
            spec_hash = Some(u64::from_le_bytes(b));
        }
        kinds.insert(index, (kind, section.size(), bytes.len() as u64));
        section_names.insert(index, name.to_string());
    }

    // Symbols: aya-obj slices section data with [address, address + size).
    let mut text_symbols: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
    let mut map_names = HashSet::new();
    for sym in file.symbols() {
        let object::SymbolSection::Section(si) = sym.section() else { continue };
        let name = sym.name().map_err(|e| malformed(format!("symbol {}: {e}", sym.index().0)))?;
        let Some(&(kind, size, data_len)) = kinds.get(&si.0) else {
            return Err(malformed(format!("symbol `{name}` is in section {}, which does not exist", si.0)));
        };
        // .bss has no file data; anything else is sliced from its data.
        let limit = if kind == AyaKind::Bss { size } else { data_len };
        let end = sym.address().checked_add(sym.size());
        if end.is_none_or(|e| e > limit) {
            return Err(malformed(format!("symbol `{name}` lies outside its section")));
        }
        if matches!(kind, AyaKind::Text | AyaKind::Program) && sym.kind() == SymbolKind::Text && sym.size() > 0 {
            if sym.address() % 8 != 0 || sym.size() % 8 != 0 {
                return Err(malformed(format!("function `{name}` is not a whole number of instructions")));
            }
            text_symbols.entry(si.0).or_default().push((sym.address(), sym.address() + sym.size()));
        }
        if kind == AyaKind::Maps && !map_names.insert(name.to_string()) {
            return Err(malformed(format!("two maps named `{name}`")));
        }
    }
    // A map named like a data section would replace it in aya-obj's table of maps.
    if let Some(clash) = section_names.values().find(|n| map_names.contains(n.as_str())) {
        return Err(malformed(format!("a map is named like section `{clash}`")));
    }

    // Relocations in code: aya-obj rewrites the instructions they point at.
    for section in file.sections() {
        let si = section.index().0;
        let Some(&(kind, _, _)) = kinds.get(&si) else { continue };
        if !matches!(kind, AyaKind::Text | AyaKind::Program) {
            continue;
        }
        let name = &section_names[&si];
        let code = section.data().unwrap_or_default();
        let insn_at = |off: u64| -> Option<RawInsn> {
            let off = usize::try_from(off).ok()?;
            code.get(off..)?.first_chunk::<8>().map(|b| RawInsn::from_bytes(*b))
        };
        // Pseudo calls without relocation are resolved pc-relative with imm + 1.
        for (n, chunk) in code.chunks_exact(8).enumerate() {
            let ins = RawInsn::from_bytes(chunk.try_into().unwrap_or_default());
            if ins.code == 0x85 && ins.imm == i32::MAX {
                return Err(malformed(format!("section `{name}`: call at instruction {n} has an invalid target")));
            }
        }
        for (offset, reloc) in section.relocations() {
            let at = format!("section `{name}`, relocation at offset {offset:#x}");
            let RelocationTarget::Symbol(symi) = reloc.target() else {
                return Err(malformed(format!("{at}: no target symbol")));
            };
            let sym = file.symbol_by_index(symi).map_err(|e| malformed(format!("{at}: {e}")))?;
            let sym_name = sym.name().unwrap_or("?");
            let ins = match insn_at(offset) {
                Some(ins) if offset % 8 == 0 => ins,
                _ => return Err(malformed(format!("{at}: not at an instruction"))),
            };
            let object::SymbolSection::Section(target) = sym.section() else {
                return Err(malformed(format!(
                    "{at}: symbol `{sym_name}` is not defined in this object (externs and kfuncs are not supported)"
                )));
            };
            let target_kind = kinds.get(&target.0).map(|k| k.0);
            let to_code =
                sym.kind() == SymbolKind::Text || matches!(target_kind, Some(AyaKind::Text | AyaKind::Program));
            if to_code {
                // A call (or a function address): aya-obj computes the callee from imm.
                match (sym.kind(), reloc.size()) {
                    (SymbolKind::Text, _) => {}
                    (SymbolKind::Section, 32) if ins.imm >= -1 && ins.imm < i32::MAX => {}
                    (SymbolKind::Section, 64) if ins.imm >= 0 => {}
                    _ => return Err(malformed(format!("{at}: unsupported code relocation to `{sym_name}`"))),
                }
            } else {
                // A map or global: must be an ld_imm64 whose second half is in the same function.
                let in_fn = text_symbols
                    .get(&si)
                    .and_then(|fs| fs.iter().find(|&&(lo, hi)| lo <= offset && offset < hi).copied());
                if let Some((_, hi)) = in_fn
                    && (ins.code != 0x18 || offset + 16 > hi)
                {
                    return Err(malformed(format!(
                        "{at}: `{sym_name}` is referenced by something other than ld_imm64"
                    )));
                }
                if ins.imm.checked_add(sym.address() as i32).is_none() {
                    return Err(malformed(format!("{at}: offset overflows")));
                }
            }
        }
    }

    let mut bytes = data.to_vec();
    if !btf_sections.is_empty() {
        let shoff = header.e_shoff(endian);
        let shentsize = u64::from(header.e_shentsize(endian));
        if shentsize != 64 {
            return Err(malformed(format!("section header size {shentsize}, expected 64")));
        }
        for index in btf_sections {
            let at = shoff
                .checked_add(index as u64 * shentsize)
                .and_then(|a| usize::try_from(a).ok())
                .filter(|&a| a + 4 <= bytes.len())
                .ok_or_else(|| malformed("section header outside the file"))?;
            bytes[at..at + 4].fill(0);
        }
    }
    Ok(Checked { bytes, spec_hash, section_names })
}

/// A map as aya-obj describes it.
pub(crate) struct MapDef {
    pub name: String,
    pub type_id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// For data sections: their bytes, and whether read-only.
    pub data: Option<(Vec<u8>, bool)>,
}

/// The program, linked with its local functions, and the maps it may use (in the order
/// of the map indices its ld_imm64 instructions carry).
pub(crate) struct Linked {
    pub name: String,
    pub insns: Vec<RawInsn>,
    pub maps: Vec<MapDef>,
}

pub(crate) fn link(checked: &Checked, globals: &[(&str, Vec<u8>)]) -> Result<Linked, LoadError> {
    match catch_unwind(AssertUnwindSafe(|| link_inner(checked, globals))) {
        Ok(r) => r,
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(malformed(format!("the object parser failed: {why}")))
        }
    }
}

fn link_inner(checked: &Checked, globals: &[(&str, Vec<u8>)]) -> Result<Linked, LoadError> {
    let mut obj = aya_obj::Object::parse(&checked.bytes).map_err(|e| malformed(chain(&e)))?;

    let mut patches: HashMap<&str, (&[u8], bool)> = HashMap::new();
    for (name, value) in globals {
        if patches.insert(name, (value.as_slice(), true)).is_some() {
            return Err(LoadError::Global { name: name.to_string(), why: "set twice".into() });
        }
    }
    for (name, value) in &patches {
        // One at a time, so that an error names the global.
        let one = HashMap::from([(*name, *value)]);
        obj.patch_map_data(one).map_err(|e| LoadError::Global { name: name.to_string(), why: chain(&e) })?;
    }

    // Our maps, in a stable order: the indices are the "fds" relocation writes into the code.
    let mut maps: Vec<(String, aya_obj::Map)> = obj.maps.iter().map(|(n, m)| (n.clone(), m.clone())).collect();
    maps.sort_by(|a, b| a.0.cmp(&b.0));
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    obj.relocate_maps(maps.iter().enumerate().map(|(i, (n, m))| (n.as_str(), i as i32, m)), &text_sections)
        .map_err(|e| LoadError::Relocation(chain(&e)))?;
    obj.relocate_calls(&text_sections).map_err(|e| LoadError::Relocation(chain(&e)))?;

    let mut candidates: Vec<(&String, &aya_obj::Program)> = obj
        .programs
        .iter()
        .filter(|(_, p)| checked.section_names.get(&p.section_index).is_some_and(|s| s.starts_with(PROGRAM_PREFIX)))
        .collect();
    candidates.sort_by(|a, b| a.0.cmp(b.0));
    let (name, program) = match candidates.as_slice() {
        [] => return Err(LoadError::NoProgram),
        [one] => *one,
        several => return Err(LoadError::SeveralPrograms(several.iter().map(|(n, _)| n.to_string()).collect())),
    };
    let function =
        obj.functions.get(&program.function_key()).ok_or_else(|| malformed(format!("program `{name}` has no code")))?;
    let insns =
        function.instructions.iter().map(|i| RawInsn::new(i.code, i.dst_reg(), i.src_reg(), i.off, i.imm)).collect();

    let maps = maps
        .into_iter()
        .map(|(name, m)| {
            let data = match m.section_kind() {
                aya_obj::EbpfSectionKind::Data | aya_obj::EbpfSectionKind::Bss => Some((m.data().to_vec(), false)),
                aya_obj::EbpfSectionKind::Rodata => Some((m.data().to_vec(), true)),
                _ => None,
            };
            MapDef {
                name,
                type_id: m.map_type(),
                key_size: m.key_size(),
                value_size: m.value_size(),
                max_entries: m.max_entries(),
                data,
            }
        })
        .collect();
    Ok(Linked { name: name.clone(), insns, maps })
}
