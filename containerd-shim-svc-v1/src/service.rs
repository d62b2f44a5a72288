//! The shim: containerd's task API (`containerd.task.v2`) served for the tasks of one shim,
//! each call turned into calls on svcd's API. A task of its own (`ctr run`) is an svc sandbox
//! on the root file system containerd unpacked for it (container backend), or a VM of the
//! node's microvm image running its process (`svc.dev/backend=microvm`). A pod (containerd's
//! CRI plugin) has one shim for all its containers (`start_shim` groups them by their pod
//! sandbox's id) and one svc sandbox: its sandbox ("pause") container makes it, with the
//! pod's policy, and stands for it; each of its containers runs its processes in it, on
//! either backend chrooted into its own image's root file system, which svcd attaches into
//! the running sandbox at the container's `Create` and detaches at its `Delete`. Every
//! process, and each one `exec` adds, is an exec of svcd's in its task's sandbox. Task events
//! go to containerd.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use containerd_shim::{
    self as shim, DeleteResponse, ExitSignal, Flags, TtrpcContext, TtrpcResult, api,
    protos::protobuf::MessageField, synchronous::publisher::RemotePublisher,
};
use svc_control::names::SandboxName;

use crate::{
    events::{Events, timestamp},
    process::{Proc, Status, Stdio},
    spec::{self, Role, Spec},
    svcd::Svcd,
};

/// svcd's API socket when `SVC_SOCKET` (as the `svc` CLI reads it) does not say otherwise.
const DEFAULT_SOCKET: &str = "/run/svc/svcd.sock";

/// The shim's state: svcd, its tasks by containerd's id, and where events go.
#[derive(Clone)]
pub struct Service {
    exit: Arc<ExitSignal>,
    /// containerd's id of the task this shim was started for (its `-id`).
    id: String,
    /// containerd's namespace of its tasks (events carry it).
    namespace: String,
    svcd: Svcd,
    tasks: Arc<Mutex<HashMap<String, Arc<Task>>>>,
    events: Events,
}

/// A task: the sandbox its processes run in, its bundle and its processes (the task's own
/// under "").
struct Task {
    sandbox: SandboxName,
    /// It made its sandbox (a task of its own, or a pod's sandbox container): its delete
    /// destroys it. A pod's container only runs in its pod's.
    owns_sandbox: bool,
    bundle: PathBuf,
    /// Where the shim mounted containerd's root file system mounts (none given: the spec's
    /// root is used as it is, and never unmounted).
    mounted: Option<PathBuf>,
    /// A pod's container (either backend): its root file system is attached to its pod's
    /// sandbox under this id (its task's), and its processes run chrooted into it.
    root: Option<String>,
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
            namespace: args.namespace.clone(),
            svcd: Svcd::new(&socket),
            tasks: Arc::default(),
            events: Events::default(),
        }
    }

    /// One shim per pod, as runc's: a container of a pod (the CRI plugin's sandbox-id
    /// annotation in the bundle's spec; the working directory is the bundle) is served by
    /// its pod sandbox's shim, which `spawn` finds by that grouping's socket.
    fn start_shim(&mut self, opts: shim::StartOpts) -> Result<String, shim::Error> {
        let spec = Spec::read(Path::new(".")).map_err(shim::Error::InvalidArgument)?;
        let grouping = spec.grouping(&opts.id);
        let (_pid, address) = shim::spawn(opts, &grouping, Vec::new())?;
        Ok(address)
    }

    /// After a shim that died: the sandbox a task made removed (a pod's container leaves its
    /// pod's to the pod's sandbox container), the root file system unmounted (the working
    /// directory is the bundle).
    fn delete_shim(&mut self) -> Result<DeleteResponse, shim::Error> {
        let bundle = std::env::current_dir().unwrap_or_default();
        let role = Spec::read(&bundle).and_then(|s| s.role());
        if let Ok(Role::PodContainer { sandbox_id }) = role {
            // Its root file system leaves its pod's sandbox (one never attached, or a sandbox
            // gone already, is no error).
            let pod = spec::sandbox_name(&sandbox_id).map_err(shim::Error::InvalidArgument)?;
            self.svcd
                .detach_root(pod.as_str(), &self.id)
                .map_err(|e| shim::Error::Other(e.to_string()))?;
        } else {
            let name = spec::sandbox_name(&self.id).map_err(shim::Error::InvalidArgument)?;
            self.svcd
                .destroy(name.as_str())
                .map_err(|e| shim::Error::Other(e.to_string()))?;
        }
        unmount_rootfs(&bundle.join("rootfs"));
        let mut resp = DeleteResponse::new();
        resp.exit_status = 137;
        resp.exited_at = MessageField::some(timestamp(SystemTime::now()));
        Ok(resp)
    }

    fn wait(&mut self) {
        self.exit.wait();
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        Service {
            events: Events::start(publisher, self.namespace.clone()),
            ..self.clone()
        }
    }
}

