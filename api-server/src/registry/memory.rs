//! The session's device address space. The server reserves one fixed range of device virtual
//! addresses per session and places every allocation inside it, so a pointer means the same
//! thing before and after a restore or migration (and pointers stored in device memory stay
//! valid).
//!
//! Physical memory is mapped in blocks of the backend's granularity (2 MiB on current
//! GPUs): an allocation of at least half a block gets blocks of its own; smaller ones are
//! carved, 256-byte aligned like `cudaMalloc`'s, out of shared *slab* blocks that are unmapped
//! when their last allocation is freed.
//!
//! The same map answers the question every call from a guest raises: is `[addr, addr + len)`
//! memory this session may touch? And, for the C/R engine's protocols that copy while the
//! session runs, it keeps a dirty log ([`DirtyLog`]): each piece of [`DIRTY_PIECE`] bytes of
//! each allocation and module variable carries the round in which it was last written (noted
//! by the engine's pre-call hook, so it costs nothing while no protocol runs).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};
use phos_checkpoint::engine::{COPY_CHUNK, DirtyLog, Round};
use phos_protocol::CudaError;

use crate::backend::{Physical, VirtualMemory};

/// `cudaMalloc` returns pointers aligned to at least this.
pub const ALIGNMENT: u64 = 256;

/// Where sessions' device memory lives by default (96 TiB: clear of where Linux places
/// mappings, inside both the CPU's and the GPU's 47/49-bit address spaces).
pub const DEFAULT_BASE: u64 = 0x6000_0000_0000;
/// Size of the reserved range by default.
pub const DEFAULT_SIZE: u64 = 1 << 40;

#[derive(Debug)]
enum BlockKind {
    /// Backs one large allocation.
    Whole,
    /// Shared by small allocations: free runs by offset, and bytes in use.
    Slab { free: BTreeMap<u64, u64>, used: u64 },
    /// A mapping of the driver API's virtual memory management (`cuMemMap`) of physical
    /// handle `handle`, inside one of the program's reservations.
    Mapped { handle: u64 },
    /// Memory another session of the tenant exported (`cudaIpcOpenMemHandle`): the block
    /// maps all of the exporter's block; the allocation is the exported one inside it.
    Imported,
}

#[derive(Debug)]
struct Block {
    len: u64,
    device: i32,
    physical: Physical,
    kind: BlockKind,
}

/// One `cudaMalloc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub addr: u64,
    pub size: u64,
    pub device: i32,
    /// Start of the block it lives in.
    block: u64,
    /// Bytes it takes in its block (size rounded up).
    span: u64,
}

#[derive(Default)]
struct Inner {
    /// Unused address ranges: start -> length.
    holes: BTreeMap<u64, u64>,
    blocks: BTreeMap<u64, Block>,
    allocations: BTreeMap<u64, Allocation>,
    /// Device memory the session may use that the allocator did not hand out (module
    /// variables): start -> length.
    external: BTreeMap<u64, u64>,
    allocated: u64,
    /// Device memory of the C/R engine's own (check contexts of validated launches): kernels
    /// the server runs may reach it, the guest's calls may not, and it is no part of the
    /// session's image. Start -> length.
    engine: BTreeMap<u64, u64>,
    /// The dirty log: by the start of each allocation and external range, the rounds in
    /// which its pieces were last written (or made).
    written: BTreeMap<u64, Marks>,
    /// Address ranges the program reserved (`cuMemAddressReserve`): start -> length. They are
    /// out of `holes`; mappings live inside them.
    reservations: BTreeMap<u64, u64>,
    /// Physical memory handles (`cuMemCreate`), by handle.
    handles: BTreeMap<u64, PhysicalHandle>,
    next_handle: u64,
}

/// A `CUmemGenericAllocationHandle`: physical memory of `size` bytes of `device`. Phos backs
/// it when it is mapped (one mapping at a time, once: the memory is the mapping's) and gives
/// the memory back when it is unmapped.
#[derive(Debug, Clone, Copy)]
struct PhysicalHandle {
    size: u64,
    device: i32,
    /// Where it is mapped now.
    mapped_at: Option<u64>,
    /// Whether it was mapped before (its memory went with that mapping).
    was_mapped: bool,
    /// `cuMemRelease`d: it goes once unmapped.
    released: bool,
    /// References `cuMemRetainAllocationHandle` added, each given back by a `cuMemRelease`
    /// before the handle's own.
    retained: u32,
}

impl PhysicalHandle {
    /// Not released yet, or still referenced by a retain.
    fn live(&self) -> bool {
        !self.released || self.retained > 0
    }
}

/// What the virtual memory calls refuse, in the driver's terms (the service maps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VmmError {
    #[error("invalid value")]
    InvalidValue,
    #[error("out of memory")]
    OutOfMemory,
    #[error("not supported by Phos")]
    NotSupported,
    #[error("device: {0:?}")]
    Device(CudaError),
}

/// Handles of physical memory, tagged so that a stray number is not taken for one.
const HANDLE_TAG: u64 = 0x9E00_0000_0000_0000;

impl Inner {
    /// Whether `addr` starts an allocation opened from another session.
    fn is_imported_allocation(&self, addr: u64) -> bool {
        self.allocations
            .get(&addr)
            .and_then(|a| self.blocks.get(&a.block))
            .is_some_and(|b| matches!(b.kind, BlockKind::Imported))
    }

