//! Fakes of the supervisor's kernel effects and of a backend, for unit tests (aya's
//! `sys/fake.rs`): each records its calls in one shared log, in order, keeps the state a real
//! one would (fence records, links, the nftables set, running guests) and fails the chosen
//! call of a chosen step (the state store's fake, `fake_store`, logs and fails in the same log).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex},
};

use ipnet::IpNet;
use svc_ebpf_common::DropEvent;

use super::effects::{HostLinks, LinkSet, SandboxFence};
use crate::{
    dataplane::{Carry, Counters, DataplaneError, SandboxLink},
    runtime::{
        Backend, BoxFuture, Description, ExecHandle, GuestCommand, GuestHandle, GuestLinks,
        GuestService, GuestSpec, HostEnd, Kind, RuntimeError, Started,
    },
};

/// The calls made, in order, and the steps to fail (each once).
#[derive(Debug, Default)]
pub(super) struct Calls {
    log: Mutex<Vec<String>>,
    /// Each step to fail, and how many of its calls to come that is (1: the next).
    fail: Mutex<Vec<(&'static str, usize)>>,
}

impl Calls {
    /// Fail the next call of `step` (`"fence.put"`, `"links.create_veth"`, …).
    pub(super) fn fail_on(&self, step: &'static str) {
        self.fail_nth(step, 1);
    }

    /// Fail the `n`th call of `step` from now (1: the next).
    pub(super) fn fail_nth(&self, step: &'static str, n: usize) {
        lock(&self.fail).push((step, n.max(1)));
    }

    /// The steps called so far (without their arguments).
    pub(super) fn steps(&self) -> Vec<String> {
        lock(&self.log)
            .iter()
            .map(|c| c.split(' ').next().unwrap_or_default().to_owned())
            .collect()
    }

    /// Forget the calls so far.
    pub(super) fn clear(&self) {
        lock(&self.log).clear();
    }

    /// Record `step` with `detail`; whether it is the one to fail.
    pub(super) fn call(&self, step: &'static str, detail: &str) -> bool {
        lock(&self.log).push(format!("{step} {detail}"));
        let mut fail = lock(&self.fail);
        let Some(at) = fail.iter().position(|(s, _)| *s == step) else {
            return false;
        };
        fail[at].1 -= 1;
        if fail[at].1 > 0 {
            return false;
        }
        fail.remove(at);
        true
    }

