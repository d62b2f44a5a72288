//! What the shim reads of a task's bundle (`config.json`, the OCI runtime spec containerd
//! writes from the image and the container's settings) and how it becomes svcd's requests: the
//! sandbox's creation request (its name, the bundle's root file system, the pod's policy
//! annotations) and the exec of the task's process.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;
use svc_control::{
    api::{CreateSandbox, ExecRequest},
    kinds,
    names::{MAX_NAME, SandboxName},
    policy::exec_caps::{ExecCaps, ExecHardening},
    policy::pod,
};

/// containerd's CRI plugin's annotation saying what a container is to its pod: `sandbox` (the
/// pod's sandbox, "pause", container) or `container` (one of the pod's containers).
pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// containerd's CRI plugin's annotation naming the pod sandbox a container belongs to.
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

/// What a task is to the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A task of its own (`ctr run`): it makes its sandbox and runs its process there.
    Alone,
    /// A pod's sandbox container: it makes the pod's sandbox; its process is a placeholder.
    PodSandbox,
    /// One of a pod's containers: its processes run in the sandbox of the pod sandbox
    /// `sandbox_id`.
    PodContainer { sandbox_id: String },
}

/// The parts of the OCI runtime spec the shim uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Spec {
    #[serde(default)]
    pub process: Process,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub root: Option<Root>,
}

/// The spec's root file system.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Root {
    /// Relative to the bundle, or absolute (`ctr run --rootfs DIR`).
    pub path: String,
    /// A read-only root asked (`readOnlyRootFilesystem`, `ctr run --read-only`).
    #[serde(default)]
    pub readonly: bool,
}

/// The spec's process: what runs, with what, where.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Process {
    #[serde(default)]
    pub terminal: bool,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub cwd: String,
    #[serde(default)]
    pub user: User,
    /// The capability sets it keeps (a pod's `securityContext.capabilities`, on containerd's
    /// defaults); none: the sandbox's own.
    #[serde(default)]
    pub capabilities: Option<ExecCaps>,
    /// `allowPrivilegeEscalation: false` (and containerd's default for a pod container).
    #[serde(default, rename = "noNewPrivileges")]
    pub no_new_privileges: bool,
}

/// The process's user.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct User {
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    #[serde(default, rename = "additionalGids")]
    pub additional_gids: Vec<u32>,
}

impl Spec {
    /// The task's root file system: the spec's root path, under `bundle` when relative.
    pub fn rootfs(&self, bundle: &Path) -> std::path::PathBuf {
        bundle.join(self.root.as_ref().map_or("rootfs", |r| r.path.as_str()))
    }

    /// What the task is, from the CRI plugin's annotations (none: a task of its own).
    pub fn role(&self) -> Result<Role, String> {
        let sandbox_id = self.annotations.get(SANDBOX_ID).filter(|s| !s.is_empty());
        match self.annotations.get(CONTAINER_TYPE).map(String::as_str) {
            None => Ok(Role::Alone),
            Some("sandbox") => Ok(Role::PodSandbox),
            Some("container") => sandbox_id
                .map(|id| Role::PodContainer {
                    sandbox_id: id.clone(),
                })
                .ok_or_else(|| {
                    format!("annotation {CONTAINER_TYPE} is container without {SANDBOX_ID}")
                }),
            Some(other) => Err(format!(
                "annotation {CONTAINER_TYPE}: {other:?}; expected sandbox or container"
            )),
        }
    }

    /// The shim that serves task `id`: a pod's containers share their pod sandbox's (as the
    /// CRI plugin names it), any other task has its own.
    pub fn grouping(&self, id: &str) -> String {
        match self.annotations.get(SANDBOX_ID) {
            Some(sandbox) if !sandbox.is_empty() => sandbox.clone(),
            _ => id.to_owned(),
        }
    }

    /// What the task asks of its root that svc cannot give, refused by
    /// `policy::pod::container_root` (a pod's sandbox container is not asked).
    pub fn check_root(&self, id: &str, role: &Role) -> Result<(), String> {
        if *role == Role::PodSandbox {
            return Ok(());
        }
        let readonly = self.root.as_ref().is_some_and(|r| r.readonly);
        pod::container_root(id, readonly).map_err(|e| e.to_string())
    }