    /// See [`AddressSpace::contains`].
    fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len.max(1)) else { return false };
        let inside =
            |m: &BTreeMap<u64, u64>| m.range(..=addr).next_back().is_some_and(|(&start, &size)| end <= start + size);
        let Some((_, first)) =
            self.allocations.range(..=addr).next_back().filter(|(_, a)| addr < a.addr + a.size.max(1))
        else {
            return inside(&self.external);
        };
        // Mappings side by side in a reservation are one range of memory, as on a GPU.
        let mut reached = first.addr + first.size;
        while reached < end && self.is_mapping(first.block) {
            match self.allocations.get(&reached) {
                Some(next) if self.is_mapping(next.block) => reached = next.addr + next.size,
                _ => break,
            }
        }
        end <= reached
    }

    fn is_mapping(&self, block: u64) -> bool {
        self.blocks.get(&block).is_some_and(|b| matches!(b.kind, BlockKind::Mapped { .. }))
    }

    /// Unmap the mapping at `start` (its allocation and block), giving its memory back; its
    /// handle goes too if it was released. Returns the bytes freed.
    fn unmap_one(&mut self, backend: &dyn VirtualMemory, start: u64) -> Result<u64, CudaError> {
        let Some(block) = self.blocks.remove(&start) else { return Ok(0) };
        let BlockKind::Mapped { handle } = block.kind else {
            self.blocks.insert(start, block);
            return Err(CudaError::InvalidValue);
        };
        if let Some(a) = self.allocations.remove(&start) {
            self.allocated -= a.size;
        }
        self.written.remove(&start);
        if let Some(h) = self.handles.get_mut(&handle) {
            h.mapped_at = None;
            if !h.live() {
                self.handles.remove(&handle);
            }
        }
        backend.unmap(start, block.len, block.physical)?;
        Ok(block.len)
    }

    fn add(&mut self, a: Allocation, round: u64) {
        self.allocations.insert(a.addr, a);
        self.written.insert(a.addr, Marks::new(a.size, round));
        self.allocated += a.size;
    }

    /// The length of the allocation or external range at `start`.
    fn len_at(&self, start: u64) -> u64 {
        self.allocations.get(&start).map(|a| a.size).or_else(|| self.external.get(&start).copied()).unwrap_or(0)
    }
}

pub struct AddressSpace {
    base: u64,
    size: u64,
    /// Allocations the session may hold at once (its `allocations` limit).
    max_allocations: usize,
    /// Kernels that run in the server (`emu`) hold a read lock for their whole run, so the
    /// map cannot change under them; allocation and free take the write lock.
    inner: RwLock<Inner>,
    /// The dirty log's current round.
    round: AtomicU64,
}

/// A frozen view of the address space, held while a kernel runs.
pub struct MemoryView<'a>(RwLockReadGuard<'a, Inner>);

impl MemoryView<'_> {
    /// The allocation or module variable containing `addr`.
    pub fn region(&self, addr: u64) -> Option<Range<u64>> {
        let inner = &self.0;
        if let Some((_, a)) = inner.allocations.range(..=addr).next_back()
            && addr < a.addr + a.size
        {
            return Some(a.addr..a.addr + a.size);
        }
        let within = |m: &BTreeMap<u64, u64>| {
            let (&start, &len) = m.range(..=addr).next_back()?;
            (addr < start + len).then_some(start..start + len)
        };
        within(&inner.external).or_else(|| within(&inner.engine))
    }
}

fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

pub(crate) fn coalesce_insert(map: &mut BTreeMap<u64, u64>, mut start: u64, mut len: u64) {
    if let Some((&prev, &plen)) = map.range(..start).next_back()
        && prev + plen == start
    {
        map.remove(&prev);
        start = prev;
        len += plen;
    }
    if let Some(&nlen) = map.get(&(start + len)) {
        map.remove(&(start + len));
        len += nlen;
    }
    map.insert(start, len);
}

/// Take exactly `[start, start + len)` out of `holes`; false when it is not all free.
pub(crate) fn take_exact(holes: &mut BTreeMap<u64, u64>, start: u64, len: u64) -> bool {
    let Some((&h, &hlen)) = holes.range(..=start).next_back() else { return false };
    let Some(end) = start.checked_add(len) else { return false };
    if end > h + hlen {
        return false;
    }
    holes.remove(&h);
    if start > h {
        holes.insert(h, start - h);
    }
    if end < h + hlen {
        holes.insert(end, h + hlen - end);
    }
    true
}

/// First fit of `len` bytes aligned to `align` among `holes`; the hole is split.
pub(crate) fn take_first_fit(holes: &mut BTreeMap<u64, u64>, len: u64, align: u64) -> Option<u64> {
    let (start, hole_len, at) = holes.iter().find_map(|(&start, &hole_len)| {
        let at = round_up(start, align)?;
        (at.checked_add(len)? <= start + hole_len).then_some((start, hole_len, at))
    })?;
    holes.remove(&start);
    if at > start {
        holes.insert(start, at - start);
    }
    let end = at + len;
    if end < start + hole_len {
        holes.insert(end, start + hole_len - end);
    }
    Some(at)
}

impl AddressSpace {
    /// Reserve `[base, base + size)` on the backend, for at most `max_allocations`
    /// allocations at once.
    pub fn reserve(backend: &dyn VirtualMemory, base: u64, size: u64, max_allocations: u64) -> Result<Self, CudaError> {
        backend.reserve(base, size)?;
        let mut inner = Inner::default();
        inner.holes.insert(base, size);
        let max_allocations = usize::try_from(max_allocations).unwrap_or(usize::MAX);
        Ok(AddressSpace { base, size, max_allocations, inner: RwLock::new(inner), round: AtomicU64::new(0) })
    }

    /// Whether the session holds as many allocations as it may.
    pub fn at_limit(&self) -> bool {
        self.inner.read().allocations.len() >= self.max_allocations
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes currently allocated (as asked for).
    pub fn allocated(&self) -> u64 {
        self.inner.read().allocated
    }

    /// Freeze the map for a kernel's run.
    pub fn view(&self) -> MemoryView<'_> {
        MemoryView(self.inner.read())
    }

