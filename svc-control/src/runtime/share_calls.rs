//! The system calls through which a mode reaches a file, and where their mode lives: both
//! backends turn [`policy::shares`](crate::policy::shares) into seccomp rules over this table
//! (the container's OCI profile, the filter svcd puts on each virtiofsd).
//!
//! `openat2` takes its mode inside a struct a filter cannot read: it answers ENOSYS, and the
//! callers that use it (virtiofsd, systemd) fall back to `openat`, whose mode a filter reads.
//! `mkdir` is listed although the kernel drops setid bits from its mode: the rule holds
//! whatever a file system does.

use crate::policy::shares::{NODE_TYPES, SETID_BITS, TYPE_BITS};

/// `O_CREAT` and `__O_TMPFILE` (x86): an open that makes a file, with the mode argument.
pub const CREATE_FLAGS: [u64; 2] = [0o100, 0o20_000_000];

/// Calls answered ENOSYS: their mode is out of a filter's reach.
pub const UNREADABLE: &[&str] = &["openat2"];

/// What a call does with the mode it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Makes {
    /// Sets the mode of a file that exists.
    Mode,
    /// Makes a file with the mode when its flags (argument `flags`) ask to create one.
    CreateWith { flags: u8 },
    /// Makes a file or directory with the mode, always.
    Create,
    /// Makes a node: the mode carries its type too.
    Node,
}

/// One call: its name, the index of its mode argument, what it does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeCall {
    pub name: &'static str,
    pub mode: u8,
    pub makes: Makes,
}

const fn call(name: &'static str, mode: u8, makes: Makes) -> ModeCall {
    ModeCall { name, mode, makes }
}

/// Every call through which a mode reaches a file (x86-64 and i386 argument order).
pub const MODE_CALLS: [ModeCall; 11] = [
    call("chmod", 1, Makes::Mode),
    call("fchmod", 1, Makes::Mode),
    call("fchmodat", 2, Makes::Mode),
    call("fchmodat2", 2, Makes::Mode),
    call("creat", 1, Makes::Create),
    call("open", 2, Makes::CreateWith { flags: 1 }),
    call("openat", 3, Makes::CreateWith { flags: 2 }),
    call("mkdir", 1, Makes::Create),
    call("mkdirat", 2, Makes::Create),
    call("mknod", 1, Makes::Node),
    call("mknodat", 2, Makes::Node),
];

/// One argument test: `(arg[index] & mask) == value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Masked {
    pub index: u8,
    pub mask: u64,
    pub value: u64,
}

/// The argument tests under which `c` is refused: any one of the returned conjunctions
/// matching refuses the call (a deny list, for a filter that allows by default).
pub fn refused_when(c: &ModeCall) -> Vec<Vec<Masked>> {
    let setid: Vec<Masked> = [0o4000, 0o2000, 0o6000]
        .into_iter()
        .map(|value| Masked {
            index: c.mode,
            mask: u64::from(SETID_BITS),
            value,
        })
        .collect();
    match c.makes {
        Makes::Mode | Makes::Create => setid.into_iter().map(|m| vec![m]).collect(),
        Makes::CreateWith { flags } => CREATE_FLAGS
            .iter()
            .flat_map(|&f| {
                setid.iter().map(move |&m| {
                    vec![
                        Masked {
                            index: flags,
                            mask: f,
                            value: f,
                        },
                        m,
                    ]
                })
            })
            .collect(),
        Makes::Node => setid
            .iter()
            .map(|&m| vec![m])
            .chain(
                // Every type the four type bits can say, but those allowed: the devices.
                (0..16_u32)
                    .map(|t| t << TYPE_BITS.trailing_zeros())
                    .filter(|t| !NODE_TYPES.contains(t))
                    .map(|t| {
                        vec![Masked {
                            index: c.mode,
                            mask: u64::from(TYPE_BITS),
                            value: u64::from(t),
                        }]
                    }),
            )
            .collect(),
    }
}

/// The argument tests under which `c` is allowed: any one of the returned conjunctions
/// matching allows the call (an allow list, for a filter that refuses by default).
pub fn allowed_when(c: &ModeCall) -> Vec<Vec<Masked>> {
    let no_setid = Masked {
        index: c.mode,
        mask: u64::from(SETID_BITS),
        value: 0,
    };
    match c.makes {
        Makes::Mode | Makes::Create => vec![vec![no_setid]],
        Makes::CreateWith { flags } => vec![
            vec![Masked {
                index: flags,
                mask: CREATE_FLAGS.iter().sum(),
                value: 0,
            }],
            vec![no_setid],
        ],
        Makes::Node => NODE_TYPES
            .iter()
            .map(|&t| {
                vec![Masked {
                    index: c.mode,
                    mask: u64::from(TYPE_BITS | SETID_BITS),
                    value: u64::from(t),
                }]
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::shares::{mode_reaches_host, node_reaches_host};

    fn holds(tests: &[Masked], args: &[u64; 6]) -> bool {
        tests
            .iter()
            .all(|m| args[usize::from(m.index)] & m.mask == m.value)
    }

    fn any(rules: &[Vec<Masked>], args: &[u64; 6]) -> bool {
        rules.iter().any(|r| holds(r, args))
    }

    /// Both forms of every call agree with the policy, for every mode and create flag.
    #[test]
    fn the_allow_and_deny_forms_are_the_policy_for_every_call() {
        let modes = [
            0o644, 0o755, 0o1777, 0o4755, 0o2775, 0o6755, 0o100_644, 0o104_755, 0o010_600,
            0o140_755, 0o020_666, 0o060_660, 0o040_755, 0o120_777, 0o030_644,
        ];
        let flags = [0, 0o1, 0o2, 0o100, 0o100 | 0o1000, 0o20_200_000, 0o200_000];
        for c in &MODE_CALLS {
            for &mode in &modes {
                for &f in &flags {
                    let mut args = [0_u64; 6];
                    args[usize::from(c.mode)] = mode;
                    if let Makes::CreateWith { flags } = c.makes {
                        args[usize::from(flags)] = f;
                    }
                    let m = u32::try_from(mode).expect("small");
                    let want = match c.makes {
                        Makes::Mode | Makes::Create => mode_reaches_host(m),
                        Makes::CreateWith { .. } => {
                            f & CREATE_FLAGS.iter().sum::<u64>() == 0 || mode_reaches_host(m)
                        }
                        Makes::Node => node_reaches_host(m),
                    };
                    assert_eq!(
                        any(&allowed_when(c), &args),
                        want,
                        "{} mode {mode:o} flags {f:o}: allow form",
                        c.name
                    );
                    assert_eq!(
                        !any(&refused_when(c), &args),
                        want,
                        "{} mode {mode:o} flags {f:o}: deny form",
                        c.name
                    );
                }
            }
        }
    }
}
