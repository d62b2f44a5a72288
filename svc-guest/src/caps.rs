//! A command's capability sets and `no_new_privs`, as an OCI process asks for them
//! (`process.capabilities`, `process.noNewPrivileges`): what a pod container's spec asks is
//! all it keeps. [`Hardening::apply`] only ever lowers: a set becomes what was asked and the
//! process held, never more; the bounding set loses every capability not asked, the ambient
//! set every one not asked, and `no_new_privs` is set when asked.

use rustix::thread::{CapabilitySet, CapabilitySets};
use serde::{Deserialize, Serialize};

/// The capabilities' names by number (`CAP_CHOWN` is 0), as the OCI spec writes them.
pub const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The capability sets a command keeps, each a mask of bits numbered as [`NAMES`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    pub bounding: u64,
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
    pub ambient: u64,
}

impl Caps {
    /// The mask of `names` (each one of [`NAMES`]); an unknown name, named.
    pub fn mask<S: AsRef<str>>(names: &[S]) -> Result<u64, String> {
        names.iter().try_fold(0u64, |mask, name| {
            let name = name.as_ref();
            NAMES
                .iter()
                .position(|n| *n == name)
                .map(|bit| mask | (1 << bit))
                .ok_or_else(|| {
                    let shown: String = name.chars().take(64).collect();
                    format!("capability {shown:?}: no such capability (CAP_CHOWN … CAP_CHECKPOINT_RESTORE)")
                })
        })
    }

    /// The names of the capabilities in `mask`, in number order.
    pub fn names(mask: u64) -> Vec<&'static str> {
        (0..NAMES.len())
            .filter(|bit| mask & (1 << bit) != 0)
            .map(|bit| NAMES[bit])
            .collect()
    }

    /// Each set within `held`'s same set: what is asked and held.
    pub fn within(self, held: Self) -> Self {
        Self {
            bounding: self.bounding & held.bounding,
            effective: self.effective & held.effective,
            permitted: self.permitted & held.permitted,
            inheritable: self.inheritable & held.inheritable,
            ambient: self.ambient & held.ambient,
        }
    }
}

/// What a command is hardened with before it runs: its capability sets (none: it keeps its
/// parent's) and `no_new_privs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hardening {
    pub caps: Option<Caps>,
    pub no_new_privs: bool,
}

