//! A pod's identity as svc records it: its Kubernetes namespace and name, carried from the CRI
//! annotations containerd puts on every task of a pod into the creation request (`pod`), kept
//! with the sandbox, written in each of its audit records and put on its metrics.
//!
//! The names are checked as Kubernetes checks them (a namespace is a DNS-1123 label, at most
//! 63 characters; a pod's name a DNS-1123 subdomain, at most 253), so what lands in the audit
//! log and in metric labels is a name Kubernetes could have made: no spaces, quotes, control
//! characters or unbounded lengths.

use std::collections::BTreeMap;

/// containerd's CRI plugin (1.6, 1.7) puts the pod's namespace on each of its tasks' specs.
pub const CRI_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
/// … and the pod's name.
pub const CRI_NAME: &str = "io.kubernetes.cri.sandbox-name";

/// The longest namespace (a DNS-1123 label).
pub const MAX_NAMESPACE: usize = 63;
/// The longest pod name (a DNS-1123 subdomain).
pub const MAX_POD_NAME: usize = 253;

/// Why a pod's identity is refused; each message names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodIdentityError {
    #[error(
        "pod namespace {value:?}: {why} (a DNS-1123 label: at most {MAX_NAMESPACE} lowercase letters, digits and '-', starting and ending with a letter or digit)"
    )]
    Namespace { value: String, why: String },
    #[error(
        "pod name {value:?}: {why} (a DNS-1123 subdomain: at most {MAX_POD_NAME} characters, lowercase letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit)"
    )]
    Name { value: String, why: String },
    #[error("pod annotations: {present} is given without {missing}; containerd's CRI sets both")]
    Half {
        present: &'static str,
        missing: &'static str,
    },
}

/// Check a namespace and a pod's name; `Ok` when Kubernetes would take both.
pub fn check(namespace: &str, name: &str) -> Result<(), PodIdentityError> {
    label(namespace, MAX_NAMESPACE).map_err(|why| PodIdentityError::Namespace {
        value: namespace.to_owned(),
        why,
    })?;
    subdomain(name).map_err(|why| PodIdentityError::Name {
        value: name.to_owned(),
        why,
    })
}

/// A namespace as Kubernetes takes it (a DNS-1123 label of at most [`MAX_NAMESPACE`]), or why
/// not (`policy::pod_secrets` checks a secret's pod namespaces with it).
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    label(namespace, MAX_NAMESPACE)
}

/// The pod's (namespace, name) from a task's annotations: none when neither CRI annotation is
/// there (a task `ctr` made), refused when only one is or either breaks Kubernetes' rules.
pub fn from_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<(String, String)>, PodIdentityError> {
    let ns = annotations.get(CRI_NAMESPACE);
    let name = annotations.get(CRI_NAME);
    match (ns, name) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(PodIdentityError::Half {
            present: CRI_NAMESPACE,
            missing: CRI_NAME,
        }),
        (None, Some(_)) => Err(PodIdentityError::Half {
            present: CRI_NAME,
            missing: CRI_NAMESPACE,
        }),
        (Some(ns), Some(name)) => {
            check(ns, name)?;
            Ok(Some((ns.clone(), name.clone())))
        }
    }
}

/// A DNS-1123 label of at most `max` characters, or why not.
fn label(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("empty".into());
    }
    if s.len() > max {
        return Err(format!("{} characters, the limit is {max}", s.len()));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!("contains {c:?}"));
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err("starts or ends with '-'".into());
    }
    Ok(())
}

/// A DNS-1123 subdomain, or why not.
fn subdomain(s: &str) -> Result<(), String> {
    if s.len() > MAX_POD_NAME {
        return Err(format!(
            "{} characters, the limit is {MAX_POD_NAME}",
            s.len()
        ));
    }
    if s.is_empty() {
        return Err("empty".into());
    }
    for part in s.split('.') {
        label(part, MAX_POD_NAME).map_err(|why| match why.as_str() {
            "empty" => "has an empty part between dots".to_owned(),
            _ => why,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_and_names_follow_kubernetes_rules() {
        let ok: &[(&str, &str)] = &[
            ("default", "web-0"),
            ("kube-system", "coredns-5d78c9869d-abcde"),
            ("a", "a.b.c"),
            ("team-1", "7up"),
        ];
        for (ns, name) in ok {
            assert_eq!(check(ns, name), Ok(()), "{ns}/{name}");
        }
        let long_ns = "a".repeat(MAX_NAMESPACE + 1);
        let long_name = format!("{}.b", "a".repeat(MAX_POD_NAME));
        let bad: &[(&str, &str, &str)] = &[
            ("", "web", "pod namespace \"\": empty"),
            ("Default", "web", "contains 'D'"),
            ("-x", "web", "starts or ends with '-'"),
            ("a.b", "web", "pod namespace \"a.b\": contains '.'"),
            (&long_ns, "web", "64 characters, the limit is 63"),
            ("ns", "", "pod name \"\": empty"),
            ("ns", "web..0", "empty part between dots"),
            ("ns", "web.", "empty part between dots"),
            ("ns", "web_0", "contains '_'"),
            ("ns", "web 0", "contains ' '"),
            ("ns", "we\"b", "contains '\"'"),
            ("ns", "web-.x", "starts or ends with '-'"),
            ("ns", &long_name, "the limit is 253"),
        ];
        for (ns, name, want) in bad {
            let e = check(ns, name).expect_err(name).to_string();
            assert!(e.contains(want), "{ns}/{name}: {e}");
        }
    }

    #[test]
    fn the_cri_annotations_make_the_identity_both_or_neither() {
        let mut a = BTreeMap::from([("svc.dev/repo".to_owned(), "x/y".to_owned())]);
        assert_eq!(from_annotations(&a), Ok(None));
        a.insert(CRI_NAMESPACE.into(), "team-a".into());
        let e = from_annotations(&a).expect_err("half").to_string();
        assert!(e.contains(CRI_NAME), "{e}");
        a.insert(CRI_NAME.into(), "agent-7".into());
        assert_eq!(
            from_annotations(&a),
            Ok(Some(("team-a".into(), "agent-7".into())))
        );
        a.insert(CRI_NAME.into(), "Agent 7".into());
        let e = from_annotations(&a).expect_err("bad name").to_string();
        assert!(e.starts_with("pod name \"Agent 7\""), "{e}");
        a.remove(CRI_NAMESPACE);
        let e = from_annotations(&a).expect_err("half").to_string();
        assert!(e.contains(CRI_NAMESPACE), "{e}");
    }
}
