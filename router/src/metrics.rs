//! Prometheus metrics: per-tenant usage and per-policy counters, in the text exposition
//! format, at `GET /metrics` on the address the configuration names. A few lines of HTTP
//! over a standard listener are all a scraper needs; a web framework would be most of the
//! router's dependency tree for one read-only page.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use phos_policy::engine::PolicyInfo;

use crate::Router;
use phos_control::TenantUsage;

/// Start serving; returns the bound address (the port may have been 0).
pub fn serve(router: Arc<Router>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("phos-metrics".into()).spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(conn) => {
                    let _ = answer(&router, conn);
                }
                // Out of descriptors, most likely: wait for some rather than spin.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    })?;
    Ok(bound)
}

fn answer(router: &Router, mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = String::new();
    let mut reader = BufReader::new(conn.try_clone()?);
    reader.read_line(&mut request)?;
    // Skip the headers.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let path = request.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if request.starts_with("GET ") && (path == "/metrics" || path == "/") {
        ("200 OK", render(router))
    } else {
        ("404 Not Found", "not found\n".to_string())
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Label values escape `\`, `"` and newlines.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One metric family: its header and one line per label set.
fn family(out: &mut String, name: &str, kind: &str, help: &str, rows: impl IntoIterator<Item = (String, String)>) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    for (labels, value) in rows {
        out.push_str(&format!("{name}{{{labels}}} {value}\n"));
    }
}

/// The metrics page.
pub fn render(router: &Router) -> String {
    let mut out = String::new();
    let usage = router.tenants.usage();
    let tenant = |t: &TenantUsage| format!("tenant=\"{}\"", label(&t.name));
    let per_tenant = |f: fn(&TenantUsage) -> String| usage.iter().map(|t| (tenant(t), f(t))).collect::<Vec<_>>();
    family(
        &mut out,
        "phos_tenant_sessions",
        "gauge",
        "Sessions of the tenant alive now.",
        per_tenant(|t| t.sessions.to_string()),
    );
    family(
        &mut out,
        "phos_tenant_sessions_bypassed",
        "gauge",
        "Sessions of the tenant alive now whose guest reported a bypass: NVIDIA's CUDA runtime or driver mapped beside Phos's, or NVIDIA's runtime built into the program (phosctl sessions names it).",
        per_tenant(|t| t.bypassed_sessions.to_string()),
    );
    family(
        &mut out,
        "phos_tenant_calls_total",
        "counter",
        "Calls the tenant made.",
        per_tenant(|t| t.calls.to_string()),
    );
    family(
        &mut out,
        "phos_tenant_delayed_calls_total",
        "counter",
        "Calls a policy delayed at least once.",
        per_tenant(|t| t.delayed.to_string()),
    );
    family(
        &mut out,
        "phos_tenant_delay_seconds_total",
        "counter",
        "Time the tenant's calls spent delayed by policies.",
        per_tenant(|t| format!("{}", t.delay_ns as f64 / 1e9)),
    );
    family(
        &mut out,
        "phos_tenant_rejected_calls_total",
        "counter",
        "Calls refused by a quota or a policy.",
        per_tenant(|t| t.rejected.to_string()),
    );
    family(
        &mut out,
        "phos_tenant_resource",
        "gauge",
        "Per spec resource: held now (kind=held), used in total (kind=used), or measured (kind=measured: device time in ns, with an estimate for work not yet measured).",
        usage.iter().flat_map(|t| {
            t.resources.iter().map(move |(r, kind, used, _)| {
                (format!("{},resource=\"{}\",kind=\"{kind}\"", tenant(t), label(r)), used.to_string())
            })
        }),
    );
    family(
        &mut out,
        "phos_tenant_quota",
        "gauge",
        "Quotas configured for the tenant, per resource.",
        usage.iter().flat_map(|t| {
            t.resources
                .iter()
                .filter(|(_, _, _, q)| *q > 0)
                .map(move |(r, _, _, q)| (format!("{},resource=\"{}\"", tenant(t), label(r)), q.to_string()))
        }),
    );
    family(
        &mut out,
        "phos_tenant_channels",
        "gauge",
        "Channels (calling threads) of the tenant's sessions open now.",
        per_tenant(|t| t.channels.to_string()),
    );
    family(
        &mut out,
        "phos_tenant_buffered_bytes",
        "gauge",
        "Bytes of the tenant's frames the router holds now (beyond 1 MiB per channel).",
        per_tenant(|t| t.buffered_bytes.to_string()),
    );
    family(
        &mut out,
        "phos_tenant_limit_refusals_total",
        "counter",
        "Refusals for a limit ([limits]): connections the router refused for a per-tenant limit (sessions, channels_per_session, channels_per_tenant, pending_handshakes, handshake_timeout, buffered_bytes) or for want of its own resources (router_resources), and calls the tenant's API servers refused because a session held its limit of objects of a kind (streams, events, allocations, ...).",
        usage.iter().flat_map(|t| {
            t.limit_refusals.iter().map(move |(l, n)| (format!("{},limit=\"{}\"", tenant(t), label(l)), n.to_string()))
        }),
    );
    family(
        &mut out,
        "phos_router_pending_handshakes",
        "gauge",
        "Connections in their handshake now.",
        [(String::new(), router.pending_handshakes().to_string())],
    );
    restore_loads(&mut out, router);
    let policies = router.policies.list();
    let per_policy = |f: fn(&PolicyInfo) -> u64| {
        policies.iter().map(|p| (format!("policy=\"{}\"", label(&p.name)), f(p).to_string())).collect::<Vec<_>>()
    };
    {
        let figures = router.checkpoints.lock();
        let mode = |m: &str| format!("mode=\"{}\"", label(m));
        let per_mode = |f: &dyn Fn(&(u64, phos_control::CheckpointSummary)) -> String| {
            figures.by_mode.iter().map(|(m, v)| (mode(m), f(v))).collect::<Vec<_>>()
        };
        family(&mut out, "phos_checkpoints_total", "counter", "Checkpoints taken.", per_mode(&|v| v.0.to_string()));
        let secs = |ms: f64| format!("{:.6}", ms / 1e3);
        family(
            &mut out,
            "phos_checkpoint_last_stall_seconds",
            "gauge",
            "How long the last checkpoint held every call of its session.",
            per_mode(&|v| secs(v.1.stall_ms)),
        );
        family(
            &mut out,
            "phos_checkpoint_last_copy_seconds",
            "gauge",
            "How long the last checkpoint took to copy its session's memory.",
            per_mode(&|v| secs(v.1.copy_ms)),
        );
        family(
            &mut out,
            "phos_checkpoint_last_held_seconds",
            "gauge",
            "The longest one call waited, in the last checkpoint, for memory it writes to be copied.",
            per_mode(&|v| secs(v.1.held_ms)),
        );
        family(
            &mut out,
            "phos_checkpoint_last_copied_aside_bytes",
            "gauge",
            "Device memory the last checkpoint copied aside ahead of writes (copy-on-write).",
            per_mode(&|v| if v.1.mode == "copy-on-write" { v.1.extra_bytes } else { 0 }.to_string()),
        );
        family(
            &mut out,
            "phos_checkpoint_last_waited_seconds",
            "gauge",
            "The time calls waited in all, in the last checkpoint, before they could write (copy-on-write).",
            per_mode(&|v| secs(v.1.waited_ms)),
        );
        family(
            &mut out,
            "phos_checkpoint_last_waited_calls",
            "gauge",
            "Calls that waited, in the last checkpoint, before they could write (copy-on-write).",
            per_mode(&|v| v.1.waited_calls.to_string()),
        );
        family(
            &mut out,
            "phos_checkpoint_last_bytes",
            "gauge",
            "Device memory the last checkpoint covered.",
            per_mode(&|v| v.1.memory_bytes.to_string()),
        );
        out.push_str(&format!(
            "# HELP phos_checkpoint_fallbacks_total Concurrent checkpoints taken again stop-the-world.\n# TYPE phos_checkpoint_fallbacks_total counter\nphos_checkpoint_fallbacks_total {}\n",
            figures.fallbacks
        ));
    }
    migrations(&mut out, router);
    family(&mut out, "phos_policy_runs_total", "counter", "Times the policy ran.", per_policy(|p| p.runs));
    family(&mut out, "phos_policy_delayed_total", "counter", "Delay verdicts.", per_policy(|p| p.delayed));
    family(&mut out, "phos_policy_rejected_total", "counter", "Reject verdicts.", per_policy(|p| p.rejected));
    family(&mut out, "phos_policy_run_mean_ns", "gauge", "Mean time of one run.", per_policy(|p| p.mean_run_ns));
    out
}