impl Service {
    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Task>>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn task(&self, id: &str) -> TtrpcResult<Arc<Task>> {
        self.tasks()
            .get(id)
            .cloned()
            .ok_or_else(|| failed(format!("no task {id:?} in this shim")))
    }

    fn proc(&self, id: &str, exec_id: &str) -> TtrpcResult<(Arc<Task>, Arc<Proc>)> {
        let task = self.task(id)?;
        let proc = task
            .procs()
            .get(exec_id)
            .cloned()
            .ok_or_else(|| failed(format!("no process {exec_id:?} in task {id}")))?;
        Ok((task, proc))
    }

    /// The task `req` asks for: a task of its own or a pod's sandbox container makes its
    /// sandbox (on the container backend: on its root file system, mounted at
    /// `<bundle>/rootfs` first when containerd hands mounts; on the microvm backend: a VM of
    /// the node's microvm image), a pod's container joins its pod's with its root file system
    /// attached to it (either backend).
    fn create_task(&self, req: &api::CreateTaskRequest) -> Result<Task, String> {
        let bundle = PathBuf::from(&req.bundle);
        let spec = Spec::read(&bundle)?;
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let role = spec.role()?;
        spec.check_root(&req.id, &role)?;
        // The pod's sandbox container runs nothing: the sandbox is the pod's.
        let request = match role {
            Role::PodSandbox => None,
            _ => Some(spec.process.exec_request(!req.stdin.is_empty())?),
        };
        let procs = |request| {
            Mutex::new(HashMap::from([(
                String::new(),
                Arc::new(Proc::new(stdio, request)),
            )]))
        };
        if let Role::PodContainer { sandbox_id } = role {
            let pod = self.tasks().get(&sandbox_id).cloned().ok_or_else(|| {
                format!(
                    "container {}: its pod sandbox {sandbox_id} is not served by this shim \
                     (not created, or deleted already)",
                    req.id
                )
            })?;
            // On either backend: the container's own image, attached into its pod's sandbox.
            let (layers, mounted) = root_layers(&req.rootfs, spec.rootfs(&bundle))?;
            if let Err(e) = self
                .svcd
                .attach_root(pod.sandbox.as_str(), &req.id, &layers)
            {
                mounted.iter().for_each(|r| unmount_rootfs(r));
                return Err(e.to_string());
            }
            let root = Some(req.id.clone());
            let request = request.map(|r| svc_control::api::ExecRequest {
                root: root.clone(),
                ..r
            });
            return Ok(Task {
                sandbox: pod.sandbox.clone(),
                owns_sandbox: false,
                bundle,
                mounted,
                root,
                procs: procs(request),
            });
        }
        let name = spec::sandbox_name(&req.id)?;
        let mut create = spec::create_request(name.clone(), &spec.annotations)?;
        // A container sandbox runs on the task's root file system; a microvm boots the
        // node's microvm image and the task's is left unmounted, unused.
        let mut mounted = None;
        if spec::takes_rootfs(&create) {
            let (layers, m) = root_layers(&req.rootfs, spec.rootfs(&bundle))?;
            create = spec::with_rootfs(create, &layers);
            mounted = m;
        }
        if let Err(e) = self.svcd.create(&create) {
            mounted.iter().for_each(|r| unmount_rootfs(r));
            return Err(e.to_string());
        }
        Ok(Task {
            sandbox: name,
            owns_sandbox: true,
            bundle,
            mounted,
            root: None,
            procs: procs(request),
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
        if self.tasks().contains_key(&req.id) {
            return Err(failed(format!("task {} exists already", req.id)));
        }
        let task = self.create_task(&req).map_err(failed)?;
        self.tasks().insert(req.id.clone(), Arc::new(task));
        self.events.created(
            &req.id,
            &req.bundle,
            [&req.stdin, &req.stdout, &req.stderr],
            req.terminal,
        );
        Ok(api::CreateTaskResponse {
            pid: std::process::id(),
            ..Default::default()
        })
    }

    fn start(&self, _: &TtrpcContext, req: api::StartRequest) -> TtrpcResult<api::StartResponse> {
        let (task, proc) = self.proc(&req.id, &req.exec_id)?;
        let (events, id, exec_id) = (self.events.clone(), req.id.clone(), req.exec_id.clone());
        proc.start(
            &self.svcd,
            task.sandbox.as_str(),
            || self.events.started(&req.id, &req.exec_id),
            move |code, at| events.exited(&id, &exec_id, code, at),
        )
        .map_err(failed)?;
        Ok(api::StartResponse {
            pid: std::process::id(),
            ..Default::default()
        })
    }

    fn exec(&self, _: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        let task = self.task(&req.id)?;
        let process: spec::Process = serde_json::from_slice(&req.spec.value)
            .map_err(|e| failed(format!("exec {}: its process spec: {e}", req.exec_id)))?;
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let request = svc_control::api::ExecRequest {
            // A pod's container's execs run in its root file system too.
            root: task.root.clone(),
            ..process
                .exec_request(!req.stdin.is_empty())
                .map_err(failed)?
        };
        {
            let mut procs = task.procs();
            if procs.contains_key(&req.exec_id) {
                return Err(failed(format!(
                    "task {}: exec {} exists already",
                    req.id, req.exec_id
                )));
            }
            procs.insert(
                req.exec_id.clone(),
                Arc::new(Proc::new(stdio, Some(request))),
            );
        }
        self.events.exec_added(&req.id, &req.exec_id);
        Ok(api::Empty::new())
    }

    fn state(&self, _: &TtrpcContext, req: api::StateRequest) -> TtrpcResult<api::StateResponse> {
        let (task, proc) = self.proc(&req.id, &req.exec_id)?;
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
            Status::Running => crate::ops::running_state(task.sandbox.as_str()),
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
        let (_, proc) = self.proc(&req.id, &req.exec_id)?;
        let (code, at) = proc.wait();
        Ok(api::WaitResponse {
            exit_status: code,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        })
    }

    fn kill(&self, _: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let (task, proc) = self.proc(&req.id, &req.exec_id)?;
        proc.kill(req.signal).map_err(failed)?;
        if req.all && req.exec_id.is_empty() {
            for p in task.procs().values() {
                let _ = p.kill(req.signal);
            }
        }
        Ok(api::Empty::new())
    }

    fn resize_pty(&self, _: &TtrpcContext, req: api::ResizePtyRequest) -> TtrpcResult<api::Empty> {
        let (_, proc) = self.proc(&req.id, &req.exec_id)?;
        proc.resize(req.width, req.height);
        Ok(api::Empty::new())
    }

    fn close_io(&self, _: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        let (_, proc) = self.proc(&req.id, &req.exec_id)?;
        if req.stdin {
            proc.close_stdin();
        }
        Ok(api::Empty::new())
    }

    fn pids(&self, _: &TtrpcContext, req: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        crate::ops::pids(&self.svcd, self.task(&req.id)?.sandbox.as_str())
    }

    /// A pod's container pauses (and resumes) its whole pod's sandbox; containerd hears
    /// `TaskPaused` (`TaskResumed`) for the task asked.
    fn pause(&self, _: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        let done = crate::ops::pause(&self.svcd, self.task(&req.id)?.sandbox.as_str())?;
        self.events.paused(&req.id);
        Ok(done)
    }

    fn resume(&self, _: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        let done = crate::ops::resume(&self.svcd, self.task(&req.id)?.sandbox.as_str())?;
        self.events.resumed(&req.id);
        Ok(done)
    }

    fn stats(&self, _: &TtrpcContext, req: api::StatsRequest) -> TtrpcResult<api::StatsResponse> {
        crate::ops::stats(&self.svcd, self.task(&req.id)?.sandbox.as_str())
    }

    /// An exec's delete forgets it. A task's forgets the task: one that made its sandbox
    /// removes it (its processes, and a pod's containers', go with it) and unmounts its root
    /// file system; a pod's container still running has its processes killed.
    fn delete(
        &self,
        _: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        let (task, proc) = self.proc(&req.id, &req.exec_id)?;
        let (code, at) = match proc.status() {
            Status::Stopped(code, at) => (code, at),
            _ if !req.exec_id.is_empty() => {
                return Err(failed(format!("exec {} is still running", req.exec_id)));
            }
            // The task's processes go with it.
            _ => (137, SystemTime::now()),
        };
        if !req.exec_id.is_empty() {
            task.procs().remove(&req.exec_id);
        } else if task.owns_sandbox {
            self.svcd
                .destroy(task.sandbox.as_str())
                .map_err(|e| failed(e.to_string()))?;
            task.mounted.iter().for_each(|r| unmount_rootfs(r));
            self.tasks().remove(&req.id);
        } else {
            for p in task.procs().values() {
                let _ = p.kill(libc::SIGKILL.unsigned_abs());
            }
            if let Some(root) = &task.root {
                self.svcd
                    .detach_root(task.sandbox.as_str(), root)
                    .map_err(|e| failed(e.to_string()))?;
            }
            task.mounted.iter().for_each(|r| unmount_rootfs(r));
            self.tasks().remove(&req.id);
        }
        if req.exec_id.is_empty() {
            self.events.deleted(&req.id, code, at);
        }
        Ok(api::DeleteResponse {
            pid: std::process::id(),
            exit_status: code,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        })
    }

    /// The shim ends once it serves no task (containerd asks after each task's delete; a
    /// pod's shim serves its other containers until the last is deleted).
    fn shutdown(&self, _: &TtrpcContext, _: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        if self.tasks().is_empty() {
            self.exit.signal();
        }
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

/// A call that failed, with what went wrong.
fn failed(message: String) -> shim::protos::ttrpc::Error {
    shim::protos::ttrpc::Error::Others(message)
}
