//! Corpus tests on real compiler output: the CUDA sources in `tests/data` are compiled to PTX
//! with every nvcc toolchain found (CUDA 11.x and 13.x, several targets, plus debug builds),
//! then each module must round-trip through the printer, the printed text must assemble with
//! ptxas, kernel signatures must match the C++ declarations, and mutated input must never panic.
//!
//! Without nvcc the tests print a notice and pass, unless `PHOS_REQUIRE_NVCC=1` (set in CI).
//! `PHOS_NVCC=/a/bin/nvcc:/b/bin/nvcc` chooses the toolchains instead of the default search.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use phos_ptx::{
    Directive, FunctionDirective, Immediate, Initializer, Instruction, KernelSignature, Module, Operand, ParamLayout,
    ScalarType, SpecialReg, StateSpace, Statement, StatementKind, parse, signatures,
};

struct Toolchain {
    nvcc: PathBuf,
    major: u32,
    label: String,
    archs: Vec<String>,
}

struct Compiled {
    /// e.g. `atomics.cu (CUDA 11.8, compute_80)`
    name: String,
    ptx: String,
    /// The nvcc that produced it, for finding ptxas next to it.
    nvcc: PathBuf,
    arch: String,
    /// Built with `-G` (ptxas then needs `-g`).
    debug: bool,
}

/// Runs `f` over `items` on a few threads (nvcc and ptxas are mostly waiting on I/O), keeping
/// the input order.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(usize, &T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8) * 2;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(i, item)));
                    }
                    done
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Probes an nvcc binary: its version and the virtual architectures it supports.
fn probe(nvcc: &Path, wanted: &dyn Fn(u32) -> &'static [&'static str]) -> Option<Toolchain> {
    let out = Command::new(nvcc).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let release = text.split("release ").nth(1)?.split(',').next()?.trim().to_string();
    let major: u32 = release.split('.').next()?.parse().ok()?;
    let list = Command::new(nvcc).arg("--list-gpu-arch").output().ok()?;
    let supported = String::from_utf8_lossy(&list.stdout).to_string();
    let archs: Vec<String> = wanted(major)
        .iter()
        .filter(|a| supported.split_whitespace().any(|s| s == **a))
        .map(|a| a.to_string())
        .collect();
    (!archs.is_empty()).then(|| Toolchain { nvcc: nvcc.to_path_buf(), major, label: format!("CUDA {release}"), archs })
}

fn wanted_archs(major: u32) -> &'static [&'static str] {
    match major {
        0..=11 => &["compute_52", "compute_70", "compute_80"],
        12 => &["compute_52", "compute_70", "compute_80", "compute_90"],
        _ => &["compute_75", "compute_90", "compute_100", "compute_120"],
    }
}

/// Makes a bare program name absolute by searching `PATH`, so that ptxas can be found beside it.
fn resolve(program: PathBuf) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.exists().then_some(program);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(&program)).find(|p| p.is_file())
}

/// The nvcc binaries to try: `PHOS_NVCC` (a `:`-separated list) replaces the default search of
/// the usual install locations and `PATH`.
fn toolchains() -> Vec<Toolchain> {
    let candidates: Vec<PathBuf> = match std::env::var_os("PHOS_NVCC") {
        Some(list) => std::env::split_paths(&list).collect(),
        None => ["/usr/bin/nvcc", "/usr/local/cuda/bin/nvcc", "/tmp/wheels/cuda13/nvidia/cu13/bin/nvcc", "nvcc"]
            .iter()
            .map(PathBuf::from)
            .collect(),
    };
    let mut found: Vec<Toolchain> = Vec::new();
    for c in candidates.into_iter().filter_map(resolve) {
        if let Some(t) = probe(&c, &wanted_archs)
            && !found.iter().any(|f| f.label == t.label)
        {
            found.push(t);
        }
    }
    found
}

struct Job {
    source: PathBuf,
    toolchain: usize,
    arch: String,
    extra: Option<&'static str>,
}

