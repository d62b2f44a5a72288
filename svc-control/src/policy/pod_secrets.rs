//! Which stored secrets a Kubernetes pod may name in its `svc.dev/secrets` annotation.
//!
//! The containerd shim asks svcd as root, and root may use every entry of the secret store, so
//! the caller's uid says nothing about the pod author: the pod's namespace (from containerd's
//! CRI annotations, `policy::pod_identity`) is what decides. Each stored secret lists the pod
//! namespaces whose pods may name it (`svc secret allow NAME --pod-namespace NS`, `*` for
//! every namespace); a new secret, and every secret stored before the list existed, has none.
//!
//! | the secret's pod namespaces | the pod's namespace | the pod may name it |
//! |-----------------------------|---------------------|---------------------|
//! | none (the default)          | any                 | no                  |
//! | `team-a`                    | `team-a`            | yes                 |
//! | `team-a`                    | `team-b`            | no                  |
//! | `team-a`, `team-b`          | `team-b`            | yes                 |
//! | `*`                         | any                 | yes                 |
//! | (no such secret)            | any                 | no, the same refusal |
//!
//! Namespaces compare byte for byte: both sides are DNS-1123 labels (lowercase, no white
//! space), checked when they are stored and when the pod's identity is read, so `Team-A`,
//! ` team-a` and `team-a ` are never another spelling of `team-a`: they are refused.
//! A missing secret gets exactly the refusal of one not allowed for the pod's namespace, so a
//! pod author learns nothing of the secrets other namespaces may use. Requests without a pod
//! (`svc sandbox create`, a `ctr` task) are not asked about: `policy::ownership` decides those.

use super::pod::SECRETS;
use super::pod_identity::MAX_NAMESPACE;

/// The entry that lets pods of every namespace name a secret.
pub const ANY_NAMESPACE: &str = "*";

/// Why a pod may not name a secret, or a pod-namespace entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodSecretError {
    /// The same words for a secret that is not stored and for one stored but not allowed.
    #[error(
        "pod annotation {SECRETS}: {var}={secret}: no stored secret {secret} is allowed for pods \
         in namespace {namespace} (on the node: svc secret allow {secret} --pod-namespace \
         {namespace})"
    )]
    NotAllowed {
        var: String,
        secret: String,
        namespace: String,
    },
    #[error(
        "--pod-namespace {value:?}: {why} (a Kubernetes namespace: at most {MAX_NAMESPACE} \
         lowercase letters, digits and '-', starting and ending with a letter or digit; or * for \
         every namespace)"
    )]
    BadNamespace { value: String, why: String },
}

/// Whether a pod in `namespace` may name the stored secret `secret` (as credential variable
/// `var`): `allowed` is the secret's pod namespaces, `None` when no such secret is stored.
pub fn may_use(
    namespace: &str,
    var: &str,
    secret: &str,
    allowed: Option<&[String]>,
) -> Result<(), PodSecretError> {
    let allowed = allowed.unwrap_or_default();
    if allowed
        .iter()
        .any(|ns| ns == ANY_NAMESPACE || ns == namespace)
    {
        return Ok(());
    }
    Err(PodSecretError::NotAllowed {
        var: var.to_owned(),
        secret: secret.to_owned(),
        namespace: namespace.to_owned(),
    })
}

/// The pod-namespace entries `values` as they are stored: each checked (a namespace, or `*`),
/// sorted, once each. The first bad one is refused, naming it.
pub fn entries(values: &[String]) -> Result<Vec<String>, PodSecretError> {
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        if v != ANY_NAMESPACE {
            super::pod_identity::check_namespace(v).map_err(|why| {
                PodSecretError::BadNamespace {
                    value: v.chars().take(80).collect(),
                    why,
                }
            })?;
        }
        out.push(v.clone());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_pod_names_only_secrets_allowed_for_its_namespace() {
        // (the secret's pod namespaces, None: not stored; the pod's namespace; may it)
        let cases: &[(Option<&[&str]>, &str, bool)] = &[
            (Some(&[]), "team-a", false),
            (Some(&["team-a"]), "team-a", true),
            (Some(&["team-a"]), "team-b", false),
            (Some(&["team-a", "team-b"]), "team-b", true),
            (Some(&["*"]), "team-b", true),
            (Some(&["*"]), "default", true),
            (Some(&["team-a"]), "team-a-x", false),
            (Some(&["team-a-x"]), "team-a", false),
            (None, "team-a", false),
        ];
        for (allowed, ns, want) in cases {
            let allowed = allowed.map(list);
            let got = may_use(ns, "GH_TOKEN", "gh", allowed.as_deref());
            assert_eq!(got.is_ok(), *want, "{allowed:?} for {ns}: {got:?}");
        }
    }

    #[test]
    fn a_missing_secret_is_refused_as_one_not_allowed() {
        let missing = may_use("team-b", "GH_TOKEN", "gh", None).expect_err("missing");
        let other = may_use("team-b", "GH_TOKEN", "gh", Some(&list(&["team-a"])))
            .expect_err("another namespace's");
        assert_eq!(missing, other);
        assert_eq!(
            missing.to_string(),
            "pod annotation svc.dev/secrets: GH_TOKEN=gh: no stored secret gh is allowed for \
             pods in namespace team-b (on the node: svc secret allow gh --pod-namespace team-b)"
        );
    }

    #[test]
    fn entries_are_namespaces_or_star_sorted_once_each() {
        assert_eq!(
            entries(&list(&["team-b", "*", "team-a", "team-b"])),
            Ok(list(&["*", "team-a", "team-b"]))
        );
        assert_eq!(entries(&[]), Ok(vec![]));
        let bad: &[(&str, &str)] = &[
            ("Team-A", "contains 'T'"),
            (" team-a", "contains ' '"),
            ("team-a ", "contains ' '"),
            ("", "empty"),
            ("team-*", "contains '*'"),
            ("**", "contains '*'"),
            ("a.b", "contains '.'"),
            ("-a", "starts or ends with '-'"),
        ];
        for (value, why) in bad {
            let e = entries(&list(&["ok", *value]))
                .expect_err(value)
                .to_string();
            assert!(
                e.starts_with(&format!("--pod-namespace {value:?}: {why}")),
                "{e}"
            );
        }
        let long = "a".repeat(MAX_NAMESPACE + 1);
        let e = entries(&[long]).expect_err("long").to_string();
        assert!(e.contains("64 characters, the limit is 63"), "{e}");
    }
}
