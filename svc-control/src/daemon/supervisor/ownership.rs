//! Who may act on what (`policy::ownership`), asked with what svcd knows: each sandbox's and
//! stored secret's owner from the store, user and group names from the host.

use super::Supervisor;
use crate::{
    api::{self, SecretInfo},
    creds,
    daemon::failure::Failure,
    policy::{
        ownership::{self, Owner, Principal, SandboxAction, SecretAccess, SecretAction},
        pod_secrets,
    },
    store::SecretRow,
};

/// `uid` with its user name, where the host knows it.
pub(super) fn owner(uid: u32) -> Owner {
    Owner {
        uid,
        name: nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name),
    }
}

/// A group's name, where the host knows it.
pub(super) fn group_name(gid: u32) -> Option<String> {
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .map(|g| g.name)
}

/// A group named by name or gid, resolved on the host.
fn resolve_group(group: &str) -> Result<u32, Failure> {
    if let Ok(Some(g)) = nix::unistd::Group::from_name(group) {
        return Ok(g.gid.as_raw());
    }
    if let Ok(gid) = group.parse::<u32>()
        && let Ok(Some(g)) = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
    {
        return Ok(g.gid.as_raw());
    }
    Err(Failure::bad(format!(
        "no group {group:?} on this host (getent group {group})"
    )))
}

pub(super) fn access_of(row: &SecretRow) -> SecretAccess {
    SecretAccess {
        owner: owner(row.owner_uid),
        shared_with: row.shared_gid.map(|g| (g, group_name(g))),
    }
}

/// The owner and sharing fields of a secret's view.
pub(super) fn with_owner(mut info: SecretInfo, row_owner: u32, shared: Option<u32>) -> SecretInfo {
    info.owner_uid = row_owner;
    info.owner = owner(row_owner).name;
    info.shared_gid = shared;
    info.shared_group = shared.and_then(group_name);
    info
}

impl Supervisor {
    /// The owner of sandbox `name` (running, or still in the store), if there is one.
    pub(super) fn sandbox_owner(&self, name: &str) -> Result<Option<u32>, Failure> {
        if let Some(uid) = self.live().get(name).map(|l| l.owner) {
            return Ok(Some(uid));
        }
        Ok(self.store().sandbox_owner(name)?)
    }

    /// Whether `who` may do `action` to sandbox `name`; a sandbox that does not exist passes
    /// (the route answers 404).
    pub fn authorize_sandbox(
        &self,
        who: &Principal,
        name: &str,
        action: SandboxAction,
    ) -> Result<(), Failure> {
        if who.is_root() {
            return Ok(());
        }
        match self.sandbox_owner(name)? {
            Some(uid) => Ok(ownership::sandbox(who, name, &owner(uid), action)?),
            None => Ok(()),
        }
    }

    /// The incarnations of the sandboxes `who` sees (for audit reads); `None`: all.
    pub fn visible_sandboxes(&self, who: &Principal) -> Option<Vec<String>> {
        if who.is_root() {
            return None;
        }
        Some(
            self.live()
                .values()
                .filter(|l| ownership::sees(who, Some(l.owner)))
                .map(|l| l.incarnation.key.to_string())
                .collect(),
        )
    }

    /// Whether `who` sees an event.
    pub fn sees_event(who: &Principal, e: &api::Event) -> bool {
        ownership::sees(who, e.owner_uid)
    }

    /// Whether `who` may do `action` with stored secret `name` (a missing one passes: the
    /// route says it is missing).
    pub(crate) fn authorize_secret(
        &self,
        who: &Principal,
        name: &str,
        action: SecretAction,
    ) -> Result<(), Failure> {
        if who.is_root() {
            return Ok(());
        }
        let Some((row, _)) = self.store().secret_get(name)? else {
            return Ok(());
        };
        Ok(ownership::secret(who, name, &access_of(&row), action)?)
    }

    /// `POST /v1/secrets/{name}/share`: its owner (or root) lets a group's members use it, or
    /// nobody but the owner (`group: None`).
    pub fn secret_share(
        &self,
        who: &Principal,
        name: &str,
        req: &api::ShareSecret,
    ) -> Result<SecretInfo, Failure> {
        creds::check_name(name).map_err(Failure::bad)?;
        self.authorize_secret(who, name, SecretAction::Share)?;
        let gid = req.group.as_deref().map(resolve_group).transpose()?;
        let row = self.store().secret_share(name, gid)?;
        tracing::info!(secret = %name, shared_gid = ?gid, by = who.uid, "secret sharing changed");
        self.event_owned(
            if gid.is_some() {
                "secret.shared"
            } else {
                "secret.unshared"
            },
            None,
            Some(row.owner_uid),
            serde_json::json!({"name": name, "group": req.group}),
        );
        self.secret_info(row)
    }

    /// `POST /v1/secrets/{name}/pod-namespaces`: its owner (or root) lets pods of Kubernetes
    /// namespaces name it in `svc.dev/secrets`, or no longer (`policy::pod_secrets`).
    pub fn secret_pod_namespaces(
        &self,
        who: &Principal,
        name: &str,
        req: &api::PodNamespacesChange,
    ) -> Result<SecretInfo, Failure> {
        creds::check_name(name).map_err(Failure::bad)?;
        self.authorize_secret(who, name, SecretAction::PodNamespaces)?;
        let entries =
            |v: &[String]| pod_secrets::entries(v).map_err(|e| Failure::bad(e.to_string()));
        let (allow, disallow) = (
            entries(req.allow.as_slice())?,
            entries(req.disallow.as_slice())?,
        );
        if allow.is_empty() && disallow.is_empty() {
            return Err(Failure::bad(format!(
                "secret {name}: give at least one --pod-namespace NAMESPACE (or '*')"
            )));
        }
        let row = self
            .store()
            .secret_pod_namespaces(name, &allow, &disallow)?;
        tracing::info!(
            secret = %name,
            pod_namespaces = ?row.pod_namespaces,
            by = who.uid,
            "secret's pod namespaces changed"
        );
        self.event_owned(
            "secret.pod_namespaces",
            None,
            Some(row.owner_uid),
            serde_json::json!({
                "name": name,
                "allowed": allow,
                "disallowed": disallow,
                "pod_namespaces": row.pod_namespaces,
            }),
        );
        self.secret_info(row)
    }
}
