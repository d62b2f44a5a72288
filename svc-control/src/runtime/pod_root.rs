//! What a pod container's root file system is given of its guest, on every backend (the
//! container backend's `container::ctr_root`, the microvm's `microvm::ctr_root`): where it goes
//! in the guest, the guest's places bound over the same places inside it, each sandbox's lock
//! over its roots and how a detached root's files are removed outside it.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::{
    proxy::guest_trust,
    runtime::{GuestHandle, RuntimeError},
};

/// A pod container's root attached into its guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootIn {
    /// Where the guest sees it.
    pub guest_path: String,
    /// The guest's places ([`guest_binds`]) not bound inside it, each with why (a link in the
    /// image where one goes, …).
    pub skipped: Vec<String>,
}

/// The guest path of container `ctr`'s root.
pub fn guest_path(ctr: &str) -> String {
    format!("{}/{ctr}", svc_guest::enter::ROOTS_DIR)
}

/// The guest's paths bound into each container's tree, relative to both roots: (path, a
/// directory). The guest's `/proc`, `/dev` and `/sys`, its relay directory and the files svcd
/// gives every guest (resolv.conf, hosts, the CA bundle): a command in the container reaches
/// the same resolver, proxy CA and devices as the sandbox's own.
pub fn guest_binds() -> [(&'static str, bool); 8] {
    [
        ("proc", true),
        ("dev", true),
        ("sys", true),
        ("run/svc", true),
        ("etc/resolv.conf", false),
        ("etc/hosts", false),
        (trimmed(guest_trust::GUEST_BUNDLE), false),
        (trimmed(guest_trust::GUEST_CA_FILE), false),
    ]
}

/// An `operation` on container `ctr`'s root file system in `guest` that failed, saying why.
pub(crate) fn lifecycle<'a>(
    operation: &'static str,
    guest: &'a GuestHandle,
    ctr: &'a str,
) -> impl Fn(String) -> RuntimeError + 'a {
    move |message| RuntimeError::Lifecycle {
        operation,
        name: guest.name.clone(),
        message: format!("container {ctr}: {message}"),
    }
}

const fn trimmed(p: &'static str) -> &'static str {
    match p.as_bytes() {
        [b'/', ..] => p.split_at(1).1,
        _ => p,
    }
}

/// Each sandbox's lock over its pod containers' roots: one attach or detach at a time in a
/// sandbox, none waiting on another sandbox's (a guest that stalls its own, or filled its
/// container's writable layer with files to remove, holds no other's). The slow removal of
/// a detached root's files runs after the lock is let go ([`set_aside`], [`remove_set_aside`]).
#[derive(Debug, Default)]
pub(crate) struct RootLocks(std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl RootLocks {
    /// Hold sandbox `name`'s lock (the locks nobody holds or waits for are dropped).
    pub(crate) async fn lock(&self, name: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let one = {
            let mut locks = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            locks.retain(|n, l| n == name || Arc::strong_count(l) > 1);
            locks.entry(name.to_owned()).or_default().clone()
        };
        one.lock_owned().await
    }
}

/// The prefix of a root's files set aside for removal: no container id starts with a dot
/// (`policy::ctr_root::check_id`), so none is ever taken for one.
const ASIDE: &str = ".gone-";

/// Move `path` (a detached root's files) aside in its own directory, under a name of this
/// svcd's ([`epoch`]) no attach looks at: quick (a rename), done under the sandbox's lock;
/// its removal ([`remove_set_aside`]) runs after. Where it went; nothing there: none.
pub(crate) fn set_aside(path: &Path) -> Result<Option<PathBuf>, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let Some(parent) = path.parent() else {
        return Err(format!(
            "{}: no directory to set it aside in",
            path.display()
        ));
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let aside = parent.join(format!("{ASIDE}{}-{n}", epoch()));
    match std::fs::rename(path, &aside) {
        Ok(()) => Ok(Some(aside)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!(
            "setting {} aside as {}: {e}",
            path.display(),
            aside.display()
        )),
    }
}

/// Remove `aside` (from [`set_aside`]), then whatever an earlier svcd set aside in the same
/// directory and never removed (it ended mid-removal): each claimed first by a rename of
/// its own, so two sweeps never remove the same tree. Failures are logged: a sandbox's
/// destroy removes its whole directory.
pub(crate) async fn remove_set_aside(aside: Option<PathBuf>, within: &Path) {
    if let Some(a) = aside {
        remove(&a).await;
    }
    for left in leftovers(within) {
        if let Ok(Some(mine)) = set_aside(&left) {
            remove(&mine).await;
        }
    }
}

/// Whether `name` is a root's files set aside for removal (not a container's).
pub(crate) fn is_set_aside(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().starts_with(ASIDE.as_bytes())
}

/// What an earlier svcd set aside in `within` (another epoch's names).
fn leftovers(within: &Path) -> Vec<PathBuf> {
    let mine = format!("{ASIDE}{}-", epoch());
    let Ok(entries) = std::fs::read_dir(within) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            is_set_aside(&name) && !name.to_string_lossy().starts_with(&mine)
        })
        .map(|e| e.path())
        .collect()
}

async fn remove(path: &Path) {
    if let Err(e) = crate::runtime::container::rootfs::remove_tree(path).await {
        tracing::warn!(error = %e, "removing a detached container root's files");
    }
}

/// This svcd's name for what it sets aside: its pid and start time, never another svcd's
/// (an svcd that ended mid-removal left another's, which the next sweep takes).
fn epoch() -> &'static str {
    static EPOCH: OnceLock<String> = OnceLock::new();
    EPOCH.get_or_init(|| {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}.{since:x}", std::process::id())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_set_aside_root_and_an_earlier_svcds_leftovers_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let within = dir.path();
        let layer = within.join("c1");
        std::fs::create_dir_all(layer.join("upper/deep")).expect("layer");
        std::fs::write(layer.join("upper/deep/f"), "x").expect("file");
        // An earlier svcd's (another epoch), and another container still attached.
        let leftover = within.join(format!("{ASIDE}1.0-7"));
        std::fs::create_dir_all(leftover.join("upper")).expect("leftover");
        std::fs::create_dir_all(within.join("c2/upper")).expect("c2");

        let aside = set_aside(&layer).expect("set aside").expect("it was there");
        assert!(!layer.exists(), "still at its own name");
        assert!(is_set_aside(aside.file_name().expect("name")));
        remove_set_aside(Some(aside.clone()), within).await;
        assert!(!aside.exists() && !leftover.exists());
        assert!(
            within.join("c2/upper").is_dir(),
            "another container's layer"
        );
        assert_eq!(set_aside(&layer).expect("nothing there"), None);
    }

    #[tokio::test]
    async fn one_sandboxs_roots_lock_holds_no_other_sandboxs() {
        let locks = RootLocks::default();
        let held = locks.lock("a").await;
        let other = tokio::time::timeout(std::time::Duration::from_secs(1), locks.lock("b"))
            .await
            .expect("b's lock while a's is held");
        let same =
            tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("a")).await;
        assert!(same.is_err(), "a's lock taken twice");
        drop((held, other));
        let again = tokio::time::timeout(std::time::Duration::from_secs(1), locks.lock("a")).await;
        assert!(again.is_ok(), "a's lock once let go");
    }
}
