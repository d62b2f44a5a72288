//! Who may act on what through svcd's API: sandboxes (and so workspaces) and stored secrets
//! belong to the uid that created them; root acts on all.
//!
//! The rules, as people know them from files:
//!
//! - A sandbox is its owner's alone: a non-root caller may show, explain requests against, exec
//!   in, fork, pause, resume, change (`allow`), read the workspace log of and destroy only its
//!   own sandboxes, sees only those in `list`, and reads only their events and audit records.
//!   Root acts on every one.
//! - A stored secret is its owner's: only the owner (or root) may rotate, remove, share or
//!   unshare it, or allow pods of a Kubernetes namespace to name it (`policy::pod_secrets`). The owner may share it with one unix group (`svc secret share NAME --group G`,
//!   like a file's group read bit): a caller in that group may then bind it into its own
//!   sandboxes (`--secret VAR@store:NAME`), but never change it.
//! - A secret a caller may not see (not its own, not shared with a group it is in) is answered
//!   as a missing one, whatever the caller asks of it: its owner is not named. Secret names are
//!   one namespace for the host, so the one thing another user learns is that a name is taken,
//!   when it tries to store a secret under it.
//! - Events and audit records: a non-root caller reads only those of its own sandboxes,
//!   secrets and approvals; one that belongs to nobody known is root's.
//! - A fork is a copy of its source: only the source's owner (or root) may make one, and the
//!   clones belong to the source's owner.
//! - The host's own credentials are the operator's: the code-host token `--repo` brokers
//!   (`credentials.code_host_token_file`, or root's code-host CLI login) goes only into root's
//!   sandboxes and those of members of `credentials.code_host_token_group`; the coding agent's
//!   home (`credentials.agent_home`) is shared only into sandboxes its directory's owner (or
//!   root) creates — another member's sandbox is made without it.
//!
//! Everything here is pure: the daemon reads the caller's uid and groups from the API socket's
//! peer credentials and the owners from its store, then asks.

/// Who is calling: the peer's uid and every group it is in (primary and supplementary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub uid: u32,
    pub groups: Vec<u32>,
}

impl Principal {
    /// Root: acts on everything.
    pub const ROOT: Self = Self {
        uid: 0,
        groups: Vec::new(),
    };

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// A uid and, where the host knows it, its user name (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub name: Option<String>,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(n) => write!(f, "uid {} ({n})", self.uid),
            None => write!(f, "uid {}", self.uid),
        }
    }
}

/// What a caller does to a sandbox (the verb a refusal names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxAction {
    Show,
    /// `svc egress explain --sandbox`: a read of its live policy.
    Explain,
    Exec,
    Destroy,
    Fork,
    Pause,
    Resume,
    Allow,
    WorkspaceLog,
    /// Attach a pod container's root file system into it.
    AttachRoot,
    /// Detach a pod container's root file system from it.
    DetachRoot,
    /// Any other per-sandbox route: refused to non-owners like the rest.
    Other,
}

impl SandboxAction {
    fn verb(self) -> &'static str {
        match self {
            Self::Show => "show it",
            Self::Explain => "explain requests against its policy",
            Self::Exec => "exec in it",
            Self::Destroy => "destroy it",
            Self::Fork => "fork it",
            Self::Pause => "pause it",
            Self::Resume => "resume it",
            Self::Allow => "change its allowlist",
            Self::WorkspaceLog => "read its workspace log",
            Self::AttachRoot => "attach a container's root file system to it",
            Self::DetachRoot => "detach a container's root file system from it",
            Self::Other => "act on it",
        }
    }
}

/// What a caller does with a stored secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretAction {
    /// `--secret VAR@store:NAME` at creation: its value goes into the caller's sandbox.
    Use,
    Rotate,
    Remove,
    Share,
    /// `svc secret allow|disallow NAME --pod-namespace NS`: which pods may name it.
    PodNamespaces,
    /// Any other per-secret route: its owner's (or root's) like the rest.
    Other,
}

/// A stored secret's owner and the group it is shared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretAccess {
    pub owner: Owner,
    /// The group (gid, name) whose members may use it, if shared.
    pub shared_with: Option<(u32, Option<String>)>,
}

