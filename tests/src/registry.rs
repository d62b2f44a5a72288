//! A read-only OCI registry on loopback serving one image layout, so containerd's CRI
//! `PullImage` pulls as it does from a node's registry (containerd 1.6 always asks the
//! image's registry, even for an image it has). Every repository and tag name the layout's
//! one image; a digest names a blob of it. Plain HTTP: containerd reaches it as a mirror
//! (`registry.mirrors`, an `http://` endpoint).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
};

/// A running registry: its address and the requests it has answered (`METHOD PATH`).
#[derive(Debug, Clone)]
pub struct Registry {
    pub addr: SocketAddr,
    served: Arc<Mutex<Vec<String>>>,
}

impl Registry {
    /// Unpack the OCI archive `archive` into `dir` and serve it on a port of the kernel's
    /// choosing until the test process ends.
    pub fn serve(archive: &Path, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("the registry's directory");
        let out = Command::new("tar")
            .arg("-C")
            .arg(dir)
            .arg("-xf")
            .arg(archive)
            .output()
            .expect("tar");
        assert!(
            out.status.success(),
            "unpacking {}: {out:?}",
            archive.display()
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the registry");
        let addr = listener.local_addr().expect("the registry's address");
        let served = Arc::new(Mutex::new(Vec::new()));
        let (log, root) = (served.clone(), dir.to_path_buf());
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let (log, root) = (log.clone(), root.clone());
                std::thread::spawn(move || answer(conn, &root, &log));
            }
        });
        Self { addr, served }
    }

    /// The requests answered so far, as `METHOD PATH` (without the query).
    pub fn served(&self) -> Vec<String> {
        self.served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Answer one request on `conn` from the layout at `root`, then close it.
fn answer(mut conn: TcpStream, root: &Path, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone the connection"));
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => return,
            Ok(_) if header.trim().is_empty() => break,
            Ok(_) => {}
        }
    }
    let mut words = first.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{method} {path}"));
    let (status, kind, digest, body) = route(root, path);
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(d) = digest {
        head.push_str(&format!("Docker-Content-Digest: {d}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = conn.write_all(&body);
    }
}

/// What `path` names: status line, media type, digest and content.
fn route(root: &Path, path: &str) -> (&'static str, &'static str, Option<String>, Vec<u8>) {
    const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    let missing = ("404 Not Found", "text/plain", None, Vec::new());
    if path == "/v2/" {
        return ("200 OK", "application/json", None, b"{}".to_vec());
    }
    let blob = |digest: &str| -> Option<Vec<u8>> {
        let hex = digest.strip_prefix("sha256:")?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        std::fs::read(blob_path(root, hex)).ok()
    };
    if let Some((_, reference)) = path.rsplit_once("/manifests/") {
        let digest = if reference.starts_with("sha256:") {
            reference.to_owned()
        } else {
            let index: serde_json::Value = std::fs::read(root.join("index.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            index["manifests"][0]["digest"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        return match blob(&digest) {
            Some(body) => ("200 OK", MANIFEST, Some(digest), body),
            None => missing,
        };
    }
    if let Some((_, digest)) = path.rsplit_once("/blobs/") {
        return match blob(digest) {
            Some(body) => (
                "200 OK",
                "application/octet-stream",
                Some(digest.to_owned()),
                body,
            ),
            None => missing,
        };
    }
    missing
}

fn blob_path(root: &Path, hex: &str) -> PathBuf {
    root.join("blobs/sha256").join(hex)
}