    fn check(&self, step: &'static str, detail: &str) -> Result<(), DataplaneError> {
        if self.call(step, detail) {
            return Err(DataplaneError::Netlink {
                operation: step.to_owned(),
                message: "failed on purpose".to_owned(),
            });
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fence: records by link index, links with its programs attached.
#[derive(Debug)]
pub(super) struct FakeFence {
    calls: Arc<Calls>,
    pub(super) records: Mutex<BTreeMap<u32, SandboxLink>>,
    pub(super) attached: Mutex<BTreeSet<String>>,
}

impl FakeFence {
    pub(super) fn new(calls: Arc<Calls>) -> Self {
        Self {
            calls,
            records: Mutex::default(),
            attached: Mutex::default(),
        }
    }
}

impl SandboxFence for FakeFence {
    fn put(&self, record: &SandboxLink, link: &str) -> Result<(), DataplaneError> {
        self.calls.check("fence.put", link)?;
        lock(&self.records).insert(record.ifindex, record.clone());
        lock(&self.attached).insert(link.to_owned());
        Ok(())
    }
    fn remove_sandbox(&self, ifindex: u32) -> Result<(), DataplaneError> {
        self.calls
            .check("fence.remove_sandbox", &ifindex.to_string())?;
        lock(&self.records).remove(&ifindex);
        Ok(())
    }
    fn detach(&self, link: &str) -> Result<(), DataplaneError> {
        self.calls.check("fence.detach", link)?;
        if lock(&self.attached).remove(link) {
            Ok(())
        } else {
            Err(DataplaneError::NotAttached {
                link: link.to_owned(),
                path: std::path::PathBuf::new(),
            })
        }
    }
    fn allow_entries(&self, id: u32) -> Vec<IpAddr> {
        self.calls.call("fence.allow_entries", &id.to_string());
        Vec::new()
    }
    fn regenerate(
        &self,
        ifindex: u32,
        _carry: &dyn Fn(IpAddr) -> Carry,
    ) -> Result<u32, DataplaneError> {
        self.calls.check("fence.regenerate", &ifindex.to_string())?;
        Ok(1)
    }
    fn counters(&self) -> Result<Counters, DataplaneError> {
        Ok(Counters {
            reasons: Vec::new(),
        })
    }
    fn drain_events(&self) -> Vec<DropEvent> {
        Vec::new()
    }
    fn collect_expired(&self) -> Result<usize, DataplaneError> {
        Ok(0)
    }
}

/// The nftables table's link set.
#[derive(Debug)]
pub(super) struct FakeNft {
    calls: Arc<Calls>,
    pub(super) links: Mutex<BTreeSet<String>>,
}

impl FakeNft {
    pub(super) fn new(calls: Arc<Calls>) -> Self {
        Self {
            calls,
            links: Mutex::default(),
        }
    }
}

impl LinkSet for FakeNft {
    fn apply(&self, links: &[String]) -> Result<(), DataplaneError> {
        self.calls.check("nft.apply", &links.join(","))?;
        *lock(&self.links) = links.iter().cloned().collect();
        Ok(())
    }
    fn set_links(&self, links: &[String]) -> Result<(), DataplaneError> {
        self.calls.check("nft.set_links", &links.join(","))?;
        *lock(&self.links) = links.iter().cloned().collect();
        Ok(())
    }
    fn change_link(&self, link: &str, add: bool) -> Result<(), DataplaneError> {
        self.calls.check("nft.change_link", link)?;
        let mut links = lock(&self.links);
        if add {
            links.insert(link.to_owned());
        } else {
            links.remove(link);
        }
        Ok(())
    }
}

/// The host's links by name (a veth's peer leaves when it moves into a guest).
#[derive(Debug)]
pub(super) struct FakeLinks {
    calls: Arc<Calls>,
    pub(super) by_name: Mutex<BTreeMap<String, u32>>,
    next: Mutex<u32>,
}

impl FakeLinks {
    pub(super) fn new(calls: Arc<Calls>) -> Self {
        Self {
            calls,
            by_name: Mutex::default(),
            next: Mutex::new(100),
        }
    }

    fn add(&self, name: &str) -> u32 {
        let mut next = lock(&self.next);
        *next += 1;
        lock(&self.by_name).insert(name.to_owned(), *next);
        *next
    }
}

impl HostLinks for FakeLinks {
    fn ifindex<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<u32>, DataplaneError>> {
        Box::pin(async move {
            self.calls.check("links.ifindex", name)?;
            Ok(lock(&self.by_name).get(name).copied())
        })
    }
    fn delete(&self, ifindex: u32) -> BoxFuture<'_, Result<(), DataplaneError>> {
        Box::pin(async move {
            self.calls.check("links.delete", &ifindex.to_string())?;
            let mut names = lock(&self.by_name);
            let gone: Vec<String> = names
                .iter()
                .filter(|(_, i)| **i == ifindex)
                .map(|(n, _)| n.clone())
                .collect();
            for n in gone {
                // A veth goes with its peer.
                names.remove(&format!("{n}g"));
                names.remove(&n);
            }
            Ok(())
        })
    }
    fn create_tap<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u32, DataplaneError>> {
        Box::pin(async move {
            self.calls.check("links.create_tap", name)?;
            Ok(self.add(name))
        })
    }
    fn create_veth<'a>(
        &'a self,
        host: &'a str,
        peer: &'a str,
    ) -> BoxFuture<'a, Result<u32, DataplaneError>> {
        Box::pin(async move {
            self.calls.check("links.create_veth", host)?;
            self.add(peer);
            Ok(self.add(host))
        })
    }
    fn add_address(&self, ifindex: u32, addr: IpNet) -> BoxFuture<'_, Result<(), DataplaneError>> {
        Box::pin(async move {
            self.calls
                .check("links.add_address", &format!("{ifindex} {addr}"))
        })
    }
    fn up(&self, ifindex: u32) -> BoxFuture<'_, Result<(), DataplaneError>> {
        Box::pin(async move { self.calls.check("links.up", &ifindex.to_string()) })
    }
    fn move_to_netns<'a>(
        &'a self,
        ifindex: u32,
        _netns: &'a std::fs::File,
    ) -> BoxFuture<'a, Result<(), DataplaneError>> {
        Box::pin(async move {
            self.calls
                .check("links.move_to_netns", &ifindex.to_string())?;
            lock(&self.by_name).retain(|_, i| *i != ifindex);
            Ok(())
        })
    }
    fn disable_ipv6(&self, name: &str) -> Result<(), DataplaneError> {
        self.calls.check("links.disable_ipv6", name)
    }
    fn configure_guest(
        &self,
        _netns: &std::path::Path,
        peer: &str,
        name: &str,
        addr: IpNet,
        _gateway: IpAddr,
    ) -> Result<(), DataplaneError> {
        self.calls
            .check("links.configure_guest", &format!("{peer} {name} {addr}"))
    }
}

