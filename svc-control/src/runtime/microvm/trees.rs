//! Host directories put into a running guest at a guest path (a pod container's own root file
//! system): the microvm machine has no hot-plug of any kind (QEMU's `docs/system/i386/microvm`:
//! "Hotplug of any kind" is not supported), so every VM boots with one spare virtio-fs
//! share, the *trees share*: a small tmpfs at `<vm dir>/trees`, made a shared mount before
//! its virtiofsd starts. virtiofsd's sandbox makes its mounts slaves of the host's,
//! so a directory the host later binds at `trees/<tree>` appears inside the share with no
//! new device and no new virtiofsd; the agent then binds it at the guest path
//! (`Request::BindTree`, no link on the way followed). Detaching reverses both: the guest's
//! bind, then the host's (the unmount propagates to virtiofsd's view), then the directory.
//!
//! The host never follows a path inside the share (the guest writes there): each tree's
//! directory is made and opened relative to the share's own directory, without following a
//! link, and mounted through that open file.

use std::{
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use rustix::{
    fs::{CWD, Mode, OFlags},
    io::Errno,
    mount::{MountFlags, MountPropagationFlags, UnmountFlags},
};
use svc_guest::proto::{Exec, GuestBind, Request, TREES_DIR, TREES_TAG};

use super::{Microvm, RECONNECT_LIMIT, channel::Channel, daemons, virtiofsd, vm_dir::VmDir};
use crate::runtime::{Backend as _, ExecHandle, GuestCommand, GuestHandle, RuntimeError};

/// The trees share's own file system: room for the trees' mount points and little else.
const SHARE_SIZE: &std::ffi::CStr = c"size=64k,nr_inodes=1024,mode=0700,uid=0,gid=0";

/// How long the agent may take to bind or unbind a tree.
const TREE_LIMIT: Duration = Duration::from_secs(30);

impl Microvm {
    /// Put `host_dir` into the running guest of sandbox `guest` at `guest_path` (made there if
    /// missing): the guest sees it live, read-write as the host directory's owner sees it
    /// (guest root is its owner, as on a live mount). One tree per guest path; detach with
    /// [`Microvm::detach_tree`].
    pub async fn attach_tree(
        &self,
        guest: &GuestHandle,
        host_dir: &Path,
        guest_path: &str,
    ) -> Result<(), RuntimeError> {
        self.attach_tree_with(guest, host_dir, guest_path, Vec::new())
            .await
            .map(drop)
    }

    /// [`Microvm::attach_tree`], then the guest's own `binds` bound inside the tree by the
    /// agent (a pod container's root file system: `svc_guest::agent::tree_binds`): the places
    /// the agent skipped, each with why, as `policy::ctr_root::skipped_places` passes them on.
    pub(super) async fn attach_tree_with(
        &self,
        guest: &GuestHandle,
        host_dir: &Path,
        guest_path: &str,
        binds: Vec<GuestBind>,
    ) -> Result<Vec<String>, RuntimeError> {
        let failed = failed("attaching a tree to", guest);
        let channel = self.live_channel(guest).await?;
        let tree = tree_name(guest_path).map_err(&failed)?;
        let dir = self.dir(&guest.name);
        if !dir.trees_pidfile().exists() {
            return Err(failed(format!(
                "it booted without a trees share (svcd found no virtiofsd, `microvm.virtiofsd` \
                 {}): recreate it once virtiofsd is installed",
                self.config.virtiofsd.display()
            )));
        }
        host_bind(&dir, host_dir, &tree).map_err(&failed)?;
        let bind = Request::BindTree {
            tree: tree.clone(),
            path: guest_path.to_owned(),
            binds,
        };
        match call(&channel, &bind).await {
            Ok(said) => Ok(crate::policy::ctr_root::skipped_places(&said)),
            Err(e) => {
                // Nothing of it stays on the host when the guest refused it.
                let _ = host_unbind(&dir, &tree);
                Err(failed(format!("the guest's agent: {e}")))
            }
        }
    }

    /// Take the tree at `guest_path` out of the guest of `guest`: the guest's bind, then the
    /// host's mount in the trees share, then its directory there.
    pub async fn detach_tree(
        &self,
        guest: &GuestHandle,
        guest_path: &str,
    ) -> Result<(), RuntimeError> {
        let failed = failed("detaching a tree from", guest);
        let tree = tree_name(guest_path).map_err(&failed)?;
        let channel = self.live_channel(guest).await?;
        let unbind = Request::UnbindTree {
            tree: tree.clone(),
            path: guest_path.to_owned(),
        };
        let guest_said = call(&channel, &unbind).await;
        // The host's side goes whatever the guest said: the tree leaves the guest with it.
        host_unbind(&self.dir(&guest.name), &tree).map_err(&failed)?;
        guest_said
            .map(drop)
            .map_err(|e| failed(format!("the guest's agent: {e}")))
    }

    /// The host's side of the tree at `guest_path` of sandbox `name` whose VM is gone (no
    /// agent to ask): its mount in the trees share and its directory there.
    pub(super) fn release_tree(&self, name: &str, guest_path: &str) -> Result<(), String> {
        host_unbind(&self.dir(name), &tree_name(guest_path)?)
    }

    /// Run `cmd` in the guest of `guest` chrooted into `root` (a guest path, e.g. a tree
    /// attached with [`Microvm::attach_tree`]).
    pub async fn exec_in_root(
        &self,
        guest: &GuestHandle,
        cmd: &GuestCommand,
        root: &str,
    ) -> Result<ExecHandle, RuntimeError> {
        self.exec_as(guest, cmd, Some(root)).await
    }

    /// Start the trees share's virtiofsd for the VM in `dir` (its directory bound on itself
    /// and made shared first); its socket and tag, a virtio-fs device like the live mounts'.
    pub(super) async fn serve_trees(&self, dir: &VmDir) -> Result<(PathBuf, String), String> {
        let trees = dir.trees();
        share_dir(&trees)?;
        let socket = dir.trees_socket();
        // The trees are the host's (the root file systems containerd unpacked): guest root
        // writes in them as the share's owner, root, never with a setid bit or a device node.
        let cmd = virtiofsd::command(&self.config.virtiofsd, &socket, &trees, (0, 0))?;
        daemons::spawn_helper(
            cmd,
            "virtiofsd (trees)",
            &dir.0.join("trees.log"),
            &dir.trees_pidfile(),
            &socket,
        )
        .await?;
        Ok((socket, TREES_TAG.to_owned()))
    }

    /// Whether VMs get a trees share: only when virtiofsd is there to serve it (without it a
    /// VM boots as before, and attaching a tree to it is refused naming why).
    pub(super) fn trees_available(&self) -> bool {
        let bin = &self.config.virtiofsd;
        if bin.components().count() > 1 {
            return bin.is_file();
        }
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(bin).is_file()))
    }

    /// The open channel to the agent of a running `guest`.
    async fn live_channel(&self, guest: &GuestHandle) -> Result<Arc<Channel>, RuntimeError> {
        if !self.alive(guest) {
            return Err(RuntimeError::NotRunning);
        }
        self.channel(&guest.name, RECONNECT_LIMIT).await
    }
}

