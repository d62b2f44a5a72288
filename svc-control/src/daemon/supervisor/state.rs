//! The state store as the supervisor uses it, behind narrow traits like its kernel effects
//! (`effects`): a sandbox's row ([`SandboxRows`]), the stored secrets ([`SecretRows`]) and
//! the event log ([`EventLog`]); [`StateStore`] is the three together, what a supervisor
//! holds. Each trait holds only the calls the supervisor makes; the production impl locks the
//! SQLite [`Store`] for each call, and the tests' fake (`fake::FakeStore`) wraps a real one and
//! fails a chosen call, so creation, destruction and adoption are tested at each store step.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::{
    api::{Event, SecretValue},
    store::{SandboxRow, SecretRow, Store, StoreError},
};

/// What a sandbox's row holds once it runs: everything a restart needs to re-adopt it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunningRow<'a> {
    /// The envelope, JSON.
    pub(crate) envelope: &'a str,
    /// Its CA's certificate, PEM.
    pub(crate) ca_cert: &'a str,
    /// Its CA's key, PEM.
    pub(crate) ca_key: &'a str,
    /// The guest's process and its start time.
    pub(crate) pid: u32,
    pub(crate) pid_start: u64,
}

/// Sandbox rows: reserved as `creating`, marked `running`, `destroying`, deleted.
pub(crate) trait SandboxRows: Send + Sync {
    /// Reserve `name` (creation `incarnation`) for `owner_uid` with the lowest free id in
    /// `1..=max_id`, as `creating`.
    fn reserve_for(
        &self,
        name: &str,
        envelope: &str,
        created_at: &str,
        incarnation: &str,
        max_id: u32,
        owner_uid: u32,
    ) -> Result<u32, StoreError>;
    /// Give the reserved row `pooled` (a warm pool's) to `name` of `owner_uid`, made at
    /// `created_at` as a new `incarnation`, with `envelope` (its id kept).
    fn claim_reserved(
        &self,
        pooled: &str,
        name: &str,
        envelope: &str,
        created_at: &str,
        incarnation: &str,
        owner_uid: u32,
    ) -> Result<(), StoreError>;
    /// Mark a reserved sandbox running, with `row` and its sealed `secrets`, in one step.
    fn set_running(
        &self,
        name: &str,
        row: RunningRow<'_>,
        secrets: &[SecretValue],
    ) -> Result<(), StoreError>;
    /// Replace a running sandbox's envelope (a live policy change).
    fn set_envelope(&self, name: &str, envelope: &str) -> Result<(), StoreError>;
    /// Mark a sandbox `destroying`.
    fn set_destroying(&self, name: &str) -> Result<(), StoreError>;
    /// Remove a sandbox's row and its secrets.
    fn delete(&self, name: &str) -> Result<(), StoreError>;
    /// Every sandbox row, by id.
    fn list(&self) -> Result<Vec<SandboxRow>, StoreError>;
    /// A sandbox's brokered secrets (sealed).
    fn secrets(&self, sandbox: &str) -> Result<Vec<SecretValue>, StoreError>;
    /// The uid that owns sandbox `name`, if there is one.
    fn sandbox_owner(&self, name: &str) -> Result<Option<u32>, StoreError>;
}

/// The stored secrets behind `svc secret` (sealed values).
pub(crate) trait SecretRows: Send + Sync {
    /// Store a new secret for `owner_uid`, as v1.
    fn secret_put(
        &self,
        name: &str,
        sealed: &[u8],
        now: &str,
        owner_uid: u32,
    ) -> Result<SecretRow, StoreError>;
    /// Replace a secret's value with a new version.
    fn secret_rotate(&self, name: &str, sealed: &[u8], now: &str) -> Result<SecretRow, StoreError>;
    /// Replace version `version`'s value in place (a refreshed grant); whether it still was.
    fn secret_refresh(
        &self,
        name: &str,
        version: u32,
        sealed: &[u8],
        now: &str,
    ) -> Result<bool, StoreError>;
    /// Share a secret with group `gid` (`None`: with nobody).
    fn secret_share(&self, name: &str, gid: Option<u32>) -> Result<SecretRow, StoreError>;
    /// Let pods of the namespaces `add` name a secret, and those of `remove` no longer.
    fn secret_pod_namespaces(
        &self,
        name: &str,
        add: &[String],
        remove: &[String],
    ) -> Result<SecretRow, StoreError>;
    /// A secret's row and sealed value, if there is one.
    fn secret_get(&self, name: &str) -> Result<Option<(SecretRow, Vec<u8>)>, StoreError>;
    /// Every stored secret, by name, without values.
    fn secret_list(&self) -> Result<Vec<SecretRow>, StoreError>;
    /// Remove a secret; its row as it was.
    fn secret_delete(&self, name: &str) -> Result<SecretRow, StoreError>;
}

