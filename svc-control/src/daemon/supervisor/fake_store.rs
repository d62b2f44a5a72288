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

impl SandboxRows for FakeStore {
    fn reserve_for(
        &self,
        name: &str,
        envelope: &str,
        created_at: &str,
        max_id: u32,
        owner_uid: u32,
    ) -> Result<u32, StoreError> {
        self.step("store.reserve_for", name)?;
        self.inner
            .reserve_for(name, envelope, created_at, max_id, owner_uid)
    }
    fn set_running(
        &self,
        name: &str,
        row: RunningRow<'_>,
        secrets: &[SecretValue],
    ) -> Result<(), StoreError> {
        self.step("store.set_running", name)?;
        self.inner.set_running(name, row, secrets)
    }
    fn set_envelope(&self, name: &str, envelope: &str) -> Result<(), StoreError> {
        self.step("store.set_envelope", name)?;
        self.inner.set_envelope(name, envelope)
    }
    fn set_destroying(&self, name: &str) -> Result<(), StoreError> {
        self.step("store.set_destroying", name)?;
        self.inner.set_destroying(name)
    }
    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.step("store.delete", name)?;
        SandboxRows::delete(&self.inner, name)
    }
    fn list(&self) -> Result<Vec<SandboxRow>, StoreError> {
        self.step("store.list", "")?;
        self.inner.list()
    }
    fn secrets(&self, sandbox: &str) -> Result<Vec<SecretValue>, StoreError> {
        self.step("store.secrets", sandbox)?;
        self.inner.secrets(sandbox)
    }
    fn sandbox_owner(&self, name: &str) -> Result<Option<u32>, StoreError> {
        self.step("store.sandbox_owner", name)?;
        self.inner.sandbox_owner(name)
    }
}

impl SecretRows for FakeStore {
    fn secret_put(
        &self,
        name: &str,
        sealed: &[u8],
        now: &str,
        owner_uid: u32,
    ) -> Result<SecretRow, StoreError> {
        self.step("store.secret_put", name)?;
        self.inner.secret_put(name, sealed, now, owner_uid)
    }
    fn secret_rotate(&self, name: &str, sealed: &[u8], now: &str) -> Result<SecretRow, StoreError> {
        self.step("store.secret_rotate", name)?;
        self.inner.secret_rotate(name, sealed, now)
    }
    fn secret_refresh(
        &self,
        name: &str,
        version: u32,
        sealed: &[u8],
        now: &str,
    ) -> Result<bool, StoreError> {
        self.step("store.secret_refresh", name)?;
        self.inner.secret_refresh(name, version, sealed, now)
    }
    fn secret_share(&self, name: &str, gid: Option<u32>) -> Result<SecretRow, StoreError> {
        self.step("store.secret_share", name)?;
        self.inner.secret_share(name, gid)
    }
    fn secret_get(&self, name: &str) -> Result<Option<(SecretRow, Vec<u8>)>, StoreError> {
        self.step("store.secret_get", name)?;
        self.inner.secret_get(name)
    }
    fn secret_list(&self) -> Result<Vec<SecretRow>, StoreError> {
        self.step("store.secret_list", "")?;
        self.inner.secret_list()
    }
    fn secret_delete(&self, name: &str) -> Result<SecretRow, StoreError> {
        self.step("store.secret_delete", name)?;
        self.inner.secret_delete(name)
    }
}

impl EventLog for FakeStore {
    fn add_event(
        &self,
        time: &str,
        kind: &str,
        sandbox: Option<&str>,
        owner: Option<u32>,
        detail: &serde_json::Value,
    ) -> Result<Event, StoreError> {
        self.step("store.add_event", kind)?;
        self.inner.add_event(time, kind, sandbox, owner, detail)
    }
    fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.step("store.events_after", "")?;
        self.inner.events_after(after, limit)
    }
}