    /// Allocate `size` bytes on `device`; 0 bytes gives the null pointer.
    pub fn alloc(&self, backend: &dyn VirtualMemory, device: i32, size: u64) -> Result<u64, CudaError> {
        if size == 0 {
            return Ok(0);
        }
        let gran = backend.granularity(device).max(ALIGNMENT);
        let mut g = self.inner.write();
        let inner = &mut *g;
        if inner.allocations.len() >= self.max_allocations {
            return Err(CudaError::MemoryAllocation);
        }
        if size >= gran / 2 {
            let len = round_up(size, gran).ok_or(CudaError::MemoryAllocation)?;
            let addr = take_first_fit(&mut inner.holes, len, gran).ok_or(CudaError::MemoryAllocation)?;
            let physical = match backend.map(device, addr, len) {
                Ok(p) => p,
                Err(e) => {
                    coalesce_insert(&mut inner.holes, addr, len);
                    return Err(e);
                }
            };
            inner.blocks.insert(addr, Block { len, device, physical, kind: BlockKind::Whole });
            inner.add(Allocation { addr, size, device, block: addr, span: len }, self.round.load(Ordering::Relaxed));
            return Ok(addr);
        }
        let span = round_up(size, ALIGNMENT).expect("small");
        // First slab of this device with room, else a new one.
        let mut found = None;
        for (&start, block) in inner.blocks.iter_mut() {
            if block.device != device {
                continue;
            }
            if let BlockKind::Slab { free, used } = &mut block.kind
                && let Some(off) = take_first_fit(free, span, ALIGNMENT)
            {
                *used += span;
                found = Some(start + off);
                break;
            }
        }
        let addr = match found {
            Some(a) => a,
            None => {
                let start = take_first_fit(&mut inner.holes, gran, gran).ok_or(CudaError::MemoryAllocation)?;
                let physical = match backend.map(device, start, gran) {
                    Ok(p) => p,
                    Err(e) => {
                        coalesce_insert(&mut inner.holes, start, gran);
                        return Err(e);
                    }
                };
                let mut free = BTreeMap::new();
                free.insert(span, gran - span);
                inner
                    .blocks
                    .insert(start, Block { len: gran, device, physical, kind: BlockKind::Slab { free, used: span } });
                start
            }
        };
        let block = *inner.blocks.range(..=addr).next_back().expect("allocated inside a block").0;
        inner.add(Allocation { addr, size, device, block, span }, self.round.load(Ordering::Relaxed));
        Ok(addr)
    }

    /// Allocate `size` bytes at exactly `addr` (a restore puts every allocation back where
    /// it was). Fails with `cudaErrorMemoryAllocation` when that memory is not free.
    pub fn alloc_at(&self, backend: &dyn VirtualMemory, device: i32, addr: u64, size: u64) -> Result<u64, CudaError> {
        if size == 0 {
            return Ok(0);
        }
        let gran = backend.granularity(device).max(ALIGNMENT);
        let mut g = self.inner.write();
        let inner = &mut *g;
        let taken = Err(CudaError::MemoryAllocation);
        if inner.allocations.len() >= self.max_allocations {
            return taken;
        }
        if size >= gran / 2 {
            let len = round_up(size, gran).ok_or(CudaError::MemoryAllocation)?;
            if !addr.is_multiple_of(gran) || !take_exact(&mut inner.holes, addr, len) {
                return taken;
            }
            let physical = match backend.map(device, addr, len) {
                Ok(p) => p,
                Err(e) => {
                    coalesce_insert(&mut inner.holes, addr, len);
                    return Err(e);
                }
            };
            inner.blocks.insert(addr, Block { len, device, physical, kind: BlockKind::Whole });
            inner.add(Allocation { addr, size, device, block: addr, span: len }, self.round.load(Ordering::Relaxed));
            return Ok(addr);
        }
        if !addr.is_multiple_of(ALIGNMENT) {
            return taken;
        }
        let span = round_up(size, ALIGNMENT).expect("small");
        let start = addr / gran * gran;
        if !inner.blocks.contains_key(&start) {
            if !take_exact(&mut inner.holes, start, gran) {
                return taken;
            }
            let physical = match backend.map(device, start, gran) {
                Ok(p) => p,
                Err(e) => {
                    coalesce_insert(&mut inner.holes, start, gran);
                    return Err(e);
                }
            };
            let mut free = BTreeMap::new();
            free.insert(0, gran);
            inner.blocks.insert(start, Block { len: gran, device, physical, kind: BlockKind::Slab { free, used: 0 } });
        }
        let block = inner.blocks.get_mut(&start).expect("present");
        let BlockKind::Slab { free, used } = &mut block.kind else { return taken };
        if block.device != device || !take_exact(free, addr - start, span) {
            return taken;
        }
        *used += span;
        inner.add(Allocation { addr, size, device, block: start, span }, self.round.load(Ordering::Relaxed));
        Ok(addr)
    }

    /// Free the allocation that starts at `addr`; returns its size. Anything else is
    /// `cudaErrorInvalidValue`, as CUDA answers a free of a pointer it did not hand out.
    pub fn free(&self, backend: &dyn VirtualMemory, addr: u64) -> Result<Allocation, CudaError> {
        let mut g = self.inner.write();
        let inner = &mut *g;
        // A mapping of the program's is unmapped, not freed (cudaFree refuses it).
        if inner.is_mapping(addr) || inner.is_imported_allocation(addr) {
            return Err(CudaError::InvalidValue);
        }
        let a = inner.allocations.remove(&addr).ok_or(CudaError::InvalidValue)?;
        inner.written.remove(&addr);
        inner.allocated -= a.size;
        let block = inner.blocks.get_mut(&a.block).expect("allocation's block");
        let release = match &mut block.kind {
            BlockKind::Whole | BlockKind::Mapped { .. } | BlockKind::Imported => true,
            BlockKind::Slab { free, used } => {
                coalesce_insert(free, a.addr - a.block, a.span);
                *used -= a.span;
                *used == 0
            }
        };
        if release {
            let block = inner.blocks.remove(&a.block).expect("block");
            backend.unmap(a.block, block.len, block.physical)?;
            coalesce_insert(&mut inner.holes, a.block, block.len);
        }
        Ok(a)
    }

