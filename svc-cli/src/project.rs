//! A project directory as a creation request gets it: `svc sandbox create --workspace DIR`
//! and `svc workspace up DIR` both read it here, so both make the same perimeter (the
//! `.svc/config.yaml` egress section — hosts, path rules, SSH repositories, secret hosts —
//! and the `.svc/workspace.json` runtime, as the user approved them). What `workspace up`
//! adds beyond the perimeter (the directory at /workspace, hooks, services, readiness) stays
//! in `workspace_cmd`.

use std::{path::PathBuf, process::ExitCode};

use svc_control::{
    api::{CreateSandbox, ProjectPerimeter},
    config::loader::LoadedWorkspace,
};

use crate::client::Client;

/// A project read from its directory.
pub(crate) struct Project {
    /// The directory, canonical.
    pub(crate) root: PathBuf,
    /// What its files configure.
    pub(crate) loaded: LoadedWorkspace,
}

impl Project {
    /// Read the project in `dir`: invalid, its errors printed and exit 78; its warnings
    /// printed.
    pub(crate) fn load(dir: &std::path::Path) -> anyhow::Result<Result<Self, ExitCode>> {
        let (root, loaded) = match crate::trust::load_valid(dir)? {
            Ok(l) => l,
            Err(code) => return Ok(Err(code)),
        };
        for w in &loaded.warnings {
            eprintln!("warning: {w}");
        }
        Ok(Ok(Self { root, loaded }))
    }

    /// Have the project's perimeter approved: `--trust`, already, or asked on a terminal;
    /// refused, the reason printed and the exit code.
    pub(crate) async fn approve(
        &self,
        client: &Client,
        trust: bool,
    ) -> anyhow::Result<Result<ProjectPerimeter, ExitCode>> {
        let perimeter = crate::trust::perimeter(&self.loaded);
        Ok(crate::trust::ensure(client, &self.root, &perimeter, trust)
            .await?
            .map(|trust| ProjectPerimeter {
                root: self.root.display().to_string(),
                perimeter,
                trust,
            }))
    }

    /// Put the project's `approved` perimeter into `req` (svcd enforces its egress section,
    /// and with it the SSH repositories and `httpsPushBranches`) and the runtime it requires
    /// (svcd takes `req.backend` first when given).
    pub(crate) fn apply(&self, approved: ProjectPerimeter, req: &mut CreateSandbox) {
        req.runtime_required = Some(self.loaded.effective.runtime.required.clone());
        req.project = Some(approved);
    }
}
