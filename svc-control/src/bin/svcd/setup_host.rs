//! `svcd setup-host`: the host accounts svcd needs, made if missing — the API group, and the
//! backends' system users each with a free range of subordinate uids and gids (found in
//! `/etc/subuid` and `/etc/subgid`, never guessed; refused, naming the files, when there is none):
//! 65,536 for the microvm user and with `container.id_ranges = "shared"`; with `"per-sandbox"`
//! (the default) the container user's range holds a slice of 65,536 per sandbox the
//! `[network] ipv4_pool` allows besides slice 0, found above `SUB_UID_MAX` (the window `useradd`
//! gives ranges from, which it would fill). A user whose largest range is smaller (a host set
//! up when shared ranges were the default) gets the large one added; its old one is kept.
//! Idempotent: what exists is kept. The Debian package's `postinst` runs it; people installing
//! by hand can too.

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};
use svc_control::{
    config::host::HostConfig,
    config::host::IdRanges,
    runtime::ids::{self, ID_COUNT},
};

const SUBUID: &str = "/etc/subuid";
const SUBGID: &str = "/etc/subgid";

/// Make what is missing; with `dry_run`, only say what would be made.
pub fn run(host: &HostConfig, dry_run: bool) -> anyhow::Result<()> {
    group(&host.api_group, dry_run)?;
    let (container_ids, container_note) = match host.container.id_ranges {
        IdRanges::Shared => (u64::from(ID_COUNT), "container.user".to_owned()),
        IdRanges::PerSandbox => (
            (u64::from(host.max_sandbox_id()) + 1) * u64::from(ID_COUNT),
            format!(
                "container.user; container.id_ranges = \"per-sandbox\": a slice of {ID_COUNT} \
                 ids for each of the {} sandboxes [network] ipv4_pool allows, and slice 0",
                host.max_sandbox_id()
            ),
        ),
    };
    for (user, key, count) in [
        (
            host.container.user.as_str(),
            container_note.as_str(),
            container_ids,
        ),
        (
            host.microvm.user.as_str(),
            "microvm.user",
            u64::from(ID_COUNT),
        ),
    ] {
        system_user(user, dry_run)?;
        id_range(user, key, count, dry_run)?;
    }
    Ok(())
}

fn say(what: &str) {
    println!("svcd setup-host: {what}");
}

fn exists(db: &str, name: &str) -> bool {
    Command::new("getent")
        .args([db, name])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Run a system tool, failing with its stderr.
fn tool(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} {:?} failed ({}): {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The API group: its members may use svcd's socket besides root.
fn group(name: &str, dry_run: bool) -> anyhow::Result<()> {
    if exists("group", name) {
        say(&format!("group {name}: present"));
        return Ok(());
    }
    if !dry_run {
        tool(Command::new("groupadd").args(["--system", name]))?;
    }
    say(&format!(
        "group {name}: created (members may use svc without root: usermod -aG {name} USER)"
    ));
    Ok(())
}

/// A backend's system user: no home, no login.
fn system_user(user: &str, dry_run: bool) -> anyhow::Result<()> {
    if exists("passwd", user) {
        say(&format!("user {user}: present"));
        return Ok(());
    }
    if !dry_run {
        tool(Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            user,
        ]))?;
    }
    say(&format!("user {user}: created"));
    Ok(())
}

fn read(path: &str) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("reading {path}")),
    }
}

/// The user's range of `count` ids in both files: kept when it has one, else the first free
/// block that no line of either file and no account's id uses — of the login.defs window for
/// [`ID_COUNT`] ids, above it for more (aligned to [`ID_COUNT`]).
fn id_range(user: &str, key: &str, count: u64, dry_run: bool) -> anyhow::Result<()> {
    let (subuid, subgid) = (read(SUBUID)?, read(SUBGID)?);
    let has =
        |text: &str| ids::largest_range(text, user).is_some_and(|(_, n)| u64::from(n) >= count);
    if has(&subuid) && has(&subgid) {
        say(&format!("user {user}: subordinate ids present ({key})"));
        return Ok(());
    }
    let defs = read("/etc/login.defs")?;
    let (lo, hi) = (
        login_def(&defs, "SUB_UID_MIN").unwrap_or(100_000),
        login_def(&defs, "SUB_UID_MAX").unwrap_or(600_100_000),
    );
    let (lo, hi, window) = if count > u64::from(ID_COUNT) {
        (
            hi + 1,
            u64::from(u32::MAX) - 1,
            "above SUB_UID_MAX of /etc/login.defs",
        )
    } else {
        (lo, hi, "(SUB_UID_MIN and SUB_UID_MAX of /etc/login.defs)")
    };
    let used = [ids::used_ranges(&subuid), ids::used_ranges(&subgid)].concat();
    let taken = [account_ids("/etc/passwd")?, account_ids("/etc/group")?].concat();
    let align = count.min(u64::from(ID_COUNT));
    let Some(start) = ids::free_block(&used, &taken, count, align, lo, hi) else {
        bail!(
            "no free range of {count} subordinate ids for {user} between {lo} and {hi} \
             {window}: every block overlaps a line of {SUBUID} or {SUBGID} or an account's id; \
             free one, or widen the window{}",
            if count > u64::from(ID_COUNT) {
                " (or shrink [network] ipv4_pool: a range holds a slice of 65536 ids per \
                 sandbox it allows)"
            } else {
                ""
            }
        );
    };
    let range = format!("{start}-{}", u64::from(start) + count - 1);
    if !dry_run {
        // usermod refuses to add ranges to files that do not exist yet (a fresh host).
        for file in [SUBUID, SUBGID] {
            if !Path::new(file).exists() {
                std::fs::write(file, "").with_context(|| format!("creating {file}"))?;
            }
        }
        tool(Command::new("usermod").args([
            "--add-subuids",
            &range,
            "--add-subgids",
            &range,
            user,
        ]))?;
    }
    say(&format!(
        "user {user}: subordinate ids {range} added ({key})"
    ));
    Ok(())
}

/// A numeric setting of `/etc/login.defs` (`NAME value`).
fn login_def(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == name).then(|| f.next()?.parse().ok())?
    })
}

/// The ids of an account file's lines (`name:x:ID:…`).
fn account_ids(path: &str) -> anyhow::Result<Vec<u64>> {
    Ok(read(path)?
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_defs_are_read_by_name() {
        let text = "# comment\nSUB_UID_MIN\t\t  200000\nSUB_UID_MAX 300000\nBAD x\n";
        assert_eq!(login_def(text, "SUB_UID_MIN"), Some(200_000));
        assert_eq!(login_def(text, "SUB_UID_MAX"), Some(300_000));
        assert_eq!(login_def(text, "BAD"), None);
        assert_eq!(login_def(text, "SUB_GID_MIN"), None);
    }
}
