//! The userspace eBPF runtime that runs policies: a loader for the objects clang builds
//! from `phos_policy.h` programs, a static checker, maps, helpers and an interpreter.
//!
//! # Loading
//!
//! [`Program::load`] parses the ELF object with `aya_obj`, sets the `PHOS_PARAM` globals it
//! is given, relocates map references and bpf-to-bpf calls, picks the one program in a
//! section `tracepoint/phos/<name>`, checks it and creates its maps. A corrupt object is a
//! [`LoadError`], never a panic: its structure is checked before aya-obj sees it.
//!
//! The static check accepts the eBPF ISA of RFC 9669 (ALU/ALU64 including the signed
//! division, modulo and sign-extending moves of ISA v4, byte swaps, JMP/JMP32 including
//! `gotol`, sign-extending loads, atomics, ld_imm64 of constants, maps and map values) and
//! rejects: unknown opcodes or nonzero reserved fields, registers above r10, writes to r10,
//! jumps or calls that leave their function or land inside an ld_imm64, functions whose
//! last instruction is not `exit` or `goto`, unknown helpers, and programs over
//! [`MAX_INSNS`] instructions. Unlike the kernel verifier it does not track types or
//! prove termination: loops are allowed, and safety comes from the run-time checks below.
//!
//! # Memory model
//!
//! A program never sees a host pointer. It runs in a virtual address space where an
//! address is `region << 32 | offset`: region 1 is the context (read-only), regions 2..=10
//! the stack frames (512 bytes each: the entry function and up to [`MAX_CALL_DEPTH`] nested
//! local calls; r10 points one past the top of the current frame), and regions 16.. the
//! value storage of each map (one buffer per map, allocated at load and never moved, so an
//! address returned by `map_lookup_elem` stays valid memory for the program's lifetime).
//! Data sections (`.rodata*`, `.data*`, `.bss*`) are maps of one entry holding the section;
//! `.rodata` is read-only. Region 0 does not exist, so null and small integers are never
//! valid pointers. Every load, store, atomic and helper argument is translated and checked
//! against its region's bounds (both ends) and writability; a failed check is a
//! [`Fault::Memory`] (or [`Fault::Helper`]) and ends the run. A map reference (`&map`)
//! evaluates to an opaque handle that no address can equal.
//!
//! Each run starts with zeroed registers except r1 (the context) and r10, and a zeroed
//! frame; each local call gets a zeroed frame and preserves r6-r9 for its caller.
//!
//! # Maps
//!
//! Hash (1), array (2), per-CPU hash (5) and array (6) (one CPU here: as 1 and 2) and LRU
//! hash (9, evicts the least recently used entry when full; the program's lookups and
//! updates count as uses, the host's lookups not). Keys and values are 1..=64 KiB, and
//! all of a program's maps together may take at most 64 MiB. Deleted hash entries are
//! zeroed. The host reads and writes entries with [`Program::map_lookup`] and
//! [`Program::map_update`].
//!
//! # Helpers
//!
//! With the kernel's ids and semantics: 1 `map_lookup_elem`, 2 `map_update_elem` (flags
//! BPF_ANY/NOEXIST/EXIST; -EEXIST, -ENOENT, -E2BIG when full or an array index is out of
//! range, -EINVAL), 3 `map_delete_elem`, 5 `ktime_get_ns` (CLOCK_MONOTONIC),
//! 6 `trace_printk` (logged at `info` with target `phos_policy` and field `policy`; %d %i
//! %u %x %X with l/ll, %c, %s, %p, %%, flags and width; returns the line's length),
//! 7 `get_prandom_u32` (xorshift64*, seeded at load), 8 `get_smp_processor_id` (0).
//!
//! # Limits
//!
//! Each [`Program::run`] executes at most `budget` instructions (local calls included) and
//! fails with [`Fault::Budget`] beyond. Local calls nest at most [`MAX_CALL_DEPTH`] deep.
//! Runs of one `Program` are serialised by `&mut self`; atomics are therefore plain
//! read-modify-writes.

mod elf;
mod helpers;
mod insn;
mod interp;
mod maps;
mod mem;
#[cfg(test)]
mod tests;

use std::fmt;

use helpers::Env;
use insn::{Insn, RawInsn};
pub use maps::MapDeclError;
use maps::MapStore;
use mem::Mem;

/// The headers policies are built against (`phos_policy.h` and the generated
/// `phos_spec.h`), for tests that compile policies.
#[doc(hidden)]
pub const INCLUDE_DIR: &str = concat!(env!("OUT_DIR"), "/include");

/// Most instructions a program may have (after linking its local functions).
pub const MAX_INSNS: usize = 65536;
/// Most nested local calls.
pub const MAX_CALL_DEPTH: usize = 8;
/// Most maps (data sections included) a program may have.
pub const MAX_MAPS: usize = 64;