    /// `<bundle>/config.json`; an error names the file.
    pub fn read(bundle: &Path) -> Result<Self, String> {
        let path = bundle.join("config.json");
        let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Process {
    /// The exec of this process in its sandbox (`stdin`: the task was given a standard input),
    /// as the spec's user: a user other than root is sent to svcd (which checks it is within
    /// the guest's ids); root (0:0) runs as the sandbox's root, whose groups are its own. Its
    /// capability sets and `noNewPrivileges` are sent too: svcd grants them within the
    /// sandbox's own (`policy::exec_caps`) and the guest lowers the command's to them.
    pub fn exec_request(&self, stdin: bool) -> Result<ExecRequest, String> {
        if self.args.is_empty() {
            return Err("the task's process has no arguments (no entrypoint or command)".into());
        }
        let u = &self.user;
        let user = (u.uid != 0 || u.gid != 0).then(|| svc_control::api::ExecUser {
            uid: u.uid,
            gid: u.gid,
            additional_gids: u.additional_gids.clone(),
        });
        let env = self
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(ExecRequest {
            argv: self.args.clone(),
            env,
            cwd: (!self.cwd.is_empty()).then(|| self.cwd.clone()),
            stdin,
            tty: self
                .terminal
                .then_some(svc_control::api::TermSize { rows: 24, cols: 80 }),
            user,
            root: None,
            hardening: (self.capabilities.is_some() || self.no_new_privileges).then(|| {
                ExecHardening {
                    capabilities: self.capabilities.clone(),
                    no_new_privs: self.no_new_privileges,
                }
            }),
        })
    }
}

/// The sandbox of containerd's task `id`: `ctr-` and the id lower-cased, other characters as
/// `-`; an id that does not fit so (too long, or changed by that) ends in a hash of itself, so
/// two ids never share a sandbox.
pub fn sandbox_name(id: &str) -> Result<SandboxName, String> {
    let mut name: String = format!("ctr-{id}")
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    if name != format!("ctr-{id}") || name.len() > MAX_NAME {
        let hash = fnv1a(id.as_bytes());
        name.truncate(MAX_NAME - 17);
        name = format!("{}-{hash:016x}", name.trim_end_matches('-'));
    }
    SandboxName::new(name).map_err(|e| format!("containerd's task id {id:?}: {e}"))
}

/// The creation request for task `name` with the policy the spec's `annotations` ask for:
/// `svc.dev/*` read by `svc_control::policy::pod` (unknown keys, and a `svc.dev/backend` no
/// backend answers to, refused by name; svcd checks the request again by the creation rules
/// and its message is what containerd reports). Its backend is named always (the default
/// kind's when the annotations name none); a container sandbox is then given the task's root
/// file system ([`with_rootfs`]), a microvm boots the node's microvm image.
pub fn create_request(
    name: SandboxName,
    annotations: &BTreeMap<String, String>,
) -> Result<CreateSandbox, String> {
    let mut req = pod::request_from_annotations(name, annotations).map_err(|e| e.to_string())?;
    let kind = pod::backend(&req).map_err(|e| e.to_string())?;
    req.backend = Some(kind.name.to_owned());
    Ok(req)
}

/// Whether the sandbox `req` makes runs on the task's root file system: the container
/// backend's does; a microvm's root is the node's microvm image, and the task's is not used.
pub fn takes_rootfs(req: &CreateSandbox) -> bool {
    req.backend.as_deref() == Some(kinds::CONTAINER.name)
}

/// `req` on the root file system `layers` (a tree, or layers top first).
pub fn with_rootfs(mut req: CreateSandbox, layers: &[std::path::PathBuf]) -> CreateSandbox {
    let layers: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
    req.rootfs = Some(layers.join(":"));
    req
}

/// FNV-1a, 64 bits: a stable hash for names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_become_valid_distinct_sandbox_names() {
        assert_eq!(
            sandbox_name("web1").map(|n| n.to_string()),
            Ok("ctr-web1".into())
        );
        let long = "a".repeat(64);
        let cases = ["Web1", "web_1", "web.1", &long, &format!("{long}b")];
        let names: Vec<String> = cases
            .iter()
            .map(|id| sandbox_name(id).expect(id).to_string())
            .collect();
        for (id, n) in cases.iter().zip(&names) {
            assert!(n.len() <= MAX_NAME && n.starts_with("ctr-"), "{id}: {n}");
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    #[test]
    fn annotations_outside_svc_are_not_read_and_unknown_svc_keys_are_refused() {
        let name = sandbox_name("t").expect("name");
        let mut a = BTreeMap::from([
            (
                "io.kubernetes.cri.container-type".to_owned(),
                "container".to_owned(),
            ),
            (
                "svc.dev/allow-hosts".to_owned(),
                "api.github.com, example.com".to_owned(),
            ),
        ]);
        let layers = ["/l/2".into(), "/l/1".into()];
        let req = create_request(name.clone(), &a).expect("request");
        assert_eq!(req.allow_hosts, ["api.github.com", "example.com"]);
        assert_eq!(req.backend.as_deref(), Some("container"), "named always");
        assert!(takes_rootfs(&req));
        let req = with_rootfs(req, &layers);
        assert_eq!(req.rootfs.as_deref(), Some("/l/2:/l/1"));
        a.insert("svc.dev/alow-hosts".into(), "x".into());
        let e = create_request(name.clone(), &a).expect_err("refused");
        assert!(e.contains("svc.dev/alow-hosts"), "{e}");
        a.remove("svc.dev/alow-hosts");
        a.insert("svc.dev/backend".into(), "gvisor".into());
        let e = create_request(name.clone(), &a).expect_err("refused");
        assert!(
            e.contains("svc.dev/backend: \"gvisor\" is no backend; expected container or microvm"),
            "{e}"
        );
        a.insert("svc.dev/backend".into(), "microvm".into());
        let req = create_request(name.clone(), &a).expect("request");
        assert_eq!(req.backend.as_deref(), Some("microvm"));
        assert!(!takes_rootfs(&req), "a microvm boots the node's image");
        assert_eq!(req.rootfs, None);
        a.insert("svc.dev/backend".into(), "container".into());
        a.insert("svc.dev/secrets".into(), "CODE_HOST_TOKEN=gh".into());
        let req = create_request(name, &a).expect("request");
        assert_eq!(
            (req.secrets[0].name.as_str(), req.secrets[0].source.as_str()),
            ("CODE_HOST_TOKEN", "store:gh")
        );
        assert!(
            req.secrets[0].value.is_empty(),
            "a reference, never a value"
        );
    }

    #[test]
    fn the_cri_annotations_group_a_pod_in_one_shim_and_say_what_each_task_is() {
        let spec = |pairs: &[(&str, &str)]| Spec {
            annotations: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Spec::default()
        };
        let alone = spec(&[("svc.dev/allow-hosts", "a.example")]);
        assert_eq!(alone.role(), Ok(Role::Alone));
        assert_eq!(alone.grouping("web"), "web");
        let pod = spec(&[(CONTAINER_TYPE, "sandbox"), (SANDBOX_ID, "p1")]);
        assert_eq!(pod.role(), Ok(Role::PodSandbox));
        assert_eq!(pod.grouping("p1"), "p1");
        let app = spec(&[(CONTAINER_TYPE, "container"), (SANDBOX_ID, "p1")]);
        assert_eq!(
            app.role(),
            Ok(Role::PodContainer {
                sandbox_id: "p1".into()
            })
        );
        assert_eq!(app.grouping("c1"), "p1");
        let orphan = spec(&[(CONTAINER_TYPE, "container")]);
        assert!(orphan.role().expect_err("no pod").contains(SANDBOX_ID));
        let odd = spec(&[(CONTAINER_TYPE, "init")]);
        assert!(odd.role().expect_err("unknown").contains("\"init\""));
    }

    #[test]
    fn a_read_only_root_asked_is_refused_but_for_the_pods_sandbox_container() {
        let ro = Spec {
            root: Some(Root {
                path: "rootfs".into(),
                readonly: true,
            }),
            ..Spec::default()
        };
        let app = Role::PodContainer {
            sandbox_id: "p1".into(),
        };
        for role in [app, Role::Alone] {
            let e = ro.check_root("c1", &role).expect_err("refused");
            assert!(
                e.contains("container c1: asks for a read-only root file system"),
                "{e}"
            );
        }
        assert_eq!(ro.check_root("p1", &Role::PodSandbox), Ok(()), "pause's");
        assert_eq!(Spec::default().check_root("c1", &Role::Alone), Ok(()));
    }

    #[test]
    fn a_process_without_arguments_is_refused_and_its_user_is_sent() {
        let mut p = Process {
            args: vec!["sh".into()],
            env: vec!["A=1".into(), "B=x=y".into()],
            ..Process::default()
        };
        let req = p.exec_request(false).expect("request");
        assert_eq!(
            req.env,
            [("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        assert_eq!(req.cwd, None);
        assert_eq!(req.user, None, "root: the sandbox's root");
        p.user.uid = 1000;
        p.user.gid = 1000;
        p.user.additional_gids = vec![27];
        let user = p.exec_request(false).expect("request").user.expect("user");
        assert_eq!(
            (user.uid, user.gid, user.additional_gids),
            (1000, 1000, vec![27])
        );
        p.args.clear();
        assert!(p.exec_request(false).is_err());
    }

    #[test]
    fn the_process_capabilities_and_no_new_privileges_are_sent() {
        let p: Process = serde_json::from_str(
            r#"{"args":["sh"],"noNewPrivileges":true,
                "capabilities":{"bounding":["CAP_KILL"],"effective":[],"permitted":["CAP_KILL"]}}"#,
        )
        .expect("an OCI process");
        let h = p
            .exec_request(false)
            .expect("request")
            .hardening
            .expect("sent");
        assert!(h.no_new_privs);
        let caps = h.capabilities.expect("caps");
        assert_eq!(
            (caps.bounding, caps.effective),
            (vec!["CAP_KILL".to_owned()], vec![])
        );
        let plain = Process {
            args: vec!["sh".into()],
            ..Process::default()
        };
        assert_eq!(plain.exec_request(false).expect("request").hardening, None);
    }
}
