//! The shim: containerd's task API (`containerd.task.v2`) served for one task, each call turned
//! into calls on svcd's API. The task is an svc sandbox on the root file system containerd
//! unpacked for it; its process, and each process `exec` adds, runs in that sandbox.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use containerd_shim::{
    self as shim, DeleteResponse, ExitSignal, Flags, TtrpcContext, TtrpcResult, api,
    protos::protobuf::{MessageField, well_known_types::timestamp::Timestamp},
    synchronous::publisher::RemotePublisher,
};
use svc_control::names::SandboxName;

use crate::{
    process::{Proc, Status, Stdio},
    spec::{self, Spec},
    svcd::Svcd,
};

/// svcd's API socket when `SVC_SOCKET` (as the `svc` CLI reads it) does not say otherwise.
const DEFAULT_SOCKET: &str = "/run/svc/svcd.sock";

/// The shim's state: svcd, and the task (none before `create`).
#[derive(Clone)]
pub struct Service {
    exit: Arc<ExitSignal>,
    /// containerd's id of the task this shim serves (its `-id`).
    id: String,
    svcd: Svcd,
    task: Arc<Mutex<Option<Arc<Task>>>>,
}

/// A task: its sandbox, its bundle and its processes (the task's own under "").
struct Task {
    name: SandboxName,
    bundle: PathBuf,
    /// Where the shim mounted containerd's root file system mounts (none given: the spec's
    /// root is used as it is, and never unmounted).
    mounted: Option<PathBuf>,
    procs: Mutex<HashMap<String, Arc<Proc>>>,
}

impl shim::Shim for Service {
    type T = Service;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut shim::Config) -> Self {
        let socket =
            std::env::var_os("SVC_SOCKET").map_or_else(|| DEFAULT_SOCKET.into(), PathBuf::from);
        Service {
            exit: Arc::new(ExitSignal::default()),
            id: args.id.clone(),
            svcd: Svcd::new(&socket),
            task: Arc::default(),
        }
    }

    fn start_shim(&mut self, opts: shim::StartOpts) -> Result<String, shim::Error> {
        let grouping = opts.id.clone();
        let (_pid, address) = shim::spawn(opts, &grouping, Vec::new())?;
        Ok(address)
    }

    /// After a shim that died: its sandbox removed, the root file system unmounted (the
    /// working directory is the bundle).
    fn delete_shim(&mut self) -> Result<DeleteResponse, shim::Error> {
        let name = spec::sandbox_name(&self.id).map_err(shim::Error::InvalidArgument)?;
        self.svcd
            .destroy(name.as_str())
            .map_err(|e| shim::Error::Other(e.to_string()))?;
        if let Ok(bundle) = std::env::current_dir() {
            unmount_rootfs(&bundle.join("rootfs"));
        }
        let mut resp = DeleteResponse::new();
        resp.exit_status = 137;
        resp.exited_at = MessageField::some(timestamp(SystemTime::now()));
        Ok(resp)
    }

    fn wait(&mut self) {
        self.exit.wait();
    }

    fn create_task_service(&self, _publisher: RemotePublisher) -> Self::T {
        self.clone()
    }
}

impl Service {
    fn task(&self) -> TtrpcResult<Arc<Task>> {
        self.task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| failed("no task has been created in this shim".into()))
    }

    fn proc(&self, exec_id: &str) -> TtrpcResult<(Arc<Task>, Arc<Proc>)> {
        let task = self.task()?;
        let proc = task
            .procs()
            .get(exec_id)
            .cloned()
            .ok_or_else(|| failed(format!("no process {exec_id:?} in task {}", self.id)))?;
        Ok((task, proc))
    }

    /// Make the sandbox of `req`'s task on its root file system (mounted at `<bundle>/rootfs`
    /// first when containerd hands mounts).
    fn create_task(&self, req: &api::CreateTaskRequest) -> Result<Task, String> {
        let bundle = PathBuf::from(&req.bundle);
        let spec = Spec::read(&bundle)?;
        let (layers, mounted) = root_layers(&req.rootfs, spec.rootfs(&bundle))?;
        let name = spec::sandbox_name(&req.id)?;
        let first = Proc::new(
            Stdio {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
            },
            spec.process.exec_request(!req.stdin.is_empty())?,
        );
        let create = spec::create_request(name.clone(), &layers, &spec.annotations)?;
        if let Err(e) = self.svcd.create(&create) {
            mounted.iter().for_each(|r| unmount_rootfs(r));
            return Err(e.to_string());
        }
        Ok(Task {
            name,
            bundle,
            mounted,
            procs: Mutex::new(HashMap::from([(String::new(), Arc::new(first))])),
        })
    }
}

