//! AllowedBranches for git pushes over smart-HTTP, when a sandbox asks for it
//! (`svc sandbox create --https-push-branches`, `.svc/config.yaml` `egress.httpsPushBranches`).
//!
//! The body of `POST …/git-receive-pack` starts with the same command list git sends the SSH
//! relay after the ref advertisement, so it is read with the same reader
//! ([`super::receive_pack::parse_push`], git's `read_head_info` byte for byte) and held to the
//! same globs ([`super::ssh::first_refused`]), refused with the same line
//! ([`super::ssh::ref_refusal`]): the two transports cannot disagree on what a push updates.
//!
//! Only the first bytes of the body are read before the decision (the proxy's body prefix,
//! 64 KiB): a command list longer than that is refused, never passed on unread. A compressed
//! body (`Content-Encoding` other than `identity`) is refused rather than decoded: git never
//! compresses a push's body (only fetch negotiation), so only a hand-made client sends one.

use super::{
    receive_pack::{PushCommands, parse_push},
    ssh::{first_refused, ref_refusal},
};

/// What the check of one push's body says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushVerdict {
    /// Every ref it updates is in AllowedBranches.
    Allowed(PushCommands),
    /// Refused: the line git's stderr gets, and the commands when they could be read.
    Refused {
        line: String,
        commands: Option<PushCommands>,
    },
}

