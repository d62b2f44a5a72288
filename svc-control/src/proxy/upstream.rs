//! How the proxy reaches upstream servers: straight to them, or through the operator's HTTP
//! forward proxy (`svcd.toml` `[upstream] proxy`). Through it, HTTPS is a `CONNECT host:443`
//! tunnel (TLS still runs end to end with the real host, verified against its name) and plain
//! HTTP goes as absolute-form requests (`GET http://host/path`); hosts matching `no_proxy`
//! are dialled directly. The operator's proxy resolves the names it is asked for.
//!
//! A guest's request is dialled at the address the guest itself dialled (see `dial`): the
//! connector is made for that one address ([`UpstreamConnector::to_address`]) and never
//! resolves the name. Only svcd's own requests (token endpoints) and the way to the operator's
//! proxy resolve names, with the host's resolver.

use std::{
    error::Error as StdError,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::{HeaderValue, Uri, uri::Scheme};
use hyper_util::{
    client::legacy::connect::{Connected, Connection, HttpConnector, proxy::Tunnel},
    rt::TokioIo,
};
use tokio::net::TcpStream;
use tower_service::Service;

type BoxError = Box<dyn StdError + Send + Sync>;

pub use crate::config::host::{NoProxy, UpstreamProxyConfig};

/// The operator's forward proxy, as the proxy uses it.
#[derive(Clone)]
pub struct ForwardProxy {
    /// `http://host:port`.
    pub uri: Uri,
    /// `Proxy-Authorization` for it (Basic), if it wants credentials.
    pub auth: Option<HeaderValue>,
    /// Hosts dialled directly.
    pub no_proxy: Vec<NoProxy>,
}

impl std::fmt::Debug for ForwardProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardProxy")
            .field("uri", &self.uri)
            .field("auth", &self.auth.as_ref().map(|_| "(set)"))
            .field("no_proxy", &self.no_proxy)
            .finish()
    }
}

impl ForwardProxy {
    /// From svcd.toml's `[upstream]`: the credentials file must be root's and readable by root
    /// alone (`user:password` on its first line).
    pub fn from_config(c: &UpstreamProxyConfig) -> Result<Self, String> {
        use std::os::unix::fs::MetadataExt as _;
        let uri: Uri = c
            .url
            .parse()
            .map_err(|e| format!("upstream.proxy {:?}: {e}", c.url))?;
        let auth = match &c.credentials_file {
            None => None,
            Some(path) => {
                let shown = path.display();
                let meta = std::fs::metadata(path)
                    .map_err(|e| format!("upstream.proxy_credentials_file {shown}: {e}"))?;
                if meta.uid() != 0 || meta.mode() & 0o077 != 0 {
                    return Err(format!(
                        "upstream.proxy_credentials_file {shown} must be owned by root and \
                         readable by root alone (chown root {shown}; chmod 600 {shown})"
                    ));
                }
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("upstream.proxy_credentials_file {shown}: {e}"))?;
                let line = text.lines().next().unwrap_or("").trim();
                if !line.contains(':') {
                    return Err(format!(
                        "upstream.proxy_credentials_file {shown}: expected user:password on its first line"
                    ));
                }
                use base64::Engine as _;
                let mut v = HeaderValue::from_str(&format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(line)
                ))
                .map_err(|_| {
                    format!("upstream.proxy_credentials_file {shown}: not a header value")
                })?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        let no_proxy = c
            .no_proxy
            .iter()
            .map(|n| NoProxy::parse(n))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            uri,
            auth,
            no_proxy,
        })
    }

    /// Whether requests to `host` go through the forward proxy.
    pub fn applies_to(&self, host: &str) -> bool {
        !self.no_proxy.iter().any(|n| n.matches(host))
    }
}

/// The connector under the proxy's TLS: direct, a tunnel, or the forward proxy for plain HTTP.
#[derive(Clone)]
pub struct UpstreamConnector<R> {
    direct: HttpConnector<R>,
    via: Option<(Arc<ForwardProxy>, Tunnel<HttpConnector<R>>)>,
    /// The one address a direct connection goes to (a guest's request: the address it dialled,
    /// already checked); `None` resolves the URI's host (svcd's own requests only).
    target: Option<SocketAddr>,
}

/// How long a direct connection to a guest's dialled address may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl<R> UpstreamConnector<R>
where
    R: Clone,
{
    pub fn new(direct: HttpConnector<R>, via: Option<Arc<ForwardProxy>>) -> Self {
        let via = via.map(|p| {
            let mut tunnel = Tunnel::new(p.uri.clone(), direct.clone());
            if let Some(auth) = &p.auth {
                tunnel = tunnel.with_auth(auth.clone());
            }
            (p, tunnel)
        });
        Self {
            direct,
            via,
            target: None,
        }
    }

    /// The same connector, dialling `target` (and nothing else) for direct connections; through
    /// the forward proxy the CONNECT or absolute-form request still names the host.
    pub fn to_address(&self, target: SocketAddr) -> Self {
        Self {
            direct: self.direct.clone(),
            via: self.via.clone(),
            target: Some(target),
        }
    }
}

