//! The choosing of [`Rooted`], over records made up here: no test sends a signal.

use super::*;

const TREE: u64 = 40;
const SUB: u64 = 41;
const OTHER: u64 = 50;
const ROOT: u64 = 1;

fn spared() -> Spared {
    Spared {
        pids: BTreeSet::from([100, 99, 1]),
        roots: BTreeSet::from([ROOT]),
    }
}

fn tree(pid_ns: Option<&str>) -> Rooted {
    let mountinfo = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
                     40 1 0:30 /c1 /trees/c1 rw - virtiofs trees rw\n\
                     41 40 0:31 / /trees/c1/tmp rw - tmpfs tmpfs rw\n\
                     50 1 0:30 /c2 /trees/c2 rw - virtiofs trees rw\n";
    Rooted::over(TREE, mountinfo, pid_ns.map(PathBuf::from), &spared()).expect("tree")
}

fn seen(pid: i32, ns_pid: i32, root_mount: u64, ns: &str) -> Seen {
    Seen {
        pid,
        ns_pid: Some(ns_pid),
        root_mount,
        pid_ns: Some(PathBuf::from(ns)),
    }
}

#[test]
fn a_process_rooted_on_the_tree_or_a_mount_below_it_is_ended() {
    let t = tree(None);
    assert_eq!(t.mounts, BTreeSet::from([TREE, SUB]));
    assert!(t.doomed(&spared(), &seen(500, 500, TREE, "pid:[1]")));
    assert!(t.doomed(&spared(), &seen(501, 501, SUB, "pid:[1]")));
}

#[test]
fn another_trees_process_on_the_same_share_is_spared() {
    // c2 is on the same virtio-fs share (the same device), its own mount.
    assert!(!tree(None).doomed(&spared(), &seen(600, 600, OTHER, "pid:[1]")));
}

#[test]
fn a_process_of_another_pid_namespace_is_spared() {
    let t = tree(Some("pid:[7]"));
    assert!(t.doomed(&spared(), &seen(500, 20, TREE, "pid:[7]")));
    assert!(!t.doomed(&spared(), &seen(501, 501, TREE, "pid:[1]")));
    let unread = Seen {
        pid_ns: None,
        ..seen(502, 21, TREE, "")
    };
    assert!(
        !t.doomed(&spared(), &unread),
        "an unread namespace is not the tree's"
    );
}

#[test]
fn pid_1_of_a_namespace_the_caller_and_its_ancestors_are_never_ended() {
    let t = tree(None);
    assert!(
        !t.doomed(&spared(), &seen(700, 1, TREE, "pid:[7]")),
        "its init"
    );
    assert!(!t.doomed(&spared(), &seen(1, 1, TREE, "pid:[1]")), "pid 1");
    assert!(
        !t.doomed(&spared(), &seen(100, 100, TREE, "pid:[1]")),
        "the caller"
    );
    assert!(
        !t.doomed(&spared(), &seen(99, 99, TREE, "pid:[1]")),
        "its parent"
    );
    let unread = Seen {
        ns_pid: None,
        ..seen(800, 0, TREE, "pid:[1]")
    };
    assert!(!t.doomed(&spared(), &unread), "an unread NSpid");
}

#[test]
fn a_tree_that_is_the_callers_root_or_holds_it_is_refused() {
    let e = Rooted::over(ROOT, "", None, &spared()).expect_err("the root itself");
    assert!(e.contains("mount 1"), "{e}");
    // The root mounted below the tree asked (the tree would be an ancestor of /).
    let e = Rooted::over(9, "9 0 0:1 / /x rw\n1 9 8:1 / / rw\n", None, &spared())
        .expect_err("holds the root");
    assert!(e.contains("mount 1"), "{e}");
    // A process rooted on the spared root is never ended, whatever the tree says.
    let odd = Rooted {
        mounts: BTreeSet::from([ROOT]),
        pid_ns: None,
    };
    assert!(!odd.doomed(&spared(), &seen(500, 500, ROOT, "pid:[1]")));
}

#[test]
fn the_callers_own_root_is_refused_on_this_machine() {
    let spared = Spared::caller().expect("spared");
    assert!(spared.pids.contains(&std::process::id().cast_signed()));
    assert!(spared.pids.len() > 1, "its parent too: {:?}", spared.pids);
    let root = mount_id(Path::new("/"), AtFlags::empty()).expect("/");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(Rooted::over(root, &mountinfo, None, &spared).is_err());
    // `/proc` is a mount of its own, `/` above it: refused, for `/` is the caller's root.
    assert!(
        Rooted::at(
            Path::new("/"),
            Path::new("/proc"),
            Path::new("/proc/self/mountinfo"),
            None,
            &spared
        )
        .is_err()
    );
}

#[test]
fn a_point_on_its_parents_mount_ends_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let mi = Path::new("/proc/self/mountinfo");
    std::fs::create_dir(t.path().join("c1")).expect("c1");
    let s = Spared::default();
    assert_eq!(
        Rooted::at(&t.path().join("c1"), t.path(), mi, None, &s),
        Ok(None)
    );
    std::os::unix::fs::symlink("/proc", t.path().join("link")).expect("link");
    assert_eq!(
        Rooted::at(&t.path().join("link"), t.path(), mi, None, &s),
        Ok(None),
        "a link is not followed"
    );
    let e = Rooted::at(&t.path().join("absent"), t.path(), mi, None, &s).expect_err("absent");
    assert!(e.contains("absent"), "{e}");
}
