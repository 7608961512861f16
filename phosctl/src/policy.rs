//! `phosctl policy ...`: build, load, list, show and unload the router's eBPF policies, and
//! `phosctl top`: live per-tenant usage.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Subcommand;
use phos_control::{KernelCheck, PolicyLoad, TenantUsage};

use crate::error::{CliError, report};
use crate::manage::{RouterArg, run};

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Load a policy (an ELF object, or `builtin:NAME` for a shipped one); under a name in
    /// use it replaces that policy at once, while guests run.
    Load {
        /// `builtin:rate_limit`, `builtin:fair_share`, `builtin:memory_quota`, or a path.
        policy: String,
        /// Its name in the chain (default: the builtin's name or the file's stem).
        #[arg(long)]
        name: Option<String>,
        /// Set a parameter: NAME=VALUE (integers; units like 2ms, 4GiB, 5K allowed).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        params: Vec<String>,
        /// Refuse the policy unless the kernel's verifier accepts it too.
        #[arg(long, conflicts_with = "no_kernel_check")]
        require_kernel_check: bool,
        /// Do not pass it through the kernel's verifier even where the router could.
        #[arg(long)]
        no_kernel_check: bool,
        /// Seconds to wait for the router; a load given up (or interrupted) never takes
        /// effect, and its kernel verification stops.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
        #[command(flatten)]
        router: RouterArg,
    },
    /// Unload a policy.
    Unload {
        name: String,
        #[command(flatten)]
        router: RouterArg,
    },
    /// List the loaded policies, in the order they decide.
    List {
        #[command(flatten)]
        router: RouterArg,
    },
    /// Show a loaded policy: its instructions and its maps.
    Show {
        name: String,
        #[command(flatten)]
        router: RouterArg,
    },
    /// Compile a policy from C with clang and the policy headers.
    Build {
        source: PathBuf,
        /// Output object (default: the source with `.o`).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The clang to use.
        #[arg(long, default_value = "clang")]
        clang: String,
    },
    /// Write the policy headers (phos_policy.h, phos_spec.h) into a directory, for building
    /// policies with one's own tools.
    Headers { dir: PathBuf },
}

pub fn command(cmd: PolicyCommand) -> ExitCode {
    match cmd {
        PolicyCommand::Load { policy, name, params, require_kernel_check, no_kernel_check, timeout, router } => {
            let (source, elf) = match phos_policy::resolve(&policy) {
                Ok(x) => x,
                Err(e) => return report(Err(e.into())),
            };
            let kernel_check = if require_kernel_check {
                KernelCheck::Require
            } else if no_kernel_check {
                KernelCheck::Skip
            } else {
                KernelCheck::Auto
            };
            let name = name.unwrap_or_else(|| phos_policy::default_name(&policy));
            let load = PolicyLoad { name, source, elf, params, kernel_check };
            report(run(&router, async |c| {
                let within = std::time::Duration::try_from_secs_f64(timeout).unwrap_or_default();
                let p = c.policy_load(phos_control::context_within(within), load).await??;
                println!(
                    "policy `{}` loaded ({} instructions{})",
                    p.name,
                    p.instructions,
                    if p.kernel_verified { ", accepted by the kernel's verifier" } else { "" }
                );
                Ok(())
            }))
        }
        PolicyCommand::Unload { name, router } => report(run(&router, async |c| {
            c.policy_unload(tarpc::context::current(), name.clone()).await??;
            println!("policy `{name}` unloaded");
            Ok(())
        })),
        PolicyCommand::List { router } => {
            if let Some(note) = phos_policy::shipped::absent() {
                println!("note: {note}");
            }
            list(&router)
        }
        PolicyCommand::Show { name, router } => report(run(&router, async |c| {
            let d = c.policy_show(tarpc::context::current(), name).await??;
            println!("policy `{}`: program `{}` from {}", d.summary.name, d.summary.program, d.summary.source);
            for (name, kind, k, v, max, n) in &d.maps {
                println!("map {name}: type {kind}, key {k} B, value {v} B, {n} of {max} entries");
            }
            for (i, line) in d.disassembly.iter().enumerate() {
                println!("{i:5}: {line}");
            }
            Ok(())
        })),
        PolicyCommand::Build { source, output, clang } => {
            let output = output.unwrap_or_else(|| source.with_extension("o"));
            report(
                phos_policy::build(&source, &output, &clang)
                    .map(|()| println!("{}", output.display()))
                    .map_err(Into::into),
            )
        }
        PolicyCommand::Headers { dir } => {
            let written = std::fs::create_dir_all(&dir).and_then(|_| {
                phos_policy::HEADERS.iter().try_for_each(|(name, text)| std::fs::write(dir.join(name), text))
            });
            report(written.map_err(|source| CliError::Io { context: dir.display().to_string(), source }))
        }
    }
}

