//! The real value never flows back: an allowed host that echoes its request headers in its
//! body (httpbin's `/headers`) answers a request the proxy swapped a credential into; the guest
//! of a real container sandbox behind the real svcd sees its placeholder there, never the real
//! token, over HTTP/1.1 and HTTP/2, and the scrub is audited as `credential-echo`.

use svc_tests::{
    require_root,
    world::{EXAMPLE_TOKEN, World},
};

#[test]
fn an_echoing_host_shows_the_guest_its_placeholder_never_the_real_token() {
    require_root();
    let w = World::start();
    let created = w.sandbox_with_example_secret("echo", "env:EXAMPLE");
    assert!(
        created.status.success(),
        "{}{}",
        String::from_utf8_lossy(&created.stdout),
        String::from_utf8_lossy(&created.stderr)
    );
    let (_, placeholder, _) = w.sh("echo", "printf %s \"$SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\"");
    assert_eq!(placeholder.len(), 64, "{placeholder}");
    for version in ["--http1.1", "--http2"] {
        let (code, out, err) = w.sh(
            "echo",
            &format!(
                "curl -sS --max-time 10 {version} -H 'Accept-Encoding: gzip' \
                 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" \
                 https://allowed.example.test/echo/headers"
            ),
        );
        assert_eq!(code, 0, "{version}: {err}");
        assert!(
            !out.contains(EXAMPLE_TOKEN),
            "{version}: the real token reached the guest: {out}"
        );
        let echo: serde_json::Value = serde_json::from_str(out.trim()).expect("json echo");
        assert_eq!(
            echo["headers"]["authorization"],
            format!("Bearer {placeholder}"),
            "{version}: {echo}"
        );
        assert_eq!(echo["headers"]["accept-encoding"], "identity", "{echo}");
    }
    let audit = w.audit();
    let echoes = audit
        .iter()
        .filter(|r| {
            r["layer"] == "http"
                && r["rule"] == "credential-echo"
                && r["decision"] == "scrubbed"
                && r["host"] == "allowed.example.test"
        })
        .count();
    assert_eq!(echoes, 2, "{audit:?}");
    assert!(!format!("{audit:?}").contains(EXAMPLE_TOKEN));
    w.destroy_checked("echo");
}
