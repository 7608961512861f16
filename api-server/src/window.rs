//! A concurrent checkpoint's window on a session ([`phos_checkpoint::engine::Window`]): device
//! memory of the engine's own, outside the session's address range, for the check contexts
//! of validated launches and the copy-on-write reserve; and the validation itself.
//!
//! Each device the session has gets one area, reserved after the session's range (the
//! devices' areas one after the other) and mapped for the checkpoint's duration:
//!
//! ```text
//! [0, CONTEXTS)                  check contexts and variable tables, handed out in order
//! [CONTEXTS, CONTEXTS + reserve) copies of chunks taken ahead of a write (first fit)
//! ```
//!
//! The reserve is what the operator set (`--cow-reserve`), or else sized from the device's
//! free memory ([`sized_reserve`]).
//!
//! A check context is written once and shared by every launch speculated to write the same
//! ranges (the flags only ever go from clear to set), so a busy session needs few. The
//! flags are read when the checkpoint finishes: after the last checked launch has been
//! issued and the devices have finished it. Kernels the server runs (`emu`) reach the area
//! through the address space's engine ranges; the guest's calls never can.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex, RwLock};
use phos_checkpoint::CrError;
use phos_checkpoint::engine::{self, Interrupted, Window, Within};
use phos_ptx::instrument::context;

use crate::backend::prelude::*;
use crate::backend::{Physical, Raw, StreamRef};
use crate::registry::memory::{AddressSpace, coalesce_insert, take_first_fit};
use crate::timing;

/// Where a session's window is, for its launches: none outside a concurrent checkpoint.
pub(crate) type WindowSlot = RwLock<Option<Arc<ServerWindow>>>;

/// Room for check contexts and variable tables on each device.
const CONTEXTS: u64 = 2 << 20;
/// Address space reserved for each device's area, at least: NVIDIA's driver (580, on the
/// H100) gives a reservation of a few MiB somewhere else than the address asked for, where
/// it keeps one of hundreds of MiB there; only what the area needs is mapped.
const MIN_RESERVATION: u64 = 1 << 30;
/// `CU_STREAM_NON_BLOCKING`
const NON_BLOCKING: u32 = 1;

/// A check context's device and the `[start, end)` ranges it holds.
type ContextKey = (i32, Vec<(u64, u64)>);

/// One device's area.
struct Area {
    device: i32,
    base: u64,
    /// Mapped, from `base`.
    len: u64,
    /// Reserved, from `base` (at least `len`).
    reserved: u64,
    physical: Physical,
    stream: Raw,
    /// Next free byte of the contexts part.
    next: Mutex<u64>,
    /// Free ranges of the reserve.
    free: Mutex<BTreeMap<u64, u64>>,
}

pub struct ServerWindow {
    /// Itself, for the session's slot.
    me: std::sync::Weak<ServerWindow>,
    session: u64,
    backend: Arc<dyn Backend>,
    memory: Arc<AddressSpace>,
    slot: Arc<WindowSlot>,
    areas: Vec<Area>,
    armed: AtomicBool,
    /// Checked kernels may still run: the memory is not given back.
    keep_mapped: AtomicBool,
    /// Check contexts by (device, ranges), and variable tables by module.
    contexts: Mutex<HashMap<ContextKey, u64>>,
    tables: Mutex<HashMap<u64, u64>>,
    /// Checked launches being issued.
    in_flight: Mutex<u32>,
    idle: Condvar,
}

