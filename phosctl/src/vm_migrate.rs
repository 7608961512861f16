//! `phosctl vm-migrate`: a VM moves to another QEMU and its tenant's GPU sessions move to
//! that QEMU's router, together (docs/operations.md, "Migrating a VM with its GPU work").
//!
//! QEMU 7.2 refuses to migrate a VM with a `vhost-user-vsock` device ("non-migratable
//! device", and phos-vmm-device lacks the dirty-log protocol feature), so the device is
//! unplugged for the VM's move and plugged into the destination after it. Meanwhile the
//! guest's channels go through the VM's user network (virtio-net, which migrates): its
//! `guestfwd` starts a `phosctl vm-relay` per connection to the router next to the QEMU, and
//! the guest library, given both endpoints, reconnects there and resumes its sessions by
//! token. The order: unplug (the guest moves onto the relay, its calls go on); QEMU's
//! pre-copy, its stop held back (`pause-before-switchover`, `downtime-limit` 0); once its
//! first pass is done, the sessions move beside its next passes (their pre-copy, a short hold,
//! the hand-over: the guest's calls wait from here); then QEMU may stop the VM, which it does
//! at its next pass, and the destination runs it; the guest's next retry reaches the
//! destination's router through the destination's relay; the device is plugged there.
//! Anything that fails before the VM's switch-over is undone: its migration is cancelled (the
//! source VM runs on), sessions that had moved are moved back, and the device is plugged into
//! the source again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use phos_control::{MigrateRequest, MigrationSummary, MigrationTarget, VmMigrationReport};
use serde_json::{Value, json};

use crate::error::CliError;
use crate::manage::{RouterArg, print_migration, run};
use crate::qmp::{Qmp, QmpError};

/// What `vm-migrate` is told.
pub struct VmMigration {
    /// The source router (where the VM's sessions are now).
    pub router: RouterArg,
    pub source_qmp: PathBuf,
    pub dest_qmp: PathBuf,
    /// Where the destination QEMU receives the VM (`migrate-incoming`'s URI).
    pub incoming: String,
    /// The VM's tenant at the source router: all its active sessions move.
    pub tenant: String,
    /// The destination router, as `phosctl migrate --to` names it.
    pub to: String,
    /// The destination router's own socket (its management service), for moving sessions
    /// back if the VM's move fails after they went, and for seeing the guest reconnect.
    pub dest_router: Option<String>,
    /// How the destination router reaches the source router (for moving sessions back).
    pub back_to: Option<String>,
    /// The vsock device's id (`-device vhost-user-vsock-pci,id=...`).
    pub device: String,
    /// phos-vmm-device's vhost-user sockets, at the source and the destination.
    pub source_vhost_user: PathBuf,
    pub dest_vhost_user: PathBuf,
    pub max_bandwidth_mib: u64,
    pub downtime_limit_ms: u64,
    pub timeout: Duration,
    pub quiesce_timeout: Duration,
}

/// Why a VM migration stopped, and where things are now.
#[derive(Debug, thiserror::Error)]
pub enum VmMigrationError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("{0}")]
    Refused(String),
    /// It failed partway; where the VM and its sessions are now (after undoing what had
    /// been done) is in `now`.
    #[error("the VM migration failed: {failed}; {now}")]
    Failed { failed: String, now: String },
}

/// The vsock device as the source QEMU has it, to be plugged again the same way.
struct Device {
    id: String,
    chardev: String,
    bus: String,
}

impl Device {
    fn plug(&self, qemu: &mut Qmp, vhost_user: &std::path::Path) -> Result<(), QmpError> {
        qemu.add_socket_chardev(&self.chardev, vhost_user)?;
        let added = qemu.execute::<Value>(
            "device_add",
            json!({ "driver": "vhost-user-vsock-pci", "id": self.id, "chardev": self.chardev, "bus": self.bus }),
        );
        if added.is_err() {
            let _ = qemu.remove_chardev(&self.chardev);
        }
        added.map(|_| ())
    }
}