    /// Free everything (device reset, session end). Returns the allocations that were live.
    pub fn free_all(&self, backend: &dyn VirtualMemory, device: Option<i32>) -> Vec<Allocation> {
        let addrs: Vec<u64> = {
            let g = self.inner.read();
            g.allocations.values().filter(|a| device.is_none_or(|d| a.device == d)).map(|a| a.addr).collect()
        };
        let mut freed = Vec::new();
        for addr in addrs {
            if self.inner.read().is_imported_allocation(addr) {
                freed.extend(self.close_imported(backend, addr).ok());
                continue;
            }
            let mapping = {
                let mut g = self.inner.write();
                let a = g.allocations.get(&addr).copied();
                if g.is_mapping(addr) {
                    let _ = g.unmap_one(backend, addr);
                    a
                } else {
                    None
                }
            };
            freed.extend(mapping.or_else(|| self.free(backend, addr).ok()));
        }
        if device.is_none() {
            // The session's end: its reservations and handles go too.
            let mut g = self.inner.write();
            let inner = &mut *g;
            for (start, len) in std::mem::take(&mut inner.reservations) {
                coalesce_insert(&mut inner.holes, start, len);
            }
            inner.handles.clear();
        }
        freed
    }

    /// Run `export` on the block of the allocation containing `addr` under the map's write
    /// lock (no kernel runs meanwhile): `(allocation, block start, block length, physical)`.
    /// Memory of the program's virtual memory management and opened IPC memory are
    /// `cudaErrorInvalidValue`, as is an address in no allocation.
    pub fn with_allocation_block<T>(
        &self,
        addr: u64,
        export: impl FnOnce(Allocation, u64, u64, Physical) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        let g = self.inner.write();
        let (_, a) = g.allocations.range(..=addr).next_back().ok_or(CudaError::InvalidValue)?;
        if addr >= a.addr + a.size.max(1) {
            return Err(CudaError::InvalidValue);
        }
        let block = g.blocks.get(&a.block).ok_or(CudaError::InvalidValue)?;
        if !matches!(block.kind, BlockKind::Whole | BlockKind::Slab { .. }) {
            return Err(CudaError::InvalidValue);
        }
        export(*a, a.block, block.len, block.physical)
    }

    /// Map `block_len` bytes another session exported (`import` maps them at the address it
    /// is given) and make `[start + offset, + size)` of them an allocation; its address.
    pub fn import(
        &self,
        device: i32,
        block_len: u64,
        offset: u64,
        size: u64,
        align: u64,
        import: impl FnOnce(u64) -> Result<Physical, CudaError>,
    ) -> Result<u64, CudaError> {
        let mut g = self.inner.write();
        let inner = &mut *g;
        if inner.allocations.len() >= self.max_allocations {
            return Err(CudaError::MemoryAllocation);
        }
        let start =
            take_first_fit(&mut inner.holes, block_len, align.max(ALIGNMENT)).ok_or(CudaError::MemoryAllocation)?;
        let physical = match import(start) {
            Ok(p) => p,
            Err(e) => {
                coalesce_insert(&mut inner.holes, start, block_len);
                return Err(e);
            }
        };
        inner.blocks.insert(start, Block { len: block_len, device, physical, kind: BlockKind::Imported });
        let a = Allocation { addr: start + offset, size, device, block: start, span: block_len };
        inner.add(a, self.round.load(Ordering::Relaxed));
        Ok(a.addr)
    }

    /// Unmap opened IPC memory whose allocation starts at `addr`; anything else is
    /// `cudaErrorInvalidValue`.
    pub fn close_imported(&self, backend: &dyn VirtualMemory, addr: u64) -> Result<Allocation, CudaError> {
        let mut g = self.inner.write();
        let inner = &mut *g;
        if !inner.is_imported_allocation(addr) {
            return Err(CudaError::InvalidValue);
        }
        let a = inner.allocations.remove(&addr).expect("checked");
        inner.written.remove(&addr);
        inner.allocated -= a.size;
        let block = inner.blocks.remove(&a.block).expect("allocation's block");
        backend.unmap(a.block, block.len, block.physical)?;
        coalesce_insert(&mut inner.holes, a.block, block.len);
        Ok(a)
    }

    /// Whether the session holds memory opened from another session.
    pub fn has_imported(&self) -> bool {
        self.inner.read().blocks.values().any(|b| matches!(b.kind, BlockKind::Imported))
    }

