//! The workspace log against the real svcd and a container sandbox: hooks that print far more
//! than the log's cap leave at most the cap in each of its two files (the log and its one
//! rotated file), and `svc workspace logs --follow` sends what is kept — in order, whole
//! records, across the rotation — and then the records written after it started.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use svc_tests::{
    require_root,
    world::{World, workspace_bin},
};

/// svcd's cap on one workspace log file (`workspace_log::LOG_CAP`).
const LOG_CAP: u64 = 8 << 20;

/// The hooks print 40 MB: five times the cap.
const SETUP: &str =
    r#"yes "$(head -c 1000 /dev/zero | tr '\0' x)" | head -n 40000; echo flood-done"#;

#[test]
fn a_huge_workspace_log_stays_under_its_cap_and_follow_streams_it_then_new_records() {
    require_root();
    let w = World::start();
    let workspace_json = serde_json::json!({"version": 1, "lifecycle": {
        "onSetup": [SETUP],
        "onStart": ["echo start-$(cat /proc/sys/kernel/random/uuid)"],
    }})
    .to_string();
    let dir = w.project("big", &[(".svc/workspace.json", &workspace_json)]);
    let dir_s = dir.to_str().expect("utf-8");
    let up = w.workspace_up(dir_s, "big");
    let text = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success(),
        "workspace up: {:?}\n{}",
        up.status,
        w.svcd_log()
    );
    assert!(text.contains("flood-done"), "the hooks ran to their end");

    // On the host: each file at most the cap.
    let state = w.dir.join("state/sandboxes/big");
    let sizes: Vec<(String, u64)> = ["workspace.log", "workspace.log.1"]
        .iter()
        .map(|f| {
            let len = std::fs::metadata(state.join(f)).map_or(0, |m| m.len());
            ((*f).to_owned(), len)
        })
        .collect();
    for (f, len) in &sizes {
        assert!(
            *len <= LOG_CAP,
            "{f} holds {len} bytes, past its cap: {sizes:?}"
        );
    }
    assert!(sizes[1].1 > 0, "the log was rotated: {sizes:?}");

    // Follow: everything kept, then a record written after the follow began.
    let mut follower = Command::new(workspace_bin("svc"))
        .env("SVC_SOCKET", &w.socket)
        .args(["workspace", "logs", "big", "--follow", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("svc workspace logs --follow");
    let out = follower.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let r: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a torn record ({e}): {:.200}", line));
            if tx.send(r).is_err() {
                break;
            }
        }
    });
    let last = last_seq(&state.join("workspace.log"));
    let mut seen: Vec<serde_json::Value> = Vec::new();
    let fresh = loop {
        let r = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("follow stopped after {} records: {e}", seen.len()));
        if let Some(prev) = seen.last() {
            assert_eq!(
                r["seq"].as_u64(),
                prev["seq"].as_u64().map(|s| s + 1),
                "records in order, none lost across the rotation"
            );
        }
        let seq = r["seq"].as_u64().unwrap_or(0);
        let fresh_start = seq > last && r["text"].as_str().is_some_and(|t| t.starts_with("start-"));
        seen.push(r);
        if seq == last {
            // Everything kept has come: a resume runs onStart again, written while we follow.
            w.svc_ok(&["sandbox", "pause", "big"]);
            w.svc_ok(&["sandbox", "resume", "big"]);
        }
        if fresh_start {
            break seq;
        }
    };
    let _ = follower.kill();
    let _ = follower.wait();
    let _ = reader.join();
    assert!(fresh > last, "the record written while following arrived");
    assert!(
        seen.first().and_then(|r| r["seq"].as_u64()) > Some(1),
        "the oldest records were dropped by the rotation"
    );
    w.destroy_checked("big");
}

/// The sequence number of the last record in the log file at `path`.
fn last_seq(path: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(path).expect("the workspace log");
    let line = text.lines().last().expect("a record");
    serde_json::from_str::<serde_json::Value>(line).expect("a record")["seq"]
        .as_u64()
        .expect("its seq")
}