impl Hardening {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.caps.is_none() && !self.no_new_privs
    }

    /// As one argument of `svc-init --enter`: `-` (nothing), else `nnp` and
    /// `caps=B:E:P:I:A` (the sets' masks in hexadecimal), joined by `,`.
    pub fn to_arg(&self) -> String {
        let mut parts = Vec::new();
        if let Some(c) = &self.caps {
            parts.push(format!(
                "caps={:x}:{:x}:{:x}:{:x}:{:x}",
                c.bounding, c.effective, c.permitted, c.inheritable, c.ambient
            ));
        }
        if self.no_new_privs {
            parts.push("nnp".to_owned());
        }
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join(",")
        }
    }

    /// [`Self::to_arg`]'s argument read back; what is wrong with it, named.
    pub fn from_arg(arg: &str) -> Result<Self, String> {
        let mut h = Self::default();
        if arg == "-" {
            return Ok(h);
        }
        let bad =
            || format!("hardening {arg:?}: expected -, or nnp and caps=B:E:P:I:A joined by ,");
        for part in arg.split(',') {
            if part == "nnp" {
                h.no_new_privs = true;
                continue;
            }
            let masks = part.strip_prefix("caps=").ok_or_else(bad)?;
            let m: Vec<u64> = masks
                .split(':')
                .map(|m| u64::from_str_radix(m, 16).map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            let [bounding, effective, permitted, inheritable, ambient] = m[..] else {
                return Err(bad());
            };
            h.caps = Some(Caps {
                bounding,
                effective,
                permitted,
                inheritable,
                ambient,
            });
        }
        Ok(h)
    }

    /// The part done while the process still has its parent's ids and capabilities: the
    /// bounding set loses every capability not asked, the ambient set is emptied. Only
    /// system calls: safe between fork and exec.
    pub fn before_ids(&self) -> std::io::Result<()> {
        let Some(caps) = &self.caps else {
            return Ok(());
        };
        for bit in 0..NAMES.len() {
            let cap = CapabilitySet::from_bits_retain(1 << bit);
            if caps.bounding & (1 << bit) == 0
                && rustix::thread::capability_is_in_bounding_set(cap)?
            {
                rustix::thread::remove_capability_from_bounding_set(cap)?;
            }
        }
        rustix::thread::clear_ambient_capability_set()?;
        Ok(())
    }

    /// The part done once the process has its user: its effective, permitted and inheritable
    /// sets become what was asked and held, the ambient set gets what was asked of it and the
    /// others allow, then `no_new_privs`. Only system calls: safe between fork and exec.
    pub fn after_ids(&self) -> std::io::Result<()> {
        if let Some(caps) = &self.caps {
            let held = rustix::thread::capabilities(None)?;
            let permitted = caps.permitted & held.permitted.bits();
            let inheritable = caps.inheritable & held.inheritable.bits();
            let sets = CapabilitySets {
                effective: CapabilitySet::from_bits_retain(
                    caps.effective & held.effective.bits() & permitted,
                ),
                permitted: CapabilitySet::from_bits_retain(permitted),
                inheritable: CapabilitySet::from_bits_retain(inheritable),
            };
            rustix::thread::set_capabilities(None, sets)?;
            let ambient = caps.ambient & permitted & inheritable;
            for bit in (0..NAMES.len()).filter(|b| ambient & (1 << b) != 0) {
                let cap = CapabilitySet::from_bits_retain(1 << bit);
                rustix::thread::configure_capability_in_ambient_set(cap, true)?;
            }
        }
        if self.no_new_privs {
            rustix::thread::set_no_new_privs(true)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_taken_both_ways_and_an_unknown_one_is_named() {
        let mask =
            Caps::mask(&["CAP_CHOWN", "CAP_MKNOD", "CAP_CHECKPOINT_RESTORE"]).expect("known");
        assert_eq!(mask, 1 | (1 << 27) | (1 << 40));
        assert_eq!(
            Caps::names(mask),
            ["CAP_CHOWN", "CAP_MKNOD", "CAP_CHECKPOINT_RESTORE"]
        );
        assert_eq!(Caps::mask::<&str>(&[]), Ok(0));
        for bad in ["CHOWN", "cap_chown", "CAP_NOPE", ""] {
            let e = Caps::mask(&[bad]).expect_err(bad);
            assert!(e.contains("no such capability"), "{bad}: {e}");
        }
        // The kernel's numbering (rustix's `CapabilitySet` has every bit of 64, named or not).
        assert_eq!(
            (
                CapabilitySet::MKNOD.bits(),
                CapabilitySet::CHECKPOINT_RESTORE.bits()
            ),
            (1 << 27, 1 << (NAMES.len() - 1))
        );
    }

    #[test]
    fn the_enter_argument_round_trips_and_a_bad_one_is_named() {
        let caps = Caps {
            bounding: 1,
            effective: 2,
            permitted: 3,
            inheritable: 0,
            ambient: 0,
        };
        for h in [
            Hardening::default(),
            Hardening {
                caps: Some(caps),
                no_new_privs: true,
            },
            Hardening {
                caps: None,
                no_new_privs: true,
            },
            Hardening {
                caps: Some(Caps::default()),
                no_new_privs: false,
            },
        ] {
            assert_eq!(Hardening::from_arg(&h.to_arg()), Ok(h), "{}", h.to_arg());
        }
        for bad in [
            "",
            "x",
            "caps=1:2",
            "caps=1:2:3:4:5:6",
            "caps=g:0:0:0:0",
            "nnp,",
        ] {
            let e = Hardening::from_arg(bad).expect_err(bad);
            assert!(e.starts_with("hardening "), "{bad}: {e}");
        }
    }

    #[test]
    fn within_never_adds() {
        let asked = Caps {
            bounding: 0b1111,
            effective: 0b1,
            permitted: 0b11,
            inheritable: 0,
            ambient: 0b100,
        };
        let held = Caps {
            bounding: 0b0101,
            effective: 0b11,
            permitted: 0b10,
            inheritable: 0b1,
            ambient: 0,
        };
        let got = asked.within(held);
        assert_eq!(
            (got.bounding, got.effective, got.permitted),
            (0b101, 0b1, 0b10)
        );
        assert_eq!((got.inheritable, got.ambient), (0, 0));
    }
}