/// A loaded, checked policy with its maps.
pub struct Program {
    name: String,
    spec_hash: Option<u64>,
    /// As loaded and relocated, for the disassembler.
    raw: Vec<RawInsn>,
    insns: Vec<Insn>,
    maps: Vec<MapStore>,
    stack: Vec<u8>,
    rng: u64,
    scratch: Vec<u8>,
}

const _: () = {
    const fn is_send<T: Send>() {}
    is_send::<Program>();
};

/// A map of a loaded program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapInfo {
    /// The map's variable name, or the data section's name (`.rodata`, `.data`, `.bss`...).
    pub name: String,
    /// The kernel's map type (BPF_MAP_TYPE_*); data sections are arrays (2).
    pub kind: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// Entries in use (arrays: always max_entries).
    pub entries: usize,
}

/// Why an object could not be loaded.
#[derive(thiserror::Error, Debug)]
pub enum LoadError {
    #[error("not a valid policy object: {0}")]
    Malformed(String),
    #[error("cannot set global `{name}`: {why}")]
    Global { name: String, why: String },
    #[error("relocation failed: {0}")]
    Relocation(String),
    #[error("no program: no function in a section `tracepoint/phos/<name>` (declare it with PHOS_ENTRY)")]
    NoProgram,
    #[error("several programs in sections `tracepoint/phos/*` ({}): a policy has exactly one", .0.join(", "))]
    SeveralPrograms(Vec<String>),
    #[error("map `{name}`: {why}")]
    Map { name: String, why: maps::MapDeclError },
    #[error("instruction {pc}: {why}")]
    Instruction { pc: usize, why: String },
    #[error("instruction {pc}: unknown helper {id} (available: {})", helper_list())]
    UnknownHelper { pc: usize, id: i64 },
    #[error("the program has {count} instructions, more than the limit of {MAX_INSNS}")]
    TooLarge { count: usize },
}

fn helper_list() -> String {
    insn::HELPERS.iter().map(|(id, name)| format!("{id} {name}")).collect::<Vec<_>>().join(", ")
}

fn helper_label(id: &u32) -> &'static str {
    insn::helper_name(i64::from(*id)).unwrap_or("unknown")
}

fn access(write: &bool) -> &'static str {
    if *write { "store" } else { "load" }
}

/// Why a run failed. The run's effects on maps up to the fault remain.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    #[error("exceeded its budget of {budget} instructions (at instruction {pc})")]
    Budget { budget: u64, pc: usize },
    #[error("instruction {pc}: invalid {len}-byte {} at {addr:#x}: {region}", access(.write))]
    Memory {
        pc: usize,
        addr: u64,
        len: usize,
        write: bool,
        /// Where `addr` points, in words.
        region: String,
    },
    #[error("instruction {pc}: helper {id} ({}): {why}", helper_label(.id))]
    Helper { pc: usize, id: u32, why: String },
    #[error("instruction {pc} cannot be executed")]
    BadInstruction { pc: usize },
    #[error("instruction {pc}: local calls nested deeper than {MAX_CALL_DEPTH}")]
    CallDepth { pc: usize },
}

/// Why a host access to a map failed.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum MapError {
    #[error("no map named `{0}`")]
    NoSuchMap(String),
    #[error("map `{map}`: the key is {got} bytes, expected {expected}")]
    KeySize { map: String, expected: u32, got: usize },
    #[error("map `{map}`: the value is {got} bytes, expected {expected}")]
    ValueSize { map: String, expected: u32, got: usize },
    #[error("map `{0}` is read-only")]
    ReadOnly(String),
    #[error("map `{0}` is full")]
    Full(String),
    #[error("map `{0}`: index out of range")]
    OutOfRange(String),
    #[error("map `{0}`: no such key")]
    NoSuchKey(String),
    #[error("map `{0}`: array entries cannot be deleted")]
    NotDeletable(String),
}

impl Program {
    /// Parses an ELF object, sets `globals` (name -> bytes, each the size of its variable;
    /// an unknown name is an error), relocates it, picks its single program (section
    /// `tracepoint/phos/<name>`), checks it statically and creates its maps.
    pub fn load(elf: &[u8], globals: &[(&str, Vec<u8>)]) -> Result<Program, LoadError> {
        let checked = elf::precheck(elf)?;
        let linked = elf::link(&checked, globals)?;
        if linked.maps.len() > MAX_MAPS {
            return Err(LoadError::Malformed(format!(
                "{} maps and data sections, more than the limit of {MAX_MAPS}",
                linked.maps.len()
            )));
        }
        let mut total = 0u64;
        let mut maps = Vec::with_capacity(linked.maps.len());
        for def in linked.maps {
            let cost = match &def.data {
                Some((bytes, _)) => bytes.len() as u64,
                None => maps::storage_cost(def.type_id, def.key_size, def.value_size, def.max_entries),
            };
            total = total.saturating_add(cost);
            if total > maps::MAX_MAP_STORAGE {
                return Err(LoadError::Map { name: def.name, why: maps::MapDeclError::TooLargeTogether });
            }
            maps.push(match def.data {
                Some((bytes, read_only)) => MapStore::data(&def.name, bytes, read_only),
                None => MapStore::new(&def.name, def.type_id, def.key_size, def.value_size, def.max_entries)
                    .map_err(|why| LoadError::Map { name: def.name.clone(), why })?,
            });
        }
        Program::assemble(linked.name, checked.spec_hash, linked.insns, maps)
    }

