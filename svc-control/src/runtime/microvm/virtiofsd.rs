//! The virtiofsd of one shared directory: its flags, its id translation and the seccomp
//! filter svcd installs on it, all from [`policy::shares`](crate::policy::shares).
//!
//! virtiofsd runs as root on the host and does what the guest's FUSE requests say: without
//! these, a guest root's `chown 1:6` and `chmod 6755` land on the host file as asked. The id
//! translation makes every guest id the directory's owner (guest root ↔ owner both ways, the
//! rest squashed); the filter makes every call that would give a host file a setid bit or
//! make a device node fail with EPERM (virtiofsd answers the guest with that error), and
//! `openat2`, whose mode a filter cannot read, fail with ENOSYS so virtiofsd opens with
//! `openat`.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, OnceLock},
};

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use crate::{
    dataplane::seccomp::{Program, install_before_exec},
    policy::shares::{IdRule, id_rules},
    runtime::share_calls::{self, MODE_CALLS, Masked},
};

/// The virtiofsd command serving `shared` (owned by `owner`: uid, gid) on `socket`, with the
/// share filter installed before it runs.
pub(super) fn command(
    bin: &Path,
    socket: &Path,
    shared: &Path,
    owner: (u32, u32),
) -> Result<tokio::process::Command, String> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--socket-path")
        .arg(socket)
        .arg("--shared-dir")
        .arg(shared)
        .args(["--sandbox", "namespace", "--cache", "auto"])
        // Without CAP_FSETID the host's kernel clears a file's set-user-ID and set-group-ID
        // bits at each write or truncate virtiofsd makes for the guest: a setid program already
        // in the share (an image's `passwd`) cannot be rewritten with the guest's bytes and
        // keep its bit.
        .arg("--modcaps=-fsetid")
        .args([
            "--migration-mode",
            "find-paths",
            "--migration-on-error",
            "guest-error",
        ])
        .args(translation("uid", owner.0))
        .args(translation("gid", owner.1));
    install_before_exec(&mut cmd, filters()?);
    Ok(cmd)
}

/// `--translate-uid`/`--translate-gid` flags (`what`: `uid` or `gid`) for a share owned by
/// `owner`.
fn translation(what: &str, owner: u32) -> Vec<String> {
    id_rules(owner)
        .iter()
        .flat_map(|r| {
            let rule = match *r {
                IdRule::Map { guest, host, count } => format!("map:{guest}:{host}:{count}"),
                IdRule::SquashGuest { guest, host, count } => {
                    format!("squash-guest:{guest}:{host}:{count}")
                }
            };
            [format!("--translate-{what}"), rule]
        })
        .collect()
}

/// The share filters, compiled once: the EPERM one and the ENOSYS one.
fn filters() -> Result<Arc<Vec<Program>>, String> {
    static FILTERS: OnceLock<Result<Arc<Vec<Program>>, String>> = OnceLock::new();
    FILTERS
        .get_or_init(|| {
            let refused = compile(refused_rules()?, libc::EPERM)?;
            let unreadable = compile(unreadable_rules()?, libc::ENOSYS)?;
            Ok(Arc::new(vec![refused, unreadable]))
        })
        .clone()
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<Program, String> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("virtiofsd's seccomp filter: {e:?}"))?;
    let errno = u32::try_from(errno).map_err(|e| e.to_string())?;
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch,
    )
    .and_then(TryInto::try_into)
    .map_err(|e| format!("compiling virtiofsd's seccomp filter: {e}"))
}

/// Each mode call, refused when a conjunction of [`share_calls::refused_when`] holds.
fn refused_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let mut rules = BTreeMap::new();
    for c in &MODE_CALLS {
        let nr = number(c.name)?;
        let list = share_calls::refused_when(c)
            .into_iter()
            .map(|tests| {
                let conditions = tests.into_iter().map(condition).collect::<Result<_, _>>()?;
                SeccompRule::new(conditions).map_err(|e| format!("{}: {e}", c.name))
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(nr, list);
    }
    Ok(rules)
}

/// `openat2` and its kind: refused whatever their arguments.
fn unreadable_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    share_calls::UNREADABLE
        .iter()
        .map(|name| Ok((number(name)?, Vec::new())))
        .collect()
}

fn condition(m: Masked) -> Result<SeccompCondition, String> {
    // Modes and open flags are C ints: their low 32 bits.
    SeccompCondition::new(
        m.index,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(m.mask),
        m.value,
    )
    .map_err(|e| format!("argument {}: {e}", m.index))
}

/// The system call number of `name` on this machine.
fn number(name: &str) -> Result<i64, String> {
    let nr = match name {
        "chmod" => libc::SYS_chmod,
        "fchmod" => libc::SYS_fchmod,
        "fchmodat" => libc::SYS_fchmodat,
        "fchmodat2" => libc::SYS_fchmodat2,
        "creat" => libc::SYS_creat,
        "open" => libc::SYS_open,
        "openat" => libc::SYS_openat,
        "openat2" => libc::SYS_openat2,
        "mkdir" => libc::SYS_mkdir,
        "mkdirat" => libc::SYS_mkdirat,
        "mknod" => libc::SYS_mknod,
        "mknodat" => libc::SYS_mknodat,
        other => return Err(format!("virtiofsd's seccomp filter: no number for {other}")),
    };
    Ok(nr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_guest_root_maps_to_the_owner_and_every_other_guest_id_is_squashed() {
        assert_eq!(
            translation("uid", 1000),
            [
                "--translate-uid",
                "map:0:1000:1",
                "--translate-uid",
                "squash-guest:1:1000:4294967294"
            ]
        );
        assert_eq!(translation("gid", 7)[3], "squash-guest:1:7:4294967294");
    }

    #[test]
    fn the_filters_compile_for_every_mode_call() {
        let f = filters().expect("filters");
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|p| !p.is_empty()));
        for c in MODE_CALLS {
            number(c.name).expect("a number");
        }
    }
}