/// An upstream connection: the TCP stream, and whether requests on it go to a forward proxy
/// (absolute-form) rather than to the server itself.
#[derive(Debug)]
pub struct UpstreamIo {
    io: TokioIo<TcpStream>,
    to_proxy: bool,
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        let c = self.io.connected();
        if self.to_proxy { c.proxy(true) } else { c }
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<R> Service<Uri> for UpstreamConnector<R>
where
    HttpConnector<R>: Service<Uri, Response = TokioIo<TcpStream>> + Clone + Send + 'static,
    <HttpConnector<R> as Service<Uri>>::Future: Send + 'static,
    <HttpConnector<R> as Service<Uri>>::Error: Into<BoxError>,
    R: Send + 'static,
{
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let host = dst.host().unwrap_or("").to_owned();
        match &mut self.via {
            Some((proxy, tunnel)) if proxy.applies_to(&host) => {
                if dst.scheme() == Some(&Scheme::HTTPS) {
                    let fut = tunnel.call(dst);
                    Box::pin(async move {
                        let io = fut.await.map_err(|e| -> BoxError {
                            format!("through the forward proxy: {e}").into()
                        })?;
                        Ok(UpstreamIo {
                            io,
                            to_proxy: false,
                        })
                    })
                } else {
                    let fut = self.direct.call(proxy.uri.clone());
                    Box::pin(async move {
                        let io = fut.await.map_err(Into::into)?;
                        Ok(UpstreamIo { io, to_proxy: true })
                    })
                }
            }
            _ => {
                if let Some(target) = self.target {
                    return Box::pin(async move {
                        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target))
                            .await
                            .map_err(|_| -> BoxError {
                                format!("connecting to {target}: timed out").into()
                            })?
                            .map_err(|e| -> BoxError {
                                format!("connecting to {target}: {e}").into()
                            })?;
                        let _ = tcp.set_nodelay(true);
                        Ok(UpstreamIo {
                            io: TokioIo::new(tcp),
                            to_proxy: false,
                        })
                    });
                }
                let fut = self.direct.call(dst);
                Box::pin(async move {
                    let io = fut.await.map_err(Into::into)?;
                    Ok(UpstreamIo {
                        io,
                        to_proxy: false,
                    })
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_entries_match_like_curls() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "anything.example", true),
            ("example.com", "example.com", true),
            ("example.com", "api.example.com", true),
            ("example.com", "API.Example.COM.", true),
            ("example.com", "notexample.com", false),
            (".example.com", "example.com", true),
            (".example.com", "a.b.example.com", true),
            ("10.0.0.0/8", "10.1.2.3", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("10.0.0.0/8", "ten.example", false),
            ("192.0.2.7", "192.0.2.7", true),
            ("::1", "[::1]", true),
        ];
        for (entry, host, want) in cases {
            let n = NoProxy::parse(entry).expect(entry);
            assert_eq!(n.matches(host), *want, "{entry} vs {host}");
        }
        for bad in ["", "exa mple.com", "a..b", "http://x"] {
            assert!(NoProxy::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_credentials_file_must_be_roots_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("creds");
        std::fs::write(&file, "svc:s3cret\n").expect("write");
        let config = |creds: Option<&std::path::Path>| UpstreamProxyConfig {
            url: "http://proxy.test:3128".into(),
            credentials_file: creds.map(ToOwned::to_owned),
            no_proxy: vec!["internal.test".into()],
        };
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = ForwardProxy::from_config(&config(Some(&file))).expect_err("world-readable");
        assert!(
            e.contains("readable by root alone") && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let fp = ForwardProxy::from_config(&config(Some(&file))).expect("root's");
        assert_eq!(
            fp.auth.as_ref().map(|v| v.as_bytes().to_vec()),
            Some(b"Basic c3ZjOnMzY3JldA==".to_vec())
        );
        assert!(
            format!("{fp:?}").contains("(set)"),
            "the credentials are not in Debug"
        );
        assert!(!fp.applies_to("a.internal.test") && fp.applies_to("example.test"));
        std::fs::write(&file, "no-colon\n").expect("write");
        let e = ForwardProxy::from_config(&config(Some(&file))).expect_err("no colon");
        assert!(e.contains("user:password"), "{e}");
        assert!(
            ForwardProxy::from_config(&config(None))
                .expect("none")
                .auth
                .is_none()
        );
    }
}
