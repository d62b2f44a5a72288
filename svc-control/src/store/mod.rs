//! svcd's durable state: one SQLite database (`svcd.db` under `state_dir`, WAL, foreign keys)
//! with versioned migrations (`PRAGMA user_version`).
//!
//! Crash safety: a sandbox row is written as `creating` before anything is built and becomes
//! `running` in one statement once everything is; destroy marks it `destroying` before it
//! removes anything and deletes the row last. A row found `creating` or `destroying` at start
//! is torn down, so a crash at any point leaves a state svcd can start from. Every multi-row
//! change is one transaction.

use std::{
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use rusqlite::{Connection, OptionalExtension as _, params};

use crate::api::{Event, SecretValue};

/// The migrations, in order; `user_version` counts how many have run.
const MIGRATIONS: &[&str] = &[
    // 1: sandboxes, their secrets, the event log.
    "CREATE TABLE sandboxes (
        name        TEXT PRIMARY KEY,
        id          INTEGER NOT NULL UNIQUE CHECK (id > 0),
        state       TEXT NOT NULL CHECK (state IN ('creating', 'running', 'destroying')),
        created_at  TEXT NOT NULL,
        envelope    TEXT NOT NULL,
        ca_cert     TEXT,
        ca_key      TEXT,
        pid         INTEGER,
        pid_start   INTEGER
    );
    CREATE TABLE secrets (
        sandbox TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
        name    TEXT NOT NULL,
        source  TEXT NOT NULL,
        value   TEXT NOT NULL,
        PRIMARY KEY (sandbox, name)
    );
    CREATE TABLE events (
        seq     INTEGER PRIMARY KEY AUTOINCREMENT,
        time    TEXT NOT NULL,
        kind    TEXT NOT NULL,
        sandbox TEXT,
        detail  TEXT NOT NULL
    );",
    // The named secret store (`svc secret`): values sealed with the host key.
    "CREATE TABLE secret_store (
        name        TEXT PRIMARY KEY,
        version     INTEGER NOT NULL CHECK (version > 0),
        sealed      BLOB NOT NULL,
        created_at  TEXT NOT NULL,
        updated_at  TEXT NOT NULL
    );",
    // 3: owners (API callers are not each other). Rows from before belong to root.
    "ALTER TABLE sandboxes ADD COLUMN owner_uid INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE secret_store ADD COLUMN owner_uid INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE secret_store ADD COLUMN shared_gid INTEGER;
    ALTER TABLE events ADD COLUMN owner_uid INTEGER;",
];

/// Events kept; older ones are pruned as new ones arrive.
const EVENTS_KEPT: i64 = 10_000;

/// Errors of the store, each naming the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database {path}: {source}")]
    Sql {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("creating state directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state database {path} is at schema version {found}, newer than this svcd ({known}); \
         run the newer svcd or restore a backup"
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("a sandbox named {0:?} already exists")]
    Exists(String),
    #[error("no sandbox named {0:?}")]
    NotFound(String),
    #[error("all {0} sandbox ids are in use")]
    Full(u32),
    #[error("a secret named {0:?} already exists")]
    SecretExists(String),
    #[error("no secret named {0:?}")]
    SecretNotFound(String),
}

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
}

/// The database.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    conn: Connection,
}

