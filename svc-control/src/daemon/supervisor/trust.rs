//! The approvals of projects' perimeters (`svc workspace trust`), one per API caller and
//! project directory, kept in svcd's state directory (root's, never inside a project: see
//! `policy::project`), so neither a guest nor another API user can write them.
//!
//! `<state>/trust/<uid>/<sha256 of the project path>.json` holds the approved canonical text
//! and its digest; `policy::trust` decides.

use std::{
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::PathBuf,
};

use serde::{Deserialize, Serialize};
use tracing::info;

use super::{Failure, Supervisor};
use crate::{
    api::{CreateSandbox, ProjectPerimeter, TrustCheck, TrustRequest},
    audit::rfc3339,
    policy::trust::{self, Approval, Decision, Perimeter},
};

/// One stored approval.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    root: String,
    #[serde(flatten)]
    approval: Approval,
    approved_at: String,
}

impl Supervisor {
    /// `POST /v1/trust/check`: whether `caller` approved the project's perimeter as it is now.
    pub fn trust_check(
        &self,
        req: &TrustRequest,
        caller: Option<u32>,
    ) -> Result<TrustCheck, Failure> {
        let uid = self.trust_caller(&req.root, caller)?;
        let content = canonical(&req.perimeter)?;
        let stored = self.approval(uid, &req.root)?;
        let decision = trust::decide(stored.as_ref().map(|s| &s.approval), &content);
        Ok(view(&req.root, uid, content, &decision, stored.as_ref()))
    }

    /// `POST /v1/trust`: record `caller`'s approval of the project's perimeter as it is now.
    pub fn trust_record(
        &self,
        req: &TrustRequest,
        caller: Option<u32>,
    ) -> Result<TrustCheck, Failure> {
        let uid = self.trust_caller(&req.root, caller)?;
        let content = canonical(&req.perimeter)?;
        let stored = self.store_approval(uid, &req.root, content.clone())?;
        Ok(view(
            &req.root,
            uid,
            content,
            &Decision::Approved,
            Some(&stored),
        ))
    }

    /// At creation: the parts of `req` read from a project are what its `project` says, and
    /// the caller approved that (or approves it now with `trust`).
    pub(super) fn check_project_trust(
        &self,
        req: &CreateSandbox,
        caller: Option<u32>,
    ) -> Result<(), Failure> {
        let Some(project) = &req.project else {
            if req.workspace.is_some() {
                return Err(Failure::bad(
                    "a workspace needs its project's perimeter (`project`) to check its \
                     approval: svc workspace up sends it",
                ));
            }
            return Ok(());
        };
        consistent(req, project)
            .map_err(|e| Failure::bad(format!("project {}: {e}", project.root)))?;
        let uid = self.trust_caller(&project.root, caller)?;
        let content = canonical(&project.perimeter)?;
        if project.trust {
            self.store_approval(uid, &project.root, content)?;
            return Ok(());
        }
        let stored = self.approval(uid, &project.root)?;
        trust::decide(stored.as_ref().map(|s| &s.approval), &content)
            .require(&project.root, uid)
            .map_err(|e| Failure {
                status: 403,
                code: "unapproved-project",
                message: e.to_string(),
            })
    }

    /// The caller's uid, once `root` is a directory they may share.
    fn trust_caller(&self, root: &str, caller: Option<u32>) -> Result<u32, Failure> {
        self.check_project_dir(root, caller)?;
        caller.ok_or_else(|| Failure::bad(format!("project {root}: cannot tell who asked")))
    }

    fn approval_path(&self, uid: u32, root: &str) -> PathBuf {
        let key = trust::digest(root);
        let key = key.trim_start_matches("sha256:");
        self.config
            .host
            .state_dir
            .join("trust")
            .join(uid.to_string())
            .join(format!("{key}.json"))
    }

    fn approval(&self, uid: u32, root: &str) -> Result<Option<Stored>, Failure> {
        let path = self.approval_path(uid, root);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Failure::internal(format!(
                    "cannot read the approval {}: {e}",
                    path.display()
                )));
            }
        };
        let stored: Stored = serde_json::from_slice(&text).map_err(|e| {
            Failure::internal(format!("approval {} is damaged: {e}", path.display()))
        })?;
        // A different directory with the same file name would be a SHA-256 collision.
        Ok((stored.root == root).then_some(stored))
    }

    fn store_approval(&self, uid: u32, root: &str, content: String) -> Result<Stored, Failure> {
        let path = self.approval_path(uid, root);
        let stored = Stored {
            root: root.to_owned(),
            approval: Approval::of(content),
            approved_at: rfc3339(std::time::SystemTime::now()),
        };
        let fail = |what: &str, e: std::io::Error| {
            Failure::internal(format!("cannot {what} {}: {e}", path.display()))
        };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| fail("make the directory of", e))?;
        }
        let body =
            serde_json::to_vec_pretty(&stored).map_err(|e| Failure::internal(e.to_string()))?;
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| fail("write", e))?;
        f.write_all(&body)
            .and_then(|()| f.sync_all())
            .map_err(|e| fail("write", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| fail("write", e))?;
        info!(uid, root, digest = %stored.approval.digest, "project perimeter approved");
        // The approver's own: no other member reads which projects it approved.
        self.event_owned(
            "project.approved",
            None,
            Some(uid),
            serde_json::json!({"uid": uid, "root": root, "digest": stored.approval.digest}),
        );
        Ok(stored)
    }
}