/// Mount the trees share in a freshly booted guest, before anything else runs in it.
pub(super) async fn mount_share(channel: &Channel) -> Result<(), String> {
    let mount = Request::Mount {
        tag: TREES_TAG.to_owned(),
        path: TREES_DIR.to_owned(),
    };
    call(channel, &mount)
        .await
        .map(drop)
        .map_err(|e| format!("mounting the trees share at {TREES_DIR}: {e}"))
}

/// Unmount the trees share of the VM in `dir` and every tree in it (lazily: a virtiofsd
/// still holding one lets go when it ends), before the VM's directory is removed: nothing
/// that removes it may reach into a tree. What was unmounted.
pub(super) fn release(dir: &VmDir) -> Option<String> {
    let trees = dir.trees();
    let mut unmounted = false;
    // Bound on itself once; a second time only by a bug, but never leave one behind.
    while rustix::mount::unmount(&trees, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW).is_ok() {
        unmounted = true;
    }
    unmounted.then(|| format!("trees share {}", trees.display()))
}

/// Exec `cmd` as a proto request with `root`.
pub(super) fn request(cmd: &GuestCommand, root: Option<&str>) -> Exec {
    Exec {
        argv: cmd.argv.clone(),
        env: cmd.env.clone(),
        cwd: cmd.cwd.clone(),
        stdin: cmd.stdin,
        tty: cmd.tty,
        user: cmd.user.as_ref().map(|u| svc_guest::proto::User {
            uid: u.uid,
            gid: u.gid,
            groups: u.additional_gids.clone(),
        }),
        root: root.map(str::to_owned),
        caps: cmd.hardening.caps,
        no_new_privs: cmd.hardening.no_new_privs,
        // `Channel::start` asks it of an agent that holds commands.
        held: false,
    }
}

/// The tree's name in the share for `guest_path`: its bytes in hex (one name per path, the
/// same after an svcd restart), checked to be a path a tree may go at.
fn tree_name(guest_path: &str) -> Result<String, String> {
    // Written the one way (no `.`, `..`, doubled or trailing `/`): one name per directory.
    let mut rebuilt = String::new();
    let mut plain = true;
    for c in Path::new(guest_path).components() {
        match c {
            std::path::Component::RootDir => {}
            std::path::Component::Normal(n) => {
                rebuilt.push('/');
                rebuilt.push_str(&n.to_string_lossy());
            }
            _ => plain = false,
        }
    }
    if !plain || rebuilt.is_empty() || rebuilt != guest_path || guest_path.len() > 120 {
        return Err(format!(
            "guest path {guest_path:?}: a tree goes at an absolute path without `.` or `..`, \
             not `/`, of at most 120 bytes"
        ));
    }
    Ok(guest_path.bytes().map(|b| format!("{b:02x}")).collect())
}

