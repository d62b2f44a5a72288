//! The secret store behind `svc secret` and the sealing of each sandbox's brokered values.
//!
//! Stored secrets are sealed with the host key (`creds::seal`) in svcd's state; so are the
//! values a sandbox was issued (the `secrets` table), which it keeps until it is destroyed:
//! a rotation changes what sandboxes created afterwards get, never what a running one swaps
//! (an svcd restart re-adopts a sandbox with the values it was issued; no backend restarts a
//! sandbox in place — a new value needs a new sandbox).

use base64::Engine as _;
use tracing::info;

use super::{Supervisor, now_text};
use crate::{
    api::{self, CreateSandbox, SecretInfo, SecretValue},
    creds::{self, SEALED, grant::GrantState},
    daemon::failure::Failure,
    policy::{
        ownership::{self, Principal, SecretAction},
        pod_secrets,
    },
    store::SecretRow,
};

fn info_of(r: SecretRow, grant: Option<&GrantState>) -> SecretInfo {
    let (owner, shared) = (r.owner_uid, r.shared_gid);
    let info = SecretInfo {
        pod_namespaces: r.pod_namespaces,
        name: r.name,
        version: r.version,
        created_at: r.created_at,
        updated_at: r.updated_at,
        kind: if grant.is_some() { "oauth" } else { "value" }.into(),
        token_endpoint: grant.map(|g| g.token_endpoint.clone()),
        expires_at: grant.map(|g| {
            crate::audit::rfc3339(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(g.expires_at_ms),
            )
        }),
        owner_uid: 0,
        owner: None,
        shared_group: None,
        shared_gid: None,
    };
    super::ownership::with_owner(info, owner, shared)
}

impl Supervisor {
    /// The plaintext to seal for a new value of `name`: the value itself, or for an OAuth
    /// secret its grant after a first refresh (which proves the refresh token and endpoint).
    async fn plaintext(
        &self,
        name: &str,
        value: &str,
        oauth: Option<api::OAuthSpec>,
    ) -> Result<(zeroize::Zeroizing<Vec<u8>>, Option<GrantState>), Failure> {
        creds::check_value(name, value).map_err(Failure::bad)?;
        let Some(spec) = oauth else {
            return Ok((zeroize::Zeroizing::new(value.as_bytes().to_vec()), None));
        };
        let state = self.first_grant(name, value, spec).await?;
        Ok((state.to_plaintext(), Some(state)))
    }

    /// `POST /v1/secrets`: a new named secret (409 if the name is taken: rotate it instead).
    /// The secret belongs to its caller; pods of `pod_namespaces` may name it.
    pub async fn secret_set(
        &self,
        who: &Principal,
        req: api::SetSecret,
    ) -> Result<SecretInfo, Failure> {
        creds::check_name(&req.name).map_err(Failure::bad)?;
        let pod_namespaces =
            pod_secrets::entries(&req.pod_namespaces).map_err(|e| Failure::bad(e.to_string()))?;
        if let Some((row, _)) = self.store().secret_get(&req.name)? {
            let access = super::ownership::access_of(&row);
            ownership::secret_name(who, &req.name, Some(&access))?;
            return Err(crate::store::StoreError::SecretExists(req.name.clone()).into());
        }
        let (plain, grant) = self.plaintext(&req.name, &req.value, req.oauth).await?;
        let sealed = self
            .config
            .key
            .seal(&creds::store_aad(&req.name), &plain)
            .map_err(|e| Failure::internal(e.to_string()))?;
        let mut row = self
            .store()
            .secret_put(&req.name, &sealed, &now_text(), who.uid)?;
        if !pod_namespaces.is_empty() {
            row = self
                .store()
                .secret_pod_namespaces(&req.name, &pod_namespaces, &[])?;
        }
        info!(
            secret = %req.name,
            version = row.version,
            oauth = grant.is_some(),
            pod_namespaces = ?row.pod_namespaces,
            "secret stored"
        );
        self.event_owned(
            "secret.created",
            None,
            Some(row.owner_uid),
            serde_json::json!({
                "name": row.name,
                "version": row.version,
                "pod_namespaces": row.pod_namespaces,
            }),
        );
        Ok(info_of(row, grant.as_ref()))
    }

    /// `POST /v1/secrets/{name}/rotate`: a new value; sandboxes created from now on get it.
    /// An OAuth secret takes a new refresh token for the same endpoint.
    pub async fn secret_rotate(
        &self,
        who: &Principal,
        name: &str,
        req: api::RotateSecret,
    ) -> Result<SecretInfo, Failure> {
        creds::check_name(name).map_err(Failure::bad)?;
        self.authorize_secret(who, name, SecretAction::Rotate)?;
        let oauth = self.stored_grant(name)?.map(|g| api::OAuthSpec {
            token_endpoint: g.token_endpoint.clone(),
            client_id: g.client_id.clone(),
        });
        let (plain, grant) = self.plaintext(name, &req.value, oauth).await?;
        let sealed = self
            .config
            .key
            .seal(&creds::store_aad(name), &plain)
            .map_err(|e| Failure::internal(e.to_string()))?;
        let row = self.store().secret_rotate(name, &sealed, &now_text())?;
        info!(secret = %name, version = row.version, "secret rotated");
        self.retire_grant(
            name,
            &format!(
                "secret {name} was rotated to v{}: recreate the sandbox to get it",
                row.version
            ),
        );
        self.event_owned(
            "secret.rotated",
            None,
            Some(row.owner_uid),
            serde_json::json!({"name": row.name, "version": row.version}),
        );
        Ok(info_of(row, grant.as_ref()))
    }

