//! The outside world of the end-to-end tests and the demo, run inside its own network
//! namespace: an authoritative DNS server for the test names and one HTTPS server per name
//! (certificates from a test CA whose certificate it writes for svcd's `proxy.extra_roots`).
//! Paths `/OWNER/REPO.git/…` are served by `git http-backend`; everything else gets a small
//! JSON answer. Every DNS question and HTTP request is logged to `DIR/received.jsonl`, so
//! tests can prove what reached the outside (and what never did); a request answered with that
//! small JSON answer logs its body too once read (`http-body`: whole or aborted, its size,
//! whether a placeholder-shaped run was in it).
//!
//! ```text
//! outside-world --dir DIR --dns 192.0.2.53 --git-root DIR --token SECRET \
//!     --serve api.agent.test=192.0.2.10 --serve code.test=192.0.2.11 … \
//!     --name db.example.test=192.0.2.20 …
//! ```
//!
//! `--name` names are answered by the DNS server only: an address another name's servers
//! hold, as names behind one load balancer share it. A name given several times (with
//! `--serve` and `--name`) is answered with all its addresses, `--name` ones first: A records
//! for the IPv4 ones, AAAA for the IPv6 ones — which is how a test plays a hostile resolver
//! answering an allowed name with loopback or metadata addresses besides its public one.
//!
//! `POST /v1/oauth/token` on any name is an OAuth token endpoint (the refresh grant): it takes
//! only the current refresh token (`rt-0` first), answers with `access-N` and `rt-N` valid for
//! 8 hours (20 seconds for `client_id=short-lived`; N counts the refreshes it granted), and
//! refuses a used or unknown refresh token with 400 `invalid_grant`, as a provider with
//! rotating refresh tokens does. The access tokens it issued count as real credentials.
//!
//! Two paths stream, for tests that hold a connection open: `/drip` answers with `tick N` lines,
//! one every 100 ms, 300 in all; `/ws-drip` is a WebSocket that sends the same lines as text
//! frames; `/ws-hold` is a WebSocket that sends nothing and stays open until its client goes;
//! `/ws-echo-headers` is a WebSocket whose one frame is the handshake's headers.
//! `/echo/headers` answers with the request's headers in its body, as httpbin's
//! `/headers` does (the Authorization a proxy sent among them).
//!
//! `DIR/ready` appears when everything listens.