    /// Checks `raw` against `maps` and builds the program.
    pub(crate) fn assemble(
        name: String,
        spec_hash: Option<u64>,
        raw: Vec<RawInsn>,
        maps: Vec<MapStore>,
    ) -> Result<Program, LoadError> {
        let insns = insn::check(&raw, &maps)?;
        Ok(Program {
            name,
            spec_hash,
            raw,
            insns,
            maps,
            stack: vec![0; mem::FRAMES * mem::STACK_SIZE],
            rng: helpers::random_seed(),
            scratch: Vec::new(),
        })
    }

    /// The program (function) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The spec hash the policy was built against (section `phos_spec`), if it says.
    pub fn spec_hash(&self) -> Option<u64> {
        self.spec_hash
    }

    /// Instructions, local functions included (an ld_imm64 counts as two).
    pub fn instructions(&self) -> usize {
        self.insns.len()
    }

    pub fn maps(&self) -> Vec<MapInfo> {
        self.maps
            .iter()
            .map(|m| MapInfo {
                name: m.name.clone(),
                kind: m.type_id,
                key_size: m.key_size,
                value_size: m.value_size,
                max_entries: m.max_entries,
                entries: m.entries(),
            })
            .collect()
    }

    /// Runs the program once on `ctx` (read-only to it) and returns r0. At most `budget`
    /// instructions are executed, those of local calls included.
    pub fn run(&mut self, ctx: &[u8], budget: u64) -> Result<u64, Fault> {
        let mut env = Env {
            mem: Mem { ctx, stack: &mut self.stack, maps: &mut self.maps },
            rng: &mut self.rng,
            scratch: &mut self.scratch,
            name: &self.name,
        };
        interp::execute(&self.insns, &mut env, budget)
    }

    fn map(&self, name: &str) -> Result<&MapStore, MapError> {
        self.maps.iter().find(|m| m.name == name).ok_or_else(|| MapError::NoSuchMap(name.to_string()))
    }

    fn map_mut_checked(&mut self, name: &str, key: &[u8]) -> Result<&mut MapStore, MapError> {
        let m = self.maps.iter_mut().find(|m| m.name == name).ok_or_else(|| MapError::NoSuchMap(name.to_string()))?;
        if key.len() != m.key_size as usize {
            return Err(MapError::KeySize { map: name.to_string(), expected: m.key_size, got: key.len() });
        }
        Ok(m)
    }

    /// The value for `key` in map `map` (a copy), if present.
    pub fn map_lookup(&self, map: &str, key: &[u8]) -> Option<Vec<u8>> {
        let m = self.map(map).ok()?;
        if key.len() != m.key_size as usize {
            return None;
        }
        let off = m.peek(key)?;
        m.values.get(off..off + m.value_size as usize).map(<[u8]>::to_vec)
    }

    /// Sets the value for `key` in map `map` (creating the entry in a hash map).
    pub fn map_update(&mut self, map: &str, key: &[u8], value: &[u8]) -> Result<(), MapError> {
        let m = self.map_mut_checked(map, key)?;
        if value.len() != m.value_size as usize {
            return Err(MapError::ValueSize { map: map.to_string(), expected: m.value_size, got: value.len() });
        }
        let hash = !m.is_array();
        m.update(key, value, maps::BPF_ANY).map_err(|e| match e {
            libc::EPERM => MapError::ReadOnly(map.to_string()),
            libc::E2BIG if hash => MapError::Full(map.to_string()),
            _ => MapError::OutOfRange(map.to_string()),
        })
    }

    /// Deletes the entry for `key` from hash map `map`.
    pub fn map_delete(&mut self, map: &str, key: &[u8]) -> Result<(), MapError> {
        let m = self.map_mut_checked(map, key)?;
        m.delete(key).map_err(|e| match e {
            libc::ENOENT => MapError::NoSuchKey(map.to_string()),
            libc::EPERM => MapError::ReadOnly(map.to_string()),
            _ => MapError::NotDeletable(map.to_string()),
        })
    }

    /// The keys in use in map `map` (arrays: every index), for listing.
    pub fn map_keys(&self, map: &str) -> Result<Vec<Vec<u8>>, MapError> {
        Ok(self.map(map)?.keys())
    }

    /// One readable line per instruction (`  pc: text`), local functions included.
    pub fn disassemble(&self) -> Vec<String> {
        (0..self.raw.len()).map(|pc| insn::disassemble(&self.raw, pc, &self.maps)).collect()
    }
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.name)
            .field("spec_hash", &self.spec_hash)
            .field("instructions", &self.insns.len())
            .field("maps", &self.maps.iter().map(|m| m.name.as_str()).collect::<Vec<_>>())
            .finish()
    }
}