/// A test-only backend, added through the registry like any other: its guest is a name in a
/// set (nothing starts); it plugs its veth in through [`GuestLinks`] as the container backend
/// does.
#[derive(Debug)]
pub(super) struct FakeBackend {
    calls: Arc<Calls>,
    pub(super) running: Mutex<BTreeSet<String>>,
    /// The guests paused (and not resumed): what `paused` says, across a restart.
    paused: Mutex<BTreeSet<String>>,
}

/// The fake backend's kind.
pub(super) const FAKE: Kind = Kind {
    name: "fake",
    aliases: &["pretend"],
    about: "A test-only backend.",
};

impl FakeBackend {
    pub(super) fn new(calls: Arc<Calls>) -> Self {
        Self {
            calls,
            running: Mutex::default(),
            paused: Mutex::default(),
        }
    }

    fn fails(&self, step: &'static str, name: &str) -> Result<(), RuntimeError> {
        if self.calls.call(step, name) {
            return Err(RuntimeError::Start {
                name: name.to_owned(),
                message: format!("{step} failed on purpose"),
            });
        }
        Ok(())
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        FAKE.name
    }
    fn describe(&self) -> Description {
        Description {
            kind: FAKE,
            summary: "a test backend that starts nothing",
            isolates_with: "nothing",
            can_fork: false,
            read_only_subpaths: true,
            share_into_running: false,
        }
    }
    fn start<'a>(
        &'a self,
        spec: &'a GuestSpec,
        links: &'a dyn GuestLinks,
    ) -> BoxFuture<'a, Result<Started, RuntimeError>> {
        Box::pin(async move {
            let ifindex = links.prepare(HostEnd::Veth).await?;
            self.fails("guest.start", &spec.name)?;
            let netns = spec.dir.join("netns");
            std::fs::write(&netns, "").map_err(|e| RuntimeError::Start {
                name: spec.name.clone(),
                message: e.to_string(),
            })?;
            links.attach(&netns).await?;
            lock(&self.running).insert(spec.name.clone());
            Ok(Started {
                guest: GuestHandle {
                    name: spec.name.clone(),
                    pid: std::process::id(),
                    start: 0,
                },
                ifindex,
            })
        })
    }
    fn alive(&self, guest: &GuestHandle) -> bool {
        lock(&self.running).contains(&guest.name)
    }
    fn stop<'a>(
        &'a self,
        name: &'a str,
        _dir: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            self.calls.call("guest.stop", name);
            Ok(if lock(&self.running).remove(name) {
                vec![format!("guest {name}")]
            } else {
                Vec::new()
            })
        })
    }
    fn serve_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        _dir: &'a std::path::Path,
        _service: GuestService,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.fails("guest.serve", &guest.name) })
    }
    fn exec<'a>(
        &'a self,
        _guest: &'a GuestHandle,
        _cmd: &'a GuestCommand,
    ) -> BoxFuture<'a, Result<ExecHandle, RuntimeError>> {
        Box::pin(async move { Err(RuntimeError::NotRunning) })
    }
    fn pause<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.calls.call("guest.pause", &guest.name);
            lock(&self.paused).insert(guest.name.clone());
            Ok(())
        })
    }
    fn resume<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.calls.call("guest.resume", &guest.name);
            lock(&self.paused).remove(&guest.name);
            Ok(())
        })
    }
    fn paused<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async move { Ok(lock(&self.paused).contains(&guest.name)) })
    }
}
