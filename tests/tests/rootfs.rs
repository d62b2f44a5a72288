//! `svc sandbox create --rootfs DIR`: a container sandbox of the real svcd on a root file system
//! handed to it instead of the base image. The guest runs the tree's own programs, its writes
//! stay in its own layer (DIR never changes, during or after), the perimeter is the same (an
//! allowed host gets the real credential swapped in, another host is refused), destroying it
//! leaves nothing of it and DIR as it was; a user who is not root, a link and a path through
//! one are refused with svcd's message.

use svc_tests::{
    require_root,
    rootfs::{MARK, fingerprint, handed_tree},
    users::User,
    world::{EXAMPLE_TOKEN, World},
};

#[test]
fn a_sandbox_on_a_handed_tree_runs_it_never_writes_it_and_keeps_its_perimeter() {
    require_root();
    let w = World::start();
    let tree = handed_tree(&w.dir);
    let before = fingerprint(&tree);
    let dir = tree.display().to_string();
    let args = [
        "sandbox",
        "create",
        "--rootfs",
        &dir,
        "--allow-host",
        "allowed.example.test",
        "--secret",
        "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:EXAMPLE",
        "handed",
    ];
    w.succeeded(&args, w.svc_env(&args, &[("EXAMPLE", EXAMPLE_TOKEN)]));

    let (code, out, err) = w.sh(
        "handed",
        "cat /etc/handed-rootfs; echo; echo written > /etc/by-guest; cat /etc/by-guest; \
         readlink /proc/1/exe",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [MARK, "written", "/dev/.svc-init"],
        "the guest runs on the handed tree, writes in its own layer, under the bound init"
    );
    assert!(
        !tree.join("etc/by-guest").exists(),
        "a guest write reached DIR"
    );

    let (code, _, err) = w.sh(
        "handed",
        "curl -sS -o /dev/null --max-time 10 -H \"Authorization: Bearer \
         $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" https://allowed.example.test/handed",
    );
    assert_eq!(code, 0, "the allowed host: {err}");
    assert_eq!(
        w.received_auth("/handed"),
        format!("Bearer {EXAMPLE_TOKEN}")
    );
    assert_ne!(
        w.curl_rc("handed", "https://forbidden.example.test/"),
        0,
        "a host outside the allowlist was reached"
    );
    assert_ne!(
        w.curl_rc("handed", "http://192.0.2.66/"),
        0,
        "an IP literal was reached"
    );

    w.destroy_checked("handed");
    assert_eq!(fingerprint(&tree), before, "DIR changed");
}

#[test]
fn rootfs_refusals_name_the_directory_and_why() {
    require_root();
    let w = World::start();
    let tree = handed_tree(&w.dir);
    let dir = tree.display().to_string();
    let link = w.dir.join("link");
    std::os::unix::fs::symlink(&tree, &link).expect("link");
    let through = format!("{}/etc", link.display());
    for (asked, says) in [
        (
            link.display().to_string(),
            "is a symbolic link: give the directory itself",
        ),
        (through.clone(), "passes through a symbolic link"),
        (format!("{dir}/etc/passwd"), "is not a directory"),
    ] {
        let out = w.svc(&["sandbox", "create", "--rootfs", &asked, "refused"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(&asked) && err.contains(says),
            "{asked}: {err}"
        );
    }
    let user = User::add(format!("rootfs{}", std::process::id() % 100_000), None);
    let out = user.svc(&w, &["sandbox", "create", "--rootfs", &dir, "theirs"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("only root may hand a sandbox its root file system"),
        "{err}"
    );
    let list = w.svc_ok(&["sandbox", "list"]);
    assert!(
        !list.contains("refused") && !list.contains("theirs"),
        "{list}"
    );
}
