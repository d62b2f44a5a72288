//! Whether a project's perimeter is one its owner approved (`svc workspace trust`).
//!
//! A workspace's project directory is shared read-write with its sandbox, so the guest can
//! rewrite `.svc/config.yaml` and `.svc/workspace.json`. What those files say about the
//! sandbox's perimeter — the egress section, the runtime, the capabilities and the host
//! credentials it is lent — is enforced only once the calling user has approved that exact
//! content, as `direnv allow` and `mise trust` do for shell hooks:
//!
//! - the perimeter is rendered as one canonical text ([`Perimeter::canonical`]): the same
//!   content always gives the same text, whatever the files' comments, spacing or key order
//!   within a host's policy;
//! - its digest is SHA-256 of that text ([`digest`]);
//! - an approval is a digest and the text it was made from, kept per user outside the project;
//! - [`decide`] compares the current text with the approval: the same digest is
//!   [`Decision::Approved`], no approval is [`Decision::Unapproved`], anything else is
//!   [`Decision::Changed`] with a line diff against the approved text.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::config::{
    egress::EgressFile,
    workspace::{Backend, Capability},
};

/// What a project says about its sandbox's perimeter, as a user approves it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Perimeter {
    /// `.svc/config.yaml`'s egress section (hosts, path rules, SSH repositories, secrets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressFile>,
    /// `.svc/workspace.json` `runtime.required`.
    #[serde(default)]
    pub runtime: Vec<Backend>,
    /// `.svc/workspace.json` `capabilities.required`.
    #[serde(default)]
    pub capabilities: Vec<Capability>,
    /// `auth.defaults.sshAgentForward`: git over SSH through the relay as the host's key.
    #[serde(default)]
    pub ssh_agent_forward: bool,
    /// `auth.defaults.gitCredentialMode: host-helper`: the host's git credential on HTTPS.
    #[serde(default)]
    pub git_host_helper: bool,
    /// `auth.defaults.gitConfigWritable`: the guest may write what host git executes.
    #[serde(default)]
    pub git_config_writable: bool,
}

impl Perimeter {
    /// The canonical text: YAML of the fields in their declared order (policy hosts are
    /// already sorted by the validated egress section that built this value).
    pub fn canonical(&self) -> Result<String, TrustError> {
        serde_norway::to_string(self).map_err(|e| TrustError::Render(e.to_string()))
    }
}

/// An approval as stored for one user and one project directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Approval {
    /// [`digest`] of `content`.
    pub digest: String,
    /// The canonical text that was approved.
    pub content: String,
}

impl Approval {
    pub fn of(content: String) -> Self {
        Self {
            digest: digest(&content),
            content,
        }
    }
}

/// Whether the current perimeter may be enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approved,
    /// Never approved by this user: the content to show.
    Unapproved {
        content: String,
    },
    /// Approved once, different now: a line diff (`-` approved, `+` now).
    Changed {
        diff: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error("cannot render the project's perimeter: {0}")]
    Render(String),
    #[error(
        "project {root}: its perimeter is not approved by you (uid {uid}):\n{content}\
         review it, then approve it with `svc workspace trust {root}` (or pass --trust)"
    )]
    Unapproved {
        root: String,
        uid: u32,
        content: String,
    },
    #[error(
        "project {root}: its perimeter changed since you (uid {uid}) approved it (- approved, \
         + now):\n{diff}review the change, then approve it with `svc workspace trust {root}` \
         (or pass --trust)"
    )]
    Changed {
        root: String,
        uid: u32,
        diff: String,
    },
}

impl Decision {
    /// The refusal for `root` and `uid`, or `Ok` when approved.
    pub fn require(self, root: &str, uid: u32) -> Result<(), TrustError> {
        match self {
            Self::Approved => Ok(()),
            Self::Unapproved { content } => Err(TrustError::Unapproved {
                root: root.to_owned(),
                uid,
                content: indent(&content),
            }),
            Self::Changed { diff } => Err(TrustError::Changed {
                root: root.to_owned(),
                uid,
                diff,
            }),
        }
    }
}

