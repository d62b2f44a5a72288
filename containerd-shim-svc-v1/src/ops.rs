//! The task operations that act on the whole sandbox through svcd: `Pause` and `Resume` (svcd
//! freezes and thaws the sandbox), `Stats` (svcd's figures of the sandbox's cgroups, as
//! containerd's cgroups v1 `Metrics`, which `ctr task metrics` and the CRI read) and `Pids`
//! (the host pids of the sandbox's processes).

use std::{collections::BTreeSet, sync::Mutex};

use containerd_shim::{
    TtrpcResult, api,
    protos::{
        cgroups::metrics::{CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat},
        protobuf::{Message as _, MessageField, well_known_types::any::Any},
    },
};
use svc_control::api::{SandboxStats, SandboxView};

use crate::svcd::{Svcd, SvcdError};

/// The type containerd registers the cgroups v1 `Metrics` under (`typeurl`): what `ctr task
/// metrics` and the CRI plugin decode a task's stats as.
pub const METRICS_V1: &str = "io.containerd.cgroups.v1.Metrics";

/// The sandboxes this shim paused (their task's state is then `PAUSED`).
static PAUSED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn paused() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    PAUSED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Svcd {
    /// `POST /v1/sandboxes/{name}/{op}` (`pause`, `resume`): the sandbox after it.
    pub fn lifecycle(&self, name: &str, op: &str) -> Result<SandboxView, SvcdError> {
        let call = format!("{op} of sandbox {name}");
        let body = self.call("POST", &format!("/v1/sandboxes/{name}/{op}"), b"", &call)?;
        serde_json::from_slice(&body).map_err(|e| SvcdError::Protocol {
            call,
            message: format!("a bad answer from svcd: {e}"),
        })
    }

    /// `POST /v1/sandboxes/{name}/roots`: container `id`'s root file system (`layers`, top
    /// first) attached to sandbox `name`.
    pub fn attach_root(
        &self,
        name: &str,
        id: &str,
        layers: &[std::path::PathBuf],
    ) -> Result<(), SvcdError> {
        let call = format!("attaching container {id}'s root file system to sandbox {name}");
        let body = serde_json::to_vec(&svc_control::api::ctr_root::AttachRoot {
            id: id.to_owned(),
            layers: layers.iter().map(|l| l.display().to_string()).collect(),
        })
        .map_err(|e| SvcdError::Protocol {
            call: call.clone(),
            message: e.to_string(),
        })?;
        self.call("POST", &format!("/v1/sandboxes/{name}/roots"), &body, &call)
            .map(drop)
    }

    /// `DELETE /v1/sandboxes/{name}/roots/{id}`; a sandbox already gone is no error.
    pub fn detach_root(&self, name: &str, id: &str) -> Result<(), SvcdError> {
        let call = format!("detaching container {id}'s root file system from sandbox {name}");
        match self.call(
            "DELETE",
            &format!("/v1/sandboxes/{name}/roots/{id}"),
            b"",
            &call,
        ) {
            Err(SvcdError::Refused { status: 404, .. }) | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `GET /v1/sandboxes/{name}/stats`.
    pub fn stats(&self, name: &str) -> Result<SandboxStats, SvcdError> {
        let call = format!("the figures of sandbox {name}");
        let body = self.call("GET", &format!("/v1/sandboxes/{name}/stats"), b"", &call)?;
        serde_json::from_slice(&body).map_err(|e| SvcdError::Protocol {
            call,
            message: format!("a bad answer from svcd: {e}"),
        })
    }
}

/// `Pause`: svcd freezes every process of the sandbox.
pub fn pause(svcd: &Svcd, name: &str) -> TtrpcResult<api::Empty> {
    svcd.lifecycle(name, "pause").map_err(failed)?;
    paused().insert(name.to_owned());
    Ok(api::Empty::new())
}

/// `Resume`: svcd thaws them.
pub fn resume(svcd: &Svcd, name: &str) -> TtrpcResult<api::Empty> {
    svcd.lifecycle(name, "resume").map_err(failed)?;
    paused().remove(name);
    Ok(api::Empty::new())
}

/// Whether this shim paused sandbox `name` (and has not resumed it).
pub fn is_paused(name: &str) -> bool {
    paused().contains(name)
}

/// The state a running task of sandbox `name` is in: `PAUSED` while paused.
pub fn running_state(name: &str) -> api::Status {
    if is_paused(name) {
        api::Status::PAUSED
    } else {
        api::Status::RUNNING
    }
}

/// `Stats`: the sandbox's figures as cgroups v1 `Metrics`.
pub fn stats(svcd: &Svcd, name: &str) -> TtrpcResult<api::StatsResponse> {
    let s = svcd.stats(name).map_err(failed)?;
    let value = metrics(&s)
        .write_to_bytes()
        .map_err(|e| failed_msg(format!("encoding the metrics of sandbox {name}: {e}")))?;
    let mut any = Any::new();
    any.type_url = METRICS_V1.to_owned();
    any.value = value;
    Ok(api::StatsResponse {
        stats: MessageField::some(any),
        ..Default::default()
    })
}

/// `Pids`: the host pids of the sandbox's processes.
pub fn pids(svcd: &Svcd, name: &str) -> TtrpcResult<api::PidsResponse> {
    let s = svcd.stats(name).map_err(failed)?;
    Ok(api::PidsResponse {
        processes: s
            .pids
            .iter()
            .map(|pid| containerd_shim::protos::types::task::ProcessInfo {
                pid: *pid,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

/// svcd's figures in containerd's cgroups v1 shape (a limit svcd has none of is 0, as the
/// cgroups library reports one it cannot read).
pub fn metrics(s: &SandboxStats) -> Metrics {
    let mut m = Metrics::new();
    m.pids = MessageField::some(PidsStat {
        current: s.pids_current.unwrap_or(s.pids.len() as u64),
        limit: s.pids_limit.unwrap_or(0),
        ..Default::default()
    });
    m.cpu = MessageField::some(CPUStat {
        usage: MessageField::some(CPUUsage {
            total: s.cpu_ns,
            kernel: s.cpu_system_ns.unwrap_or(0),
            user: s.cpu_user_ns.unwrap_or(0),
            ..Default::default()
        }),
        ..Default::default()
    });
    m.memory = MessageField::some(MemoryStat {
        usage: MessageField::some(MemoryEntry {
            usage: s.memory_bytes,
            limit: s.memory_limit_bytes.unwrap_or(0),
            ..Default::default()
        }),
        ..Default::default()
    });
    m
}

fn failed(e: SvcdError) -> containerd_shim::protos::ttrpc::Error {
    failed_msg(e.to_string())
}

fn failed_msg(message: String) -> containerd_shim::protos::ttrpc::Error {
    containerd_shim::protos::ttrpc::Error::Others(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svcds_figures_become_cgroups_v1_metrics_that_read_back() {
        let s = SandboxStats {
            name: "ctr-t".into(),
            backend: "container".into(),
            state: "running".into(),
            scope: String::new(),
            cgroup: "/svc/ctr-t".into(),
            cpu_ns: 7_000,
            cpu_user_ns: Some(5_000),
            cpu_system_ns: Some(2_000),
            memory_bytes: 4096,
            memory_limit_bytes: None,
            pids_current: Some(2),
            pids_limit: Some(512),
            pids: vec![10, 11],
        };
        let bytes = metrics(&s).write_to_bytes().expect("encodes");
        let back = Metrics::parse_from_bytes(&bytes).expect("decodes");
        assert_eq!(back.cpu.usage.total, 7_000);
        assert_eq!(back.cpu.usage.user, 5_000);
        assert_eq!(back.memory.usage.usage, 4096);
        assert_eq!(back.memory.usage.limit, 0, "no limit");
        assert_eq!((back.pids.current, back.pids.limit), (2, 512));
    }
}
