//! The program's virtual address space: every address is `region << 32 | offset`, and every
//! access is translated to (region, offset) and bounds-checked here. Region 0 does not exist,
//! so null and small integers are never valid pointers.

use super::MAX_CALL_DEPTH;
use super::maps::MapStore;

/// Bytes of stack per frame.
pub(crate) const STACK_SIZE: usize = 512;
/// Frames: the entry function plus one per nested local call.
pub(crate) const FRAMES: usize = MAX_CALL_DEPTH + 1;

const CTX_REGION: u64 = 1;
const STACK_REGION: u64 = 2;
const MAP_REGION: u64 = 16;
const OFFSET_MASK: u64 = 0xffff_ffff;
/// Map handles (what `&map` evaluates to) carry this tag in their high half: no region has
/// that number, so a handle is never a valid address and an address is never a handle.
const MAP_HANDLE_TAG: u64 = 0xfeed_0000_0000_0000;

/// The address of the context.
pub(crate) const CTX_BASE: u64 = CTX_REGION << 32;

const _: () = assert!(STACK_REGION + FRAMES as u64 <= MAP_REGION);

/// The frame pointer (r10) of frame `k`: one past its highest byte.
pub(crate) const fn frame_top(k: usize) -> u64 {
    ((STACK_REGION + k as u64) << 32) + STACK_SIZE as u64
}

/// The address of the first byte of map `m`'s value storage.
pub(crate) const fn map_base(m: usize) -> u64 {
    (MAP_REGION + m as u64) << 32
}

pub(crate) const fn map_handle(m: usize) -> u64 {
    MAP_HANDLE_TAG | m as u64
}

/// The map index a handle names (not checked against the number of maps).
pub(crate) fn handle_to_map(h: u64) -> Option<usize> {
    (h & !OFFSET_MASK == MAP_HANDLE_TAG).then_some((h & OFFSET_MASK) as usize)
}

/// What a running program can address: the caller's context, the stack and the maps.
pub(crate) struct Mem<'a> {
    pub ctx: &'a [u8],
    pub stack: &'a mut [u8],
    pub maps: &'a mut [MapStore],
}

impl Mem<'_> {
    #[inline(always)]
    fn region(&self, rid: u64) -> Option<&[u8]> {
        if rid == CTX_REGION {
            return Some(self.ctx);
        }
        let f = rid.wrapping_sub(STACK_REGION);
        if f < FRAMES as u64 {
            let f = f as usize;
            return self.stack.get(f * STACK_SIZE..(f + 1) * STACK_SIZE);
        }
        let m = usize::try_from(rid.wrapping_sub(MAP_REGION)).ok()?;
        self.maps.get(m).map(|m| m.values.as_slice())
    }

    /// Like `region`, but `None` for read-only regions (the context, .rodata).
    #[inline(always)]
    fn region_mut(&mut self, rid: u64) -> Option<&mut [u8]> {
        let f = rid.wrapping_sub(STACK_REGION);
        if f < FRAMES as u64 {
            let f = f as usize;
            return self.stack.get_mut(f * STACK_SIZE..(f + 1) * STACK_SIZE);
        }
        let m = usize::try_from(rid.wrapping_sub(MAP_REGION)).ok()?;
        self.maps.get_mut(m).filter(|m| !m.read_only).map(|m| m.values.as_mut_slice())
    }

    /// The `len` bytes at `addr`, if they all lie in one region.
    #[inline(always)]
    pub(crate) fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let off = (addr & OFFSET_MASK) as usize;
        self.region(addr >> 32)?.get(off..off.checked_add(len)?)
    }

    #[inline(always)]
    pub(crate) fn load<const N: usize>(&self, addr: u64) -> Option<[u8; N]> {
        let off = (addr & OFFSET_MASK) as usize;
        self.region(addr >> 32)?.get(off..)?.first_chunk::<N>().copied()
    }

    #[inline(always)]
    pub(crate) fn store<const N: usize>(&mut self, addr: u64, bytes: [u8; N]) -> Option<()> {
        let off = (addr & OFFSET_MASK) as usize;
        *self.region_mut(addr >> 32)?.get_mut(off..)?.first_chunk_mut::<N>()? = bytes;
        Some(())
    }

    #[inline(always)]
    pub(crate) fn slot<const N: usize>(&mut self, addr: u64) -> Option<&mut [u8; N]> {
        let off = (addr & OFFSET_MASK) as usize;
        self.region_mut(addr >> 32)?.get_mut(off..)?.first_chunk_mut::<N>()
    }

    /// Describes the region `addr` points into, for fault messages.
    pub(crate) fn describe(&self, addr: u64) -> String {
        let rid = addr >> 32;
        let off = addr & OFFSET_MASK;
        if rid == CTX_REGION {
            return format!("offset {off} of the context ({} bytes, read-only)", self.ctx.len());
        }
        let f = rid.wrapping_sub(STACK_REGION);
        if f < FRAMES as u64 {
            return format!("offset {off} of stack frame {f} ({STACK_SIZE} bytes)");
        }
        if handle_to_map(addr).is_some() {
            return "a map handle, not memory".to_string();
        }
        let m = usize::try_from(rid.wrapping_sub(MAP_REGION)).ok();
        match m.and_then(|m| self.maps.get(m)) {
            Some(m) => format!(
                "offset {off} of the values of map `{}` ({} bytes{})",
                m.name,
                m.values.len(),
                if m.read_only { ", read-only" } else { "" }
            ),
            None => "no memory (a null or forged pointer)".to_string(),
        }
    }
}
