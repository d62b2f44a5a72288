//! `policy::pod`: a pod's `svc.dev/*` annotations as the creation request the API takes, and
//! its refusals — the creation rules' own messages for what `svc sandbox create` would refuse
//! too, the annotation named for what only a pod can get wrong. Named table cases.

use std::collections::BTreeMap;

use svc_control::{
    api::{CreateSandbox, SandboxName, SecretValue},
    config::host::HostConfig,
    policy::{
        creation::{self, Request, Secret},
        pod::{self, PodError},
    },
};

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn name() -> SandboxName {
    SandboxName::new("pod-a").unwrap_or_else(|e| panic!("a valid name: {e}"))
}

/// The annotations' request, checked: its refusal's message, or the request.
fn decide(pairs: &[(&str, &str)]) -> Result<CreateSandbox, String> {
    let req =
        pod::request_from_annotations(name(), &annotations(pairs)).map_err(|e| e.to_string())?;
    pod::check(&HostConfig::default(), &req).map_err(|e| e.to_string())?;
    Ok(req)
}

/// What `svc sandbox create` says of the same request given as flags.
fn cli_refusal(
    allow_hosts: &[String],
    repo: Option<&str>,
    secrets: &[(&'static str, &'static str)],
) -> String {
    let secrets: Vec<Secret<'_>> = secrets
        .iter()
        .map(|(name, store)| Secret {
            name,
            source: store,
            value: "stored",
        })
        .collect();
    let req = Request {
        egress: None,
        context_path: false,
        allow_hosts,
        repo,
        secrets: &secrets,
        project_egress: None,
    };
    match creation::plan(&HostConfig::default(), &req) {
        Ok(_) => panic!("the flags' request must be refused too"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_annotation_maps_onto_its_request_field() {
    let req = decide(&[
        (
            pod::ALLOW_HOSTS,
            "api.example.test, *.pkg.example.test\tdocs.example.test",
        ),
        (pod::REPO, "acme/widget"),
        (pod::SECRETS, "CODE_HOST_TOKEN=gh"),
        (pod::BACKEND, "microvm"),
        (pod::BRANCHES, "refs/heads/svc/**, refs/heads/agent/*"),
        // The CRI's pod identity becomes the request's `pod`.
        ("io.kubernetes.cri.sandbox-name", "pod-a"),
        ("io.kubernetes.cri.sandbox-namespace", "team-a"),
        // Others' annotations are theirs: not read, not refused.
        ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ("svc.dev.example/other", "x"),
    ])
    .unwrap_or_else(|e| panic!("valid annotations: {e}"));
    assert_eq!(
        req.allow_hosts,
        [
            "api.example.test",
            "*.pkg.example.test",
            "docs.example.test"
        ]
    );
    assert_eq!(req.repo.as_deref(), Some("acme/widget"));
    assert_eq!(
        req.pod.as_ref().map(ToString::to_string).as_deref(),
        Some("team-a/pod-a")
    );
    assert_eq!(
        req.secrets,
        [SecretValue {
            name: "CODE_HOST_TOKEN".into(),
            source: "store:gh".into(),
            value: String::new(),
        }],
        "a store reference, as --secret CODE_HOST_TOKEN@store:gh sends it: no value"
    );
    assert_eq!(req.backend.as_deref(), Some("microvm"));
    assert_eq!(
        req.allowed_branches,
        ["refs/heads/svc/**", "refs/heads/agent/*"]
    );
    assert_eq!(req.egress, None, "curated, as svc sandbox create's default");
}

#[test]
fn a_pod_without_svc_annotations_is_a_default_curated_request() {
    let req = decide(&[("app", "web")]).unwrap_or_else(|e| panic!("{e}"));
    let plain: CreateSandbox = serde_json::from_value(serde_json::json!({ "name": "pod-a" }))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(req, plain);
}

/// A named case: the annotations and the exact message of their refusal.
type Case = (&'static str, Vec<(&'static str, &'static str)>, String);

#[test]
fn refused_annotations_say_what_svc_sandbox_create_would() {
    let one = |s: &str| vec![s.to_owned()];
    let cases: Vec<Case> = vec![
        (
            "a misspelt svc.dev key is named, never ignored",
            vec![("svc.dev/allow-host", "api.example.test")],
            "pod annotation svc.dev/allow-host: unknown svc.dev annotation; svc reads \
             svc.dev/allow-hosts, svc.dev/repo, svc.dev/secrets, svc.dev/backend, svc.dev/branches"
                .into(),
        ),
        (
            "an empty value",
            vec![(pod::REPO, "  ")],
            "pod annotation svc.dev/repo: empty; give a value or leave the annotation out".into(),
        ),
        (
            "a secret given as a value, not a store reference",
            vec![(pod::SECRETS, "ghp_0123456789")],
            "pod annotation svc.dev/secrets: \"ghp_0123456789\" is not VAR=NAME (a credential \
             variable and the name of an entry of the node's secret store, e.g. \
             CODE_HOST_TOKEN=gh; never a value)"
                .into(),
        ),
        (
            "a host that is no host: --allow-host's message",
            vec![(pod::ALLOW_HOSTS, "ok.example.test,http://x.example.test/")],
            cli_refusal(
                &["ok.example.test".into(), "http://x.example.test/".into()],
                None,
                &[],
            ),
        ),
        (
            "a repository that is not owner/repo: --repo's message",
            vec![(pod::REPO, "widget")],
            cli_refusal(&[], Some("widget"), &[]),
        ),
        (
            "CODE_HOST_TOKEN without a repository: --secret's message and hint",
            vec![(pod::SECRETS, "CODE_HOST_TOKEN=gh")],
            cli_refusal(&[], None, &[("CODE_HOST_TOKEN", "store:gh")]),
        ),
        (
            "the same variable twice",
            vec![
                (pod::REPO, "acme/widget"),
                (pod::SECRETS, "CODE_HOST_TOKEN=gh,CODE_HOST_TOKEN=other"),
            ],
            cli_refusal(
                &[],
                Some("acme/widget"),
                &[
                    ("CODE_HOST_TOKEN", "store:gh"),
                    ("CODE_HOST_TOKEN", "store:other"),
                ],
            ),
        ),
        (
            "a backend svc has no kind of",
            vec![(pod::BACKEND, "gvisor")],
            "pod annotation svc.dev/backend: \"gvisor\" is no backend; expected container or \
             microvm (netns is container's old name)"
                .into(),
        ),
        (
            "a branch that is no ref pattern",
            vec![(pod::BRANCHES, "main")],
            creation::branches(&one("main"))
                .map(|_| String::new())
                .unwrap_or_else(|e| e.to_string()),
        ),
    ];
    for (what, pairs, want) in cases {
        assert!(
            !want.is_empty(),
            "{what}: the expected refusal is a refusal"
        );
        assert_eq!(decide(&pairs).err(), Some(want), "{what}");
    }
}

#[test]
fn a_branch_pattern_is_a_ref_name_once_its_globs_are_set_aside() {
    let cases: &[(&str, bool)] = &[
        ("refs/heads/svc/**", true),
        ("refs/heads/agent-[0-9]*", true),
        ("refs/tags/v?", true),
        ("main", false),
        ("refs/heads/../main", false),
        ("refs/heads/a b", false),
        ("refs/heads//x", false),
        ("refs/heads/.hidden", false),
        ("refs/heads/x.lock", false),
        ("refs/heads/x:y", false),
    ];
    for (pattern, ok) in cases {
        assert_eq!(
            creation::branches(&[(*pattern).to_owned()]).is_ok(),
            *ok,
            "{pattern}"
        );
    }
    assert_eq!(
        creation::branches(&[]).ok(),
        Some(vec!["refs/heads/svc/**".to_owned()]),
        "none given: the default"
    );
}

#[test]
fn pod_errors_wrap_the_creation_rules_unchanged() {
    let req = pod::request_from_annotations(name(), &annotations(&[(pod::REPO, "widget")]))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = pod::check(&HostConfig::default(), &req).expect_err("widget is no owner/repo");
    assert_eq!(
        PodError::from(e.clone()).to_string(),
        e.to_string(),
        "a pod's refusal is the rule's message, nothing added"
    );
}

#[test]
fn the_backend_annotation_names_a_kind_by_its_canonical_name() {
    use svc_control::kinds;
    let kind_of = |pairs: &[(&str, &str)]| {
        let req = pod::request_from_annotations(name(), &annotations(pairs))
            .unwrap_or_else(|e| panic!("{pairs:?}: {e}"));
        (req.backend.clone(), pod::backend(&req).map(|k| k.name))
    };
    assert_eq!(kind_of(&[]), (None, Ok(kinds::DEFAULT.name)));
    assert_eq!(
        kind_of(&[(pod::BACKEND, "microvm")]),
        (Some("microvm".into()), Ok("microvm"))
    );
    assert_eq!(
        kind_of(&[(pod::BACKEND, "netns")]),
        (Some("container".into()), Ok("container")),
        "an old name becomes its kind's"
    );
    // A request made otherwise, with a name no kind answers to: refused by the annotation.
    let mut req = CreateSandbox::named(name());
    req.backend = Some("gvisor".into());
    let e = pod::backend(&req).expect_err("no such kind");
    assert!(
        e.to_string()
            .starts_with("pod annotation svc.dev/backend: \"gvisor\""),
        "{e}"
    );
}
