//! Running a command in a container guest: over the channel to its init (`svc-init`, see
//! `init`), which starts it as the guest's own child (and must take it within [`START`]: an
//! init whose server is stopped fails the command naming that, the command is cancelled — the
//! init holds it until told to start, so it never runs once the server goes on — and its
//! channel is given up; an init from before held starts gets the runtime's exec instead);
//! or, for a guest without one (made by an earlier svcd, or from an image without `svc-init`),
//! with `runc exec`, its pid file naming the guest's process (to kill the command itself, not
//! only runc), on pipes or on a terminal of svcd's.
//!
//! Both give the command the same: the container's user, capabilities, no_new_privs, seccomp
//! filter, cgroup and limits (the init has the container's process configuration and its
//! children inherit it, as `runc exec` applies that configuration), the process
//! configuration's environment with the request's on top, the working directory (`/` unless
//! given), a session of its own, and runc's words and the shell's codes (126, 127) for a command
//! that could not start.
//!
//! A command asking for a user other than the guest's root (`GuestCommand::user`, checked by
//! `policy::exec_user`) goes through the runtime's exec, which sets it: `--user`, and its
//! supplementary groups with runc's `--additional-gids` or, crun having no such flag, a
//! `--process` file holding the whole process.

use std::process::Stdio;

use super::{Container, oci};
use crate::runtime::{
    ExecHandle, GuestCommand, GuestHandle, GuestProcess, RuntimeError,
    microvm::channel::{Channel, NoAck, START},
};

impl Container {
    /// Run `cmd` in `guest` (checked to be running).
    pub(super) async fn exec_in(
        &self,
        guest: &GuestHandle,
        cmd: &GuestCommand,
    ) -> Result<ExecHandle, RuntimeError> {
        let Some(first) = cmd.argv.first() else {
            return Err(RuntimeError::Exec("no command given".into()));
        };
        if first.is_empty() {
            return Err(RuntimeError::Exec("the command name is empty".into()));
        }
        // The init starts commands as the guest's root: another user goes through the
        // runtime's exec, which sets it — but for a command in a pod container's root file
        // system, or one asking for its capability sets, which the init enters and takes the
        // user (and the sets) in itself.
        let init = match (&cmd.user, &cmd.root, &cmd.hardening.caps) {
            (None, _, _) | (_, Some(_), _) | (_, _, Some(_)) => self.init_of(guest).await,
            (Some(_), None, None) => None,
        };
        match init {
            Some(init) => {
                let channel = init
                    .get()
                    .await
                    .map_err(|e| fail(format!("the channel to the guest's init: {e}")))?;
                if !channel.holds_exec() {
                    // An init from before held starts (a guest an earlier svcd made) would
                    // start a command it read late, after its caller was told it failed: the
                    // runtime's exec, which does not wait on the init, runs it instead.
                    return self.without_init(guest, cmd);
                }
                match channel.start(request(cmd), START).await {
                    Ok(handle) => Ok(handle),
                    Err(NoAck::Ended(e)) => {
                        Err(fail(format!("the channel to the guest's init: {e}")))
                    }
                    Err(NoAck::Late) => {
                        let why = unanswered(guest);
                        tracing::warn!(guest = %guest.name, "{why}");
                        self.give_up_init(&guest.name, &channel, &why);
                        Err(fail(why))
                    }
                }
            }
            None => self.without_init(guest, cmd),
        }
    }

    /// Run `cmd` in `guest` with the runtime's exec (entering its root when it has one).
    fn without_init(
        &self,
        guest: &GuestHandle,
        cmd: &GuestCommand,
    ) -> Result<ExecHandle, RuntimeError> {
        match cmd.root {
            Some(_) => self.runc_exec(guest, &entering(guest, cmd)),
            None => self.runc_exec(guest, cmd),
        }
    }

    /// Stop using the channel to `name`'s init (its server took no command in time): what
    /// runs over it ends with `why`, and the guest's commands run with the runtime's exec from
    /// now on (no hand-over is tried either: its server does not answer).
    fn give_up_init(&self, name: &str, channel: &Channel, why: &str) {
        self.inits().remove(name);
        self.reattached().insert(
            name.to_owned(),
            std::sync::Arc::new(tokio::sync::OnceCell::new_with(Some(false))),
        );
        channel.abandon(format!(
            "the channel to the guest's init was given up: {why}"
        ));
    }