fn compile_corpus() -> Option<Vec<Compiled>> {
    let chains = toolchains();
    if chains.is_empty() {
        if std::env::var("PHOS_REQUIRE_NVCC").as_deref() == Ok("1") {
            panic!("PHOS_REQUIRE_NVCC=1 but no usable nvcc was found");
        }
        eprintln!("NOTICE: nvcc not found; skipping PTX corpus tests (set PHOS_REQUIRE_NVCC=1 to make this fail)");
        return None;
    }
    let mut sources: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .expect("tests/data exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 10, "expected the CUDA corpus in tests/data");

    let mut jobs = Vec::new();
    for src in &sources {
        for (ti, t) in chains.iter().enumerate() {
            for arch in &t.archs {
                jobs.push(Job { source: src.clone(), toolchain: ti, arch: arch.clone(), extra: None });
            }
            // One debug build per toolchain: -G with the oldest, -lineinfo with newer ones.
            let extra = if t.major <= 11 { "-G" } else { "-lineinfo" };
            let arch = t.archs[t.archs.len() / 2].clone();
            jobs.push(Job { source: src.clone(), toolchain: ti, arch, extra: Some(extra) });
        }
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let results: Vec<Compiled> = parallel_map(&jobs, |i, job| {
        let t = &chains[job.toolchain];
        let file = dir.path().join(format!("{i}.ptx"));
        let mut cmd = Command::new(&t.nvcc);
        cmd.arg("-ptx").arg(format!("-arch={}", job.arch)).arg(&job.source).arg("-o").arg(&file);
        if let Some(e) = job.extra {
            cmd.arg(e);
        }
        let res = cmd.output().expect("nvcc runs");
        let src_name = job.source.file_name().unwrap().to_string_lossy().to_string();
        assert!(res.status.success(), "nvcc failed on {src_name}: {}", String::from_utf8_lossy(&res.stderr));
        let ptx = std::fs::read_to_string(&file).expect("PTX written");
        let flags = job.extra.map(|e| format!(" {e}")).unwrap_or_default();
        Compiled {
            name: format!("{src_name} ({}, {}{flags})", t.label, job.arch),
            ptx,
            nvcc: t.nvcc.clone(),
            arch: job.arch.clone(),
            debug: job.extra == Some("-G"),
        }
    });
    let mut results = results;
    results.sort_by(|a, b| a.name.cmp(&b.name));
    eprintln!(
        "compiled {} PTX files with {}",
        results.len(),
        chains.iter().map(|c| c.label.as_str()).collect::<Vec<_>>().join(" and ")
    );
    Some(results)
}

fn corpus() -> Option<&'static [Compiled]> {
    static CORPUS: OnceLock<Option<Vec<Compiled>>> = OnceLock::new();
    CORPUS.get_or_init(compile_corpus).as_deref()
}

fn parse_ok(c: &Compiled) -> Module {
    parse(&c.ptx).unwrap_or_else(|e| panic!("{}: {e}", c.name))
}

#[test]
fn every_ptx_file_round_trips() {
    let Some(corpus) = corpus() else { return };
    for c in corpus {
        let first = parse_ok(c);
        assert!(first.entries().count() > 0, "{}: no kernels found", c.name);
        let printed = first.to_string();
        let second =
            parse(&printed).unwrap_or_else(|e| panic!("{}: printed PTX does not parse: {e}\n{printed}", c.name));
        assert!(first.eq_ignoring_lines(&second), "{}: tree changed after printing", c.name);
        // Printing is a fixed point after one round.
        assert_eq!(second.to_string(), printed, "{}: printing is not stable", c.name);
    }
}

/// The printed text is not just re-parsable by us: ptxas assembles it. compute_52 builds are
/// left out only to save time (their instructions are a subset of the newer builds').
#[test]
fn printed_ptx_assembles_with_ptxas() {
    assemble_all("printed PTX", |m| Some(m.to_string()));
}

/// The checked twins of every module (validation's rewritten kernels, which the GPU's driver
/// JIT-compiles during a checkpoint) assemble too. A module may have no twin only for a reason
/// the rewrite names (a store whose address is not an operand, as tensor copies have).
#[test]
fn checked_twins_assemble_with_ptxas() {
    assemble_all("checked twin", |m| match phos_ptx::instrument::checked_twin(m) {
        Ok(twin) => Some(twin.module.to_string()),
        Err(e @ phos_ptx::instrument::InstrumentError::UncheckableStore { .. }) => {
            eprintln!("no twin: {e}");
            None
        }
        Err(e) => panic!("no twin: {e}"),
    });
}

/// Runs ptxas on `text` of every corpus module (where it gives one), for the module's arch.
fn assemble_all(what: &str, text: impl Fn(&Module) -> Option<String> + Sync) {
    let Some(corpus) = corpus() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let todo: Vec<&Compiled> =
        corpus.iter().filter(|c| c.nvcc.with_file_name("ptxas").exists() && c.arch != "compute_52").collect();
    if todo.is_empty() {
        assert!(std::env::var("PHOS_REQUIRE_NVCC").as_deref() != Ok("1"), "no ptxas found next to nvcc");
        eprintln!("NOTICE: no ptxas next to nvcc; skipping the assembly check");
        return;
    }
    parallel_map(&todo, |i, c| {
        let Some(ptx) = text(&parse_ok(c)) else { return };
        let file = dir.path().join(format!("{i}.ptx"));
        std::fs::write(&file, &ptx).expect("write PTX");
        let mut cmd = Command::new(c.nvcc.with_file_name("ptxas"));
        cmd.arg(format!("-arch={}", c.arch.replace("compute_", "sm_")));
        if c.debug {
            cmd.arg("-g");
        }
        let out = cmd.arg(&file).arg("-o").arg(dir.path().join(format!("{i}.cubin"))).output().expect("ptxas runs");
        assert!(
            out.status.success(),
            "{}: ptxas rejected the {what}: {}\n{ptx}",
            c.name,
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

fn find<'a>(sigs: &'a [KernelSignature], name: &str) -> &'a KernelSignature {
    sigs.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("kernel {name} not found"))
}

fn layout(sig: &KernelSignature) -> Vec<(u64, u64, u64)> {
    sig.params.iter().map(|p: &ParamLayout| (p.offset, p.size, p.align)).collect()
}

/// Counts the top-level parameters of a demangled prototype such as `f(int, S<a, b>, float*)`.
fn cpp_param_count(demangled: &str) -> usize {
    let Some(open) = demangled.find('(') else { return 0 };
    let inner = &demangled[open + 1..demangled.rfind(')').unwrap_or(demangled.len())];
    if inner.trim().is_empty() {
        return 0;
    }
    let mut depth = 0i32;
    let mut count = 1;
    for ch in inner.chars() {
        match ch {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => count += 1,
            _ => {}
        }
    }
    count
}

#[test]
fn signatures_match_cpp_declarations() {
    let Some(corpus) = corpus() else { return };
    for c in corpus {
        let module = parse_ok(c);
        let sigs = signatures(&module);
        for s in &sigs {
            // Every parameter of the C++ prototype appears once in the PTX parameter list.
            if s.name.starts_with("_Z") {
                assert_ne!(s.demangled, s.name, "{}: {} did not demangle", c.name, s.name);
                assert_eq!(cpp_param_count(&s.demangled), s.params.len(), "{}: {}", c.name, s.demangled);
            }
            let mut end = 0;
            for p in &s.params {
                assert!(p.offset >= end && p.offset % p.align == 0, "{}: bad layout {s}", c.name);
                end = p.offset + p.size;
            }
            assert_eq!(s.size, end);
        }
        let file = c.name.split(' ').next().unwrap_or("");
        match file {
            "structs.cu" => {
                // (const float*, float*, int, struct { int; double; char })
                let mixed = find(&sigs, "_Z10with_mixedPKfPfi5Mixed");
                assert_eq!(mixed.demangled, "with_mixed(float const*, float*, int, Mixed)");
                assert_eq!(layout(mixed), [(0, 8, 8), (8, 8, 8), (16, 4, 4), (24, 24, 8)], "{}", c.name);
                assert_eq!(mixed.size, 48);
                assert_eq!(mixed.params[3].ptx_type(), ".align 8 .b8[24]");
                // (Aligned16, char, Aligned16, float*)
                let aligned = find(&sigs, "_Z12with_aligned9Aligned16cS_Pf");
                assert_eq!(layout(aligned), [(0, 16, 16), (16, 1, 1), (32, 16, 16), (48, 8, 8)]);
                assert_eq!(aligned.size, 56);
                // (Big { float[300]; int }, float*): a 1204-byte aggregate
                let big = find(&sigs, "_Z8with_big3BigPf");
                assert_eq!(layout(big), [(0, 1204, 4), (1208, 8, 8)]);
                assert_eq!(big.size, 1216);
                // (char, Small { short; char }, short, double, Small, long long*)
                let small = find(&sigs, "_Z10with_smallc5SmallsdS_Px");
                assert_eq!(layout(small), [(0, 1, 1), (2, 4, 2), (6, 2, 2), (8, 8, 8), (16, 4, 2), (24, 8, 8)]);
                assert_eq!(small.size, 32);
                // (float4, int2, double2, char3, float*)
                let vecs = find(&sigs, "_Z17with_array_struct6float44int27double25char3Pf");
                assert_eq!(layout(vecs), [(0, 16, 16), (16, 8, 8), (32, 16, 16), (48, 3, 1), (56, 8, 8)]);
                assert_eq!(vecs.size, 64);
            }
            "vector_add.cu" => {
                let va = find(&sigs, "vector_add");
                assert_eq!(va.demangled, "vector_add");
                assert_eq!(layout(va), [(0, 8, 8), (8, 8, 8), (16, 8, 8), (24, 4, 4)]);
                assert_eq!(va.size, 28);
                let tys: Vec<ScalarType> = va.params.iter().map(|p| p.ty).collect();
                assert_eq!(tys, [ScalarType::U64, ScalarType::U64, ScalarType::U64, ScalarType::U32]);
                let saxpy = find(&sigs, "_Z17saxpy_grid_stridefPKfPfm");
                assert_eq!(layout(saxpy), [(0, 4, 4), (8, 8, 8), (16, 8, 8), (24, 8, 8)]);
                let none = find(&sigs, "_Z16no_params_kernelv");
                assert!(none.params.is_empty() && none.size == 0);
            }
            "hopper.cu" => {
                // (const __grid_constant__ Params { float; int; const float* }, float*)
                let g = find(&sigs, "_Z20grid_constant_kernel6ParamsPf");
                assert_eq!(layout(g), [(0, 16, 8), (16, 8, 8)]);
                assert_eq!(g.size, 24);
            }
            "templates.cu" => {
                let f = find(&sigs, "_Z5axpbyIfEvT_PKS0_S0_PS0_i");
                assert_eq!(f.demangled, "void axpby<float>(float, float const*, float, float*, int)");
                assert_eq!(layout(f), [(0, 4, 4), (8, 8, 8), (16, 4, 4), (24, 8, 8), (32, 4, 4)]);
                let d = find(&sigs, "_Z5axpbyIdEvT_PKS0_S0_PS0_i");
                assert_eq!(layout(d), [(0, 8, 8), (8, 8, 8), (16, 8, 8), (24, 8, 8), (32, 4, 4)]);
                assert_eq!(d.size, 36);
            }
            _ => {}
        }
    }
}

/// Tiny deterministic PRNG so the mutation test needs no extra dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Applies one random edit at a char boundary: truncation, deletion, duplication, swap or
/// insertion of PTX-significant characters.
fn mutate(src: &str, rng: &mut XorShift) -> String {
    let boundary = |rng: &mut XorShift| {
        let mut i = rng.below(src.len() + 1);
        while !src.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let (a, b) = {
        let (x, y) = (boundary(rng), boundary(rng));
        (x.min(y), x.max(y))
    };
    let short_b = {
        let mut e = (a + rng.below(40)).min(src.len());
        while !src.is_char_boundary(e) {
            e -= 1;
        }
        e
    };
    const PIECES: &[&str] = &[
        "{",
        "}",
        "(",
        ")",
        "[",
        "]",
        ",",
        ";",
        ":",
        "@",
        "!",
        "-",
        "+",
        "|",
        "<",
        ">",
        "=",
        ".",
        "%",
        "\"",
        "/*",
        "//",
        "\n",
        " ",
        "0f",
        "0d",
        "0x",
        "9999999999999999999999",
        ".reg",
        ".param",
        ".entry",
        ".func",
        "_",
        ".v4",
        ".b8",
        "%tid.x",
        "generic(",
        ".section",
        ".loc",
        "call",
        "$L__BB0_1",
        ".align",
        "é",
    ];
    match rng.below(6) {
        0 => src[..a].to_string(),
        1 => format!("{}{}", &src[..a], &src[short_b..]),
        2 => format!("{}{}{}", &src[..b], &src[a..b], &src[b..]),
        3 => format!("{}{}{}", &src[..a], PIECES[rng.below(PIECES.len())], &src[a..]),
        4 => format!("{}{}{}", &src[..a], PIECES[rng.below(PIECES.len())], &src[short_b..]),
        _ => format!("{}{}{}", &src[b..], &src[a..b], &src[..a]),
    }
}

#[test]
fn mutated_ptx_never_panics() {
    let Some(corpus) = corpus() else { return };
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut errors = 0usize;
    let mut runs = 0usize;
    // Prefer smaller files so many mutations run quickly; include a debug build too.
    let mut files: Vec<&Compiled> = corpus.iter().filter(|c| c.ptx.len() < 60_000).collect();
    files.sort_by_key(|c| c.ptx.len());
    let mut seen = std::collections::HashSet::new();
    files.retain(|c| seen.insert(c.name.split(' ').next().unwrap_or("").to_string()));
    for c in files.iter().take(12) {
        for _ in 0..150 {
            let mut text = mutate(&c.ptx, &mut rng);
            if rng.below(3) == 0 {
                text = mutate(&text, &mut rng);
            }
            runs += 1;
            match std::panic::catch_unwind(|| parse(&text).map(|m| m.to_string())) {
                Ok(Ok(printed)) => {
                    // Whatever parses must still round-trip.
                    let a = parse(&text).expect("parsed a moment ago");
                    let b =
                        parse(&printed).unwrap_or_else(|e| panic!("{}: printed mutant does not parse: {e}", c.name));
                    assert!(a.eq_ignoring_lines(&b), "{}: mutant does not round-trip", c.name);
                }
                Ok(Err(e)) => {
                    errors += 1;
                    assert!(e.line >= 1 && e.column >= 1, "{}: error without location: {e}", c.name);
                }
                Err(_) => panic!("{}: parser panicked on a mutated input:\n{text}", c.name),
            }
        }
    }
    assert!(runs > 0 && errors > 0, "mutations should produce some errors ({errors} of {runs})");
}

/// All instructions of a module, with the function they are in.
fn all_instructions(m: &Module) -> Vec<(&str, &Instruction)> {
    m.functions().flat_map(|f| f.instructions().into_iter().map(move |(_, i)| (f.name.as_str(), i))).collect()
}

fn all_statements(stmts: &[Statement]) -> Vec<&Statement> {
    let mut out = Vec::new();
    for s in stmts {
        out.push(s);
        if let StatementKind::Block(b) = &s.kind {
            out.extend(all_statements(b));
        }
    }
    out
}

/// Spot checks that nvcc's constructs come out as the intended structures, not just that they
/// survive a round trip.
#[test]
fn compiler_constructs_have_the_expected_structure() {
    let Some(corpus) = corpus() else { return };
    let arch_at_least = |c: &Compiled, n: u32| c.arch.trim_start_matches("compute_").parse::<u32>().unwrap_or(0) >= n;
    for c in corpus {
        let m = parse_ok(c);
        let instrs = all_instructions(&m);
        let has = |pred: &dyn Fn(&Instruction) -> bool| instrs.iter().any(|(_, i)| pred(i));
        let file = c.name.split(' ').next().unwrap_or("");
        // Every kernel reads its thread index through a special register.
        if file != "globals.cu" && file != "printf.cu" {
            assert!(
                has(&|i| i.operands.iter().any(|o| matches!(o, Operand::Special(SpecialReg::Tid, _)))),
                "{}: no %tid read",
                c.name
            );
        }
        // `-G` code is unoptimised (generic addressing, no inlining); the spot checks target
        // optimised output.
        let file = if c.debug { "" } else { file };
        match file {
            "matmul_tiled.cu" => {
                let f = m.function("_Z12matmul_tiledPKfS0_Pfiii").expect("matmul kernel");
                // CUDA 11 writes `.maxntid 256, 1, 1`, CUDA 13 `.maxntid 256`.
                assert!(
                    f.directives.iter().any(|d| matches!(d, FunctionDirective::MaxNTid(v)
                        if v[0] == 256 && v[1..].iter().all(|&x| x == 1))),
                    "{}",
                    c.name
                );
                assert!(f.directives.contains(&FunctionDirective::MinNCtaPerSm(2)), "{}", c.name);
                assert!(has(&|i| i.opcode == "bar" && i.space().is_none()), "{}: no barrier", c.name);
                assert!(has(&|i| i.opcode == "ld" && i.space() == Some(StateSpace::Shared)), "{}", c.name);
                let unroll = m.function("_Z14loop_no_unrollPfi").expect("loop kernel");
                let stmts = all_statements(unroll.body.as_deref().unwrap_or(&[]));
                assert!(
                    stmts.iter().any(|s| matches!(&s.kind, StatementKind::Pragma(p) if p == &["nounroll"])),
                    "{}: no nounroll pragma",
                    c.name
                );
            }
            "printf.cu" => {
                let vprintf = m.function("vprintf").expect("vprintf prototype");
                assert!(vprintf.body.is_none() && vprintf.params.len() == 2);
                assert!(
                    has(&|i| i.opcode == "call" && i.operands.iter().any(|o| o == &Operand::Symbol("vprintf".into()))),
                    "{}",
                    c.name
                );
                let s = m.variables().find(|v| v.declarators[0].name == "$str").expect("format string");
                assert!(
                    matches!(&s.declarators[0].init, Some(Initializer::List(bytes)) if bytes[0] == Initializer::Imm(Immediate::Int(104)))
                );
            }
            "atomics.cu" => {
                assert!(
                    has(&|i| i.opcode == "atom" && i.space() == Some(StateSpace::Global) && i.has("cas")),
                    "{}",
                    c.name
                );
                assert!(has(&|i| i.opcode == "atom" && i.space() == Some(StateSpace::Shared)), "{}", c.name);
                assert!(has(
                    &|i| matches!(i.opcode.as_str(), "red" | "atom") && i.types().any(|t| t == ScalarType::F32)
                ));
            }
            "warp_reduce.cu" => {
                assert!(
                    has(&|i| i.opcode == "shfl" && i.has("down") && matches!(i.operands[0], Operand::Pair(..))),
                    "{}",
                    c.name
                );
                assert!(has(&|i| i.opcode == "vote" && i.has("ballot")), "{}", c.name);
                assert!(has(&|i| i.opcode == "activemask"), "{}", c.name);
            }
            "globals.cu" => {
                let var = |n: &str| m.variables().find(|v| v.declarators[0].name == n).unwrap_or_else(|| panic!("{n}"));
                assert_eq!(
                    var("d_ptr").declarators[0].init,
                    Some(Initializer::Address { name: "d_target".into(), generic: true, offset: 8 })
                );
                assert_eq!(var("m_value").attributes, ["managed"]);
                assert_eq!(var("c_table").space, StateSpace::Const);
            }
            "device_calls.cu" => {
                let kernel = m.function("_Z11call_kernelPiPfPK4Vec3i").expect("call kernel");
                let stmts = all_statements(kernel.body.as_deref().unwrap_or(&[]));
                let proto = stmts.iter().find_map(|s| match &s.kind {
                    StatementKind::CallPrototype(p) => Some(p),
                    _ => None,
                });
                let proto = proto.unwrap_or_else(|| panic!("{}: no call prototype", c.name));
                assert_eq!((proto.return_params.len(), proto.params.len()), (1, 1));
                // The indirect call goes through a register and names the prototype.
                assert!(has(&|i| i.opcode == "call"
                    && matches!(i.operands.get(1), Some(Operand::Reg(_)))
                    && i.operands.last() == Some(&Operand::Symbol(proto.label.clone()))));
                let trap = m.function("_Z13never_returnsv").expect("noreturn function");
                assert!(trap.body.is_some());
            }
            "tensor_core.cu" if arch_at_least(c, 80) => {
                assert!(has(&|i| i.opcode == "mma" && i.types().count() == 4), "{}", c.name);
                assert!(has(&|i| i.opcode == "wmma"), "{}", c.name);
                assert!(has(&|i| i.opcode == "cp" && i.has("async")), "{}", c.name);
            }
            "hopper.cu" if arch_at_least(c, 90) => {
                let f = m.function("_Z14cluster_kernelPf").expect("cluster kernel");
                assert!(f.directives.contains(&FunctionDirective::ExplicitCluster), "{}", c.name);
                assert!(f.directives.contains(&FunctionDirective::ReqNCtaPerCluster(vec![2, 1, 1])), "{}", c.name);
                assert!(has(&|i| i.operands.contains(&Operand::Special(SpecialReg::ClusterCtaRank, None))));
                assert!(has(
                    &|i| i.opcode == "elect" && matches!(&i.operands[0], Operand::Pair(a, _) if **a == Operand::Sink)
                ));
                assert!(has(&|i| i.opcode == "mbarrier" && i.space() == Some(StateSpace::SharedCta)));
            }
            _ => {}
        }
        // Debug builds keep their line table and (with -G) their DWARF sections.
        if c.debug || c.name.contains(" -lineinfo") {
            let locs = m
                .functions()
                .filter_map(|f| f.body.as_deref())
                .flat_map(all_statements)
                .filter(|s| matches!(s.kind, StatementKind::Loc(_)))
                .count();
            assert!(locs > 0, "{}: no .loc directives", c.name);
            assert!(m.directives.iter().any(|d| matches!(d, Directive::File(_))), "{}: no .file", c.name);
        }
        if c.debug {
            assert!(m.directives.iter().any(|d| matches!(d, Directive::Section(_))), "{}: no debug sections", c.name);
        }
    }
}
