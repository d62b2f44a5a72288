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
    users_ranges(text, user)
        .find(|&(start, count)| {
            count >= ID_COUNT && start > 0 && start.checked_add(ID_COUNT).is_some()
        })
        .map(|(start, _)| start)
}

/// The `(start, count)` of each well-formed `user:start:count` line of a subordinate-id
/// file's text that is `user`'s.
fn users_ranges<'a>(text: &'a str, user: &'a str) -> impl Iterator<Item = (u32, u32)> + 'a {
    text.lines().filter_map(move |l| {
        let mut f = l.trim().split(':');
        let (name, start, count) = (f.next()?, f.next()?, f.next()?);
        if name != user || f.next().is_some() {
            return None;
        }
        Some((start.parse::<u32>().ok()?, count.parse::<u32>().ok()?))
    })
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

/// The largest range `user` owns in a subordinate-id file's text (the first of equals):
/// `(start, count)`; ranges starting at 0 or running past the last id are skipped.
pub fn largest_range(text: &str, user: &str) -> Option<(u32, u32)> {
    users_ranges(text, user)
        .filter(|&(start, count)| start > 0 && start.checked_add(count).is_some())
        .fold(None, |best: Option<(u32, u32)>, r| match best {
            Some(b) if b.1 >= r.1 => Some(b),
            _ => Some(r),
        })
}

/// A user's subordinate range cut into slices of [`ID_COUNT`] ids, one per container sandbox
/// (`container.id_ranges = "per-sandbox"`): sandbox id N's guest ids map to slice N, the
/// range's start + N × [`ID_COUNT`]. Slice 0 is never a sandbox's: it is the ids the shared
/// setting maps every guest to when the range is the user's first, so a host that changes
/// the setting never gives a new sandbox the ids older ones still run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRange {
    /// The user owning the range.
    pub user: String,
    /// The range's first uid and gid.
    pub start: IdRange,
    /// How many slices it holds (of its uids and gids, the fewer).
    pub slices: u32,
}

impl SliceRange {
    /// The user's largest range in both texts (of `/etc/subuid` and `/etc/subgid`), or none
    /// when either has none.
    pub fn from_texts(subuid: &str, subgid: &str, user: &str) -> Option<Self> {
        let (uid, uids) = largest_range(subuid, user)?;
        let (gid, gids) = largest_range(subgid, user)?;
        Some(Self {
            user: user.to_owned(),
            start: IdRange { uid, gid },
            slices: uids.min(gids) / ID_COUNT,
        })
    }

    /// The first ids of sandbox `id`'s slice, or why it has none: the range is too small for
    /// that many sandboxes (it names the range and how to grow it).
    pub fn slice(&self, id: u32) -> Result<IdRange, String> {
        let offset = u64::from(id) * u64::from(ID_COUNT);
        let at = |start: u32| u32::try_from(u64::from(start) + offset).ok();
        match (at(self.start.uid), at(self.start.gid)) {
            (Some(uid), Some(gid)) if id >= 1 && id < self.slices => Ok(IdRange { uid, gid }),
            _ => Err(format!(
                "no host id range is left for sandbox id {id}: container.id_ranges = \
                 \"per-sandbox\" gives sandbox id N the slice N of {count} ids of user {user}'s \
                 subordinate range ({uid}-{uid_end} in /etc/subuid, {gid}-{gid_end} in \
                 /etc/subgid), which holds slices 1 to {last}; grow the range (`svcd setup-host` \
                 sizes it for the sandbox pool, or `usermod --add-subuids FIRST-LAST \
                 --add-subgids FIRST-LAST {user}` with a larger free range), or destroy a sandbox",
                count = ID_COUNT,
                user = self.user,
                uid = self.start.uid,
                gid = self.start.gid,
                uid_end =
                    u64::from(self.start.uid) + u64::from(self.slices) * u64::from(ID_COUNT) - 1,
                gid_end =
                    u64::from(self.start.gid) + u64::from(self.slices) * u64::from(ID_COUNT) - 1,
                last = self.slices.saturating_sub(1),
            )),
        }
    }
}

/// The per-sandbox range of `user` from `/etc/subuid` and `/etc/subgid` (`config_key` names
/// the setting that chose the user, for the error): its largest range in each.
pub fn slice_range(
    user: &str,
    subuid: &Path,
    subgid: &Path,
    config_key: &str,
) -> Result<SliceRange, RuntimeError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map_err(|e| RuntimeError::Setup(format!("reading {}: {e}", path.display())))
    };
    let files = [(subuid, read(subuid)?), (subgid, read(subgid)?)];
    match SliceRange::from_texts(&files[0].1, &files[1].1, user) {
        Some(r) if r.slices >= 2 => Ok(r),
        _ => Err(RuntimeError::Setup(too_small(user, &files, config_key))),
    }
}

/// Why `user`'s ranges in `files` (`/etc/subuid` and `/etc/subgid`, path and text) hold no
/// sandbox's slice: what it has, and what to run (a host set up when the shared setting was
/// the default has a single range of [`ID_COUNT`] ids).
fn too_small(user: &str, files: &[(&Path, String); 2], config_key: &str) -> String {
    let has: Vec<String> = files
        .iter()
        .map(|(path, text)| match largest_range(text, user) {
            Some((start, count)) => format!(
                "{count} ids ({start}-{}) in {}",
                u64::from(start) + u64::from(count) - 1,
                path.display()
            ),
            None => format!("none in {}", path.display()),
        })
        .collect();
    format!(
        "container.id_ranges = \"per-sandbox\" (the default) needs user {user:?} to own a \
         range of at least {} ids in both {} and {} (slice 0 and one of {ID_COUNT} ids per \
         sandbox), and its largest is {}: run `svcd setup-host` as root (it adds a range sized \
         for the sandboxes [network] ipv4_pool allows and keeps the old one), then start svcd \
         again; or set container.id_ranges = \"shared\" in svcd.toml (every sandbox's guest \
         root one host user), or name another user in svcd.toml {config_key}",
        2 * u64::from(ID_COUNT),
        files[0].0.display(),
        files[1].0.display(),
        has.join(", "),
    )
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
    free_block(used, taken, count, count, lo, hi)
}

