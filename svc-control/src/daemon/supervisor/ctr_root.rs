//! Pod containers' root file systems in a running sandbox (`POST /v1/sandboxes/{name}/roots`,
//! `DELETE …/roots/{id}`, an exec's `root`): checked by `policy::ctr_root`, each layer on disk
//! as `--rootfs` is, then attached by the sandbox's backend. Whether one is attached is the
//! backend's to say (from the sandbox's directory: it holds across an svcd restart).

use super::{Failure, Supervisor, rootfs};
use crate::{
    api::ctr_root::{AttachRoot, AttachedRoot, DetachedRoot},
    names::SandboxName,
    policy::{ctr_root, ownership::Principal},
    runtime::RuntimeError,
};

impl Supervisor {
    /// Attach `req`'s layers as a container's root file system into sandbox `name` (the
    /// caller owns it or is root: the route checked).
    pub async fn attach_root(
        &self,
        who: &Principal,
        name: &str,
        req: AttachRoot,
    ) -> Result<AttachedRoot, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        let layers =
            ctr_root::check_attach(&req.id, &req.layers, who.is_root()).map_err(|e| match e {
                ctr_root::CtrRootError::NotRoot { .. } => Failure::forbidden(e.to_string()),
                _ => Failure::bad(e.to_string()),
            })?;
        for l in &layers {
            let shown = l.display().to_string();
            rootfs::check_dir(&shown).map_err(|e| {
                Failure::bad(format!("attaching {}'s root file system: {e}", req.id))
            })?;
        }
        let (guest, id, backend) = {
            let live = self.live();
            let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
            (
                l.guest.clone(),
                l.id,
                self.backends.get(&l.envelope.backend),
            )
        };
        let dir = self.sandbox_dir(name);
        let root = backend
            .attach_root(&guest, id, &dir, &req.id, &layers)
            .await
            .map_err(runtime_failure)?;
        self.event(
            "sandbox.root-attached",
            Some(name),
            serde_json::json!({"container": req.id, "guest_path": root.guest_path, "layers": layers.len(), "skipped": root.skipped}),
        );
        Ok(AttachedRoot {
            sandbox: name.to_owned(),
            id: req.id,
            guest_path: root.guest_path,
            skipped: root.skipped,
        })
    }

    /// Detach container `id`'s root file system from sandbox `name`.
    pub async fn detach_root(&self, name: &str, id: &str) -> Result<DetachedRoot, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        ctr_root::check_id(id).map_err(|e| Failure::bad(e.to_string()))?;
        let (guest, backend) = {
            let live = self.live();
            let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
            (l.guest.clone(), self.backends.get(&l.envelope.backend))
        };
        let dir = self.sandbox_dir(name);
        let was_attached = backend
            .detach_root(&guest, &dir, id)
            .await
            .map_err(runtime_failure)?;
        if was_attached {
            self.event(
                "sandbox.root-detached",
                Some(name),
                serde_json::json!({"container": id}),
            );
        }
        Ok(DetachedRoot {
            sandbox: name.to_owned(),
            id: id.to_owned(),
            was_attached,
        })
    }

    /// The guest path of container `id`'s root file system attached to sandbox `name` (of
    /// `backend`), for an exec's `root`; refused when it is not attached.
    pub(super) fn exec_root(
        &self,
        name: &str,
        backend: &dyn crate::runtime::Backend,
        id: &str,
    ) -> Result<String, Failure> {
        ctr_root::check_id(id).map_err(|e| Failure::bad(format!("exec root: {e}")))?;
        backend
            .root_attached(&self.sandbox_dir(name), id)
            .ok_or_else(|| {
                Failure::bad(format!(
                    "exec root {id:?}: no such container root file system is attached to \
                     sandbox {name:?} (POST /v1/sandboxes/{name}/roots attaches one)"
                ))
            })
    }
}

fn runtime_failure(e: RuntimeError) -> Failure {
    match e {
        RuntimeError::Unsupported { .. } | RuntimeError::NotRunning => {
            Failure::unsupported(e.to_string())
        }
        other => Failure::internal(other.to_string()),
    }
}