/// Migrations through the router: how many went (out, failed, in), and the last one's figures.
fn migrations(out: &mut String, router: &Router) {
    let figures = router.migration_figures();
    let one = |v: String| [(String::new(), v)];
    family(
        out,
        "phos_migrations_total",
        "counter",
        "Sessions moved away from this router (or between its devices).",
        one(figures.done.to_string()),
    );
    family(
        out,
        "phos_migrations_failed_total",
        "counter",
        "Migrations given up (their sessions ran on where they were).",
        one(figures.failed.to_string()),
    );
    family(
        out,
        "phos_migrations_arrived_total",
        "counter",
        "Sessions that moved here from another router.",
        one(figures.arrived.to_string()),
    );
    if let Some(last) = &figures.last {
        let secs = |ms: f64| format!("{:.6}", ms / 1e3);
        family(
            out,
            "phos_migration_last_downtime_seconds",
            "gauge",
            "How long the last migration held its session's calls (the last round and the target's restore).",
            one(secs(last.downtime_ms)),
        );
        family(
            out,
            "phos_migration_last_total_seconds",
            "gauge",
            "How long the last migration took in all.",
            one(secs(last.total_ms)),
        );
        family(
            out,
            "phos_migration_last_rounds",
            "gauge",
            "Recopy rounds of the last migration (between its first copy and its held one).",
            one(last.passes.len().saturating_sub(2).to_string()),
        );
        family(
            out,
            "phos_migration_last_bytes",
            "gauge",
            "Device memory the last migration moved.",
            one(last.memory_bytes.to_string()),
        );
        family(
            out,
            "phos_migration_last_sent_bytes",
            "gauge",
            "Bytes the last migration sent (every pass).",
            one(last.sent_bytes.to_string()),
        );
        // By pass: 0 is the first copy, the last the held one; rounds in between.
        let passes = |f: fn(&phos_control::RoundFigures) -> u64| {
            last.passes.iter().enumerate().map(move |(i, p)| (format!("pass=\"{i}\""), f(p).to_string()))
        };
        family(
            out,
            "phos_migration_last_pass_copied_bytes",
            "gauge",
            "Bytes each pass of the last migration copied (pass 0 everything, then the parts written since).",
            passes(|p| p.copied_bytes),
        );
        family(
            out,
            "phos_migration_last_pass_dirty_bytes",
            "gauge",
            "Bytes written before each pass of the last migration (what the dirty log named).",
            passes(|p| p.dirty_bytes),
        );
        family(
            out,
            "phos_migration_last_pass_skipped_pieces",
            "gauge",
            "Blocks (16 KiB) written before each pass of the last migration that were not sent again: the device still held what had been sent (pieces skipped by hash).",
            passes(|p| p.skipped_pieces),
        );
        family(
            out,
            "phos_migration_last_dirty_bytes_per_second",
            "gauge",
            "How fast the last migrated session wrote memory during its rounds.",
            one(format!("{:.0}", last.dirty_rate)),
        );
    }
    family(
        out,
        "phos_vm_migrations_total",
        "counter",
        "VMs moved away with their sessions (phosctl vm-migrate).",
        one(figures.vm_done.to_string()),
    );
    family(
        out,
        "phos_vm_migrations_failed_total",
        "counter",
        "VM moves undone (the VM and its sessions stayed here).",
        one(figures.vm_failed.to_string()),
    );
    if let Some(last) = &figures.vm_last {
        let secs = |ms: f64| format!("{:.6}", ms / 1e3);
        let gauges = [
            ("phos_vm_migration_last_downtime_seconds", "QEMU's downtime of the last VM move.", last.vm_downtime_ms),
            (
                "phos_vm_migration_last_device_away_seconds",
                "How long the last moved VM had no vsock device.",
                last.device_away_ms,
            ),
            ("phos_vm_migration_last_total_seconds", "How long the last VM move took in all.", last.total_ms),
        ];
        for (name, help, ms) in gauges {
            family(out, name, "gauge", help, one(secs(ms)));
        }
        if let Some(held) = last.calls_held_ms {
            family(
                out,
                "phos_vm_migration_last_calls_held_seconds",
                "gauge",
                "How long the last moved VM's CUDA calls waited (hand-over to its guest back at the destination).",
                one(secs(held)),
            );
        }
    }
}

