//! `phosctl bench`: Phos against native CUDA, in one run on one machine.
//!
//! It runs a micro-benchmark program (`tests/bench/remoting.cu`, which prints
//! `metric value unit` lines) and a directory of whole programs (the `tests/cuda` builds),
//! each natively and through `phosctl run` on every transport asked for, `runs` times each,
//! and writes one markdown table of medians and ratios. With `--served POOL` it also runs
//! them through a router it starts once with a pool of API servers (`phosctl serve --pool`),
//! the way an operator deploys Phos: a program then finds a server whose context is already
//! created, where `phosctl run` starts a private router and server for each program.
//! Building the programs is the caller's (nvcc lives on the GPU machine; see
//! `tests/scripts/gpu-bench.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The micro-benchmark executable (built from tests/bench/remoting.cu).
    #[arg(long)]
    micro: Option<PathBuf>,
    /// Arguments for it (`quick` skips copies above 64 MiB).
    #[arg(long, allow_hyphen_values = true)]
    micro_args: Vec<String>,
    /// A directory of CUDA program executables to time whole.
    #[arg(long)]
    programs: Option<PathBuf>,
    /// Transports to run Phos over.
    #[arg(long, value_delimiter = ',', default_value = "shm,unix")]
    transports: Vec<String>,
    /// Runs of each side; the table shows medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where to write the markdown table (also printed).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Backend for Phos (default: cuda where a GPU answers, else emu).
    #[arg(long)]
    backend: Option<String>,
    /// Also run through one router started here with this many API servers kept ready
    /// (`phosctl serve --pool POOL`), over shared memory.
    #[arg(long)]
    served: Option<usize>,
}

/// One way of running a program: natively, or through Phos over a transport (through a
/// running router at `endpoint`, or a private one).
#[derive(Clone)]
struct Side {
    label: String,
    transport: Option<String>,
    endpoint: Option<String>,
}

/// Why a benchmark could not run a side.
#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("cannot find phosctl's own executable: {0}")]
    NoExecutable(std::io::Error),
    #[error("a directory for the served router: {0}")]
    NoDirectory(std::io::Error),
    #[error("{}: {source}", path.display())]
    Start { path: PathBuf, source: std::io::Error },
    #[error("the served router did not start")]
    NotServing,
}

/// A router this benchmark started (`--served`); stopped when dropped.
struct ServedRouter {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl ServedRouter {
    fn start(pool: usize, backend: &Option<String>) -> Result<(ServedRouter, String), BenchError> {
        let dir = tempfile::tempdir().map_err(BenchError::NoDirectory)?;
        let socket = dir.path().join("router.sock");
        let me = std::env::current_exe().map_err(BenchError::NoExecutable)?;
        let mut c = Command::new(&me);
        c.arg("serve").arg("--listen").arg(format!("unix:{}", socket.display()));
        c.arg("--pool").arg(pool.to_string());
        if let Some(b) = backend {
            c.arg("--backend").arg(b);
        }
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Start { path: me, source })?;
        let served = ServedRouter { child, _dir: dir };
        // Ready once it listens and its pool had time to start (contexts take ~0.2 s each).
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while !socket.exists() {
            if Instant::now() > deadline {
                return Err(BenchError::NotServing);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(500 + 300 * pool as u64));
        Ok((served, format!("unix:{}", socket.display())))
    }
}

impl Drop for ServedRouter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// Run `exe args` natively or through Phos; returns (stdout, exit success, seconds).
fn run_once(
    side: &Side,
    backend: &Option<String>,
    exe: &Path,
    args: &[String],
) -> Result<(String, bool, f64), BenchError> {
    let mut cmd = match &side.transport {
        None => Command::new(exe),
        Some(t) => {
            let me = std::env::current_exe().map_err(BenchError::NoExecutable)?;
            let mut c = Command::new(me);
            c.arg("run").arg("--transport").arg(t);
            match (&side.endpoint, backend) {
                (Some(e), _) => drop(c.arg("--endpoint").arg(e)),
                (None, Some(b)) => drop(c.arg("--backend").arg(b)),
                (None, None) => {}
            }
            c.arg("--").arg(exe);
            c
        }
    };
    cmd.args(args).stdin(Stdio::null()).stderr(Stdio::null());
    let t = Instant::now();
    let out = cmd.output().map_err(|source| BenchError::Start { path: exe.to_path_buf(), source })?;
    let secs = t.elapsed().as_secs_f64();
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), out.status.success(), secs))
}

/// `metric value unit` lines.
fn parse_metrics(text: &str) -> Vec<(String, f64, String)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (name, v, unit) = (it.next()?, it.next()?.parse().ok()?, it.next()?);
            Some((name.to_string(), v, unit.to_string()))
        })
        .collect()
}

