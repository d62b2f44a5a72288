//! containerd's task events (`/tasks/create`, `/tasks/start`, `/tasks/paused`, `/tasks/exit`,
//! …), published to
//! containerd's TTRPC address from one thread in the order the shim raised them: the CRI
//! plugin updates a container's state from them (`TaskExit` ends `StopContainer` and
//! `StopPodSandbox`), and `ctr events` shows them.

use std::{
    sync::mpsc::{Sender, channel},
    time::SystemTime,
};

use containerd_shim::{
    event::Event,
    protos::{
        events::task::{
            TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskPaused,
            TaskResumed, TaskStart,
        },
        protobuf::{MessageDyn, MessageField, well_known_types::timestamp::Timestamp},
        ttrpc::context::Context,
    },
    synchronous::publisher::RemotePublisher,
};

/// Where the shim's events go: a queue to the publishing thread (none: dropped, as before the
/// task service exists).
#[derive(Clone, Default)]
pub struct Events {
    queue: Option<Sender<Box<dyn Event + Send>>>,
}

impl Events {
    /// Publish through `publisher`, in namespace `namespace`, from a thread of their own: a
    /// call never waits for containerd to take its event.
    pub fn start(publisher: RemotePublisher, namespace: String) -> Self {
        let (queue, events) = channel::<Box<dyn Event + Send>>();
        std::thread::spawn(move || {
            for event in events {
                let topic = event.topic();
                let event: Box<dyn MessageDyn> = event;
                if let Err(e) = publisher.publish(Context::default(), &topic, &namespace, event) {
                    log::warn!("publishing {topic} to containerd: {e}");
                }
            }
        });
        Self { queue: Some(queue) }
    }

    fn send(&self, event: impl Event + Send + 'static) {
        if let Some(q) = &self.queue {
            let _ = q.send(Box::new(event));
        }
    }

    /// Task `id` was created from `bundle` with these FIFOs.
    pub fn created(&self, id: &str, bundle: &str, io: [&str; 3], terminal: bool) {
        let [stdin, stdout, stderr] = io.map(str::to_owned);
        self.send(TaskCreate {
            container_id: id.to_owned(),
            bundle: bundle.to_owned(),
            io: MessageField::some(TaskIO {
                stdin,
                stdout,
                stderr,
                terminal,
                ..Default::default()
            }),
            pid: std::process::id(),
            ..Default::default()
        });
    }

    /// Process `exec_id` of task `id` started (`""`: the task's own).
    pub fn started(&self, id: &str, exec_id: &str) {
        let pid = std::process::id();
        if exec_id.is_empty() {
            self.send(TaskStart {
                container_id: id.to_owned(),
                pid,
                ..Default::default()
            });
        } else {
            self.send(TaskExecStarted {
                container_id: id.to_owned(),
                exec_id: exec_id.to_owned(),
                pid,
                ..Default::default()
            });
        }
    }

    /// Process `exec_id` was added to task `id`.
    pub fn exec_added(&self, id: &str, exec_id: &str) {
        self.send(TaskExecAdded {
            container_id: id.to_owned(),
            exec_id: exec_id.to_owned(),
            ..Default::default()
        });
    }

    /// Task `id` was paused (`/tasks/paused`): its sandbox is frozen.
    pub fn paused(&self, id: &str) {
        self.send(TaskPaused {
            container_id: id.to_owned(),
            ..Default::default()
        });
    }

    /// Task `id` was resumed (`/tasks/resumed`): its sandbox is thawed.
    pub fn resumed(&self, id: &str) {
        self.send(TaskResumed {
            container_id: id.to_owned(),
            ..Default::default()
        });
    }

    /// Process `exec_id` of task `id` exited with `code` at `at`. The task's own process is
    /// named by the task's id, as containerd's CRI plugin tells it from an exec's.
    pub fn exited(&self, id: &str, exec_id: &str, code: u32, at: SystemTime) {
        self.send(TaskExit {
            container_id: id.to_owned(),
            id: if exec_id.is_empty() { id } else { exec_id }.to_owned(),
            pid: std::process::id(),
            exit_status: code,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        });
    }

    /// Task `id` was deleted; its process had exited with `code` at `at`.
    pub fn deleted(&self, id: &str, code: u32, at: SystemTime) {
        self.send(TaskDelete {
            container_id: id.to_owned(),
            id: id.to_owned(),
            pid: std::process::id(),
            exit_status: code,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        });
    }
}

/// `at` as protobuf's timestamp.
pub fn timestamp(at: SystemTime) -> Timestamp {
    let d = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut t = Timestamp::new();
    t.seconds = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    t.nanos = i32::try_from(d.subsec_nanos()).unwrap_or(0);
    t
}