use std::{
    collections::HashMap,
    io::Write as _,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use hickory_proto::{
    op::{Message, MessageType, ResponseCode},
    rr::{
        RData, Record, RecordType,
        rdata::{A, AAAA},
    },
};
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, body::Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use svc_control::proxy::ca::SandboxCa;

struct World {
    names: HashMap<String, Vec<IpAddr>>,
    log: Mutex<std::fs::File>,
    git_root: PathBuf,
    tokens: Vec<String>,
    /// Refreshes the token endpoint granted.
    refreshes: Mutex<u32>,
}

impl World {
    /// Whether `bearer` is an access token the token endpoint issued.
    fn issued(&self, bearer: &str) -> bool {
        let n = *self
            .refreshes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        bearer
            .strip_prefix("access-")
            .and_then(|k| k.parse::<u32>().ok())
            .is_some_and(|k| (1..=n).contains(&k))
    }

    fn log(&self, v: serde_json::Value) {
        if let Ok(mut f) = self.log.lock() {
            let _ = writeln!(f, "{v}");
        }
    }
}

fn arg_values(args: &[String], flag: &str) -> Vec<String> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].clone())
        .collect()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let one = |flag: &str| {
        arg_values(&args, flag)
            .pop()
            .unwrap_or_else(|| panic!("outside-world: {flag} is required"))
    };
    let dir = PathBuf::from(one("--dir"));
    std::fs::create_dir_all(&dir).expect("dir");
    let dns: IpAddr = one("--dns").parse().expect("--dns IP");
    let name_ip = |s: &str| {
        let (name, ip) = s.split_once('=').expect("--serve/--name NAME=IP");
        (name.to_owned(), ip.parse::<IpAddr>().expect("IP"))
    };
    let served: Vec<(String, IpAddr)> = arg_values(&args, "--serve")
        .iter()
        .map(|s| name_ip(s))
        .collect();
    let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
    // `--name` addresses first: a hostile answer leads with the address it wants dialled.
    for (name, ip) in arg_values(&args, "--name")
        .iter()
        .map(|s| name_ip(s))
        .chain(served.iter().cloned())
    {
        names.entry(name).or_default().push(ip);
    }
    let world = Arc::new(World {
        names,
        log: Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("received.jsonl"))
                .expect("log"),
        ),
        git_root: PathBuf::from(one("--git-root")),
        tokens: arg_values(&args, "--token"),
        refreshes: Mutex::new(0),
    });
    let ca = Arc::new(SandboxCa::generate("outside-world test").expect("CA"));
    std::fs::write(dir.join("ca.pem"), ca.ca_pem()).expect("ca.pem");

    let udp = tokio::net::UdpSocket::bind(SocketAddr::new(dns, 53))
        .await
        .expect("bind DNS");
    tokio::spawn(serve_dns(world.clone(), udp));
    for (name, ip) in served {
        // Plain HTTP on port 80 too, same handler.
        let plain = tokio::net::TcpListener::bind(SocketAddr::new(ip, 80))
            .await
            .unwrap_or_else(|e| panic!("bind {ip}:80: {e}"));
        let (w80, n80) = (world.clone(), name.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = plain.accept().await else {
                    continue;
                };
                // As real servers do (nginx's tcp_nodelay, Go's default): with Nagle on, a new
                // HTTP/2 connection's small frames can wait out the client's delayed ACK (40 ms).
                let _ = tcp.set_nodelay(true);
                let (world, name) = (w80.clone(), n80.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (world, name) = (world.clone(), name.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                answer(&world, &name, "http", req).await,
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 443))
            .await
            .unwrap_or_else(|e| panic!("bind {ip}:443: {e}"));
        let tls = tokio_rustls::TlsAcceptor::from(ca.server_config(&name).expect("leaf"));
        let world = world.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let (tls, world, name) = (tls.clone(), world.clone(), name.clone());
                tokio::spawn(async move {
                    let Ok(stream) = tls.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let (world, name) = (world.clone(), name.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                answer(&world, &name, "https", req).await,
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    }
    std::fs::write(dir.join("ready"), b"").expect("ready");
    std::future::pending::<()>().await;
}

type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// The streaming and echoing paths (see the module's documentation), else [`handle`].
async fn answer(
    world: &World,
    name: &str,
    scheme: &str,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let ticks = || {
        futures::stream::unfold(0u32, |n| async move {
            if n >= 300 {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            Some((format!("tick {n}\n"), n + 1))
        })
    };
    match req.uri().path() {
        "/drip" => {
            log_request(world, name, scheme, &req);
            use futures::StreamExt as _;
            let frames = ticks().map(|t| Ok(hyper::body::Frame::data(Bytes::from(t))));
            Response::new(http_body_util::StreamBody::new(frames).boxed_unsync())
        }
        "/ws-drip" => {
            log_request(world, name, scheme, &req);
            websocket(&mut req, move |mut ws| async move {
                use futures::{SinkExt as _, StreamExt as _};
                let mut ticks = std::pin::pin!(ticks());
                while let Some(t) = ticks.next().await {
                    if ws
                        .send(tokio_tungstenite::tungstenite::Message::text(t))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                let _ = ws.close(None).await;
            })
        }
        "/ws-hold" => {
            log_request(world, name, scheme, &req);
            websocket(&mut req, move |mut ws| async move {
                use futures::StreamExt as _;
                while let Some(Ok(_)) = ws.next().await {}
            })
        }
        "/ws-echo-headers" => {
            log_request(world, name, scheme, &req);
            ws_echo_headers(req)
        }
        "/echo/headers" => {
            log_request(world, name, scheme, &req);
            let body = headers_json(&req);
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(format!("{body}\n"))).boxed_unsync())
                .unwrap_or_default()
        }
        path if path.starts_with("/slow/") => {
            // `/slow/SECS/…`: answered as any request, SECS (at most 30) seconds late.
            let secs: u64 = path
                .split('/')
                .nth(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            log_request(world, name, scheme, &req);
            tokio::time::sleep(std::time::Duration::from_secs(secs.min(30))).await;
            handle(world, name, scheme, req)
                .await
                .map(|b| b.boxed_unsync())
        }
        _ => handle(world, name, scheme, req)
            .await
            .map(|b| b.boxed_unsync()),
    }
}

/// `/ws-echo-headers`: a WebSocket whose one text frame is the handshake's headers as JSON (the
/// Authorization a proxy sent among them), as a debugging endpoint of a real service might.
fn ws_echo_headers(mut req: Request<Incoming>) -> Response<Body> {
    let text = headers_json(&req).to_string();
    websocket(&mut req, |mut ws| async move {
        use futures::SinkExt as _;
        let _ = ws
            .send(tokio_tungstenite::tungstenite::Message::text(text))
            .await;
        let _ = ws.close(None).await;
    })
}

/// The server's side of a WebSocket.
type Ws = tokio_tungstenite::WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Agree to `req`'s WebSocket handshake (the 101), and `serve` the socket once upgraded.
fn websocket<F, Fut>(req: &mut Request<Incoming>, serve: F) -> Response<Body>
where
    F: FnOnce(Ws) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let key = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| tokio_tungstenite::tungstenite::handshake::derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
    let on = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(io) = on.await else { return };
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(io),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        serve(ws).await;
    });
    switching(&key)
}

/// `{"headers": {name: value, …}}` of a request, as httpbin's `/headers` answers.
fn headers_json(req: &Request<Incoming>) -> serde_json::Value {
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into(),
            )
        })
        .collect();
    serde_json::json!({ "headers": headers })
}

