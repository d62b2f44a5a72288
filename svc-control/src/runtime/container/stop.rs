//! Stopping a container guest and removing what svcd made for it: its relay socket, the
//! container (its init killed, then `runc delete`), its shared directories' attachments, an
//! old overlay in the host's namespace, and its disk.

use std::{path::Path, time::Duration};

use super::{Container, disk, rootfs, shared::detach_shared};
use crate::runtime::{RuntimeError, gone_within, start_time};

impl Container {
    /// Stop the guest of sandbox `name` in `dir`; what was removed.
    pub(super) async fn stop_guest(
        &self,
        name: &str,
        dir: &Path,
    ) -> Result<Vec<String>, RuntimeError> {
        let err = |message: String| RuntimeError::Stop {
            name: name.to_owned(),
            message,
        };
        let mut removed = Vec::new();
        // The init's channel ends with it (its commands are ended with the container).
        self.inits().remove(name);
        self.reattached().remove(name);
        if let Some(relay) = self.relays().remove(name) {
            relay.abort();
            removed.push("git SSH relay socket".to_owned());
        }
        if self.delete(name, dir).await.map_err(err)? {
            removed.push("container (processes, cgroup)".to_owned());
        }
        detach_shared(dir);
        // Only a sandbox made by an earlier svcd has its overlay in the host's namespace.
        if rootfs::Layers::under(dir).unmount().map_err(err)? {
            removed.push("root file system overlay".to_owned());
        }
        if let Some(what) = disk::release(dir).await.map_err(err)? {
            removed.push(what);
        }
        // A channel to its init made meanwhile (a hand-over begun at a resume) goes too.
        self.inits().remove(name);
        self.reattached().remove(name);
        Ok(removed)
    }

    /// End the container of sandbox `name` (in `dir`) and delete it; whether there was one.
    async fn delete(&self, name: &str, dir: &Path) -> Result<bool, String> {
        // `runc delete --force` waits a fixed 100 ms after its SIGKILL before it looks
        // again; killing the init (the kernel then kills the whole pid namespace) and
        // watching it go is quicker. `delete --force` stays the fallback for anything odd.
        let init = read_init(dir).filter(|(p, s)| start_time(*p) == Some(*s));
        // A frozen guest's processes take no signal until thawed (cgroup v1's freezer): one
        // still paused here (a crash interrupted its destroy) is thawed first.
        if let Some((pid, _)) = init
            && self.frozen(pid).unwrap_or(false)
            && let Err(e) = self.run(&["resume", name]).await
        {
            tracing::warn!(sandbox = %name, error = %e, "thawing the paused guest to stop it");
        }
        let mut forced = true;
        if let Some((pid, start)) = init
            && self.run(&["kill", name, "KILL"]).await.is_ok()
        {
            forced = !gone_within(pid, start, Duration::from_secs(2)).await;
        }
        let delete: &[&str] = if forced {
            &["delete", "--force", name]
        } else {
            &["delete", name]
        };
        match self.run(delete).await {
            Ok(()) => Ok(true),
            Err(e) if e.contains("does not exist") || e.contains("not exist") => Ok(false),
            Err(e) if !forced => match self.run(&["delete", "--force", name]).await {
                Ok(()) => Ok(true),
                Err(again) => Err(format!("runc delete: {e}; --force: {again}")),
            },
            Err(e) => Err(format!("runc delete: {e}")),
        }
    }
}

/// The guest's init as `create` recorded it: (pid, start time).
fn read_init(dir: &Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(dir.join("init.id")).ok()?;
    let (pid, start) = text.trim().split_once(' ')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}
