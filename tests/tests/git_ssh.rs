//! git over SSH from inside real sandboxes, on both backends: the guest's git runs the
//! `svc-git-ssh` shim from the image (GIT_SSH_COMMAND), the shim reaches svcd's relay through
//! the sandbox's own socket (container: a unix socket svcd binds in the sandbox's directory;
//! microvm: a stream the guest's agent opens on its channel), and svcd runs the host's real
//! ssh with the host's agent against a real sshd in the outside world. The guest has no key,
//! no agent and no route to port 22. Every refusal gives git's stderr the exact line, leaves
//! the server's refs and objects unchanged, and is audited.
#![expect(clippy::expect_used, reason = "test helpers")]

use svc_tests::{
    require_root,
    world::{CODE_SSH_ADDR, World, microvm_images},
};

fn create(w: &World, name: &str, backend: &str) -> serde_json::Value {
    let out = w.sandbox_in_project(name, backend, &w.ssh_project(), &["--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        v["ssh_repos"],
        serde_json::json!([{"host": CODE_SSH_ADDR, "repo": "acme/widget"}]),
        "{v}"
    );
    v
}

const GIT: &str = "git -c user.name=agent -c user.email=agent@svc.invalid";

/// Clone, push to an allowed branch, and every refusal, from inside `name`.
fn clone_push_and_refusals(w: &World, name: &str) {
    let ssh = w.ssh.as_ref().expect("the world serves SSH");
    let remote = format!("root@{CODE_SSH_ADDR}:acme/widget.git");

    // No way around the relay: no key, no agent, no route to port 22.
    let (code, out, _) = w.sh(
        name,
        "ls /root/.ssh 2>/dev/null; echo \"agent=${SSH_AUTH_SOCK:-none}\"; \
         echo \"cmd=$GIT_SSH_COMMAND\"; command -v ssh || echo no-ssh",
    );
    assert_eq!(code, 0);
    assert!(out.contains("agent=none"), "{out}");
    assert!(out.contains("cmd=/usr/local/bin/svc-git-ssh"), "{out}");
    let (code, _, _) = w.sh(
        name,
        &format!("timeout 3 bash -c 'exec 3<>/dev/tcp/{CODE_SSH_ADDR}/22' 2>/dev/null"),
    );
    assert_ne!(code, 0, "the guest reached port 22 directly");

    // Clone (upload-pack, scp-style URL), then a protocol-v2 fetch.
    let (code, out, err) = w.sh(
        name,
        &format!("cd /tmp && {GIT} clone -q {remote} widget && cat widget/README && cd widget && {GIT} -c protocol.version=2 fetch -q origin && echo fetched"),
    );
    assert_eq!(code, 0, "clone: {out}{err}\n{}", w.svcd_log());
    assert!(
        out.contains("acme/widget") && out.contains("fetched"),
        "{out}"
    );

    // A push to an allowed branch lands.
    let (code, out, err) = w.sh(
        name,
        &format!("cd /tmp/widget && {GIT} commit -q --allow-empty -m work && {GIT} push -q origin HEAD:refs/heads/svc/{name}"),
    );
    assert_eq!(code, 0, "allowed push: {out}{err}");
    assert!(
        ssh.refs("acme/widget")
            .contains(&format!("refs/heads/svc/{name}"))
    );

    // A push to main: refused with the exact line; the server is unchanged.
    let (refs, objects) = (ssh.refs("acme/widget"), ssh.objects("acme/widget"));
    let (code, _, err) = w.sh(
        name,
        &format!("cd /tmp/widget && echo change > f && {GIT} add f && {GIT} commit -q -m main && {GIT} push origin HEAD:refs/heads/main"),
    );
    assert_ne!(code, 0, "a push to main went through");
    assert!(
        err.contains("svc: refused: ref refs/heads/main not in allowed branches"),
        "{err}"
    );
    assert_eq!(ssh.refs("acme/widget"), refs, "a refused push moved a ref");
    assert_eq!(
        ssh.objects("acme/widget"),
        objects,
        "a refused push stored objects"
    );

    // Every other refusal class from inside the sandbox: one allowed and one refused ref
    // together, a tag, deleting main, refs/heads/svc itself — each refused with its exact
    // line, the server's refs and objects unchanged.
    for (what, push, refname) in [
        (
            "one allowed, one not",
            format!("HEAD:refs/heads/svc/{name}-ok HEAD:refs/heads/release"),
            "refs/heads/release",
        ),
        ("a tag", "HEAD:refs/tags/v9".to_owned(), "refs/tags/v9"),
        (
            "deleting main",
            ":refs/heads/main".to_owned(),
            "refs/heads/main",
        ),
        (
            "svc itself",
            "HEAD:refs/heads/svc".to_owned(),
            "refs/heads/svc",
        ),
    ] {
        let (code, _, err) = w.sh(name, &format!("cd /tmp/widget && {GIT} push origin {push}"));
        assert_ne!(code, 0, "{what}: pushed");
        assert!(
            err.contains(&format!(
                "svc: refused: ref {refname} not in allowed branches"
            )),
            "{what}: {err}"
        );
        assert_eq!(ssh.refs("acme/widget"), refs, "{what}: a ref moved");
        assert_eq!(
            ssh.objects("acme/widget"),
            objects,
            "{what}: objects stored"
        );
    }
    // Push options pass to an allowed ref; deleting an allowed branch is an allowed update.
    let (code, out, err) = w.sh(
        name,
        &format!("cd /tmp/widget && {GIT} push -q -o ci.skip origin HEAD:refs/heads/svc/{name}-opts && {GIT} push -q origin :refs/heads/svc/{name}-opts"),
    );
    assert_eq!(code, 0, "push options, delete: {out}{err}");
    assert!(
        !ssh.refs("acme/widget")
            .contains(&format!("svc/{name}-opts"))
    );

    // A repository outside the policy: refused at once.
    let (code, _, err) = w.sh(
        name,
        &format!("cd /tmp && {GIT} clone -q root@{CODE_SSH_ADDR}:evil/exfil.git exfil"),
    );
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!(
            "svc: refused by egress policy: {CODE_SSH_ADDR} evil/exfil not in .svc/config.yaml egress.policy"
        )),
        "{err}"
    );

    // Not git: a shell, option injection. The shim is the guest's; the relay decides.
    for (what, args) in [
        ("a shell", format!("root@{CODE_SSH_ADDR} sh")),
        (
            "ProxyCommand injection",
            format!("-oProxyCommand=id root@{CODE_SSH_ADDR} \"git-upload-pack 'acme/widget.git'\""),
        ),
    ] {
        let (code, _, err) = w.sh(name, &format!("/usr/local/bin/svc-git-ssh {args}"));
        assert_ne!(code, 0, "{what} was relayed");
        assert!(err.contains("svc: refused"), "{what}: {err}");
    }

    // One audit record per session, with the push's refs.
    let ssh_records: Vec<serde_json::Value> = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "ssh" && r["sandbox_name"] == name)
        .collect();
    assert!(
        ssh_records
            .iter()
            .any(|r| r["command"] == "git-upload-pack" && r["decision"] == "allow"),
        "{ssh_records:?}"
    );
    assert!(
        ssh_records.iter().any(|r| r["decision"] == "deny"
            && r["refs"][0]["name"] == "refs/heads/main"
            && r["reason"] == "svc: refused: ref refs/heads/main not in allowed branches"),
        "{ssh_records:?}"
    );
    assert!(
        ssh_records
            .iter()
            .any(|r| r["repo"] == "evil/exfil" && r["decision"] == "deny"),
        "{ssh_records:?}"
    );
    let metrics = w.metrics();
    assert!(
        metrics.contains(&format!(
            "svc_git_ssh_sessions_total{{sandbox=\"{name}\",command=\"git-receive-pack\",decision=\"deny\"}}"
        )),
        "{metrics}"
    );
}

