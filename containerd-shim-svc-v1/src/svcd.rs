//! svcd's API, as the shim calls it: HTTP/1.1 on svcd's Unix socket, blocking, one connection
//! per call (`Connection: close`). Creation and removal are JSON calls; a task's process is an
//! upgraded exec (`svc-exec.v1`) whose connection then carries JSON lines both ways.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
};

use svc_control::api::{CreateSandbox, EXEC_UPGRADE, ExecFrame, ExecInput, ExecRequest};

/// What went wrong talking to svcd; each message names the call.
#[derive(Debug, thiserror::Error)]
pub enum SvcdError {
    #[error("connecting to svcd at {socket}: {source}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{call}: {source}")]
    Io {
        call: String,
        #[source]
        source: std::io::Error,
    },
    /// svcd refused: its status and message (the creation rules' message for a refused
    /// request).
    #[error("{call}: svcd answered {status}: {message}")]
    Refused {
        call: String,
        status: u16,
        message: String,
    },
    #[error("{call}: {message}")]
    Protocol { call: String, message: String },
}

/// The longest response head or exec line taken from svcd.
const MAX_LINE: usize = 4 << 20;

/// svcd's API socket.
#[derive(Debug, Clone)]
pub struct Svcd {
    socket: PathBuf,
}

impl Svcd {
    /// The API at `socket`.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
        }
    }

    /// `POST /v1/sandboxes`.
    pub fn create(&self, req: &CreateSandbox) -> Result<(), SvcdError> {
        let body = serde_json::to_vec(req).map_err(|e| protocol("creating", e.to_string()))?;
        self.call(
            "POST",
            "/v1/sandboxes",
            &body,
            &format!("creating sandbox {}", req.name),
        )
        .map(drop)
    }

    /// `DELETE /v1/sandboxes/{name}`; a sandbox already gone is no error.
    pub fn destroy(&self, name: &str) -> Result<(), SvcdError> {
        match self.call(
            "DELETE",
            &format!("/v1/sandboxes/{name}"),
            b"",
            &format!("removing sandbox {name}"),
        ) {
            Err(SvcdError::Refused { status: 404, .. }) | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Start `req` in sandbox `name`: the attached exec.
    pub fn exec(&self, name: &str, req: &ExecRequest) -> Result<Exec, SvcdError> {
        let call = format!("running the task's process in sandbox {name}");
        let body = serde_json::to_vec(req).map_err(|e| protocol(&call, e.to_string()))?;
        let mut stream = self.connect()?;
        let head = format!(
            "POST /v1/sandboxes/{name}/exec HTTP/1.1\r\nhost: svcd\r\nconnection: upgrade\r\n\
             upgrade: {EXEC_UPGRADE}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        write_all(&mut stream, &[head.as_bytes(), &body], &call)?;
        let writer = stream.try_clone().map_err(|e| io(&call, e))?;
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader, &call)?;
        if status != 101 {
            let body = read_body(&mut reader, &headers, &call)?;
            return Err(refused(&call, status, &body));
        }
        Ok(Exec {
            reader,
            writer,
            call,
        })
    }

    fn connect(&self) -> Result<UnixStream, SvcdError> {
        UnixStream::connect(&self.socket).map_err(|source| SvcdError::Connect {
            socket: self.socket.clone(),
            source,
        })
    }

    /// One call with a JSON body; the response's body when it is a 2xx.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        call: &str,
    ) -> Result<Vec<u8>, SvcdError> {
        let mut stream = self.connect()?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: svcd\r\nconnection: close\r\ncontent-type: \
             application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        write_all(&mut stream, &[head.as_bytes(), body], call)?;
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader, call)?;
        let body = read_body(&mut reader, &headers, call)?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(refused(call, status, &body))
        }
    }
}

/// A running exec: its output frames, and where signals and input go.
#[derive(Debug)]
pub struct Exec {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    call: String,
}

