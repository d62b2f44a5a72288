//! `policy::creation`: which `svc sandbox create` requests are refused and why, which mode a
//! request implies, and when `--repo` brokers the host's code-host token. Named table cases.

use svc_control::{
    config::host::{HostConfig, defaults},
    policy::{
        creation::{self, CreationError, Request, Secret},
        mode::EgressMode,
    },
};

fn secret<'a>(name: &'a str, value: &'a str) -> Secret<'a> {
    Secret {
        name,
        source: "env:X",
        value,
    }
}

/// A workspace's `.svc/config.yaml` egress section: one open host, one path-gated host, one
/// brokered host.
fn project_egress() -> svc_control::config::egress::EgressConfig {
    svc_control::config::egress::parse(
        std::path::Path::new(".svc/config.yaml"),
        "egress:\n  allow: [open.example.test]\n  policy:\n    api.example.test:\n      paths: [\"/v1/**\"]\n  secrets:\n    - name: MCP_TOKEN\n      hosts: [mcp.example.test]\n",
    )
    .unwrap_or_else(|e| panic!("the fixture must be valid: {e}"))
}

#[test]
fn a_workspace_egress_section_joins_the_allowlist_and_the_placeholders() {
    let host = HostConfig::default();
    let project = project_egress();
    let plan = creation::plan(
        &host,
        &Request {
            egress: None,
            context_path: false,
            allow_hosts: &[],
            repo: None,
            secrets: &[secret("SVC_CRED_MCP_EXAMPLE_TEST_TOKEN", "t")],
            project_egress: Some(&project),
        },
    )
    .expect("valid");
    let allowed: Vec<String> = plan
        .policy
        .allowed
        .0
        .iter()
        .map(ToString::to_string)
        .collect();
    for h in ["open.example.test", "api.example.test", "mcp.example.test"] {
        assert!(allowed.contains(&h.to_owned()), "{h} not in {allowed:?}");
    }
    assert_eq!(plan.policy.egress, project, "the section gates requests");
    // An empty section is no section: allow-all stays possible.
    let empty = svc_control::config::egress::EgressConfig::default();
    creation::plan(
        &host,
        &Request {
            egress: Some(EgressMode::AllowAll),
            context_path: false,
            allow_hosts: &[],
            repo: None,
            secrets: &[],
            project_egress: Some(&empty),
        },
    )
    .expect("allow-all with an empty section");
}

/// A named case: the request and what its refusal must be.
type Refusal<'a> = (&'static str, Request<'a>, fn(&CreationError) -> bool);

