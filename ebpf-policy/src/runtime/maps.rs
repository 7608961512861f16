//! Map storage. Every map's values live in one buffer allocated at load and never resized,
//! so that a value address handed to the program stays inside a valid region for the
//! program's lifetime (what it points to may change once the entry is deleted, as in the
//! kernel, but it is never freed memory).

use std::collections::HashMap;

pub(crate) const BPF_MAP_TYPE_HASH: u32 = 1;
pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(crate) const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
pub(crate) const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub(crate) const BPF_MAP_TYPE_LRU_HASH: u32 = 9;

pub(crate) const BPF_ANY: u64 = 0;
pub(crate) const BPF_NOEXIST: u64 = 1;
pub(crate) const BPF_EXIST: u64 = 2;

/// Largest key or value.
pub(crate) const MAX_KEY_VALUE_SIZE: u32 = 64 * 1024;
/// Largest total storage of a program's maps (values, keys and index slots).
pub(crate) const MAX_MAP_STORAGE: u64 = 64 * 1024 * 1024;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Hash,
    LruHash,
    Array,
    /// A data section (.rodata*, .data*, .bss*): an array of one value, the section's bytes.
    Data,
}

pub(crate) struct MapStore {
    pub name: String,
    pub type_id: u32,
    pub kind: Kind,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// Read-only to the program (.rodata); the host cannot update it either (like a frozen map).
    pub read_only: bool,
    /// max_entries * value_size bytes; entry `slot` at `slot * value_size`.
    pub values: Vec<u8>,
    hash: Option<HashIndex>,
}

struct HashIndex {
    slots: HashMap<Box<[u8]>, u32>,
    /// The key of each used slot (max_entries * key_size), to find an evicted entry's key.
    keys: Vec<u8>,
    free: Vec<u32>,
    lru: Option<Lru>,
}

/// Recency order of the used slots, a doubly linked list through slot numbers.
struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used: evicted first.
    tail: u32,
}

impl Lru {
    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NIL {
            self.head = n
        } else {
            self.next[p as usize] = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.prev[n as usize] = p
        }
        self.prev[s as usize] = NIL;
        self.next[s as usize] = NIL;
    }

    fn push_front(&mut self, s: u32) {
        self.prev[s as usize] = NIL;
        self.next[s as usize] = self.head;
        if self.head == NIL {
            self.tail = s
        } else {
            self.prev[self.head as usize] = s
        }
        self.head = s;
    }

    fn touch(&mut self, s: u32) {
        if self.head != s {
            self.unlink(s);
            self.push_front(s);
        }
    }
}

/// Why a map declaration is refused (a host access to a map fails with a [`super::MapError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapDeclError {
    #[error("unsupported map type {0} (supported: 1 hash, 2 array, 5, 6, 9 lru hash)")]
    Type(u32),
    #[error("{what} size {size} is not in 1..={MAX_KEY_VALUE_SIZE}")]
    Size { what: &'static str, size: u32 },
    #[error("array maps have 4-byte keys, not {0}")]
    ArrayKey(u32),
    #[error("max_entries is 0")]
    NoEntries,
    #[error("needs {0} bytes of storage, more than the limit of {MAX_MAP_STORAGE}")]
    TooLarge(u64),
    #[error("the maps need more than the limit of {MAX_MAP_STORAGE} bytes together")]
    TooLargeTogether,
}

/// Bytes a map of this shape takes, to enforce [`MAX_MAP_STORAGE`].
pub(crate) fn storage_cost(type_id: u32, key_size: u32, value_size: u32, max_entries: u32) -> u64 {
    let n = u64::from(max_entries);
    let mut cost = n * u64::from(value_size);
    if matches!(type_id, BPF_MAP_TYPE_HASH | BPF_MAP_TYPE_PERCPU_HASH | BPF_MAP_TYPE_LRU_HASH) {
        // Keys twice (slot table and index), the free list, and a rough index overhead.
        cost += n * (2 * u64::from(key_size) + 4 + 32);
        if type_id == BPF_MAP_TYPE_LRU_HASH {
            cost += n * 8;
        }
    }
    cost
}

