//! The TLS path of a guest connection admitted at the SNI gate: the sandbox CA's leaf for
//! exactly the admitted name, the handshake over the ClientHello already read ([`Rewind`]),
//! then HTTP/1.1 or HTTP/2 (ALPN) served request by request (`exchange`) until the connection
//! ends or a live change cuts it.

use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Request;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto::Builder,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};

use super::{
    config::ProxyConfig,
    context::Conn,
    exchange::exchange,
    h1_frames::{Tracker, Verdict},
    h1_watch::Watched,
    request::Carried,
    revoke::whose,
};
use crate::policy::credentials::Scheme;

/// Terminate TLS for `name` (admitted and bound) on `tcp`, whose first bytes (`hello`) were
/// read already, and serve it.
pub(super) async fn serve(
    conn: Conn,
    tcp: TcpStream,
    hello: Vec<u8>,
    name: String,
    dialled_to: Option<SocketAddr>,
) {
    let Ok(tls) = conn.sandbox.ca.server_config(&name) else {
        return conn.ctx.audit_conn(
            &conn.sandbox,
            format!("could not mint a certificate for {name}"),
        );
    };
    let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls)
        .accept(Rewind::new(hello, tcp))
        .await
    else {
        return;
    };
    // HTTP/1.1: the proxy's own head reader and framing witness (`h1_frames`).
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let (tracker, witness) = Tracker::new(conn.ctx.config.max_head);
    let timeout = conn.ctx.config.header_timeout;
    let stream = Watched::new(stream, (!h2).then_some(tracker), timeout);
    let witness = (!h2).then_some(witness);
    let Conn {
        ctx,
        sandbox,
        source,
        cut,
        slot,
    } = conn;
    let found = sandbox.clone();
    let sni: Arc<str> = Arc::from(name.as_str());
    let served = ctx.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(slot.clone());
        let sandbox = served.current(source, &sandbox);
        let (ctx, sni) = (served.clone(), sni.clone());
        // HTTP/2 has no framing to witness; an HTTP/1.1 head with no verdict is refused.
        let framing = match witness.as_ref() {
            None => Some(Verdict::Framed {
                both_lengths: false,
                upgrade: false,
            }),
            Some(w) => w.next(),
        };
        let witness = witness.clone();
        // Boxed: hyper moves a service's future several times on its way into the task
        // that runs it (HTTP/2: a task per stream), and a request's is kilobytes.
        Box::pin(async move {
            let upgrade = matches!(framing, Some(Verdict::Framed { upgrade: true, .. }));
            let connect = req.method() == http::Method::CONNECT;
            let carried = Carried {
                scheme: Scheme::Https,
                sni: Some(&*sni),
                framing: framing.as_ref(),
                dialled_port: dialled_to.map(|a| a.port()),
            };
            let answer = exchange(&ctx, &sandbox, carried, dialled_to, req).await;
            if let (true, Some(w)) = (upgrade, witness) {
                w.answered(hands_over(connect, &answer));
            }
            Ok::<_, Infallible>(answer)
        })
    });
    let builder = builder(&ctx.config);
    // With upgrades: a WebSocket handshake hands its connection over to the relay. Cut when
    // its address leaves the sandbox, or its name does (every stream on it is for the name).
    let serve = async {
        let _ = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .await;
    };
    let sni_name = name.clone();
    let dialled = dialled_to.map(|a| a.ip().to_canonical());
    let was_cut = cut
        .serve(
            serve,
            ctx.sandboxes.clone(),
            whose(&found),
            dialled,
            move || Some(sni_name.clone()),
        )
        .await;
    if let Some(why) = was_cut {
        ctx.audit_cut(&found, "TLS", Some(name), why);
    }
}

/// HTTP/1.1 and HTTP/2 as the proxy serves them to guests: the head's time and size bounded,
/// HTTP/2 kept alive by pings within the head's time.
fn builder(config: &ProxyConfig) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .max_buf_size(hyper_buffer(config.max_head));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(config.header_timeout)
        .keep_alive_timeout(config.header_timeout)
        .max_header_list_size(u32::try_from(config.max_head).unwrap_or(u32::MAX));
    builder
}

/// hyper's HTTP/1.1 read buffer: room for the largest head the witness hands on (`max_head`,
/// re-serialised: a few bytes more per header line) with the body's first bytes behind it.
pub(super) fn hyper_buffer(max_head: usize) -> usize {
    max_head.max(8192) + 8192
}

/// hyper hands the connection over after `answer` (a 101, or a 2xx to `CONNECT`): the
/// witness's bytes are the upgraded stream's from then on.
pub(super) fn hands_over<B>(connect: bool, answer: &http::Response<B>) -> bool {
    let status = answer.status();
    status == http::StatusCode::SWITCHING_PROTOCOLS || (connect && status.is_success())
}

/// A stream that replays the bytes already read (the ClientHello) before the socket's.
pub(super) struct Rewind {
    prefix: Vec<u8>,
    pos: usize,
    inner: TcpStream,
}

impl Rewind {
    /// `inner`, read from after `prefix`.
    pub(super) fn new(prefix: Vec<u8>, inner: TcpStream) -> Self {
        Self {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    // Vectored, as the socket is: TLS hands over each record as its own slice, and without
    // this every record (three in the server's first flight) would be its own send.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// TLS hands the socket a flight of records as separate slices: all of them go in one
    /// write, not just the first (the default of `poll_write_vectored`).
    #[tokio::test]
    async fn rewind_writes_every_slice_of_a_vectored_write_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut client, (server, _)) = (client.unwrap(), accepted.unwrap());
        let mut rewind = Rewind::new(Vec::new(), server);
        assert!(rewind.is_write_vectored());
        let slices = [
            io::IoSlice::new(b"server hello;"),
            io::IoSlice::new(b"change cipher spec;"),
            io::IoSlice::new(b"finished"),
        ];
        let n = rewind.write_vectored(&slices).await.unwrap();
        assert_eq!(n, slices.iter().map(|s| s.len()).sum::<usize>());
        rewind.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"server hello;change cipher spec;finished");
    }
}
