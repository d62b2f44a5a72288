//! Policy from a Kubernetes pod: its `svc.dev/*` annotations read as the creation request the
//! API takes ([`CreateSandbox`]), then checked by `policy::creation` exactly as a
//! `svc sandbox create` request is, so a refused pod carries the same message. Pure: the
//! containerd shim reads a pod's annotations with it before it asks svcd, and svcd checks the
//! request again as it checks every request.
//!
//! | annotation            | value                                   | request field      |
//! |-----------------------|-----------------------------------------|--------------------|
//! | `svc.dev/allow-hosts` | hosts, separated by commas or spaces    | `allow_hosts`      |
//! | `svc.dev/repo`        | `owner/repo` on the code host           | `repo`             |
//! | `svc.dev/secrets`     | `VAR=NAME` pairs, separated by commas   | `secrets` (`store:NAME`) |
//! | `svc.dev/backend`     | `container` or `microvm`                | `backend` (canonical) |
//! | `svc.dev/branches`    | ref patterns, separated by commas/spaces | `allowed_branches` |
//!
//! `svc.dev/secrets` names entries of the node's secret store (`svc secret set NAME` on the
//! node): a reference, never a value. svcd resolves it at creation, as it does `--secret
//! VAR@store:NAME`. Any other `svc.dev/` key is refused, naming it: a misspelt annotation
//! would otherwise leave the pod with less than its author asked for, silently. Annotations
//! outside `svc.dev/` belong to others and are not read, but for the two containerd's CRI
//! plugin puts on every task of a pod, `io.kubernetes.cri.sandbox-namespace` and
//! `io.kubernetes.cri.sandbox-name`: they become the request's `pod` (`policy::pod_identity`).

use std::collections::BTreeMap;

use super::creation::{self, CreationError};
use crate::api::{CreateSandbox, SandboxName, SecretValue};
use crate::config::host::HostConfig;
use crate::kinds::{self, Kind};

/// The prefix every annotation svc reads starts with.
pub const PREFIX: &str = "svc.dev/";
/// Hosts added to the Curated allowlist (`--allow-host`).
pub const ALLOW_HOSTS: &str = "svc.dev/allow-hosts";
/// The code-host repository the sandbox is bound to (`--repo`).
pub const REPO: &str = "svc.dev/repo";
/// Credentials brokered from the node's secret store (`--secret VAR@store:NAME`).
pub const SECRETS: &str = "svc.dev/secrets";
/// The backend (`--backend`).
pub const BACKEND: &str = "svc.dev/backend";
/// AllowedBranches: the refs pushes may update.
pub const BRANCHES: &str = "svc.dev/branches";
/// Every annotation svc reads, in the order the docs list them.
pub const KNOWN: [&str; 5] = [ALLOW_HOSTS, REPO, SECRETS, BACKEND, BRANCHES];