impl Exec {
    /// The writing half, for signals and input from other threads.
    pub fn sender(&self) -> Result<Sender, SvcdError> {
        let stream = self.writer.try_clone().map_err(|e| io(&self.call, e))?;
        Ok(Sender(std::sync::Arc::new(std::sync::Mutex::new(stream))))
    }

    /// The next frame svcd sent; none once the stream ended.
    pub fn next_frame(&mut self) -> Result<Option<ExecFrame>, SvcdError> {
        let Some(line) = read_line(&mut self.reader, &self.call)? else {
            return Ok(None);
        };
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| protocol(&self.call, format!("a bad exec frame from svcd: {e}")))
    }
}

/// Sends frames up an exec's connection.
#[derive(Debug, Clone)]
pub struct Sender(std::sync::Arc<std::sync::Mutex<UnixStream>>);

impl Sender {
    /// Send one input frame.
    pub fn send(&self, frame: &ExecInput) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(frame).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut s = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.write_all(&line)?;
        s.flush()
    }
}

fn write_all(stream: &mut UnixStream, parts: &[&[u8]], call: &str) -> Result<(), SvcdError> {
    for p in parts {
        stream.write_all(p).map_err(|e| io(call, e))?;
    }
    stream.flush().map_err(|e| io(call, e))
}

/// The status and the (lower-cased) headers of a response.
fn read_head(
    reader: &mut BufReader<UnixStream>,
    call: &str,
) -> Result<(u16, Vec<(String, String)>), SvcdError> {
    let status_line = read_line(reader, call)?
        .ok_or_else(|| protocol(call, "svcd closed the connection without answering".into()))?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            protocol(
                call,
                format!("a bad status line from svcd: {status_line:?}"),
            )
        })?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader, call)?
            .ok_or_else(|| protocol(call, "svcd's response head was cut short".into()))?;
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            return Ok((status, headers));
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
}

/// The body after `headers`: by its length, chunked, or to the end of the connection.
fn read_body(
    reader: &mut BufReader<UnixStream>,
    headers: &[(String, String)],
    call: &str,
) -> Result<Vec<u8>, SvcdError> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let size = read_line(reader, call)?.unwrap_or_default();
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| protocol(call, format!("a bad chunk size from svcd: {size:?}")))?;
            if size == 0 || body.len() + size > MAX_LINE {
                return Ok(body);
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).map_err(|e| io(call, e))?;
            body.extend_from_slice(&chunk[..size]);
        }
    }
    let limit = match header("content-length").map(str::parse::<u64>) {
        Some(Ok(n)) => n.min(MAX_LINE as u64),
        Some(Err(_)) => return Err(protocol(call, "a bad content-length from svcd".into())),
        None => MAX_LINE as u64,
    };
    reader
        .take(limit)
        .read_to_end(&mut body)
        .map_err(|e| io(call, e))?;
    Ok(body)
}

/// One line (without its `\n`), at most [`MAX_LINE`] long; none at the end of the stream.
fn read_line(reader: &mut BufReader<UnixStream>, call: &str) -> Result<Option<String>, SvcdError> {
    let mut line = Vec::new();
    let n = reader
        .by_ref()
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line)
        .map_err(|e| io(call, e))?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') && n as u64 >= MAX_LINE as u64 {
        return Err(protocol(call, "a line from svcd longer than 4 MiB".into()));
    }
    line.pop_if(|b| *b == b'\n');
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| protocol(call, "a line from svcd that is not UTF-8".into()))
}

/// svcd's refusal: the message of its JSON error body, or the body.
fn refused(call: &str, status: u16, body: &[u8]) -> SvcdError {
    let message = serde_json::from_slice::<svc_control::api::ApiError>(body)
        .map(|e| e.error)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).trim().to_owned());
    SvcdError::Refused {
        call: call.to_owned(),
        status,
        message,
    }
}

fn io(call: &str, source: std::io::Error) -> SvcdError {
    SvcdError::Io {
        call: call.to_owned(),
        source,
    }
}

fn protocol(call: &str, message: String) -> SvcdError {
    SvcdError::Protocol {
        call: call.to_owned(),
        message,
    }
}
