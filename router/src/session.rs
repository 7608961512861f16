//! One session: a guest process and the API server process that runs its calls.

use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use phos_protocol::handshake::Hello;

use crate::usage::Usage;
use crate::{RouterConfig, Tenant};

pub struct SessionEntry {
    pub id: u64,
    pub tenant: Tenant,
    /// The guest process (as the router's PID namespace sees it).
    pub pid: u32,
    pub program: String,
    pub abi_major: u32,
    pub socket: PathBuf,
    pub started: Instant,
    pub usage: Usage,
    token: [u8; 16],
    channels: AtomicUsize,
    idle_since: Mutex<Option<Instant>>,
    server: Mutex<Option<(Child, ChildStdin)>>,
}

/// Closes a channel's count when the channel ends, however it ends.
pub(crate) struct ChannelGuard(pub std::sync::Arc<SessionEntry>);

impl Drop for ChannelGuard {
    fn drop(&mut self) {
        self.0.channel_closed();
    }
}

fn random_token() -> io::Result<[u8; 16]> {
    let mut t = [0u8; 16];
    let n = unsafe { libc::getrandom(t.as_mut_ptr() as *mut libc::c_void, t.len(), 0) };
    if n != t.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(t)
}

impl SessionEntry {
    /// Start the session's API server and wait until it is ready.
    pub(crate) fn start(
        id: u64,
        tenant: Tenant,
        pid: u32,
        hello: &Hello,
        config: &RouterConfig,
        socket: PathBuf,
    ) -> io::Result<Self> {
        let stderr = match &config.server_log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                Stdio::from(std::fs::File::create(dir.join(format!("session-{id}.log")))?)
            }
            None => Stdio::inherit(),
        };
        let mut child = Command::new(&config.server_bin)
            .arg("--listen")
            .arg(&socket)
            .arg("--session")
            .arg(id.to_string())
            .arg("--max-payload")
            .arg(config.max_payload.to_string())
            .args(&config.server_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| io::Error::other(format!("{}: {e}", config.server_bin.display())))?;
        let stdin = child.stdin.take().expect("piped");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("the API server exited during start-up (see its log above)"));
        }
        Ok(SessionEntry {
            id,
            tenant,
            pid,
            program: hello.program.clone(),
            abi_major: hello.abi_major,
            socket,
            started: Instant::now(),
            usage: Usage::default(),
            token: random_token()?,
            channels: AtomicUsize::new(0),
            idle_since: Mutex::new(Some(Instant::now())),
            server: Mutex::new(Some((child, stdin))),
        })
    }

    pub fn token(&self) -> [u8; 16] {
        self.token
    }

    /// Compare tokens without leaking how much of one matched.
    pub fn token_matches(&self, other: &[u8; 16]) -> bool {
        self.token.iter().zip(other).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    pub fn channels(&self) -> usize {
        self.channels.load(Ordering::Relaxed)
    }

    pub(crate) fn channel_opened(&self) {
        self.channels.fetch_add(1, Ordering::Relaxed);
        *self.idle_since.lock().unwrap() = None;
    }

    pub(crate) fn channel_closed(&self) {
        if self.channels.fetch_sub(1, Ordering::Relaxed) == 1 {
            *self.idle_since.lock().unwrap() = Some(Instant::now());
        }
    }

    fn guest_alive(&self) -> bool {
        unsafe { libc::kill(self.pid as libc::pid_t, 0) == 0 }
    }

    /// No channel is open and the guest is gone (or has been idle past `linger`), or the
    /// server died.
    pub(crate) fn is_finished(&self, linger: Duration) -> bool {
        if let Some((child, _)) = self.server.lock().unwrap().as_mut()
            && matches!(child.try_wait(), Ok(Some(_)))
        {
            return true;
        }
        match *self.idle_since.lock().unwrap() {
            Some(since) => !self.guest_alive() || since.elapsed() > linger,
            None => false,
        }
    }

    /// Stop the server: closing its stdin ends it.
    pub(crate) fn end(&self) {
        if let Some((mut child, stdin)) = self.server.lock().unwrap().take() {
            drop(stdin);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for SessionEntry {
    fn drop(&mut self) {
        self.end();
    }
}