#[test]
fn refused_requests_name_what_to_change() {
    let host = HostConfig::default();
    let hosts = ["allowed.example.test".to_owned()];
    let bad_host = ["not a host".to_owned()];
    let code = [secret("CODE_HOST_TOKEN", "t")];
    let twice = [
        secret("CODE_HOST_TOKEN", "t"),
        secret("CODE_HOST_TOKEN", "u"),
    ];
    let newline = [secret("CODE_HOST_TOKEN", "t\nX-Evil: 1")];
    let empty = [secret("CODE_HOST_TOKEN", "")];
    let unknown = [secret("SVC_CRED_OTHER_TEST_TOKEN", "t")];
    let project = project_egress();
    let cases: Vec<Refusal<'_>> = vec![
        (
            "allow_all_with_project_egress",
            Request {
                egress: Some(EgressMode::AllowAll),
                context_path: false,
                allow_hosts: &[],
                repo: None,
                secrets: &[],
                project_egress: Some(&project),
            },
            |e| matches!(e, CreationError::AllowAllWithProjectEgress),
        ),
        (
            "allow_all_with_allow_host",
            Request {
                egress: Some(EgressMode::AllowAll),
                context_path: false,
                allow_hosts: &hosts,
                repo: None,
                secrets: &[],
                project_egress: None,
            },
            |e| matches!(e, CreationError::AllowAllWithCuratedFlags),
        ),
        (
            "allow_all_with_repo",
            Request {
                egress: Some(EgressMode::AllowAll),
                context_path: false,
                allow_hosts: &[],
                repo: Some("acme/widget"),
                secrets: &[],
                project_egress: None,
            },
            |e| matches!(e, CreationError::AllowAllWithCuratedFlags),
        ),
        (
            "context_path_with_secret",
            Request {
                egress: None,
                context_path: true,
                allow_hosts: &[],
                repo: None,
                secrets: &code,
                project_egress: None,
            },
            |e| matches!(e, CreationError::AllowAllWithCuratedFlags),
        ),
        (
            "context_path_with_egress_curated",
            Request {
                egress: Some(EgressMode::Curated),
                context_path: true,
                allow_hosts: &[],
                repo: None,
                secrets: &[],
                project_egress: None,
            },
            |e| matches!(e, CreationError::ContextPathWithCurated),
        ),
        (
            "bad_allow_host",
            Request {
                egress: None,
                context_path: false,
                allow_hosts: &bad_host,
                repo: None,
                secrets: &[],
                project_egress: None,
            },
            |e| matches!(e, CreationError::BadHost { host, .. } if host == "not a host"),
        ),
        (
            "bad_repo",
            Request {
                egress: None,
                context_path: false,
                allow_hosts: &[],
                repo: Some("../etc"),
                secrets: &[],
                project_egress: None,
            },
            |e| matches!(e, CreationError::BadRepo { .. }),
        ),
        (
            "code_host_token_without_repo",
            Request {
                egress: None,
                context_path: false,
                allow_hosts: &[],
                repo: None,
                secrets: &code,
                project_egress: None,
            },
            |e| matches!(e, CreationError::NoSuchVariable { hint, .. } if hint.contains("needs --repo")),
        ),
        (
            "secret_for_a_host_not_allowed",
            Request {
                egress: None,
                context_path: false,
                allow_hosts: &hosts,
                repo: None,
                secrets: &unknown,
                project_egress: None,
            },
            |e| {
                matches!(e, CreationError::NoSuchVariable { variables, .. }
                    if variables.contains("SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN"))
            },
        ),
        (
            "secret_given_twice",
            Request {
                egress: None,
                context_path: false,
                allow_hosts: &[],
                repo: Some("acme/widget"),
                secrets: &twice,
                project_egress: None,
            },
            |e| matches!(e, CreationError::SecretTwice(n) if n == "CODE_HOST_TOKEN"),
        ),
        (
            "secret_with_a_line_break_is_header_injection",
            Request {
                egress: None,
                context_path: false,
                allow_hosts: &[],
                repo: Some("acme/widget"),
                secrets: &newline,
                project_egress: None,
            },
            |e| matches!(e, CreationError::BadSecretValue { .. }),
        ),
        (
            "empty_secret",
            Request {
                egress: None,
                context_path: false,
                allow_hosts: &[],
                repo: Some("acme/widget"),
                secrets: &empty,
                project_egress: None,
            },
            |e| matches!(e, CreationError::BadSecretValue { .. }),
        ),
    ];
    for (name, req, expected) in cases {
        match creation::plan(&host, &req) {
            Ok(_) => panic!("{name}: accepted"),
            Err(e) => assert!(expected(&e), "{name}: refused for another reason: {e}"),
        }
    }
}

#[test]
fn valid_requests_plan_their_mode_hosts_and_variables() {
    let host = HostConfig::default();
    let hosts = ["allowed.example.test".to_owned()];
    let code = [secret("CODE_HOST_TOKEN", "t")];
    let curated = creation::plan(
        &host,
        &Request {
            egress: None,
            context_path: false,
            allow_hosts: &hosts,
            repo: Some("acme/widget"),
            secrets: &code,
            project_egress: None,
        },
    )
    .expect("valid");
    assert_eq!(curated.egress, EgressMode::Curated);
    assert_eq!(curated.extra_hosts.len(), 1);
    assert!(curated.repo.is_some());
    let vars: Vec<String> = curated
        .policy
        .placeholders
        .entries()
        .iter()
        .filter_map(svc_control::policy::credentials::PlaceholderEntry::env_name)
        .collect();
    assert!(vars.contains(&"CODE_HOST_TOKEN".to_owned()), "{vars:?}");
    assert!(
        vars.contains(&"SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN".to_owned()),
        "{vars:?}"
    );
    let open = creation::plan(
        &host,
        &Request {
            egress: None,
            context_path: true,
            allow_hosts: &[],
            repo: None,
            secrets: &[],
            project_egress: None,
        },
    )
    .expect("valid");
    assert_eq!(open.egress, EgressMode::AllowAll);
}

