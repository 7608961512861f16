//! A small client of QEMU's machine protocol (QMP) for `phosctl vm-migrate`: the handful of
//! commands and events a migration needs, each answer read into a typed struct.
//!
//! Hand-written over `serde_json` rather than the `qapi` crate: that crate generates the
//! whole QMP schema of the QEMU release it pins (hundreds of types, a long build on every
//! machine that builds phosctl) to use eight commands, and its schema differs from the QEMU
//! that runs (Debian 12's 7.2) in exactly the migration fields this code reads.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// What went wrong talking to a QEMU.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("cannot reach the QMP socket {}: {source}", path.display())]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("QMP of {qemu}: {source}")]
    Io { qemu: String, source: std::io::Error },
    #[error("QMP of {qemu} closed the connection (QEMU ended?)")]
    Closed { qemu: String },
    #[error("QMP of {qemu}: unexpected answer to {command}: {detail}")]
    Protocol { qemu: String, command: String, detail: String },
    /// QEMU refused or failed the command, in its words.
    #[error("{qemu} refused {command}: {desc} ({class})")]
    Refused { qemu: String, command: String, class: String, desc: String },
    #[error("{qemu}: no {event} event within {waited:?}")]
    NoEvent { qemu: String, event: String, waited: Duration },
}

/// One QEMU's QMP connection. Events that arrive while a command waits for its answer are
/// kept for [`Qmp::wait_event`].
pub struct Qmp {
    /// The QEMU, as messages name it ("the source QEMU").
    name: String,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    events: VecDeque<(String, Value)>,
}

/// `query-status`.
#[derive(Debug, Deserialize)]
pub struct StatusInfo {
    pub status: String,
    pub running: bool,
}

/// `query-migrate` (the fields read here).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MigrationInfo {
    pub status: Option<String>,
    pub ram: Option<RamStats>,
    /// Milliseconds the VM was stopped (once completed).
    pub downtime: Option<u64>,
    pub error_desc: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RamStats {
    pub total: u64,
    pub remaining: u64,
    pub transferred: u64,
    pub dirty_pages_rate: u64,
    pub page_size: Option<u64>,
    pub mbps: f64,
    /// Dirty-bitmap syncs so far: 1 while the first pass copies, then one per pass.
    #[serde(default)]
    pub dirty_sync_count: u64,
}

