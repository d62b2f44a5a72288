//! Throwaway users and groups of the host, for the tests of a second API user: each made
//! afresh (a leftover of the same name removed first) and removed on drop.

use std::process::{Command, Output};

use crate::world::World;

/// The world's API group (`nogroup`): every user made here has it as its primary group.
pub const API_GID: u32 = 65534;

/// A throwaway user of the host, primary group [`API_GID`]; removed on drop.
#[derive(Debug)]
pub struct User {
    /// Its login name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
}

impl User {
    /// `useradd` (no home, no shell) with primary group [`API_GID`] and, if given,
    /// `extra_group` besides.
    pub fn add(name: String, extra_group: Option<&str>) -> Self {
        let _ = Command::new("userdel").arg(&name).output();
        let mut c = Command::new("useradd");
        c.args(["--no-create-home", "--shell", "/usr/sbin/nologin"])
            .args(["--gid", &API_GID.to_string()]);
        if let Some(g) = extra_group {
            c.args(["--groups", g]);
        }
        crate::run_cmd(c.arg(&name));
        let uid = id_of("-u", &name);
        Self { name, uid }
    }

    /// setpriv's arguments for running as this user with the groups the host gives it.
    pub fn ids(&self) -> Vec<String> {
        let out = Command::new("id")
            .args(["-G", &self.name])
            .output()
            .expect("id");
        let groups: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        vec![
            format!("--reuid={}", self.uid),
            format!("--regid={API_GID}"),
            format!("--groups={}", groups.join(",")),
        ]
    }

    /// `svc ARGS` against `w`'s svcd, run as this user; as it went.
    pub fn svc(&self, w: &World, args: &[&str]) -> Output {
        let ids = self.ids();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        w.svc_as(&ids, args)
    }

    /// `svc ARGS` run by this user, asserting success (the failure shows svcd's log); its stdout.
    pub fn svc_ok(&self, w: &World, args: &[&str]) -> String {
        let out = self.svc(w, args);
        assert!(
            out.status.success(),
            "{} ran svc {args:?}: {out:?}\nsvcd:\n{}",
            self.name,
            w.svcd_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// How svcd names this user as an owner.
    pub fn named(&self) -> String {
        format!("uid {} ({})", self.uid, self.name)
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// A throwaway group of the host; removed on drop (after its users: declare it first).
#[derive(Debug)]
pub struct Group(pub String);

impl Group {
    /// `groupadd NAME`.
    pub fn add(name: String) -> Self {
        let _ = Command::new("groupdel").arg(&name).output();
        crate::run_cmd(Command::new("groupadd").arg(&name));
        Self(name)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.0).output();
    }
}

/// `id FLAG NAME` as a number (`-u`: the uid, `-g`: the primary gid).
pub fn id_of(flag: &str, name: &str) -> u32 {
    let out = Command::new("id").args([flag, name]).output().expect("id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("id {flag} {name}: {out:?}"))
}

/// Two new accounts `{prefix}-a…` and `{prefix}-b…`, named apart from every other pair of this
/// process (tests of one file run at once, and each deletes its own users when it ends).
pub fn pair(prefix: &str) -> (User, User) {
    static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let pair = PAIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = std::process::id() % 10_000;
    (
        User::add(format!("{prefix}-a{tag}-{pair}"), None),
        User::add(format!("{prefix}-b{tag}-{pair}"), None),
    )
}

/// Until `cond` holds (every 200 ms, for at most `secs`): whether it did.
pub fn within(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    cond()
}
