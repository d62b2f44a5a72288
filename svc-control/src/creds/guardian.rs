//! The coding agent's credential guardian: keeps the OAuth token in
//! `{agent_home}/.credentials.json` fresh on the host while sandboxes share that directory.
//!
//! Each check reads the file; when the token expires within the lead time (30 minutes by
//! default) it takes an exclusive advisory lock on the sidecar `.credentials.json.lock`,
//! reads the file again (another guardian may have refreshed it while this one waited: then it
//! stops there), asks the agent platform's token endpoint for a new token with the refresh
//! grant, and writes the file back atomically (a temporary file in the same directory, fsync,
//! rename, fsync of the directory), with the owner and mode the file had and every field it
//! does not own kept as it was.
//!
//! The directory is shared read-write with guests, so everything in it is hostile input: the
//! file is opened relative to the directory without following symlinks, must be a regular
//! file of at most [`MAX_FILE`] bytes, and a malformed one is reported, never "repaired".
//! Time comes from a [`Clock`], so tests move it without sleeping.

use std::{
    io::{Read as _, Write as _},
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use nix::{
    fcntl::{FlockArg, OFlag},
    sys::stat::{Mode, SFlag},
};
use serde_json::Value;

use super::grant::ms;
use zeroize::Zeroizing;

/// The credentials file's name in the agent's home.
pub const FILE: &str = ".credentials.json";
/// The sidecar lock file guardians serialise on.
pub const LOCK: &str = ".credentials.json.lock";
/// Largest credentials file read (a real one is under 1 KiB).
pub const MAX_FILE: u64 = 1 << 20;
/// How often a guardian looks.
pub const DEFAULT_POLL: Duration = Duration::from_secs(60);
/// How long before expiry a guardian refreshes.
pub const DEFAULT_LEAD: Duration = Duration::from_secs(30 * 60);
/// The key of the OAuth object in the credentials file, by default.
pub use crate::config::host::DEFAULT_ENTRY;

/// Where "now" comes from.
pub trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A fixed instant (tests, `svcd guardian --now`).
#[derive(Debug, Clone, Copy)]
pub struct FixedClock(pub SystemTime);

impl Clock for FixedClock {
    fn now(&self) -> SystemTime {
        self.0
    }
}

pub use super::grant::{Refreshed, Refresher};

/// One guardian's settings.
#[derive(Clone)]
pub struct Guardian {
    /// The agent's home on the host.
    pub home: PathBuf,
    /// The key of the OAuth object (`accessToken`, `refreshToken`, `expiresAt` in ms).
    pub entry: String,
    pub lead: Duration,
    pub refresher: Arc<dyn Refresher>,
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Guardian {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guardian")
            .field("home", &self.home)
            .field("entry", &self.entry)
            .field("lead", &self.lead)
            .finish_non_exhaustive()
    }
}

/// What one check did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The token is good for longer than the lead time.
    Fresh { expires_at_ms: u64 },
    /// This guardian refreshed it.
    Refreshed { expires_at_ms: u64 },
    /// Another guardian refreshed it while this one waited for the lock.
    RefreshedByAnother { expires_at_ms: u64 },
    /// No credentials file (the agent has not logged in on the host).
    NoFile,
    /// The refresh failed; the file is unchanged.
    Failed { reason: String },
}

/// The OAuth fields of the credentials file.
struct Token {
    refresh: Option<Zeroizing<String>>,
    expires_at_ms: u64,
}

fn token(doc: &Value, entry: &str) -> Result<Token, String> {
    let o = doc
        .get(entry)
        .and_then(Value::as_object)
        .ok_or_else(|| format!("{FILE} has no \"{entry}\" object"))?;
    let expires_at_ms = o
        .get("expiresAt")
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("{FILE}: \"{entry}.expiresAt\" is not a number of milliseconds"))?;
    let refresh = o
        .get("refreshToken")
        .and_then(Value::as_str)
        .map(|s| Zeroizing::new(s.to_owned()));
    Ok(Token {
        refresh,
        expires_at_ms,
    })
}

/// The file as read: its bytes, parsed, and who owns it.
struct Read {
    doc: Value,
    uid: u32,
    gid: u32,
    mode: u32,
}