#[test]
fn git_over_ssh_from_a_container_sandbox_goes_through_the_relay() {
    require_root();
    let mut w = World::start_with_git_ssh("");
    create(&w, "gitc", "container");
    clone_push_and_refusals(&w, "gitc");

    // svcd restarts: the sandbox's relay socket is bound again where its guest sees it.
    w.kill_svcd();
    w.start_svcd();
    let (code, out, err) = w.sh(
        "gitc",
        &format!("cd /tmp/widget && {GIT} fetch -q origin && echo again"),
    );
    assert_eq!(code, 0, "fetch after an svcd restart: {out}{err}");
    w.destroy_checked("gitc");
}

/// A client of the guest's own, speaking receive-pack through the shim (as the found attack
/// did): push certificates that hide a command from a reader that does not read them as git
/// does are refused, from inside a container sandbox.
#[test]
fn a_push_certificate_hiding_a_command_is_refused_from_a_container_sandbox() {
    require_root();
    push_certificate_attack("gitcert", "container");
}

/// The same attack from inside a microvm sandbox: the shim reaches the relay through a stream
/// the guest's agent opens on its vsock channel, not a unix socket, and is held to the same
/// parse.
#[test]
fn a_push_certificate_hiding_a_command_is_refused_from_a_microvm_sandbox() {
    require_root();
    let _ = microvm_images();
    push_certificate_attack("gitcertv", "microvm");
}