    /// Run `cmd` in `guest` with `runc exec`.
    fn runc_exec(
        &self,
        guest: &GuestHandle,
        cmd: &GuestCommand,
    ) -> Result<ExecHandle, RuntimeError> {
        // Which guest process the command is, so that ending it kills the command and not
        // only the runtime's exec; and the runtime's own errors, to tell a command it could not
        // start (127, 126) from one that ran.
        static EXECS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = EXECS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let process = GuestProcess {
            pid_file: self.execs.join(format!("{}.{n}.pid", guest.name)),
            init: guest.pid,
            log: self.execs.join(format!("{}.{n}.log", guest.name)),
        };
        let mut c = self.runc();
        c.arg("--log")
            .arg(&process.log)
            .arg("--log-format")
            .arg("json")
            .arg("exec")
            // The container's process has no_new_privs; runc's exec takes it from the config,
            // crun's only from this flag: said for both, so no command is ever without it.
            .arg("--no-new-privs")
            .arg("--cwd")
            .arg(cmd.cwd.as_deref().unwrap_or("/"));
        for (k, v) in &cmd.env {
            c.arg("--env").arg(format!("{k}={v}"));
        }
        if let Some(u) = &cmd.user {
            c.arg("--user").arg(format!("{}:{}", u.uid, u.gid));
            // The primary group is the process's already (containerd lists it again).
            let extra: Vec<u32> = (u.additional_gids.iter().copied())
                .filter(|g| *g != u.gid)
                .collect();
            if !extra.is_empty() && !self.runtime_is_runc() {
                // crun's exec has no --additional-gids: the whole process from a file (crun
                // then takes nothing of it from the flags; the pid file and log still).
                let file = process.log.with_extension("process.json");
                write_process(&file, cmd, u)?;
                c.arg("--process").arg(&file);
            } else {
                for g in &extra {
                    c.arg("--additional-gids").arg(g.to_string());
                }
            }
        }
        if cmd.tty.is_some() {
            c.arg("--tty");
        }
        c.arg("--pid-file").arg(&process.pid_file);
        c.arg(&guest.name).args(&cmd.argv).env_clear();
        match cmd.tty {
            None => on_pipes(c, cmd.stdin, process),
            Some((rows, cols)) => on_terminal(c, (rows, cols), process),
        }
    }
}

/// The OCI process of `cmd` as `user` (`exec --process`): what the flags would say, the
/// supplementary groups too.
fn write_process(
    file: &std::path::Path,
    cmd: &GuestCommand,
    user: &crate::api::ExecUser,
) -> Result<(), RuntimeError> {
    let exec = request(cmd);
    let process = serde_json::json!({
        "terminal": cmd.tty.is_some(),
        "user": {
            "uid": user.uid,
            "gid": user.gid,
            "additionalGids": user.additional_gids,
        },
        "args": exec.argv,
        "env": exec.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "cwd": exec.cwd.unwrap_or_else(|| "/".into()),
        "noNewPrivileges": true,
    });
    std::fs::write(file, process.to_string())
        .map_err(|e| fail(format!("writing {}: {e}", file.display())))
}

/// A rooted `cmd` for the runtime's exec: the guest's `svc-init --enter` (as the guest's root,
/// from `/`) chroots into the root, enters the working directory, takes the user and execs the
/// command. The init is the one the guest runs: bound at [`super::handed::HANDED_INIT`] on a
/// handed root file system (a pod's), else the base image's.
fn entering(guest: &GuestHandle, cmd: &GuestCommand) -> GuestCommand {
    let handed = std::path::Path::new(&format!("/proc/{}/root", guest.pid))
        .join(super::handed::HANDED_INIT.trim_start_matches('/'));
    let init = if std::fs::symlink_metadata(handed).is_ok() {
        super::handed::HANDED_INIT
    } else {
        super::INIT[0]
    };
    let user = cmd.user.as_ref().map_or_else(
        || "-".to_owned(),
        |u| {
            let groups: Vec<String> = u.additional_gids.iter().map(ToString::to_string).collect();
            format!("{}:{}:{}", u.uid, u.gid, groups.join(","))
        },
    );
    let mut argv = vec![
        init.to_owned(),
        "--enter".to_owned(),
        cmd.root.clone().unwrap_or_default(),
        cmd.cwd.clone().unwrap_or_else(|| "/".into()),
        user,
        cmd.hardening.to_arg(),
        "--".to_owned(),
    ];
    argv.extend(cmd.argv.iter().cloned());
    GuestCommand {
        argv,
        cwd: None,
        user: None,
        root: None,
        hardening: Default::default(),
        ..cmd.clone()
    }
}

impl Container {
    /// Whether the OCI runtime is runc (by its file name); else crun, whose exec flags differ.
    fn runtime_is_runc(&self) -> bool {
        self.runtime
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("runc"))
    }
}

fn fail(m: String) -> RuntimeError {
    RuntimeError::Exec(m)
}

/// Why the init of `guest` took no command within [`START`]: its server's state, as the host
/// sees it.
fn unanswered(guest: &GuestHandle) -> String {
    let server = match super::reinit::server_of(guest.pid) {
        Some(pid) if matches!(process_state(pid), Some('T' | 't')) => {
            format!("its server (host pid {pid}) is stopped")
        }
        Some(pid) => format!("its server (host pid {pid}) did not answer"),
        None => "it has no server".to_owned(),
    };
    format!(
        "the guest's init took no command within {} s: {server}; this sandbox's commands run \
         with the runtime's exec from now on",
        START.as_secs()
    )
}