/// The 101 that agrees to a WebSocket handshake whose accept key is `key`.
fn switching(key: &str) -> Response<Body> {
    Response::builder()
        .status(101)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", key)
        .body(Full::new(Bytes::new()).boxed_unsync())
        .unwrap_or_default()
}

/// The log line of a request the streaming and echoing paths answer.
fn log_request(world: &World, name: &str, scheme: &str, req: &Request<Incoming>) {
    world.log(serde_json::json!({
        "kind": "http",
        "scheme": scheme,
        "host": name,
        "method": req.method().as_str(),
        "path": req.uri().path(),
    }));
}

async fn handle(
    world: &World,
    name: &str,
    scheme: &str,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bearer = auth.strip_prefix("Bearer ").unwrap_or("");
    let credential = if bearer.is_empty() {
        "none"
    } else if world.tokens.iter().any(|t| t == bearer) || world.issued(bearer) {
        "real"
    } else if bearer.len() == 64 && bearer.bytes().all(|b| b.is_ascii_hexdigit()) {
        "placeholder"
    } else {
        "other"
    };
    let path = req.uri().path().to_owned();
    world.log(serde_json::json!({
        "kind": "http",
        "scheme": scheme,
        "host": name,
        "method": req.method().as_str(),
        "path": path,
        "authorization": auth,
        "credential": credential,
    }));
    println!(
        "  [{name}] {} {path}  Authorization: {}",
        req.method(),
        if auth.is_empty() { "(none)" } else { &auth }
    );
    let is_git = path
        .split('/')
        .nth(2)
        .is_some_and(|repo| repo.ends_with(".git"));
    if is_git {
        return svc_tests::git::cgi(world.git_root.clone(), req).await;
    }
    if path == "/v1/oauth/token" && req.method() == hyper::Method::POST {
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return token_endpoint(world, &body);
    }
    log_body(world, name, &path, req.into_body()).await;
    let body = serde_json::json!({
        "served_by": name,
        "path": path,
        "credential_received": credential,
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{body}\n"))))
        .unwrap_or_default()
}

/// Read a request's body and log what came of it (`http-body`): whether it ended whole (an
/// aborted upload does not), its bytes, and whether a placeholder-shaped run (64 hex digits)
/// was among them.
async fn log_body(world: &World, name: &str, path: &str, mut body: Incoming) {
    let mut got = Vec::new();
    let complete = loop {
        match body.frame().await {
            None => break true,
            Some(Err(_)) => break false,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    got.extend_from_slice(data);
                }
            }
        }
    };
    let hex64 = got
        .split(|b| !b.is_ascii_hexdigit())
        .any(|run| run.len() >= 64);
    world.log(serde_json::json!({
        "kind": "http-body",
        "host": name,
        "path": path,
        "complete": complete,
        "bytes": got.len(),
        "hex64": hex64,
    }));
}

