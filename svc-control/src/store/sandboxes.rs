//! Sandbox rows and their brokered secrets: reserved as `creating`, marked `running` with
//! everything a restart needs, `destroying`, then deleted.

use rusqlite::{OptionalExtension as _, params};

use super::{db::Store, error::StoreError};
use crate::api::SecretValue;

/// One sandbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    pub name: String,
    pub id: u32,
    pub state: String,
    pub created_at: String,
    /// The envelope, JSON (the daemon's type).
    pub envelope: String,
    pub ca_cert: Option<String>,
    pub ca_key: Option<String>,
    pub pid: Option<u32>,
    pub pid_start: Option<u64>,
    /// The uid that created it (0 for sandboxes created before owners were recorded).
    pub owner_uid: u32,
    /// Which creation of a sandbox of this name and id it is (its audit records' key).
    pub incarnation: String,
}

impl Store {
    /// Reserve `name` for root with the lowest free id in `1..=max_id`, as `creating`.
    pub fn reserve(
        &mut self,
        name: &str,
        envelope: &str,
        created_at: &str,
        max_id: u32,
    ) -> Result<u32, StoreError> {
        let incarnation = crate::audit::Incarnation::fresh_key();
        self.reserve_for(name, envelope, created_at, &incarnation, max_id, 0)
    }

