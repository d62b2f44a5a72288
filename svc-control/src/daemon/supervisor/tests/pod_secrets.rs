//! A pod's request names only the stored secrets allowed for its namespace
//! (`policy::pod_secrets`), refused in the same words when the secret is not stored at all;
//! creations without a pod are not asked.

use super::{World, request};
use crate::{
    api::{CreateSandbox, PodNamespacesChange, PodRef, SecretValue, SetSecret},
    policy::ownership::Principal,
};

/// A request for sandbox `name` binding the stored secret `secret`, from a pod of namespace
/// `pod` if one is given.
fn naming(name: &str, secret: &str, pod: Option<&str>) -> CreateSandbox {
    let mut req = request(name);
    req.allow_hosts = vec!["allowed.example.test".into()];
    req.secrets = vec![SecretValue {
        name: "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN".into(),
        source: format!("store:{secret}"),
        value: String::new(),
    }];
    req.pod = pod.map(|ns| PodRef::new(ns, name).expect("a pod"));
    req
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// `svc secret set NAME --pod-namespace …`, as root.
async fn store(w: &World, name: &str, namespaces: &[&str]) {
    let set = SetSecret {
        name: name.into(),
        value: "token".into(),
        oauth: None,
        pod_namespaces: strings(namespaces),
    };
    let info = w
        .sup
        .secret_set(&Principal::ROOT, set)
        .await
        .expect("stored");
    let mut want = strings(namespaces);
    want.sort();
    assert_eq!(info.pod_namespaces, want);
}

/// `svc secret allow|disallow NAME --pod-namespace …`, as root.
fn change(w: &World, name: &str, allow: &[&str], disallow: &[&str]) -> Vec<String> {
    let change = PodNamespacesChange {
        allow: strings(allow),
        disallow: strings(disallow),
    };
    w.sup
        .secret_pod_namespaces(&Principal::ROOT, name, &change)
        .expect("changed")
        .pod_namespaces
}

fn refusal(secret: &str, namespace: &str) -> String {
    format!(
        "pod annotation svc.dev/secrets: SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN={secret}: no stored \
         secret {secret} is allowed for pods in namespace {namespace} (on the node: svc secret \
         allow {secret} --pod-namespace {namespace})"
    )
}

#[tokio::test]
async fn a_pod_names_only_the_secrets_allowed_for_its_namespace() {
    let w = World::new();
    store(&w, "team-a-bot", &["team-a"]).await;
    store(&w, "everyone", &["*"]).await;
    store(&w, "unscoped", &[]).await;
    w.created(naming("a-1", "team-a-bot", Some("team-a"))).await;
    w.created(naming("b-1", "everyone", Some("team-b"))).await;
    // Another namespace's, one allowed for none, one not stored: one refusal, before anything
    // is built.
    w.calls.clear();
    for secret in ["team-a-bot", "unscoped", "not-stored"] {
        let f = w.refused(naming("b-2", secret, Some("team-b"))).await;
        assert_eq!(f.status, 403, "{}", f.message);
        assert_eq!(f.message, refusal(secret, "team-b"));
    }
    let built: Vec<_> = w
        .calls
        .steps()
        .into_iter()
        .filter(|s| !s.starts_with("store.secret_get"))
        .collect();
    assert!(built.is_empty(), "{built:?}");
    // Without a pod the request is not asked: root binds every secret, as before.
    w.created(naming("plain", "unscoped", None)).await;

    assert_eq!(
        change(&w, "team-a-bot", &["team-b"], &[]),
        ["team-a", "team-b"]
    );
    w.created(naming("b-3", "team-a-bot", Some("team-b"))).await;
    assert_eq!(change(&w, "team-a-bot", &[], &["team-a"]), ["team-b"]);
    let f = w.refused(naming("a-2", "team-a-bot", Some("team-a"))).await;
    assert_eq!(f.message, refusal("team-a-bot", "team-a"));
    // `*` removes only the `*` entry.
    assert_eq!(change(&w, "everyone", &["team-c"], &["*"]), ["team-c"]);
}

#[tokio::test]
async fn pod_namespace_entries_are_checked_and_a_missing_secret_is_named() {
    let w = World::new();
    store(&w, "gh", &[]).await;
    for bad in ["Team-A", " team-a", "team-a ", "team-*", ""] {
        let change = PodNamespacesChange {
            allow: strings(&[bad]),
            disallow: Vec::new(),
        };
        let f = w
            .sup
            .secret_pod_namespaces(&Principal::ROOT, "gh", &change)
            .expect_err(bad);
        assert_eq!(f.status, 400, "{}", f.message);
        assert!(
            f.message.starts_with(&format!("--pod-namespace {bad:?}: ")),
            "{}",
            f.message
        );
    }
    let set = SetSecret {
        name: "other".into(),
        value: "token".into(),
        oauth: None,
        pod_namespaces: strings(&["Team-A"]),
    };
    let f = w
        .sup
        .secret_set(&Principal::ROOT, set)
        .await
        .expect_err("a bad namespace");
    assert_eq!(f.status, 400, "{}", f.message);
    let empty = PodNamespacesChange::default();
    let f = w
        .sup
        .secret_pod_namespaces(&Principal::ROOT, "gh", &empty)
        .expect_err("nothing asked");
    assert!(f.message.contains("--pod-namespace"), "{}", f.message);
    let change = PodNamespacesChange {
        allow: strings(&["team-a"]),
        disallow: Vec::new(),
    };
    let f = w
        .sup
        .secret_pod_namespaces(&Principal::ROOT, "nope", &change)
        .expect_err("missing");
    assert_eq!(f.status, 404, "{}", f.message);
    // Nothing was stored by the refusals.
    assert_eq!(
        w.sup.secret_list(&Principal::ROOT).expect("list")[0].pod_namespaces,
        Vec::<String>::new()
    );
}