    /// Live allocations, by address.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.inner.read().allocations.values().copied().collect()
    }

    /// The allocation containing `addr`.
    pub fn allocation_at(&self, addr: u64) -> Option<Allocation> {
        let g = self.inner.read();
        let (_, a) = g.allocations.range(..=addr).next_back()?;
        (addr < a.addr + a.size).then_some(*a)
    }

    /// Let the session use `[addr, addr + len)` (a module variable).
    pub fn add_external(&self, addr: u64, len: u64) {
        if len > 0 {
            let mut g = self.inner.write();
            g.external.insert(addr, len);
            g.written.insert(addr, Marks::new(len, self.round.load(Ordering::Relaxed)));
        }
    }

    pub fn remove_external(&self, addr: u64) {
        let mut g = self.inner.write();
        if g.external.remove(&addr).is_some() {
            g.written.remove(&addr);
        }
    }

    /// Let kernels the server runs reach `[addr, addr + len)`, the C/R engine's own memory
    /// (not the guest's calls, nor the session's image).
    pub fn add_engine(&self, addr: u64, len: u64) {
        self.inner.write().engine.insert(addr, len);
    }

    /// Undo [`add_engine`](Self::add_engine).
    pub fn remove_engine(&self, addr: u64) {
        self.inner.write().engine.remove(&addr);
    }

    /// The device whose memory backs the allocation containing `addr`.
    pub fn device_of(&self, addr: u64) -> Option<i32> {
        let g = self.inner.read();
        g.allocations.range(..=addr).next_back().filter(|(_, a)| addr < a.addr + a.size.max(1)).map(|(_, a)| a.device)
    }

    /// The allocation or module variable containing `addr`, as (start, length).
    pub fn region_of(&self, addr: u64) -> Option<(u64, u64)> {
        let g = self.inner.read();
        let (&start, _) = g.written.range(..=addr).next_back()?;
        let len = g.len_at(start);
        (addr < start.saturating_add(len)).then_some((start, len))
    }

    /// Every allocation and module variable, as (start, length): all a kernel could write.
    pub fn regions(&self) -> Vec<(u64, u64)> {
        let g = self.inner.read();
        g.written.keys().map(|&start| (start, g.len_at(start))).collect()
    }

    /// Is `[addr, addr + len)` inside one allocation (or module variable) of this session?
    /// A length of 0 asks whether `addr` itself is.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        self.inner.read().contains(addr, len)
    }

    /// The first of `ranges` (address, length) that [`contains`](Self::contains) refuses, if
    /// one does: the ranges of one call (a matmul's matrices) checked under one lock.
    pub fn first_outside(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Option<usize> {
        let g = self.inner.read();
        ranges.into_iter().position(|(addr, len)| !g.contains(addr, len))
    }

    /// Reserve `size` bytes of address space for the program's own mappings, at `hint` when
    /// that is free, else anywhere, aligned to `alignment` (0: the granularity).
    pub fn reserve_range(
        &self,
        backend: &dyn VirtualMemory,
        device: i32,
        size: u64,
        alignment: u64,
        hint: u64,
    ) -> Result<u64, VmmError> {
        let gran = backend.granularity(device).max(ALIGNMENT);
        if size == 0 || !size.is_multiple_of(gran) || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(VmmError::InvalidValue);
        }
        let align = alignment.max(gran);
        let mut g = self.inner.write();
        let inner = &mut *g;
        if inner.reservations.len() >= self.max_allocations {
            return Err(VmmError::OutOfMemory);
        }
        let at = if hint != 0 && hint.is_multiple_of(align) && take_exact(&mut inner.holes, hint, size) {
            hint
        } else {
            take_first_fit(&mut inner.holes, size, align).ok_or(VmmError::OutOfMemory)?
        };
        inner.reservations.insert(at, size);
        Ok(at)
    }

    /// Give a reservation back whole; nothing may be mapped in it.
    pub fn free_range(&self, addr: u64, size: u64) -> Result<(), VmmError> {
        let mut g = self.inner.write();
        let inner = &mut *g;
        if inner.reservations.get(&addr) != Some(&size) {
            return Err(VmmError::InvalidValue);
        }
        if inner.blocks.range(addr..addr + size).next().is_some() {
            return Err(VmmError::InvalidValue);
        }
        inner.reservations.remove(&addr);
        coalesce_insert(&mut inner.holes, addr, size);
        Ok(())
    }

    /// A handle of `size` bytes of `device`'s memory (a multiple of the granularity).
    pub fn create_handle(&self, backend: &dyn VirtualMemory, device: i32, size: u64) -> Result<u64, VmmError> {
        let gran = backend.granularity(device).max(ALIGNMENT);
        if size == 0 || !size.is_multiple_of(gran) || size > self.size {
            return Err(VmmError::InvalidValue);
        }
        let mut g = self.inner.write();
        if g.handles.len() >= self.max_allocations {
            return Err(VmmError::OutOfMemory);
        }
        g.next_handle += 1;
        let handle = HANDLE_TAG | g.next_handle;
        g.handles.insert(
            handle,
            PhysicalHandle { size, device, mapped_at: None, was_mapped: false, released: false, retained: 0 },
        );
        Ok(handle)
    }

    /// `cuMemRelease`: the handle goes now, or when its mapping is unmapped.
    pub fn release_handle(&self, handle: u64) -> Result<(), VmmError> {
        let mut g = self.inner.write();
        let h = g.handles.get_mut(&handle).filter(|h| h.live()).ok_or(VmmError::InvalidValue)?;
        if h.retained > 0 {
            h.retained -= 1;
            if h.released && h.retained == 0 && h.mapped_at.is_none() {
                g.handles.remove(&handle);
            }
            return Ok(());
        }
        if h.mapped_at.is_some() {
            h.released = true;
        } else {
            g.handles.remove(&handle);
        }
        Ok(())
    }

    /// The size and device of a live handle.
    pub fn handle_info(&self, handle: u64) -> Result<(u64, i32), VmmError> {
        let g = self.inner.read();
        let h = g.handles.get(&handle).filter(|h| h.live()).ok_or(VmmError::InvalidValue)?;
        Ok((h.size, h.device))
    }

    /// Map `handle` (all of it: `size` is its size) at `addr`, inside one reservation and
    /// over nothing mapped. Its memory is then an allocation of the session like any other.
    pub fn map_handle(&self, backend: &dyn VirtualMemory, addr: u64, size: u64, handle: u64) -> Result<(), VmmError> {
        let mut g = self.inner.write();
        let inner = &mut *g;
        let h = *inner.handles.get(&handle).filter(|h| h.live()).ok_or(VmmError::InvalidValue)?;
        if size != h.size {
            // Part of a handle, at an offset: not carried.
            return Err(VmmError::NotSupported);
        }
        if h.mapped_at.is_some() || h.was_mapped {
            // One mapping of a handle at a time, once (see PhysicalHandle).
            return Err(VmmError::NotSupported);
        }
        let end = addr.checked_add(size).ok_or(VmmError::InvalidValue)?;
        let gran = backend.granularity(h.device).max(ALIGNMENT);
        let in_reservation =
            inner.reservations.range(..=addr).next_back().is_some_and(|(&start, &len)| end <= start + len);
        if !addr.is_multiple_of(gran) || !in_reservation {
            return Err(VmmError::InvalidValue);
        }
        let overlaps = inner.blocks.range(..end).next_back().is_some_and(|(&start, b)| start + b.len > addr);
        if overlaps {
            return Err(VmmError::InvalidValue);
        }
        if inner.allocations.len() >= self.max_allocations {
            return Err(VmmError::OutOfMemory);
        }
        let physical = backend.map(h.device, addr, size).map_err(|e| match e {
            CudaError::MemoryAllocation => VmmError::OutOfMemory,
            e => VmmError::Device(e),
        })?;
        inner.blocks.insert(addr, Block { len: size, device: h.device, physical, kind: BlockKind::Mapped { handle } });
        let round = self.round.load(Ordering::Relaxed);
        inner.add(Allocation { addr, size, device: h.device, block: addr, span: size }, round);
        if let Some(h) = inner.handles.get_mut(&handle) {
            h.mapped_at = Some(addr);
            h.was_mapped = true;
        }
        Ok(())
    }

    /// Unmap every mapping in `[addr, addr + size)`, which they must cover exactly.
    pub fn unmap_range(&self, backend: &dyn VirtualMemory, addr: u64, size: u64) -> Result<u64, VmmError> {
        let end = addr.checked_add(size).ok_or(VmmError::InvalidValue)?;
        let mut g = self.inner.write();
        let inner = &mut *g;
        let mut covered = addr;
        let mut starts = Vec::new();
        for (&start, b) in inner.blocks.range(addr..end) {
            if start != covered || !matches!(b.kind, BlockKind::Mapped { .. }) {
                return Err(VmmError::InvalidValue);
            }
            covered = start + b.len;
            starts.push(start);
        }
        if size == 0 || covered != end {
            return Err(VmmError::InvalidValue);
        }
        let mut freed = 0;
        for start in starts {
            freed += inner.unmap_one(backend, start).map_err(VmmError::Device)?;
        }
        Ok(freed)
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped where `addr` lies, with one more
    /// reference (a `cuMemRelease` gives it back).
    pub fn retain_handle(&self, addr: u64) -> Result<u64, VmmError> {
        let mut g = self.inner.write();
        let inner = &mut *g;
        let handle = match inner.blocks.range(..=addr).next_back() {
            Some((&start, b)) if addr < start + b.len => match b.kind {
                BlockKind::Mapped { handle } => handle,
                _ => return Err(VmmError::InvalidValue),
            },
            _ => return Err(VmmError::InvalidValue),
        };
        let h = inner.handles.get_mut(&handle).ok_or(VmmError::InvalidValue)?;
        h.retained = h.retained.checked_add(1).ok_or(VmmError::InvalidValue)?;
        Ok(handle)
    }

    /// The device of the mappings that cover `[addr, addr + size)` side by side; `None` when
    /// something else (or nothing) is there.
    pub fn mapped_range_device(&self, addr: u64, size: u64) -> Option<i32> {
        let end = addr.checked_add(size)?;
        let g = self.inner.read();
        let (&first, _) = g.blocks.range(..=addr).next_back()?;
        let mut covered = first;
        let mut device = None;
        for (&start, b) in g.blocks.range(first..end) {
            let BlockKind::Mapped { .. } = b.kind else { return None };
            if start != covered || device.is_some_and(|d| d != b.device) {
                return None;
            }
            device = Some(b.device);
            covered = start + b.len;
        }
        (size > 0 && covered >= end).then_some(device).flatten()
    }

    /// Whether the program has reservations or physical handles of its own (the driver API's
    /// virtual memory management), which checkpoints do not hold yet.
    pub fn has_program_mappings(&self) -> bool {
        let g = self.inner.read();
        !g.reservations.is_empty() || !g.handles.is_empty()
    }
}

