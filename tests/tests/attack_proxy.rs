//! A hostile guest against the proxy after its redesign into stages (issue 30): raw bytes from
//! inside a real container sandbox behind the real svcd (`attack/guest.py`: its own TLS
//! ClientHello framing, its own request heads), against the outside world's servers.
//!
//! Every case's request path says what must become of it: `/ok-…` must reach the outside world
//! (the legitimate neighbour of an attack), `/deny-…` must never reach it, `/abort-…` may reach
//! it only cut short (its body never complete, no placeholder-shaped run in what came), `/any-…`
//! may (its answer is only shown). Besides each case's expected status: no real token ever reaches the
//! outside world on a path that is not `/ok-…`, and none ever reaches the guest.

use serde_json::{Value, json};
use svc_tests::{
    require_root,
    world::{EXAMPLE_TOKEN, World},
};

/// Where the cases go and what they send.
#[path = "attack/forms.rs"]
mod forms;
/// Framing and plain-HTTP cases.
#[path = "attack/framing.rs"]
mod framing;
/// HTTPS cases.
#[path = "attack/https.rs"]
mod https;

use forms::{ALLOWED, FORBIDDEN, OTHER, head, tls, ws_headers};
use framing::plain_cases;
use https::https_cases;

/// The guest's client (see its header).
const GUEST_PY: &str = include_str!("attack/guest.py");

/// `bytes` as hex digits.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Write `bytes` to `path` in sandbox `name`.
fn put(w: &World, name: &str, path: &str, bytes: &[u8]) {
    let script = format!(
        "python3 -c 'import sys; open(sys.argv[1], \"wb\").write(bytes.fromhex(sys.argv[2]))' {path} {}",
        hex(bytes)
    );
    let (code, _, err) = w.sh(name, &script);
    assert_eq!(code, 0, "writing {path} in {name}: {err}");
}

/// Copy the guest's client into sandbox `name` as `/tmp/guest.py`.
fn install_guest(w: &World, name: &str) {
    put(w, name, "/tmp/guest.py", GUEST_PY.as_bytes());
}