/// A checked launch being issued: the window waits for it before reading the flags.
pub(crate) struct InFlight(Arc<ServerWindow>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut n = self.0.in_flight.lock();
        *n -= 1;
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl ServerWindow {
    /// Map an area on every device of the session, with `reserve(device)` bytes for copies
    /// (none where the device has not that much free); launches find it once it is armed.
    pub(crate) fn open(
        session: u64,
        backend: Arc<dyn Backend>,
        memory: Arc<AddressSpace>,
        slot: Arc<WindowSlot>,
        reserve: impl Fn(i32) -> u64,
    ) -> Result<Arc<ServerWindow>, CrError> {
        let devices = backend.device_count().max(0);
        let mut areas = Vec::new();
        // The areas follow one another (their sizes differ where the reserves do).
        let mut next = memory.base() + memory.size();
        for device in 0..devices {
            let reserve = reserve(device);
            let gran = backend.granularity(device).max(1);
            let full = (CONTEXTS + reserve).next_multiple_of(gran);
            let bare = CONTEXTS.next_multiple_of(gran);
            let reserved = full.max(MIN_RESERVATION).next_multiple_of(gran);
            let base = next.next_multiple_of(gran);
            next = base + reserved;
            let mapped = timing::timed(
                || format!("mapping the checkpoint's area of {full} bytes on device {device}"),
                || map_area(backend.as_ref(), device, base, full, reserved),
            )
            .map(|p| (p, full))
            .or_else(|e| {
                if reserve > 0 {
                    tracing::warn!(
                        session,
                        "device {device}: no room for a copy-on-write reserve of {reserve} bytes ({e:?}): writers wait for the copy instead"
                    );
                }
                map_area(backend.as_ref(), device, base, bare, reserved).map(|p| (p, bare))
            });
            let stream = mapped.and_then(|(physical, len)| {
                let made = timing::timed(
                    || format!("creating the checkpoint's stream on device {device}"),
                    || backend.bind(device).and_then(|_| backend.stream_create(device, NON_BLOCKING, 0)),
                );
                match made {
                    Ok(stream) => Ok((physical, len, stream)),
                    Err(e) => {
                        let _ = backend.unmap(base, len, physical);
                        backend.unreserve(base, reserved);
                        Err(e)
                    }
                }
            });
            let (physical, len, stream) = match stream {
                Ok(s) => s,
                Err(error) => {
                    release_areas(&areas, &backend, &memory);
                    let what = format!("setting up the checkpoint's memory on device {device}");
                    return Err(CrError::Device { what, error });
                }
            };
            let mut free = BTreeMap::new();
            if len > CONTEXTS {
                free.insert(base + CONTEXTS, len - CONTEXTS);
            }
            areas.push(Area {
                device,
                base,
                len,
                reserved,
                physical,
                stream,
                next: Mutex::new(base),
                free: Mutex::new(free),
            });
        }
        Ok(Arc::new_cyclic(|me| ServerWindow {
            me: me.clone(),
            session,
            backend,
            memory,
            slot,
            areas,
            armed: AtomicBool::new(false),
            keep_mapped: AtomicBool::new(false),
            contexts: Mutex::default(),
            tables: Mutex::default(),
            in_flight: Mutex::new(0),
            idle: Condvar::new(),
        }))
    }

    pub(crate) fn armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }

    fn area(&self, device: i32) -> Result<&Area, String> {
        self.areas.iter().find(|a| a.device == device).ok_or_else(|| format!("no checkpoint memory on device {device}"))
    }

    /// A checked launch begins, unless the window is no longer armed.
    pub(crate) fn begin_launch(self: &Arc<Self>) -> Option<InFlight> {
        let mut n = self.in_flight.lock();
        if !self.armed() {
            return None;
        }
        *n += 1;
        Some(InFlight(self.clone()))
    }

    /// `len` bytes of the contexts part of `device`'s area, written with what `fill` makes
    /// of their address.
    fn place(&self, device: i32, len: usize, fill: impl FnOnce(u64) -> Vec<u8>) -> Result<u64, String> {
        let area = self.area(device)?;
        let mut next = area.next.lock();
        let at = next.next_multiple_of(16);
        if at + len as u64 > area.base + CONTEXTS {
            return Err("too many distinct check contexts for this checkpoint".into());
        }
        self.copy_in(area, at, &fill(at)).map_err(|e| format!("writing a check context: {e:?}"))?;
        *next = at + len as u64;
        Ok(at)
    }

    fn copy_in(&self, area: &Area, at: u64, bytes: &[u8]) -> Result<(), phos_protocol::CudaError> {
        let b = &self.backend;
        let stream = Some(StreamRef::Created(area.stream));
        timing::timed(
            || format!("writing {} bytes of check context on device {}", bytes.len(), area.device),
            || {
                b.bind(area.device)?;
                b.memcpy_htod(at, bytes, stream)?;
                b.stream_synchronize(StreamRef::Created(area.stream))
            },
        )
    }

    /// The table of the original module's variable addresses that `module`'s twins read,
    /// written the first time (`addresses` gives them).
    pub(crate) fn variable_table(
        &self,
        device: i32,
        module: u64,
        addresses: impl FnOnce() -> Result<Vec<u64>, phos_protocol::CudaError>,
    ) -> Result<u64, String> {
        let mut tables = self.tables.lock();
        if let Some(&t) = tables.get(&module) {
            return Ok(t);
        }
        let addresses = addresses().map_err(|e| format!("a variable of its module has no address: {e:?}"))?;
        let mut bytes: Vec<u8> = addresses.iter().flat_map(|a| a.to_le_bytes()).collect();
        bytes.resize(bytes.len().max(8), 0);
        let at = self.place(device, bytes.len(), |_| bytes)?;
        tables.insert(module, at);
        Ok(at)
    }

    /// The check context for launches speculated to write `ranges` (`[start, end)` pairs),
    /// whose twins read variables through `table`.
    pub(crate) fn context(&self, device: i32, ranges: &[(u64, u64)], table: u64) -> Result<u64, String> {
        let mut contexts = self.contexts.lock();
        let key = (device, ranges.to_vec());
        if let Some(&c) = contexts.get(&key) {
            return Ok(c);
        }
        let size = context::SIZE as usize;
        let count = u32::try_from(ranges.len()).map_err(|_| "too many ranges".to_string())?;
        let len = size + 16 * ranges.len();
        let placed = self.place(device, len, |at| {
            let mut bytes = vec![0u8; len];
            bytes[context::RANGE_COUNT as usize..][..4].copy_from_slice(&count.to_le_bytes());
            // The ranges follow the context.
            bytes[context::RANGES as usize..][..8].copy_from_slice(&(at + size as u64).to_le_bytes());
            bytes[context::VARIABLES as usize..][..8].copy_from_slice(&table.to_le_bytes());
            for (i, (start, end)) in ranges.iter().enumerate() {
                bytes[size + 16 * i..][..8].copy_from_slice(&start.to_le_bytes());
                bytes[size + 16 * i + 8..][..8].copy_from_slice(&end.to_le_bytes());
            }
            bytes
        })?;
        contexts.insert(key, placed);
        Ok(placed)
    }
}