/// How finely the dirty log follows writes: pieces of this many bytes from the start of each
/// allocation and module variable, the pieces the C/R engine copies (a kernel that writes a
/// byte of a large allocation makes one piece dirty, not the allocation).
pub const DIRTY_PIECE: u64 = COPY_CHUNK as u64;

/// The rounds in which the pieces of one range were last written.
struct Marks(Box<[AtomicU64]>);

impl Marks {
    fn new(len: u64, round: u64) -> Self {
        Marks((0..len.div_ceil(DIRTY_PIECE).max(1)).map(|_| AtomicU64::new(round)).collect())
    }
}

/// Pieces of allocations and module variables ([`DIRTY_PIECE`]): a write marks the pieces it
/// touches (a kernel whose stores are not known is shown the whole allocations it may
/// write, so it marks every piece of them). Ranges made during a round count as written in
/// it (their contents are new). A round begun while calls run may count a write noted as it
/// begins for the round before: protocols begin rounds with the session quiesced.
impl DirtyLog for AddressSpace {
    fn note_write(&self, addr: u64, len: u64) {
        let end = addr.saturating_add(len.max(1));
        let g = self.inner.read();
        let round = self.round.load(Ordering::Relaxed);
        // Ranges do not overlap: walking down from the last one starting before `end`, the
        // first that ends at or before `addr` ends the ones written.
        for (&start, marks) in g.written.range(..end).rev() {
            let range_end = start.saturating_add(g.len_at(start));
            if range_end <= addr {
                break;
            }
            let first = (addr.max(start) - start) / DIRTY_PIECE;
            let last = (end.min(range_end).max(start + 1) - 1 - start) / DIRTY_PIECE;
            for mark in marks.0.iter().take(last as usize + 1).skip(first as usize) {
                mark.fetch_max(round, Ordering::Relaxed);
            }
        }
    }

