//! The svcd API client: HTTP/1.1 over the unix socket.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::{Serialize, de::DeserializeOwned};
use svc_control::api::ApiError;

/// Where svcd listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/svc/svcd.sock";

/// Where svcd is.
#[derive(Debug, Clone, clap::Args)]
pub struct SocketArg {
    /// svcd's API socket.
    #[arg(long, env = "SVC_SOCKET", default_value = DEFAULT_SOCKET, global = true)]
    pub socket: PathBuf,
}

/// The runtime a command's calls to svcd run on (one thread).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// The socket from `--socket`, `SVC_SOCKET`, or the default.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

/// An error svcd answered with (already worded for people).
#[derive(Debug)]
pub struct Refused {
    pub error: ApiError,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error.error)
    }
}

impl std::error::Error for Refused {}

impl Client {
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_owned(),
        }
    }

    /// A connection to svcd's socket. A caller the socket's permissions keep out is told
    /// which group may use svcd and how to join it; otherwise, whether svcd runs.
    pub async fn connect(&self) -> anyhow::Result<tokio::net::UnixStream> {
        match tokio::net::UnixStream::connect(&self.socket).await {
            Ok(s) => Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(anyhow::anyhow!("{}", permission_denied(&self.socket)))
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!(
                "cannot reach svcd at {} (is it running? `svcd run` as root, or `systemctl \
                 start svcd`; another socket: --socket or SVC_SOCKET)",
                self.socket.display()
            ))),
        }
    }

    /// Send a request; the response (any status) with its streaming body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<http::Response<Incoming>> {
        let stream = self.connect().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("talking to svcd")?;
        tokio::spawn(conn);
        let has_body = body.is_some();
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "svcd");
        if has_body {
            req = req.header("content-type", "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .context("building the request")?;
        sender.send_request(req).await.context("talking to svcd")
    }

    /// A JSON call: `T` on success, [`Refused`] with svcd's words otherwise.
    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> anyhow::Result<T> {
        let body = body.map(serde_json::to_vec).transpose()?;
        let resp = self.send(method, path, body).await?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("reading svcd's answer")?
            .to_bytes();
        if !status.is_success() {
            return Err(refused(status, &bytes).into());
        }
        serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "svcd's answer is not what this svc expects (versions differ?): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    }
}

impl Client {
    /// `GET path`, a stream of JSON lines: `each` gets every line as it arrives; a refusal is
    /// svcd's error.
    pub async fn get_lines(
        &self,
        path: &str,
        each: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let resp = self.send(Method::GET, path, None).await?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp
                .into_body()
                .collect()
                .await
                .context("reading svcd's answer")?
                .to_bytes();
            return Err(refused(status, &body).into());
        }
        for_each_line(resp.into_body(), each).await
    }
}

/// What a caller who may not open `socket` is told: the group that may (the socket's own, as
/// svcd's `api_group` made it) and how to join it.
fn permission_denied(socket: &Path) -> String {
    format!(
        "permission denied on {}: your user is not in the group '{}' that may use svcd; ask an \
         administrator to run: usermod -aG {1} $USER (then log in again)",
        socket.display(),
        socket_group(socket)
    )
}

/// The name of the group owning `socket` (or, when it cannot be read, its directory's); the
/// default API group when neither can be read.
fn socket_group(socket: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let gid = std::fs::metadata(socket)
        .or_else(|_| std::fs::metadata(socket.parent().unwrap_or(Path::new("/"))))
        .map(|m| m.gid());
    match gid {
        Ok(gid) => match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
            Ok(Some(g)) => g.name,
            _ => gid.to_string(),
        },
        Err(_) => svc_control::config::host::defaults::API_GROUP.to_owned(),
    }
}

/// svcd's error body as an error.
pub fn refused(status: StatusCode, body: &[u8]) -> Refused {
    let error = serde_json::from_slice::<ApiError>(body).unwrap_or_else(|_| ApiError {
        code: "unknown".into(),
        error: format!("svcd answered {status}: {}", String::from_utf8_lossy(body)),
    });
    Refused { error }
}

/// Split a streaming body into lines as they arrive; `each` gets every complete line.
pub async fn for_each_line(
    mut body: Incoming,
    mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut pending: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading svcd's stream")?;
        if let Ok(data) = frame.into_data() {
            pending.extend_from_slice(&data);
            while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                each(&line[..line.len() - 1])?;
            }
        }
    }
    if !pending.is_empty() {
        each(&pending)?;
    }
    Ok(())
}