    /// Reserve `name` (creation `incarnation`) for `owner_uid` with the lowest free id in
    /// `1..=max_id`, as `creating`.
    pub fn reserve_for(
        &mut self,
        name: &str,
        envelope: &str,
        created_at: &str,
        incarnation: &str,
        max_id: u32,
        owner_uid: u32,
    ) -> Result<u32, StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sql {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sql)?;
        refuse_taken(&tx, name).map_err(sql)??;
        let mut id = 1u32;
        {
            let mut stmt = tx
                .prepare("SELECT id FROM sandboxes ORDER BY id")
                .map_err(sql)?;
            let ids = stmt.query_map([], |r| r.get::<_, u32>(0)).map_err(sql)?;
            for used in ids {
                if used.map_err(sql)? == id {
                    id += 1;
                } else {
                    break;
                }
            }
        }
        if id > max_id {
            return Err(StoreError::Full(max_id));
        }
        tx.execute(
            "INSERT INTO sandboxes (name, id, state, created_at, envelope, owner_uid, \
             incarnation) VALUES (?1, ?2, 'creating', ?3, ?4, ?5, ?6)",
            params![name, id, created_at, envelope, owner_uid, incarnation],
        )
        .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(id)
    }

    /// Give the reserved row `pooled` (a sandbox made ahead by a warm pool) to `name`, of
    /// `owner_uid`, made at `created_at`, with `envelope`; it keeps its id and stays
    /// `creating`. `Exists` when `name` is taken, `NotFound` when `pooled` is not reserved.
    pub fn claim_reserved(
        &mut self,
        pooled: &str,
        name: &str,
        envelope: &str,
        created_at: &str,
        incarnation: &str,
        owner_uid: u32,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sql {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sql)?;
        refuse_taken(&tx, name).map_err(sql)??;
        let n = tx
            .execute(
                "UPDATE sandboxes SET name = ?2, envelope = ?3, created_at = ?4, owner_uid = ?5, \
                 incarnation = ?6 WHERE name = ?1 AND state = 'creating'",
                params![pooled, name, envelope, created_at, owner_uid, incarnation],
            )
            .map_err(sql)?;
        if n == 0 {
            return Err(StoreError::NotFound(pooled.to_owned()));
        }
        tx.commit().map_err(sql)
    }

    /// Mark a reserved sandbox running, with everything its restart needs, and its secrets, in
    /// one transaction.
    #[expect(clippy::too_many_arguments, reason = "one row's columns")]
    pub fn set_running(
        &mut self,
        name: &str,
        envelope: &str,
        ca_cert: &str,
        ca_key: &str,
        pid: u32,
        pid_start: u64,
        secrets: &[SecretValue],
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sql {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sql)?;
        for s in secrets {
            tx.execute(
                "INSERT OR REPLACE INTO secrets (sandbox, name, source, value) \
                 VALUES (?1, ?2, ?3, ?4)",
                params![name, s.name, s.source, s.value],
            )
            .map_err(sql)?;
        }
        let n = tx
            .execute(
                "UPDATE sandboxes SET state = 'running', envelope = ?2, ca_cert = ?3, \
                 ca_key = ?4, pid = ?5, pid_start = ?6 WHERE name = ?1",
                params![name, envelope, ca_cert, ca_key, pid, pid_start as i64],
            )
            .map_err(sql)?;
        if n == 0 {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        tx.commit().map_err(sql)
    }

    /// Replace a running sandbox's envelope (a live policy change).
    pub fn set_envelope(&self, name: &str, envelope: &str) -> Result<(), StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE sandboxes SET envelope = ?2 WHERE name = ?1",
                params![name, envelope],
            )
            .map_err(|source| StoreError::Sql {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        Ok(())
    }

    /// Mark a made sandbox `destroying` (running, or left `destroying` by a destroy that did
    /// not finish); `NotFound` when no such sandbox has that name (none does, or it is still
    /// being made).
    pub fn set_destroying(&self, name: &str) -> Result<(), StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE sandboxes SET state = 'destroying' WHERE name = ?1 \
                 AND state IN ('running', 'destroying')",
                params![name],
            )
            .map_err(|e| self.err(e))?;
        if n == 0 {
            return Err(StoreError::NotFound(name.to_owned()));
        }
        Ok(())
    }

    /// Remove a sandbox's row and its secrets.
    pub fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM sandboxes WHERE name = ?1", params![name])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Every sandbox row, by id.
    pub fn list(&self) -> Result<Vec<SandboxRow>, StoreError> {
        self.all(
            "SELECT name, id, state, created_at, envelope, ca_cert, ca_key, pid, pid_start, \
             owner_uid, incarnation FROM sandboxes ORDER BY id",
            [],
            |r| {
                Ok(SandboxRow {
                    name: r.get(0)?,
                    id: r.get(1)?,
                    state: r.get(2)?,
                    created_at: r.get(3)?,
                    envelope: r.get(4)?,
                    ca_cert: r.get(5)?,
                    ca_key: r.get(6)?,
                    pid: r.get(7)?,
                    pid_start: r.get::<_, Option<i64>>(8)?.map(|v| v as u64),
                    owner_uid: r.get(9)?,
                    incarnation: r.get(10)?,
                })
            },
        )
    }

    /// A sandbox's brokered secrets.
    pub fn secrets(&self, sandbox: &str) -> Result<Vec<SecretValue>, StoreError> {
        self.all(
            "SELECT name, source, value FROM secrets WHERE sandbox = ?1 ORDER BY name",
            params![sandbox],
            |r| {
                Ok(SecretValue {
                    name: r.get(0)?,
                    source: r.get(1)?,
                    value: r.get(2)?,
                })
            },
        )
    }

    /// The uid that owns sandbox `name`, if there is one.
    pub fn sandbox_owner(&self, name: &str) -> Result<Option<u32>, StoreError> {
        self.conn
            .query_row(
                "SELECT owner_uid FROM sandboxes WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }
}

/// `Exists` when a sandbox row named `name` is there (inside the caller's transaction).
fn refuse_taken(
    tx: &rusqlite::Transaction<'_>,
    name: &str,
) -> rusqlite::Result<Result<(), StoreError>> {
    let taken = tx
        .query_row(
            "SELECT 1 FROM sandboxes WHERE name = ?1",
            params![name],
            |_| Ok(true),
        )
        .optional()?
        .unwrap_or(false);
    Ok(if taken {
        Err(StoreError::Exists(name.to_owned()))
    } else {
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::migrations::MIGRATIONS;

    fn secret(name: &str) -> SecretValue {
        SecretValue {
            name: name.into(),
            source: "env:X".into(),
            value: "real".into(),
        }
    }

    #[test]
    fn reserve_run_destroy_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        assert_eq!(s.schema_version().unwrap(), MIGRATIONS.len() as i64);
        assert_eq!(s.reserve("a", "{}", "t", 10).unwrap(), 1);
        assert_eq!(s.reserve("b", "{}", "t", 10).unwrap(), 2);
        assert!(matches!(
            s.reserve("a", "{}", "t", 10),
            Err(StoreError::Exists(_))
        ));
        s.set_running("a", "{\"x\":1}", "cert", "key", 42, 7, &[secret("T")])
            .unwrap();
        s.delete("b").unwrap();
        // The lowest free id is reused.
        assert_eq!(s.reserve("c", "{}", "t", 10).unwrap(), 2);
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        let rows = s.list().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].state, "running");
        assert_eq!(rows[0].pid, Some(42));
        assert_eq!(rows[0].pid_start, Some(7));
        assert_eq!(rows[1].state, "creating");
        assert_eq!(s.secrets("a").unwrap(), vec![secret("T")]);
        s.set_destroying("a").unwrap();
        s.delete("a").unwrap();
        assert!(
            s.secrets("a").unwrap().is_empty(),
            "secrets go with the row"
        );
        assert!(matches!(
            s.set_destroying("a"),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn a_pooled_row_is_claimed_under_its_new_name_and_keeps_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.reserve("taken", "{}", "t", 10).unwrap();
        let id = s.reserve("pool.container.1", "{}", "t0", 10).unwrap();
        assert!(matches!(
            s.claim_reserved("pool.container.1", "taken", "{}", "t1", "c1", 7),
            Err(StoreError::Exists(_))
        ));
        s.claim_reserved("pool.container.1", "dev", "{\"y\":2}", "t1", "c1", 7)
            .unwrap();
        let row = s
            .list()
            .unwrap()
            .into_iter()
            .find(|r| r.name == "dev")
            .unwrap();
        assert_eq!(
            (row.id, row.owner_uid, row.state.as_str()),
            (id, 7, "creating")
        );
        assert_eq!(
            (row.created_at.as_str(), row.envelope.as_str()),
            ("t1", "{\"y\":2}")
        );
        // The claimer's incarnation, never the pool's: audit records name the claimer only.
        assert_eq!(row.incarnation, "c1");
        assert!(matches!(
            s.claim_reserved("pool.container.1", "other", "{}", "t2", "c2", 0),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn ids_run_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.reserve("a", "{}", "t", 1).unwrap();
        assert!(matches!(
            s.reserve("b", "{}", "t", 1),
            Err(StoreError::Full(1))
        ));
    }
}
