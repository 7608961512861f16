//! The runtime on policies compiled from C (tests/programs/*.c) with clang. Without clang
//! these tests pass vacuously, unless PHOS_REQUIRE_CLANG=1 makes them fail.

use std::fmt::Debug;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use phos_policy::runtime::{Fault, INCLUDE_DIR, LoadError, MapError, Program};

const ADMIT: u64 = 0;
const BUDGET: u64 = 100_000;

fn delay(ns: u64) -> u64 {
    (1 << 62) | ns
}

fn reject(error: u32) -> u64 {
    (2 << 62) | u64::from(error)
}

/// The clang to use, or `None` (test skipped) where there is none.
fn clang() -> Option<String> {
    let clang = std::env::var("PHOS_CLANG").unwrap_or_else(|_| "clang".into());
    match Command::new(&clang).arg("--version").output() {
        Ok(o) if o.status.success() => Some(clang),
        _ if std::env::var("PHOS_REQUIRE_CLANG").is_ok_and(|v| v == "1") => {
            panic!("PHOS_REQUIRE_CLANG=1 but `{clang}` cannot be run")
        }
        _ => {
            eprintln!("skipped: `{clang}` not found (set PHOS_REQUIRE_CLANG=1 to fail instead)");
            None
        }
    }
}

/// Compiles tests/programs/NAME.c like `phosctl policy build` does.
fn compile(name: &str) -> Option<Vec<u8>> {
    let clang = clang()?;
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs").join(format!("{name}.c"));
    let out = dir.path().join(format!("{name}.o"));
    let status = Command::new(clang)
        .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror", "-I", INCLUDE_DIR, "-c"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "clang failed on {}", src.display());
    Some(std::fs::read(out).unwrap())
}

/// A `#define NAME value` of the generated phos_spec.h.
fn spec_define(name: &str) -> u64 {
    let text = std::fs::read_to_string(Path::new(INCLUDE_DIR).join("phos_spec.h")).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("#define ")?.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} not in phos_spec.h"));
    let value = line.split_whitespace().next().unwrap().trim_end_matches("ULL");
    match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
        None => value.parse().unwrap(),
    }
}

/// The fields of `struct phos_call`, read from phos_policy.h (so that these tests follow
/// changes of the header): (name, number of u64 words).
fn call_layout() -> Vec<(String, usize)> {
    let text = std::fs::read_to_string(Path::new(INCLUDE_DIR).join("phos_policy.h")).unwrap();
    let rc = spec_define("PHOS_RC_COUNT") as usize;
    let body = text.split("struct phos_call {").nth(1).unwrap().split("};").next().unwrap();
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("__u64 ")?.split(';').next())
        .map(|decl| match decl.strip_suffix("[PHOS_RC_COUNT]") {
            Some(name) => (name.to_string(), rc),
            None => (decl.to_string(), 1),
        })
        .collect()
}

/// A `struct phos_call`, built by field name; unset fields are 0.
#[derive(Clone, Default)]
struct Call {
    words: Vec<(String, usize, u64)>,
}

