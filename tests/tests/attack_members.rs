//! A second API user against the first, through the real `svc` (under `setpriv` with each
//! user's ids) and the real svcd: B reads A's audit records by every filter, and takes over A's
//! sandbox's name the moment A destroys it, then reads "its" records.

use std::process::{Command, Output};

use svc_tests::{require_root, world::World};

/// The World's API group (`nogroup`).
const API_GID: u32 = 65534;

/// A throwaway user of the host in the API group; removed on drop.
struct User {
    name: String,
    uid: u32,
}

impl User {
    fn add(name: String) -> Self {
        let _ = Command::new("userdel").arg(&name).output();
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/usr/sbin/nologin"])
            .args(["--gid", &API_GID.to_string()])
            .arg(&name)
            .output()
            .expect("useradd");
        assert!(out.status.success(), "useradd {name}: {out:?}");
        let id = Command::new("id").args(["-u", &name]).output().expect("id");
        let uid = String::from_utf8_lossy(&id.stdout)
            .trim()
            .parse()
            .expect("uid");
        Self { name, uid }
    }

    fn run(&self, w: &World, args: &[&str]) -> Output {
        let ids = [
            format!("--reuid={}", self.uid),
            format!("--regid={API_GID}"),
            "--clear-groups".to_owned(),
        ];
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        w.svc_as(&ids, args)
    }

    fn ok(&self, w: &World, args: &[&str]) -> String {
        let out = self.run(w, args);
        assert!(
            out.status.success(),
            "{} ran svc {args:?}: {out:?}\nsvcd:\n{}",
            self.name,
            w.svcd_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

fn users() -> (User, User) {
    let tag = std::process::id() % 100_000;
    (
        User::add(format!("svcatk-a{tag}")),
        User::add(format!("svcatk-b{tag}")),
    )
}

/// B asks for A's records by name, by id, by layer and verdict; and B takes A's sandbox's name
/// the moment A destroys it: none of A's records, made just before, is B's to read.
#[test]
fn a_member_reads_none_of_anothers_audit_records() {
    require_root();
    let w = World::start();
    let (a, b) = users();
    a.ok(
        &w,
        &[
            "sandbox",
            "create",
            "--allow-host",
            "allowed.example.test",
            "reused",
        ],
    );
    let id = w.show("reused")["id"].to_string();
    b.ok(&w, &["sandbox", "create", "mine"]);
    // A's guest: a request whose path is A's business.
    let a_secret_path = "/a-private-path-5d1e";
    let (code, _, err) = w.sh(
        "reused",
        &format!("curl -sS --max-time 10 https://allowed.example.test{a_secret_path}"),
    );
    assert_eq!(code, 0, "{err}");
    for args in [
        vec!["audit", "--json"],
        vec!["audit", "--sandbox", "reused", "--json"],
        vec!["audit", "--sandbox", &id, "--json"],
        vec!["audit", "--layer", "http", "--verdict", "allow", "--json"],
    ] {
        let seen = b.ok(&w, &args);
        assert!(
            !seen.contains(a_secret_path) && !seen.contains("\"reused\""),
            "B read A's records with {args:?}: {seen}"
        );
    }
    // A's guest keeps making records up to the moment A destroys it; B takes the name at once.
    let mut busy = Command::new(svc_tests::world::workspace_bin("svc"))
        .env("SVC_SOCKET", &w.socket)
        .args(["sandbox", "exec", "reused", "--", "sh", "-c"])
        .arg(format!(
            "while :; do curl -s -o /dev/null --max-time 2 https://allowed.example.test{a_secret_path}-late; done"
        ))
        .spawn()
        .expect("svc exec");
    std::thread::sleep(std::time::Duration::from_secs(2));
    a.ok(&w, &["sandbox", "destroy", "reused"]);
    let taken = b.run(&w, &["sandbox", "create", "reused"]);
    let _ = busy.kill();
    let _ = busy.wait();
    assert!(
        taken.status.success(),
        "B could not take the name: {taken:?}"
    );
    let seen = b.ok(&w, &["audit", "--sandbox", "reused", "--json"]);
    let leaked: Vec<&str> = seen.lines().filter(|l| l.contains(a_secret_path)).collect();
    assert!(
        leaked.is_empty(),
        "B reads A's records through the reused name ({} of them): {leaked:#?}",
        leaked.len()
    );
    w.svc_ok(&["sandbox", "destroy", "reused"]);
    w.svc_ok(&["sandbox", "destroy", "mine"]);
}