impl MapStore {
    /// A map declared with PHOS_MAP (section `maps`).
    pub(crate) fn new(
        name: &str,
        type_id: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> Result<MapStore, MapDeclError> {
        let kind = match type_id {
            BPF_MAP_TYPE_HASH | BPF_MAP_TYPE_PERCPU_HASH => Kind::Hash,
            BPF_MAP_TYPE_LRU_HASH => Kind::LruHash,
            BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY => Kind::Array,
            t => return Err(MapDeclError::Type(t)),
        };
        for (what, size) in [("key", key_size), ("value", value_size)] {
            if size == 0 || size > MAX_KEY_VALUE_SIZE {
                return Err(MapDeclError::Size { what, size });
            }
        }
        if kind == Kind::Array && key_size != 4 {
            return Err(MapDeclError::ArrayKey(key_size));
        }
        if max_entries == 0 {
            return Err(MapDeclError::NoEntries);
        }
        let cost = storage_cost(type_id, key_size, value_size, max_entries);
        if cost > MAX_MAP_STORAGE {
            return Err(MapDeclError::TooLarge(cost));
        }
        let n = max_entries as usize;
        let hash = (kind != Kind::Array).then(|| HashIndex {
            slots: HashMap::new(),
            keys: vec![0; n * key_size as usize],
            // Reversed so that slots fill from 0 upwards.
            free: (0..max_entries).rev().collect(),
            lru: (kind == Kind::LruHash).then(|| Lru { prev: vec![NIL; n], next: vec![NIL; n], head: NIL, tail: NIL }),
        });
        Ok(MapStore {
            name: name.to_string(),
            type_id,
            kind,
            key_size,
            value_size,
            max_entries,
            read_only: false,
            values: vec![0; n * value_size as usize],
            hash,
        })
    }

    /// A data section as a map (its size is checked by the caller).
    pub(crate) fn data(name: &str, bytes: Vec<u8>, read_only: bool) -> MapStore {
        MapStore {
            name: name.to_string(),
            type_id: BPF_MAP_TYPE_ARRAY,
            kind: Kind::Data,
            key_size: 4,
            value_size: bytes.len() as u32,
            max_entries: 1,
            read_only,
            values: bytes,
            hash: None,
        }
    }

    /// Whether values can be addressed directly (ld_imm64 with a map value).
    pub(crate) fn is_array(&self) -> bool {
        matches!(self.kind, Kind::Array | Kind::Data)
    }

    pub(crate) fn entries(&self) -> usize {
        match &self.hash {
            Some(h) => h.slots.len(),
            None => self.max_entries as usize,
        }
    }

    fn array_index(&self, key: &[u8]) -> Option<usize> {
        let i = u32::from_le_bytes(*key.first_chunk::<4>()?);
        (i < self.max_entries).then_some(i as usize)
    }

    /// The byte offset in `values` of the entry for `key` (which is `key_size` bytes).
    /// `touch` marks an LRU entry as recently used (the program's lookups do, the host's not).
    pub(crate) fn find(&mut self, key: &[u8], touch: bool) -> Option<usize> {
        let vs = self.value_size as usize;
        match &mut self.hash {
            None => self.array_index(key).map(|i| i * vs),
            Some(h) => {
                let slot = *h.slots.get(key)?;
                if touch && let Some(lru) = &mut h.lru {
                    lru.touch(slot);
                }
                Some(slot as usize * vs)
            }
        }
    }

    /// Like `find` without touching anything.
    pub(crate) fn peek(&self, key: &[u8]) -> Option<usize> {
        let vs = self.value_size as usize;
        match &self.hash {
            None => self.array_index(key).map(|i| i * vs),
            Some(h) => h.slots.get(key).map(|&s| s as usize * vs),
        }
    }

    fn write_value(&mut self, at: usize, value: &[u8]) -> Result<(), i32> {
        let dst = self.values.get_mut(at..at + value.len()).ok_or(libc::EINVAL)?;
        dst.copy_from_slice(value);
        Ok(())
    }

    /// The kernel's map_update_elem: `Err(errno)` on failure.
    pub(crate) fn update(&mut self, key: &[u8], value: &[u8], flags: u64) -> Result<(), i32> {
        if flags > BPF_EXIST {
            return Err(libc::EINVAL);
        }
        if key.len() != self.key_size as usize || value.len() != self.value_size as usize {
            return Err(libc::EINVAL);
        }
        if self.read_only {
            return Err(libc::EPERM);
        }
        let vs = self.value_size as usize;
        let ks = self.key_size as usize;
        let Some(h) = &mut self.hash else {
            // Array entries always exist.
            if flags == BPF_NOEXIST {
                return Err(libc::EEXIST);
            }
            let i = self.array_index(key).ok_or(libc::E2BIG)?;
            return self.write_value(i * vs, value);
        };
        if let Some(&slot) = h.slots.get(key) {
            if flags == BPF_NOEXIST {
                return Err(libc::EEXIST);
            }
            if let Some(lru) = &mut h.lru {
                lru.touch(slot);
            }
            return self.write_value(slot as usize * vs, value);
        }
        if flags == BPF_EXIST {
            return Err(libc::ENOENT);
        }
        let slot = match h.free.pop() {
            Some(s) => s,
            None => {
                // Full: an LRU map evicts its least recently used entry, others fail.
                let Some(lru) = &mut h.lru else { return Err(libc::E2BIG) };
                let victim = lru.tail;
                if victim == NIL {
                    return Err(libc::E2BIG);
                }
                lru.unlink(victim);
                let at = victim as usize * ks;
                h.slots.remove(&h.keys[at..at + ks]);
                self.values[victim as usize * vs..][..vs].fill(0);
                victim
            }
        };
        h.keys[slot as usize * ks..][..ks].copy_from_slice(key);
        h.slots.insert(key.into(), slot);
        if let Some(lru) = &mut h.lru {
            lru.push_front(slot);
        }
        self.write_value(slot as usize * vs, value)
    }

    /// The kernel's map_delete_elem: `Err(errno)` on failure. A deleted slot is zeroed.
    pub(crate) fn delete(&mut self, key: &[u8]) -> Result<(), i32> {
        let vs = self.value_size as usize;
        let ks = self.key_size as usize;
        let Some(h) = &mut self.hash else { return Err(libc::EINVAL) };
        if self.read_only {
            return Err(libc::EPERM);
        }
        let slot = h.slots.remove(key).ok_or(libc::ENOENT)?;
        if let Some(lru) = &mut h.lru {
            lru.unlink(slot);
        }
        h.keys[slot as usize * ks..][..ks].fill(0);
        self.values[slot as usize * vs..][..vs].fill(0);
        h.free.push(slot);
        Ok(())
    }

    /// Keys in use (for hash maps), in slot order.
    pub(crate) fn keys(&self) -> Vec<Vec<u8>> {
        match &self.hash {
            Some(h) => {
                let mut slots: Vec<(u32, &[u8])> = h.slots.iter().map(|(k, &s)| (s, &k[..])).collect();
                slots.sort_unstable_by_key(|&(s, _)| s);
                slots.into_iter().map(|(_, k)| k.to_vec()).collect()
            }
            None => (0..self.max_entries).map(|i| i.to_le_bytes().to_vec()).collect(),
        }
    }
}