/// The sandbox's own client against the shim, on `backend`: a clone, an allowed push (so the
/// server holds a commit main does not), then the hostile streams.
fn push_certificate_attack(name: &str, backend: &str) {
    let w = World::start_with_git_ssh("");
    create(&w, name, backend);
    let remote = format!("root@{CODE_SSH_ADDR}:acme/widget.git");
    let (code, out, err) = w.sh(
        name,
        &format!(
            "cd /tmp && {GIT} clone -q {remote} widget && cd widget && \
             {GIT} commit -q --allow-empty -m work && {GIT} push -q origin HEAD:refs/heads/svc/{name}"
        ),
    );
    assert_eq!(
        code,
        0,
        "clone and allowed push: {out}{err}\n{}",
        w.svcd_log()
    );
    hostile_push_certificates(&w, name);
    w.destroy_checked(name);
}

#[test]
fn git_over_ssh_from_a_microvm_sandbox_goes_through_the_relay() {
    require_root();
    let _ = microvm_images();
    let w = World::start_with_git_ssh("");
    create(&w, "gitv", "microvm");
    clone_push_and_refusals(&w, "gitv");

    // A clone of the VM: its agent serves a new host, and the clone's git reaches the relay
    // as its own sandbox.
    w.svc_ok(&["sandbox", "fork", "gitv", "gitv2"]);
    let (code, out, err) = w.sh(
        "gitv2",
        &format!("cd /tmp/widget && {GIT} fetch -q origin && echo forked"),
    );
    assert_eq!(code, 0, "fetch in the clone: {out}{err}");
    assert!(
        w.audit_record(|r| r["layer"] == "ssh" && r["sandbox_name"] == "gitv2")
            .is_some(),
        "the clone's session was audited as the clone's"
    );
    w.destroy_checked("gitv2");
    w.destroy_checked("gitv");
}

/// An empty SHA-1 pack (`git pack-objects --stdout </dev/null`).
const EMPTY_PACK: &[u8] = b"PACK\0\0\0\x02\0\0\0\0\x02\x9d\x08\x82\x3b\xd8\xa8\xea\xb5\x10\xad\x6a\xc7\x5c\x82\x3c\xfd\x3e\xd3\x1e";

fn pkt(payload: &[u8]) -> Vec<u8> {
    let mut v = format!("{:04x}", payload.len() + 4).into_bytes();
    v.extend_from_slice(payload);
    v
}

/// A push certificate's stream: `push-cert`, `lines` one a pkt-line each (a line may hold
/// several), an SSH signature, `push-cert-end`, then `tail` (a flush and a pack by default).
fn cert_stream(lines: &[Vec<u8>], end: bool, tail: &[Vec<u8>]) -> Vec<u8> {
    let mut s = pkt(b"push-cert\0report-status side-band-64k object-format=sha1");
    for l in lines {
        s.extend(pkt(l));
    }
    for l in [
        &b"-----BEGIN SSH SIGNATURE-----\n"[..],
        b"U1NIU0lH\n",
        b"-----END SSH SIGNATURE-----\n",
    ] {
        s.extend(pkt(l));
    }
    if end {
        s.extend(pkt(b"push-cert-end\n"));
    }
    for t in tail {
        s.extend(pkt(t));
    }
    s.extend(b"0000");
    s.extend(EMPTY_PACK);
    s
}

/// The bytes as a `printf` format the guest's shell writes back exactly.
fn printf_format(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b' ' | b'-' | b'/' | b'.' | b'+' | b':' => {
                char::from(*b).to_string()
            }
            _ => format!("\\{b:03o}"),
        })
        .collect()
}