fn canonical(p: &Perimeter) -> Result<String, Failure> {
    p.canonical().map_err(|e| Failure::bad(e.to_string()))
}

fn view(
    root: &str,
    uid: u32,
    content: String,
    decision: &Decision,
    stored: Option<&Stored>,
) -> TrustCheck {
    let (word, diff) = match decision {
        Decision::Approved => ("approved", None),
        Decision::Unapproved { .. } => ("unapproved", None),
        Decision::Changed { diff } => ("changed", Some(diff.clone())),
    };
    TrustCheck {
        root: root.to_owned(),
        uid,
        decision: word.to_owned(),
        digest: trust::digest(&content),
        content,
        diff,
        approved_at: stored.map(|s| s.approved_at.clone()),
    }
}

/// Whether what `req` enforces from the project is what its perimeter says.
fn consistent(req: &CreateSandbox, project: &ProjectPerimeter) -> Result<(), String> {
    let p = &project.perimeter;
    if let Some(w) = &req.workspace {
        if w.root != project.root {
            return Err(format!("the workspace's directory is {}", w.root));
        }
        if w.egress != p.egress {
            return Err("the workspace's egress section is not the perimeter's".into());
        }
        if w.auth.ssh_agent_forward != p.ssh_agent_forward
            || w.auth.git_host_helper != p.git_host_helper
            || w.auth.git_config_writable != p.git_config_writable
        {
            return Err("the workspace's auth is not the perimeter's".into());
        }
    }
    if let Some(r) = &req.runtime_required
        && *r != p.runtime
    {
        return Err("runtime_required is not the perimeter's runtime".into());
    }
    for r in &req.ssh_repos {
        let listed = p
            .egress
            .iter()
            .flat_map(|e| e.policy.0.iter())
            .any(|(host, entry)| {
                host.eq_ignore_ascii_case(&r.host) && entry.repos.contains(&r.repo)
            });
        if !listed {
            return Err(format!(
                "SSH repository {}:{} is not in the perimeter's egress.policy",
                r.host, r.repo
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        api::{SshRepo, WorkspaceSpec},
        config::{
            UniqueMap,
            egress::{EgressFile, PolicyEntryFile},
            workspace::Backend,
        },
    };

    fn perimeter() -> Perimeter {
        Perimeter {
            egress: Some(EgressFile {
                allow: vec!["pypi.org".into()],
                policy: UniqueMap(
                    [(
                        "github.com".to_owned(),
                        PolicyEntryFile {
                            paths: Vec::new(),
                            repos: vec!["acme/app".into()],
                        },
                    )]
                    .into_iter()
                    .collect(),
                ),
                secrets: Vec::new(),
                https_push_branches: false,
            }),
            runtime: vec![Backend::CONTAINER],
            ..Perimeter::default()
        }
    }

    fn request(edit: impl FnOnce(&mut CreateSandbox)) -> CreateSandbox {
        let p = perimeter();
        let mut req: CreateSandbox = serde_json::from_value(serde_json::json!({
            "name": "w",
            "workspace": {"root": "/home/dev/app"},
        }))
        .expect("a request");
        if let Some(w) = req.workspace.as_mut() {
            w.egress.clone_from(&p.egress);
        }
        req.runtime_required = Some(p.runtime.clone());
        req.ssh_repos = vec![SshRepo {
            host: "github.com".into(),
            repo: "acme/app".into(),
        }];
        edit(&mut req);
        req
    }

    #[test]
    fn what_is_enforced_must_be_the_approved_perimeter() {
        let project = ProjectPerimeter {
            root: "/home/dev/app".into(),
            perimeter: perimeter(),
            trust: false,
        };
        fn ws(req: &mut CreateSandbox) -> &mut WorkspaceSpec {
            req.workspace.as_mut().expect("a workspace")
        }
        type Edit = Box<dyn FnOnce(&mut CreateSandbox)>;
        let cases: Vec<(&str, Edit, Option<&str>)> = vec![
            ("as_approved", Box::new(|_| {}), None),
            (
                "backend_flag_instead_of_runtime",
                Box::new(|r| r.runtime_required = None),
                None,
            ),
            (
                "another_directory",
                Box::new(|r| ws(r).root = "/home/dev/other".into()),
                Some("the workspace's directory is /home/dev/other"),
            ),
            (
                "an_egress_host_more",
                Box::new(|r| {
                    if let Some(e) = ws(r).egress.as_mut() {
                        e.allow.push("evil.example".into());
                    }
                }),
                Some("egress section is not the perimeter's"),
            ),
            (
                "host_helper_on",
                Box::new(|r| ws(r).auth.git_host_helper = true),
                Some("auth is not the perimeter's"),
            ),
            (
                "git_config_writable",
                Box::new(|r| ws(r).auth.git_config_writable = true),
                Some("auth is not the perimeter's"),
            ),
            (
                "another_runtime",
                Box::new(|r| r.runtime_required = Some(vec![Backend::MICROVM])),
                Some("runtime_required"),
            ),
            (
                "an_ssh_repo_not_listed",
                Box::new(|r| {
                    r.ssh_repos.push(SshRepo {
                        host: "github.com".into(),
                        repo: "acme/infra".into(),
                    });
                }),
                Some("SSH repository github.com:acme/infra"),
            ),
        ];
        for (name, edit, want) in cases {
            let got = consistent(&request(edit), &project);
            match (want, got) {
                (None, Ok(())) => {}
                (Some(frag), Err(e)) => assert!(e.contains(frag), "{name}: {e}"),
                (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
            }
        }
    }
}