/// The state letter of process `pid` (`/proc/PID/stat`'s third field: `T` stopped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// What the init is asked to run for `cmd`: its environment is the container process's
/// ([`oci::BASE_ENV`]) with `cmd`'s on top, as `runc exec --env` makes it (a name given again
/// keeps its place with the last value; new names follow in order).
fn request(cmd: &GuestCommand) -> svc_guest::proto::Exec {
    let mut env: Vec<(String, String)> = oci::BASE_ENV
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for (k, v) in &cmd.env {
        match env.iter_mut().find(|(name, _)| name == k) {
            Some(slot) => slot.1.clone_from(v),
            None => env.push((k.clone(), v.clone())),
        }
    }
    svc_guest::proto::Exec {
        argv: cmd.argv.clone(),
        env,
        cwd: Some(cmd.cwd.clone().unwrap_or_else(|| "/".into())),
        stdin: cmd.stdin,
        tty: cmd.tty,
        root: cmd.root.clone(),
        caps: cmd.hardening.caps,
        no_new_privs: cmd.hardening.no_new_privs,
        // Only a rooted command, or one keeping only some capabilities, takes its user from
        // the init.
        user: (cmd.root.is_some() || cmd.hardening.caps.is_some())
            .then_some(cmd.user.as_ref())
            .flatten()
            .map(|u| svc_guest::proto::User {
                uid: u.uid,
                gid: u.gid,
                groups: u.additional_gids.clone(),
            }),
        // `Channel::start` asks it of an init that holds commands.
        held: false,
    }
}

/// Run the exec on pipes (standard input only when `stdin`).
fn on_pipes(
    mut c: tokio::process::Command,
    stdin: bool,
    process: GuestProcess,
) -> Result<ExecHandle, RuntimeError> {
    c.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c
        .spawn()
        .map_err(|e| fail(format!("running runc exec: {e}")))?;
    Ok(ExecHandle::from_child(child, Some(process)))
}

/// Run the exec on a terminal of `size` (rows, columns). runc makes the command's terminal
/// inside the container and copies between it and its own standard streams: give it a
/// terminal of svcd's (of the caller's size) whose master end carries the caller's bytes.
fn on_terminal(
    mut c: tokio::process::Command,
    (rows, cols): (u16, u16),
    process: GuestProcess,
) -> Result<ExecHandle, RuntimeError> {
    let pty = nix::pty::openpty(
        Some(&nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }),
        None,
    )
    .map_err(|e| fail(format!("opening a terminal: {e}")))?;
    let slave = |fd: &std::os::fd::OwnedFd| {
        fd.try_clone()
            .map(Stdio::from)
            .map_err(|e| fail(format!("the terminal: {e}")))
    };
    c.stdin(slave(&pty.slave)?)
        .stdout(slave(&pty.slave)?)
        .stderr(slave(&pty.slave)?);
    let child = c
        .spawn()
        .map_err(|e| fail(format!("running runc exec: {e}")))?;
    // Only runc holds the terminal's slave end now, so the master reads the end of
    // the output when the command and runc are gone.
    drop(c);
    drop(pty.slave);
    ExecHandle::from_tty(child, pty.master, Some(process))
        .map_err(|e| fail(format!("the terminal: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_env_is_the_containers_with_the_callers_on_top_as_runc_makes_it() {
        let cmd = GuestCommand {
            argv: vec!["env".into()],
            env: vec![
                ("HOME".into(), "/y".into()),
                ("A".into(), "1".into()),
                ("A".into(), "2".into()),
            ],
            ..GuestCommand::default()
        };
        let exec = request(&cmd);
        let names: Vec<String> = exec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            names,
            [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/y",
                "LANG=C.UTF-8",
                "A=2"
            ]
        );
        assert_eq!(exec.cwd.as_deref(), Some("/"), "runc exec's default");
        assert_eq!((exec.root, exec.user), (None, None), "the guest's own root");
    }

    #[test]
    fn a_rooted_command_takes_its_user_in_the_root_and_the_runtime_runs_it_through_the_init() {
        let user = crate::api::ExecUser {
            uid: 1000,
            gid: 1000,
            additional_gids: vec![27, 1000],
        };
        let cmd = GuestCommand {
            argv: vec!["id".into(), "-u".into()],
            cwd: Some("/work".into()),
            user: Some(user),
            root: Some("/.svc/ctr/c1".into()),
            ..GuestCommand::default()
        };
        let exec = request(&cmd);
        assert_eq!(exec.root.as_deref(), Some("/.svc/ctr/c1"));
        assert_eq!(
            exec.user,
            Some(svc_guest::proto::User {
                uid: 1000,
                gid: 1000,
                groups: vec![27, 1000],
            })
        );
        let guest = GuestHandle {
            name: "s".into(),
            // No such process: the base image's init path is taken.
            pid: u32::MAX,
            start: 0,
        };
        let via = entering(&guest, &cmd);
        assert_eq!(
            via.argv,
            [
                crate::runtime::container::INIT[0],
                "--enter",
                "/.svc/ctr/c1",
                "/work",
                "1000:1000:27,1000",
                "-",
                "--",
                "id",
                "-u"
            ]
        );
        assert_eq!((via.cwd, via.user, via.root), (None, None, None));
        let unrooted = GuestCommand {
            user: cmd.user.clone(),
            root: None,
            ..cmd
        };
        assert_eq!(request(&unrooted).user, None, "only a rooted command's");
    }
}