/// The refresh grant with rotating refresh tokens (see the module's documentation).
fn token_endpoint(world: &World, body: &[u8]) -> Response<Full<Bytes>> {
    let form: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    let answer = |status: u16, v: serde_json::Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())))
            .unwrap_or_default()
    };
    let mut n = world
        .refreshes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let current = format!("rt-{n}");
    if form.get("grant_type").map(String::as_str) != Some("refresh_token")
        || form.get("refresh_token") != Some(&current)
    {
        world.log(serde_json::json!({"kind": "token", "granted": false,
            "refresh_token": form.get("refresh_token")}));
        return answer(
            400,
            serde_json::json!({"error": "invalid_grant", "error_description": "refresh token used or unknown"}),
        );
    }
    *n += 1;
    world.log(
        serde_json::json!({"kind": "token", "granted": true, "n": *n,
        "client_id": form.get("client_id")}),
    );
    answer(
        200,
        serde_json::json!({"access_token": format!("access-{n}"), "refresh_token": format!("rt-{n}"),
            "token_type": "Bearer",
            "expires_in": if form.get("client_id").map(String::as_str) == Some("short-lived") { 20 } else { 28800 }}),
    )
}

/// Names the outside world answers: each known name, and `slow-NAME` as NAME 1.5 s late.
async fn serve_dns(world: Arc<World>, sock: tokio::net::UdpSocket) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut answer = Message::response(query.metadata.id, query.metadata.op_code);
        answer.metadata.message_type = MessageType::Response;
        answer.metadata.authoritative = true;
        answer.metadata.recursion_desired = query.metadata.recursion_desired;
        answer.metadata.recursion_available = true;
        let mut code = ResponseCode::NXDomain;
        let mut late = false;
        for q in &query.queries {
            answer.add_query(q.clone());
            let name = q.name.to_ascii().trim_end_matches('.').to_ascii_lowercase();
            world.log(
                serde_json::json!({"kind": "dns", "name": name, "type": q.query_type.to_string()}),
            );
            let name = match name.strip_prefix("slow-") {
                Some(known) => {
                    late = true;
                    known.to_owned()
                }
                None => name,
            };
            if let Some(ips) = world.names.get(&name) {
                code = ResponseCode::NoError;
                for ip in ips {
                    let rdata = match (q.query_type, ip) {
                        (RecordType::A, IpAddr::V4(v4)) => RData::A(A(*v4)),
                        (RecordType::AAAA, IpAddr::V6(v6)) => RData::AAAA(AAAA(*v6)),
                        _ => continue,
                    };
                    answer.add_answer(Record::from_rdata(q.name.clone(), 60, rdata));
                }
            }
        }
        answer.metadata.response_code = code;
        let Ok(bytes) = answer.to_vec() else {
            continue;
        };
        if late {
            let sock = sock.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                let _ = sock.send_to(&bytes, from).await;
            });
        } else {
            let _ = sock.send_to(&bytes, from).await;
        }
    }
}
