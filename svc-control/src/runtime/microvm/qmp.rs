//! A QMP client: the QEMU Machine Protocol over the VM's unix socket (`-qmp
//! unix:PATH,server=on,wait=off`). One command at a time: `execute` sends a command and returns
//! its `return` value, or QEMU's error class and description; asynchronous events that arrive
//! in between are kept, not mistaken for answers. Used by the microvm backend to pause
//! (`stop`), resume (`cont`), snapshot (`migrate`) and end (`quit`) a VM.

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{
        UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
};

/// Longest line QEMU may send (a large `query-*` answer fits easily).
const MAX_LINE: usize = 1 << 20;

/// Errors of the QMP client.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("connecting to QMP at {path}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to QMP")]
    Io(#[from] std::io::Error),
    #[error("QMP closed the connection")]
    Closed,
    #[error("QMP did not answer within {0:?}")]
    Timeout(Duration),
    #[error("QMP sent something that is not a QMP message: {0}")]
    Protocol(String),
    #[error("QMP refused {command}: {class}: {desc}")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
}

/// A negotiated QMP session.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// QEMU's version from the greeting, e.g. `10.0.2`.
    pub version: String,
    /// Events received so far (`{"event": "STOP", …}`), oldest first.
    pub events: Vec<Value>,
    timeout: Duration,
}

impl Qmp {
    /// Connect, read the greeting and leave capabilities negotiation mode.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| QmpError::Connect {
                path: path.display().to_string(),
                source,
            })?;
        let (r, w) = stream.into_split();
        let mut qmp = Self {
            reader: BufReader::new(r),
            writer: w,
            version: String::new(),
            events: Vec::new(),
            timeout,
        };
        let greeting = qmp.next_message().await?;
        let v = &greeting["QMP"]["version"]["qemu"];
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!("no greeting: {greeting}")));
        }
        qmp.version = format!("{}.{}.{}", v["major"], v["minor"], v["micro"]);
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// Run `command` (with `arguments`); its `return` value.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = serde_json::to_vec(&msg).map_err(|e| QmpError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line).await?;
        loop {
            let m = self.next_message().await?;
            if m.get("event").is_some() {
                self.events.push(m);
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                return Err(QmpError::Refused {
                    command: command.to_owned(),
                    class: e["class"].as_str().unwrap_or("?").to_owned(),
                    desc: e["desc"].as_str().unwrap_or("?").to_owned(),
                });
            }
            return Err(QmpError::Protocol(m.to_string()));
        }
    }

    /// The VM's run state (`running`, `paused`, `postmigrate`, …).
    pub async fn status(&mut self) -> Result<String, QmpError> {
        let s = self.execute("query-status", None).await?;
        s["status"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| QmpError::Protocol(format!("query-status answered {s}")))
    }

    async fn next_message(&mut self) -> Result<Value, QmpError> {
        let mut line = Vec::new();
        let read = tokio::time::timeout(self.timeout, async {
            loop {
                let before = line.len();
                let n = (&mut self.reader)
                    .take((MAX_LINE - before.min(MAX_LINE)) as u64 + 1)
                    .read_until(b'\n', &mut line)
                    .await?;
                if n == 0 {
                    return Err(QmpError::Closed);
                }
                if line.len() > MAX_LINE {
                    return Err(QmpError::Protocol(format!(
                        "a line longer than {MAX_LINE} bytes"
                    )));
                }
                if line.ends_with(b"\n") {
                    return Ok(());
                }
            }
        })
        .await
        .map_err(|_| QmpError::Timeout(self.timeout))?;
        read?;
        serde_json::from_slice(&line).map_err(|e| {
            QmpError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&line).trim()))
        })
    }
}
