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

/// The id intervals `[start, start + count)` a subordinate-id file's text gives out, to
/// anyone; lines that do not parse give nothing.
pub fn used_ranges(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.trim().split(':');
            let (_, start, count) = (f.next()?, f.next()?, f.next()?);
            let (start, count) = (start.parse::<u64>().ok()?, count.parse::<u64>().ok()?);
            Some((start, start + count))
        })
        .collect()
}

/// The first `count` ids, starting at a multiple of `count`, inside `[lo, hi]` that overlap
/// no interval of `used` and contain no id of `taken` (the uids and gids real accounts
/// have): a new user's subordinate range. Id 4294967295 ((uid_t)-1) is never in it. `None` when there is no such block.
pub fn free_range(used: &[(u64, u64)], taken: &[u64], count: u64, lo: u64, hi: u64) -> Option<u32> {
    let count = count.max(1);
    let mut start = lo.div_ceil(count) * count;
    // (uid_t)-1 is no id: a block ends below it.
    while start + count - 1 <= hi && start + count <= u64::from(u32::MAX) {
        let end = start + count;
        let blocked = used
            .iter()
            .filter(|(s, e)| start < *e && *s < end)
            .map(|(_, e)| *e)
            .chain(
                taken
                    .iter()
                    .filter(|&&id| (start..end).contains(&id))
                    .map(|id| id + 1),
            )
            .max();
        match blocked {
            None => return u32::try_from(start).ok(),
            Some(past) => start = past.div_ceil(count) * count,
        }
    }
    None
}

#[cfg(test)]
mod free_range_tests {
    use super::*;

    const LO: u64 = 100_000;
    const HI: u64 = 600_100_000;

    #[test]
    fn a_free_range_is_found_around_what_is_used() {
        let cases: &[(&str, &str, &[u64], Option<u32>)] = &[
            (
                "empty files: the first aligned block from the minimum",
                "",
                &[],
                Some(131_072),
            ),
            (
                "one user's range from the minimum is skipped",
                "alice:100000:65536\n",
                &[],
                Some(196_608),
            ),
            (
                "a range that starts inside the candidate moves past it",
                "bob:200000:10\n",
                &[],
                Some(131_072),
            ),
            (
                "ranges of both files count",
                "alice:131072:65536\nbob:196608:65536\n",
                &[],
                Some(262_144),
            ),
            (
                "a real uid inside the block moves past it",
                "",
                &[140_000],
                Some(196_608),
            ),
            (
                "lines that do not parse are ignored",
                "garbage\nx:y:z\n:1\n",
                &[],
                Some(131_072),
            ),
        ];
        for (name, text, taken, want) in cases {
            let used = used_ranges(text);
            assert_eq!(free_range(&used, taken, 65_536, LO, HI), *want, "{name}");
        }
    }

    #[test]
    fn no_free_range_is_said_as_none() {
        let used = vec![(0, 1 << 32)];
        assert_eq!(
            free_range(&used, &[], 65_536, LO, HI),
            None,
            "everything used"
        );
        assert_eq!(
            free_range(&[], &[], 65_536, 100_000, 150_000),
            None,
            "the window is smaller than one aligned block"
        );
        assert_eq!(
            free_range(&[], &[], 65_536, 4_294_900_000, u64::MAX),
            None,
            "no block below 2^32"
        );
    }
}