/// Bind `host_dir` at `trees/<tree>` of the VM in `dir`.
fn host_bind(dir: &VmDir, host_dir: &Path, tree: &str) -> Result<(), String> {
    if std::fs::canonicalize(host_dir).ok().as_deref() != Some(host_dir) || !host_dir.is_dir() {
        return Err(format!(
            "{}: not a directory named without a symbolic link",
            host_dir.display()
        ));
    }
    let trees = open_trees(dir)?;
    match rustix::fs::mkdirat(&trees, tree, Mode::from_raw_mode(0o755)) {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            return Err(format!(
                "a tree is already attached at that guest path (or the guest made {})",
                dir.trees().join(tree).display()
            ));
        }
        Err(e) => return Err(format!("{}: {e}", dir.trees().join(tree).display())),
    }
    let at = rustix::fs::openat(
        &trees,
        tree,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", dir.trees().join(tree).display()))?;
    let target = fd_path(&at);
    rustix::mount::mount_bind_recursive(host_dir, &target).map_err(|e| {
        let _ = rustix::fs::unlinkat(&trees, tree, rustix::fs::AtFlags::REMOVEDIR);
        format!("binding {} into the trees share: {e}", host_dir.display())
    })
}

/// Unmount `trees/<tree>` of the VM in `dir` (the link the guest may have put there instead
/// is not followed) and remove its directory. Already gone is done.
fn host_unbind(dir: &VmDir, tree: &str) -> Result<(), String> {
    let trees = match open_trees(dir) {
        Ok(t) => t,
        Err(_) if !dir.trees().exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    let at = fd_path(&trees).join(tree);
    match rustix::mount::unmount(&at, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
        // EINVAL: not a mount point (never bound, or already unbound).
        Ok(()) | Err(Errno::INVAL | Errno::NOENT) => {}
        Err(e) => {
            return Err(format!(
                "unmounting {}: {e}",
                dir.trees().join(tree).display()
            ));
        }
    }
    match rustix::fs::unlinkat(&trees, tree, rustix::fs::AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(format!(
            "removing {}: {e}",
            dir.trees().join(tree).display()
        )),
    }
}

/// The VM's trees share directory, opened without following a link.
fn open_trees(dir: &VmDir) -> Result<OwnedFd, String> {
    rustix::fs::openat(
        CWD,
        dir.trees(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("the trees share {}: {e}", dir.trees().display()))
}

/// The path through which the kernel reaches the file `fd` is open on.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Mount the trees share at `trees`: a tiny tmpfs (root's, 0700: the guest writes at its top
/// as root, and may fill no host disk there, only [`SHARE_SIZE`]) made a shared mount, so
/// virtiofsd's slave copy gets each tree bound under it. (Under a shared parent it is shared
/// already, with copies in the parent's peers: those get the trees and their unmounts too.)
fn share_dir(trees: &Path) -> Result<(), String> {
    let said = |e: &dyn std::fmt::Display| format!("the trees share {}: {e}", trees.display());
    std::fs::create_dir_all(trees).map_err(|e| said(&e))?;
    rustix::mount::mount(
        "svc-trees",
        trees,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        SHARE_SIZE,
    )
    .map_err(|e| said(&e))?;
    rustix::mount::mount_change(trees, MountPropagationFlags::SHARED).map_err(|e| said(&e))
}

/// `request` to the agent, within [`TREE_LIMIT`]: what it said on standard error.
async fn call(channel: &Channel, request: &Request) -> Result<String, String> {
    tokio::time::timeout(TREE_LIMIT, channel.call_said(request, b""))
        .await
        .map_err(|_| format!("no answer within {} s", TREE_LIMIT.as_secs()))?
}

/// A tree `operation` on `guest` that failed, saying why.
fn failed(operation: &'static str, guest: &GuestHandle) -> impl Fn(String) -> RuntimeError {
    move |message| RuntimeError::Lifecycle {
        operation,
        name: guest.name.clone(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_named_by_its_guest_path_and_odd_paths_are_refused() {
        assert_eq!(tree_name("/pod/c1").expect("plain"), "2f706f642f6331");
        assert_ne!(
            tree_name("/a_b").expect("plain"),
            tree_name("/a/b").expect("plain")
        );
        for bad in [
            "/",
            "pod/c1",
            "/pod/../etc",
            "/pod/./c1",
            "/pod//c1",
            "/pod/c1/",
            "",
        ] {
            let e = tree_name(bad).expect_err(bad);
            assert!(e.contains("absolute path without"), "{bad}: {e}");
        }
        assert!(tree_name(&format!("/{}", "a".repeat(120))).is_err());
    }
}
