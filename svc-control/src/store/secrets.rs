//! The named secret store (`svc secret`): values sealed with the host key, each with its
//! owner, the group it is shared with, the pod namespaces that may name it, and a version that
//! rotation raises.

use rusqlite::{OptionalExtension as _, params};

use super::{db::Store, error::StoreError};

/// A stored secret, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    pub name: String,
    pub version: u32,
    pub created_at: String,
    pub updated_at: String,
    /// The uid that stored it (0 for secrets stored before owners were recorded).
    pub owner_uid: u32,
    /// The group whose members may use it (`svc secret share`), if any.
    pub shared_gid: Option<u32>,
    /// The Kubernetes namespaces whose pods may name it (`svc secret allow`; `*`: every one),
    /// sorted; none for a secret stored before they were recorded.
    pub pod_namespaces: Vec<String>,
}

/// The columns a [`SecretRow`] is read from, in [`from_row`]'s order (the pod namespaces
/// joined by spaces: a namespace holds none).
const COLUMNS: &str = "name, version, created_at, updated_at, owner_uid, shared_gid, \
     (SELECT group_concat(p.namespace, ' ') FROM secret_pod_namespaces p \
      WHERE p.name = secret_store.name)";

/// A [`SecretRow`] from a row whose first columns are [`COLUMNS`].
fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SecretRow> {
    Ok(SecretRow {
        name: r.get(0)?,
        version: r.get(1)?,
        created_at: r.get(2)?,
        updated_at: r.get(3)?,
        owner_uid: r.get(4)?,
        shared_gid: r.get(5)?,
        pod_namespaces: {
            let joined: Option<String> = r.get(6)?;
            let mut v: Vec<String> = joined
                .unwrap_or_default()
                .split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            v.sort();
            v
        },
    })
}

impl Store {
    fn secret_row(&self, name: &str) -> Result<Option<(SecretRow, Vec<u8>)>, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS}, sealed FROM secret_store WHERE name = ?1"),
                params![name],
                |r| Ok((from_row(r)?, r.get::<_, Vec<u8>>(7)?)),
            )
            .optional()
            .map_err(self.sql_err())
    }

    /// The secret `name` without its value, or [`StoreError::SecretNotFound`].
    fn secret_found(&self, name: &str) -> Result<SecretRow, StoreError> {
        self.secret_row(name)?
            .map(|(r, _)| r)
            .ok_or_else(|| StoreError::SecretNotFound(name.to_owned()))
    }

    /// `sql` with `params` on the secret `name`, then the secret; [`StoreError::SecretNotFound`]
    /// when it changed no row.
    fn secret_update(
        &self,
        name: &str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<SecretRow, StoreError> {
        let n = self.conn.execute(sql, params).map_err(self.sql_err())?;
        if n == 0 {
            return Err(StoreError::SecretNotFound(name.to_owned()));
        }
        self.secret_found(name)
    }

    /// Store a new secret (sealed) owned by `owner_uid`; refused if the name is taken.
    pub fn secret_put(
        &self,
        name: &str,
        sealed: &[u8],
        now: &str,
        owner_uid: u32,
    ) -> Result<SecretRow, StoreError> {
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO secret_store \
                 (name, version, sealed, created_at, updated_at, owner_uid) \
                 VALUES (?1, 1, ?2, ?3, ?3, ?4)",
                params![name, sealed, now, owner_uid],
            )
            .map_err(self.sql_err())?;
        if n == 0 {
            return Err(StoreError::SecretExists(name.to_owned()));
        }
        self.secret_found(name)
    }

    /// Give a secret a new (sealed) value: its next version.
    pub fn secret_rotate(
        &self,
        name: &str,
        sealed: &[u8],
        now: &str,
    ) -> Result<SecretRow, StoreError> {
        self.secret_update(
            name,
            "UPDATE secret_store SET sealed = ?2, version = version + 1, updated_at = ?3 \
             WHERE name = ?1",
            params![name, sealed, now],
        )
    }

    /// Replace the sealed value of `name` at `version` in place (a refreshed OAuth grant: the
    /// version stays); `false` if the secret is gone or at another version now.
    pub fn secret_refresh(
        &self,
        name: &str,
        version: u32,
        sealed: &[u8],
        now: &str,
    ) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE secret_store SET sealed = ?3, updated_at = ?4 WHERE name = ?1 AND version = ?2",
                params![name, version, sealed, now],
            )
            .map_err(self.sql_err())?;
        Ok(n == 1)
    }

    /// Share a secret with the members of group `gid` (`None`: with nobody but its owner).
    pub fn secret_share(&self, name: &str, gid: Option<u32>) -> Result<SecretRow, StoreError> {
        self.secret_update(
            name,
            "UPDATE secret_store SET shared_gid = ?2 WHERE name = ?1",
            params![name, gid],
        )
    }

    /// Let pods of the namespaces `add` name the secret `name`, and those of `remove` no
    /// longer (entries checked by `policy::pod_secrets` already); one transaction.
    pub fn secret_pod_namespaces(
        &self,
        name: &str,
        add: &[String],
        remove: &[String],
    ) -> Result<SecretRow, StoreError> {
        self.secret_found(name)?;
        let tx = self.conn.unchecked_transaction().map_err(self.sql_err())?;
        for ns in add {
            tx.execute(
                "INSERT OR IGNORE INTO secret_pod_namespaces (name, namespace) VALUES (?1, ?2)",
                params![name, ns],
            )
            .map_err(self.sql_err())?;
        }
        for ns in remove {
            tx.execute(
                "DELETE FROM secret_pod_namespaces WHERE name = ?1 AND namespace = ?2",
                params![name, ns],
            )
            .map_err(self.sql_err())?;
        }
        tx.commit().map_err(self.sql_err())?;
        self.secret_found(name)
    }

    /// A secret and its sealed value.
    pub fn secret_get(&self, name: &str) -> Result<Option<(SecretRow, Vec<u8>)>, StoreError> {
        self.secret_row(name)
    }

    /// Every stored secret, by name, without values.
    pub fn secret_list(&self) -> Result<Vec<SecretRow>, StoreError> {
        self.all(
            &format!("SELECT {COLUMNS} FROM secret_store ORDER BY name"),
            [],
            from_row,
        )
    }

    /// Remove a secret; what it was.
    pub fn secret_delete(&self, name: &str) -> Result<SecretRow, StoreError> {
        let row = self.secret_found(name)?;
        self.conn
            .execute("DELETE FROM secret_store WHERE name = ?1", params![name])
            .map_err(self.sql_err())?;
        Ok(row)
    }
}
