//! svcd's own limits: the descriptor limit it raises at start, and the shipped unit's limits.
//! A file of its own: it lowers this test process's soft descriptor limit, which other tests in
//! the same binary would share.
#![expect(clippy::expect_used, reason = "test helpers")]

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use svc_tests::{require_root, world::World};

/// `Max open files` of a process: (soft, hard).
fn open_files(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files line");
    let nums: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

#[test]
fn svcd_raises_its_descriptor_limit_to_the_hard_limit() {
    require_root();
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    // As systemd and login shells start a service: a soft limit of 1,024.
    setrlimit(Resource::RLIMIT_NOFILE, 1024, hard).expect("setrlimit");
    let w = World::start();
    let pid = w.svcd_pid().expect("svcd runs");
    assert_eq!(
        open_files(pid),
        (hard, hard),
        "svcd started with a soft limit of 1024 and a hard limit of {hard}"
    );
    assert!(
        w.svcd_log().contains("raised the descriptor limit"),
        "svcd says it raised the limit"
    );
}

#[test]
fn the_shipped_unit_sets_limits_for_a_thousand_sandboxes() {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/svcd.service"),
    )
    .expect("packaging/svcd.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("the unit sets no {key}"))
            .trim()
            .to_owned()
    };
    let nofile: u64 = value("LimitNOFILE")
        .parse()
        .expect("LimitNOFILE is a number");
    assert!(
        nofile >= 65_536,
        "LimitNOFILE={nofile} is too low for 1,000 sandboxes"
    );
    assert_eq!(value("TasksMax"), "infinity");
    assert_eq!(value("LimitMEMLOCK"), "infinity");
}
