//! `phosctl run --summary`: what a program did through Phos, from the private router's books
//! once the program has exited: the backend and why, the program's result, and its calls,
//! kernel launches, bytes copied and device time as the router counted them.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use phos_api_server::BackendKind;
use phos_control::TenantUsage;
use phos_router::Router;

use crate::policy::bytes;

/// Wait (up to `limit`) until the router has ended every session: a session ends once all its
/// channels are closed, so every call the program sent has been read and counted by then.
pub fn wait_for_sessions_to_end(router: &Router, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !router.sessions().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The summary's lines. `books` are the private router's tenants (one, the user's, unless the
/// program's processes ran as several users).
pub fn render(
    program: &str,
    status: &ExitStatus,
    elapsed: Duration,
    backend: BackendKind,
    why: &str,
    books: &[TenantUsage],
) -> String {
    use std::os::unix::process::ExitStatusExt;
    let result = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("ended ({status})"),
    };
    let backend = match backend {
        BackendKind::Cuda => format!("cuda, the GPU through the CUDA driver ({why})"),
        BackendKind::Emu => format!("emu, the CPU backend: Phos's PTX interpreter runs the kernels ({why})"),
    };
    let sum = |name: &str| books.iter().map(|t| used(t, name)).sum::<u64>();
    let calls: u64 = books.iter().map(|t| t.calls).sum();
    let delayed: u64 = books.iter().map(|t| t.delayed).sum();
    let rejected: u64 = books.iter().map(|t| t.rejected).sum();
    let mut out = String::new();
    out.push_str(&format!("phos: {program} {result} after {:.1} s\n", elapsed.as_secs_f64()));
    out.push_str(&format!("phos: backend {backend}\n"));
    out.push_str("phos: through Phos, as the router counted them:\n");
    out.push_str(&format!(
        "phos:   {}, {}, {} of device time charged\n",
        count(calls, "CUDA call", "CUDA calls"),
        count(sum("kernel_launches"), "kernel launch", "kernel launches"),
        duration(sum("device_time"))
    ));
    out.push_str(&format!(
        "phos:   {} copied to the device, {} from it, {} within it\n",
        bytes(sum("bytes_to_device")),
        bytes(sum("bytes_from_device")),
        bytes(sum("bytes_on_device"))
    ));
    out.push_str(&format!(
        "phos:   {} delayed and {rejected} refused by quotas or policies\n",
        count(delayed, "call", "calls")
    ));
    out
}

fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn used(t: &TenantUsage, resource: &str) -> u64 {
    t.resources.iter().find(|r| r.0 == resource).map(|r| r.2).unwrap_or(0)
}

fn duration(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.2} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n => format!("{:.1} µs", n as f64 / 1e3),
    }
}