#[test]
fn the_mode_and_the_host_code_token_follow_the_flags() {
    let cases = [
        ("default_is_curated", None, false, EgressMode::Curated),
        (
            "egress_allow_all",
            Some(EgressMode::AllowAll),
            false,
            EgressMode::AllowAll,
        ),
        (
            "context_path_is_allow_all",
            None,
            true,
            EgressMode::AllowAll,
        ),
        (
            "explicit_curated",
            Some(EgressMode::Curated),
            false,
            EgressMode::Curated,
        ),
    ];
    for (name, asked, context, want) in cases {
        assert_eq!(creation::egress_mode(asked, context), want, "{name}");
    }
    let own = [secret("CODE_HOST_TOKEN", "t")];
    let base = Request {
        egress: None,
        context_path: false,
        allow_hosts: &[],
        repo: Some("acme/widget"),
        secrets: &[],
        project_egress: None,
    };
    let broker = [
        ("repo_alone_brokers_the_host_token", base, true),
        (
            "own_secret_wins",
            Request {
                secrets: &own,
                ..base
            },
            false,
        ),
        ("no_repo_no_token", Request { repo: None, ..base }, false),
        (
            "allow_all_never",
            Request {
                egress: Some(EgressMode::AllowAll),
                ..base
            },
            false,
        ),
    ];
    for (name, req, want) in broker {
        assert_eq!(creation::brokers_host_code_token(&req), want, "{name}");
    }
}

#[test]
fn a_backend_is_given_only_if_this_svcd_offers_it() {
    use svc_control::config::workspace::Backend;
    let offered = names(&[Backend::CONTAINER]);
    assert_eq!(
        creation::backend(None, &offered, canonical),
        Ok(Backend::CONTAINER.name())
    );
    assert_eq!(
        creation::backend(Some("container"), &offered, canonical),
        Ok(Backend::CONTAINER.name())
    );
    assert_eq!(
        creation::backend(Some("netns"), &offered, canonical),
        Ok(Backend::CONTAINER.name()),
        "netns is container's old name"
    );
    let vm = creation::backend(Some("microvm"), &offered, canonical).expect_err("not offered");
    assert!(
        matches!(vm, CreationError::BackendUnavailable("microvm", _)),
        "{vm}"
    );
    assert!(vm.to_string().contains("it offers: container"), "{vm}");
    let bad = creation::backend(Some("docker"), &offered, canonical).expect_err("unknown");
    assert!(
        bad.to_string().contains("expected container or microvm"),
        "{bad}"
    );
    assert_eq!(
        creation::backend(
            Some("microvm"),
            &names(&[Backend::MICROVM, Backend::CONTAINER]),
            canonical
        ),
        Ok(Backend::MICROVM.name())
    );
}