pub fn vm_migrate(m: VmMigration) -> Result<(), CliError> {
    let started = Instant::now();
    let deadline = started + m.timeout;
    let mut src = Qmp::connect(&m.source_qmp, "the source QEMU").map_err(VmMigrationError::from)?;
    let mut dst = Qmp::connect(&m.dest_qmp, "the destination QEMU").map_err(VmMigrationError::from)?;
    let (device, sessions) = prepare(&m, &mut src, &mut dst)?;
    println!(
        "moving the VM ({} session(s) of tenant {}: {:?}) to {} and its sessions to {}",
        sessions.len(),
        m.tenant,
        sessions,
        m.incoming,
        m.to
    );

    // The device first, so that QEMU takes the migration: the guest's channels break and
    // reconnect through the VM's network relay (PHOS_ENDPOINT's next endpoint) to the same
    // router and session; its calls go on meanwhile.
    if let Err(e) = src.unplug(&device.id, Duration::from_secs(60)) {
        let now = undo(&m, &mut src, &device, &[], false);
        report_to_router(&m.router, None);
        return Err(VmMigrationError::Failed { failed: format!("unplugging the vsock device: {e}"), now }.into());
    }
    if let Err(e) = src.remove_chardev(&device.chardev) {
        eprintln!("phosctl: {e} (the source's phos-vmm-device may not see its VM go)");
    }
    let unplugged = Instant::now();
    println!(
        "vsock device unplugged in {:.1} ms (the guest goes on through its network relay); copying the VM and its sessions",
        ms(unplugged - started)
    );

    let together = copy_together(&m, &mut src, &mut dst, &sessions, deadline);
    let (moved, copied) = together;
    let copied = match copied {
        Ok(c) => c,
        Err(failed) => {
            let now = undo(&m, &mut src, &device, &moved, true);
            report_to_router(&m.router, None);
            return Err(VmMigrationError::Failed { failed, now }.into());
        }
    };

    // The VM runs on the destination: its device is plugged there; the guest's channels
    // reconnect through the destination's relay, or through the device once it is there.
    let plugged = device.plug(&mut dst, &m.dest_vhost_user).map_err(|e| VmMigrationError::Failed {
        failed: format!("plugging the vsock device into the destination: {e}"),
        now: format!(
            "the VM and its sessions are at the destination, the VM without its vsock device (its calls go \
             through its network relay): plug it (chardev-add {} to {}, device_add vhost-user-vsock-pci,id={},chardev={},bus={})",
            device.chardev,
            m.dest_vhost_user.display(),
            device.id,
            device.chardev,
            device.bus
        ),
    });
    let device_away = unplugged.elapsed();
    plugged?;
    if let Err(e) = src.execute::<Value>("quit", json!({})) {
        eprintln!("phosctl: ending the source QEMU: {e}");
    }
    println!(
        "moved in {:.1} ms: VM paused {:.1} ms (QEMU's downtime); vsock device away {:.1} ms (unplug to plug)",
        ms(started.elapsed()),
        copied.vm_downtime_ms,
        ms(device_away)
    );
    let calls_held = m.dest_router.as_ref().and_then(|r| guest_back(r, &moved, copied.handed_over, deadline));
    if let Some(held) = calls_held {
        println!(
            "the guest's CUDA calls waited {:.1} ms (from the sessions' hand-over to its first channel at the destination)",
            ms(held)
        );
    }
    let report = VmMigrationReport {
        vm_downtime_ms: copied.vm_downtime_ms,
        device_away_ms: ms(device_away),
        calls_held_ms: calls_held.map(ms),
        total_ms: ms(started.elapsed()),
        sessions: moved.len() as u32,
    };
    report_to_router(&m.router, Some(report));
    Ok(())
}