/// Run `cases` in sandbox `name`; one result object per case, by case name.
fn attack(w: &World, name: &str, cases: &[Value]) -> Vec<Value> {
    put(
        w,
        name,
        "/tmp/cases.json",
        Value::from(cases).to_string().as_bytes(),
    );
    let (code, out, err) = w.sh(name, "python3 /tmp/guest.py /tmp/cases.json");
    assert_eq!(code, 0, "the guest's client failed: {err}\n{out}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A sandbox allowing allowed.example.test (with its secret), other.attack.test and
/// db.example.test (allowed.example.test's address); the guest's client installed; its
/// placeholder.
fn hostile_sandbox(w: &World, name: &str) -> String {
    let secret = "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:EXAMPLE";
    let args = [
        "sandbox",
        "create",
        "--allow-host",
        ALLOWED,
        "--allow-host",
        OTHER.0,
        "--allow-host",
        "db.example.test",
        "--secret",
        secret,
        name,
    ];
    let out = w.svc_env(&args, &[("EXAMPLE", EXAMPLE_TOKEN)]);
    assert!(out.status.success(), "{out:?}\n{}", w.svcd_log());
    install_guest(w, name);
    let (_, p, _) = w.sh(name, "printf %s \"$SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\"");
    assert_eq!(p.len(), 64, "{p}");
    p
}

/// What did not go as the cases expected, and what the outside world saw that it must not.
fn judge(w: &World, cases: &[(Value, Vec<u16>)], results: &[Value]) -> Vec<String> {
    let mut wrong = Vec::new();
    for ((case, want), got) in cases.iter().zip(results) {
        let status = got["status"].as_u64().unwrap_or(0) as u16;
        let name = case["case"].as_str().unwrap_or("?");
        let answer = got["answer"].as_str().unwrap_or("");
        eprintln!("{name:45} {status:3} {:?}", got["statuses"]);
        if !want.contains(&status) {
            wrong.push(format!(
                "{name}: status {status}, wanted one of {want:?}: {got}"
            ));
        }
        if let Some(all) = case.get("expect_statuses")
            && got["statuses"] != *all
        {
            wrong.push(format!(
                "{name}: statuses {}, wanted {all}: {got}",
                got["statuses"]
            ));
        }
        if answer.contains(EXAMPLE_TOKEN) {
            wrong.push(format!(
                "{name}: the real token reached the guest: {answer}"
            ));
        }
        // A refusal is the perimeter's: its JSON, never a bare parser error or a close.
        if (400..500).contains(&status) && !answer.contains("svc egress perimeter") {
            wrong.push(format!(
                "{name}: refused ({status}) without the perimeter's answer: {answer}"
            ));
        }
    }
    for r in w.received().iter().filter(|r| r["kind"] == "http") {
        let path = r["path"].as_str().unwrap_or("");
        if path.starts_with("/deny") {
            wrong.push(format!("a refused request reached the outside world: {r}"));
        }
        if r["credential"] == "real" && !path.starts_with("/ok") {
            wrong.push(format!(
                "the real token went out on a request not meant to carry it: {r}"
            ));
        }
        if r["host"] == FORBIDDEN {
            wrong.push(format!("the forbidden host was reached: {r}"));
        }
    }
    wrong.extend(cut_short(w));
    wrong
}

/// `/abort-…` requests reach the outside world only cut short: each head that came is followed
/// by its body's record (`http-body`, written when the body ends or breaks off), which did not
/// end whole and held no placeholder-shaped run (64 hex digits).
fn cut_short(w: &World) -> Vec<String> {
    let aborts = |received: &[Value], kind: &str| -> Vec<Value> {
        received
            .iter()
            .filter(|r| {
                r["kind"] == kind && r["path"].as_str().is_some_and(|p| p.starts_with("/abort"))
            })
            .cloned()
            .collect()
    };
    // A body's record comes once the proxy's abort reaches the outside world.
    let mut received = w.received();
    for _ in 0..50 {
        if aborts(&received, "http-body").len() >= aborts(&received, "http").len() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        received = w.received();
    }
    let (heads, bodies) = (aborts(&received, "http"), aborts(&received, "http-body"));
    let mut wrong = Vec::new();
    if bodies.len() < heads.len() {
        wrong.push(format!(
            "{} /abort heads reached the outside world, {} body records: {heads:?}",
            heads.len(),
            bodies.len()
        ));
    }
    for b in &bodies {
        if b["complete"] != false {
            wrong.push(format!(
                "an aborted request reached the outside world whole: {b}"
            ));
        }
        if b["hex64"] != false {
            wrong.push(format!("the placeholder reached the outside world: {b}"));
        }
    }
    wrong
}

/// Every SNI / Host / authority / credential / framing / upgrade form of the brief, over TLS
/// and plain HTTP, from one hostile guest: the cases of `finding` (`None`: those that held).
fn hostile_forms(finding: Option<&str>) {
    let w = World::start_with_dns(&[OTHER], &[]);
    let p = hostile_sandbox(&w, "atk");
    let mut cases = https_cases(&p);
    cases.extend(plain_cases(&p));
    cases.retain(|(c, _)| c["finding"].as_str() == finding);
    let values: Vec<Value> = cases.iter().map(|(c, _)| c.clone()).collect();
    let results = attack(&w, "atk", &values);
    assert_eq!(results.len(), cases.len(), "{results:#?}");
    let mut wrong = judge(&w, &cases, &results);
    for r in w.audit().iter().filter(|r| r["decision"] == "deny") {
        eprintln!("audit: {} {} {}", r["status"], r["path"], r["rule"]);
    }
    if finding.is_none() {
        wrong.extend(held_extras(&w));
    }
    if finding == Some("unanswered-refusal") {
        // Each refused head leaves a record of the perimeter's refusal.
        let records = w
            .audit()
            .iter()
            .filter(|r| r["decision"] == "deny" && r["rule"] == "request-malformed")
            .count();
        if records < cases.len() {
            wrong.push(format!(
                "{records} request-malformed records for {} refused heads",
                cases.len()
            ));
        }
    }
    w.destroy_checked("atk");
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The forms that held when this file was written, and the neighbours that must work.
#[test]
fn a_hostile_guests_request_forms_are_refused_or_stay_bound() {
    require_root();
    hostile_forms(None);
}

/// FINDING: the framing witness (`h1_frames`) stops at a refused upgrade or CONNECT and the
/// connection goes on: a later request with both Content-Length and Transfer-Encoding is
/// forwarded (re-framed by hyper) instead of refused.
#[test]
fn smuggling_shapes_are_refused_after_a_refused_upgrade_or_connect() {
    require_root();
    hostile_forms(Some("framing-witness"));
}

/// FINDING (fixed: the proxy reads each head itself, `proxy::h1_head`). Heads hyper rejects
/// itself (`Transfer-Encoding: chunked, identity`, `xchunked`, a space before the colon,
/// obs-fold) got hyper's bare 400 (no perimeter answer, no audit record), and HTTP/2 with prior
/// knowledge on port 80 no answer at all. Each is now the perimeter's 400 (its JSON body) with
/// an audit record naming what was wrong.
#[test]
fn every_refusal_is_the_perimeters_answer() {
    require_root();
    hostile_forms(Some("unanswered-refusal"));
}

/// FINDING (fixed as far as streaming allows): a placeholder in a trailer, or past the body's
/// first 64 KiB, went to another host unrefused (the credential rules read the head and the
/// body's prefix only). The body past its prefix is now scanned as it streams: both are refused
/// 403 and audited `credential-leak`, and what the outside world gets is an aborted request:
/// never the placeholder (no byte of it leaves: bytes that could begin one wait for what follows
/// them), never a complete request (the upstream request is cut off mid-body). The head and the
/// body before the placeholder do reach it: holding every body whole until its end would be
/// unbounded memory, so the rule checked here is that, not "nothing reaches it".
#[test]
fn a_placeholder_sent_late_to_another_host_is_refused() {
    require_root();
    hostile_forms(Some("late-placeholder"));
}

/// HTTP/2 fronting and the gate's audit records (no answer at all, but a record naming why).
fn held_extras(w: &World) -> Vec<String> {
    let mut wrong = Vec::new();
    // HTTP/2: `:authority` of another allowed name on a connection opened for this one.
    let (_, h2, _) = w.sh(
        "atk",
        "curl -sk --http2 -o /dev/null -w '%{http_code} %{http_version}' \\
         -H 'Host: other.attack.test' https://allowed.example.test/deny-h2-front",
    );
    eprintln!("{:45} {h2}", "h2_authority_of_another_allowed_name");
    if h2 != "421 2" {
        wrong.push(format!("h2_authority_of_another_allowed_name: {h2}"));
    }
    let audit = w.audit();
    let rules: Vec<&str> = audit.iter().filter_map(|r| r["rule"].as_str()).collect();
    for why in [
        "ClientHello has no server name: refused",
        "server name other.attack.test does not match the address dialled",
        "server name forbidden.example.test is not allowed for this sandbox",
    ] {
        if !rules.iter().any(|r| r.starts_with(why)) {
            wrong.push(format!("no audit record says {why:?}"));
        }
    }
    // The legitimate neighbours did reach the outside world, with the real token where asked.
    let received = w.received();
    for ok in ["/ok-bearer", "/ok-case-dot", "/ok-lower"] {
        if !received
            .iter()
            .any(|r| r["path"] == ok && r["credential"] == "real")
        {
            wrong.push(format!(
                "{ok} did not reach the outside world with the real token"
            ));
        }
    }
    wrong
}

/// FINDING (fixed by refusing). A WebSocket handshake to the secret's own host used to carry the
/// real token upstream (swapped as on any request), and an upstream echoing the handshake's
/// headers in a frame showed the guest the real token: the upgraded stream is relayed as raw
/// (possibly compressed) bytes and cannot be scrubbed. A placeholder on an upgrade is now
/// refused (403, the perimeter's answer, audited), and nothing reaches the upstream.
#[test]
fn a_websocket_echo_never_shows_the_guest_the_real_token() {
    require_root();
    let w = World::start();
    let p = hostile_sandbox(&w, "wse");
    let bearer = format!("Authorization: Bearer {p}\r\n");
    let case = tls(
        "websocket_echo",
        ALLOWED,
        Some(ALLOWED),
        &[head(
            "GET",
            "/ws-echo-headers",
            ALLOWED,
            &(ws_headers("") + &bearer),
            false,
        )],
    );
    let results = attack(&w, "wse", &[case]);
    let got = &results[0];
    eprintln!("{got:#}");
    let answer = got["answer"].as_str().unwrap_or("");
    assert!(
        !answer.contains(EXAMPLE_TOKEN),
        "the real token reached the guest in a WebSocket frame: {answer}"
    );
    assert_eq!(got["status"], 403, "the handshake was not refused: {got}");
    assert!(
        answer.contains("svc egress perimeter")
            && answer.contains("credentials are not swapped on protocol upgrades"),
        "the refusal is not the perimeter's, naming why: {answer}"
    );
    let reached: Vec<_> = w
        .received()
        .into_iter()
        .filter(|r| r["path"] == "/ws-echo-headers")
        .collect();
    assert!(
        reached.is_empty(),
        "the handshake reached the upstream: {reached:#?}"
    );
    assert!(
        w.audit()
            .iter()
            .any(|r| r["decision"] == "deny" && r["rule"] == "upgrade-credential"),
        "no audit record of the refused handshake"
    );
    w.destroy_checked("wse");
}

/// FINDING. A name allowed on one port only (allowed.example.test:8443) whose address is shared with a
/// name allowed on 443 (db.example.test): the guest dials that address on 443 (open for
/// db.example.test), presents allowed.example.test as SNI and `Host:
/// allowed.example.test:8443`. The policy reads the port from `Host`; the proxy dials the port
/// the guest dialled: allowed.example.test's server on 443, which no rule allows.
#[test]
fn a_name_allowed_on_one_port_is_not_served_on_another_port_of_its_address() {
    require_root();
    let w = World::start();
    w.svc_ok(&[
        "sandbox",
        "create",
        "--allow-host",
        "allowed.example.test:8443",
        "--allow-host",
        "db.example.test",
        "ports",
    ]);
    install_guest(&w, "ports");
    let case = |case: &str, path: &str, host: &str| {
        let mut c = tls(
            case,
            ALLOWED,
            Some(ALLOWED),
            &[head("GET", path, host, "", false)],
        );
        c["resolve"] = json!(["db.example.test"]);
        c
    };
    let results = attack(
        &w,
        "ports",
        &[
            case("port_443_as_443", "/deny-port-443", ALLOWED),
            case(
                "port_443_as_8443",
                "/deny-port-8443",
                "allowed.example.test:8443",
            ),
        ],
    );
    for r in &results {
        eprintln!("{r:#}");
    }
    let reached: Vec<_> = w
        .received()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/deny-port"))
        })
        .collect();
    let audit: Vec<_> = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "http" && r["decision"] == "allow")
        .collect();
    assert!(
        reached.is_empty(),
        "allowed.example.test was served on port 443, which only db.example.test is allowed \
         on: {reached:#?}\nallowed records: {audit:#?}\nanswers: {results:#?}"
    );
    w.destroy_checked("ports");
}

