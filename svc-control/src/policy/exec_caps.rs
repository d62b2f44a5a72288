//! What an exec may keep of its capabilities and whether it takes `no_new_privs`
//! (`ExecRequest::hardening`: an OCI process's `capabilities` and `noNewPrivileges`, as
//! containerd writes a pod container's `securityContext` into its spec). They only ever
//! narrow: each set granted is what was asked and the sandbox's own processes hold, never more,
//! and the guest lowers its command's sets to them before it runs (`svc_guest::caps`). Names
//! are the OCI spec's (`CAP_CHOWN`); an unknown one is refused, named.

use serde::{Deserialize, Serialize};
use svc_guest::caps::{Caps, Hardening};

/// The most names one capability set may list (there are 41 capabilities).
pub const MAX_NAMES: usize = 64;

/// The hardening an exec asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecHardening {
    /// Keep only these capability sets; none: the sandbox's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<ExecCaps>,
    /// Set `no_new_privs` (no setuid binary or file capability raises the command).
    #[serde(default)]
    pub no_new_privs: bool,
}

/// An OCI process's capability sets, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecCaps {
    #[serde(default)]
    pub bounding: Vec<String>,
    #[serde(default)]
    pub effective: Vec<String>,
    #[serde(default)]
    pub permitted: Vec<String>,
    #[serde(default)]
    pub inheritable: Vec<String>,
    #[serde(default)]
    pub ambient: Vec<String>,
}

/// Why a hardening is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecHardeningError {
    /// A request that can never be honoured (a name no capability has, too many names).
    #[error("{0}")]
    Bad(String),
    /// One this sandbox's backend cannot honour.
    #[error("{0}")]
    Unsupported(String),
}

/// What `asked` is granted in a sandbox of `backend` whose processes hold the capabilities
/// `own` (a mask, `svc_guest::caps::NAMES`' bits): each set asked within `own`.
pub fn grant(
    asked: &ExecHardening,
    backend: &str,
    own: u64,
) -> Result<Hardening, ExecHardeningError> {
    if !matches!(backend, "container" | "microvm") {
        return Err(ExecHardeningError::Unsupported(format!(
            "exec hardening (capabilities, no_new_privs): the {backend} backend does not apply \
             it; use the container or microvm backend"
        )));
    }
    let caps = asked
        .capabilities
        .as_ref()
        .map(|c| masks(c).map(|m| m.within(all(own))))
        .transpose()
        .map_err(ExecHardeningError::Bad)?;
    Ok(Hardening {
        caps,
        no_new_privs: asked.no_new_privs,
    })
}

/// The sets' masks; a set too long or a name unknown, named with its set.
fn masks(c: &ExecCaps) -> Result<Caps, String> {
    let set = |what: &str, names: &[String]| {
        if names.len() > MAX_NAMES {
            return Err(format!(
                "capabilities: {} names in the {what} set, the limit is {MAX_NAMES}",
                names.len()
            ));
        }
        Caps::mask(names).map_err(|e| format!("capabilities: the {what} set: {e}"))
    };
    Ok(Caps {
        bounding: set("bounding", &c.bounding)?,
        effective: set("effective", &c.effective)?,
        permitted: set("permitted", &c.permitted)?,
        inheritable: set("inheritable", &c.inheritable)?,
        ambient: set("ambient", &c.ambient)?,
    })
}

/// `mask` as each of the five sets.
fn all(mask: u64) -> Caps {
    Caps {
        bounding: mask,
        effective: mask,
        permitted: mask,
        inheritable: mask,
        ambient: mask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(names: &[&str]) -> ExecCaps {
        let v: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        ExecCaps {
            bounding: v.clone(),
            effective: v.clone(),
            permitted: v,
            ..ExecCaps::default()
        }
    }

    #[test]
    fn what_is_granted_is_asked_and_held_and_bad_asks_are_named() {
        let own = Caps::mask(&["CAP_CHOWN", "CAP_KILL"]).expect("known");
        let asked = |c: Option<ExecCaps>, nnp| ExecHardening {
            capabilities: c,
            no_new_privs: nnp,
        };
        // What is asked, of which backend: the mask granted and no_new_privs, or the refusal.
        type Case = (
            ExecHardening,
            &'static str,
            Result<(u64, bool), &'static str>,
        );
        let cases: &[Case] = &[
            // drop ALL + allowPrivilegeEscalation false.
            (asked(Some(caps(&[])), true), "container", Ok((0, true))),
            // More than the sandbox holds: only what it holds.
            (
                asked(
                    Some(caps(&["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_MKNOD"])),
                    false,
                ),
                "container",
                Ok((1, false)),
            ),
            (
                asked(Some(caps(&["CAP_KILL"])), false),
                "microvm",
                Ok((1 << 5, false)),
            ),
            (
                asked(Some(caps(&["CAP_NOPE"])), false),
                "container",
                Err("the bounding set: capability \"CAP_NOPE\": no such capability"),
            ),
            (
                asked(Some(caps(&["CAP_CHOWN"; 65])), false),
                "microvm",
                Err("65 names in the bounding set, the limit is 64"),
            ),
            (
                asked(None, true),
                "firecracker",
                Err("the firecracker backend does not apply it"),
            ),
        ];
        for (h, backend, want) in cases {
            match (grant(h, backend, own), want) {
                (Ok(got), Ok((mask, nnp))) => {
                    let c = got.caps.expect("caps");
                    assert_eq!(
                        (c.bounding, c.effective, c.permitted),
                        (*mask, *mask, *mask)
                    );
                    assert_eq!((c.inheritable, c.ambient, got.no_new_privs), (0, 0, *nnp));
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{h:?}: {e}"),
                (got, _) => panic!("{h:?} {backend}: {got:?}"),
            }
        }
        let none = grant(&ExecHardening::default(), "container", own).expect("nothing asked");
        assert!(none.is_empty());
    }
}
