//! Every manifest under `deploy/kubernetes/` fits the Kubernetes API types or the agent-sandbox
//! CRDs with no unknown field, its svc pods' annotations make a valid sandbox, and containerd's
//! snippets register the RuntimeClass's handler; broken copies of them are refused, naming what
//! is wrong.
#![expect(
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use svc_k8s_manifests::{Crds, check, check_containerd, files_ending, read_yaml, yaml_files};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn crds() -> Crds {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../tests/data/agent-sandbox");
    Crds::load(&dir).expect("the CRD copies load")
}

fn manifest(rel: &str) -> Value {
    read_yaml(&deploy().join(rel)).expect("the manifest reads")
}

#[test]
fn every_manifest_fits_its_api_type_or_crd() {
    let crds = crds();
    let mut seen = Vec::new();
    let mut svc_pods = 0;
    for path in yaml_files(&deploy()).expect("deploy/kubernetes lists") {
        let doc = read_yaml(&path).expect("reads");
        let checked = check(&doc, &crds).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        svc_pods += checked.svc_pods;
        seen.push(checked.what);
    }
    for kind in [
        "v1 Namespace svc-system",
        "node.k8s.io/v1 RuntimeClass svc",
        "apps/v1 DaemonSet svcd",
        "extensions.agents.x-k8s.io/v1beta1 SandboxTemplate coding-agent",
        "extensions.agents.x-k8s.io/v1beta1 SandboxWarmPool coding-agent-pool",
        "extensions.agents.x-k8s.io/v1beta1 SandboxClaim fix-issue-42",
    ] {
        assert!(seen.iter().any(|s| s == kind), "{kind} not among {seen:?}");
    }
    assert_eq!(svc_pods, 1, "the template's pods run on svc");
}

#[test]
fn containerd_snippets_register_the_runtime_class_handler() {
    let snippets = files_ending(&deploy().join("containerd"), ".toml").expect("lists");
    assert_eq!(snippets.len(), 2, "containerd 1.x and 2.x: {snippets:?}");
    for path in snippets {
        let text = std::fs::read_to_string(&path).expect("reads");
        check_containerd(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    assert_eq!(
        manifest("runtimeclass.yaml")["handler"],
        svc_k8s_manifests::HANDLER
    );
}

/// A named broken copy: the file, the change, and a part of the refusal's message.
type Broken = (&'static str, &'static str, fn(&mut Value), &'static str);

#[test]
fn broken_manifests_are_refused_naming_what_is_wrong() {
    let crds = crds();
    let cases: &[Broken] = &[
        (
            "a misspelt pod field in the DaemonSet (the API types would drop it)",
            "daemonset.yaml",
            |d| d["spec"]["template"]["spec"]["hostNetwrok"] = json!(true),
            "unknown field .spec.template.spec.hostNetwrok",
        ),
        (
            "a container field the API does not have",
            "daemonset.yaml",
            |d| d["spec"]["template"]["spec"]["containers"][0]["privileged"] = json!(true),
            "unknown field .spec.template.spec.containers[0].privileged",
        ),
        (
            "a wrong type",
            "daemonset.yaml",
            |d| d["spec"]["template"]["spec"]["hostPID"] = json!("yes"),
            "invalid type",
        ),
        (
            "a RuntimeClass for another handler",
            "runtimeclass.yaml",
            |d| d["handler"] = json!("runc"),
            "RuntimeClass handler \"runc\"",
        ),
        (
            "a SandboxTemplate field the CRD does not have",
            "examples/agent-sandbox/template.yaml",
            |d| d["spec"]["networkPolicyManagment"] = json!("Unmanaged"),
            "networkPolicyManagment",
        ),
        (
            "a value outside the CRD's enum",
            "examples/agent-sandbox/claim.yaml",
            |d| d["spec"]["lifecycle"]["shutdownPolicy"] = json!("Later"),
            "shutdownPolicy",
        ),
        (
            "a claim without its required warm pool",
            "examples/agent-sandbox/claim.yaml",
            |d| {
                if let Some(spec) = d["spec"].as_object_mut() {
                    spec.remove("warmPoolRef");
                }
            },
            "warmPoolRef",
        ),
        (
            "a pod field inside the template that the API does not have",
            "examples/agent-sandbox/template.yaml",
            |d| d["spec"]["podTemplate"]["spec"]["runtimeClass"] = json!("svc"),
            "'runtimeClass' was unexpected) at /spec/podTemplate/spec",
        ),
        (
            "a misspelt svc.dev annotation",
            "examples/agent-sandbox/template.yaml",
            |d| {
                d["spec"]["podTemplate"]["metadata"]["annotations"]["svc.dev/allowhosts"] =
                    json!("x.example")
            },
            "pod annotation svc.dev/allowhosts: unknown svc.dev annotation",
        ),
        (
            "a svc.dev annotation the creation rules refuse",
            "examples/agent-sandbox/template.yaml",
            |d| {
                d["spec"]["podTemplate"]["metadata"]["annotations"]["svc.dev/repo"] =
                    json!("widget")
            },
            "--repo \"widget\"",
        ),
        (
            "a claim adding a bad svc.dev annotation",
            "examples/agent-sandbox/claim.yaml",
            |d| {
                d["spec"]["additionalPodMetadata"] =
                    json!({"annotations": {"svc.dev/backend": "gvisor"}})
            },
            "svc.dev/backend: \"gvisor\" is no backend",
        ),
        (
            "a kind nothing describes",
            "namespace.yaml",
            |d| d["kind"] = json!("Namespaces"),
            "no API type or CRD for this kind",
        ),
    ];
    for (what, file, change, want) in cases {
        let mut doc = manifest(file);
        check(&doc, &crds).unwrap_or_else(|e| panic!("{what}: the original must pass: {e}"));
        change(&mut doc);
        match check(&doc, &crds) {
            Ok(c) => panic!("{what}: {} was accepted", c.what),
            Err(e) => assert!(e.contains(want), "{what}: {e:?} does not say {want:?}"),
        }
    }
}

#[test]
fn broken_containerd_snippets_are_refused() {
    let good =
        std::fs::read_to_string(deploy().join("containerd/containerd-2.x.toml")).expect("reads");
    let cases = [
        (
            "another runtime type",
            good.replace("io.containerd.svc.v1", "io.containerd.runc.v2"),
            "runtime_type",
        ),
        (
            "the annotations not passed on",
            good.replace("pod_annotations = [\"svc.dev/*\"]", ""),
            "pod_annotations",
        ),
        (
            "a misspelt key",
            good.replace("pod_annotations", "pod_anotations"),
            "unexpected key pod_anotations",
        ),
        (
            "a 1.x table under the 2.x version",
            good.replace("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"),
            "no [plugins.\"io.containerd.cri.v1.runtime\"",
        ),
        (
            "another handler name",
            good.replace("runtimes.svc]", "runtimes.svc-vm]"),
            "runtimes.svc] table",
        ),
    ];
    for (what, text, want) in cases {
        match check_containerd(&text) {
            Ok(()) => panic!("{what}: accepted"),
            Err(e) => assert!(e.contains(want), "{what}: {e:?} does not say {want:?}"),
        }
    }
}
