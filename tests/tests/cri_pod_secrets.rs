//! Which stored secrets a pod may name, through containerd's CRI as kubelet drives it: a
//! stored secret is allowed for the pod namespaces `svc secret allow` lists (none by default),
//! and a pod of another namespace that names it fails `RunPodSandbox` with svcd's message,
//! which names the secret and the namespace — the same words as for a secret that is not
//! stored at all. A pod cannot reach another namespace's secret by spelling the secret's name
//! or the annotation differently, by naming it twice, or by claiming another namespace in its
//! own annotations.

use std::sync::atomic::{AtomicU32, Ordering};

use svc_control::policy::pod;
use svc_tests::{
    cri::{Cri, pod_config_in, run_pod, shim_sandboxes, start},
    pods::{assert_no_pods, stop_remove_pod},
    require_root,
    world::{CODE_TOKEN, EXAMPLE_TOKEN, World},
};

/// The credential variable the pods bind their secret to (for allowed.example.test).
const VAR: &str = "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN";

/// svcd's refusal of a pod in `namespace` naming `secret` (as `VAR`).
fn refusal(secret: &str, namespace: &str) -> String {
    format!(
        "pod annotation svc.dev/secrets: {VAR}={secret}: no stored secret {secret} is allowed \
         for pods in namespace {namespace} (on the node: svc secret allow {secret} \
         --pod-namespace {namespace})"
    )
}

/// `RunPodSandbox` of a pod named `name-N` (a new N each time) in `namespace` with
/// `annotations` fails: its message, with containerd's escaping of quotes undone.
fn refused(cri: &Cri, namespace: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!("{name}-{}", N.fetch_add(1, Ordering::Relaxed));
    let config = pod_config_in(namespace, &name, annotations);
    match run_pod(cri, &config) {
        Ok(id) => panic!("pod {namespace}/{name} ({annotations:?}) started as {id}"),
        Err(e) => e.message().replace("\\\"", "\""),
    }
}

/// A pod's annotations: allowed.example.test and other.example.test, and `secrets` as its
/// `svc.dev/secrets`.
fn naming(secrets: &str) -> Vec<(&'static str, &str)> {
    vec![
        (pod::ALLOW_HOSTS, "allowed.example.test, other.example.test"),
        (pod::SECRETS, secrets),
    ]
}

#[test]
fn a_pod_names_only_the_secrets_allowed_for_its_namespace() {
    require_root();
    let w = World::start();
    w.store_secret("team-a-bot", EXAMPLE_TOKEN, &["team-a"]);
    let (c, cri) = start(&w);
    let bind = format!("{VAR}=team-a-bot");

    // A pod in team-b names team-a's secret: refused naming the secret and the namespace.
    let said = refused(&cri, "team-b", "agent", &naming(&bind));
    let want = refusal("team-a-bot", "team-b");
    assert!(said.contains(&want), "RunPodSandbox says {want:?}: {said}");
    // A secret that is not stored at all: the very same words, so the pod's author cannot
    // tell another namespace's secret from no secret.
    let missing = format!("{VAR}=no-such-bot");
    let said = refused(&cri, "team-b", "agent", &naming(&missing));
    assert!(said.contains(&refusal("no-such-bot", "team-b")), "{said}");
    assert_no_pods(&w, &c, &cri);

    // The secret's owner allows team-b (`svc secret show --json` has it); its pod now runs.
    w.svc_ok(&["secret", "allow", "team-a-bot", "--pod-namespace", "team-b"]);
    let shown: serde_json::Value =
        serde_json::from_str(&w.svc_ok(&["secret", "show", "team-a-bot", "--json"]))
            .expect("show json");
    assert_eq!(
        shown["pod_namespaces"],
        serde_json::json!(["team-a", "team-b"]),
        "{shown}"
    );
    let listed = w.svc_ok(&["secret", "list"]);
    assert!(listed.contains("team-a,team-b"), "{listed}");
    let config = pod_config_in("team-b", "agent", &naming(&bind));
    let id = run_pod(&cri, &config)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}\nsvcd:\n{}", w.svcd_log()));
    let names = shim_sandboxes(&w);
    assert_eq!(names.len(), 1, "{names:?}");
    let show = w.show(&names[0]);
    assert_eq!(show["pod"]["namespace"], "team-b", "{show}");
    assert!(
        show["secrets"].to_string().contains("store:team-a-bot@v1"),
        "{show}"
    );
    stop_remove_pod(&c, &cri, &id);

    // Disallowed again: refused again.
    w.svc_ok(&[
        "secret",
        "disallow",
        "team-a-bot",
        "--pod-namespace",
        "team-b",
    ]);
    let said = refused(&cri, "team-b", "agent-2", &naming(&bind));
    assert!(said.contains(&want), "{said}");
    assert_no_pods(&w, &c, &cri);
}