impl Task {
    fn procs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Proc>>> {
        self.procs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl shim::Task for Service {
    fn connect(
        &self,
        _: &TtrpcContext,
        _: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: std::process::id(),
            ..Default::default()
        })
    }

    fn create(
        &self,
        _: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        let task = self.create_task(&req).map_err(failed)?;
        *self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(task));
        Ok(api::CreateTaskResponse {
            pid: std::process::id(),
            ..Default::default()
        })
    }

    fn start(&self, _: &TtrpcContext, req: api::StartRequest) -> TtrpcResult<api::StartResponse> {
        let (task, proc) = self.proc(&req.exec_id)?;
        proc.start(&self.svcd, task.name.as_str()).map_err(failed)?;
        Ok(api::StartResponse {
            pid: std::process::id(),
            ..Default::default()
        })
    }

    fn exec(&self, _: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        let task = self.task()?;
        let process: spec::Process = serde_json::from_slice(&req.spec.value)
            .map_err(|e| failed(format!("exec {}: its process spec: {e}", req.exec_id)))?;
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let request = process
            .exec_request(!req.stdin.is_empty())
            .map_err(failed)?;
        task.procs()
            .insert(req.exec_id.clone(), Arc::new(Proc::new(stdio, request)));
        Ok(api::Empty::new())
    }

    fn state(&self, _: &TtrpcContext, req: api::StateRequest) -> TtrpcResult<api::StateResponse> {
        let (task, proc) = self.proc(&req.exec_id)?;
        let mut resp = api::StateResponse {
            id: req.id,
            exec_id: req.exec_id,
            bundle: task.bundle.display().to_string(),
            pid: std::process::id(),
            stdin: proc.stdio.stdin.clone(),
            stdout: proc.stdio.stdout.clone(),
            stderr: proc.stdio.stderr.clone(),
            terminal: proc.stdio.terminal,
            ..Default::default()
        };
        let status = match proc.status() {
            Status::Created => api::Status::CREATED,
            Status::Running => crate::ops::running_state(task.name.as_str()),
            Status::Stopped(code, at) => {
                resp.exit_status = code;
                resp.exited_at = MessageField::some(timestamp(at));
                api::Status::STOPPED
            }
        };
        resp.set_status(status);
        Ok(resp)
    }

    fn wait(&self, _: &TtrpcContext, req: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        let (_, proc) = self.proc(&req.exec_id)?;
        let (code, at) = proc.wait();
        Ok(api::WaitResponse {
            exit_status: code,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        })
    }

    fn kill(&self, _: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let (task, proc) = self.proc(&req.exec_id)?;
        proc.kill(req.signal).map_err(failed)?;
        if req.all && req.exec_id.is_empty() {
            for p in task.procs().values() {
                let _ = p.kill(req.signal);
            }
        }
        Ok(api::Empty::new())
    }

    fn resize_pty(&self, _: &TtrpcContext, req: api::ResizePtyRequest) -> TtrpcResult<api::Empty> {
        let (_, proc) = self.proc(&req.exec_id)?;
        proc.resize(req.width, req.height);
        Ok(api::Empty::new())
    }

    fn close_io(&self, _: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        let (_, proc) = self.proc(&req.exec_id)?;
        if req.stdin {
            proc.close_stdin();
        }
        Ok(api::Empty::new())
    }

    fn pids(&self, _: &TtrpcContext, _: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        crate::ops::pids(&self.svcd, self.task()?.name.as_str())
    }

    fn pause(&self, _: &TtrpcContext, _: api::PauseRequest) -> TtrpcResult<api::Empty> {
        crate::ops::pause(&self.svcd, self.task()?.name.as_str())
    }

    fn resume(&self, _: &TtrpcContext, _: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        crate::ops::resume(&self.svcd, self.task()?.name.as_str())
    }

    fn stats(&self, _: &TtrpcContext, _: api::StatsRequest) -> TtrpcResult<api::StatsResponse> {
        crate::ops::stats(&self.svcd, self.task()?.name.as_str())
    }

    /// An exec's delete forgets it; the task's removes its sandbox and unmounts its root
    /// file system.
    fn delete(
        &self,
        _: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        let (task, proc) = self.proc(&req.exec_id)?;
        let (code, at) = match proc.status() {
            Status::Stopped(code, at) => (code, at),
            _ if !req.exec_id.is_empty() => {
                return Err(failed(format!("exec {} is still running", req.exec_id)));
            }
            // The task's sandbox goes, and its processes with it.
            _ => (137, SystemTime::now()),
        };
        if req.exec_id.is_empty() {
            self.svcd
                .destroy(task.name.as_str())
                .map_err(|e| failed(e.to_string()))?;
            task.mounted.iter().for_each(|r| unmount_rootfs(r));
        } else {
            task.procs().remove(&req.exec_id);
        }
        Ok(api::DeleteResponse {
            pid: std::process::id(),
            exit_status: code,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        })
    }

    fn shutdown(&self, _: &TtrpcContext, _: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        self.exit.signal();
        Ok(api::Empty::new())
    }
}