/// The figures of each session's last on-demand restore (times from the restore's start in
/// its server).
fn restore_loads(out: &mut String, router: &Router) {
    let loads: Vec<(String, phos_control::LoadReport)> = router
        .sessions()
        .iter()
        .filter_map(|s| {
            let load = s.restore_load.lock().clone()?;
            Some((format!("session=\"{}\",tenant=\"{}\"", s.id, label(&s.tenant.0)), load))
        })
        .collect();
    let seconds = |ms: f64| format!("{}", ms / 1e3);
    let rows = |f: &dyn Fn(&phos_control::LoadReport) -> Option<String>| {
        loads.iter().filter_map(|(l, r)| Some((l.clone(), f(r)?))).collect::<Vec<_>>()
    };
    family(
        out,
        "phos_restore_serving_seconds",
        "gauge",
        "On-demand restore: time until the session was served (its objects recreated).",
        rows(&|r| Some(seconds(r.serving_ms))),
    );
    family(
        out,
        "phos_restore_first_call_seconds",
        "gauge",
        "On-demand restore: time until the session's first call was served (answered, or queued for an async call, after any wait for its memory; absent: no call came during the load).",
        rows(&|r| r.first_call_ms.map(seconds)),
    );
    family(
        out,
        "phos_restore_loaded_seconds",
        "gauge",
        "On-demand restore: time until all of the session's memory was loaded (absent: loading, or failed).",
        rows(&|r| r.loaded_ms.map(seconds)),
    );
    family(
        out,
        "phos_restore_loaded_bytes",
        "gauge",
        "On-demand restore: bytes of device memory loaded so far.",
        rows(&|r| Some(r.done.to_string())),
    );
    family(
        out,
        "phos_restore_memory_bytes",
        "gauge",
        "On-demand restore: bytes of device memory to load in all.",
        rows(&|r| Some(r.total.to_string())),
    );
    family(
        out,
        "phos_restore_held_calls",
        "gauge",
        "On-demand restore: calls held until memory they touch was loaded.",
        rows(&|r| Some(r.held_calls.to_string())),
    );
    family(
        out,
        "phos_restore_failed",
        "gauge",
        "On-demand restore: 1 if the load failed (the session's calls then fail; its server's log says why).",
        rows(&|r| Some(u8::from(r.failed.is_some()).to_string())),
    );
}
