//! Which guest user an exec may run as (`ExecRequest::user`, an OCI spec's `process.user`):
//! ids the guest's id mapping holds (guest ids `0..count`, `runtime::ids::ID_COUNT`, each
//! shifted to a host id of the sandbox's range), so no exec runs as an id outside the sandbox's range, and a bounded list
//! of supplementary groups. Both backends honour it: the container backend through its
//! runtime's exec, the microvm backend through its agent (setgroups, setgid, setuid before
//! the command runs).

use crate::api::ExecUser;

/// The most supplementary groups an exec may ask for.
pub const MAX_ADDITIONAL_GIDS: usize = 64;

/// Why an exec user is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecUserError {
    /// A request that can never be honoured (an id outside the guest's).
    #[error("{0}")]
    Bad(String),
    /// One this sandbox's backend cannot honour.
    #[error("{0}")]
    Unsupported(String),
}

/// Whether `user` may be asked of a sandbox of `backend` whose guest has ids `0..count`; the
/// refusal names what is wrong.
pub fn check(user: &ExecUser, backend: &str, count: u32) -> Result<(), ExecUserError> {
    ids(user, count).map_err(ExecUserError::Bad)?;
    if !user.is_root() && !matches!(backend, "container" | "microvm") {
        return Err(ExecUserError::Unsupported(format!(
            "exec user {}:{}: the {backend} backend runs commands as its guest's root only; \
             use the container or microvm backend, or run as 0:0",
            user.uid, user.gid
        )));
    }
    Ok(())
}

/// The ids of `user` within the guest's (`0..count`).
fn ids(user: &ExecUser, count: u32) -> Result<(), String> {
    let bad = |what: &str, id: u32| {
        format!(
            "exec user: {what} {id} is outside the guest's ids (0-{}): the sandbox's id mapping \
             holds no such id",
            count.saturating_sub(1)
        )
    };
    if user.uid >= count {
        return Err(bad("uid", user.uid));
    }
    if user.gid >= count {
        return Err(bad("gid", user.gid));
    }
    if let Some(g) = user.additional_gids.iter().find(|g| **g >= count) {
        return Err(bad("additional gid", *g));
    }
    if user.additional_gids.len() > MAX_ADDITIONAL_GIDS {
        return Err(format!(
            "exec user: {} additional gids, the limit is {MAX_ADDITIONAL_GIDS}",
            user.additional_gids.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_within_the_guests_ids_are_taken_others_named() {
        let u = |uid, gid, extra: &[u32]| ExecUser {
            uid,
            gid,
            additional_gids: extra.to_vec(),
        };
        let cases: &[(ExecUser, &str, Option<&str>)] = &[
            (u(0, 0, &[]), "container", None),
            (u(1000, 1000, &[4, 27]), "container", None),
            (u(65535, 65535, &[]), "container", None),
            (u(0, 0, &[]), "microvm", None),
            (
                u(65536, 0, &[]),
                "container",
                Some("uid 65536 is outside the guest's ids (0-65535)"),
            ),
            (u(0, 70000, &[]), "container", Some("gid 70000 is outside")),
            (
                u(1, 1, &[1, 99999]),
                "container",
                Some("additional gid 99999"),
            ),
            (
                u(1, 1, &[7; 65]),
                "container",
                Some("65 additional gids, the limit is 64"),
            ),
            (u(1000, 1000, &[4, 27]), "microvm", None),
            (u(0, 0, &[10]), "microvm", None),
            (
                u(65536, 0, &[]),
                "microvm",
                Some("uid 65536 is outside the guest's ids"),
            ),
            (
                u(1000, 1000, &[]),
                "firecracker",
                Some("the firecracker backend runs commands as its guest's root only"),
            ),
            (u(0, 0, &[]), "firecracker", None),
        ];
        for (user, backend, want) in cases {
            match (check(user, backend, 65536), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => {
                    let e = e.to_string();
                    assert!(e.contains(w), "{user:?} {backend}: {e}");
                }
                (got, _) => panic!("{user:?} {backend}: {got:?}"),
            }
        }
    }
}
