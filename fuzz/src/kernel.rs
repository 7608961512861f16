//! Running one kernel of a parsed PTX module in the interpreter, on small buffers and with an
//! instruction budget, as the `emu` backend would; the launch comes from the front of the
//! input:
//!
//! ```text
//! kernel: u8      which `.entry` (modulo their number)
//! grid:   u8      1 + (byte % 4) blocks
//! block:  u8, u8  1 + (byte % 128) by 1 + (byte % 2) threads
//! shared: u16     dynamic shared memory bytes
//! value:  u32     every parameter that is not a pointer (sizes, counts)
//! then the PTX text
//! ```
//!
//! Pointer-sized parameters point at two zeroed buffers of [`BUFFER_BYTES`], in turn; the
//! module's variables get storage as the backend gives it.

use std::ops::Range;

use phos_ptx::exec::{self, GlobalMemory, Launch, Program, RunOptions};

use crate::Fields;

/// Bytes of each of the two buffers a kernel's pointers reach.
pub const BUFFER_BYTES: usize = 16 << 10;
/// Warp-instructions a launch may run.
pub const KERNEL_LIMIT: u64 = 100_000;
/// Module variables larger than this together are not given storage (the launch is skipped).
pub const MAX_VARIABLE_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, Default)]
pub struct LaunchConfig {
    pub kernel: u8,
    pub grid: u8,
    pub block: [u8; 2],
    pub shared: u16,
    pub value: u32,
}

impl LaunchConfig {
    pub fn read(f: &mut Fields<'_>) -> Self {
        LaunchConfig { kernel: f.u8(), grid: f.u8(), block: [f.u8(), f.u8()], shared: f.u16(), value: f.u32() }
    }

    /// The bytes [`read`](Self::read) takes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.kernel, self.grid, self.block[0], self.block[1]];
        out.extend_from_slice(&self.shared.to_le_bytes());
        out.extend_from_slice(&self.value.to_le_bytes());
        out
    }
}

/// Memory a kernel may touch: the regions of the buffers and variables.
struct Regions(Vec<Range<u64>>);

impl GlobalMemory for Regions {
    fn region(&self, addr: u64) -> Option<Range<u64>> {
        self.0.iter().find(|r| r.contains(&addr)).cloned()
    }
}

/// Storage 8-byte aligned, addressed by the interpreter through raw pointers.
fn zeroed(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

/// Lower `module` and run the kernel `config` names; what the launch returned (`None`: the
/// module has no kernel, or its variables are too large to give storage).
pub fn run(module: &phos_ptx::Module, config: &LaunchConfig) -> Option<Result<exec::Stats, exec::ExecError>> {
    let mut program = Program::new(module);
    let kernels: Vec<&phos_ptx::Function> = module.entries().collect();
    let kernel = *kernels.get(usize::from(config.kernel) % kernels.len().max(1))?;

    // Variables: one block of storage, each aligned as declared.
    let vars = program.variables().to_vec();
    let mut offsets = Vec::with_capacity(vars.len());
    let mut end = 0u64;
    for v in &vars {
        let align = v.align.clamp(1, 4096);
        let at = end.checked_next_multiple_of(align)?;
        offsets.push(at);
        end = at.checked_add(v.size.max(1))?;
    }
    if end > MAX_VARIABLE_BYTES {
        return None;
    }
    let mut storage = zeroed(end as usize + 4096);
    let base = (storage.as_mut_ptr() as u64).next_multiple_of(4096);
    let addresses: Vec<u64> = offsets.iter().map(|o| base + o).collect();
    let contents = program.bind_variables(&addresses);
    let mut regions = Vec::new();
    for ((v, &addr), init) in vars.iter().zip(&addresses).zip(&contents) {
        let n = init.len().min(v.size as usize);
        // SAFETY: `addr..addr + v.size` lies inside `storage` (laid out above), and `n` is at
        // most `v.size`.
        unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), addr as *mut u8, n) };
        regions.push(addr..addr + v.size);
    }

    let buffers = [zeroed(BUFFER_BYTES), zeroed(BUFFER_BYTES)];
    for b in &buffers {
        let start = b.as_ptr() as u64;
        regions.push(start..start + BUFFER_BYTES as u64);
    }
    let signature = phos_ptx::signature_of(kernel);
    let mut params = vec![0u8; usize::try_from(signature.size).ok()?.min(64 << 10)];
    let mut pointers = buffers.iter().map(|b| b.as_ptr() as u64).cycle();
    for p in &signature.params {
        let value = match p.size {
            8 => pointers.next().expect("cycles").to_le_bytes(),
            _ => u64::from(config.value).to_le_bytes(),
        };
        let at = p.offset as usize;
        let n = (p.size as usize).min(8);
        // A parameter's offset may be near the integer's limit (a hostile module's sizes).
        if let Some(dst) = at.checked_add(n).and_then(|end| params.get_mut(at..end)) {
            dst.copy_from_slice(&value[..n]);
        }
    }
    let launch = Launch {
        grid: [1 + u32::from(config.grid % 4), 1, 1],
        block: [1 + u32::from(config.block[0] % 128), 1 + u32::from(config.block[1] % 2), 1],
        dynamic_shared: u32::from(config.shared),
        params: &params,
    };
    let options = RunOptions { workers: 1, max_warp_instructions: Some(KERNEL_LIMIT) };
    let mut printed = Vec::new();
    // `storage` and `buffers` live to the end of this function, past the launch.
    Some(exec::run_with(&program, &kernel.name, &launch, &Regions(regions), &mut printed, &options))
}