impl Store {
    /// Open (creating if needed) `svcd.db` under `dir` (mode 0700) and run pending migrations.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| StoreError::Dir {
                path: dir.to_owned(),
                source,
            })?;
        let path = dir.join("svcd.db");
        let conn = Connection::open(&path).map_err(|source| StoreError::Sql {
            path: path.clone(),
            source,
        })?;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        let mut store = Self { path, conn };
        store.setup()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sql {
            path: self.path.clone(),
            source,
        }
    }

    fn setup(&mut self) -> Result<(), StoreError> {
        self.conn
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                 PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;",
            )
            .map_err(|e| self.err(e))?;
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found: version,
                known,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = self.conn.transaction().map_err(|source| StoreError::Sql {
                path: self.path.clone(),
                source,
            })?;
            tx.execute_batch(sql)
                .and_then(|()| tx.pragma_update(None, "user_version", i as i64 + 1))
                .and_then(|()| tx.commit())
                .map_err(|source| StoreError::Sql {
                    path: self.path.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// The schema version in force.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.err(e))
    }

    /// Reserve `name` for root with the lowest free id in `1..=max_id`, as `creating`.
    pub fn reserve(
        &mut self,
        name: &str,
        envelope: &str,
        created_at: &str,
        max_id: u32,
    ) -> Result<u32, StoreError> {
        self.reserve_for(name, envelope, created_at, max_id, 0)
    }

    /// Reserve `name` for `owner_uid` with the lowest free id in `1..=max_id`, as `creating`.
    pub fn reserve_for(
        &mut self,
        name: &str,
        envelope: &str,
        created_at: &str,
        max_id: u32,
        owner_uid: u32,
    ) -> Result<u32, StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sql {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sql)?;
        let exists: bool = tx
            .query_row(
                "SELECT 1 FROM sandboxes WHERE name = ?1",
                params![name],
                |_| Ok(true),
            )
            .optional()
            .map_err(sql)?
            .unwrap_or(false);
        if exists {
            return Err(StoreError::Exists(name.to_owned()));
        }
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
            "INSERT INTO sandboxes (name, id, state, created_at, envelope, owner_uid) \
             VALUES (?1, ?2, 'creating', ?3, ?4, ?5)",
            params![name, id, created_at, envelope, owner_uid],
        )
        .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(id)
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

    /// Mark a sandbox `destroying`.
    fn sql_err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sql {
            path: self.path.clone(),
            source,
        }
    }

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

    pub fn set_destroying(&self, name: &str) -> Result<(), StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE sandboxes SET state = 'destroying' WHERE name = ?1",
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
        let mut stmt = self
            .conn
            .prepare(
                "SELECT name, id, state, created_at, envelope, ca_cert, ca_key, pid, pid_start, \
                 owner_uid FROM sandboxes ORDER BY id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| {
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
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// A sandbox's brokered secrets.
    pub fn secrets(&self, sandbox: &str) -> Result<Vec<SecretValue>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, source, value FROM secrets WHERE sandbox = ?1 ORDER BY name")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![sandbox], |r| {
                Ok(SecretValue {
                    name: r.get(0)?,
                    source: r.get(1)?,
                    value: r.get(2)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
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

    /// Append an event (and prune the oldest past [`EVENTS_KEPT`]). It belongs to `owner`, or
    /// when `None` to its sandbox's owner as the store has it now (none for svcd's own events).
    pub fn add_event(
        &self,
        time: &str,
        kind: &str,
        sandbox: Option<&str>,
        owner: Option<u32>,
        detail: &serde_json::Value,
    ) -> Result<Event, StoreError> {
        self.conn
            .execute(
                "INSERT INTO events (time, kind, sandbox, detail, owner_uid) VALUES (?1, ?2, ?3, \
                 ?4, COALESCE(?5, (SELECT owner_uid FROM sandboxes WHERE name = ?3)))",
                params![time, kind, sandbox, detail.to_string(), owner],
            )
            .map_err(|e| self.err(e))?;
        let seq = self.conn.last_insert_rowid();
        let owner_uid: Option<u32> = self
            .conn
            .query_row(
                "SELECT owner_uid FROM events WHERE seq = ?1",
                params![seq],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        self.conn
            .execute(
                "DELETE FROM events WHERE seq <= ?1",
                params![seq - EVENTS_KEPT],
            )
            .map_err(|e| self.err(e))?;
        Ok(Event {
            seq,
            time: time.to_owned(),
            kind: kind.to_owned(),
            sandbox: sandbox.map(str::to_owned),
            detail: detail.clone(),
            owner_uid,
        })
    }

    /// Events with `seq > after`, oldest first, at most `limit`.
    pub fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT seq, time, kind, sandbox, detail, owner_uid FROM events WHERE seq > ?1 \
                 ORDER BY seq LIMIT ?2",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![after, limit as i64], |r| {
                let detail: String = r.get(4)?;
                Ok(Event {
                    seq: r.get(0)?,
                    time: r.get(1)?,
                    kind: r.get(2)?,
                    sandbox: r.get(3)?,
                    detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
                    owner_uid: r.get(5)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn rows_from_before_owners_belong_to_root_and_new_ones_to_their_creator() {
        let dir = tempfile::tempdir().unwrap();
        {
            // A database at schema 2 (before owners), with a sandbox and a stored secret.
            let mut conn = Connection::open(dir.path().join("svcd.db")).unwrap();
            let tx = conn.transaction().unwrap();
            tx.execute_batch(MIGRATIONS[0]).unwrap();
            tx.execute_batch(MIGRATIONS[1]).unwrap();
            tx.pragma_update(None, "user_version", 2).unwrap();
            tx.execute(
                "INSERT INTO sandboxes (name, id, state, created_at, envelope) \
                 VALUES ('old', 1, 'running', 't', '{}')",
                [],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO secret_store (name, version, sealed, created_at, updated_at) \
                 VALUES ('gh', 1, x'00', 't', 't')",
                [],
            )
            .unwrap();
            tx.commit().unwrap();
        }
        let mut s = Store::open(dir.path()).unwrap();
        assert_eq!(s.list().unwrap()[0].owner_uid, 0);
        let gh = s.secret_get("gh").unwrap().unwrap().0;
        assert_eq!((gh.owner_uid, gh.shared_gid), (0, None));
        s.reserve_for("new", "{}", "t", 10, 1001).unwrap();
        assert_eq!(s.sandbox_owner("new").unwrap(), Some(1001));
        assert_eq!(
            s.secret_put("mine", b"x", "t", 1001).unwrap().owner_uid,
            1001
        );
        assert_eq!(
            s.secret_share("mine", Some(2001)).unwrap().shared_gid,
            Some(2001)
        );
        assert_eq!(s.secret_share("mine", None).unwrap().shared_gid, None);
        // An event about a sandbox is its owner's; svcd's own are nobody's.
        let e = s
            .add_event(
                "t",
                "sandbox.created",
                Some("new"),
                None,
                &serde_json::json!({}),
            )
            .unwrap();
        assert_eq!(e.owner_uid, Some(1001));
        let e = s
            .add_event(
                "t",
                "supervisor.started",
                None,
                None,
                &serde_json::json!({}),
            )
            .unwrap();
        assert_eq!(e.owner_uid, None);
        assert_eq!(s.events_after(0, 10).unwrap()[0].owner_uid, Some(1001));
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

    #[test]
    fn events_in_order_after_a_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let a = s
            .add_event(
                "t1",
                "sandbox.created",
                Some("a"),
                None,
                &serde_json::json!({}),
            )
            .unwrap();
        let b = s
            .add_event(
                "t2",
                "workspace.ready",
                Some("a"),
                None,
                &serde_json::json!({"k": 1}),
            )
            .unwrap();
        assert!(b.seq > a.seq);
        let after = s.events_after(a.seq, 10).unwrap();
        assert_eq!(after, vec![b]);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        let conn = Connection::open(dir.path().join("svcd.db")).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let e = Store::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("schema version 99"), "{e}");
    }

    #[test]
    fn a_file_that_is_not_a_database_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("svcd.db"),
            b"this is not sqlite, not at all....",
        )
        .unwrap();
        let e = Store::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("svcd.db"), "{e}");
    }
}