/// [`free_range`] with the block starting at a multiple of `align` rather than of `count`
/// (a per-sandbox range: many slices, each aligned).
pub fn free_block(
    used: &[(u64, u64)],
    taken: &[u64],
    count: u64,
    align: u64,
    lo: u64,
    hi: u64,
) -> Option<u32> {
    let (count, align) = (count.max(1), align.max(1));
    let mut start = lo.div_ceil(align) * align;
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
            Some(past) => start = past.div_ceil(align) * align,
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
    fn a_large_block_is_aligned_to_a_slice_not_to_its_size() {
        let used = used_ranges("svc-sandbox:600113152:65536\n");
        let count = 16_385 * 65_536;
        assert_eq!(
            free_block(&used, &[], count, 65_536, 600_100_001, u64::from(u32::MAX)),
            Some(600_178_688),
            "past the used line, at the next multiple of 65536"
        );
        assert_eq!(
            free_block(&[], &[], 1 << 32, 65_536, 0, u64::from(u32::MAX)),
            None,
            "nothing that large below 2^32"
        );
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

#[cfg(test)]
mod slice_tests {
    use super::*;

    /// (what, a file's text, the largest range wanted).
    type RangeCase<'a> = (&'a str, &'a str, Option<(u32, u32)>);
    /// (sandbox id, its slice's first (uid, gid), or refused).
    type SliceCase = (u32, Option<(u32, u32)>);

    #[test]
    fn the_users_largest_range_is_cut_into_slices() {
        let cases: &[RangeCase<'_>] = &[
            (
                "the larger of two lines wins",
                "svc-sandbox:200000:65536\nsvc-sandbox:2147483648:1073741824\n",
                Some((2_147_483_648, 1_073_741_824)),
            ),
            (
                "the first of equals",
                "svc-sandbox:200000:65536\nsvc-sandbox:400000:65536\n",
                Some((200_000, 65_536)),
            ),
            (
                "other users' lines are not the user's",
                "alice:100000:9999999\nsvc-sandbox:200000:131072\n",
                Some((200_000, 131_072)),
            ),
            (
                "a range past the last id or at 0 is skipped",
                "svc-sandbox:4294967000:65536\nsvc-sandbox:0:999999\n",
                None,
            ),
            ("malformed lines are skipped", "svc-sandbox:x:65536\n", None),
        ];
        for (name, text, want) in cases {
            assert_eq!(largest_range(text, "svc-sandbox"), *want, "{name}");
        }
    }

    #[test]
    fn sandbox_id_n_gets_slice_n_and_ids_past_the_range_are_refused() {
        let r = SliceRange::from_texts(
            "svc-sandbox:1000000:262144\n",
            "svc-sandbox:3000000:327680\n",
            "svc-sandbox",
        )
        .expect("a range");
        assert_eq!(r.slices, 4, "uids hold 4 slices, gids 5: the fewer");
        let cases: &[SliceCase] = &[
            (0, None),
            (1, Some((1_065_536, 3_065_536))),
            (3, Some((1_196_608, 3_196_608))),
            (4, None),
            (u32::MAX, None),
        ];
        for (id, want) in cases {
            let got = r.slice(*id).map(|s| (s.uid, s.gid));
            match (want, &got) {
                (Some(w), Ok(g)) => assert_eq!(w, g, "id {id}"),
                (None, Err(e)) => assert!(
                    e.contains(&format!("sandbox id {id}"))
                        && e.contains("1000000-1262143 in /etc/subuid")
                        && e.contains("slices 1 to 3")
                        && e.contains("svcd setup-host"),
                    "id {id}: {e}"
                ),
                _ => panic!("id {id}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn a_range_of_one_slice_is_refused_saying_what_to_run() {
        let dir = std::env::temp_dir().join(format!("svc-ids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (subuid, subgid) = (dir.join("subuid"), dir.join("subgid"));
        std::fs::write(&subuid, "svc-sandbox:200000:65536\n").expect("subuid");
        std::fs::write(&subgid, "alice:100000:65536\n").expect("subgid");
        let err = slice_range("svc-sandbox", &subuid, &subgid, "container.user")
            .expect_err("one slice is no sandbox's")
            .to_string();
        for part in [
            "(the default) needs user \"svc-sandbox\" to own a range of at least 131072 ids",
            "its largest is 65536 ids (200000-265535) in ",
            "none in ",
            "run `svcd setup-host` as root",
            "container.id_ranges = \"shared\"",
        ] {
            assert!(err.contains(part), "{part:?} in {err}");
        }
        std::fs::write(&subgid, "svc-sandbox:300000:196608\n").expect("subgid");
        std::fs::write(
            &subuid,
            "svc-sandbox:200000:65536\nsvc-sandbox:900000:131072\n",
        )
        .expect("subuid");
        let r = slice_range("svc-sandbox", &subuid, &subgid, "container.user").expect("2 slices");
        assert_eq!((r.start.uid, r.start.gid, r.slices), (900_000, 300_000, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_user_without_a_range_in_either_file_has_no_slices() {
        assert_eq!(
            SliceRange::from_texts("svc-sandbox:1:65536\n", "", "svc-sandbox"),
            None
        );
    }
}
