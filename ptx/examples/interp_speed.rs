//! Measures the PTX interpreter's speed in simulated thread-instructions per second on three kernels (vector add
//! over 1M elements, a 256x256 tiled matrix product, a shared-memory reduction), using the checked-in PTX of
//! `benches/data/bench.cu`. Prints one `kernel thread-instr/s` line per kernel.
//!
//! `cargo run --release -p phos-ptx --example interp_speed [-- WORKERS]` (default: 1 worker, i.e. per core).

use std::ops::Range;
use std::time::Instant;

use phos_ptx::exec::{self, GlobalMemory, Launch, Program};

struct Regions(Vec<Range<u64>>);

impl GlobalMemory for Regions {
    fn region(&self, addr: u64) -> Option<Range<u64>> {
        self.0.iter().find(|r| r.contains(&addr)).cloned()
    }
}

fn params(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn main() {
    let workers: usize = std::env::args().nth(1).and_then(|w| w.parse().ok()).unwrap_or(1);
    let ptx = include_str!("../benches/data/bench.ptx");
    let prog = Program::new(&phos_ptx::parse(ptx).expect("bench.ptx parses"));
    let run = |kernel: &str, grid: [u32; 3], block: [u32; 3], p: &[u8], bufs: &mut [&mut Vec<f32>]| {
        let mem = Regions(
            bufs.iter_mut().map(|b| b.as_mut_ptr() as u64..b.as_mut_ptr() as u64 + 4 * b.len() as u64).collect(),
        );
        let launch = Launch { grid, block, dynamic_shared: 0, params: p };
        let mut out = Vec::new();
        let t = Instant::now();
        let stats = exec::run(&prog, kernel, &launch, &mem, &mut out, workers).expect("kernel runs");
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{kernel} {:.1}M thread-instr/s ({} thread-instructions in {:.1} ms, {workers} worker(s))",
            stats.thread_instructions as f64 / secs / 1e6,
            stats.thread_instructions,
            secs * 1e3
        );
    };
    let n = 1 << 20;
    let (mut a, mut b, mut c) = (vec![1.0f32; n], vec![2.0f32; n], vec![0.0f32; n]);
    let p = [
        params(&[a.as_mut_ptr() as u64, b.as_mut_ptr() as u64, c.as_mut_ptr() as u64]),
        (n as u32).to_le_bytes().to_vec(),
    ]
    .concat();
    run("vector_add", [(n as u32) / 256, 1, 1], [256, 1, 1], &p, &mut [&mut a, &mut b, &mut c]);
    let m = 256;
    let (mut a, mut b, mut c) = (vec![0.5f32; m * m], vec![0.25f32; m * m], vec![0.0f32; m * m]);
    let p = [
        params(&[a.as_mut_ptr() as u64, b.as_mut_ptr() as u64, c.as_mut_ptr() as u64]),
        (m as u32).to_le_bytes().to_vec(),
    ]
    .concat();
    run("matmul_tiled", [m as u32 / 16, m as u32 / 16, 1], [16, 16, 1], &p, &mut [&mut a, &mut b, &mut c]);
    let (mut a, mut o) = (vec![1.0f32; n], vec![0.0f32; 256]);
    let p = [params(&[a.as_mut_ptr() as u64, o.as_mut_ptr() as u64]), (n as u32).to_le_bytes().to_vec()].concat();
    run("reduce_shared", [256, 1, 1], [256, 1, 1], &p, &mut [&mut a, &mut o]);
}
