//! A Kubernetes pod's identity as the API carries it (`pod` of a creation request, a sandbox's
//! view and each of its audit records): `{"namespace": …, "name": …}`, checked by
//! `policy::pod_identity` as it is read, so a bad one refuses the request naming what is wrong.
//! And the change of the pod namespaces a stored secret is allowed for.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::pod_identity;

/// A pod: its namespace and name, as Kubernetes names them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "RawPod")]
pub struct PodRef {
    /// A DNS-1123 label (at most 63 characters).
    pub namespace: String,
    /// A DNS-1123 subdomain (at most 253 characters).
    pub name: String,
}

/// A pod as it arrives, before its names are checked.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawPod {
    namespace: String,
    name: String,
}

impl TryFrom<RawPod> for PodRef {
    type Error = pod_identity::PodIdentityError;

    fn try_from(raw: RawPod) -> Result<Self, Self::Error> {
        Self::new(&raw.namespace, &raw.name)
    }
}

impl PodRef {
    /// The pod `name` in `namespace`, or why Kubernetes would not take it.
    pub fn new(namespace: &str, name: &str) -> Result<Self, pod_identity::PodIdentityError> {
        pod_identity::check(namespace, name)?;
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// `NAMESPACE/NAME`, as `svc audit --pod` takes it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (ns, name) = s
            .split_once('/')
            .ok_or_else(|| format!("pod {s:?}: expected NAMESPACE/NAME, such as default/web-0"))?;
        Self::new(ns, name).map_err(|e| e.to_string())
    }
}

/// `POST /v1/secrets/{name}/pod-namespaces`: which Kubernetes namespaces' pods may name a
/// stored secret in their `svc.dev/secrets` annotation (`policy::pod_secrets`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodNamespacesChange {
    /// Namespaces to allow (`*`: every namespace).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Namespaces to allow no longer (`*` removes only the `*` entry).
    #[serde(default)]
    pub disallow: Vec<String>,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_checked_as_it_is_read() {
        let read =
            |v: serde_json::Value| serde_json::from_value::<PodRef>(v).map_err(|e| e.to_string());
        let p = read(serde_json::json!({"namespace": "team-a", "name": "agent-7"})).expect("ok");
        assert_eq!(p.to_string(), "team-a/agent-7");
        let e = read(serde_json::json!({"namespace": "Team", "name": "x"})).expect_err("bad");
        assert!(e.starts_with("pod namespace \"Team\": contains 'T'"), "{e}");
        let e = read(serde_json::json!({"namespace": "a", "name": "x", "uid": "1"}))
            .expect_err("unknown field");
        assert!(e.contains("uid"), "{e}");
        assert_eq!(PodRef::parse("team-a/agent-7"), Ok(p));
        assert!(
            PodRef::parse("team-a")
                .unwrap_err()
                .contains("NAMESPACE/NAME")
        );
        assert!(PodRef::parse("a/b/c").unwrap_err().contains("contains '/'"));
    }
}