/// Why a pod's annotations make no request; each message names the annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    #[error("pod annotation {key}: unknown svc.dev annotation; svc reads {}", KNOWN.join(", "))]
    UnknownKey { key: String },
    #[error("pod annotation {key}: empty; give a value or leave the annotation out")]
    Empty { key: &'static str },
    #[error(
        "pod annotation {SECRETS}: {entry:?} is not VAR=NAME (a credential variable and the \
         name of an entry of the node's secret store, e.g. CODE_HOST_TOKEN=gh; never a value)"
    )]
    BadSecret { entry: String },
    #[error(
        "pod annotation {BACKEND}: {value:?} is no backend; expected container or microvm \
         (netns is container's old name)"
    )]
    UnknownBackend { value: String },
    #[error(
        "container {id}: asks for a read-only root file system (readOnlyRootFilesystem, ctr run \
         --read-only), which svc does not give a container yet; it runs on no writable root it \
         was not asked for: leave the setting out"
    )]
    ReadOnlyRoot { id: String },
    /// The request the annotations make is refused by the creation rules (their message).
    #[error(transparent)]
    Creation(#[from] CreationError),
    /// The CRI's pod namespace or name is not one Kubernetes makes.
    #[error(transparent)]
    Identity(#[from] super::pod_identity::PodIdentityError),
}

/// The creation request a pod's annotations make, for the sandbox `name`: the `svc.dev/*`
/// annotations mapped onto [`CreateSandbox`] (others ignored), every other field its default.
/// Only the shape is checked here; [`check`] applies the creation rules.
pub fn request_from_annotations(
    name: SandboxName,
    annotations: &BTreeMap<String, String>,
) -> Result<CreateSandbox, PodError> {
    let mut req = CreateSandbox::named(name);
    req.pod = super::pod_identity::from_annotations(annotations)?
        .map(|(namespace, name)| crate::api::PodRef { namespace, name });
    for (key, value) in annotations {
        if !key.starts_with(PREFIX) {
            continue;
        }
        let Some(known) = KNOWN.iter().copied().find(|k| k == key) else {
            return Err(PodError::UnknownKey { key: key.clone() });
        };
        let value = value.trim();
        if value.is_empty() {
            return Err(PodError::Empty { key: known });
        }
        match known {
            ALLOW_HOSTS => req.allow_hosts = list(value),
            REPO => req.repo = Some(value.to_owned()),
            SECRETS => req.secrets = secrets(value)?,
            BACKEND => req.backend = Some(backend_name(value)?.to_owned()),
            _ => req.allowed_branches = list(value),
        }
    }
    Ok(req)
}

/// The kind of backend a pod's request runs on: the one its `svc.dev/backend` names, the
/// default kind (container) when it names none. A name no kind answers to is refused, naming
/// the annotation (as [`request_from_annotations`] refuses it).
pub fn backend(req: &CreateSandbox) -> Result<Kind, PodError> {
    match req.backend.as_deref() {
        None => Ok(kinds::DEFAULT),
        Some(name) => kinds::named(name).ok_or_else(|| PodError::UnknownBackend {
            value: name.to_owned(),
        }),
    }
}

/// A backend annotation's value as its kind's canonical name (`netns` is `container`).
fn backend_name(value: &str) -> Result<&'static str, PodError> {
    kinds::named(value)
        .map(|k| k.name)
        .ok_or_else(|| PodError::UnknownBackend {
            value: value.to_owned(),
        })
}

/// What container `id` (a pod's, or a task of its own) asks of its root file system: a
/// read-only root (`readonly`, the OCI spec's `root.readonly`) is refused, naming it, rather
/// than run with less than was asked. A pod's sandbox ("pause") container, whose root the
/// CRI plugin always makes read-only and which runs nothing, is not checked.
pub fn container_root(id: &str, readonly: bool) -> Result<(), PodError> {
    if readonly {
        return Err(PodError::ReadOnlyRoot { id: id.to_owned() });
    }
    Ok(())
}

/// A pod's request checked by the creation rules as svcd checks a `svc sandbox create`:
/// the flags' combination, each host and the repository, each secret's variable (a stored
/// secret's value is svcd's to read, so only its reference is checked here), and the
/// branches, and the backend's name (whether this node's svcd offers it is svcd's to say).
pub fn check(host: &HostConfig, req: &CreateSandbox) -> Result<(), CreationError> {
    let every: Vec<&'static str> = crate::kinds::KINDS.iter().map(|k| k.name).collect();
    creation::backend(req.backend.as_deref(), &every, |n| {
        crate::kinds::named(n).map(|k| k.name)
    })?;
    // The store's values are svcd's: a stand-in that fits a header takes their place.
    let stand_ins: Vec<SecretValue> = req
        .secrets
        .iter()
        .map(|s| SecretValue {
            value: if s.value.is_empty() {
                "stored".into()
            } else {
                s.value.clone()
            },
            ..s.clone()
        })
        .collect();
    let secrets = creation::Secret::all_of(&stand_ins);
    creation::plan(host, &creation::Request::of_api(req, &secrets, None))?;
    creation::branches(&req.allowed_branches)?;
    Ok(())
}

/// Entries separated by commas or white space.
fn list(value: &str) -> Vec<String> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `VAR=NAME, VAR2=NAME2` as the store references `--secret VAR@store:NAME` sends.
fn secrets(value: &str) -> Result<Vec<SecretValue>, PodError> {
    list(value)
        .into_iter()
        .map(|entry| match entry.split_once('=') {
            Some((var, store)) if !var.is_empty() && !store.is_empty() && !store.contains('=') => {
                Ok(SecretValue {
                    name: var.to_owned(),
                    source: format!("store:{store}"),
                    value: String::new(),
                })
            }
            _ => Err(PodError::BadSecret { entry }),
        })
        .collect()
}