/// FINDING (it depends on timing: the request must meet an empty bucket, which a flood on four
/// connections makes likely, not certain). A guest spends its audit budget (`limits.audit_burst` records at once, then
/// `audit_records_per_sec`) on refused requests, and while it goes on sends a request that carries its real
/// token upstream: that request must still leave a record of its own (host, path, the
/// credential swapped), not only a count in a `suppressed` record.
#[test]
fn a_credentialed_request_after_an_audit_flood_still_has_its_record() {
    require_root();
    let w = World::start();
    let p = hostile_sandbox(&w, "flood");
    // Refused requests on four kept-alive connections at once, each one audited.
    let mut flood = tls(
        "flood",
        ALLOWED,
        Some(ALLOWED),
        &[head("GET", "/deny-flood", FORBIDDEN, "", true)],
    );
    flood["repeat"] = json!(2500);
    flood["batch"] = json!(250);
    flood["parallel"] = json!(4);
    // The credentialed request goes while the flood still runs.
    flood["detach"] = json!(true);
    let pause = json!({"case": "pause", "sleep": 4});
    let after = tls(
        "after",
        ALLOWED,
        Some(ALLOWED),
        &[head(
            "POST",
            "/ok-after-flood",
            ALLOWED,
            &format!("Authorization: Bearer {p}\r\nContent-Length: 9\r\n"),
            false,
        ) + "exfiltrat"],
    );
    // Resolved before the flood (the guard is busy after it): the after request dials the
    // address the guard answered then.
    let before = tls(
        "before",
        ALLOWED,
        Some(ALLOWED),
        &[head("GET", "/ok-before-flood", ALLOWED, "", false)],
    );
    let mut after = after;
    after["addr"] = json!("192.0.2.20");
    let results = attack(&w, "flood", &[before, flood, pause, after]);
    eprintln!("{results:#?}");
    assert_eq!(results[3]["status"], 200, "{results:#?}");
    assert!(
        w.received()
            .iter()
            .any(|r| r["path"] == "/ok-after-flood" && r["credential"] == "real"),
        "the request did not go out"
    );
    // The suppressed counts are written every 5 s.
    std::thread::sleep(std::time::Duration::from_secs(7));
    let audit = w.audit();
    let suppressed: Vec<_> = audit
        .iter()
        .filter(|r| r["layer"] == "suppressed")
        .collect();
    let own: Vec<_> = audit
        .iter()
        .filter(|r| r["layer"] == "http" && r["path"] == "/ok-after-flood")
        .collect();
    let flood_records = audit.iter().filter(|r| r["layer"] == "dns").count();
    let mut by_rule = std::collections::BTreeMap::<String, usize>::new();
    for r in &audit {
        *by_rule
            .entry(format!("{} {} {}", r["layer"], r["rule"], r["status"]))
            .or_default() += 1;
    }
    eprintln!("flood: {flood_records} records written; by rule: {by_rule:#?}; own: {own:#?}");
    eprintln!("suppressed: {suppressed:#?}");
    assert!(
        !suppressed.is_empty(),
        "the flood stayed within the audit budget ({flood_records} records written): the \
         attack did not happen"
    );
    assert!(
        !own.is_empty(),
        "the request that carried the real token upstream left no record of its own (only \
         counted in {suppressed:?}); {} records in all",
        audit.len()
    );
    w.destroy_checked("flood");
}
