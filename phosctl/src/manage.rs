//! Managing a running router's sessions: `sessions`, `checkpoint`, `restore` (the router's
//! management service, with progress bars for the copies).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use phos_control::{
    CheckpointMode, CheckpointRequest, ControlError, ImageRefusal, RestoreRequest, RouterControlClient,
};
use phos_protocol::text::printable;

use crate::error::{CliError, report};

/// Which router to manage.
#[derive(clap::Args)]
pub struct RouterArg {
    /// The router's socket (default: $PHOS_ENDPOINT, else where `phosctl serve` listens).
    #[arg(long)]
    router: Option<String>,
}

impl RouterArg {
    /// The router whose socket is `endpoint`.
    pub fn at(endpoint: String) -> RouterArg {
        RouterArg { router: Some(endpoint) }
    }

    /// The router's socket as given (`None`: the default one).
    pub fn endpoint(&self) -> Option<String> {
        self.router.clone()
    }

    fn control_path(&self) -> Result<PathBuf, CliError> {
        let endpoint =
            self.router.clone().or_else(|| std::env::var("PHOS_ENDPOINT").ok()).unwrap_or_else(crate::default_endpoint);
        Ok(phos_control::control_path(&crate::endpoint_path(&endpoint)?))
    }
}

/// Call the router's management service with `f`.
pub(crate) fn run<T>(
    router: &RouterArg,
    f: impl AsyncFnOnce(RouterControlClient) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let path = router.control_path()?;
    phos_control::block_on(async move {
        let client = phos_control::router_client(&path)
            .await
            .map_err(|source| CliError::Unreachable { path: path.clone(), source })?;
        f(client).await
    })
    .map_err(|source| CliError::Io { context: "a runtime for the call".into(), source })?
}

pub fn sessions(router: &RouterArg, all: bool) -> ExitCode {
    report(run(router, async |c| {
        if !all {
            let list = c.sessions(tarpc::context::current()).await?;
            print_sessions(false, list.iter().map(|s| (None, s)));
            return Ok(());
        }
        // The router asks its peers (it has the secret); each answers within its wait.
        let cx = phos_control::context_within(phos_router::fleet::PEER_WAIT + Duration::from_secs(10));
        let fleet = c.fleet_sessions(cx).await?;
        let mut unanswered = 0;
        for f in &fleet {
            if let Err(e) = &f.sessions {
                eprintln!("phosctl: router {} ({}) did not answer: {e}", printable(&f.router), printable(&f.endpoint));
                unanswered += 1;
            }
        }
        let listed = fleet
            .iter()
            .filter_map(|f| f.sessions.as_ref().ok().map(|l| (f, l)))
            .flat_map(|(f, l)| l.iter().map(move |s| (Some(f.router.as_str()), s)));
        print_sessions(true, listed);
        if unanswered > 0 {
            return Err(CliError::Partial { unanswered, routers: fleet.len() });
        }
        Ok(())
    }))
}

/// The sessions table; with a router named for each session, a first column of them.
fn print_sessions<'a>(with_router: bool, list: impl Iterator<Item = (Option<&'a str>, &'a phos_control::SessionInfo)>) {
    let router_column =
        |r: Option<&str>| if with_router { format!("{:<24} ", printable(r.unwrap_or("-"))) } else { String::new() };
    println!(
        "{}{:>4}  {:<10} {:<9} {:>7} {:>4} {:>9} {:>8} {:<8}  program",
        if with_router { format!("{:<24} ", "router") } else { String::new() },
        "id",
        "tenant",
        "state",
        "pid",
        "abi",
        "calls",
        "uptime",
        "bypass"
    );
    for (router, s) in list {
        println!(
            "{}{:>4}  {:<10} {:<9} {:>7} {:>4} {:>9} {:>7.0}s {:<8}  {}",
            router_column(router),
            s.id,
            printable(&s.tenant),
            printable(&s.state),
            s.pid,
            s.abi_major,
            s.calls,
            s.uptime_s,
            if s.bypass.is_empty() { "-" } else { "BYPASSED" },
            printable(&s.program)
        );
        // The findings are escaped by the router.
        for finding in &s.bypass {
            println!("      bypass: {finding}");
        }
    }
}