impl Call {
    fn set(mut self, field: &str, value: u64) -> Self {
        self.words.push((field.to_string(), 0, value));
        self
    }
    fn set_at(mut self, field: &str, index: usize, value: u64) -> Self {
        self.words.push((field.to_string(), index, value));
        self
    }
    fn tenant(t: u64) -> Self {
        Call::default().set("tenant", t)
    }
    fn bytes(&self) -> Vec<u8> {
        let layout = call_layout();
        let mut words = vec![0u64; layout.iter().map(|(_, n)| n).sum()];
        for (field, index, value) in &self.words {
            let mut at = 0;
            for (name, n) in &layout {
                if name == field {
                    assert!(index < n, "{field}[{index}]");
                    break;
                }
                at += n;
            }
            assert!(at < words.len(), "no field {field} in struct phos_call");
            words[at + index] = *value;
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

fn run(p: &mut Program, call: &Call) -> u64 {
    p.run(&call.bytes(), BUDGET).unwrap_or_else(|f| panic!("{} faulted: {f}", p.name()))
}

#[test]
fn token_bucket_admits_a_burst_then_delays() {
    let Some(elf) = compile("token_bucket") else { return };
    let mut p = Program::load(&elf, &[]).unwrap();
    assert_eq!(p.name(), "token_bucket");
    assert_eq!(p.spec_hash(), Some(spec_define("PHOS_SPEC_HASH")));
    let t1_now = 5_000_000_000;
    let t1 = Call::tenant(1).set("now_ns", t1_now);
    for _ in 0..3 {
        assert_eq!(run(&mut p, &t1), ADMIT);
    }
    // burst = 3, rate = 10/s: the next token comes in 100 ms.
    assert_eq!(run(&mut p, &t1), delay(100_000_000));
    // Another tenant has its own bucket.
    let t2 = Call::tenant(2).set("now_ns", t1_now);
    assert_eq!(run(&mut p, &t2), ADMIT);
    // 250 ms later, two tokens.
    let later = Call::tenant(1).set("now_ns", t1_now + 250_000_000);
    assert_eq!(run(&mut p, &later), ADMIT);
    assert_eq!(run(&mut p, &later), ADMIT);
    assert_eq!(run(&mut p, &later), delay(100_000_000));

    // The host sees and changes the buckets: { tokens, last_ns }.
    let bucket = p.map_lookup("buckets", &1u64.to_le_bytes()).unwrap();
    assert_eq!(bucket[..8], 0u64.to_le_bytes());
    assert_eq!(bucket[8..], (t1_now + 200_000_000).to_le_bytes());
    let mut refilled = bucket.clone();
    refilled[..8].copy_from_slice(&2u64.to_le_bytes());
    p.map_update("buckets", &1u64.to_le_bytes(), &refilled).unwrap();
    assert_eq!(run(&mut p, &later), ADMIT);
    assert_eq!(run(&mut p, &later), ADMIT);
    assert_eq!(run(&mut p, &later), delay(100_000_000));
    assert_eq!(p.map_lookup("buckets", &3u64.to_le_bytes()), None);
    assert_eq!(p.map_lookup("buckets", &[0; 4]), None, "wrong key size");
    assert_eq!(p.map_lookup("nope", &[0; 8]), None);
    assert!(matches!(p.map_update("buckets", &[0; 8], &[0; 4]), Err(MapError::ValueSize { .. })));
    assert_eq!(p.map_update("nope", &[0; 8], &[0; 16]), Err(MapError::NoSuchMap("nope".into())));
    // A new tenant from the host, then the map fills up (16 entries).
    for t in 100..114u64 {
        p.map_update("buckets", &t.to_le_bytes(), &[0; 16]).unwrap();
    }
    assert_eq!(p.map_update("buckets", &999u64.to_le_bytes(), &[0; 16]), Err(MapError::Full("buckets".into())));
    // The program cannot insert a new tenant either: it rejects.
    let t3 = Call::tenant(3).set("now_ns", t1_now);
    assert_eq!(run(&mut p, &t3), reject(800));
    p.map_delete("buckets", &100u64.to_le_bytes()).unwrap();
    assert_eq!(run(&mut p, &t3), ADMIT);

    let buckets = p.maps().into_iter().find(|m| m.name == "buckets").unwrap();
    assert_eq!((buckets.kind, buckets.key_size, buckets.value_size, buckets.max_entries), (1, 8, 16, 16));
    assert_eq!(buckets.entries, 16);
    assert_eq!(p.map_keys("buckets").unwrap().len(), 16);
    assert!(p.maps().iter().any(|m| m.name == ".rodata"));
    // The refill function is linked in and called.
    let text = p.disassemble().join("\n");
    assert!(text.contains("call 1 (map_lookup_elem)") && text.contains("map[buckets]"), "{text}");
    assert!(text.lines().any(|l| l.contains("call +")), "{text}");
    assert_eq!(p.disassemble().len(), p.instructions());
}

#[test]
fn token_bucket_parameters_are_set_at_load() {
    let Some(elf) = compile("token_bucket") else { return };
    let mut p = Program::load(&elf, &[("burst", 1u64.to_le_bytes().to_vec())]).unwrap();
    let t = Call::tenant(9).set("now_ns", 1_000_000_000);
    assert_eq!(run(&mut p, &t), ADMIT);
    assert_eq!(run(&mut p, &t), delay(100_000_000));
    let mut p = Program::load(&elf, &[("rate_per_s", 1000u64.to_le_bytes().to_vec())]).unwrap();
    for _ in 0..3 {
        assert_eq!(run(&mut p, &t), ADMIT);
    }
    assert_eq!(run(&mut p, &t), delay(1_000_000));
    // Parameters are read-only to the program and to the host.
    assert_eq!(p.map_update(".rodata", &[0; 4], &[0; 16]), Err(MapError::ReadOnly(".rodata".into())));
}

#[test]
fn parameters_of_other_widths_and_errors() {
    let Some(elf) = compile("params") else { return };
    let to_device = spec_define("PHOS_RC_bytes_to_device") as usize;
    let copy = |bytes: u64| Call::default().set_at("amount", to_device, bytes);
    let mut p = Program::load(&elf, &[]).unwrap();
    assert_eq!(run(&mut p, &copy(1024)), ADMIT);
    assert_eq!(run(&mut p, &copy(1025)), reject(2));
    let globals = [("limit", 100u64.to_le_bytes().to_vec()), ("code", 701u32.to_le_bytes().to_vec())];
    let mut p = Program::load(&elf, &globals).unwrap();
    assert_eq!(run(&mut p, &copy(100)), ADMIT);
    assert_eq!(run(&mut p, &copy(101)), reject(701));

    let e = Program::load(&elf, &[("nope", vec![0; 8])]).unwrap_err();
    assert!(matches!(&e, LoadError::Global { name, .. } if name == "nope"), "{e}");
    let e = Program::load(&elf, &[("limit", vec![0; 4])]).unwrap_err();
    assert!(matches!(&e, LoadError::Global { name, .. } if name == "limit"), "{e}");
    assert!(e.to_string().contains("size"), "{e}");
    let e = Program::load(&elf, &[("limit", vec![0; 8]), ("limit", vec![1; 8])]).unwrap_err();
    assert!(matches!(e, LoadError::Global { .. }), "{e}");
}

#[test]
fn array_map_atomics_and_data_sections() {
    let Some(elf) = compile("array_count") else { return };
    let mut p = Program::load(&elf, &[]).unwrap();
    for f in 0..20u64 {
        assert_eq!(run(&mut p, &Call::tenant(100 + f).set("function", f)), ADMIT);
    }
    for slot in 0..8u32 {
        let v = p.map_lookup("per_function", &slot.to_le_bytes()).unwrap();
        let calls = u64::from_le_bytes(v[..8].try_into().unwrap());
        let last = u64::from_le_bytes(v[8..].try_into().unwrap());
        assert_eq!(calls, if slot < 4 { 3 } else { 2 }, "slot {slot}");
        assert_eq!(last, 100 + if slot < 4 { 16 + u64::from(slot) } else { 8 + u64::from(slot) });
    }
    assert_eq!(p.map_lookup("per_function", &8u32.to_le_bytes()), None);
    assert_eq!(p.map_lookup(".bss", &0u32.to_le_bytes()), Some(20u64.to_le_bytes().to_vec()));
    assert_eq!(p.map_lookup(".data", &0u32.to_le_bytes()), Some(1u64.to_le_bytes().to_vec()));
    // The host resets a counter.
    p.map_update("per_function", &0u32.to_le_bytes(), &[0; 16]).unwrap();
    run(&mut p, &Call::default());
    assert_eq!(p.map_lookup("per_function", &0u32.to_le_bytes()).unwrap()[..8], 1u64.to_le_bytes());
    let info = p.maps().into_iter().find(|m| m.name == "per_function").unwrap();
    assert_eq!((info.kind, info.entries, info.max_entries), (2, 8, 8));

    // A writable global (.data) patched at load.
    let mut p = Program::load(&elf, &[("step", 5u64.to_le_bytes().to_vec())]).unwrap();
    run(&mut p, &Call::default());
    run(&mut p, &Call::default());
    assert_eq!(p.map_lookup(".bss", &0u32.to_le_bytes()), Some(10u64.to_le_bytes().to_vec()));
    // .bss can be set too (to its initial value).
    Program::load(&elf, &[("total_calls", 1u64.to_le_bytes().to_vec())]).unwrap();
}

/// Collects the `phos_policy` log lines as "policy: line".
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

#[derive(Default)]
struct Fields {
    policy: String,
    message: String,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "policy" => self.policy = value.to_string(),
            "message" => self.message = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn Debug) {
        match field.name() {
            "policy" => self.policy = format!("{value:?}"),
            "message" => self.message = format!("{value:?}"),
            _ => {}
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() == "phos_policy" {
            let mut f = Fields::default();
            event.record(&mut f);
            self.0.lock().unwrap().push(format!("{}: {}", f.policy, f.message));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn string_literals_and_logging() {
    let Some(elf) = compile("log") else { return };
    let mut p = Program::load(&elf, &[]).unwrap();
    assert!(p.maps().iter().any(|m| m.name.starts_with(".rodata.str")), "{:?}", p.maps());
    let capture = Capture::default();
    let malloc = spec_define("PHOS_FN_cudaMalloc");
    tracing::subscriber::with_default(capture.clone(), || {
        assert_eq!(run(&mut p, &Call::tenant(3).set("function", malloc)), ADMIT);
        assert_eq!(run(&mut p, &Call::tenant(4).set("function", 1)), ADMIT);
    });
    let lines = capture.0.lock().unwrap().clone();
    let signed = malloc as i64 - 20;
    assert_eq!(
        lines,
        [
            format!("log_calls: tenant 3 calls malloc ({signed})"),
            "log_calls: %x=ff    -7|1  |".to_string(),
            "log_calls: tenant 4 calls other (-19)".to_string(),
            "log_calls: %x=ff    -7|1  |".to_string(),
        ]
    );
}

#[test]
fn bounded_loop() {
    let Some(elf) = compile("loop") else { return };
    let mut p = Program::load(&elf, &[]).unwrap();
    // The loop is a real loop (a backward jump), not unrolled.
    assert!(p.disassemble().iter().any(|l| l.contains("goto -")), "{:#?}", p.disassemble());
    let rc = spec_define("PHOS_RC_COUNT");
    let call =
        |share: u64| (0..rc).fold(Call::default().set("share", share), |c, i| c.set_at("amount", i as usize, i + 1));
    let all: u64 = (1..=rc).sum();
    assert_eq!(run(&mut p, &call(0)), ADMIT);
    assert_eq!(run(&mut p, &call(2)), delay(3));
    assert_eq!(run(&mut p, &call(rc)), delay(all));
    assert_eq!(run(&mut p, &call(1000)), delay(all));
    // The budget counts the loop's iterations.
    assert!(matches!(p.run(&call(rc).bytes(), 20), Err(Fault::Budget { budget: 20, .. })));
}

#[test]
fn reading_past_the_context_faults() {
    let Some(elf) = compile("oob") else { return };
    let mut p = Program::load(&elf, &[]).unwrap();
    let ctx = Call::default().bytes();
    let f = p.run(&ctx, BUDGET).unwrap_err();
    let Fault::Memory { addr, len, write, .. } = &f else { panic!("{f:?}") };
    assert_eq!((*len, *write), (8, false));
    assert_eq!(*addr & 0xffff_ffff, ctx.len() as u64 + 32);
    assert!(f.to_string().contains("context"), "{f}");
    // With a context large enough, the same program runs.
    let mut bigger = ctx.clone();
    bigger.resize(ctx.len() + 40, 0xab);
    assert_eq!(p.run(&bigger, BUDGET), Ok(0xabab_abab_abab_abab));
}

#[test]
fn endless_loop_runs_out_of_budget() {
    let Some(elf) = compile("forever") else { return };
    let mut p = Program::load(&elf, &[]).unwrap();
    assert_eq!(run(&mut p, &Call::tenant(27)), delay(111));
    let f = p.run(&Call::tenant(0).bytes(), BUDGET).unwrap_err();
    assert!(matches!(f, Fault::Budget { budget: BUDGET, .. }), "{f}");
    // It stays usable.
    assert_eq!(run(&mut p, &Call::tenant(1)), delay(0));
}

#[test]
fn objects_without_exactly_one_policy() {
    if let Some(elf) = compile("two_entries") {
        let e = Program::load(&elf, &[]).unwrap_err();
        assert!(matches!(&e, LoadError::SeveralPrograms(names) if names == &["first", "second"]), "{e}");
    }
    if let Some(elf) = compile("no_entry") {
        assert!(matches!(Program::load(&elf, &[]), Err(LoadError::NoProgram)));
    }
}

#[test]
fn garbage_is_rejected() {
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        b"\x7fELF".to_vec(),
        vec![0; 64],
        (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect(),
        std::fs::read("/proc/self/exe").unwrap(),
    ];
    for bytes in cases {
        let e = Program::load(&bytes, &[]).unwrap_err();
        assert!(matches!(e, LoadError::Malformed(_)), "{e}");
    }
    let Some(elf) = compile("token_bucket") else { return };
    for len in (0..elf.len()).step_by(7) {
        assert!(Program::load(&elf[..len], &[]).is_err(), "truncated to {len} bytes");
    }
}

/// xorshift64*, for reproducible mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// File ranges worth mutating most: the headers, code, relocations, symbols and data.
fn hot_ranges(elf: &[u8]) -> Vec<(usize, usize)> {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(elf).unwrap();
    let mut ranges = vec![(0, 64)];
    for s in file.sections() {
        let name = s.name().unwrap_or("");
        if name.starts_with(".debug") || name.starts_with(".rel.debug") || name.contains("BTF") {
            continue;
        }
        if let Some((off, size)) = s.file_range()
            && size > 0
        {
            ranges.push((off as usize, size as usize));
        }
    }
    // The section header table, at the end of clang's objects.
    let shoff = u64::from_le_bytes(elf[0x28..0x30].try_into().unwrap()) as usize;
    ranges.push((shoff, elf.len() - shoff));
    ranges
}

/// Loads (and runs, where they load) `rounds` random mutations of an object. Returns how
/// many loaded, and how many panicked inside aya-obj (caught by the runtime).
fn fuzz(name: &str, elf: &[u8], rounds: usize, seed: u64) -> (usize, usize) {
    let hot = hot_ranges(elf);
    let mut rng = Rng(seed | 1);
    let (mut loaded, mut parser_panics) = (0, 0);
    let ctx = Call::default().bytes();
    for round in 0..rounds {
        let mut bytes = elf.to_vec();
        for _ in 0..1 + rng.below(4) {
            let (start, len) = if rng.below(4) == 0 { (0, bytes.len()) } else { hot[rng.below(hot.len())] };
            let at = (start + rng.below(len.max(1))).min(bytes.len() - 1);
            match rng.below(5) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => bytes[at] = rng.next() as u8,
                2 => {
                    let v = [0u32, 1, 8, 0x7fff_ffff, u32::MAX, rng.next() as u32][rng.below(6)];
                    let at = at & !3;
                    if at + 4 <= bytes.len() {
                        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
                    }
                }
                3 => bytes[at] = bytes[at].wrapping_add(8),
                _ => bytes.truncate(at.max(1)),
            }
        }
        let result = std::panic::catch_unwind(|| {
            let p = Program::load(&bytes, &[]);
            if let Ok(mut p) = p {
                let _ = p.run(&ctx, 10_000);
                let _ = p.disassemble();
                return Ok(());
            }
            p.map(|_| ())
        });
        match result {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(LoadError::Malformed(why))) if why.contains("the object parser failed") => {
                eprintln!("{name} round {round}: {why}");
                parser_panics += 1
            }
            Ok(Err(_)) => {}
            Err(_) => panic!("{name} round {round}: Program::load or run panicked"),
        }
    }
    (loaded, parser_panics)
}

#[test]
fn mutated_objects_never_panic() {
    // PHOS_FUZZ_ROUNDS=n runs n rounds on every test program instead.
    let rounds: Option<usize> = std::env::var("PHOS_FUZZ_ROUNDS").ok().and_then(|v| v.parse().ok());
    let seed = std::env::var("PHOS_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15);
    let names: &[&str] = match rounds {
        Some(_) => &["token_bucket", "array_count", "params", "log", "loop", "oob", "forever", "two_entries"],
        None => &["token_bucket"],
    };
    for name in names {
        let Some(elf) = compile(name) else { return };
        let (loaded, parser_panics) = fuzz(name, &elf, rounds.unwrap_or(2000), seed);
        eprintln!("{name}: {loaded} mutants loaded, {parser_panics} panics caught inside the object parser");
        assert_eq!(parser_panics, 0, "the structural checks let a panic through to aya-obj");
    }
}

#[test]
fn shipped_policies_load_and_run() {
    for (name, elf) in phos_policy::shipped::SHIPPED {
        let mut p = Program::load(elf, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.spec_hash(), Some(spec_define("PHOS_SPEC_HASH")), "{name}");
        for tenant in 0..4 {
            let call = Call::tenant(tenant).set("now_ns", 1_000_000_000 + tenant).set("share", 1);
            p.run(&call.bytes(), BUDGET).unwrap_or_else(|f| panic!("{name}: {f}"));
        }
        assert_eq!(p.disassemble().len(), p.instructions());
    }
}

#[test]
fn fair_share_brakes_a_tenant_ahead_then_stops_it() {
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    // Time-sliced, with the brake (off unless set) and no tolerance (the leads below are
    // exact).
    let mut p = Program::load(
        elf,
        &[
            ("quantum_ns", 0u64.to_le_bytes().to_vec()),
            ("brake_ns", 2_000_000u64.to_le_bytes().to_vec()),
            ("tolerance_ppm", 0u64.to_le_bytes().to_vec()),
        ],
    )
    .unwrap();
    let (dt, launches) = (spec_define("PHOS_RC_device_time") as usize, spec_define("PHOS_RC_kernel_launches") as usize);
    const MS: u64 = 1_000_000;
    let t0 = 5_000 * MS;
    let poll = 50_000;
    // A call of `tenant` at `now`: measured device time `used`, `pending` of it queued in
    // `queued` kernels, the queue empty since `drained`.
    let call = |tenant: u64, now: u64, launch: bool, used: u64, pending: u64, queued: u64, drained: u64| {
        Call::tenant(tenant)
            .set("now_ns", now)
            .set("share", 1)
            .set_at("amount", launches, u64::from(launch))
            .set_at("amount", dt, if launch { 5 * MS } else { 0 })
            .set_at("used", dt, used + pending)
            .set_at("pending", dt, pending)
            .set_at("queued", dt, queued)
            .set_at("drained_ns", dt, drained)
    };
    assert_eq!(run(&mut p, &call(1, t0, false, 0, 0, 0, 0)), ADMIT);
    // Tenant 0 launches a kernel estimated at 5 ms: until its next call the other tenant
    // sees that much of its work queued.
    assert_eq!(run(&mut p, &call(0, t0, true, 0, 0, 0, 0)), ADMIT);
    // Tenant 1 has run 6 ms: 1 ms ahead, within the brake's margin (2 ms), it may queue more.
    assert_eq!(run(&mut p, &call(1, t0 + MS, true, 6 * MS, 0, 1, 0)), ADMIT);
    // 7 ms ahead: braked. While a kernel of its own is queued, its launch waits...
    assert_eq!(run(&mut p, &call(1, t0 + 2 * MS, true, 12 * MS, 0, 1, 0)), delay(poll));
    // ... unless another thread of its guest waits for this launch (a barrier): its own
    // kernels queued may be behind that thread's wait.
    assert_eq!(run(&mut p, &call(1, t0 + 2 * MS, true, 12 * MS, 0, 1, 0).set("awaited", 1)), ADMIT);
    // ... and once its queue is empty, until it has been for (7 - 2) / 8 ms.
    let now = t0 + 3 * MS;
    assert_eq!(run(&mut p, &call(1, now, true, 12 * MS, 0, 0, now - MS / 2)), delay(625_000 - MS / 2));
    assert_eq!(run(&mut p, &call(1, now, true, 12 * MS, 0, 0, now - 625_000)), ADMIT);
    // 35 ms ahead, past the slack (30 ms): stopped, empty queue or not (waiting for the
    // others, not for itself).
    assert_eq!(run(&mut p, &call(1, now, true, 40 * MS, 0, 0, 1)), delay(poll));
    assert_eq!(run(&mut p, &call(1, now, true, 40 * MS, 0, 0, 1).set("awaited", 1)), delay(poll));
    // Copies and queries are never held back.
    assert_eq!(run(&mut p, &call(1, now, false, 40 * MS, 0, 0, 1)), ADMIT);
    // The other tenant's queued work counts: with 30 ms of it queued, tenant 1 is 10 ms ahead.
    assert_eq!(run(&mut p, &call(0, now, false, 0, 30 * MS, 6, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(1, now, true, 40 * MS, 0, 0, 1)), ADMIT);
    assert_eq!(run(&mut p, &call(1, now, true, 40 * MS, 0, 1, 1)), delay(poll));
}

/// A launch of `tenant` at `now`, with its measured device time `used` and `queued` kernels.
fn fair_launch(tenant: u64, now: u64, used: u64, queued: u64) -> Call {
    let (dt, launches) = (spec_define("PHOS_RC_device_time") as usize, spec_define("PHOS_RC_kernel_launches") as usize);
    Call::tenant(tenant)
        .set("now_ns", now)
        .set("share", 1)
        .set_at("amount", launches, 1)
        .set_at("used", dt, used)
        .set_at("queued", dt, queued)
}

/// Time-sliced, fair_share by default only stops a tenant past its slack: within it, a
/// tenant ahead launches with kernels queued.
#[test]
fn fair_share_does_not_brake_unless_asked() {
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    let mut p = Program::load(elf, &[("quantum_ns", 0u64.to_le_bytes().to_vec())]).unwrap();
    let dt = spec_define("PHOS_RC_device_time") as usize;
    const MS: u64 = 1_000_000;
    let t0 = 5_000 * MS;
    let call = |tenant: u64, now: u64, used: u64, queued: u64| {
        fair_launch(tenant, now, used, queued).set_at("amount", dt, 5 * MS)
    };
    assert_eq!(run(&mut p, &call(0, t0, 0, 0)), ADMIT);
    // 12 ms ahead (with the other's 5 ms launch queued: 7), its own kernel queued: it goes.
    assert_eq!(run(&mut p, &call(1, t0 + MS, 12 * MS, 1)), ADMIT);
    // Past the slack (30 ms): stopped.
    assert_eq!(run(&mut p, &call(1, t0 + 2 * MS, 45 * MS, 1)), delay(50_000));
}

#[test]
fn fair_share_parameters_set_the_brake() {
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    let param = |name: &'static str, v: u64| (name, v.to_le_bytes().to_vec());
    // No brake margin, no hold: a tenant ahead at all keeps one kernel queued at a time.
    let mut p = Program::load(
        elf,
        &[param("quantum_ns", 0), param("brake_ns", 0), param("hold_div", 0), param("tolerance_ppm", 0)],
    )
    .unwrap();
    let dt = spec_define("PHOS_RC_device_time") as usize;
    let t0 = 5_000_000_000;
    let call = |tenant: u64, used: u64, queued: u64| fair_launch(tenant, t0, used, queued).set_at("drained_ns", dt, t0);
    assert_eq!(run(&mut p, &call(0, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(1, 0, 1)), ADMIT, "level: not braked");
    assert_eq!(run(&mut p, &call(1, 1000, 1)), delay(50_000));
    assert_eq!(run(&mut p, &call(1, 1000, 0)), ADMIT, "an empty queue, no hold");
}

/// Time-sliced, with a tolerance, a lead that grows no faster than that share of wall time
/// is forgiven as it grows; one that grows faster is still stopped past the slack.
#[test]
fn fair_share_forgives_a_lead_within_its_tolerance() {
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    let mut p = Program::load(
        elf,
        &[("quantum_ns", 0u64.to_le_bytes().to_vec()), ("tolerance_ppm", 50_000u64.to_le_bytes().to_vec())],
    )
    .unwrap();
    const MS: u64 = 1_000_000;
    let t0 = 5_000 * MS;
    let call = |tenant: u64, now: u64, used: u64| fair_launch(tenant, now, used, 0);
    // Both tenants call every 10 ms for a second; tenant 1 is charged 4% more each time
    // (0.4 ms per 10 ms: 40 ms ahead after a second without the tolerance).
    for i in 0..=100u64 {
        let now = t0 + i * 10 * MS;
        assert_eq!(run(&mut p, &call(0, now, i * 10 * MS)), ADMIT);
        assert_eq!(run(&mut p, &call(1, now + 1, i * 10 * MS + i * 400_000)), ADMIT, "call {i}");
    }
    // Charged 20% more from here: the lead outgrows the tolerance and passes the slack.
    let mut stopped = false;
    for i in 101..=400u64 {
        let now = t0 + i * 10 * MS;
        assert_eq!(run(&mut p, &call(0, now, i * 10 * MS)), ADMIT);
        stopped |= run(&mut p, &call(1, now + 1, i * 10 * MS + 40 * MS + (i - 100) * 2 * MS)) != ADMIT;
    }
    assert!(stopped, "a lead growing at 20% of wall time was never stopped");
}

/// Calls of one tenant's threads reach a policy in a different order than their clocks were
/// read: a call timed just before another's must not see that one as far in the future.
#[test]
fn shipped_policies_take_a_call_timed_before_the_last_one_in_stride() {
    let launches = spec_define("PHOS_RC_kernel_launches") as usize;
    const MS: u64 = 1_000_000;
    let t0 = 5_000 * MS;
    // fair_share: the other tenant, called a microsecond after this call's clock, is still
    // active; the tenant 10 ms ahead with a kernel queued is still braked.
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    let mut p = Program::load(
        elf,
        &[("quantum_ns", 0u64.to_le_bytes().to_vec()), ("brake_ns", (2 * MS).to_le_bytes().to_vec())],
    )
    .unwrap();
    let call = fair_launch;
    assert_eq!(run(&mut p, &call(1, t0, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(0, t0, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(0, t0 + MS, 10 * MS, 1)), delay(50_000));
    assert_eq!(run(&mut p, &call(1, t0 + 5 * MS, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(0, t0 + 5 * MS - 1_000, 10 * MS, 1)), delay(50_000));
    // rate_limit: a bucket emptied at t0 + 1 ms is not refilled by a call timed before that.
    let Some(elf) = phos_policy::shipped::get("rate_limit") else { return };
    let param = |name: &'static str, v: u64| (name, v.to_le_bytes().to_vec());
    let mut p = Program::load(elf, &[param("launches_per_s", 1000), param("launch_burst", 1)]).unwrap();
    let launch = |now: u64| Call::tenant(0).set("now_ns", now).set("share", 1).set_at("amount", launches, 1);
    assert_eq!(run(&mut p, &launch(t0)), ADMIT);
    assert_ne!(run(&mut p, &launch(t0 + 100_000)), ADMIT, "one launch a millisecond");
    assert_eq!(run(&mut p, &launch(t0 + MS)), ADMIT);
    assert_ne!(run(&mut p, &launch(t0 + MS - 1_000)), ADMIT, "a call timed before the last refill");
}

/// The engine hands each program a `now_ns` that never goes backwards, whatever order the
/// calls of several threads reach it in (their clocks are read before they queue for it).
#[test]
fn the_engine_never_turns_a_programs_clock_back() {
    let Some(elf) = compile("clock_order") else { return };
    let set = phos_policy::engine::PolicySet::new(BUDGET);
    set.load("clock", "test", &elf, &[], phos_policy::engine::KernelCheck::Skip, &|| false).unwrap();
    let at = |now_ns| phos_policy::engine::CallContext { now_ns, ..Default::default() };
    assert_eq!(set.decide(&at(10_000_000)), phos_policy::engine::Verdict::Admit);
    assert_eq!(set.decide(&at(9_999_000)), phos_policy::engine::Verdict::Admit, "a call timed before the last one");
    assert_eq!(set.decide(&at(20_000_000)), phos_policy::engine::Verdict::Admit);
}

/// fair_share's turns: a launch waits while the others have kernels on the device; a tenant
/// with the device goes on until it is a quantum ahead of the slowest tenant asking to
/// launch; then the slowest goes.
#[test]
fn fair_share_takes_turns() {
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    let mut p = Program::load(elf, &[]).unwrap();
    let dt = spec_define("PHOS_RC_device_time") as usize;
    const MS: u64 = 1_000_000;
    let t0 = 5_000 * MS;
    let poll = delay(50_000);
    // A launch of `tenant` at `now` (ms after t0), `used` ms measured, with `queued` kernels
    // of its own and `others` of other tenants on the device.
    let call = |tenant: u64, now: u64, used: u64, queued: u64, others: u64| {
        fair_launch(tenant, t0 + now * MS, used * MS, queued).set_at("others_queued", dt, others)
    };
    assert_eq!(run(&mut p, &call(0, 0, 0, 0, 0)), ADMIT, "alone");
    assert_eq!(run(&mut p, &call(1, 1, 0, 0, 1)), poll, "the other's kernel is on the device");
    // Tenant 0 has the device: on until 5 ms (the quantum) ahead of tenant 1, who waits.
    assert_eq!(run(&mut p, &call(0, 2, 4, 1, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(1, 2, 0, 0, 1)), poll);
    assert_eq!(run(&mut p, &call(0, 3, 6, 1, 0)), poll, "6 ms ahead of a tenant waiting");
    // Its queue drained, the device goes to tenant 1, behind; tenant 0 waits for it.
    assert_eq!(run(&mut p, &call(1, 4, 0, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(0, 4, 6, 0, 1)), poll);
    assert_eq!(run(&mut p, &call(1, 5, 0, 1, 0)), ADMIT, "the slowest goes on");
    // Kernels queued count: at 8 ms with 4 ms queued, tenant 1 is 6 ms ahead of tenant 0
    // (once tenant 0 has asked again: the slowest asking is known from the asks).
    let queued = |c: Call, ms: u64| c.set_at("pending", dt, ms * MS).set_at("used", dt, 12 * MS);
    assert_eq!(run(&mut p, &queued(call(1, 6, 8, 2, 0), 4)), ADMIT);
    assert_eq!(run(&mut p, &call(0, 6, 6, 0, 2)), poll);
    assert_eq!(run(&mut p, &queued(call(1, 7, 8, 2, 0), 4)), poll);
    // Copies and queries are never held back.
    let copy = call(0, 7, 6, 0, 2).set_at("amount", spec_define("PHOS_RC_kernel_launches") as usize, 0);
    assert_eq!(run(&mut p, &copy), ADMIT);
}

/// Turns never wait for ever: for a tenant that has stopped asking, or for work on the
/// device that does not drain (then tenants time-slice until it has); and a tenant banks
/// at most `bank_ns` of device time it did not use.
#[test]
fn fair_share_turns_give_up_waiting() {
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    let param = |name: &'static str, v: u64| (name, v.to_le_bytes().to_vec());
    let mut p = Program::load(elf, &[param("max_wait_ns", 10_000_000), param("bank_ns", 50_000_000)]).unwrap();
    let dt = spec_define("PHOS_RC_device_time") as usize;
    const MS: u64 = 1_000_000;
    let t0 = 5_000 * MS;
    let poll = delay(50_000);
    let call = |tenant: u64, now: u64, used: u64, others: u64| {
        fair_launch(tenant, t0 + now * MS, used * MS, 0).set_at("others_queued", dt, others)
    };
    assert_eq!(run(&mut p, &call(1, 0, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(0, 0, 0, 1)), poll);
    // Tenant 1 runs far ahead of tenant 0, who last asked 3 ms ago: not waited for.
    assert_eq!(run(&mut p, &call(1, 3, 40, 0)), ADMIT);
    // Tenant 0 waits for work that does not drain: after 10 ms it launches beside it, and
    // goes on doing so while that work is there.
    assert_eq!(run(&mut p, &call(0, 4, 0, 1)), poll);
    assert_eq!(run(&mut p, &call(0, 9, 0, 1)), poll);
    assert_eq!(run(&mut p, &call(0, 14, 0, 1)), ADMIT);
    assert_eq!(run(&mut p, &call(0, 15, 0, 1)), ADMIT);
    // Once the device is free of it, waits start over.
    assert_eq!(run(&mut p, &call(0, 16, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(0, 17, 0, 1)), poll);
    // Tenant 1 at 120 ms is stopped for tenant 0 only until tenant 0 has caught up with
    // what it banked: tenant 0 is lifted to 50 ms (its bank) behind, 70 ms.
    assert_eq!(run(&mut p, &call(1, 18, 120, 0)), poll);
    assert_eq!(run(&mut p, &call(0, 19, 0, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(0, 20, 44, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(1, 21, 120, 0)), poll, "6 ms ahead of tenant 0 (70 + 44 ms)");
    assert_eq!(run(&mut p, &call(0, 21, 46, 0)), ADMIT);
    assert_eq!(run(&mut p, &call(1, 22, 120, 0)), ADMIT, "4 ms ahead of tenant 0");
}

/// fair_share driven by a simulated GPU and router: two tenants of the fairness benchmark's
/// load (each keeping two batches of about 1 ms of kernels queued), one of `short_ns`
/// kernels and one of `long_ns`, equal shares, for `secs` seconds. The device runs one
/// tenant's kernels at a time, time-slicing in 2 ms slices when both have work (and then,
/// as on a GPU, a kernel's events span the other's slices too); a kernel's measurement
/// reaches the books 100 µs after it ends. Returns each tenant's device time per 100 ms
/// window and the device's idle time.
mod simulated {
    use super::*;
    use std::collections::VecDeque;

    const STEP: u64 = 5_000;
    const SLICE: u64 = 2_000_000;
    const REPORT: u64 = 100_000;

    #[derive(Default)]
    struct Tenant {
        kernel_ns: u64,
        batch: u64,
        // The guest: kernels left to launch in the batch being launched, batches launched
        // and not completed (kernels of each still to complete), when to ask again.
        to_launch: u64,
        batches: VecDeque<u64>,
        retry_at: u64,
        // The device: kernels queued (time left, and when each started, for its events).
        queue: VecDeque<(u64, Option<u64>)>,
        // The router's books.
        measured_ns: u64,
        measured: u64,
        admitted: u64,
        drained_ns: u64,
        reports: VecDeque<(u64, u64)>,
        // What it really ran, per window.
        truth: Vec<u64>,
    }

    impl Tenant {
        fn queued(&self) -> u64 {
            self.admitted - self.measured
        }
        fn mean(&self) -> u64 {
            self.measured_ns.checked_div(self.measured).unwrap_or(0)
        }
    }

    pub struct Outcome {
        pub windows: Vec<[u64; 2]>,
        pub idle_ns: u64,
    }

    pub fn run_pair(p: &mut Program, short_ns: u64, long_ns: u64, secs: u64) -> Outcome {
        let (dt, launches) =
            (spec_define("PHOS_RC_device_time") as usize, spec_define("PHOS_RC_kernel_launches") as usize);
        let mut ts: Vec<Tenant> = [short_ns, long_ns]
            .iter()
            .map(|&k| Tenant { kernel_ns: k, batch: (1_000_000 / k).max(1), ..Default::default() })
            .collect();
        let t0 = 1_000_000_000;
        let end = t0 + secs * 1_000_000_000;
        let window = 100_000_000;
        let (mut slice_owner, mut slice_left, mut idle_ns) = (0usize, SLICE, 0u64);
        let mut now = t0;
        while now < end {
            let w = ((now - t0) / window) as usize;
            // The guests.
            for i in 0..2 {
                let other_queued = ts[1 - i].queued();
                let t = &mut ts[i];
                if t.to_launch == 0 && t.batches.len() < 2 {
                    t.to_launch = t.batch;
                    t.batches.push_back(0);
                }
                while t.to_launch > 0 && now >= t.retry_at {
                    let mean = t.mean();
                    let call = Call::tenant(i as u64)
                        .set("now_ns", now)
                        .set("share", 1)
                        .set_at("amount", launches, 1)
                        .set_at("amount", dt, mean)
                        .set_at("used", dt, t.measured_ns + t.queued() * mean)
                        .set_at("pending", dt, t.queued() * mean)
                        .set_at("queued", dt, t.queued())
                        .set_at("drained_ns", dt, t.drained_ns)
                        .set_at("others_queued", dt, other_queued);
                    let verdict = run(p, &call);
                    if verdict != ADMIT {
                        assert_eq!(verdict >> 62, 1, "only delays");
                        t.retry_at = now + (verdict & ((1 << 62) - 1)).max(STEP);
                        break;
                    }
                    t.admitted += 1;
                    t.queue.push_back((t.kernel_ns, None));
                    t.to_launch -= 1;
                    *t.batches.back_mut().unwrap() += 1;
                }
            }
            // The device.
            let busy: Vec<usize> = (0..2).filter(|&i| !ts[i].queue.is_empty()).collect();
            let runs = match busy.len() {
                0 => None,
                1 => Some(busy[0]),
                _ => {
                    if slice_left == 0 || ts[slice_owner].queue.is_empty() {
                        slice_owner = 1 - slice_owner;
                        slice_left = SLICE;
                    }
                    slice_left = slice_left.saturating_sub(STEP);
                    Some(slice_owner)
                }
            };
            match runs {
                None => idle_ns += STEP,
                Some(i) => {
                    let t = &mut ts[i];
                    if t.truth.len() <= w {
                        t.truth.resize(w + 1, 0);
                    }
                    t.truth[w] += STEP;
                    let head = t.queue.front_mut().unwrap();
                    let started = *head.1.get_or_insert(now);
                    head.0 = head.0.saturating_sub(STEP);
                    if head.0 == 0 {
                        t.queue.pop_front();
                        t.reports.push_back((now + STEP + REPORT, now + STEP - started));
                        // The oldest batch (all launched: the guest launches in order).
                        let b = t.batches.front_mut().unwrap();
                        *b -= 1;
                        if *b == 0 && (t.batches.len() > 1 || t.to_launch == 0) {
                            t.batches.pop_front();
                        }
                    }
                }
            }
            // Started kernels of the other tenant keep their start: their events run on.
            now += STEP;
            // The servers' reports.
            for t in ts.iter_mut() {
                while t.reports.front().is_some_and(|&(at, _)| at <= now) {
                    let (_, ns) = t.reports.pop_front().unwrap();
                    t.measured_ns += ns;
                    t.measured += 1;
                    if t.queued() == 0 {
                        t.drained_ns = now;
                    }
                }
            }
        }
        let n = ts[0].truth.len().max(ts[1].truth.len());
        let at = |t: &Tenant, w: usize| t.truth.get(w).copied().unwrap_or(0);
        Outcome { windows: (0..n).map(|w| [at(&ts[0], w), at(&ts[1], w)]).collect(), idle_ns }
    }
}

/// On a simulated GPU, fair_share's turns give a tenant of 0.1 ms kernels and one of 10 ms
/// kernels equal device time within 2% over every second, and keep the device busy.
#[test]
fn fair_share_turns_split_a_simulated_gpu_evenly() {
    let Some(elf) = phos_policy::shipped::get("fair_share") else { return };
    let mut p = Program::load(elf, &[]).unwrap();
    let out = simulated::run_pair(&mut p, 100_000, 10_000_000, 6);
    let seconds: Vec<[u64; 2]> =
        out.windows.chunks(10).skip(1).map(|c| c.iter().fold([0, 0], |a, w| [a[0] + w[0], a[1] + w[1]])).collect();
    let unfair: Vec<f64> = seconds.iter().map(|s| (s[0] as f64 - s[1] as f64).abs() / (s[0] + s[1]) as f64).collect();
    eprintln!("per second: {seconds:?}; unfairness {unfair:?}; idle {} ms", out.idle_ns / 1_000_000);
    assert!(unfair.iter().all(|&u| u < 0.02), "{unfair:?}");
    assert!(out.idle_ns < 6 * 30_000_000, "idle {} ms", out.idle_ns / 1_000_000);
}

/// A load whose client gave up never takes effect: before the checks, during the kernel's
/// verification (where the router may use it), or after it.
#[test]
fn an_abandoned_load_never_takes_effect() {
    use phos_policy::engine::{KernelCheck, PolicyError, PolicySet};
    let Some(elf) = phos_policy::shipped::get("rate_limit") else { return };
    let set = PolicySet::new(BUDGET);
    for check in [KernelCheck::Skip, KernelCheck::Auto] {
        let err = set.load("gone", "test", elf, &[], check, &|| true).unwrap_err();
        assert!(err.to_string().contains("abandoned"), "{err}");
    }
    assert!(set.list().is_empty());
    if phos_policy::kernel::available() {
        // The client gives up once the verification has started: the verified policy is
        // still not loaded.
        let asked = std::cell::Cell::new(0);
        let late = || {
            asked.set(asked.get() + 1);
            asked.get() > 1
        };
        let err = set.load("late", "test", elf, &[], KernelCheck::Require, &late).unwrap_err();
        assert!(matches!(err, PolicyError::Abandoned | PolicyError::Kernel(_)), "{err}");
        assert!(err.to_string().contains("abandoned"), "{err}");
        assert!(set.list().is_empty());
        // A client that stays gets it verified and loaded.
        let info = set.load("kept", "test", elf, &[], KernelCheck::Require, &|| false).unwrap();
        assert!(info.kernel_verified);
    }
}