    /// `GET /v1/secrets`: names, versions, kinds and owners, never values; a non-root caller
    /// sees its own and those shared with a group it is in.
    pub fn secret_list(&self, who: &Principal) -> Result<Vec<SecretInfo>, Failure> {
        let rows = self.store().secret_list()?;
        rows.into_iter()
            .filter(|r| ownership::sees_secret(who, &super::ownership::access_of(r)))
            .map(|r| self.secret_info(r))
            .collect()
    }

    /// A stored secret as the API shows it.
    pub(super) fn secret_info(&self, row: SecretRow) -> Result<SecretInfo, Failure> {
        let g = self.stored_grant(&row.name)?;
        Ok(info_of(row, g.as_ref()))
    }

    /// `DELETE /v1/secrets/{name}`. Sandboxes issued its value keep it (an OAuth secret's
    /// sandboxes keep its access token until it expires; it is refreshed no more).
    pub fn secret_remove(&self, who: &Principal, name: &str) -> Result<SecretInfo, Failure> {
        creds::check_name(name).map_err(Failure::bad)?;
        self.authorize_secret(who, name, SecretAction::Remove)?;
        let g = self.stored_grant(name)?;
        let row = self.store().secret_delete(name)?;
        info!(secret = %name, "secret removed");
        self.retire_grant(name, &format!("secret {name} was removed"));
        self.event_owned(
            "secret.removed",
            None,
            Some(row.owner_uid),
            serde_json::json!({"name": name}),
        );
        Ok(info_of(row, g.as_ref()))
    }

    /// `--secret VAR@store:NAME`: the stored value as it is now; the source records its version
    /// (`store:NAME@v3`). Only a secret `who` may use (`policy::ownership`), and for a pod's
    /// request only one allowed for the pod's namespace (`policy::pod_secrets`; a missing
    /// secret is refused in the same words).
    pub(super) fn resolve_store_secrets(
        &self,
        who: &Principal,
        req: &mut CreateSandbox,
    ) -> Result<(), Failure> {
        let pod = req.pod.clone();
        for s in &mut req.secrets {
            let Some(name) = s.source.strip_prefix("store:") else {
                continue;
            };
            let name = name.split('@').next().unwrap_or("").to_owned();
            creds::check_name(&name)
                .map_err(|e| Failure::bad(format!("--secret {}@store:{name}: {e}", s.name)))?;
            let missing = || {
                Failure::bad(format!(
                    "--secret {}@store:{name}: no secret {name} in the store (svc secret list; svc secret set {name})",
                    s.name
                ))
            };
            let found = self.store().secret_get(&name)?;
            if let Some(pod) = &pod {
                let allowed = found.as_ref().map(|(row, _)| row.pod_namespaces.as_slice());
                pod_secrets::may_use(&pod.namespace, &s.name, &name, allowed)
                    .map_err(|e| Failure::forbidden(e.to_string()))?;
            }
            let (row, sealed) = found.ok_or_else(missing)?;
            let access = super::ownership::access_of(&row);
            match ownership::secret(who, &name, &access, SecretAction::Use) {
                Ok(()) => {}
                // One the caller may not see reads as one that is not there.
                Err(ownership::OwnershipError::SecretHidden { .. }) => return Err(missing()),
                Err(e) => {
                    return Err(Failure::forbidden(format!(
                        "--secret {}@store:{name}: {e}",
                        s.name
                    )));
                }
            }
            let value = self
                .config
                .key
                .open(&creds::store_aad(&name), &sealed)
                .map_err(|e| Failure::internal(e.to_string()))?;
            s.value = if GrantState::from_plaintext(&value).is_some() {
                // An OAuth secret: the sandbox holds a reference to the grant.
                self.grant(&name, row.version).reference()
            } else {
                String::from_utf8(value.to_vec())
                    .map_err(|_| Failure::internal(format!("secret {name} is not UTF-8")))?
            };
            s.source = format!("store:{name}@v{}", row.version);
        }
        Ok(())
    }

    /// A sandbox's values as they go into its state: sealed for it.
    pub(super) fn sealed_for(
        &self,
        sandbox: &str,
        secrets: &[SecretValue],
    ) -> Result<Vec<SecretValue>, Failure> {
        secrets
            .iter()
            .map(|s| {
                let sealed = self
                    .config
                    .key
                    .seal(&creds::sandbox_aad(sandbox, &s.name), s.value.as_bytes())
                    .map_err(|e| Failure::internal(e.to_string()))?;
                Ok(SecretValue {
                    name: s.name.clone(),
                    source: s.source.clone(),
                    value: format!(
                        "{SEALED}{}",
                        base64::engine::general_purpose::STANDARD.encode(sealed)
                    ),
                })
            })
            .collect()
    }

    /// A sandbox's values as it was issued them (opened; older unsealed rows as they are).
    pub(super) fn sandbox_secrets(&self, sandbox: &str) -> Result<Vec<SecretValue>, Failure> {
        self.store()
            .secrets(sandbox)?
            .into_iter()
            .map(|mut s| {
                if let Some(b64) = s.value.strip_prefix(SEALED) {
                    let sealed = base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|_| {
                            Failure::internal(format!(
                                "{sandbox}'s {} is not sealed base64",
                                s.name
                            ))
                        })?;
                    let value = self
                        .config
                        .key
                        .open(&creds::sandbox_aad(sandbox, &s.name), &sealed)
                        .map_err(|e| Failure::internal(e.to_string()))?;
                    s.value = String::from_utf8(value.to_vec()).map_err(|_| {
                        Failure::internal(format!("{sandbox}'s {} is not UTF-8", s.name))
                    })?;
                }
                Ok(s)
            })
            .collect()
    }
}