    fn begin_round(&self) -> Round {
        Round(self.round.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn written_since(&self, round: Round) -> Vec<(u64, u64)> {
        let g = self.inner.read();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (&start, marks) in &g.written {
            let len = g.len_at(start);
            for (i, mark) in marks.0.iter().enumerate() {
                let at = i as u64 * DIRTY_PIECE;
                if mark.load(Ordering::Relaxed) < round.0 || at >= len.max(1) {
                    continue;
                }
                let piece = (start + at, (len - at).min(DIRTY_PIECE));
                // Neighbouring pieces of one range make one range.
                match out.last_mut() {
                    Some((s, n)) if *s + *n == piece.0 && *s >= start => *n += piece.1,
                    _ => out.push(piece),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emu::EmuBackend;

    fn space(size: u64) -> (EmuBackend, AddressSpace) {
        let backend = EmuBackend::new(1 << 30);
        // A per-test base keeps concurrently running tests out of each other's ranges.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let base = 0x5100_0000_0000 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * (1 << 36);
        let s = AddressSpace::reserve(&backend, base, size, 1 << 20).unwrap();
        (backend, s)
    }

    #[test]
    fn program_mappings_live_in_reservations_and_are_one_range_side_by_side() {
        let (b, s) = space(1 << 30);
        let g = b.granularity(0);
        assert_eq!(
            s.reserve_range(&b, 0, g + 1, 0, 0),
            Err(VmmError::InvalidValue),
            "not a multiple of the granularity"
        );
        let va = s.reserve_range(&b, 0, 4 * g, 0, 0).unwrap();
        assert!(va.is_multiple_of(g));
        let other = s.alloc(&b, 0, g).unwrap();
        assert!(other >= va + 4 * g || other + g <= va, "cudaMalloc stays out of reservations");
        let (h0, h1) = (s.create_handle(&b, 0, g).unwrap(), s.create_handle(&b, 0, g).unwrap());
        assert_eq!(s.map_handle(&b, va + 4 * g, g, h0), Err(VmmError::InvalidValue), "outside the reservation");
        assert_eq!(s.map_handle(&b, va, 2 * g, h0), Err(VmmError::NotSupported), "more than the handle");
        s.map_handle(&b, va, g, h0).unwrap();
        assert_eq!(s.map_handle(&b, va, g, h1), Err(VmmError::InvalidValue), "over a mapping");
        s.map_handle(&b, va + g, g, h1).unwrap();
        assert!(s.contains(va + g - 8, 16), "across the two mappings");
        assert!(!s.contains(va + 2 * g - 8, 16), "past the second");
        assert_eq!(s.mapped_range_device(va, 2 * g), Some(0));
        assert_eq!(s.mapped_range_device(va, 3 * g), None);
        assert_eq!(s.allocated(), 3 * g);
        assert!(s.free(&b, va).is_err(), "a mapping is unmapped, not freed");
        assert_eq!(s.free_range(va, 4 * g), Err(VmmError::InvalidValue), "still mapped");
        s.release_handle(h0).unwrap();
        assert_eq!(s.handle_info(h0), Err(VmmError::InvalidValue), "released");
        assert_eq!(s.unmap_range(&b, va, g + 1), Err(VmmError::InvalidValue), "not whole mappings");
        assert_eq!(s.unmap_range(&b, va, 2 * g), Ok(2 * g));
        assert_eq!(s.allocated(), g);
        assert_eq!(s.map_handle(&b, va, g, h1), Err(VmmError::NotSupported), "its memory went with its mapping");
        assert!(s.has_program_mappings());
        s.release_handle(h1).unwrap();
        s.free_range(va, 4 * g).unwrap();
        assert!(!s.has_program_mappings());
        assert_eq!(s.reserve_range(&b, 0, 4 * g, 0, va), Ok(va), "the range is free again, at the hint");
    }

    #[test]
    fn a_retained_handle_outlives_its_own_release_until_given_back() {
        let (b, s) = space(1 << 30);
        let g = b.granularity(0);
        let va = s.reserve_range(&b, 0, 2 * g, 0, 0).unwrap();
        let h = s.create_handle(&b, 0, g).unwrap();
        assert_eq!(s.retain_handle(va), Err(VmmError::InvalidValue), "nothing mapped there");
        s.map_handle(&b, va, g, h).unwrap();
        assert_eq!(s.retain_handle(va + 16), Ok(h), "an address inside the mapping");
        assert_eq!(s.retain_handle(va + g), Err(VmmError::InvalidValue), "past it");
        s.release_handle(h).unwrap();
        s.release_handle(h).unwrap();
        assert_eq!(s.handle_info(h), Err(VmmError::InvalidValue), "both references given back");
        assert_eq!(s.release_handle(h), Err(VmmError::InvalidValue), "no third");
        assert_eq!(s.retain_handle(va), Ok(h), "still mapped: found again");
        assert_eq!(s.unmap_range(&b, va, g), Ok(g));
        assert_eq!(s.handle_info(h), Ok((g, 0)), "the retain keeps it");
        s.release_handle(h).unwrap();
        assert_eq!(s.handle_info(h), Err(VmmError::InvalidValue), "gone with its last reference");
        s.free_range(va, 2 * g).unwrap();
        assert!(!s.has_program_mappings());
    }

    #[test]
    fn small_allocations_share_a_slab_and_are_aligned() {
        let (b, s) = space(1 << 30);
        let a = s.alloc(&b, 0, 4).unwrap();
        let c = s.alloc(&b, 0, 1000).unwrap();
        assert_eq!(a % ALIGNMENT, 0);
        assert_eq!(c % ALIGNMENT, 0);
        assert_eq!(c - a, 256, "second allocation follows the first in the slab");
        assert!(s.contains(a, 4));
        assert!(!s.contains(a, 5), "past the end of a 4-byte allocation");
        assert!(s.contains(c + 999, 1));
        // Memory is really there (the emulator maps host memory at the device address).
        // SAFETY: `c` is a live allocation of 1000 bytes, mapped in this process by `emu`.
        unsafe { std::ptr::write_bytes(c as *mut u8, 0xab, 1000) };
        assert_eq!(s.free(&b, a).unwrap().size, 4);
        assert!(!s.contains(a, 1));
        assert!(s.free(&b, a).is_err(), "double free");
        s.free(&b, c).unwrap();
        assert_eq!(s.allocated(), 0);
    }

    #[test]
    fn large_allocations_get_whole_blocks_and_holes_coalesce() {
        let (b, s) = space(64 << 20);
        let x = s.alloc(&b, 0, 5 << 20).unwrap();
        assert_eq!(x % (2 << 20), 0);
        let y = s.alloc(&b, 0, 3 << 20).unwrap();
        s.free(&b, x).unwrap();
        s.free(&b, y).unwrap();
        // After both are freed the whole range is one hole again: a 60 MiB allocation fits.
        let z = s.alloc(&b, 0, 60 << 20).unwrap();
        assert_eq!(z, s.base());
        assert!(s.alloc(&b, 0, 8 << 20).is_err(), "range exhausted");
    }

    #[test]
    fn interior_pointers_and_foreign_pointers() {
        let (b, s) = space(1 << 30);
        let x = s.alloc(&b, 0, 4096).unwrap();
        assert_eq!(s.free(&b, x + 16).unwrap_err(), CudaError::InvalidValue);
        assert!(!s.contains(0x1000, 1));
        assert!(!s.contains(u64::MAX - 3, 8), "overflowing range");
        s.add_external(0x7000_0000, 64);
        assert!(s.contains(0x7000_0010, 16));
        assert!(!s.contains(0x7000_0030, 32));
    }

    #[test]
    fn allocations_come_back_at_their_addresses() {
        let (b, s) = space(1 << 30);
        let big = s.alloc(&b, 0, 3 << 20).unwrap();
        let small: Vec<u64> = (0..5).map(|i| s.alloc(&b, 0, 100 + i).unwrap()).collect();
        let all: Vec<Allocation> = s.allocations();
        s.free_all(&b, None);
        let (b2, s2) = (b, s);
        // Recreate in another order: the small ones first, then the big one.
        for a in all.iter().rev() {
            assert_eq!(s2.alloc_at(&b2, a.device, a.addr, a.size).unwrap(), a.addr);
        }
        assert!(s2.contains(big, 3 << 20));
        for (i, p) in small.iter().enumerate() {
            assert!(s2.contains(*p, 100 + i as u64));
        }
        // Taken addresses are refused.
        assert!(s2.alloc_at(&b2, 0, big, 16).is_err());
        assert!(s2.alloc_at(&b2, 0, small[0], 16).is_err());
        // New allocations do not collide with restored ones.
        let fresh = s2.alloc(&b2, 0, 100).unwrap();
        assert!(!small.contains(&fresh));
    }

    #[test]
    fn zero_size_is_null() {
        let (b, s) = space(1 << 30);
        assert_eq!(s.alloc(&b, 0, 0).unwrap(), 0);
    }

    #[test]
    fn the_dirty_log_names_what_was_written_since_a_round_began() {
        let (b, s) = space(1 << 30);
        let big = s.alloc(&b, 0, 3 << 20).unwrap();
        let small: Vec<u64> = (0..3).map(|_| s.alloc(&b, 0, 256).unwrap()).collect();
        s.add_external(0x7000_0000, 64);
        let round = s.begin_round();
        assert!(s.written_since(round).is_empty());
        // A write across two small allocations marks both, whole; one ending where the
        // third starts does not mark it.
        s.note_write(small[0] + 100, 412);
        s.note_write(0x7000_0010, 4);
        // In address order (the module variable lies below the session's range here).
        assert_eq!(s.written_since(round), vec![(0x7000_0000, 64), (small[0], 256), (small[1], 256)]);
        let next = s.begin_round();
        assert!(s.written_since(next).is_empty(), "a new round starts clean");
        s.note_write(big + (2 << 20), 1);
        let fresh = s.alloc(&b, 0, 100).unwrap();
        let mut want = vec![(big, 3 << 20), (fresh, 100)];
        want.sort();
        assert_eq!(s.written_since(next), want, "what is made in a round counts as written in it");
        // Everything since the first round; a freed allocation is forgotten.
        s.free(&b, small[0]).unwrap();
        assert_eq!(s.written_since(round).len(), 4);
        // Outside every range: nothing.
        s.note_write(0x1000, 8);
        assert_eq!(s.written_since(s.begin_round()), vec![]);
    }

    #[test]
    fn the_dirty_log_follows_pieces_of_large_allocations() {
        let (b, s) = space(1 << 30);
        let p = DIRTY_PIECE;
        let big = s.alloc(&b, 0, 4 * p + 100).unwrap();
        let round = s.begin_round();
        // A byte of the second piece; a write across the third and fourth; the short last one.
        s.note_write(big + p + 5, 1);
        assert_eq!(s.written_since(round), vec![(big + p, p)]);
        s.note_write(big + 3 * p - 1, 2);
        assert_eq!(s.written_since(round), vec![(big + p, 3 * p)], "neighbouring pieces are one range");
        s.note_write(big + 4 * p + 99, 1);
        assert_eq!(s.written_since(round), vec![(big + p, 3 * p + 100)]);
        let next = s.begin_round();
        // A write of the whole allocation (a kernel whose stores are not known) marks all of it.
        s.note_write(big, 4 * p + 100);
        assert_eq!(s.written_since(next), vec![(big, 4 * p + 100)]);
        // One ending where a piece starts does not mark that piece.
        let last = s.begin_round();
        s.note_write(big, p);
        assert_eq!(s.written_since(last), vec![(big, p)]);
    }
}
