//! What a guest may leave on a host file through a shared directory (the project at
//! `/workspace`, the coding agent's home): the owner's ids only, no set-user-ID or
//! set-group-ID bit, no device node, no file capability (`security.capability`: the container
//! backend keeps no `CAP_SETFCAP`, the microvm backend's virtiofsd passes no extended
//! attributes). Both backends ask this module: the container backend's
//! seccomp profile and the microvm backend's virtiofsd (its id translation and the seccomp
//! filter svcd puts on it) are built from these rules.
//!
//! Why: a share is a directory of a host user. A setid file there runs on the host with the
//! file's ids for whoever executes it, and a device node opens a host device with the node's
//! mode; an id other than the owner's gives a file to a user who never wrote it; a file
//! capability set by the guest's root on a share owned by host root is stored for host root
//! and gives whoever runs the file that capability on the host.

/// The mode bits that never reach a host file through a share: set-user-ID, set-group-ID.
pub const SETID_BITS: u32 = 0o6000;

/// The file-type bits of a mode (`S_IFMT`).
pub const TYPE_BITS: u32 = 0o170_000;

/// Character and block devices (`S_IFCHR`, `S_IFBLK`): never made through a share.
pub const DEVICE_TYPES: [u32; 2] = [0o020_000, 0o060_000];

/// The node types `mknod` may make through a share: a regular file (type 0 or `S_IFREG`),
/// a FIFO, a socket.
pub const NODE_TYPES: [u32; 4] = [0, 0o100_000, 0o010_000, 0o140_000];

/// The guest's root: the only guest id the owner shows as.
pub const GUEST_ROOT: u32 = 0;

/// Whether a mode given to chmod/open/creat/mkdir may reach a host file.
pub const fn mode_reaches_host(mode: u32) -> bool {
    mode & SETID_BITS == 0
}

/// Whether `mknod` with `mode` (type and permission bits) may make a node on the host.
pub fn node_reaches_host(mode: u32) -> bool {
    mode_reaches_host(mode) && NODE_TYPES.contains(&(mode & TYPE_BITS))
}

/// The host id a guest's uid or gid `guest` becomes in a share owned by `owner`: always the
/// owner. The guest's root writes as the owner; any other guest id (a `chown 1:6`, a file
/// made by a guest user) is squashed to the owner, never passed through.
pub const fn host_id(owner: u32, _guest: u32) -> u32 {
    owner
}

/// The id a host file's uid or gid `host` shows as in the guest: the owner's as the guest's
/// root, any other as itself (a file the owner shared that another user owns).
pub const fn guest_id(owner: u32, host: u32) -> u32 {
    if host == owner { GUEST_ROOT } else { host }
}

/// One rule of a share's id translation (guest ↔ host), in the order a translator needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdRule {
    /// `count` guest ids from `guest` are host ids from `host`, both ways.
    Map { guest: u32, host: u32, count: u32 },
    /// `count` guest ids from `guest` all become host id `host` (one way: guest to host).
    SquashGuest { guest: u32, host: u32, count: u32 },
}

/// The translation [`host_id`] and [`guest_id`] describe, as ranges: guest root ↔ the owner,
/// every other guest id (1 up to the last one a range can name) squashed to the owner.
pub const fn id_rules(owner: u32) -> [IdRule; 2] {
    [
        IdRule::Map {
            guest: GUEST_ROOT,
            host: owner,
            count: 1,
        },
        IdRule::SquashGuest {
            guest: 1,
            host: owner,
            count: u32::MAX - 1,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apply `rules` to guest id `g` as a range translator does (unlisted ids pass through).
    fn translate(rules: &[IdRule], g: u32) -> u32 {
        for r in rules {
            match *r {
                IdRule::Map { guest, host, count } | IdRule::SquashGuest { guest, host, count }
                    if g >= guest && g - guest < count =>
                {
                    return match r {
                        IdRule::Map { .. } => host + (g - guest),
                        IdRule::SquashGuest { .. } => host,
                    };
                }
                _ => {}
            }
        }
        g
    }

    #[test]
    fn only_modes_without_setid_bits_reach_the_host() {
        for (mode, reaches) in [
            (0o644, true),
            (0o755, true),
            (0o1777, true),
            (0o100_755, true),
            (0o4755, false),
            (0o2755, false),
            (0o6755, false),
            (0o42_775, false),
            (0o104_000, false),
        ] {
            assert_eq!(mode_reaches_host(mode), reaches, "{mode:o}");
        }
    }

    #[test]
    fn mknod_makes_files_fifos_and_sockets_never_devices_or_setid_files() {
        for (mode, reaches) in [
            (0o644, true),
            (0o100_644, true),
            (0o010_600, true),
            (0o140_755, true),
            (0o020_666, false),
            (0o060_660, false),
            (0o100_000 | 0o4755, false),
            (0o2644, false),
            (0o040_755, false),
        ] {
            assert_eq!(node_reaches_host(mode), reaches, "{mode:o}");
        }
    }

    #[test]
    fn every_guest_id_is_the_owner_on_the_host_and_the_owner_is_guest_root() {
        let owner = 1000;
        let rules = id_rules(owner);
        for g in [0, 1, 6, 999, 1000, 1001, 65_534, 100_000, u32::MAX - 1] {
            assert_eq!(host_id(owner, g), owner, "guest {g}");
            assert_eq!(translate(&rules, g), host_id(owner, g), "rules, guest {g}");
        }
        for (h, g) in [(1000, 0), (0, 0), (1, 1), (1001, 1001)] {
            assert_eq!(guest_id(owner, h), g, "host {h}");
        }
        // The ranges do not overlap and stop before the id that means "unchanged".
        let [
            IdRule::Map { count: 1, .. },
            IdRule::SquashGuest {
                guest: 1, count, ..
            },
        ] = rules
        else {
            panic!("{rules:?}");
        };
        assert_eq!(u64::from(count) + 1, u64::from(u32::MAX));
    }
}