impl Qmp {
    /// Connect to the QMP socket at `path` and leave the greeting's negotiation mode.
    pub fn connect(path: &Path, name: &str) -> Result<Qmp, QmpError> {
        let stream =
            UnixStream::connect(path).map_err(|source| QmpError::Connect { path: path.to_path_buf(), source })?;
        let writer = stream.try_clone().map_err(|source| QmpError::Io { qemu: name.to_string(), source })?;
        let mut qmp = Qmp { name: name.to_string(), reader: BufReader::new(stream), writer, events: VecDeque::new() };
        let greeting = qmp.read(Some(Duration::from_secs(10)))?;
        if greeting.get("QMP").is_none() {
            return Err(qmp.protocol("the greeting", format!("{greeting}")));
        }
        qmp.execute::<Value>("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn protocol(&self, command: &str, detail: String) -> QmpError {
        QmpError::Protocol { qemu: self.name.clone(), command: command.to_string(), detail }
    }

    /// The next message, waiting at most `within` (forever: `None`); `Ok(None)` on timeout.
    fn read_within(&mut self, within: Option<Duration>) -> Result<Option<Value>, QmpError> {
        let io = |source| QmpError::Io { qemu: self.name.clone(), source };
        self.reader.get_ref().set_read_timeout(within.map(|d| d.max(Duration::from_millis(1)))).map_err(io)?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(QmpError::Closed { qemu: self.name.clone() }),
            Ok(_) => {
                serde_json::from_str(&line).map(Some).map_err(|e| self.protocol("a message", format!("{e}: {line}")))
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(QmpError::Io { qemu: self.name.clone(), source: e }),
        }
    }

    fn read(&mut self, within: Option<Duration>) -> Result<Value, QmpError> {
        self.read_within(within)?.ok_or_else(|| QmpError::Io {
            qemu: self.name.clone(),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"),
        })
    }

    /// Run `command` with `arguments` and read its answer as `T`.
    pub fn execute<T: DeserializeOwned>(&mut self, command: &str, arguments: Value) -> Result<T, QmpError> {
        let mut message = serde_json::to_vec(&json!({ "execute": command, "arguments": arguments }))
            .map_err(|e| self.protocol(command, e.to_string()))?;
        message.push(b'\n');
        self.writer.write_all(&message).map_err(|source| QmpError::Io { qemu: self.name.clone(), source })?;
        loop {
            let mut answer = self.read(Some(Duration::from_secs(60)))?;
            if let Some(event) = answer.get("event").and_then(Value::as_str).map(str::to_string) {
                let data = answer.get_mut("data").map(Value::take).unwrap_or(Value::Null);
                self.events.push_back((event, data));
                continue;
            }
            if let Some(error) = answer.get("error") {
                let text = |k: &str| error.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
                return Err(QmpError::Refused {
                    qemu: self.name.clone(),
                    command: command.to_string(),
                    class: text("class"),
                    desc: text("desc"),
                });
            }
            let Some(value) = answer.get_mut("return").map(Value::take) else {
                return Err(self.protocol(command, answer.to_string()));
            };
            return serde_json::from_value(value).map_err(|e| self.protocol(command, e.to_string()));
        }
    }

    /// Wait up to `within` for event `name` whose data `matches`.
    pub fn wait_event(
        &mut self,
        name: &str,
        matches: impl Fn(&Value) -> bool,
        within: Duration,
    ) -> Result<Value, QmpError> {
        if let Some(i) = self.events.iter().position(|(n, d)| n == name && matches(d)) {
            return Ok(self.events.remove(i).map(|(_, d)| d).unwrap_or_default());
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::NoEvent { qemu: self.name.clone(), event: name.to_string(), waited: within });
            }
            let Some(mut message) = self.read_within(Some(left))? else { continue };
            let Some(event) = message.get("event").and_then(Value::as_str).map(str::to_string) else { continue };
            let data = message.get_mut("data").map(Value::take).unwrap_or(Value::Null);
            if event == name && matches(&data) {
                return Ok(data);
            }
            self.events.push_back((event, data));
        }
    }

    pub fn status(&mut self) -> Result<StatusInfo, QmpError> {
        self.execute("query-status", json!({}))
    }

    pub fn migration(&mut self) -> Result<MigrationInfo, QmpError> {
        self.execute("query-migrate", json!({}))
    }

    /// A QOM property of a device of the command line or `device_add` (by its `id`).
    pub fn device_property(&mut self, id: &str, property: &str) -> Result<Value, QmpError> {
        self.execute("qom-get", json!({ "path": format!("/machine/peripheral/{id}"), "property": property }))
    }

    /// Unplug device `id` and wait until the guest has let it go (`DEVICE_DELETED`).
    pub fn unplug(&mut self, id: &str, within: Duration) -> Result<(), QmpError> {
        self.execute::<Value>("device_del", json!({ "id": id }))?;
        self.wait_event("DEVICE_DELETED", |d| d.get("device").and_then(Value::as_str) == Some(id), within)?;
        Ok(())
    }

    /// A chardev `id` that connects to the Unix socket `path` (a vhost-user backend's).
    pub fn add_socket_chardev(&mut self, id: &str, path: &Path) -> Result<(), QmpError> {
        let backend = json!({
            "type": "socket",
            "data": { "addr": { "type": "unix", "data": { "path": path } }, "server": false }
        });
        self.execute::<Value>("chardev-add", json!({ "id": id, "backend": backend }))?;
        Ok(())
    }

    pub fn remove_chardev(&mut self, id: &str) -> Result<(), QmpError> {
        self.execute::<Value>("chardev-remove", json!({ "id": id }))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake QEMU on a socket pair: it greets, answers each command from `answers` in
    /// order (interleaving an event before the second), and records what it was sent.
    fn fake(answers: Vec<&'static str>) -> (Qmp, std::thread::JoinHandle<Vec<Value>>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut w = theirs.try_clone().unwrap();
            let mut r = BufReader::new(theirs);
            writeln!(w, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            let mut sent = Vec::new();
            for (i, a) in std::iter::once(r#"{"return": {}}"#).chain(answers).enumerate() {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                sent.push(serde_json::from_str::<Value>(&line).unwrap());
                if i == 2 {
                    writeln!(w, r#"{{"event": "DEVICE_DELETED", "data": {{"device": "vsock0"}}}}"#).unwrap();
                }
                writeln!(w, "{a}").unwrap();
            }
            sent
        });
        let writer = ours.try_clone().unwrap();
        let mut qmp = Qmp { name: "a test QEMU".into(), reader: BufReader::new(ours), writer, events: VecDeque::new() };
        qmp.read(Some(Duration::from_secs(5))).unwrap();
        qmp.execute::<Value>("qmp_capabilities", json!({})).unwrap();
        (qmp, server)
    }

    /// Answers are typed, errors carry QEMU's words, and an event that arrives while a
    /// command waits is kept for a later wait.
    #[test]
    fn answers_errors_and_events_are_read() {
        let (mut qmp, server) = fake(vec![
            r#"{"return": {"status": "running", "running": true, "singlestep": false}}"#,
            r#"{"return": {}}"#,
            r#"{"error": {"class": "GenericError", "desc": "State blocked by non-migratable device"}}"#,
        ]);
        let status = qmp.status().unwrap();
        assert_eq!((status.status.as_str(), status.running), ("running", true));
        qmp.execute::<Value>("device_del", json!({"id": "vsock0"})).unwrap();
        let deleted = qmp.wait_event("DEVICE_DELETED", |_| true, Duration::from_millis(10)).unwrap();
        assert_eq!(deleted["device"], "vsock0");
        let err = qmp.execute::<Value>("migrate", json!({"uri": "unix:/x"})).unwrap_err().to_string();
        assert!(err.contains("refused migrate") && err.contains("non-migratable"), "{err}");
        let missing = qmp.wait_event("MIGRATION", |_| true, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(missing, QmpError::Closed { .. } | QmpError::NoEvent { .. }), "{missing}");
        let sent = server.join().unwrap();
        assert_eq!(sent[3]["execute"], "migrate");
        assert_eq!(sent[3]["arguments"]["uri"], "unix:/x");
    }
}
