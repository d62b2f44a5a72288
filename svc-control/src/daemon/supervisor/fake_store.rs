//! A fake of the supervisor's state store, for unit tests: a real SQLite [`Store`] in a
//! temporary directory behind the store's traits (`state`), each call recorded as a step
//! (`store.reserve_for`, `store.set_running`, …) in the log the kernel fakes write to, and
//! the chosen call of a step failed as the disk would fail it.

use std::{path::Path, sync::Arc, sync::Mutex};

use super::{
    fake::Calls,
    state::{EventLog, RunningRow, SandboxRows, SecretRows},
};
use crate::{
    api::{Event, SecretValue},
    store::{SandboxRow, SecretRow, Store, StoreError},
};

/// The real store, its calls logged and failed on demand.
#[derive(Debug)]
pub(super) struct FakeStore {
    calls: Arc<Calls>,
    /// The real store underneath (read it directly: nothing logged, nothing failed).
    pub(super) inner: Mutex<Store>,
}

impl FakeStore {
    /// The store under `dir` (made if need be), its calls logged in `calls`.
    pub(super) fn open(dir: &Path, calls: Arc<Calls>) -> Self {
        Self {
            calls,
            inner: Mutex::new(Store::open(dir).expect("store")),
        }
    }

    /// Record `step`; the database's error if it is the one to fail.
    fn step(&self, step: &'static str, detail: &str) -> Result<(), StoreError> {
        if !self.calls.call(step, detail) {
            return Ok(());
        }
        let path = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .path()
            .to_owned();
        Err(StoreError::Sql {
            path,
            source: rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some(format!("{step} failed on purpose")),
            ),
        })
    }
}

/// The store's traits for [`FakeStore`]: each call logged as `store.<method>` with a detail,
/// failed if it is the chosen one, else made on the real store.
macro_rules! logged {
    ($($trait:ident { $(fn $m:ident($($a:ident: $t:ty),*) -> $r:ty, $detail:expr;)* })*) => {
        $(impl $trait for FakeStore {
            $(fn $m(&self, $($a: $t),*) -> Result<$r, StoreError> {
                self.step(concat!("store.", stringify!($m)), $detail)?;
                $trait::$m(&self.inner, $($a),*)
            })*
        })*
    };
}

logged! {
    SandboxRows {
        fn reserve_for(
            name: &str,
            envelope: &str,
            created_at: &str,
            incarnation: &str,
            max_id: u32,
            owner_uid: u32
        ) -> u32, name;
        fn claim_reserved(
            pooled: &str,
            name: &str,
            envelope: &str,
            created_at: &str,
            incarnation: &str,
            owner_uid: u32
        ) -> (), name;
        fn set_running(name: &str, row: RunningRow<'_>, secrets: &[SecretValue]) -> (), name;
        fn set_envelope(name: &str, envelope: &str) -> (), name;
        fn set_destroying(name: &str) -> (), name;
        fn delete(name: &str) -> (), name;
        fn list() -> Vec<SandboxRow>, "";
        fn secrets(sandbox: &str) -> Vec<SecretValue>, sandbox;
        fn sandbox_owner(name: &str) -> Option<u32>, name;
    }
    SecretRows {
        fn secret_put(name: &str, sealed: &[u8], now: &str, owner_uid: u32) -> SecretRow, name;
        fn secret_rotate(name: &str, sealed: &[u8], now: &str) -> SecretRow, name;
        fn secret_refresh(name: &str, version: u32, sealed: &[u8], now: &str) -> bool, name;
        fn secret_share(name: &str, gid: Option<u32>) -> SecretRow, name;
        fn secret_pod_namespaces(
            name: &str,
            add: &[String],
            remove: &[String]
        ) -> SecretRow, name;
        fn secret_get(name: &str) -> Option<(SecretRow, Vec<u8>)>, name;
        fn secret_list() -> Vec<SecretRow>, "";
        fn secret_delete(name: &str) -> SecretRow, name;
    }
    EventLog {
        fn add_event(
            time: &str,
            kind: &str,
            sandbox: Option<&str>,
            owner: Option<u32>,
            detail: &serde_json::Value
        ) -> Event, kind;
        fn events_after(after: i64, limit: usize) -> Vec<Event>, "";
    }
}
