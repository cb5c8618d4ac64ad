//! A minimal client of QEMU's machine protocol (QMP), for the QEMU TCG test
//! engine's snapshots: one JSON object per line each way; the server greets,
//! the client negotiates (`qmp_capabilities`), then each command gets one
//! `return` or `error` reply, with asynchronous `event`s in between (skipped).
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Errors of a QMP exchange.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP socket {path}: {source}")]
    Connect { path: String, source: std::io::Error },
    #[error("QMP: {0}")]
    Io(#[from] std::io::Error),
    #[error("QMP: QEMU closed the connection")]
    Closed,
    #[error("QMP: unexpected message {0}")]
    Protocol(String),
    #[error("QMP {command}: {class}: {desc}")]
    Command { command: String, class: String, desc: String },
    #[error("QMP {0}: no answer in time")]
    Timeout(String),
}

/// One negotiated QMP connection.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to `path` (retrying while QEMU has not made it yet, until
    /// `within`), reads the greeting and leaves capabilities negotiation.
    pub fn connect(path: &Path, within: Duration) -> Result<Qmp, QmpError> {
        let deadline = Instant::now() + within;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    tracing::trace!("QMP {}: {e}; retrying", path.display());
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => return Err(QmpError::Connect { path: path.display().to_string(), source }),
            }
        };
        stream.set_read_timeout(Some(within))?;
        let mut qmp = Qmp { reader: BufReader::new(stream.try_clone()?), writer: stream };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(greeting.to_string()));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(QmpError::Closed);
        }
        serde_json::from_str(&line).map_err(|_| QmpError::Protocol(line.trim().to_string()))
    }

    /// Runs `command` and returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.writer.write_all(text.as_bytes())?;
        loop {
            let reply = self.read()?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                return Err(QmpError::Command { command: command.into(), class: field("class"), desc: field("desc") });
            }
            if reply.get("event").is_none() {
                return Err(QmpError::Protocol(reply.to_string()));
            }
        }
    }

    /// Polls `query-migrate` until the migration completes (Ok), fails or
    /// is cancelled (Err with QEMU's reason), or `within` passes.
    pub fn wait_migration(&mut self, within: Duration) -> Result<(), QmpError> {
        let deadline = Instant::now() + within;
        loop {
            let info = self.execute("query-migrate", None)?;
            match info.get("status").and_then(Value::as_str).unwrap_or("") {
                "completed" => return Ok(()),
                s @ ("failed" | "cancelled") => {
                    let desc = info.get("error-desc").and_then(Value::as_str).unwrap_or("").to_string();
                    return Err(QmpError::Command { command: "migrate".into(), class: s.into(), desc });
                }
                _ if Instant::now() >= deadline => return Err(QmpError::Timeout("migrate".into())),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    /// A scripted QMP server: greets, then answers each line read with the next reply.
    fn server(dir: &Path, replies: Vec<&'static str>) -> (std::path::PathBuf, std::thread::JoinHandle<Vec<String>>) {
        let path = dir.join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n").unwrap();
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut seen = Vec::new();
            for r in replies {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                seen.push(line.trim().to_string());
                s.write_all(r.as_bytes()).unwrap();
            }
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            seen
        });
        (path, t)
    }

    #[test]
    fn negotiates_skips_events_and_reports_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (path, t) = server(
            dir.path(),
            vec![
                "{\"return\": {}}\r\n",
                "{\"event\": \"STOP\", \"timestamp\": {}}\r\n{\"return\": {}}\r\n",
                "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no such file\"}}\r\n",
                "{\"return\": {\"status\": \"failed\", \"error-desc\": \"disk full\"}}\r\n",
            ],
        );
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(q.execute("stop", None).unwrap(), json!({}));
        let e = q.execute("migrate", Some(json!({"uri": "file:/x"}))).unwrap_err();
        assert_eq!(e.to_string(), "QMP migrate: GenericError: no such file");
        let e = q.wait_migration(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.to_string(), "QMP migrate: failed: disk full");
        drop(q);
        let seen = t.join().unwrap();
        assert_eq!(seen[0], "{\"execute\":\"qmp_capabilities\"}");
        assert_eq!(seen[2], "{\"arguments\":{\"uri\":\"file:/x\"},\"execute\":\"migrate\"}");
    }

    #[test]
    fn a_missing_socket_is_named() {
        let e = Qmp::connect(Path::new("/nonexistent/qmp.sock"), Duration::from_millis(50)).err().unwrap();
        assert!(e.to_string().starts_with("QMP socket /nonexistent/qmp.sock:"), "{e}");
    }
}