/// Why a caller may not do what it asked; each message names the thing, its owner and what
/// would be needed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    #[error("sandbox {sandbox:?} belongs to {owner}; only its owner or root may {verb}")]
    Sandbox {
        sandbox: String,
        owner: Owner,
        verb: &'static str,
    },
    /// Exactly what a missing secret's answer says (see [`SecretHidden`](Self::SecretHidden)).
    #[error("no secret named {secret:?} (svc secret list shows them)")]
    SecretHidden { secret: String },
    #[error(
        "the secret name {secret:?} is taken (secret names are one namespace for every user of \
         this host; svc secret list shows yours): choose another name"
    )]
    SecretNameTaken { secret: String },
    #[error("secret {secret:?} belongs to {owner}; only its owner or root may {verb} it")]
    SecretNotYours {
        secret: String,
        owner: Owner,
        verb: &'static str,
    },
    #[error(
        "--repo needs CODE_HOST_TOKEN, and the host's code-host token is the operator's: uid \
         {caller} {}; give your own token: --secret CODE_HOST_TOKEN@store:NAME (svc secret set \
         NAME), @env:VAR or @file:PATH",
        match group {
            Some(g) => format!("is not in credentials.code_host_token_group ({g})"),
            None => "may not use it (root may; credentials.code_host_token_group lets a group)".to_owned(),
        }
    )]
    HostCodeToken { caller: u32, group: Option<String> },
    #[error(
        "pod annotation svc.dev/repo needs CODE_HOST_TOKEN, and a pod never gets the node's own \
         code-host token (every pod author on the node could use it); name a stored one allowed \
         for namespace {namespace}: svc.dev/secrets: CODE_HOST_TOKEN=NAME (on the node: svc \
         secret set NAME --pod-namespace {namespace})"
    )]
    HostCodeTokenForPod { namespace: String },
}

/// Whether `who` may do `action` to the sandbox `name` owned by `owner`.
pub fn sandbox(
    who: &Principal,
    name: &str,
    owner: &Owner,
    action: SandboxAction,
) -> Result<(), OwnershipError> {
    if who.is_root() || who.uid == owner.uid {
        return Ok(());
    }
    Err(OwnershipError::Sandbox {
        sandbox: name.to_owned(),
        owner: owner.clone(),
        verb: action.verb(),
    })
}

/// Whether `who` sees a sandbox (or an event or record about one, a secret or an approval)
/// owned by `owner_uid` in lists, events and audit reads. A record whose owner is not known —
/// about a sandbox or not — is root's to read.
pub fn sees(who: &Principal, owner_uid: Option<u32>) -> bool {
    who.is_root() || owner_uid == Some(who.uid)
}

/// Whether `who` may do `action` with the stored secret `name`.
pub fn secret(
    who: &Principal,
    name: &str,
    access: &SecretAccess,
    action: SecretAction,
) -> Result<(), OwnershipError> {
    if who.is_root() || who.uid == access.owner.uid {
        return Ok(());
    }
    if !sees_secret(who, access) {
        return Err(OwnershipError::SecretHidden {
            secret: name.to_owned(),
        });
    }
    let verb = match action {
        // Seen and not its own: shared with a group it is in.
        SecretAction::Use => return Ok(()),
        SecretAction::Rotate => "rotate",
        SecretAction::Remove => "remove",
        SecretAction::Share => "share or unshare",
        SecretAction::PodNamespaces => "allow or disallow pod namespaces for",
        SecretAction::Other => "act on",
    };
    Err(OwnershipError::SecretNotYours {
        secret: name.to_owned(),
        owner: access.owner.clone(),
        verb,
    })
}