/// The QEMU `downtime-limit` while the sessions have not moved: QEMU stops the VM only if
/// what is left would go in a millisecond (and then waits, `pause-before-switchover`). Not 0:
/// QEMU 7.2 syncs its dirty bitmap again only when what is left is below the threshold
/// (its bandwidth times the limit), so with 0 it would never look again after its first
/// pass, find nothing left, and stop the VM with all that was written meanwhile to copy.
const HOLDING_DOWNTIME_MS: u64 = 1;

/// What is left of QEMU's first pass when the command holds it back for the sessions' move
/// (or the first pass's end, if it jumps past): late enough that little of the VM is left to
/// copy after the sessions moved, early enough that QEMU is not done before it is held.
const HOLD_AT: u64 = 16 << 20;

/// QEMU's bandwidth while the sessions move (bytes/s): a trickle, so that it neither ends
/// its pass nor finds it has converged (its threshold is what it sent lately times the
/// downtime limit) before the sessions are handed over.
const HOLDING_BANDWIDTH: u64 = 1 << 20;

/// After the sessions' hand-over, before the VM may stop: the answers the source's servers
/// sent before it reach the guest's memory (what is still in the source QEMU's network
/// stack when the VM stops does not move with it; the guest would send those calls again).
const SETTLE: Duration = Duration::from_millis(50);

/// What the VM's and the sessions' joint move did.
struct Copied {
    vm_downtime_ms: f64,
    /// When the last session was handed over (the guest's calls wait from here).
    handed_over: Instant,
}

