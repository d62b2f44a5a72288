//! The proxy dials only the address the guest dialled. svcd's resolver (the outside world's
//! DNS server, svcd's `[dns] upstreams`) turns hostile: it answers allowed names with the
//! host's own addresses — loopback, the cloud metadata address, an address of the sandbox pool,
//! the host's address, svcd's own metrics port — ahead of each name's public address, in A and
//! AAAA records. The DNS guard hands the guest the public address only; the proxy must then
//! connect to that address and nothing else. Listeners planted on the hostile addresses in the
//! host's namespace count what they accept (nothing), over plain HTTP, HTTPS (HTTP/1.1),
//! HTTP/2 and a WebSocket handshake from real container and microvm sandboxes, while the same requests to
//! the names' public servers still work and their audit records name the address dialled.

use std::net::SocketAddr;

use svc_tests::{
    require_root,
    servers::TcpServer,
    world::{World, microvm_images},
};

/// What a planted listener answers, should anything reach it.
const PLANTED: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nplanted";

/// Names the outside world serves (their public addresses).
const SERVED: &[(&str, &str)] = &[
    ("loop.hostile.test", "192.0.2.31"),
    ("meta.hostile.test", "192.0.2.32"),
    ("pool.hostile.test", "192.0.2.33"),
    ("host.hostile.test", "192.0.2.34"),
    ("metrics.hostile.test", "192.0.2.35"),
];

/// The hostile resolver's extra answers, given ahead of the public address. `v6.hostile.test`
/// has only the DNS server's address besides (nothing listens there on 80 or 443), so a proxy
/// that resolved the name again would fall back to its AAAA answers.
const HOSTILE: &[(&str, &str)] = &[
    ("loop.hostile.test", "127.0.0.1"),
    ("loop.hostile.test", "::1"),
    ("meta.hostile.test", "169.254.169.254"),
    ("meta.hostile.test", "fd00:ec2::254"),
    ("pool.hostile.test", "10.203.250.2"),
    ("host.hostile.test", "192.0.2.1"),
    ("host.hostile.test", "::ffff:192.0.2.1"),
    ("metrics.hostile.test", "127.0.0.1"),
    ("v6.hostile.test", "192.0.2.53"),
    ("v6.hostile.test", "::1"),
    ("v6.hostile.test", "::ffff:127.0.0.1"),
];

/// Where listeners are planted in the host's namespace (ports 80 and 443 each).
const PLANTED_ON: &[&str] = &[
    "127.0.0.1",
    "::1",
    "169.254.169.254",
    "fd00:ec2::254",
    "10.203.250.2",
    "192.0.2.1",
];

/// The four kinds of request, as curl commands for `URL`'s scheme and host.
fn requests(name: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "plain HTTP",
            format!("curl -sS --max-time 20 http://{name}/plain"),
        ),
        (
            "HTTPS (HTTP/1.1)",
            format!("curl -sS --max-time 20 --http1.1 https://{name}/tls"),
        ),
        (
            "HTTP/2",
            format!("curl -sS --max-time 20 --http2 https://{name}/h2"),
        ),
        (
            "WebSocket handshake",
            format!(
                "curl -sS --max-time 20 --http1.1 -H 'Connection: Upgrade' \
                 -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' \
                 -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' https://{name}/ws"
            ),
        ),
    ]
}

#[test]
fn hostile_dns_never_steers_the_proxy_to_the_hosts_own_addresses() {
    require_root();
    hostile_dns("hostile", "container");
}

/// The same from inside a microvm sandbox: its tap carries the fence and the proxy's original
/// destination as a container's veth does.
#[test]
fn hostile_dns_never_steers_the_proxy_from_a_microvm_sandbox() {
    require_root();
    let _ = microvm_images();
    hostile_dns("hostilev", "microvm");
}

/// Planted listeners, a sandbox `name` on `backend` allowed every served name, each kind of
/// request to each name; nothing reaches a planted listener and every public server answers.
fn hostile_dns(name: &str, backend: &str) {
    let w = World::start_with_dns(SERVED, HOSTILE);
    // The metadata address and a sandbox-pool address exist on the host (as on a cloud VM, and
    // as another sandbox's would be reachable from it), so a dial to them would connect. (On
    // `lo`: this kernel may have no dummy links.)
    for args in [
        ["addr", "add", "169.254.169.254/32", "dev", "lo"],
        ["addr", "add", "10.203.250.2/32", "dev", "lo"],
        ["addr", "add", "fd00:ec2::254/128", "dev", "lo"],
    ] {
        let out = w.host.exec("ip", &args);
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }
    let planted: Vec<(SocketAddr, TcpServer)> = PLANTED_ON
        .iter()
        .flat_map(|a| [80, 443].map(|p| SocketAddr::new(a.parse().expect("address"), p)))
        .map(|at| (at, TcpServer::start(&w.host, at, PLANTED)))
        .collect();
    let mut create = vec!["sandbox", "create", name, "--backend", backend];
    for (name, _) in SERVED {
        create.extend(["--allow-host", name]);
    }
    create.extend([
        "--allow-host",
        "v6.hostile.test",
        "--allow-host",
        "metrics.hostile.test:9464",
    ]);
    w.svc_ok(&create);

    // The names' public servers answer every kind of request.
    for (host, public) in SERVED {
        for (kind, cmd) in requests(host) {
            let (code, out, err) = w.sh(name, &cmd);
            assert!(
                code == 0 && out.contains(&format!("\"served_by\":\"{host}\"")),
                "{kind} to {host} did not reach its public server {public}: {code} {out}{err}\n{}",
                w.svcd_log()
            );
        }
    }
    // A name whose public address has no server: the request fails, and goes nowhere else.
    for (kind, cmd) in requests("v6.hostile.test") {
        let (_, out, _) = w.sh(name, &cmd);
        assert!(!out.contains("planted"), "{kind}: {out}");
    }
    // svcd's own metrics port, through a name allowed on that port: never svcd's answer.
    let (_, out, err) = w.sh(
        name,
        "curl -sS --max-time 20 http://metrics.hostile.test:9464/metrics",
    );
    assert!(
        !out.contains("svc_") && !out.contains("# HELP"),
        "svcd's metrics reached the guest: {out}{err}"
    );

    // Checked from the listeners' side: not one connection reached them.
    let reached: Vec<String> = planted
        .iter()
        .filter(|(_, l)| l.count() > 0)
        .map(|(at, l)| format!("{at} accepted {}", l.count()))
        .collect();
    assert!(
        reached.is_empty(),
        "the proxy dialled the hostile answers: {reached:?}\n{}",
        w.svcd_log()
    );

    // And they were listening all along: each accepts a connection from the host now.
    for (at, listener) in &planted {
        let connected = w
            .host
            .run(|| std::net::TcpStream::connect_timeout(at, std::time::Duration::from_secs(5)));
        assert!(connected.is_ok(), "{at}: {connected:?}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while listener.count() == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(listener.count(), 1, "{at} was not listening");
    }

    // Each allowed request's audit record names the public address it was dialled at.
    let audit = w.audit();
    for (host, public) in SERVED.iter().filter(|(n, _)| *n != "metrics.hostile.test") {
        let dialled: Vec<&str> = audit
            .iter()
            .filter(|r| r["host"] == *host && r["decision"] == "allow")
            .filter_map(|r| r["dialled"].as_str())
            .collect();
        let mut want = vec![format!("{public}:80")];
        want.extend(std::iter::repeat_n(format!("{public}:443"), 3));
        assert_eq!(dialled, want, "{host}'s records: {audit:#?}");
    }
    w.destroy_checked(name);
}