/// The task's root file system as svcd takes it (a tree, or layers top first), and where the
/// shim mounted it, if it did. An overlay (containerd's overlayfs snapshotter) is handed as its
/// layers, each of which svcd maps to the guest's ids (an overlay mount itself cannot be
/// idmapped); a bind as its source; no mount as the spec's root; anything else mounted at
/// `rootfs` and handed as that tree.
fn root_layers(
    mounts: &[shim::protos::types::mount::Mount],
    rootfs: PathBuf,
) -> Result<(Vec<PathBuf>, Option<PathBuf>), String> {
    match mounts {
        [] => return Ok((vec![rootfs], None)),
        [m] if m.type_ == "overlay" => {
            let option = |k: &str| m.options.iter().find_map(|o| o.strip_prefix(k));
            let upper = option("upperdir=").map(PathBuf::from);
            let lower = option("lowerdir=").unwrap_or_default();
            let layers: Vec<PathBuf> = upper
                .into_iter()
                .chain(
                    lower
                        .split(':')
                        .filter(|l| !l.is_empty())
                        .map(PathBuf::from),
                )
                .collect();
            return Ok((layers, None));
        }
        [m] if m.type_ == "bind" => return Ok((vec![PathBuf::from(&m.source)], None)),
        _ => {}
    }
    for m in mounts {
        let (kind, source) = (m.type_.as_str(), m.source.as_str());
        shim::mount::mount_rootfs(
            (!kind.is_empty()).then_some(kind),
            (!source.is_empty()).then_some(source),
            &m.options,
            &rootfs,
        )
        .map_err(|e| {
            format!(
                "mounting the task's root file system at {}: {e}",
                rootfs.display()
            )
        })?;
    }
    Ok((vec![rootfs.clone()], Some(rootfs)))
}

/// Unmount what the shim mounted at `rootfs` (nothing there is no error).
fn unmount_rootfs(rootfs: &Path) {
    if let Err(e) = shim::mount::umount_recursive(rootfs.to_str(), 0) {
        log::warn!("unmounting {}: {e}", rootfs.display());
    }
}

fn timestamp(at: SystemTime) -> Timestamp {
    let d = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut t = Timestamp::new();
    t.seconds = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    t.nanos = i32::try_from(d.subsec_nanos()).unwrap_or(0);
    t
}

/// A call that failed, with what went wrong.
fn failed(message: String) -> shim::protos::ttrpc::Error {
    shim::protos::ttrpc::Error::Others(message)
}