/// The event log `svc events` follows.
pub(crate) trait EventLog: Send + Sync {
    /// Record an event (its sandbox's owner's when `owner` is `None`).
    fn add_event(
        &self,
        time: &str,
        kind: &str,
        sandbox: Option<&str>,
        owner: Option<u32>,
        detail: &serde_json::Value,
    ) -> Result<Event, StoreError>;
    /// Up to `limit` events after sequence number `after`.
    fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, StoreError>;
}

/// Everything the supervisor keeps in its state store.
pub(crate) trait StateStore: SandboxRows + SecretRows + EventLog {}

impl<T: SandboxRows + SecretRows + EventLog> StateStore for T {}

fn lock(store: &Mutex<Store>) -> MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SandboxRows for Mutex<Store> {
    fn reserve_for(
        &self,
        name: &str,
        envelope: &str,
        created_at: &str,
        incarnation: &str,
        max_id: u32,
        owner_uid: u32,
    ) -> Result<u32, StoreError> {
        lock(self).reserve_for(name, envelope, created_at, incarnation, max_id, owner_uid)
    }
    fn claim_reserved(
        &self,
        pooled: &str,
        name: &str,
        envelope: &str,
        created_at: &str,
        incarnation: &str,
        owner_uid: u32,
    ) -> Result<(), StoreError> {
        lock(self).claim_reserved(pooled, name, envelope, created_at, incarnation, owner_uid)
    }
    fn set_running(
        &self,
        name: &str,
        row: RunningRow<'_>,
        secrets: &[SecretValue],
    ) -> Result<(), StoreError> {
        lock(self).set_running(
            name,
            row.envelope,
            row.ca_cert,
            row.ca_key,
            row.pid,
            row.pid_start,
            secrets,
        )
    }
    fn set_envelope(&self, name: &str, envelope: &str) -> Result<(), StoreError> {
        lock(self).set_envelope(name, envelope)
    }
    fn set_destroying(&self, name: &str) -> Result<(), StoreError> {
        lock(self).set_destroying(name)
    }
    fn delete(&self, name: &str) -> Result<(), StoreError> {
        lock(self).delete(name)
    }
    fn list(&self) -> Result<Vec<SandboxRow>, StoreError> {
        lock(self).list()
    }
    fn secrets(&self, sandbox: &str) -> Result<Vec<SecretValue>, StoreError> {
        lock(self).secrets(sandbox)
    }
    fn sandbox_owner(&self, name: &str) -> Result<Option<u32>, StoreError> {
        lock(self).sandbox_owner(name)
    }
}

impl SecretRows for Mutex<Store> {
    fn secret_put(
        &self,
        name: &str,
        sealed: &[u8],
        now: &str,
        owner_uid: u32,
    ) -> Result<SecretRow, StoreError> {
        lock(self).secret_put(name, sealed, now, owner_uid)
    }
    fn secret_rotate(&self, name: &str, sealed: &[u8], now: &str) -> Result<SecretRow, StoreError> {
        lock(self).secret_rotate(name, sealed, now)
    }
    fn secret_refresh(
        &self,
        name: &str,
        version: u32,
        sealed: &[u8],
        now: &str,
    ) -> Result<bool, StoreError> {
        lock(self).secret_refresh(name, version, sealed, now)
    }
    fn secret_share(&self, name: &str, gid: Option<u32>) -> Result<SecretRow, StoreError> {
        lock(self).secret_share(name, gid)
    }
    fn secret_pod_namespaces(
        &self,
        name: &str,
        add: &[String],
        remove: &[String],
    ) -> Result<SecretRow, StoreError> {
        lock(self).secret_pod_namespaces(name, add, remove)
    }
    fn secret_get(&self, name: &str) -> Result<Option<(SecretRow, Vec<u8>)>, StoreError> {
        lock(self).secret_get(name)
    }
    fn secret_list(&self) -> Result<Vec<SecretRow>, StoreError> {
        lock(self).secret_list()
    }
    fn secret_delete(&self, name: &str) -> Result<SecretRow, StoreError> {
        lock(self).secret_delete(name)
    }
}

impl EventLog for Mutex<Store> {
    fn add_event(
        &self,
        time: &str,
        kind: &str,
        sandbox: Option<&str>,
        owner: Option<u32>,
        detail: &serde_json::Value,
    ) -> Result<Event, StoreError> {
        lock(self).add_event(time, kind, sandbox, owner, detail)
    }
    fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, StoreError> {
        lock(self).events_after(after, limit)
    }
}
