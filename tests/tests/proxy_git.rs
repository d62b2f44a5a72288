//! Git smart-HTTP through the live proxy: real `git` as the guest, a real `git http-backend`
//! (CGI) behind an HTTPS upstream. The bound repository clones and pushes; a foreign one is
//! refused by the perimeter with its rule, on every route.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    process::Command,
    sync::Arc,
};

use hyper::{Request, body::Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use svc_control::{
    audit::{AuditError, AuditRecord, AuditSink},
    config::host,
    policy::{credentials::CredentialKind, request::SandboxPolicy},
    proxy::{Broker, Proxy, ProxyConfig, ProxySandbox, Resolve, Sandboxes, ca::SandboxCa},
};

/// The one sandbox; every connection of it was dialled to the upstream (the fence's
/// `SO_ORIGINAL_DST`, which a connection straight to the proxy does not have).
struct One(Arc<ProxySandbox>, SocketAddr);
impl Sandboxes for One {
    fn sandbox_for(&self, s: IpAddr) -> Option<Arc<ProxySandbox>> {
        s.is_loopback().then(|| self.0.clone())
    }
    fn original_destination(&self, _: &tokio::net::TcpStream) -> Option<SocketAddr> {
        Some(self.1)
    }
}
struct Tokens;
impl Broker for Tokens {
    fn bearer(
        &self,
        _: u32,
        _: &svc_control::policy::credentials::Placeholder,
        _: CredentialKind,
        _: &str,
    ) -> Option<Result<svc_control::creds::Bearer, String>> {
        Some(Ok(svc_control::creds::Bearer::new("real-code-host-token")))
    }
}
/// Upstreams live on 127.0.0.2 (the proxy on 127.0.0.1, same port).
struct Second;
impl Resolve for Second {
    fn resolve(
        &self,
        _: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
    {
        Box::pin(async { Ok(vec!["127.0.0.2".parse().unwrap()]) })
    }
}
struct NoAudit;
impl AuditSink for NoAudit {
    fn record(&self, _: &AuditRecord) -> Result<(), AuditError> {
        Ok(())
    }
}

fn git(args: &[&str], env: &[(&str, String)], dir: &Path) -> std::process::Output {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn smart_http_for_the_bound_repo_only() {
    let dir = svc_tests::fresh_dir("svcgit");
    let root = dir.join("srv");
    std::fs::create_dir_all(root.join("acme")).unwrap();
    std::fs::create_dir_all(root.join("evil")).unwrap();
    for repo in ["acme/widget.git", "evil/exfil.git"] {
        let out = git(&["init", "-q", "--bare", "-b", "main", repo], &[], &root);
        assert!(out.status.success());
        git(
            &["config", "http.receivepack", "true"],
            &[],
            &root.join(repo),
        );
    }
    // Seed the bound repo with one commit.
    let seed = dir.join("seed");
    std::fs::create_dir_all(&seed).unwrap();
    let ident = [
        ("GIT_AUTHOR_NAME", "t".to_string()),
        ("GIT_AUTHOR_EMAIL", "t@t".into()),
        ("GIT_COMMITTER_NAME", "t".into()),
        ("GIT_COMMITTER_EMAIL", "t@t".into()),
    ];
    git(&["init", "-q", "-b", "main"], &[], &seed);
    std::fs::write(seed.join("README"), "hello\n").unwrap();
    git(&["add", "."], &[], &seed);
    assert!(
        git(&["commit", "-qm", "first"], &ident, &seed)
            .status
            .success()
    );
    assert!(
        git(
            &[
                "push",
                "-q",
                root.join("acme/widget.git").to_str().unwrap(),
                "main"
            ],
            &[],
            &seed
        )
        .status
        .success()
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let upstream_ca = SandboxCa::generate("git-upstream-root").unwrap();
    // The same port on 127.0.0.1 (proxy) and 127.0.0.2 (upstream).
    let (port, upstream) = rt.block_on(async {
        loop {
            let p = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = p.local_addr().unwrap().port();
            if let Ok(u) = tokio::net::TcpListener::bind(("127.0.0.2", port)).await {
                return (port, (p, u));
            }
        }
    });
    let (proxy_listener, upstream_listener) = upstream;
    let acceptor =
        tokio_rustls::TlsAcceptor::from(upstream_ca.server_config("code.example.test").unwrap());
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let (root2, seen2) = (root.clone(), seen.clone());
    rt.spawn(async move {
        loop {
            let Ok((c, _)) = upstream_listener.accept().await else {
                continue;
            };
            let (acceptor, root, seen) = (acceptor.clone(), root2.clone(), seen2.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(c).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (root, seen) = (root.clone(), seen.clone());
                    async move {
                        seen.lock().unwrap().push(format!(
                            "{} {} auth={}",
                            req.method(),
                            req.uri().path(),
                            req.headers()
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                        ));
                        Ok::<_, std::convert::Infallible>(svc_tests::git::cgi(root, req).await)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });

    // The sandbox: code host family on this port, bound to acme/widget.
    let host_cfg = host::parse(Path::new("svcd.toml"), &format!("[hosts]\ncode_host = \"code.example.test:{port}\"\ncode_api_host = \"api.code.example.test:{port}\"\ncode_uploads_host = \"uploads.code.example.test:{port}\"\ncode_archive_host = \"archive.code.example.test:{port}\"\n")).unwrap();
    let policy = SandboxPolicy::for_sandbox(
        &host_cfg,
        &[],
        Some(svc_control::config::egress::RepoName::parse("acme/widget").unwrap()),
        Default::default(),
    )
    .unwrap();
    let placeholder = policy
        .placeholders
        .entries()
        .iter()
        .find(|e| e.kind == CredentialKind::CodeHost)
        .unwrap()
        .placeholder
        .expose()
        .to_owned();
    let ca = Arc::new(SandboxCa::generate("git-sandbox").unwrap());
    let ca_pem = dir.join("ca.pem");
    std::fs::write(&ca_pem, ca.ca_pem()).unwrap();
    let mut config = ProxyConfig::with_roots(&[upstream_ca.ca_der()]).unwrap();
    // The upstream is on loopback: the operator's exception opens that class for this test.
    config.network.allow_cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    let proxy = Arc::new(Proxy::new(
        config,
        Arc::new(One(
            Arc::new(ProxySandbox {
                id: 3,
                policy,
                ca,
                incarnation: Default::default(),
            }),
            SocketAddr::from(([127, 0, 0, 2], port)),
        )),
        Arc::new(Tokens),
        Arc::new(Second),
        Arc::new(NoAudit),
    ));
    rt.spawn(proxy.serve(proxy_listener, std::future::pending()));

    let env = [
        ("GIT_SSL_CAINFO", ca_pem.display().to_string()),
        ("GIT_CONFIG_COUNT", "2".into()),
        ("GIT_CONFIG_KEY_0", "http.curloptResolve".into()),
        (
            "GIT_CONFIG_VALUE_0",
            format!("code.example.test:{port}:127.0.0.1"),
        ),
        ("GIT_CONFIG_KEY_1", "http.extraHeader".into()),
        (
            "GIT_CONFIG_VALUE_1",
            format!("Authorization: Bearer {placeholder}"),
        ),
    ];
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let url = |repo: &str| format!("https://code.example.test:{port}/{repo}.git");

    let clone = git(&["clone", "-q", &url("acme/widget"), "widget"], &env, &work);
    assert!(
        clone.status.success(),
        "cloning the bound repo: {}",
        String::from_utf8_lossy(&clone.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(work.join("widget/README")).unwrap(),
        "hello\n"
    );
    let w = work.join("widget");
    std::fs::write(w.join("CHANGE"), "svc\n").unwrap();
    git(&["add", "."], &[], &w);
    assert!(
        git(&["commit", "-qm", "change"], &ident, &w)
            .status
            .success()
    );
    let push = git(
        &["push", "-q", "origin", "HEAD:refs/heads/svc/change"],
        &env,
        &w,
    );
    assert!(
        push.status.success(),
        "pushing to the bound repo: {}",
        String::from_utf8_lossy(&push.stderr)
    );

    let foreign = git(&["clone", "-q", &url("evil/exfil"), "exfil"], &env, &work);
    assert!(!foreign.status.success(), "a foreign repo must not clone");
    let err = String::from_utf8_lossy(&foreign.stderr);
    assert!(
        err.contains("403"),
        "git reports the perimeter's 403: {err}"
    );
    let push_foreign = git(
        &["push", "-q", &url("evil/exfil"), "HEAD:refs/heads/main"],
        &env,
        &w,
    );
    assert!(
        !push_foreign.status.success(),
        "a foreign repo must not take a push"
    );

    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|s| s.contains("/acme/widget.git/")),
        "only the bound repo reached the code host: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|s| s.ends_with("auth=Bearer real-code-host-token")),
        "the real token was swapped in: {seen:?}"
    );
    assert!(
        seen.iter().any(|s| s.contains("git-receive-pack")),
        "the push went through: {seen:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
