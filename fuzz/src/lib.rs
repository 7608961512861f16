//! What the fuzz targets in `fuzz_targets/` share: a cap on single allocations (an input that
//! makes a parser ask for hundreds of megabytes is a finding, even where the system would
//! grant it), a reader for the few fields a target takes from the front of its input, the
//! in-process API server on `emu` that the `dispatch` target drives, and each target's seed
//! corpus (written when `PHOS_FUZZ_WRITE_SEEDS` is set; see docs/fuzzing.md).

pub mod emu;
pub mod image;
pub mod kernel;
pub mod ring;
pub mod seeds;

use std::alloc::{GlobalAlloc, Layout, System};

/// Every function of every API, and decoders of every remote function's request and reply,
/// generated from the specs.
#[allow(clippy::all)]
pub mod reencode {
    include!(concat!(env!("OUT_DIR"), "/reencode.rs"));
}

/// The largest single allocation any input may cause. Every parser here reads messages of
/// kilobytes; one that turns them into a request for this much trusts a length it was told.
pub const MAX_ALLOCATION: usize = 256 << 20;

/// The system allocator, refusing (by aborting, which libFuzzer reports as a crash with the
/// input) any allocation above [`MAX_ALLOCATION`].
pub struct CappedAllocator;

fn refuse(layout: Layout) -> ! {
    let mut msg = *b"phos-fuzz: allocation of more than MAX_ALLOCATION bytes asked: 0x0000000000000000\n";
    let digits = b"0123456789abcdef";
    let end = msg.len() - 1;
    for i in 0..16 {
        msg[end - 1 - i] = digits[(layout.size() >> (4 * i)) & 0xf];
    }
    // SAFETY: writes a stack buffer to stderr; nothing here allocates.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort();
}

// SAFETY: every call is forwarded to the system allocator unchanged, after a size check.
unsafe impl GlobalAlloc for CappedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOCATION {
            refuse(layout);
        }
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOCATION {
            refuse(layout);
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_ALLOCATION {
            refuse(Layout::from_size_align(new_size, layout.align()).unwrap_or(layout));
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CappedAllocator = CappedAllocator;

/// Takes fields off the front of an input; past its end every field reads as zero, so that
/// any input is a valid one.
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        Fields { rest: input }
    }

    /// Up to `n` bytes.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.rest.split_at(n.min(self.rest.len()));
        self.rest = tail;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let head = self.bytes(N);
        out[..head.len()].copy_from_slice(head);
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// Everything not taken yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// When `PHOS_FUZZ_WRITE_SEEDS` names a directory, write every target's seed corpus into it
/// (`DIR/TARGET/`) and end the process: how `fuzz/run` gets the seeds from the code the
/// targets read, so that they never lag behind the formats. Any target does it for all
/// (they share the tools' outputs), from its `init`.
pub fn write_seeds_if_asked() {
    let Some(dir) = std::env::var_os("PHOS_FUZZ_WRITE_SEEDS") else { return };
    let dir = std::path::PathBuf::from(dir);
    for (target, make) in seeds::TARGETS {
        let seeds = make();
        assert!(!seeds.is_empty(), "no seeds were made for {target}");
        let sub = dir.join(target);
        std::fs::create_dir_all(&sub).unwrap_or_else(|e| panic!("{}: {e}", sub.display()));
        for (name, bytes) in &seeds {
            let path = sub.join(name);
            std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        eprintln!("phos-fuzz: {} seeds for {target}", seeds.len());
    }
    std::process::exit(0);
}