pub fn bench(args: BenchArgs) -> std::process::ExitCode {
    let mut sides = vec![Side { label: "native".into(), transport: None, endpoint: None }];
    for t in &args.transports {
        if !["shm", "unix"].contains(&t.as_str()) {
            eprintln!("unknown transport {t} (expected shm or unix)");
            return std::process::ExitCode::from(2);
        }
        sides.push(Side { label: format!("Phos ({t})"), transport: Some(t.clone()), endpoint: None });
    }
    let _served = match args.served {
        Some(pool) => match ServedRouter::start(pool, &args.backend) {
            Ok((router, endpoint)) => {
                let label = format!("Phos (served, pool {pool})");
                sides.push(Side { label, transport: Some("shm".into()), endpoint: Some(endpoint) });
                Some(router)
            }
            Err(e) => {
                eprintln!("{e}");
                return std::process::ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let runs = args.runs.max(1);
    let mut md = String::new();
    let header = |md: &mut String, first: &str| {
        md.push_str(&format!("| {first} |"));
        for s in &sides {
            md.push_str(&format!(" {} |", s.label));
        }
        for s in &sides[1..] {
            md.push_str(&format!(" {} / native |", s.label));
        }
        md.push('\n');
        md.push_str(&"|---".repeat(2 * sides.len()));
        md.push_str("|\n");
    };

    if let Some(micro) = &args.micro {
        // metric -> side -> values
        let mut values: BTreeMap<String, Vec<Vec<f64>>> = BTreeMap::new();
        let mut order: Vec<(String, String)> = Vec::new();
        for run in 0..runs {
            for (i, side) in sides.iter().enumerate() {
                eprintln!("micro-benchmarks, {}, run {}/{runs}", side.label, run + 1);
                let (out, ok, _) = match run_once(side, &args.backend, micro, &args.micro_args) {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("{e}");
                        return std::process::ExitCode::FAILURE;
                    }
                };
                if !ok {
                    eprintln!("{} failed {}:\n{out}", micro.display(), side.label);
                    return std::process::ExitCode::FAILURE;
                }
                for (name, v, unit) in parse_metrics(&out) {
                    if !order.iter().any(|(n, _)| n == &name) {
                        order.push((name.clone(), unit));
                    }
                    values.entry(name).or_insert_with(|| vec![Vec::new(); sides.len()])[i].push(v);
                }
            }
        }
        header(&mut md, "metric");
        for (name, unit) in &order {
            let meds: Vec<f64> = values[name].iter().map(|v| median(v.clone())).collect();
            md.push_str(&format!("| {name} |"));
            for m in &meds {
                md.push_str(&format!(" {m:.2} {unit} |"));
            }
            for m in &meds[1..] {
                // Ratios read "fraction of native" for rates and "times native" for times.
                md.push_str(&format!(" {:.3} |", m / meds[0]));
            }
            md.push('\n');
        }
        md.push_str(&format!(
            "\nMedians of {runs} runs. Rates (1/s, GB/s): higher is better, ratio = Phos / native; \
             latencies (us): lower is better.\n"
        ));
        // Kept at once: the programs take long, and a run cut short keeps this part.
        eprint!("{md}");
        if let Some(out) = &args.out {
            let _ = std::fs::write(out, &md);
        }
    }

    if let Some(dir) = &args.programs {
        let mut exes: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(d) => d
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    use std::os::unix::fs::PermissionsExt;
                    p.is_file() && p.metadata().is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
                })
                .collect(),
            Err(e) => {
                eprintln!("{}: {e}", dir.display());
                return std::process::ExitCode::FAILURE;
            }
        };
        exes.sort();
        if !md.is_empty() {
            md.push('\n');
        }
        header(&mut md, "program (wall s)");
        let mut logs: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
        for exe in &exes {
            let name = exe.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let mut times = vec![Vec::new(); sides.len()];
            let mut outputs: Vec<Option<String>> = vec![None; sides.len()];
            for run in 0..runs {
                for (i, side) in sides.iter().enumerate() {
                    eprintln!("{name}, {}, run {}/{runs}", side.label, run + 1);
                    match run_once(side, &args.backend, exe, &[]) {
                        Ok((out, _, secs)) => {
                            times[i].push(secs);
                            outputs[i].get_or_insert(out);
                        }
                        Err(e) => eprintln!("{e}"),
                    }
                }
            }
            let meds: Vec<f64> = times.into_iter().map(median).collect();
            let same = outputs.iter().all(|o| o == &outputs[0]);
            md.push_str(&format!("| {name}{} |", if same { "" } else { " (output differs!)" }));
            for m in &meds {
                md.push_str(&format!(" {m:.3} |"));
            }
            for (i, m) in meds.iter().enumerate().skip(1) {
                md.push_str(&format!(" {:.3} |", m / meds[0]));
                logs[i].push((m / meds[0]).ln());
            }
            md.push('\n');
        }
        md.push_str("| **geometric mean** |");
        md.push_str(&" |".repeat(sides.len()));
        for l in &logs[1..] {
            let g = (l.iter().sum::<f64>() / l.len().max(1) as f64).exp();
            md.push_str(&format!(" **{g:.3}** |"));
        }
        md.push_str(&format!(
            "\n\nWall time of each program (process start to exit), median of {runs} runs; Phos \
             includes starting a private router and API server (`phosctl run`), except where served: \
             through one running router with API servers kept ready (`phosctl serve --pool`).\n"
        ));
    }
    print!("{md}");
    if let Some(out) = &args.out
        && let Err(e) = std::fs::write(out, &md)
    {
        eprintln!("{}: {e}", out.display());
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
