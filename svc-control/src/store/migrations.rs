//! The schema's migrations, in order; `PRAGMA user_version` counts how many have run.

/// The migrations, in order; `user_version` counts how many have run.
pub(super) const MIGRATIONS: &[&str] = &[
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
    // 4: each sandbox's incarnation (its audit records' key: ids and names are reused). Rows
    // from before get one each now.
    "ALTER TABLE sandboxes ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
    UPDATE sandboxes SET incarnation = lower(hex(randomblob(8))) WHERE incarnation = '';",
    // 5: the Kubernetes pod namespaces whose pods may name each stored secret
    // (`policy::pod_secrets`). Secrets stored before get none: no pod may name them until
    // `svc secret allow NAME --pod-namespace NS`.
    "CREATE TABLE secret_pod_namespaces (
        name      TEXT NOT NULL REFERENCES secret_store(name) ON DELETE CASCADE,
        namespace TEXT NOT NULL,
        PRIMARY KEY (name, namespace)
    );",
];
