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

pub fn sessions(router: &RouterArg) -> ExitCode {
    report(run(router, async |c| {
        let list = c.sessions(tarpc::context::current()).await?;
        println!(
            "{:>4}  {:<10} {:<9} {:>7} {:>4} {:>9} {:>8} {:<8}  program",
            "id", "tenant", "state", "pid", "abi", "calls", "uptime", "bypass"
        );
        for s in list {
            println!(
                "{:>4}  {:<10} {:<9} {:>7} {:>4} {:>9} {:>7.0}s {:<8}  {}",
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
        Ok(())
    }))
}

/// Poll `progress` while `work` runs, showing a bar of bytes copied.
async fn with_progress<T>(c: &RouterControlClient, session: u64, what: &str, work: impl Future<Output = T>) -> T {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
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

pub fn checkpoint(
    router: &RouterArg,
    session: u64,
    out: PathBuf,
    stop: bool,
    mode: CheckpointMode,
    compress: bool,
    quiesce_timeout: Duration,
) -> ExitCode {
    let dir = absolute(&out);
    report(run(router, async |c| {
        let request = CheckpointRequest { dir: dir.clone(), stop, compress, quiesce_timeout, mode };
        let work = c.checkpoint(phos_control::long_context(), session, request);
        let s = with_progress(&c, session, "checkpoint", work).await??;
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
                    " while the session ran ({} MiB copied ahead of writes; the longest a call waited for the copy: {:.1} ms)",
                    s.extra_bytes >> 20,
                    s.held_ms
                ),
                "recopy" => format!(" ({} recopy rounds, {} MiB copied again)", s.rounds, s.extra_bytes >> 20),
                _ => String::new(),
            }
        );
        if let Some(why) = &s.fallback {
            println!("the concurrent checkpoint was taken again stop-the-world: {why}");
        }
        println!("image: {}", s.dir.display());
        Ok(())
    }))
}

pub fn restore(
    router: &RouterArg,
    dir: PathBuf,
    device: Option<i32>,
    tenant: Option<String>,
    as_tenant: Option<String>,
    timeout: Duration,
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
    report(run(router, async |c| {
        let request =
            RestoreRequest { dir: dir.clone(), device, tenant: tenant.clone(), as_tenant: as_tenant.clone(), timeout };
        // The router gives up at `timeout`; the call waits a little longer for its answer.
        let work = c.restore(phos_control::context_within(timeout + Duration::from_secs(30)), request);
        let s = with_progress(&c, session, "restore", work).await??;
        println!(
            "session {} restored from {} in {:.1} ms ({} server; in the server: {} records replayed in {:.1} ms, {} MiB copied in {:.1} ms)",
            s.session,
            dir.display(),
            s.total_ms,
            if s.pooled { "pooled" } else { "new" },
            s.records,
            s.replay_ms,
            s.memory_bytes >> 20,
            s.copy_ms
        );
        Ok(())
    }))
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    }
}
