//! The database itself: opened (mode 0600 in a 0700 directory), set up (WAL, foreign keys) and
//! migrated.

use std::{
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use rusqlite::Connection;

use super::{error::StoreError, migrations::MIGRATIONS};

/// The database.
#[derive(Debug)]
pub struct Store {
    pub(super) path: PathBuf,
    pub(super) conn: Connection,
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

    pub(super) fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sql {
            path: self.path.clone(),
            source,
        }
    }

    /// [`Self::err`] as a closure, for `map_err`.
    pub(super) fn sql_err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sql {
            path: self.path.clone(),
            source,
        }
    }

    /// Every row `sql` selects with `params`, each made by `row`.
    pub(super) fn all<T>(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StoreError> {
        let mut stmt = self.conn.prepare(sql).map_err(self.sql_err())?;
        let rows = stmt.query_map(params, row).map_err(self.sql_err())?;
        rows.collect::<Result<_, _>>().map_err(self.sql_err())
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
