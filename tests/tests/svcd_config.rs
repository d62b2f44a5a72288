//! svcd's configuration as an operator uses it: the audit log reopened on SIGHUP (logrotate's
//! `create`), `svc audit -n N` and `--until`, and `svc doctor --microvm` reporting the images
//! the running svcd uses from svcd.toml's `[microvm]` (no `SVC_MICROVM_*` anywhere).

use std::{
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use svc_tests::{
    require_root,
    world::{World, microvm_images, offline_microvm_doctor, workspace_bin},
};

/// `svc sandbox allow NAME --add-host HOST`: one `policy` audit record naming `host`.
fn policy_record(w: &World, name: &str, host: &str) {
    w.svc_ok(&["sandbox", "allow", name, "--add-host", host]);
}

/// The records of `path` that added `host`.
fn added(path: &std::path::Path, host: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| {
            r["layer"] == "policy"
                && r["added"]
                    .as_array()
                    .is_some_and(|a| a.contains(&host.into()))
        })
        .count()
}

#[test]
fn sighup_reopens_the_audit_log_after_it_was_moved() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "rot"]);
    policy_record(&w, "rot", "before.example.test");
    let path = w.audit_path();
    let moved = path.with_file_name("audit.jsonl-rotated");
    std::fs::rename(&path, &moved).expect("move the audit log as logrotate does");
    let pid = w.svcd_pid().expect("svcd runs");
    let hup = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !w.svcd_log().contains("SIGHUP: reopened the audit log") {
        assert!(
            Instant::now() < deadline,
            "no reopen logged:\n{}",
            w.svcd_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    policy_record(&w, "rot", "after.example.test");
    assert_eq!(
        added(&path, "after.example.test"),
        1,
        "the new record is in a new file"
    );
    assert_eq!(added(&path, "before.example.test"), 0);
    assert_eq!(
        added(&moved, "before.example.test"),
        1,
        "the moved file keeps its records"
    );
    assert_eq!(
        added(&moved, "after.example.test"),
        0,
        "and gets no new ones"
    );
    assert!(
        w.svc(&["sandbox", "list"]).status.success(),
        "svcd still serves"
    );
}

#[test]
fn audit_tail_and_until_pick_the_records() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "tail"]);
    for n in 1..=4 {
        policy_record(&w, "tail", &format!("h{n}.example.test"));
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["audit", "--json", "--layer", "policy"];
        all.extend(args);
        w.svc_ok(&all)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a record"))
            .collect()
    };
    let hosts = |records: &[Value]| -> Vec<String> {
        records
            .iter()
            .map(|r| r["added"][0].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let every = lines(&[]);
    assert_eq!(every.len(), 4, "{every:?}");
    assert_eq!(
        hosts(&lines(&["-n", "2"])),
        ["h3.example.test", "h4.example.test"],
        "the last two"
    );
    assert_eq!(hosts(&lines(&["--tail", "1"])), ["h4.example.test"]);
    assert_eq!(lines(&["-n", "0"]).len(), 0);
    let second = every[1]["time"].as_str().expect("time");
    assert_eq!(
        hosts(&lines(&["--until", second])),
        ["h1.example.test", "h2.example.test"],
        "up to the second record's time"
    );
    assert_eq!(
        hosts(&lines(&["--since", second, "--until", second])),
        ["h2.example.test"]
    );
    assert!(lines(&["--until", "1h"]).is_empty(), "none an hour old");
    // -o: the same records as YAML documents, or the sandbox each is of.
    let yaml = w.svc_ok(&["audit", "-o", "yaml", "--layer", "policy", "-n", "2"]);
    assert_eq!(yaml.matches("---\n").count(), 2, "{yaml}");
    assert!(yaml.contains("- h4.example.test"), "{yaml}");
    let names = w.svc_ok(&["audit", "-o", "name", "--layer", "policy"]);
    assert_eq!(names.lines().collect::<Vec<_>>(), ["tail"; 4], "{names}");
    let both = w.svc(&["audit", "-o", "yaml", "--json"]);
    assert_eq!(
        both.status.code(),
        Some(2),
        "-o and --json conflict: {both:?}"
    );
    let bad = w.svc(&["audit", "--until", "later"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains(
            "until \"later\": expected a duration such as 10m or 2h, or an RFC 3339 time"
        ),
        "{bad:?}"
    );
}

#[test]
fn doctor_reports_the_images_svcd_uses_from_its_configuration() {
    require_root();
    let images = microvm_images();
    let (kernel, rootfs) = (images.join("vmlinuz"), images.join("rootfs.ext4"));
    let mut w = World::start_with_microvm(&format!(
        "kernel = \"{}\"\nrootfs = \"{}\"\ninitrd = \"{}\"",
        kernel.display(),
        rootfs.display(),
        images.join("initrd.img").display()
    ));
    w.kill_svcd();
    w.start_svcd_with_env(&[
        ("SVC_MICROVM_KERNEL", None),
        ("SVC_MICROVM_ROOTFS", None),
        ("SVC_MICROVM_INITRD", None),
    ]);
    let dir = w.dir.join("doctor-ws");
    std::fs::create_dir_all(&dir).expect("workspace");
    let out = Command::new(workspace_bin("svc"))
        .arg("--socket")
        .arg(&w.socket)
        .args(["doctor", "--microvm", "--json"])
        .arg(&dir)
        .env_remove("SVC_MICROVM_KERNEL")
        .env_remove("SVC_MICROVM_ROOTFS")
        .env_remove("SVC_MICROVM_INITRD")
        .output()
        .expect("svc doctor");
    let report: Value = serde_json::from_slice(&out.stdout).expect("the report");
    let probe = |name: &str| -> Value {
        report["results"]
            .as_array()
            .and_then(|r| r.iter().find(|c| c["name"] == name).cloned())
            .unwrap_or_else(|| panic!("{name} in {report:#}"))
    };
    for (name, path, key) in [
        ("host:svc-microvm-kernel", &kernel, "microvm.kernel"),
        ("host:svc-microvm-rootfs", &rootfs, "microvm.rootfs"),
    ] {
        let p = probe(name);
        assert_eq!(p["status"], "passed", "{p:#}");
        assert_eq!(
            p["output"],
            format!("{} (svcd uses it, from {key})", path.display()),
            "{p:#}"
        );
    }
    assert_eq!(probe("host:microvm-agent")["status"], "passed");
    let source = probe("host:microvm-images");
    assert_eq!(source["status"], "passed", "{source:#}");

    // Without svcd, the same probes read this environment, and say so.
    let out = offline_microvm_doctor(&dir).output().expect("svc doctor");
    let report: Value = serde_json::from_slice(&out.stdout).expect("the report");
    let source = report["results"]
        .as_array()
        .and_then(|r| {
            r.iter()
                .find(|c| c["name"] == "host:microvm-images")
                .cloned()
        })
        .expect("host:microvm-images");
    assert_eq!(source["status"], "skipped");
    assert!(
        source["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("svcd did not answer (on /nonexistent/svcd.sock")),
        "{source:#}"
    );
}