/// From inside sandbox `name`, its own client sends receive-pack streams through the shim
/// (as the found attack did): a certificate whose one pkt-line holds a blank line and a command
/// for main (git joins the certificate's pkt-lines and reads that command), a command split
/// across pkt-lines, commands outside the certificate, a flush inside it. Each is refused with a
/// line on git's stderr, main does not move, and the audit names the refs git would have
/// applied; a certificate as git writes it, to an svc/ ref, lands.
fn hostile_push_certificates(w: &World, name: &str) {
    let ssh = w.ssh.as_ref().expect("the world serves SSH");
    let refs = ssh.refs("acme/widget");
    let id = |r: &str| {
        refs.lines()
            .find_map(|l| l.strip_prefix(&format!("{r} ")))
            .unwrap_or_else(|| panic!("{r} in {refs}"))
            .to_owned()
    };
    let (main, work) = (id("refs/heads/main"), id(&format!("refs/heads/svc/{name}")));
    let to_main = format!("{main} {work} refs/heads/main\n").into_bytes();
    let header = b"certificate version 0.1\n".to_vec();
    let shim = format!(
        "/usr/local/bin/svc-git-ssh root@{CODE_SSH_ADDR} \"git-receive-pack 'acme/widget.git'\""
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "the found attack: a command after a blank line inside one pkt-line",
            cert_stream(&[[&b"x\n\n"[..], &to_main].concat()], true, &[]),
            "svc: refused: a push certificate has a pkt-line that is not exactly one line",
        ),
        (
            "a certificate command split across pkt-lines",
            cert_stream(
                &[
                    header.clone(),
                    b"\n".to_vec(),
                    to_main[..50].to_vec(),
                    to_main[50..].to_vec(),
                ],
                true,
                &[],
            ),
            "svc: refused: a push certificate has a pkt-line that is not exactly one line",
        ),
        (
            "a command outside the certificate",
            cert_stream(
                &[
                    header.clone(),
                    b"\n".to_vec(),
                    format!("{main} {work} refs/heads/svc/{name}-x\n").into_bytes(),
                ],
                true,
                std::slice::from_ref(&to_main),
            ),
            "svc: refused: a push certificate comes with commands outside it",
        ),
        (
            "a flush inside the certificate",
            cert_stream(
                &[header.clone(), b"\n".to_vec(), to_main.clone()],
                false,
                &[],
            ),
            "svc: refused: a push certificate is not closed by push-cert-end",
        ),
    ];
    for (what, stream, line) in &cases {
        let (code, _, err) = w.sh(
            name,
            &format!("printf '{}' | {shim}", printf_format(stream)),
        );
        assert_ne!(code, 0, "{what}: not refused");
        assert!(err.contains(line), "{what}: {err}");
        assert_eq!(ssh.refs("acme/widget"), refs, "{what}: a ref moved");
    }
    let denied: Vec<serde_json::Value> = w
        .audit()
        .into_iter()
        .filter(|r| {
            r["layer"] == "ssh"
                && r["sandbox_name"] == name
                && r["decision"] == "deny"
                && r["reason"]
                    .as_str()
                    .is_some_and(|s| s.contains("a push certificate"))
        })
        .collect();
    assert_eq!(denied.len(), cases.len(), "{denied:?}");
    for r in &denied {
        assert_eq!(r["signed"], true, "{r}");
        assert!(
            r["refs"]
                .as_array()
                .is_some_and(|a| a.iter().any(|u| u["name"] == "refs/heads/main")),
            "the audit names the ref git would have moved: {r}"
        );
    }

    // The legitimate form: a certificate as git writes it, to an svc/ ref, lands.
    let created = format!("refs/heads/svc/{name}-signed");
    let zero = "0".repeat(40);
    let good = cert_stream(
        &[
            header,
            b"pusher agent 1700000000 +0000\n".to_vec(),
            b"\n".to_vec(),
            format!("{zero} {work} {created}\n").into_bytes(),
        ],
        true,
        &[],
    );
    let (code, out, err) = w.sh(name, &format!("printf '{}' | {shim}", printf_format(&good)));
    assert_eq!(code, 0, "a well-formed certificate: {out}{err}");
    assert!(ssh.refs("acme/widget").contains(&created), "{err}");
}
