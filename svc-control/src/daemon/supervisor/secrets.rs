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
    creds::{self, SEALED},
    daemon::failure::Failure,
    store::SecretRow,
};

fn info_of(r: SecretRow) -> SecretInfo {
    SecretInfo {
        name: r.name,
        version: r.version,
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

impl Supervisor {
    /// `POST /v1/secrets`: a new named secret (409 if the name is taken: rotate it instead).
    pub fn secret_set(&self, req: api::SetSecret) -> Result<SecretInfo, Failure> {
        creds::check_name(&req.name).map_err(Failure::bad)?;
        creds::check_value(&req.name, &req.value).map_err(Failure::bad)?;
        let sealed = self
            .config
            .key
            .seal(&creds::store_aad(&req.name), req.value.as_bytes())
            .map_err(|e| Failure::internal(e.to_string()))?;
        let row = self.store().secret_put(&req.name, &sealed, &now_text())?;
        info!(secret = %req.name, version = row.version, "secret stored");
        self.event(
            "secret.created",
            None,
            serde_json::json!({"name": row.name, "version": row.version}),
        );
        Ok(info_of(row))
    }

    /// `POST /v1/secrets/{name}/rotate`: a new value; sandboxes created from now on get it.
    pub fn secret_rotate(&self, name: &str, req: api::RotateSecret) -> Result<SecretInfo, Failure> {
        creds::check_name(name).map_err(Failure::bad)?;
        creds::check_value(name, &req.value).map_err(Failure::bad)?;
        let sealed = self
            .config
            .key
            .seal(&creds::store_aad(name), req.value.as_bytes())
            .map_err(|e| Failure::internal(e.to_string()))?;
        let row = self.store().secret_rotate(name, &sealed, &now_text())?;
        info!(secret = %name, version = row.version, "secret rotated");
        self.event(
            "secret.rotated",
            None,
            serde_json::json!({"name": row.name, "version": row.version}),
        );
        Ok(info_of(row))
    }

    /// `GET /v1/secrets`: names and versions, never values.
    pub fn secret_list(&self) -> Result<Vec<SecretInfo>, Failure> {
        Ok(self
            .store()
            .secret_list()?
            .into_iter()
            .map(info_of)
            .collect())
    }

    /// `DELETE /v1/secrets/{name}`. Sandboxes issued its value keep it.
    pub fn secret_remove(&self, name: &str) -> Result<SecretInfo, Failure> {
        creds::check_name(name).map_err(Failure::bad)?;
        let row = self.store().secret_delete(name)?;
        info!(secret = %name, "secret removed");
        self.event("secret.removed", None, serde_json::json!({"name": name}));
        Ok(info_of(row))
    }

    /// `--secret VAR@store:NAME`: the stored value as it is now; the source records its version
    /// (`store:NAME@v3`).
    pub(super) fn resolve_store_secrets(&self, req: &mut CreateSandbox) -> Result<(), Failure> {
        for s in &mut req.secrets {
            let Some(name) = s.source.strip_prefix("store:") else {
                continue;
            };
            let name = name.split('@').next().unwrap_or("").to_owned();
            creds::check_name(&name)
                .map_err(|e| Failure::bad(format!("--secret {}@store:{name}: {e}", s.name)))?;
            let (row, sealed) = self.store().secret_get(&name)?.ok_or_else(|| {
                Failure::bad(format!(
                    "--secret {}@store:{name}: no secret {name} in the store (svc secret list; svc secret set {name})",
                    s.name
                ))
            })?;
            let value = self
                .config
                .key
                .open(&creds::store_aad(&name), &sealed)
                .map_err(|e| Failure::internal(e.to_string()))?;
            s.value = String::from_utf8(value.to_vec())
                .map_err(|_| Failure::internal(format!("secret {name} is not UTF-8")))?;
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
