//! The event log: appended, pruned past [`EVENTS_KEPT`], read after a cursor.

use rusqlite::params;

use super::{db::Store, error::StoreError};
use crate::api::Event;

/// Events kept; older ones are pruned as new ones arrive.
const EVENTS_KEPT: i64 = 10_000;

impl Store {
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
        self.all(
            "SELECT seq, time, kind, sandbox, detail, owner_uid FROM events WHERE seq > ?1 \
             ORDER BY seq LIMIT ?2",
            params![after, limit as i64],
            |r| {
                let detail: String = r.get(4)?;
                Ok(Event {
                    seq: r.get(0)?,
                    time: r.get(1)?,
                    kind: r.get(2)?,
                    sandbox: r.get(3)?,
                    detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
                    owner_uid: r.get(5)?,
                })
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