#[test]
fn a_workspace_runtime_block_selects_a_backend_as_spec_2_5_says() {
    use svc_control::config::workspace::Backend;
    let (container, microvm) = (Backend::CONTAINER, Backend::MICROVM);
    let netns = Backend::named("netns").expect("container's old name");
    let why = |b: &str| format!("{b} images missing");
    struct Case {
        name: &'static str,
        required: Vec<svc_control::config::workspace::Backend>,
        offered: Vec<svc_control::config::workspace::Backend>,
        want: Result<(svc_control::config::workspace::Backend, &'static str), &'static str>,
    }
    for c in [
        Case {
            name: "empty, microvm offered: automatic picks the stronger boundary",
            required: vec![],
            offered: vec![container, microvm],
            want: Ok((microvm, "automatic, microvm")),
        },
        Case {
            name: "empty, microvm not offered: container, and why",
            required: vec![],
            offered: vec![container],
            want: Ok((container, "automatic, container (microvm images missing)")),
        },
        Case {
            name: "microvm required and offered",
            required: vec![microvm],
            offered: vec![container, microvm],
            want: Ok((microvm, "lists microvm first and this svcd offers it")),
        },
        Case {
            name: "microvm required, not offered: unsatisfiable",
            required: vec![microvm],
            offered: vec![container],
            want: Err("cannot be met here: microvm is not offered: microvm images missing"),
        },
        Case {
            name: "prefer-first falls back to the next listed",
            required: vec![microvm, container],
            offered: vec![container],
            want: Ok((container, "prefer-first: container (microvm is not offered")),
        },
        Case {
            name: "the old name netns is container",
            required: vec![netns],
            offered: vec![container],
            want: Ok((container, "lists container first")),
        },
    ] {
        let got =
            creation::select_runtime(&names(&c.required), &preference(), &names(&c.offered), why);
        match (got, c.want) {
            (Ok((b, reason)), Ok((want_b, want_reason))) => {
                assert_eq!(b, want_b.name(), "{}", c.name);
                assert!(reason.contains(want_reason), "{}: {reason}", c.name);
            }
            (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{}: {e}", c.name),
            (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
        }
    }
}

/// Backends of a workspace file as the registry names them (canonical: `netns` is
/// `container`).
fn names(backends: &[svc_control::config::workspace::Backend]) -> Vec<&'static str> {
    backends.iter().map(|b| b.name()).collect()
}

/// The kind a name stands for, among every kind the registry can hold.
fn canonical(name: &str) -> Option<&'static str> {
    svc_control::runtime::KINDS
        .iter()
        .find(|k| k.answers_to(name))
        .map(|k| k.name)
}

/// The automatic order: every kind, strongest isolation first.
fn preference() -> Vec<&'static str> {
    svc_control::runtime::KINDS.iter().map(|k| k.name).collect()
}

/// (name, added, removed, the hosts after).
type ChangeCase = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
);
/// (name, added, removed, bound to a repo, what the refusal says).
type ChangeRefusal = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    bool,
    &'static str,
);

#[test]
fn a_live_allowlist_change_touches_only_the_hosts_given_to_the_sandbox() {
    let host = HostConfig::default();
    let agent = svc_control::hosts::Allowlist(host.agent_hosts.clone());
    let current = vec!["allowed.example.com".to_owned(), "*.pkg.example".to_owned()];
    let change = |add: &[&str], remove: &[&str], repo: bool| {
        creation::change_allowlist(
            &current,
            &add.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
            &remove.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
            &agent,
            &host.code,
            repo,
        )
        .map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>())
        .map_err(|e| e.to_string())
    };
    let ok: &[ChangeCase] = &[
        (
            "add one",
            &["pypi.org"],
            &[],
            &["allowed.example.com", "*.pkg.example", "pypi.org"],
        ),
        (
            "remove one",
            &[],
            &["allowed.example.com"],
            &["*.pkg.example"],
        ),
        (
            "names compare normalised",
            &[],
            &["ALLOWED.example.com."],
            &["*.pkg.example"],
        ),
        (
            "adding one already there changes nothing",
            &["allowed.example.com"],
            &[],
            &["allowed.example.com", "*.pkg.example"],
        ),
        (
            "remove and add at once",
            &["b.example"],
            &["*.pkg.example"],
            &["allowed.example.com", "b.example"],
        ),
    ];
    for (name, add, remove, want) in ok {
        let got = change(add, remove, false).expect(name);
        assert_eq!(got, *want, "{name}");
    }
    let refused: &[ChangeRefusal] = &[
        (
            "nothing asked",
            &[],
            &[],
            false,
            "give hosts to add or remove",
        ),
        (
            "an agent host",
            &[],
            &[defaults::AGENT_HOSTS[0]],
            false,
            "built-in hosts",
        ),
        (
            "the code host of a --repo sandbox",
            &[],
            &[defaults::CODE_HOST],
            true,
            "recreate the sandbox without --repo",
        ),
        (
            "a host never given",
            &[],
            &["other.example"],
            false,
            "not one of the hosts this sandbox was given",
        ),
        ("a bad host", &["bad host"], &[], false, "bad host"),
        ("a public suffix wildcard", &["*.com"], &[], false, "*.com"),
    ];
    for (name, add, remove, repo, fragment) in refused {
        let e = change(add, remove, *repo).expect_err(name);
        assert!(e.contains(fragment), "{name}: {e}");
    }
}