/// Whether `who` may store a new secret under `name`, held already by `existing` if any. A name
/// held by a secret the caller cannot see is refused without naming its owner; one it sees is
/// left to the store (which says it exists: rotate it instead).
pub fn secret_name(
    who: &Principal,
    name: &str,
    existing: Option<&SecretAccess>,
) -> Result<(), OwnershipError> {
    match existing {
        Some(access) if !sees_secret(who, access) => Err(OwnershipError::SecretNameTaken {
            secret: name.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Whether `who` sees the stored secret in `svc secret list`: its owner, a member of the group
/// it is shared with (who may use it), root.
pub fn sees_secret(who: &Principal, access: &SecretAccess) -> bool {
    who.is_root()
        || who.uid == access.owner.uid
        || access
            .shared_with
            .as_ref()
            .is_some_and(|(gid, _)| who.groups.contains(gid))
}

/// The host's code-host token (`credentials.code_host_token_file` or root's code-host CLI
/// login), brokered by `--repo`: root's, and usable by members of `group` (gid, name) when the
/// operator names one (`credentials.code_host_token_group`). Never a pod's (`pod_namespace`:
/// the request's pod identity): the shim asks as root for every pod author on the node.
pub fn host_code_token(
    who: &Principal,
    group: Option<&(u32, String)>,
    pod_namespace: Option<&str>,
) -> Result<(), OwnershipError> {
    if let Some(namespace) = pod_namespace {
        return Err(OwnershipError::HostCodeTokenForPod {
            namespace: namespace.to_owned(),
        });
    }
    if who.is_root() || group.is_some_and(|(gid, _)| who.groups.contains(gid)) {
        return Ok(());
    }
    Err(OwnershipError::HostCodeToken {
        caller: who.uid,
        group: group.map(|(_, name)| name.clone()),
    })
}

/// Whether the coding agent's home, owned by `dir_owner` on the host, is shared into a sandbox
/// `who` creates: its owner's and root's, nobody else's (another member would read and write
/// the owner's agent state and credentials).
pub fn shares_agent_home(who: &Principal, dir_owner: u32) -> bool {
    who.is_root() || who.uid == dir_owner
}

/// Whether `who` may have svcd (root) listen on the host's `local_port` for a Spotlight
/// forward: root on any, a member only on ports it could bind itself (at or above the host's
/// `net.ipv4.ip_unprivileged_port_start`, `unprivileged_start`).
pub fn spotlight_port(
    who: &Principal,
    local_port: u16,
    unprivileged_start: u32,
) -> Result<(), String> {
    if who.is_root() || u32::from(local_port) >= unprivileged_start {
        return Ok(());
    }
    Err(format!(
        "spotlight: local port {local_port} is privileged on this host (below \
         net.ipv4.ip_unprivileged_port_start = {unprivileged_start}): only root's workspaces may \
         forward it; change its localPort in spotlight.defaults"
    ))
}

/// Whether `who` may be told which process holds a host port: root, or the holder's own user
/// (another user's process names and pids are not a member's to learn).
pub fn sees_port_holder(who: &Principal, holder_uid: u32) -> bool {
    who.is_root() || who.uid == holder_uid
}

/// Whether `who` may say which Kubernetes pod a sandbox is (`pod` in the creation request,
/// `NAMESPACE/NAME`): root only — the node's containerd shim, which reads it from containerd's
/// own annotations. A member naming a pod would put its sandbox's records under that pod's
/// name in the audit log and the metrics, where an operator filtering by pod reads them as
/// the pod's.
pub fn names_a_pod(who: &Principal, pod: &str) -> Result<(), String> {
    if who.is_root() {
        return Ok(());
    }
    Err(format!(
        "pod {pod}: only root (the node's containerd shim) may say which Kubernetes pod a \
         sandbox is; create the sandbox without `pod`"
    ))
}

/// The owner of a fork's clones: its source's (only the source's owner or root may fork).
pub fn fork_owner(source_owner: u32) -> u32 {
    source_owner
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: u32 = 1001;
    const BOB: u32 = 1002;
    const DEVS: u32 = 2001;

    fn who(uid: u32, groups: &[u32]) -> Principal {
        Principal {
            uid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn only_root_says_which_pod_a_sandbox_is() {
        assert_eq!(names_a_pod(&who(0, &[]), "kube-system/coredns-0"), Ok(()));
        for member in [who(ALICE, &[DEVS]), who(BOB, &[])] {
            let e = names_a_pod(&member, "kube-system/coredns-0").expect_err("a member");
            assert!(
                e.contains("pod kube-system/coredns-0") && e.contains("only root"),
                "{e}"
            );
        }
    }

    fn owner(uid: u32) -> Owner {
        Owner {
            uid,
            name: Some(if uid == ALICE { "alice" } else { "bob" }.to_owned()),
        }
    }

    fn access(uid: u32, shared: Option<u32>) -> SecretAccess {
        SecretAccess {
            owner: owner(uid),
            shared_with: shared.map(|g| (g, Some("devs".to_owned()))),
        }
    }

    /// (case, caller uid, caller groups, token group, the request's pod namespace, allowed)
    type HostTokenCase = (
        &'static str,
        u32,
        &'static [u32],
        Option<u32>,
        Option<&'static str>,
        bool,
    );
    const HOST_TOKEN_CASES: &[HostTokenCase] = &[
        ("root_uses_it", 0, &[], None, None, true),
        (
            "root_uses_it_with_a_group_set",
            0,
            &[],
            Some(DEVS),
            None,
            true,
        ),
        (
            "member_without_a_group_set_may_not",
            BOB,
            &[],
            None,
            None,
            false,
        ),
        (
            "member_outside_the_group_may_not",
            BOB,
            &[],
            Some(DEVS),
            None,
            false,
        ),
        (
            "member_of_the_group_may",
            ALICE,
            &[DEVS],
            Some(DEVS),
            None,
            true,
        ),
        (
            "member_of_another_group_may_not",
            BOB,
            &[DEVS + 1],
            Some(DEVS),
            None,
            false,
        ),
        // The shim asks as root for any pod author on the node.
        (
            "root_for_a_pod_may_not",
            0,
            &[],
            None,
            Some("team-a"),
            false,
        ),
        (
            "group_member_for_a_pod_may_not",
            ALICE,
            &[DEVS],
            Some(DEVS),
            Some("team-a"),
            false,
        ),
    ];

    #[test]
    fn host_code_token_table() {
        for (case, uid, groups, group, pod, allowed) in HOST_TOKEN_CASES {
            let g = group.map(|gid| (gid, "devs".to_owned()));
            let got = host_code_token(&who(*uid, groups), g.as_ref(), *pod);
            assert_eq!(got.is_ok(), *allowed, "{case}: {got:?}");
            if let Err(e) = got {
                let text = e.to_string();
                let named = match pod {
                    Some(ns) => {
                        text.contains("CODE_HOST_TOKEN=NAME")
                            && text.contains(&format!("--pod-namespace {ns}"))
                    }
                    None => {
                        text.contains("--secret CODE_HOST_TOKEN@store:NAME")
                            && text.contains(&format!("uid {uid}"))
                    }
                };
                assert!(named, "{case}: the refusal names the way out: {text}");
            }
        }
    }

    #[test]
    fn spotlight_port_table() {
        // (case, caller, local port, unprivileged start, allowed)
        let cases: &[(&str, u32, u16, u32, bool)] = &[
            ("member_unprivileged_port", BOB, 18080, 1024, true),
            ("member_first_unprivileged_port", BOB, 1024, 1024, true),
            ("member_privileged_port", BOB, 81, 1024, false),
            ("member_port_1023", BOB, 1023, 1024, false),
            ("root_privileged_port", 0, 81, 1024, true),
            ("host_lets_everyone_bind_80", BOB, 80, 80, true),
            ("host_start_0_allows_all", BOB, 1, 0, true),
        ];
        for (case, caller, port, start, allowed) in cases {
            let got = spotlight_port(&who(*caller, &[]), *port, *start);
            assert_eq!(got.is_ok(), *allowed, "{case}: {got:?}");
        }
        let refused = spotlight_port(&who(BOB, &[]), 81, 1024).unwrap_err();
        assert!(refused.contains("local port 81 is privileged"), "{refused}");
    }

    #[test]
    fn port_holder_table() {
        for (case, caller, holder, sees) in [
            ("own_process", BOB, BOB, true),
            ("another_users_process", BOB, ALICE, false),
            ("root_sees_all", 0, ALICE, true),
        ] {
            assert_eq!(sees_port_holder(&who(caller, &[]), holder), sees, "{case}");
        }
    }

    #[test]
    fn agent_home_table() {
        // (case, caller, directory owner, shared)
        let cases: &[(&str, u32, u32, bool)] = &[
            ("owner_gets_it", ALICE, ALICE, true),
            ("root_gets_it", 0, ALICE, true),
            ("another_member_does_not", BOB, ALICE, false),
            ("member_does_not_get_roots", BOB, 0, false),
        ];
        for (case, caller, dir_owner, shared) in cases {
            assert_eq!(
                shares_agent_home(&who(*caller, &[]), *dir_owner),
                *shared,
                "{case}"
            );
        }
    }

    const ALL_ACTIONS: [SandboxAction; 9] = [
        SandboxAction::Show,
        SandboxAction::Exec,
        SandboxAction::Destroy,
        SandboxAction::Fork,
        SandboxAction::Pause,
        SandboxAction::Resume,
        SandboxAction::Allow,
        SandboxAction::WorkspaceLog,
        SandboxAction::Other,
    ];

    /// (case, caller, sandbox owner, allowed)
    const SANDBOX_CASES: &[(&str, u32, u32, bool)] = &[
        ("root_acts_on_all", 0, ALICE, true),
        ("root_acts_on_its_own", 0, 0, true),
        ("owner_acts_on_its_own", ALICE, ALICE, true),
        ("member_cannot_act_on_anothers_sandbox", BOB, ALICE, false),
        ("member_cannot_act_on_roots_sandbox", BOB, 0, false),
    ];

    #[test]
    fn sandbox_table() {
        for (case, caller, own, allowed) in SANDBOX_CASES {
            for action in ALL_ACTIONS {
                let r = sandbox(&who(*caller, &[DEVS]), "dev", &owner(*own), action);
                assert_eq!(r.is_ok(), *allowed, "{case} {action:?}: {r:?}");
            }
        }
    }

    #[test]
    fn member_cannot_exec_in_anothers_sandbox() {
        let e = sandbox(&who(BOB, &[]), "dev", &owner(ALICE), SandboxAction::Exec).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sandbox \"dev\" belongs to uid 1001 (alice); only its owner or root may exec in it"
        );
    }

    #[test]
    fn an_owner_without_a_name_is_named_by_uid() {
        let o = Owner {
            uid: 4242,
            name: None,
        };
        let e = sandbox(&who(BOB, &[]), "x", &o, SandboxAction::Destroy).unwrap_err();
        assert!(e.to_string().contains("belongs to uid 4242;"), "{e}");
    }

    /// (case, caller, its groups, secret owner, shared with, action, allowed)
    #[expect(clippy::type_complexity, reason = "a table of named cases")]
    const SECRET_CASES: &[(&str, u32, &[u32], u32, Option<u32>, SecretAction, bool)] = &[
        (
            "root_uses_all",
            0,
            &[],
            ALICE,
            None,
            SecretAction::Use,
            true,
        ),
        (
            "root_rotates_all",
            0,
            &[],
            ALICE,
            None,
            SecretAction::Rotate,
            true,
        ),
        (
            "owner_uses_its_own",
            ALICE,
            &[],
            ALICE,
            None,
            SecretAction::Use,
            true,
        ),
        (
            "owner_shares_its_own",
            ALICE,
            &[],
            ALICE,
            None,
            SecretAction::Share,
            true,
        ),
        (
            "unshared_secret_unusable_by_member",
            BOB,
            &[DEVS],
            ALICE,
            None,
            SecretAction::Use,
            false,
        ),
        (
            "shared_secret_usable_by_group_member",
            BOB,
            &[DEVS],
            ALICE,
            Some(DEVS),
            SecretAction::Use,
            true,
        ),
        (
            "shared_secret_unusable_outside_the_group",
            BOB,
            &[3000],
            ALICE,
            Some(DEVS),
            SecretAction::Use,
            false,
        ),
        (
            "shared_secret_not_rotatable_by_group_member",
            BOB,
            &[DEVS],
            ALICE,
            Some(DEVS),
            SecretAction::Rotate,
            false,
        ),
        (
            "shared_secret_not_removable_by_group_member",
            BOB,
            &[DEVS],
            ALICE,
            Some(DEVS),
            SecretAction::Remove,
            false,
        ),
        (
            "shared_secret_not_reshared_by_group_member",
            BOB,
            &[DEVS],
            ALICE,
            Some(DEVS),
            SecretAction::Share,
            false,
        ),
        (
            "shared_secret_not_allowed_for_pods_by_group_member",
            BOB,
            &[DEVS],
            ALICE,
            Some(DEVS),
            SecretAction::PodNamespaces,
            false,
        ),
        (
            "owner_allows_pods_to_name_its_secret",
            ALICE,
            &[],
            ALICE,
            None,
            SecretAction::PodNamespaces,
            true,
        ),
        (
            "member_cannot_use_roots_secret",
            BOB,
            &[DEVS],
            0,
            None,
            SecretAction::Use,
            false,
        ),
    ];

    #[test]
    fn secret_table() {
        for (case, caller, groups, own, shared, action, allowed) in SECRET_CASES {
            let r = secret(&who(*caller, groups), "gh", &access(*own, *shared), *action);
            assert_eq!(r.is_ok(), *allowed, "{case}: {r:?}");
        }
    }

    #[test]
    fn a_secret_the_caller_cannot_see_is_answered_as_a_missing_one() {
        for action in [
            SecretAction::Use,
            SecretAction::Rotate,
            SecretAction::Remove,
            SecretAction::Share,
            SecretAction::PodNamespaces,
        ] {
            let e = secret(&who(BOB, &[DEVS]), "gh", &access(ALICE, None), action)
                .unwrap_err()
                .to_string();
            assert_eq!(
                e, "no secret named \"gh\" (svc secret list shows them)",
                "{action:?}"
            );
        }
        // One it sees (shared with its group) and may not change names its owner.
        let e = secret(
            &who(BOB, &[DEVS]),
            "gh",
            &access(ALICE, Some(DEVS)),
            SecretAction::Rotate,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("belongs to uid 1001 (alice)"), "{e}");
    }

    #[test]
    fn a_name_held_by_a_hidden_secret_is_taken_without_its_owner() {
        let e = secret_name(&who(BOB, &[]), "gh", Some(&access(ALICE, None)))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("the secret name \"gh\" is taken"), "{e}");
        assert!(!e.contains("alice") && !e.contains("1001"), "{e}");
        assert!(secret_name(&who(BOB, &[]), "gh", None).is_ok());
        assert!(secret_name(&who(ALICE, &[]), "gh", Some(&access(ALICE, None))).is_ok());
        assert!(secret_name(&who(BOB, &[DEVS]), "gh", Some(&access(ALICE, Some(DEVS)))).is_ok());
        assert!(secret_name(&Principal::ROOT, "gh", Some(&access(ALICE, None))).is_ok());
    }

    /// (case, caller, owner uid, seen)
    const SEES_CASES: &[(&str, u32, Option<u32>, bool)] = &[
        ("root_sees_all", 0, Some(ALICE), true),
        ("root_sees_unowned_records", 0, None, true),
        ("owner_sees_its_own", ALICE, Some(ALICE), true),
        ("member_does_not_see_anothers", BOB, Some(ALICE), false),
        ("member_does_not_see_roots", BOB, Some(0), false),
        ("member_does_not_see_unowned_records", BOB, None, false),
    ];

    #[test]
    fn sees_table() {
        for (case, caller, own, seen) in SEES_CASES {
            assert_eq!(sees(&who(*caller, &[]), *own), *seen, "{case}");
        }
    }

    #[test]
    fn secret_list_shows_owned_and_shared_only() {
        assert!(sees_secret(&who(ALICE, &[]), &access(ALICE, None)));
        assert!(!sees_secret(&who(BOB, &[DEVS]), &access(ALICE, None)));
        assert!(sees_secret(&who(BOB, &[DEVS]), &access(ALICE, Some(DEVS))));
        assert!(sees_secret(&Principal::ROOT, &access(ALICE, None)));
    }

    #[test]
    fn a_fork_belongs_to_its_sources_owner() {
        assert_eq!(fork_owner(ALICE), ALICE);
    }
}