/// The VM's pre-copy and the sessions' migrations side by side, then one stop: QEMU copies
/// the VM's memory while it runs (holding its stop back); near the end of its first pass it
/// is held to a trickle and the sessions move (their pre-copy rounds while the VM and its
/// program run, then each one's short hold and hand-over); then QEMU may stop the
/// VM, which it does at its next pass (`pause-before-switchover`: it waits, stopped, for
/// `migrate-continue`), copies the rest and hands the VM to the destination. The sessions
/// that moved, and how it went (a failure says what failed).
fn copy_together(
    m: &VmMigration,
    src: &mut Qmp,
    dst: &mut Qmp,
    sessions: &[u64],
    deadline: Instant,
) -> (Vec<MigrationSummary>, Result<Copied, String>) {
    if let Err(e) = src.execute::<Value>("migrate", json!({ "uri": m.incoming })) {
        return (Vec::new(), Err(format!("the VM's memory: {e}")));
    }
    std::thread::scope(|scope| {
        let mut moving: Option<Moves<'_>> = None;
        let mut moved: Option<(Vec<MigrationSummary>, Instant)> = None;
        let mut released = false;
        let mut last_print = Instant::now();
        let outcome = loop {
            let info = match src.migration() {
                Ok(i) => i,
                Err(e) => break Err(format!("the VM's memory: {e}")),
            };
            match info.status.as_deref() {
                Some("failed") | Some("cancelled") => {
                    break Err(format!(
                        "the VM's memory: {}",
                        info.error_desc.unwrap_or_else(|| "QEMU gave no reason".into())
                    ));
                }
                // The VM is stopped, its state not sent yet.
                Some("pre-switchover") => break Ok(()),
                _ => {}
            }
            if let Some(ram) = &info.ram {
                if last_print.elapsed() >= Duration::from_millis(500) {
                    println!(
                        "  VM memory: {} MiB left of {} MiB, {} MiB sent, dirtied {:.1} MiB/s, {:.0} Mbit/s",
                        ram.remaining >> 20,
                        ram.total >> 20,
                        ram.transferred >> 20,
                        (ram.dirty_pages_rate * ram.page_size.unwrap_or(4096)) as f64 / (1 << 20) as f64,
                        ram.mbps
                    );
                    last_print = Instant::now();
                }
                // QEMU's first pass nearly done (or done): it is held to a trickle, and the
                // sessions go now, beside it.
                let ready = ram.dirty_sync_count >= 2 || ram.remaining <= HOLD_AT;
                if moving.is_none() && moved.is_none() && ready {
                    if let Err(e) =
                        src.execute::<Value>("migrate-set-parameters", json!({ "max-bandwidth": HOLDING_BANDWIDTH }))
                    {
                        break Err(format!("the VM's memory: {e}"));
                    }
                    println!(
                        "VM memory: {} MiB left of its first pass, held while the sessions move",
                        ram.remaining >> 20
                    );
                    moving = Some(spawn_moves(scope, m, sessions, deadline));
                }
            }
            if moving.as_ref().is_some_and(|h| h.is_finished()) {
                let (done, failed) = join_moves(moving.take().expect("finished"));
                let at = Instant::now();
                moved = Some((done, at));
                if let Some(f) = failed {
                    break Err(f);
                }
            }
            if !released && let Some((_, at)) = &moved {
                std::thread::sleep(SETTLE.saturating_sub(at.elapsed()));
                // QEMU may copy the rest and stop the VM now.
                let full = json!({ "max-bandwidth": m.max_bandwidth_mib << 20, "downtime-limit": m.downtime_limit_ms });
                if let Err(e) = src.execute::<Value>("migrate-set-parameters", full) {
                    break Err(format!("the VM's memory: {e}"));
                }
                released = true;
            }
            if Instant::now() >= deadline {
                break Err("the VM's memory: its migration did not end in time".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The sessions' thread ends before anything else is decided.
        if let Some(h) = moving.take() {
            let (done, failed) = join_moves(h);
            let failed = failed.or(outcome.as_ref().err().cloned());
            moved = Some((done, Instant::now()));
            if let Some(f) = failed {
                return (moved.map(|(d, _)| d).unwrap_or_default(), Err(f));
            }
        }
        if let Err(f) = outcome {
            return (moved.map(|(d, _)| d).unwrap_or_default(), Err(f));
        }
        // Stopped, paused before its switch-over: the sessions, if they had not gone yet
        // (nothing was left of the VM to copy before they did), go now.
        let (moved, handed_over) = match moved {
            Some(m) => m,
            None => {
                println!("the VM stopped before its sessions moved; moving them now");
                let (done, failed) = join_moves(spawn_moves(scope, m, sessions, deadline));
                if let Some(f) = failed {
                    return (done, Err(f));
                }
                (done, Instant::now())
            }
        };
        let finished = src
            .execute::<Value>("migrate-continue", json!({ "state": "pre-switchover" }))
            .map_err(|e| format!("the VM's memory: {e}"))
            .and_then(|_| finish_vm(src, dst, deadline));
        (moved, finished.map(|vm_downtime_ms| Copied { vm_downtime_ms, handed_over }))
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Check both QEMUs and the router before anything changes; the device to move and the
/// sessions.
fn prepare(m: &VmMigration, src: &mut Qmp, dst: &mut Qmp) -> Result<(Device, Vec<u64>), CliError> {
    let refused = |why: String| CliError::from(VmMigrationError::Refused(why));
    let status = src.status().map_err(VmMigrationError::from)?;
    if !status.running {
        return Err(refused(format!("the source VM is not running (QEMU says {})", status.status)));
    }
    let status = dst.status().map_err(VmMigrationError::from)?;
    if status.status != "inmigrate" {
        return Err(refused(format!(
            "the destination QEMU is not waiting for a migration (it is {}; start it with -incoming defer)",
            status.status
        )));
    }
    let text = |v: Value, what: &str| match v {
        Value::String(s) => Ok(s),
        other => Err(refused(format!("the source's device {}: {what} is {other}", m.device))),
    };
    let chardev = text(src.device_property(&m.device, "chardev").map_err(VmMigrationError::from)?, "chardev")?;
    let bus_path = text(src.device_property(&m.device, "parent_bus").map_err(VmMigrationError::from)?, "parent_bus")?;
    // "/machine/peripheral/rp1/rp1": the bus of root port `rp1`.
    let bus = bus_path.rsplit('/').next().unwrap_or_default().to_string();
    if bus.is_empty() || bus_path.starts_with("/machine/q35") {
        return Err(refused(format!(
            "the source's device {} sits on {bus_path}, which cannot unplug it: put it behind a \
             pcie-root-port (-device pcie-root-port,id=rp1,chassis=1 -device vhost-user-vsock-pci,bus=rp1,...)",
            m.device
        )));
    }
    let sessions = run(&m.router, async |c| Ok(c.sessions(tarpc::context::current()).await?))?
        .into_iter()
        .filter(|s| s.tenant == m.tenant && s.state == "active")
        .map(|s| s.id)
        .collect();
    // The destination takes the VM at `incoming`.
    dst.execute::<Value>("migrate-incoming", json!({ "uri": m.incoming })).map_err(VmMigrationError::from)?;
    // QEMU stops the VM only once the sessions have moved (the downtime limit is raised
    // then), and waits, stopped, before its switch-over: the command says when it goes on.
    src.execute::<Value>(
        "migrate-set-capabilities",
        json!({ "capabilities": [{ "capability": "pause-before-switchover", "state": true }] }),
    )
    .map_err(VmMigrationError::from)?;
    src.execute::<Value>(
        "migrate-set-parameters",
        json!({ "max-bandwidth": m.max_bandwidth_mib << 20, "downtime-limit": HOLDING_DOWNTIME_MS }),
    )
    .map_err(VmMigrationError::from)?;
    Ok((Device { id: m.device.clone(), chardev, bus }, sessions))
}

/// The sessions' migrations on their thread: what moved, and why the rest did not.
type Moves<'scope> = std::thread::ScopedJoinHandle<'scope, (Vec<MigrationSummary>, Option<String>)>;

fn spawn_moves<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    m: &'env VmMigration,
    sessions: &'env [u64],
    deadline: Instant,
) -> Moves<'scope> {
    scope.spawn(move || move_sessions(&m.router, sessions, &m.to, m.quiesce_timeout, deadline))
}

/// Wait for the sessions' thread; what moved, and why the rest did not.
fn join_moves(h: Moves<'_>) -> (Vec<MigrationSummary>, Option<String>) {
    let (done, failed) = h.join().unwrap_or_else(|_| (Vec::new(), Some("the migration thread panicked".into())));
    (done, failed.map(|f| format!("the GPU sessions: {f}")))
}

/// After `migrate-continue`: wait until QEMU has sent the VM and the destination runs it;
/// QEMU's downtime in ms.
fn finish_vm(src: &mut Qmp, dst: &mut Qmp, deadline: Instant) -> Result<f64, String> {
    let downtime = loop {
        let info = src.migration().map_err(|e| format!("the VM's memory: {e}"))?;
        match info.status.as_deref() {
            Some("completed") => break info.downtime.unwrap_or_default() as f64,
            Some("failed") | Some("cancelled") => {
                return Err(format!(
                    "the VM's memory: {}",
                    info.error_desc.unwrap_or_else(|| "QEMU gave no reason".into())
                ));
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err("the VM's memory: its migration did not end in time".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let running_by = Instant::now() + Duration::from_secs(60);
    loop {
        // The destination has the VM now: an error here is not a reason to go back.
        match dst.status() {
            Ok(s) if s.running => break,
            Ok(_) if Instant::now() < running_by => std::thread::sleep(Duration::from_millis(10)),
            Ok(s) => {
                eprintln!("phosctl: the destination VM is {} after the migration (run `cont` there)", s.status);
                break;
            }
            Err(e) => {
                eprintln!("phosctl: the destination QEMU after the migration: {e}");
                break;
            }
        }
    }
    Ok(downtime)
}

/// Move the sessions one after another; those that moved, and why the rest did not.
fn move_sessions(
    router: &RouterArg,
    sessions: &[u64],
    to: &str,
    quiesce_timeout: Duration,
    deadline: Instant,
) -> (Vec<MigrationSummary>, Option<String>) {
    let mut moved = Vec::new();
    for &id in sessions {
        let timeout = deadline.saturating_duration_since(Instant::now());
        let request = MigrateRequest {
            to: MigrationTarget::Router(to.to_string()),
            quiesce_timeout,
            timeout,
            connections: phos_checkpoint::migrate::DEFAULT_LANES,
        };
        let done = run(router, async |c| {
            Ok(c.migrate(phos_control::context_within(timeout + Duration::from_secs(30)), id, request).await??)
        });
        match done {
            Ok(s) => {
                print_migration(id, &s);
                moved.push(s);
            }
            Err(e) => return (moved, Some(format!("session {id}: {e}"))),
        }
    }
    (moved, None)
}

/// Put everything back on the source after a failure before the switch-over; says where
/// things are.
/// `unplugged`: the device was unplugged (and the VM's migration may have begun).
fn undo(m: &VmMigration, src: &mut Qmp, device: &Device, moved: &[MigrationSummary], unplugged: bool) -> String {
    let mut left = Vec::new();
    if unplugged && let Err(e) = cancel_vm_migration(src) {
        left.push(format!("the source VM: {e}"));
    }
    if !moved.is_empty() {
        match (&m.dest_router, m.back_to.clone().or_else(|| m.router.endpoint())) {
            (Some(dest), Some(back)) => {
                let dest = RouterArg::at(dest.clone());
                let ids: Vec<u64> = moved.iter().map(|s| s.session).collect();
                let (_, failed) = move_sessions(&dest, &ids, &back, m.quiesce_timeout, Instant::now() + m.timeout);
                if let Some(why) = failed {
                    left.push(format!("moving the sessions back: {why}"));
                }
            }
            _ => left.push(format!(
                "sessions {:?} are at {} (no --dest-router to move them back: `phosctl migrate ID --to SOURCE --router DEST`)",
                moved.iter().map(|s| s.session).collect::<Vec<_>>(),
                m.to
            )),
        }
    }
    if unplugged && let Err(e) = device.plug(src, &m.source_vhost_user) {
        left.push(format!("plugging the vsock device back into the source: {e}"));
    }
    if left.is_empty() && unplugged {
        "the VM and its sessions run on the source, its vsock device plugged in again".into()
    } else if left.is_empty() {
        "the VM and its sessions run on the source".into()
    } else {
        format!("undoing it failed too: {}", left.join("; "))
    }
}

/// Cancel the VM's migration and make sure the source runs.
fn cancel_vm_migration(src: &mut Qmp) -> Result<(), QmpError> {
    let _ = src.execute::<Value>("migrate_cancel", json!({}));
    let deadline = Instant::now() + Duration::from_secs(30);
    while src.migration()?.status.as_deref().is_some_and(|s| s == "cancelling") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !src.status()?.running {
        src.execute::<Value>("cont", json!({}))?;
    }
    Ok(())
}

/// How long after `since` the moved sessions all had a channel at the destination again
/// (their guest reconnected), if the destination router can be asked.
fn guest_back(dest: &str, moved: &[MigrationSummary], since: Instant, deadline: Instant) -> Option<Duration> {
    if moved.is_empty() {
        return None;
    }
    let dest = RouterArg::at(dest.to_string());
    let ids: Vec<u64> = moved.iter().map(|s| s.session).collect();
    let deadline = deadline.min(Instant::now() + Duration::from_secs(120));
    loop {
        let list = run(&dest, async |c| Ok(c.sessions(tarpc::context::current()).await?)).ok()?;
        let back = ids.iter().all(|id| list.iter().any(|s| s.id == *id && s.channels > 0));
        if back {
            return Some(since.elapsed());
        }
        if Instant::now() >= deadline {
            eprintln!("phosctl: the guest has not reconnected its sessions {ids:?} at the destination yet");
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Tell the source router how the VM's move went (`None`: it failed), for its metrics.
fn report_to_router(router: &RouterArg, report: Option<VmMigrationReport>) {
    let told = run(router, async |c| Ok(c.vm_migrated(tarpc::context::current(), report).await?));
    if let Err(e) = told {
        eprintln!("phosctl: the source router did not take the figures for its metrics: {e}");
    }
}
