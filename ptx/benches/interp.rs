//! Interpreter throughput in simulated thread-instructions per second (criterion's "elements"), on the kernels of
//! `benches/data/bench.cu`: vector add over 1M elements, a 256x256 tiled matrix product and a shared-memory reduction,
//! each on one worker thread (per-core speed).
//!
//! `cargo bench -p phos-ptx --bench interp`

use std::ops::Range;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use phos_ptx::exec::{self, GlobalMemory, Launch, Program};

struct Regions(Vec<Range<u64>>);

impl GlobalMemory for Regions {
    fn region(&self, addr: u64) -> Option<Range<u64>> {
        self.0.iter().find(|r| r.contains(&addr)).cloned()
    }
}

struct Case {
    kernel: &'static str,
    grid: [u32; 3],
    block: [u32; 3],
    params: Vec<u8>,
    regions: Vec<Range<u64>>,
    _bufs: Vec<Vec<f32>>,
}

fn case(kernel: &'static str, grid: [u32; 3], block: [u32; 3], mut bufs: Vec<Vec<f32>>, n: u32) -> Case {
    // Kernels write through these addresses, so they are taken from mutable borrows (the heap data never moves).
    let regions: Vec<Range<u64>> =
        bufs.iter_mut().map(|b| b.as_mut_ptr() as u64..b.as_mut_ptr() as u64 + 4 * b.len() as u64).collect();
    let mut params: Vec<u8> = regions.iter().flat_map(|r| r.start.to_le_bytes()).collect();
    params.extend_from_slice(&n.to_le_bytes());
    Case { kernel, grid, block, params, regions, _bufs: bufs }
}

fn run(prog: &Program, c: &Case) -> u64 {
    let mem = Regions(c.regions.clone());
    let launch = Launch { grid: c.grid, block: c.block, dynamic_shared: 0, params: &c.params };
    exec::run(prog, c.kernel, &launch, &mem, &mut Vec::new(), 1).expect("kernel runs").thread_instructions
}

fn bench(cr: &mut Criterion) {
    let prog = Program::new(&phos_ptx::parse(include_str!("data/bench.ptx")).expect("bench.ptx parses"));
    let n = 1u32 << 20;
    let m = 256u32;
    let cases = [
        case(
            "vector_add",
            [n / 256, 1, 1],
            [256, 1, 1],
            vec![vec![1.0; n as usize], vec![2.0; n as usize], vec![0.0; n as usize]],
            n,
        ),
        case(
            "matmul_tiled",
            [m / 16, m / 16, 1],
            [16, 16, 1],
            vec![vec![0.5; (m * m) as usize], vec![0.25; (m * m) as usize], vec![0.0; (m * m) as usize]],
            m,
        ),
        case("reduce_shared", [256, 1, 1], [256, 1, 1], vec![vec![1.0; n as usize], vec![0.0; 256]], n),
    ];
    let mut group = cr.benchmark_group("interp");
    group.sample_size(10);
    for c in &cases {
        let instrs = run(&prog, c);
        let t = std::time::Instant::now();
        run(&prog, c);
        let secs = t.elapsed().as_secs_f64();
        println!("{} {:.1}M thread-instr/s ({} thread-instructions)", c.kernel, instrs as f64 / secs / 1e6, instrs);
        group.throughput(Throughput::Elements(instrs));
        group.bench_function(c.kernel, |b| b.iter(|| run(&prog, c)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