/// SHA-256 of `content`, as `sha256:` and lowercase hex.
pub fn digest(content: &str) -> String {
    digest_bytes(content.as_bytes())
}

/// SHA-256 of `bytes`, as `sha256:` and lowercase hex (a hook's content).
pub fn digest_bytes(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = String::from("sha256:");
    for b in d.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Compare the current canonical text with the user's approval, if any.
pub fn decide(approval: Option<&Approval>, current: &str) -> Decision {
    match approval {
        None => Decision::Unapproved {
            content: current.to_owned(),
        },
        Some(a) if a.digest == digest(current) => Decision::Approved,
        Some(a) => Decision::Changed {
            diff: diff(&a.content, current),
        },
    }
}

/// Largest product of line counts the diff works out line by line; beyond it, every old line
/// is shown removed and every new one added.
const MAX_DIFF_CELLS: usize = 1 << 20;

/// A line diff of `old` to `new`: each line prefixed `  `, `- ` or `+ `.
pub fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut out = String::new();
    if a.len().saturating_mul(b.len()) > MAX_DIFF_CELLS {
        for l in &a {
            let _ = writeln!(out, "- {l}");
        }
        for l in &b {
            let _ = writeln!(out, "+ {l}");
        }
        return out;
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    out
}

/// `text` with each line indented, for a message.
fn indent(text: &str) -> String {
    text.lines().fold(String::new(), |mut s, l| {
        let _ = writeln!(s, "    {l}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{UniqueMap, egress::PolicyEntryFile};

    fn perimeter(allow: &[&str], paths: &[&str], repos: &[&str]) -> Perimeter {
        Perimeter {
            egress: Some(EgressFile {
                allow: allow.iter().map(|s| (*s).to_owned()).collect(),
                policy: UniqueMap(
                    [(
                        "github.com".to_owned(),
                        PolicyEntryFile {
                            paths: paths.iter().map(|s| (*s).to_owned()).collect(),
                            repos: repos.iter().map(|s| (*s).to_owned()).collect(),
                        },
                    )]
                    .into_iter()
                    .collect(),
                ),
                secrets: Vec::new(),
                https_push_branches: false,
            }),
            runtime: vec![Backend::CONTAINER],
            capabilities: vec![Capability::CredentialsBroker],
            ssh_agent_forward: false,
            git_host_helper: false,
            git_config_writable: false,
        }
    }

    fn text(p: &Perimeter) -> String {
        p.canonical().expect("a perimeter renders")
    }

    #[test]
    fn approval_cases() {
        let base = perimeter(&["pypi.org"], &["/acme/app/**"], &["acme/app"]);
        let approved = Approval::of(text(&base));
        /// What the decision must be: `None` approved, `Some("")` unapproved, `Some(frag)`
        /// changed with `frag` in the diff.
        struct Case {
            name: &'static str,
            approval: Option<Approval>,
            now: Perimeter,
            want: Option<&'static str>,
        }
        let changed = |name, now, frag| Case {
            name,
            approval: Some(approved.clone()),
            now,
            want: Some(frag),
        };
        let cases = [
            Case {
                name: "same_content_is_approved",
                approval: Some(approved.clone()),
                now: base.clone(),
                want: None,
            },
            Case {
                name: "never_approved",
                approval: None,
                now: base.clone(),
                want: Some(""),
            },
            Case {
                name: "empty_project_never_approved",
                approval: None,
                now: Perimeter::default(),
                want: Some(""),
            },
            changed(
                "guest_adds_an_open_host",
                perimeter(
                    &["pypi.org", "evil.example"],
                    &["/acme/app/**"],
                    &["acme/app"],
                ),
                "+   - evil.example",
            ),
            changed(
                "guest_opens_every_path",
                perimeter(&["pypi.org"], &["/**"], &["acme/app"]),
                "+       - /**",
            ),
            changed(
                "guest_adds_a_repo",
                perimeter(
                    &["pypi.org"],
                    &["/acme/app/**"],
                    &["acme/app", "acme/infra"],
                ),
                "+       - acme/infra",
            ),
            changed(
                "guest_removes_the_egress_section",
                Perimeter {
                    egress: None,
                    ..base.clone()
                },
                "- egress:",
            ),
            changed(
                "guest_asks_for_the_container_backend_instead",
                Perimeter {
                    runtime: vec![Backend::MICROVM, Backend::CONTAINER],
                    ..base.clone()
                },
                "+ - microvm",
            ),
            changed(
                "guest_adds_a_capability",
                Perimeter {
                    capabilities: vec![Capability::CredentialsBroker, Capability::GitSshRelay],
                    ..base.clone()
                },
                "+ - git.ssh-relay",
            ),
            changed(
                "guest_turns_on_the_host_credential_helper",
                Perimeter {
                    git_host_helper: true,
                    ..base.clone()
                },
                "+ gitHostHelper: true",
            ),
            changed(
                "guest_makes_git_config_writable",
                Perimeter {
                    git_config_writable: true,
                    ..base.clone()
                },
                "+ gitConfigWritable: true",
            ),
            changed(
                "guest_turns_on_ssh_agent_forwarding",
                Perimeter {
                    ssh_agent_forward: true,
                    ..base.clone()
                },
                "+ sshAgentForward: true",
            ),
            Case {
                name: "stored_text_that_does_not_match_its_digest_is_not_approval",
                approval: Some(Approval {
                    digest: digest("something else"),
                    content: text(&base),
                }),
                now: base.clone(),
                want: Some("  runtime:"),
            },
        ];
        for c in &cases {
            let got = decide(c.approval.as_ref(), &text(&c.now));
            match (c.want, got) {
                (None, Decision::Approved) => {}
                (Some(""), Decision::Unapproved { content }) => {
                    assert_eq!(content, text(&c.now), "{}", c.name);
                }
                (Some(frag), Decision::Changed { diff }) if !frag.is_empty() => {
                    assert!(diff.contains(frag), "{}: {frag:?} not in\n{diff}", c.name);
                }
                (want, got) => panic!("{}: want {want:?}, got {got:?}", c.name),
            }
        }
    }

    #[test]
    fn the_same_content_renders_the_same_text() {
        let a = perimeter(&["pypi.org"], &["/a/**"], &[]);
        assert_eq!(text(&a), text(&a.clone()));
        assert_eq!(digest(&text(&a)), digest(&text(&a)));
        assert_ne!(
            digest(&text(&a)),
            digest(&text(&perimeter(&["pypi.org."], &["/a/**"], &[])))
        );
        assert!(digest("").starts_with("sha256:e3b0c442"));
    }

    #[test]
    fn refusals_name_the_approving_command() {
        let base = perimeter(&["pypi.org"], &["/**"], &[]);
        let e = decide(None, &text(&base))
            .require("/home/dev/app", 1000)
            .expect_err("unapproved");
        let msg = e.to_string();
        assert!(msg.contains("svc workspace trust /home/dev/app"), "{msg}");
        assert!(msg.contains("    egress:"), "{msg}");
        let e = decide(Some(&Approval::of("runtime: []\n".into())), &text(&base))
            .require("/home/dev/app", 1000)
            .expect_err("changed");
        assert!(e.to_string().contains("- runtime: []"), "{e}");
    }

    #[test]
    fn diff_of_huge_texts_stays_bounded() {
        let old: String = (0..3000).map(|i| format!("a{i}\n")).collect();
        let new: String = (0..3000).map(|i| format!("b{i}\n")).collect();
        let d = diff(&old, &new);
        assert_eq!(d.lines().count(), 6000);
        assert_eq!(diff("x\ny\n", "x\nz\n"), "  x\n- y\n+ z\n");
    }
}
