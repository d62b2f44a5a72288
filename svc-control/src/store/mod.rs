//! svcd's durable state: one SQLite database (`svcd.db` under `state_dir`, WAL, foreign keys)
//! with versioned migrations (`PRAGMA user_version`).
//!
//! Crash safety: a sandbox row is written as `creating` before anything is built and becomes
//! `running` in one statement once everything is; destroy marks it `destroying` before it
//! removes anything and deletes the row last. A row found `creating` or `destroying` at start
//! is torn down, so a crash at any point leaves a state svcd can start from. Every multi-row
//! change is one transaction.

mod db;
mod error;
mod events;
mod migrations;
mod sandboxes;
mod secrets;

pub use db::Store;
pub use error::StoreError;
pub use sandboxes::SandboxRow;
pub use secrets::SecretRow;

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::{migrations::MIGRATIONS, *};

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
        let old = s.list().unwrap()[0].incarnation.clone();
        assert!(
            old.len() == 16 && old.bytes().all(|b| b.is_ascii_hexdigit()),
            "a row from before incarnations is given one: {old:?}"
        );
        let gh = s.secret_get("gh").unwrap().unwrap().0;
        assert_eq!((gh.owner_uid, gh.shared_gid), (0, None));
        s.reserve_for("new", "{}", "t", "0f", 10, 1001).unwrap();
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
    fn secrets_from_before_pod_namespaces_get_none_and_a_removed_one_takes_its_own() {
        let dir = tempfile::tempdir().unwrap();
        {
            // A database at schema 4 (before pod namespaces), with a stored secret.
            let mut conn = Connection::open(dir.path().join("svcd.db")).unwrap();
            let tx = conn.transaction().unwrap();
            for m in &MIGRATIONS[..4] {
                tx.execute_batch(m).unwrap();
            }
            tx.pragma_update(None, "user_version", 4).unwrap();
            tx.execute(
                "INSERT INTO secret_store (name, version, sealed, created_at, updated_at) \
                 VALUES ('gh', 1, x'00', 't', 't')",
                [],
            )
            .unwrap();
            tx.commit().unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let gh = s.secret_get("gh").unwrap().unwrap();
        assert_eq!(gh.0.pod_namespaces, Vec::<String>::new());
        assert_eq!(gh.1, [0u8], "the sealed value is read past the new column");
        let ns = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let row = s
            .secret_pod_namespaces("gh", &ns(&["team-b", "team-a", "team-b"]), &[])
            .unwrap();
        assert_eq!(row.pod_namespaces, ns(&["team-a", "team-b"]));
        let row = s
            .secret_pod_namespaces("gh", &ns(&["*"]), &ns(&["team-a", "nobody"]))
            .unwrap();
        assert_eq!(row.pod_namespaces, ns(&["*", "team-b"]));
        assert_eq!(
            s.secret_list().unwrap()[0].pod_namespaces,
            ns(&["*", "team-b"])
        );
        assert!(matches!(
            s.secret_pod_namespaces("nope", &ns(&["a"]), &[]),
            Err(StoreError::SecretNotFound(_))
        ));
        // A secret stored again under a removed one's name starts with none.
        s.secret_delete("gh").unwrap();
        let again = s.secret_put("gh", b"x", "t", 0).unwrap();
        assert_eq!(again.pod_namespaces, Vec::<String>::new());
    }
}