#[test]
fn a_pod_cannot_reach_another_namespaces_secret_by_spelling_or_annotations() {
    require_root();
    let w = World::start();
    w.store_secret("team-a-bot", EXAMPLE_TOKEN, &["team-a"]);
    w.store_secret("team-b-bot", EXAMPLE_TOKEN, &["team-b"]);
    let (c, cri) = start(&w);
    let not_for_b = refusal("team-a-bot", "team-b");

    // The secret's name in other cases is another (missing) secret, refused alike.
    let upper = format!("{VAR}=TEAM-A-BOT");
    let said = refused(&cri, "team-b", "upper", &naming(&upper));
    assert!(said.contains(&refusal("TEAM-A-BOT", "team-b")), "{said}");
    // White space around it, a version suffix: the same secret, still not team-b's.
    for spelled in [
        format!("  {VAR}=team-a-bot  "),
        format!("{VAR}=team-a-bot@v1"),
    ] {
        let said = refused(&cri, "team-b", "spelled", &naming(&spelled));
        assert!(said.contains(&not_for_b), "{spelled:?}: {said}");
    }
    // Named after one it may name, for another variable: each secret is asked.
    let after = format!("{VAR}=team-b-bot, SVC_CRED_OTHER_EXAMPLE_TEST_TOKEN=team-a-bot");
    let said = refused(&cri, "team-b", "after", &naming(&after));
    assert!(
        said.contains(
            "=team-a-bot: no stored secret team-a-bot is allowed for pods in namespace team-b"
        ),
        "{said}"
    );
    // The same variable twice, its own secret first: the second is asked too, not dropped
    // or taken as an override of the first.
    let twice = format!("{VAR}=team-b-bot, {VAR}=team-a-bot");
    let said = refused(&cri, "team-b", "twice", &naming(&twice));
    assert!(said.contains(&not_for_b), "{said}");
    // The annotation's key spelt differently beside the real one: refused by the shim, so it
    // never stands in for (or beside) `svc.dev/secrets`. (A key with a further `/` never
    // reaches the shim: containerd's `svc.dev/*` does not match across a `/`.)
    let own = format!("{VAR}=team-b-bot");
    let other = format!("{VAR}=team-a-bot");
    for key in ["svc.dev/Secrets", "svc.dev/secrets ", "svc.dev/secret"] {
        let mut annotations = naming(&own);
        annotations.push((key, other.as_str()));
        let said = refused(&cri, "team-b", "key", &annotations);
        assert!(
            said.contains(&format!("pod annotation {key}: unknown svc.dev annotation")),
            "{key:?}: {said}"
        );
    }
    // The pod claims team-a in its own annotations: containerd passes a runtime only the
    // `svc.dev/*` ones and sets the CRI's own, so the pod is still team-b's.
    let mut claims = naming(&other);
    claims.push(("io.kubernetes.cri.sandbox-namespace", "team-a"));
    let said = refused(&cri, "team-b", "claims", &claims);
    assert!(said.contains(&not_for_b), "{said}");
    // A namespace spelt as team-a in other cases is no namespace Kubernetes makes: refused.
    let said = refused(&cri, "Team-A", "cased", &naming(&other));
    assert!(
        said.contains("pod namespace \"Team-A\": contains 'T'"),
        "{said}"
    );
    assert_no_pods(&w, &c, &cri);
}

/// A pod naming a repository gets only a code-host token it names itself: the node's own
/// (`credentials.code_host_token_file`, which this world has, and which a `svc sandbox create
/// --repo` by root gets) is never brokered into a pod, whose shim asks as root for any pod
/// author on the node.
#[test]
fn a_pod_never_gets_the_nodes_own_code_host_token() {
    require_root();
    let w = World::start();
    w.store_secret("team-a-code", CODE_TOKEN, &["team-a"]);
    let (c, cri) = start(&w);
    let repo = [(pod::REPO, "acme/widgets")];
    let said = refused(&cri, "team-a", "repo", &repo);
    let want = "pod annotation svc.dev/repo needs CODE_HOST_TOKEN, and a pod never gets the \
                node's own code-host token (every pod author on the node could use it); name a \
                stored one allowed for namespace team-a: svc.dev/secrets: CODE_HOST_TOKEN=NAME \
                (on the node: svc secret set NAME --pod-namespace team-a)";
    assert!(said.contains(want), "RunPodSandbox says {want:?}: {said}");
    assert_no_pods(&w, &c, &cri);

    // Its own stored token, allowed for its namespace: the pod runs with that one.
    let config = pod_config_in(
        "team-a",
        "repo-own",
        &[repo[0], (pod::SECRETS, "CODE_HOST_TOKEN=team-a-code")],
    );
    let id = run_pod(&cri, &config)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}\nsvcd:\n{}", w.svcd_log()));
    let names = shim_sandboxes(&w);
    assert_eq!(names.len(), 1, "{names:?}");
    let show = w.show(&names[0]);
    let secrets = show["secrets"].to_string();
    assert!(secrets.contains("store:team-a-code@v1"), "{show}");
    assert!(
        !secrets.contains("host:"),
        "the node's token is not brokered: {show}"
    );
    stop_remove_pod(&c, &cri, &id);
    assert_no_pods(&w, &c, &cri);
}
