//! The store's errors.

use std::path::PathBuf;

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
