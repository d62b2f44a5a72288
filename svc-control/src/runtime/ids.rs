//! Subordinate id ranges (`/etc/subuid`, `/etc/subgid`) of the backends' system users: the
//! container backend maps its guests' ids into its user's range, the microvm backend runs each
//! sandbox's QEMU as one id of its user's range.

use std::path::Path;

use super::RuntimeError;

/// How many ids a range has: a container guest's uids and gids 0..65535, or a uid and gid
/// per microvm sandbox id.
pub const ID_COUNT: u32 = 65536;

/// The first host uid and gid of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub uid: u32,
    pub gid: u32,
}

/// The first range of at least [`ID_COUNT`] ids that `user` owns in a subordinate-id file's
/// text (`name:start:count` lines).
pub fn subordinate_range(text: &str, user: &str) -> Option<u32> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.trim().split(':');
            let (name, start, count) = (f.next()?, f.next()?, f.next()?);
            if name != user || f.next().is_some() {
                return None;
            }
            let (start, count) = (start.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
            (count >= ID_COUNT && start > 0 && start.checked_add(ID_COUNT).is_some())
                .then_some(start)
        })
        .next()
}

/// The id range of `user` from `/etc/subuid` and `/etc/subgid` (`config_key` names the
/// setting that chose the user, for the error).
pub fn id_range(
    user: &str,
    subuid: &Path,
    subgid: &Path,
    config_key: &str,
) -> Result<IdRange, RuntimeError> {
    let fix = format!(
        "create it with `useradd --system --no-create-home --shell /usr/sbin/nologin {user}` \
         and `usermod --add-subuids FIRST-LAST --add-subgids FIRST-LAST {user}`, FIRST-LAST \
         being {ID_COUNT} ids no line of /etc/subuid or /etc/subgid overlaps (`cargo xtask \
         setup` picks them), or name another user in svcd.toml {config_key}"
    );
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map_err(|e| RuntimeError::Setup(format!("reading {}: {e}; {fix}", path.display())))
    };
    let uid = subordinate_range(&read(subuid)?, user).ok_or_else(|| {
        RuntimeError::Setup(format!(
            "user {user:?} has no range of {ID_COUNT} ids in {}; {fix}",
            subuid.display()
        ))
    })?;
    let gid = subordinate_range(&read(subgid)?, user).ok_or_else(|| {
        RuntimeError::Setup(format!(
            "user {user:?} has no range of {ID_COUNT} ids in {}; {fix}",
            subgid.display()
        ))
    })?;
    Ok(IdRange { uid, gid })
}
