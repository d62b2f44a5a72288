//! The named secret store (`svc secret`): values sealed with the host key, each with its
//! owner, the group it is shared with, and a version that rotation raises.

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
}

impl Store {
    fn secret_row(&self, name: &str) -> Result<Option<(SecretRow, Vec<u8>)>, StoreError> {
        self.conn
            .query_row(
                "SELECT name, version, created_at, updated_at, sealed, owner_uid, shared_gid \
                 FROM secret_store WHERE name = ?1",
                params![name],
                |r| {
                    Ok((
                        SecretRow {
                            name: r.get(0)?,
                            version: r.get(1)?,
                            created_at: r.get(2)?,
                            updated_at: r.get(3)?,
                            owner_uid: r.get(5)?,
                            shared_gid: r.get(6)?,
                        },
                        r.get::<_, Vec<u8>>(4)?,
                    ))
                },
            )
            .optional()
            .map_err(self.sql_err())
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
        self.secret_row(name)?
            .map(|(r, _)| r)
            .ok_or_else(|| StoreError::SecretNotFound(name.to_owned()))
    }

    /// Give a secret a new (sealed) value: its next version.
    pub fn secret_rotate(
        &self,
        name: &str,
        sealed: &[u8],
        now: &str,
    ) -> Result<SecretRow, StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE secret_store SET sealed = ?2, version = version + 1, updated_at = ?3 \
                 WHERE name = ?1",
                params![name, sealed, now],
            )
            .map_err(self.sql_err())?;
        if n == 0 {
            return Err(StoreError::SecretNotFound(name.to_owned()));
        }
        self.secret_row(name)?
            .map(|(r, _)| r)
            .ok_or_else(|| StoreError::SecretNotFound(name.to_owned()))
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
        let n = self
            .conn
            .execute(
                "UPDATE secret_store SET shared_gid = ?2 WHERE name = ?1",
                params![name, gid],
            )
            .map_err(self.sql_err())?;
        if n == 0 {
            return Err(StoreError::SecretNotFound(name.to_owned()));
        }
        self.secret_row(name)?
            .map(|(r, _)| r)
            .ok_or_else(|| StoreError::SecretNotFound(name.to_owned()))
    }

    /// A secret and its sealed value.
    pub fn secret_get(&self, name: &str) -> Result<Option<(SecretRow, Vec<u8>)>, StoreError> {
        self.secret_row(name)
    }

    /// Every stored secret, by name, without values.
    pub fn secret_list(&self) -> Result<Vec<SecretRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT name, version, created_at, updated_at, owner_uid, shared_gid \
                 FROM secret_store ORDER BY name",
            )
            .map_err(self.sql_err())?;
        let rows = st
            .query_map([], |r| {
                Ok(SecretRow {
                    name: r.get(0)?,
                    version: r.get(1)?,
                    created_at: r.get(2)?,
                    updated_at: r.get(3)?,
                    owner_uid: r.get(4)?,
                    shared_gid: r.get(5)?,
                })
            })
            .map_err(self.sql_err())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql_err())
    }

    /// Remove a secret; what it was.
    pub fn secret_delete(&self, name: &str) -> Result<SecretRow, StoreError> {
        let row = self
            .secret_row(name)?
            .map(|(r, _)| r)
            .ok_or_else(|| StoreError::SecretNotFound(name.to_owned()))?;
        self.conn
            .execute("DELETE FROM secret_store WHERE name = ?1", params![name])
            .map_err(self.sql_err())?;
        Ok(row)
    }
}
