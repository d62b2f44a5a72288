//! svcd makes a user namespace for each idmapped tree (a sandbox's base image, each layer of a
//! pod container's root file system, each shared directory) by forking a child that waits
//! for its maps. Many are made at once when sandboxes and pod containers are created side by
//! side: no child may hold another's pipes (it would wait for the other, which waits for it,
//! and both svcd threads would wait forever, as would every call behind them).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use svc_control::dataplane::idmap::IdmappedTree;
use svc_tests::require_root;

/// Threads making user namespaces at once, and how many each makes.
const THREADS: usize = 8;
const EACH: usize = 150;

/// Far longer than the 1,200 namespaces take (under a second here): reached only by a hang.
const HANG: Duration = Duration::from_secs(120);

#[test]
fn user_namespaces_made_side_by_side_never_wait_on_each_other() {
    require_root();
    // Only the namespace is made here (the tree is attached later, elsewhere).
    let dir = std::env::temp_dir();
    let (done, finished) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    for t in 0..THREADS {
        let (dir, done, stop) = (dir.clone(), done.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let made = (0..EACH).try_for_each(|_| {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                IdmappedTree::new(
                    &dir,
                    &dir,
                    100_000 + 65_536 * u32::try_from(t)?,
                    100_000,
                    65_536,
                )
                .map(drop)
                .map_err(Into::into)
            });
            done.send(made.map_err(|e: Box<dyn std::error::Error + Send + Sync>| e.to_string()))
                .expect("the test waits");
        });
    }
    for n in 0..THREADS {
        match finished.recv_timeout(HANG) {
            Ok(made) => made.unwrap_or_else(|e| panic!("a user namespace: {e}")),
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                panic!(
                    "{n} of {THREADS} threads done after {HANG:?}: the others wait forever (the \
                     children that make user namespaces wait on each other's pipes)\n{}",
                    end_children()
                )
            }
        }
    }
}

/// The test process's children and what each waits in (`wchan`), for a hang's message; each
/// is killed, until none is left (they would wait on each other after the test has ended).
fn end_children() -> String {
    let mut said = String::new();
    for _ in 0..100 {
        let children = children();
        if children.is_empty() {
            break;
        }
        for (pid, wchan) in children {
            if said.lines().count() < 16 {
                said.push_str(&format!("child {pid} waits in {wchan}\n"));
            }
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    said
}

/// The test process's children (each thread's own, as the kernel lists them in
/// `/proc/self/task/*/children`: the namespaces' children are forked by the test's threads):
/// each pid and its `wchan`.
fn children() -> Vec<(i32, String)> {
    let tasks = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .map(|pid| {
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
            (pid, wchan)
        })
        .collect()
}
