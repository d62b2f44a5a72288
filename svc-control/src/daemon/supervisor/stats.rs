//! `GET /v1/sandboxes/{name}/stats`: a sandbox's figures from its cgroups
//! (`runtime::cgroup_stats`).

use super::{Failure, Supervisor};
use crate::{
    api::{SandboxName, SandboxStats},
    runtime::cgroup_stats::{Figures, Host},
};

impl Supervisor {
    /// What sandbox `name` uses now. A container's figures are its cgroup's; a microvm's its
    /// memory cgroup's and its QEMU process's (the scope says which).
    pub fn stats(&self, name: &str) -> Result<SandboxStats, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        let (pid, backend, state) = {
            let live = self.live();
            let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
            let view = self.view(l);
            (l.guest.pid, l.envelope.backend.clone(), view.state)
        };
        if state == "dead" {
            return Err(Failure {
                status: 409,
                code: "busy",
                message: format!(
                    "sandbox {name:?} is dead: its processes are gone, so it has no figures \
                     (destroy it)"
                ),
            });
        }
        let host = Host::default();
        let (figures, scope): (Result<Figures, String>, &str) = if backend == "microvm" {
            (
                host.vm(pid),
                "the VM: memory of its memory cgroup (guest RAM and QEMU), CPU time of its QEMU \
                 process; the guest's own processes are inside the VM, not the host's",
            )
        } else {
            (host.container(pid), "the sandbox's cgroup")
        };
        let f = figures.map_err(|e| {
            Failure::internal(format!("reading sandbox {name}'s figures (pid {pid}): {e}"))
        })?;
        Ok(SandboxStats {
            name: name.to_owned(),
            backend,
            state,
            scope: scope.to_owned(),
            cgroup: f.cgroup,
            cpu_ns: f.cpu_ns,
            cpu_user_ns: f.cpu_user_ns,
            cpu_system_ns: f.cpu_system_ns,
            memory_bytes: f.memory_bytes,
            memory_limit_bytes: f.memory_limit,
            pids_current: f.pids_current,
            pids_limit: f.pids_limit,
            pids: f.pids,
        })
    }
}