/// The copy-on-write reserve a device gets when the operator set none: half of its free
/// memory (the session keeps the other half to allocate from while the checkpoint runs), and
/// no more than the session's memory on it, `session_bytes` (it never copies more aside).
pub(crate) fn sized_reserve(backend: &dyn Backend, device: i32, session_bytes: u64) -> u64 {
    match backend.mem_info(device) {
        Ok((free, _)) => (free / 2).min(session_bytes),
        Err(e) => {
            tracing::warn!("device {device}: its free memory is unknown ({e:?}): no copy-on-write reserve");
            0
        }
    }
}

/// Reserve `reserved` bytes of address space at `base` and map the first `len`.
fn map_area(
    backend: &dyn Backend,
    device: i32,
    base: u64,
    len: u64,
    reserved: u64,
) -> Result<Physical, phos_protocol::CudaError> {
    backend.reserve(base, reserved)?;
    match backend.map(device, base, len) {
        Ok(p) => Ok(p),
        Err(e) => {
            backend.unreserve(base, reserved);
            Err(e)
        }
    }
}

fn release_areas(areas: &[Area], backend: &Arc<dyn Backend>, memory: &AddressSpace) {
    for a in areas {
        memory.remove_engine(a.base);
        let _ = backend.bind(a.device);
        let _ = timing::timed(
            || format!("destroying the checkpoint's stream on device {}", a.device),
            || backend.stream_destroy(a.stream),
        );
        let _ = timing::timed(
            || format!("unmapping the checkpoint's area of {} bytes", a.len),
            || backend.unmap(a.base, a.len, a.physical),
        );
        backend.unreserve(a.base, a.reserved);
    }
}

impl Drop for ServerWindow {
    fn drop(&mut self) {
        if self.keep_mapped.load(Ordering::Relaxed) {
            tracing::warn!(
                session = self.session,
                "the checkpoint's device memory stays mapped: checked kernels may still be running"
            );
            return;
        }
        release_areas(&self.areas, &self.backend, &self.memory);
    }
}

impl Window for ServerWindow {
    fn arm(&self) {
        // Registered here, with the session at rest, not when the window opens: on `emu` a
        // running kernel holds the address space for reading until it ends, and the window
        // opens before the checkpoint's deadline-bound waits.
        for a in &self.areas {
            self.memory.add_engine(a.base, CONTEXTS);
        }
        *self.slot.write() = self.me.upgrade();
        self.armed.store(true, Ordering::Release);
    }

    fn save(&self, device: i32, pieces: &[(u64, u64)]) -> Result<Vec<u64>, CrError> {
        let Ok(area) = self.area(device) else { return Ok(Vec::new()) };
        let mut copies = Vec::with_capacity(pieces.len());
        {
            let mut free = area.free.lock();
            for &(_, len) in pieces {
                match take_first_fit(&mut free, len.next_multiple_of(256), 256) {
                    Some(copy) => copies.push(copy),
                    None => break,
                }
            }
        }
        if copies.is_empty() {
            return Ok(copies);
        }
        // Every copy queued on the area's stream (pieces that follow one another, here and in
        // the reserve, as one), then one wait: the writes that asked for them are issued only
        // after this returns.
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        for (&copy, &(addr, len)) in copies.iter().zip(pieces) {
            match runs.last_mut() {
                Some((to, from, n)) if *from + *n == addr && *to + *n == copy => *n += len,
                _ => runs.push((copy, addr, len)),
            }
        }
        let b = &self.backend;
        let stream = StreamRef::Created(area.stream);
        let bytes: u64 = runs.iter().map(|r| r.2).sum();
        let copied = timing::timed(
            || format!("copying {bytes} bytes aside on device {device} ({} runs)", runs.len()),
            || {
                b.bind(device)
                    .and_then(|_| runs.iter().try_for_each(|&(to, from, n)| b.memcpy_dtod(to, from, n, Some(stream))))
                    .and_then(|_| b.stream_synchronize(stream))
            },
        );
        if let Err(error) = copied {
            for (&copy, &(_, len)) in copies.iter().zip(pieces) {
                self.release(device, copy, len);
            }
            let bytes: u64 = pieces[..copies.len()].iter().map(|p| p.1).sum();
            let what = format!("copying {bytes} bytes from {:#x} on aside ahead of a write", pieces[0].0);
            return Err(CrError::Device { what, error });
        }
        Ok(copies)
    }