/// `phosctl policy list`: the router's chain of policies, in the order they decide.
fn list(router: &RouterArg) -> ExitCode {
    report(run(router, async |c| {
        let list = c.policy_list(tarpc::context::current()).await?;
        if list.is_empty() {
            println!("no policies loaded: every call is admitted (quotas still apply)");
        }
        println!(
            "{:<16} {:>6} {:>10} {:>10} {:>9} {:>9} {:>8}  source",
            "name", "insns", "runs", "admitted", "delayed", "rejected", "mean ns"
        );
        for p in list {
            println!(
                "{:<16} {:>6} {:>10} {:>10} {:>9} {:>9} {:>8}  {}{}",
                p.name,
                p.instructions,
                p.runs,
                p.admitted,
                p.delayed,
                p.rejected,
                p.mean_run_ns,
                p.source,
                if p.kernel_verified { " (kernel-verified)" } else { "" }
            );
        }
        Ok(())
    }))
}

/// `phosctl top`: per-tenant usage, refreshed every `interval`; rates over the interval.
pub fn top(router: &RouterArg, interval: Duration, once: bool) -> ExitCode {
    report(run(router, async |c| {
        let tty = std::io::stdout().is_terminal() && !once;
        let mut last: HashMap<String, (TenantUsage, Instant)> = HashMap::new();
        loop {
            let usage = c.usage(tarpc::context::current()).await?;
            let now = Instant::now();
            let mut out = String::new();
            if tty {
                out.push_str("\x1b[H\x1b[2J");
            }
            out.push_str(&format!(
                "{:<14} {:>5} {:>9} {:>9} {:>11} {:>10} {:>8} {:>12} {:>9} {:>9}\n",
                "tenant",
                "share",
                "sessions",
                "bypassed",
                "calls/s",
                "launches/s",
                "gpu %",
                "memory",
                "delayed/s",
                "rejected"
            ));
            let device_ns: u64 = usage.iter().map(measured).sum();
            let last_device_ns: u64 = last.values().map(|(t, _)| measured(t)).sum();
            let gpu_total = device_ns.saturating_sub(last_device_ns).max(1);
            for t in &usage {
                let (rate, share) = match last.get(&t.name) {
                    Some((prev, at)) => {
                        let secs = now.duration_since(*at).as_secs_f64().max(1e-9);
                        let r = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
                        (
                            (
                                r(t.calls, prev.calls),
                                r(used(t, "kernel_launches"), used(prev, "kernel_launches")),
                                r(t.delayed, prev.delayed),
                            ),
                            100.0 * measured(t).saturating_sub(measured(prev)) as f64 / gpu_total as f64,
                        )
                    }
                    None => ((0.0, 0.0, 0.0), 0.0),
                };
                out.push_str(&format!(
                    "{:<14} {:>5} {:>9} {:>9} {:>11.0} {:>10.0} {:>7.1}% {:>12} {:>9.0} {:>9}\n",
                    t.name,
                    t.share,
                    t.sessions,
                    t.bypassed_sessions,
                    rate.0,
                    rate.1,
                    share,
                    bytes(used(t, "device_memory")),
                    rate.2,
                    t.rejected
                ));
            }
            let first = last.is_empty();
            last = usage.into_iter().map(|t| (t.name.clone(), (t, now))).collect();
            // The first sample has no rates: take a second one before printing once.
            if !(once && first) {
                print!("{out}");
            }
            if once && !first {
                return Ok(());
            }
            tokio::time::sleep(interval).await;
        }
    }))
}

fn used(t: &TenantUsage, resource: &str) -> u64 {
    t.resources.iter().find(|r| r.0 == resource).map(|r| r.2).unwrap_or(0)
}

/// The tenant's measured resources together (device time).
fn measured(t: &TenantUsage) -> u64 {
    t.resources.iter().filter(|r| r.1 == "measured").map(|r| r.2).sum()
}

pub(crate) fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