fn open_dir(home: &Path) -> Result<OwnedFd, String> {
    nix::fcntl::open(
        home,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", home.display()))
}

/// Read the credentials file relative to `dir`, refusing anything but a small regular file.
fn read(dir: &impl AsFd) -> Result<Option<Read>, String> {
    let fd = match nix::fcntl::openat(
        dir,
        FILE,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) => {
            return Err(format!("{FILE} is a symbolic link: refused"));
        }
        Err(e) => return Err(format!("{FILE}: {e}")),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| format!("{FILE}: {e}"))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(format!("{FILE} is not a regular file: refused"));
    }
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size > MAX_FILE {
        return Err(format!("{FILE} is {size} bytes (over {MAX_FILE}): refused"));
    }
    let mut bytes = Zeroizing::new(Vec::new());
    std::fs::File::from(fd)
        .take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{FILE}: {e}"))?;
    let doc: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{FILE} is not JSON: {e}"))?;
    Ok(Some(Read {
        doc,
        uid: st.st_uid,
        gid: st.st_gid,
        mode: st.st_mode & 0o7777,
    }))
}

/// Replace the credentials file with `doc`: temporary file, fsync, rename, fsync of the
/// directory; owner and mode as the old file's.
fn write(dir: &impl AsFd, doc: &Value, like: &Read) -> Result<(), String> {
    let mut suffix = [0u8; 6];
    getrandom::fill(&mut suffix).map_err(|e| format!("randomness: {e}"))?;
    let tmp = format!(
        ".credentials.json.svc-{}-{}",
        std::process::id(),
        suffix
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let fd = nix::fcntl::openat(
        dir,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| format!("{tmp}: {e}"))?;
    let result = (|| {
        nix::unistd::fchown(
            &fd,
            Some(nix::unistd::Uid::from_raw(like.uid)),
            Some(nix::unistd::Gid::from_raw(like.gid)),
        )
        .map_err(|e| format!("{tmp}: chown: {e}"))?;
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(like.mode))
            .map_err(|e| format!("{tmp}: chmod: {e}"))?;
        let mut bytes = Zeroizing::new(
            serde_json::to_vec_pretty(doc).map_err(|e| format!("serialising {FILE}: {e}"))?,
        );
        bytes.push(b'\n');
        let mut f = std::fs::File::from(fd);
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("{tmp}: {e}"))?;
        nix::fcntl::renameat(dir, tmp.as_str(), dir, FILE)
            .map_err(|e| format!("renaming {tmp} to {FILE}: {e}"))?;
        nix::unistd::fsync(dir).map_err(|e| format!("syncing the directory: {e}"))
    })();
    if result.is_err() {
        let _ = nix::unistd::unlinkat(dir, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    result
}

/// Take the sidecar lock (blocking): held until the returned value drops.
fn lock(dir: &impl AsFd) -> Result<nix::fcntl::Flock<OwnedFd>, String> {
    let fd = nix::fcntl::openat(
        dir,
        LOCK,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ELOOP => format!("{LOCK} is a symbolic link: refused"),
        e => format!("{LOCK}: {e}"),
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| format!("{LOCK}: {e}"))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(format!("{LOCK} is not a regular file: refused"));
    }
    nix::fcntl::Flock::lock(fd, FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {LOCK}: {e}"))
}

impl Guardian {
    /// One check (blocking file work runs on tokio's blocking pool).
    pub async fn check(&self) -> Outcome {
        match self.check_inner().await {
            Ok(o) => o,
            Err(reason) => Outcome::Failed { reason },
        }
    }

    async fn check_inner(&self) -> Result<Outcome, String> {
        let home = self.home.clone();
        let entry = self.entry.clone();
        let lead_ms = u64::try_from(self.lead.as_millis()).unwrap_or(u64::MAX);
        let now = ms(self.clock.now());
        // First look, without the lock: most checks end here.
        let first = {
            let home = home.clone();
            blocking(move || {
                let dir = open_dir(&home)?;
                read(&dir)
            })
            .await?
        };
        let Some(first) = first else {
            return Ok(Outcome::NoFile);
        };
        let t = token(&first.doc, &entry)?;
        if t.expires_at_ms > now.saturating_add(lead_ms) {
            return Ok(Outcome::Fresh {
                expires_at_ms: t.expires_at_ms,
            });
        }
        // Due: serialise with the other guardians, then look again.
        let (dir, held, again) = blocking(move || {
            let dir = open_dir(&home)?;
            let held = lock(&dir)?;
            let again = read(&dir)?;
            Ok((dir, held, again))
        })
        .await?;
        let Some(again) = again else {
            return Ok(Outcome::NoFile);
        };
        let t = token(&again.doc, &entry)?;
        if t.expires_at_ms > now.saturating_add(lead_ms) {
            return Ok(Outcome::RefreshedByAnother {
                expires_at_ms: t.expires_at_ms,
            });
        }
        let Some(refresh_token) = t.refresh else {
            return Err(format!(
                "{FILE}: \"{entry}.refreshToken\" is missing: log in again on the host"
            ));
        };
        let new = self.refresher.refresh(&refresh_token).await?;
        let expires_at_ms = ms(self.clock.now())
            .saturating_add(u64::try_from(new.expires_in.as_millis()).unwrap_or(u64::MAX));
        let mut doc = again.doc.clone();
        if let Some(o) = doc.get_mut(&entry).and_then(Value::as_object_mut) {
            o.insert(
                "accessToken".into(),
                Value::String(new.access_token.as_str().to_owned()),
            );
            if let Some(r) = &new.refresh_token {
                o.insert("refreshToken".into(), Value::String(r.as_str().to_owned()));
            }
            o.insert("expiresAt".into(), Value::from(expires_at_ms));
        }
        blocking(move || {
            let r = write(&dir, &doc, &again);
            drop(held);
            r
        })
        .await?;
        Ok(Outcome::Refreshed { expires_at_ms })
    }

    /// Check every `poll` until the task is dropped; each outcome goes to `report`.
    pub async fn run(self, poll: Duration, report: impl Fn(&Outcome) + Send) {
        loop {
            let o = self.check().await;
            report(&o);
            tokio::time::sleep(poll).await;
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("the guardian's file work: {e}"))?
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicU32, Ordering},
        time::UNIX_EPOCH,
    };

    use super::*;

    struct Counting(AtomicU32);

    impl Refresher for Counting {
        fn refresh<'a>(
            &'a self,
            refresh_token: &'a str,
        ) -> std::pin::Pin<Box<dyn Future<Output = Result<Refreshed, String>> + Send + 'a>>
        {
            Box::pin(async move {
                let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
                if refresh_token == "bad" {
                    return Err("token endpoint answered 400: invalid_grant".into());
                }
                Ok(Refreshed {
                    access_token: Zeroizing::new(format!("access-{n}")),
                    refresh_token: Some(Zeroizing::new(format!("refresh-{n}"))),
                    expires_in: Duration::from_secs(8 * 3600),
                })
            })
        }
    }

    const T0: u64 = 1_900_000_000_000;

    fn at(ms: u64) -> Arc<dyn Clock> {
        Arc::new(FixedClock(UNIX_EPOCH + Duration::from_millis(ms)))
    }

    fn guardian(home: &Path, now: u64, r: Arc<Counting>) -> Guardian {
        Guardian {
            home: home.to_owned(),
            entry: DEFAULT_ENTRY.into(),
            lead: DEFAULT_LEAD,
            refresher: r,
            clock: at(now),
        }
    }

    fn home(expires: u64, refresh: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "svc-guardian-{}-{}",
            std::process::id(),
            T0.wrapping_add(expires).wrapping_add(refresh.len() as u64)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(
            d.join(FILE),
            format!(
                r#"{{"claudeAiOauth":{{"accessToken":"old","refreshToken":"{refresh}","expiresAt":{expires},"scopes":["a"],"subscriptionType":"max"}},"other":{{"kept":true}}}}"#
            ),
        )
        .expect("file");
        d
    }

    #[tokio::test]
    async fn a_token_far_from_expiry_is_left_alone_and_a_due_one_is_refreshed_keeping_other_fields()
    {
        let r = Arc::new(Counting(AtomicU32::new(0)));
        let expires = T0 + 31 * 60 * 1000;
        let d = home(expires, "rt-1");
        let o = guardian(&d, T0, r.clone()).check().await;
        assert_eq!(
            o,
            Outcome::Fresh {
                expires_at_ms: expires
            }
        );
        assert_eq!(r.0.load(Ordering::SeqCst), 0);
        // Two minutes later it is within the lead time.
        let now = T0 + 2 * 60 * 1000;
        let o = guardian(&d, now, r.clone()).check().await;
        let want = now + 8 * 3600 * 1000;
        assert_eq!(
            o,
            Outcome::Refreshed {
                expires_at_ms: want
            }
        );
        let doc: Value =
            serde_json::from_slice(&std::fs::read(d.join(FILE)).expect("read")).expect("json");
        assert_eq!(doc["claudeAiOauth"]["accessToken"], "access-1");
        assert_eq!(doc["claudeAiOauth"]["refreshToken"], "refresh-1");
        assert_eq!(doc["claudeAiOauth"]["expiresAt"], want);
        assert_eq!(doc["claudeAiOauth"]["scopes"][0], "a");
        assert_eq!(doc["claudeAiOauth"]["subscriptionType"], "max");
        assert_eq!(doc["other"]["kept"], true);
        let left: Vec<_> = std::fs::read_dir(&d)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("svc-"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn a_failed_refresh_leaves_the_file_as_it_was() {
        let r = Arc::new(Counting(AtomicU32::new(0)));
        let d = home(T0, "bad");
        let before = std::fs::read(d.join(FILE)).expect("read");
        let o = guardian(&d, T0, r).check().await;
        assert_eq!(
            o,
            Outcome::Failed {
                reason: "token endpoint answered 400: invalid_grant".into()
            }
        );
        assert_eq!(std::fs::read(d.join(FILE)).expect("read"), before);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn hostile_files_are_refused_not_followed() {
        let r = Arc::new(Counting(AtomicU32::new(0)));
        let d = home(T0, "rt-x");
        let target = d.join("elsewhere.json");
        std::fs::rename(d.join(FILE), &target).expect("move");
        std::os::unix::fs::symlink(&target, d.join(FILE)).expect("symlink");
        let o = guardian(&d, T0, r.clone()).check().await;
        assert_eq!(
            o,
            Outcome::Failed {
                reason: format!("{FILE} is a symbolic link: refused")
            }
        );
        std::fs::remove_file(d.join(FILE)).expect("rm");
        std::fs::create_dir(d.join(FILE)).expect("a directory in its place");
        let o = guardian(&d, T0, r.clone()).check().await;
        assert!(
            matches!(&o, Outcome::Failed { reason } if reason.contains("not a regular file")),
            "{o:?}"
        );
        std::fs::remove_dir(d.join(FILE)).expect("rmdir");
        std::fs::write(d.join(FILE), "{not json").expect("garbage");
        let o = guardian(&d, T0, r.clone()).check().await;
        assert!(
            matches!(&o, Outcome::Failed { reason } if reason.contains("is not JSON")),
            "{o:?}"
        );
        std::fs::write(d.join(FILE), r#"{"claudeAiOauth":{"expiresAt":1}}"#).expect("no rt");
        let o = guardian(&d, T0, r.clone()).check().await;
        assert!(
            matches!(&o, Outcome::Failed { reason } if reason.contains("refreshToken\" is missing")),
            "{o:?}"
        );
        // The lock file planted as a symlink to a host file is not followed either.
        std::fs::write(
            d.join(FILE),
            r#"{"claudeAiOauth":{"refreshToken":"r","expiresAt":1}}"#,
        )
        .expect("due");
        std::fs::remove_file(d.join(LOCK)).expect("the lock file the last check made");
        std::os::unix::fs::symlink(&target, d.join(LOCK)).expect("lock symlink");
        let o = guardian(&d, T0, r.clone()).check().await;
        assert_eq!(
            o,
            Outcome::Failed {
                reason: format!("{LOCK} is a symbolic link: refused")
            }
        );
        assert_eq!(
            r.0.load(Ordering::SeqCst),
            0,
            "nothing hostile reached the endpoint"
        );
        std::fs::remove_file(d.join(FILE)).expect("rm");
        assert_eq!(guardian(&d, T0, r).check().await, Outcome::NoFile);
        let _ = std::fs::remove_dir_all(&d);
    }
}