    fn release(&self, device: i32, copy: u64, len: u64) {
        if let Ok(area) = self.area(device) {
            coalesce_insert(&mut area.free.lock(), copy, len.next_multiple_of(256));
        }
    }

    fn finish(&self, within: &Within<'_>) -> Result<Option<u64>, CrError> {
        // Launches being issued with a twin finish issuing (on `emu`, running), within the
        // deadline too.
        let issued = {
            let mut n = self.in_flight.lock();
            self.armed.store(false, Ordering::Release);
            while *n > 0 && !self.idle.wait_until(&mut n, within.deadline).timed_out() {}
            *n == 0
        };
        // Launches run the original kernels from now on; a new launch no longer finds the
        // window.
        {
            let mut slot = self.slot.write();
            if slot.as_ref().is_some_and(|w| std::ptr::eq(Arc::as_ptr(w), self)) {
                *slot = None;
            }
        }
        let session = self.session;
        if !issued {
            self.keep_mapped.store(true, Ordering::Relaxed);
            let why = "checked kernel launches were still being issued at the deadline".into();
            return Err(CrError::CopyOnWrite { session, why });
        }
        // The checked kernels issued must have run before their flags say anything, and
        // before the memory they read goes: not cancellable, only bounded. If they do not
        // end in time the memory stays mapped (a kernel still running reads it).
        let b = self.backend.clone();
        fn never() -> bool {
            false
        }
        let within = Within { deadline: within.deadline, cancelled: &never };
        let syncing = std::time::Instant::now();
        let synced = engine::wait_within(&within, move || {
            (0..b.device_count())
                .try_for_each(|d| b.device_synchronize(d).map_err(CrError::device(format!("synchronising device {d}"))))
        })
        .map_err(|_: Interrupted| CrError::CopyOnWrite {
            session,
            why: "the devices did not finish the checked kernels in time".into(),
        })
        .and_then(|synced| synced.ok_or(CrError::Thread("device synchronisation")).flatten());
        timing::slow(syncing, || "waiting for the checked kernels at the checkpoint's end".into());
        if let Err(e) = synced {
            self.keep_mapped.store(true, Ordering::Relaxed);
            return Err(e);
        }
        let contexts: Vec<(i32, u64)> = self.contexts.lock().iter().map(|(k, &at)| (k.0, at)).collect();
        for (device, at) in contexts {
            let area = self.area(device).map_err(|why| CrError::CopyOnWrite { session, why })?;
            let mut flags = [0u8; context::SIZE as usize];
            let b = &self.backend;
            b.bind(device)
                .and_then(|_| b.memcpy_dtoh(&mut flags, at, Some(StreamRef::Created(area.stream))))
                .map_err(CrError::device(format!("reading the check context at {at:#x}")))?;
            let missed = u32::from_le_bytes(flags[context::MISSED as usize..][..4].try_into().expect("4 bytes"));
            if missed != 0 {
                let first = u64::from_le_bytes(flags[context::FIRST_MISS as usize..][..8].try_into().expect("8 bytes"));
                return Ok(Some(first));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emu::EmuBackend;

    /// Unless set, the reserve is half the device's free memory, at most the session's
    /// memory on it; a device that does not answer gets none.
    #[test]
    fn the_reserve_is_half_the_free_memory_at_most_the_sessions() {
        let emu = EmuBackend::new(1 << 30);
        assert_eq!(sized_reserve(&emu, 0, 48 << 20), 48 << 20);
        assert_eq!(sized_reserve(&emu, 0, 4 << 30), 512 << 20);
        let physical = emu.reserve(0x4a00_0000_0000, 256 << 20).and_then(|_| emu.map(0, 0x4a00_0000_0000, 256 << 20));
        let physical = physical.expect("256 MiB mapped");
        assert_eq!(sized_reserve(&emu, 0, 4 << 30), 384 << 20, "half of what is free now");
        emu.unmap(0x4a00_0000_0000, 256 << 20, physical).unwrap();
        emu.unreserve(0x4a00_0000_0000, 256 << 20);
        assert_eq!(sized_reserve(&emu, 7, 4 << 30), 0);
    }
}