/// A bar of bytes done, labelled `what` (drawn only on a terminal).
fn bytes_bar(what: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Poll `progress` while `work` runs, showing a bar of bytes copied.
async fn with_progress<T>(c: &RouterControlClient, session: u64, what: &str, work: impl Future<Output = T>) -> T {
    let bar = bytes_bar(what);
    let poll = async {
        loop {
            if let Ok(Some(p)) = c.progress(tarpc::context::current(), session).await {
                bar.set_length(p.total);
                bar.set_position(p.done);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let out = tokio::select! {
        out = work => out,
        _ = poll => unreachable!(),
    };
    bar.finish_and_clear();
    out
}

/// Checkpoint `session` into `out`; with `process` (the CRIU binary), its process too
/// (see [`crate::process`]): with `stop` the process ends and the session stops; without, both
/// run on.
#[allow(clippy::too_many_arguments)] // the command's own options
pub fn checkpoint(
    router: &RouterArg,
    session: u64,
    out: PathBuf,
    stop: bool,
    mode: CheckpointMode,
    compress: bool,
    quiesce_timeout: Duration,
    process: Option<PathBuf>,
) -> ExitCode {
    let dir = absolute(&out);
    report(run(router, async |c| {
        let pid = match &process {
            Some(_) => Some(local_process(&c, session).await?),
            None => None,
        };
        let park = process.is_some();
        let request = CheckpointRequest { dir: dir.clone(), stop, compress, quiesce_timeout, mode, park };
        if let (Some(criu), Some(pid), false) = (&process, pid, stop) {
            return checkpoint_leaving_running(&c, session, request, criu, pid).await;
        }
        let work = c.checkpoint(phos_control::long_context(), session, request);
        let s = with_progress(&c, session, "checkpoint", work).await??;
        print_checkpoint(session, &s);
        if let (Some(criu), Some(pid)) = (&process, pid) {
            if let Err(source) = crate::process::dump(criu, pid, &dir, false) {
                // The process runs on, its calls waiting: the session comes back from the
                // image for it.
                let request = RestoreRequest {
                    dir: dir.clone(),
                    device: None,
                    tenant: None,
                    as_tenant: None,
                    timeout: phos_control::DEFAULT_RESTORE_TIMEOUT,
                    full: false,
                };
                let context = phos_control::context_within(phos_control::DEFAULT_RESTORE_TIMEOUT);
                let after = match c.restore(context, request).await {
                    Ok(Ok(_)) => "the session was restored from the image and the process carries on".to_string(),
                    Ok(Err(e)) => format!("restoring the session from the image for it failed too: {e}"),
                    Err(e) => format!("restoring the session from the image for it failed too: {e}"),
                };
                return Err(CliError::ProcessNotDumped { session, pid, source, after });
            }
            println!(
                "process {pid} dumped with CRIU into {}; it has ended: `phosctl restore {}` brings it back with its session",
                dir.join(crate::process::PROCESS_DIR).display(),
                dir.display()
            );
        }
        Ok(())
    }))
}

/// What a checkpoint did, for the operator.
fn print_checkpoint(session: u64, s: &phos_control::CheckpointSummary) {
    println!(
        "session {session}: {} records, {} regions, {} MiB of device memory ({} MiB stored) in {:.1} ms (quiesce {:.1} ms, copy {:.1} ms){}",
        s.records,
        s.regions,
        s.memory_bytes >> 20,
        s.stored_bytes >> 20,
        s.total_ms,
        s.quiesce_ms,
        s.copy_ms,
        if s.stopped { "; the session is stopped until it is restored" } else { "" }
    );
    println!(
        "{}: calls held {:.1} ms, memory copied in {:.1} ms{}",
        s.mode,
        s.stall_ms,
        s.copy_ms,
        match s.mode.as_str() {
            "copy-on-write" => format!(
                " while the session ran ({:.1} MiB copied aside ahead of writes; {} calls waited {:.1} ms in all before they could write, the longest {:.1} ms for the copy)",
                s.extra_bytes as f64 / (1 << 20) as f64,
                s.waited_calls,
                s.waited_ms,
                s.held_ms
            ),
            "recopy" => format!(
                " ({} recopy rounds, {} MiB copied again; {} pieces skipped by hash, {} MiB the device still held as sent)",
                s.rounds,
                s.extra_bytes >> 20,
                s.skipped_pieces,
                s.skipped_bytes >> 20
            ),
            _ => String::new(),
        }
    );
    if let Some(why) = &s.fallback {
        println!("the concurrent checkpoint was taken again stop-the-world: {why}");
    }
    println!("image: {}", s.dir.display());
}

/// How often the session's server is asked whether the checkpoint has taken its cut.
const CUT_POLL: Duration = Duration::from_millis(2);

/// `checkpoint --process` without `--stop`: the session is parked and its server freezes
/// it at the cut; once frozen, its process's channels are cut, the process dumped with CRIU
/// and left running, and the session unparked, while the server copies its memory on.
async fn checkpoint_leaving_running(
    c: &RouterControlClient,
    session: u64,
    request: CheckpointRequest,
    criu: &Path,
    pid: u32,
) -> Result<(), CliError> {
    let dir = request.dir.clone();
    let quiesce_timeout = request.quiesce_timeout;
    let started = std::time::Instant::now();
    let work = c.checkpoint(phos_control::long_context(), session, request);
    tokio::pin!(work);
    // Until the cut: the checkpoint may also end (failed, or done) first.
    let mut finished = None;
    loop {
        tokio::select! {
            r = &mut work => {
                finished = Some(r);
                break;
            }
            _ = tokio::time::sleep(CUT_POLL) => {
                if let Ok(Some(p)) = c.progress(tarpc::context::current(), session).await
                    && p.frozen
                {
                    break;
                }
            }
        }
    }
    // Failed before the cut: the router has unparked the session.
    let finished = match finished {
        Some(r) => Some(r??),
        None => None,
    };
    let cut_at = std::time::Instant::now();
    let within = phos_control::context_within(quiesce_timeout + Duration::from_secs(10));
    let cut = match c.cut_channels(within, session, quiesce_timeout).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(unpark_after(c, session, e.into()).await),
        Err(e) => return Err(unpark_after(c, session, e.into()).await),
    };
    let channels_ms = cut_at.elapsed().as_secs_f64() * 1e3;
    let dump_started = std::time::Instant::now();
    let (criu, image) = (criu.to_path_buf(), dir.clone());
    let dumped = tokio::task::spawn_blocking(move || crate::process::dump(&criu, pid, &image, true))
        .await
        .map_err(|e| CliError::Io { context: "the dump's thread".into(), source: std::io::Error::other(e) })?;
    let dump_ms = dump_started.elapsed().as_secs_f64() * 1e3;
    let unparked = c.unpark(tarpc::context::current(), session).await;
    let held_ms = cut_at.elapsed().as_secs_f64() * 1e3;
    let copied = match finished {
        Some(s) => Ok(s),
        None => match with_progress(c, session, "checkpoint", &mut work).await {
            Ok(r) => r.map_err(CliError::from),
            Err(e) => Err(CliError::from(e)),
        },
    };
    unparked??;
    let s = match copied {
        Ok(s) => s,
        Err(e) => {
            // The process was dumped (or not) at a cut whose GPU image did not complete:
            // nothing to restore it with.
            let _ = std::fs::remove_dir_all(dir.join(crate::process::PROCESS_DIR));
            return Err(e);
        }
    };
    if let Err(source) = dumped {
        let _ = std::fs::remove_dir_all(dir.join(crate::process::PROCESS_DIR));
        let after = format!("the process runs on, and {} holds its session's GPU state only", dir.display());
        return Err(CliError::ProcessNotDumped { session, pid, source, after });
    }
    print_checkpoint(session, &s);
    println!(
        "process {pid} dumped with CRIU into {} and left running: its calls were held {held_ms:.1} ms from the cut (the cut took {:.1} ms; {cut} channel(s) cut in {channels_ms:.1} ms, CRIU dump {dump_ms:.1} ms); GPU memory copied in {:.1} ms, {:.1} ms in all",
        dir.join(crate::process::PROCESS_DIR).display(),
        s.stall_ms,
        s.copy_ms,
        started.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "`phosctl restore {}` (once the process has ended) brings both back as they were at the cut",
        dir.display()
    );
    Ok(())
}

/// A parked checkpoint that cannot go on: its session is unparked (its server serves it
/// again once the checkpoint ends), and `e` said.
async fn unpark_after(c: &RouterControlClient, session: u64, e: CliError) -> CliError {
    match c.unpark(tarpc::context::current(), session).await {
        Ok(Ok(())) => e,
        Ok(Err(u)) => CliError::Usage(format!("{e}; unparking the session failed too: {u}")),
        Err(u) => CliError::Usage(format!("{e}; unparking the session failed too: {u}")),
    }
}

/// The process of `session`, which must be on this host and running.
async fn local_process(c: &RouterControlClient, session: u64) -> Result<u32, CliError> {
    let list = c.sessions(tarpc::context::current()).await?;
    let info = list.into_iter().find(|s| s.id == session).ok_or(ControlError::NoSuchSession { session })?;
    if info.remote {
        return Err(CliError::Usage(format!(
            "session {session}'s process runs on another host (pid {} there): --process dumps a process of this host",
            info.pid
        )));
    }
    if info.state != "active" {
        return Err(CliError::Usage(format!(
            "session {session} is {}: --process needs its process running",
            info.state
        )));
    }
    Ok(info.pid)
}

pub fn migrate(
    router: &RouterArg,
    session: u64,
    to: phos_control::MigrationTarget,
    quiesce_timeout: Duration,
    timeout: Duration,
    connections: u16,
) -> ExitCode {
    report(run(router, async |c| {
        let request = phos_control::MigrateRequest { to, quiesce_timeout, timeout, connections };
        let work = c.migrate(phos_control::context_within(timeout + Duration::from_secs(30)), session, request);
        let s = with_migration_progress(&c, session, work).await??;
        print_migration(session, &s);
        Ok(())
    }))
}

/// What the passes of a migration are called: the first copy, its rounds, the held copy.
fn pass_name(pass: usize, held: bool) -> String {
    match pass {
        0 => "first copy".to_string(),
        _ if held => "held copy".to_string(),
        i => format!("round {i}"),
    }
}

/// Follow the migration of `session` while `work` runs. On a terminal (standard output), a
/// bar of the pass under way: bytes copied of those known so far, the rate, bytes left, and
/// how fast the session writes its memory; elsewhere nothing, so that what is printed after
/// stays the same lines for scripts.
async fn with_migration_progress<T>(c: &RouterControlClient, session: u64, work: impl Future<Output = T>) -> T {
    use std::io::IsTerminal;
    let bar = ProgressBar::new(0);
    if !std::io::stdout().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}) {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(pass_name(0, false));
    let poll = async {
        loop {
            if let Ok(Some(p)) = c.progress(tarpc::context::current(), session).await {
                bar.set_length(p.total);
                bar.set_position(p.done);
                bar.set_prefix(pass_name(p.pass as usize, p.held));
                bar.set_message(format!(
                    "{} left, session writes {}/s",
                    indicatif::HumanBytes(p.total.saturating_sub(p.done)),
                    indicatif::HumanBytes(p.dirty_rate)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let out = tokio::select! {
        out = work => out,
        _ = poll => unreachable!(),
    };
    bar.finish_and_clear();
    out
}

/// What a migration did, for the operator.
pub(crate) fn print_migration(session: u64, s: &phos_control::MigrationSummary) {
    println!(
        "session {session} moved to {}: {} MiB of device memory, {} MiB sent, in {:.1} ms; calls held {:.1} ms (downtime)",
        s.to,
        s.memory_bytes >> 20,
        s.sent_bytes >> 20,
        s.total_ms,
        s.downtime_ms
    );
    for (i, p) in s.passes.iter().enumerate() {
        let what = pass_name(i, i + 1 == s.passes.len());
        println!(
            "  {what:<10} {:>10} bytes written before it, {:>10} bytes copied, {:8.1} ms, {:>7} pieces skipped by hash",
            p.dirty_bytes, p.copied_bytes, p.ms, p.skipped_pieces
        );
    }
    println!(
        "dirty rate {:.1} MiB/s during the rounds; the target served the session after {:.1} ms (on demand: memory loading behind it)",
        s.dirty_rate / (1 << 20) as f64,
        s.restore.total_ms
    );
}

/// Where a restored session goes: the device, and whose it is to be.
pub struct RestoreTarget {
    pub device: Option<i32>,
    pub tenant: Option<String>,
    pub as_tenant: Option<String>,
}

/// Restore the image `dir`; with `process` (the CRIU binary), its process too, once its
/// session is back.
pub fn restore(
    router: &RouterArg,
    dir: PathBuf,
    target: RestoreTarget,
    timeout: Duration,
    full: bool,
    process: Option<PathBuf>,
) -> ExitCode {
    let dir = absolute(&dir);
    // The session's id, for following the restore's progress; a bad image is refused here
    // already, with the same error the router would give.
    let session = match phos_checkpoint::Image::open(&dir) {
        Ok(image) => image.manifest.session.id,
        Err(e) => {
            let reason = ImageRefusal::Invalid(e.to_string());
            return report(Err(ControlError::ImageRefused { dir, reason }.into()));
        }
    };
    let RestoreTarget { device, tenant, as_tenant } = target;
    report(run(router, async |c| {
        // CRIU restores the process at its pid: refused before anything is restored while
        // that pid is taken.
        if process.is_some() {
            crate::process::check_restorable(&dir)
                .map_err(|source| CliError::ProcessNotRestored { session, source })?;
        }
        let request = RestoreRequest { dir: dir.clone(), device, tenant, as_tenant, timeout, full };
        // The router gives up at `timeout`; the call waits a little longer for its answer.
        let work = c.restore(phos_control::context_within(timeout + Duration::from_secs(30)), request);
        // Into the suspended session the router keeps, the process first: until its session
        // is back its channels are refused as parked and it waits, where a session restored
        // first, with no process yet to connect to it, would be ended by the router as one
        // whose process went. A session the router does not have (it was restarted) comes
        // first: the process would be told that its session is unknown, and give up.
        let kept = c.sessions(tarpc::context::current()).await?.iter().any(|s| s.id == session);
        let bring_back = |criu: &Path| -> Result<u32, CliError> {
            let pid = crate::process::restore(criu, &dir)
                .map_err(|source| CliError::ProcessNotRestored { session, source })?;
            println!(
                "process {pid} restored with CRIU from {}: it reconnects to its session",
                dir.join(crate::process::PROCESS_DIR).display()
            );
            Ok(pid)
        };
        let process_pid = match &process {
            Some(criu) if kept => Some(bring_back(criu)?),
            _ => None,
        };
        let restored = match with_progress(&c, session, "restore", work).await {
            Ok(r) => r.map_err(CliError::from),
            Err(e) => Err(CliError::from(e)),
        };
        let s = restored.map_err(|e| match process_pid {
            Some(pid) => CliError::SessionNotRestored { pid, source: Box::new(e) },
            None => e,
        })?;
        if let Some(criu) = process.as_deref().filter(|_| !kept) {
            bring_back(criu)?;
        }
        let server = if s.pooled { "pooled" } else { "new" };
        if !s.on_demand {
            println!(
                "session {} restored from {} in {:.1} ms ({server} server; in the server: {} records replayed in {:.1} ms, {} MiB copied in {:.1} ms)",
                s.session,
                dir.display(),
                s.total_ms,
                s.records,
                s.replay_ms,
                s.memory_bytes >> 20,
                s.copy_ms
            );
            return Ok(());
        }
        println!(
            "session {} restored from {} on demand: serving after {:.1} ms ({server} server; in the server: {} records replayed in {:.1} ms); loading {} MiB of device memory behind it",
            s.session,
            dir.display(),
            s.total_ms,
            s.records,
            s.replay_ms,
            s.memory_bytes >> 20,
        );
        let load = follow_load(&c, s.session).await;
        if let Some(reason) = load.failed {
            return Err(CliError::LoadFailed { session: s.session, reason });
        }
        // The server's times count from its restore's start; the router's, from the request
        // (server start or pool hand-out included): a time from the request is the router's
        // time to serving plus the server's from serving on.
        let from_request = |ms: f64| s.total_ms + (ms - load.serving_ms);
        match load.loaded_ms {
            Some(loaded) => println!(
                "memory loaded: {} MiB, all in {:.1} ms after the request ({:.1} ms of loading behind the served session)",
                load.total >> 20,
                from_request(loaded),
                loaded - load.serving_ms
            ),
            // Its program ended first; the first call (below) was served all the same.
            None => println!(
                "the session ended with {} of {} MiB of its memory loaded (its program needed no more)",
                load.done >> 20,
                load.total >> 20
            ),
        }
        match load.first_call_ms {
            Some(ms) => println!(
                "first call served {:.1} ms after the request; calls held for memory: {} ({:.1} ms in all)",
                from_request(ms),
                load.held_calls,
                load.held_ms
            ),
            None => println!("no call came during the load"),
        }
        Ok(())
    }))
}

/// Follow the memory load of an on-demand restore of `session` with a bar of bytes loaded,
/// until it is over.
async fn follow_load(c: &RouterControlClient, session: u64) -> phos_control::LoadReport {
    let bar = bytes_bar("loading");
    let mut last = phos_control::LoadReport { session, ..Default::default() };
    loop {
        match c.restore_load(tarpc::context::current(), session).await {
            Ok(Some(r)) => {
                bar.set_length(r.total);
                bar.set_position(r.done);
                if r.finished() {
                    bar.finish_and_clear();
                    return r;
                }
                last = r;
            }
            // The router no longer has the session: it ended.
            Ok(None) => {
                bar.finish_and_clear();
                return phos_control::LoadReport { session_ended: true, ..last };
            }
            // The router did not answer this time: ask again.
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    }
}