/// Check a smart-HTTP push: `headers` of the request, `body` its first bytes (`complete`:
/// the whole body), `branches` the sandbox's AllowedBranches.
pub fn check(
    branches: &[String],
    headers: &[(&str, &[u8])],
    body: &[u8],
    complete: bool,
) -> PushVerdict {
    let refused = |line: String| PushVerdict::Refused {
        line,
        commands: None,
    };
    if let Some((_, coding)) = headers.iter().find(|(n, v)| {
        n.eq_ignore_ascii_case("content-encoding") && !v.eq_ignore_ascii_case(b"identity")
    }) {
        return refused(format!(
            "svc: refused: a push body with Content-Encoding {:?} is not read, so not \
             forwarded (git never compresses a push)",
            String::from_utf8_lossy(coding)
        ));
    }
    match parse_push(body) {
        Err(e) => refused(format!("svc: refused: {e}")),
        Ok(None) if complete => {
            refused("svc: refused: the push's body ends before its command list does".to_owned())
        }
        Ok(None) => refused(format!(
            "svc: refused: the command list is longer than the {} bytes read before the push \
             is decided",
            body.len()
        )),
        Ok(Some(commands)) => match first_refused(branches, &commands.updates) {
            Some(bad) => PushVerdict::Refused {
                line: ref_refusal(&bad.name),
                commands: Some(commands),
            },
            None => PushVerdict::Allowed(commands),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO: &str = "0000000000000000000000000000000000000000";
    const ONE: &str = "1111111111111111111111111111111111111111";

    fn pkt(payload: &str) -> String {
        format!("{:04x}{payload}", payload.len() + 4)
    }

    fn push(refs: &[&str]) -> Vec<u8> {
        let mut s = String::new();
        for (i, r) in refs.iter().enumerate() {
            let caps = if i == 0 {
                "\0report-status side-band-64k"
            } else {
                ""
            };
            s.push_str(&pkt(&format!("{ZERO} {ONE} {r}{caps}\n")));
        }
        s.push_str("0000PACK");
        s.into_bytes()
    }

    #[test]
    fn push_cases() {
        let branches = vec![super::super::ssh::DEFAULT_BRANCHES.to_owned()];
        let plain: &[(&str, &[u8])] =
            &[("content-type", b"application/x-git-receive-pack-request")];
        let gzip: &[(&str, &[u8])] = &[("Content-Encoding", b"gzip")];
        let identity: &[(&str, &[u8])] = &[("content-encoding", b"identity")];
        let cert = {
            let mut s = pkt("push-cert\0report-status\n");
            for l in [
                "certificate version 0.1\n",
                "pusher x 1 +0000\n",
                "\n",
                &format!("{ZERO} {ONE} refs/heads/svc/a\n\n{ZERO} {ONE} refs/heads/main\n"),
                "-----BEGIN PGP SIGNATURE-----\n",
                "-----END PGP SIGNATURE-----\n",
                "push-cert-end\n",
            ] {
                s.push_str(&pkt(l));
            }
            s.push_str("0000");
            s.into_bytes()
        };
        // (name, headers, body, complete, Ok(refs) or Err(line fragment))
        type Want = Result<&'static [&'static str], &'static str>;
        let long = push(&["refs/heads/svc/a"])[..20].to_vec();
        type Headers<'a> = &'a [(&'a str, &'a [u8])];
        let cases: Vec<(&str, Headers<'_>, Vec<u8>, bool, Want)> = vec![
            (
                "allowed_branch",
                plain,
                push(&["refs/heads/svc/a"]),
                false,
                Ok(&["refs/heads/svc/a"]),
            ),
            (
                "allowed_identity_encoding",
                identity,
                push(&["refs/heads/svc/a"]),
                true,
                Ok(&["refs/heads/svc/a"]),
            ),
            (
                "main_refused_with_the_ssh_line",
                plain,
                push(&["refs/heads/svc/a", "refs/heads/main"]),
                false,
                Err("svc: refused: ref refs/heads/main not in allowed branches"),
            ),
            (
                "deletion_of_main_refused",
                plain,
                format!(
                    "{}0000",
                    pkt(&format!("{ONE} {ZERO} refs/heads/main\0report-status\n"))
                )
                .into_bytes(),
                true,
                Err("svc: refused: ref refs/heads/main not in allowed branches"),
            ),
            (
                "dot_dot_escape_refused",
                plain,
                push(&["refs/heads/svc/../main"]),
                false,
                Err("ref refs/heads/svc/../main not in allowed branches"),
            ),
            (
                "certificate_hiding_a_command",
                plain,
                cert,
                true,
                Err("svc: refused: a push certificate"),
            ),
            (
                "gzip_refused",
                gzip,
                push(&["refs/heads/svc/a"]),
                false,
                Err("Content-Encoding \"gzip\""),
            ),
            (
                "longer_than_the_prefix",
                plain,
                long.clone(),
                false,
                Err("command list is longer than the 20 bytes"),
            ),
            (
                "body_ends_early",
                plain,
                long,
                true,
                Err("ends before its command list"),
            ),
            (
                "bad_length",
                plain,
                b"zzzz".to_vec(),
                false,
                Err("svc: refused: bad pkt-line length"),
            ),
        ];
        for (name, headers, body, complete, want) in cases {
            let got = check(&branches, headers, &body, complete);
            match (want, got) {
                (Ok(refs), PushVerdict::Allowed(c)) => {
                    let names: Vec<&str> = c.updates.iter().map(|u| u.name.as_str()).collect();
                    assert_eq!(names, refs, "{name}");
                }
                (Err(frag), PushVerdict::Refused { line, .. }) => {
                    assert!(line.contains(frag), "{name}: {line}");
                }
                (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn a_refused_push_keeps_every_ref_for_the_audit() {
        let branches = vec![super::super::ssh::DEFAULT_BRANCHES.to_owned()];
        let got = check(
            &branches,
            &[],
            &push(&["refs/heads/main", "refs/heads/svc/a"]),
            false,
        );
        let PushVerdict::Refused {
            commands: Some(c), ..
        } = got
        else {
            panic!("not refused with commands: {got:?}");
        };
        let names: Vec<&str> = c.updates.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["refs/heads/main", "refs/heads/svc/a"]);
        assert!(c.capabilities.iter().any(|x| x == "side-band-64k"));
    }

    #[test]
    fn decide_holds_receive_pack_posts_only_when_asked() {
        use crate::{
            config::{
                egress::{EgressConfig, RepoName},
                host::HostConfig,
            },
            policy::{
                credentials::Scheme,
                request::{HttpRequest, Outcome, Rule, SandboxPolicy, decide},
            },
        };
        let repo = RepoName::parse("acme/widget").expect("a repo name");
        let mut policy = SandboxPolicy::for_sandbox(
            &HostConfig::default(),
            &[],
            Some(repo),
            EgressConfig::default(),
        )
        .expect("a policy");
        let host = policy.code.code_host.to_string();
        let main = push(&["refs/heads/main"]);
        let svc = push(&["refs/heads/svc/a"]);
        // (name, asked, target, body, rule, refs checked)
        type Case<'a> = (&'a str, bool, &'a str, &'a [u8], Rule, usize);
        let cases: &[Case<'_>] = &[
            (
                "off_main",
                false,
                "/acme/widget.git/git-receive-pack",
                &main,
                Rule::SmartHttp,
                0,
            ),
            (
                "on_main",
                true,
                "/acme/widget.git/git-receive-pack",
                &main,
                Rule::SmartHttpPushRefused,
                1,
            ),
            (
                "on_svc",
                true,
                "/acme/widget.git/git-receive-pack",
                &svc,
                Rule::SmartHttp,
                1,
            ),
            (
                "on_fetch",
                true,
                "/acme/widget.git/git-upload-pack",
                b"0000",
                Rule::SmartHttp,
                0,
            ),
            (
                "on_foreign_repo",
                true,
                "/evil/exfil.git/git-receive-pack",
                &svc,
                Rule::SmartHttpForeignRepo,
                0,
            ),
        ];
        for (name, asked, target, body, rule, refs) in cases {
            policy.https_push_branches =
                asked.then(|| vec![super::super::ssh::DEFAULT_BRANCHES.to_owned()]);
            let d = decide(
                &policy,
                &HttpRequest {
                    scheme: Scheme::Https,
                    method: "POST",
                    target,
                    authority: Some(&host),
                    sni: Some(&host),
                    alt_authority: None,
                    headers: &[],
                    body_prefix: body,
                    body_complete: false,
                    head_had_both_lengths: false,
                    dialled_port: None,
                },
            );
            assert_eq!(d.rule, *rule, "{name}: {d:?}");
            assert_eq!(d.push.map_or(0, |p| p.updates.len()), *refs, "{name}");
            if *rule == Rule::SmartHttpPushRefused {
                assert_eq!(d.outcome, Outcome::Deny { status: 403 }, "{name}");
                assert_eq!(
                    d.reason, "svc: refused: ref refs/heads/main not in allowed branches",
                    "{name}"
                );
            }
        }
    }
}
