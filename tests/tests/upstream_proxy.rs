//! Upstream through the operator's forward proxy: a real tinyproxy (Debian's) in the outside
//! world with Basic credentials, svcd's `[upstream]` pointing at it, and the host's own direct
//! connections to the outside world refused (counted). A sandbox's HTTPS goes through it as a
//! `CONNECT` tunnel (TLS verified end to end with the real host), its plain HTTP as
//! absolute-form requests; a `no_proxy` host is dialled directly; nothing else tries to.

use svc_tests::{require_root, world::World};

fn tinyproxy_log(w: &World) -> String {
    std::fs::read_to_string(w.dir.join("tinyproxy/tinyproxy.log")).unwrap_or_default()
}

/// The requests tinyproxy took and the upstream connections it made, counted from the
/// message part of each log line (the timestamp in front is not searched).
fn requests_and_onward_connections(log: &str) -> (usize, usize) {
    let messages = log
        .lines()
        .filter_map(|l| l.split_once("]: ").map(|(_, m)| m));
    messages.fold((0, 0), |(req, conn), m| {
        (
            req + usize::from(m.starts_with("Request (")),
            conn + usize::from(m.starts_with("Established connection to host")),
        )
    })
}

/// Packets the host sent towards the outside world other than to the DNS server, the proxy and
/// the no_proxy host (the `inet svctest` rule's counter).
fn refused_direct(w: &World) -> u64 {
    let out = w
        .host
        .exec("nft", &["list", "chain", "inet", "svctest", "out"]);
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("packets ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {text}"))
}

#[test]
fn upstreams_are_reached_through_the_operators_forward_proxy() {
    require_root();
    let w = World::start_with_upstream_proxy();
    assert!(
        w.svcd_log()
            .contains("upstream connections go through the operator's forward proxy"),
        "{}",
        w.svcd_log()
    );
    w.sandbox_allowing("up", &["allowed.example.test"]);

    // HTTPS: a CONNECT tunnel through the proxy, TLS end to end with the real host.
    let (code, out, err) = w.sh(
        "up",
        "curl -sS --max-time 20 https://allowed.example.test/through",
    );
    assert_eq!(code, 0, "{out}{err}\n{}", w.svcd_log());
    assert!(
        out.contains("\"served_by\":\"allowed.example.test\""),
        "{out}"
    );
    // Plain HTTP: an absolute-form request to the proxy, with the proxy's credentials.
    let (code, out, err) = w.sh(
        "up",
        "curl -sS --max-time 20 http://allowed.example.test/plain",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("\"path\":\"/plain\""), "{out}");
    // A no_proxy host: dialled directly (the host's rule lets this one through).
    let (code, out, err) = w.sh("up", "curl -sS --max-time 20 https://api.agent.test/direct");
    assert_eq!(code, 0, "{out}{err}");

    let log = tinyproxy_log(&w);
    assert!(
        log.contains("CONNECT allowed.example.test:443"),
        "no CONNECT in the proxy's log:\n{log}"
    );
    assert!(
        log.contains("GET http://allowed.example.test/plain"),
        "no absolute-form request in the proxy's log:\n{log}"
    );
    assert!(
        !log.contains("api.agent.test"),
        "the no_proxy host went through the proxy:\n{log}"
    );
    // tinyproxy logs nothing when it refuses credentials (it answers 407 and moves on), so
    // a refusal shows as a request it never connected onwards.
    let (requests, connected) = requests_and_onward_connections(&log);
    assert_eq!(
        requests, connected,
        "the proxy refused some of svcd's requests (credentials?):\n{log}"
    );
    assert!(requests >= 2, "{log}");
    assert_eq!(
        refused_direct(&w),
        0,
        "svcd tried to reach the outside world around the proxy"
    );

    // The guest's own Proxy-Authorization never reaches the operator's proxy: a guest that
    // sends the wrong one still gets through with svcd's.
    let (code, out, _) = w.sh(
        "up",
        "curl -sS --max-time 20 -H 'Proxy-Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=' http://allowed.example.test/hop",
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"path\":\"/hop\""), "{out}");
    w.destroy_checked("up");
}
