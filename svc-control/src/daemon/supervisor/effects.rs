//! The kernel effects the supervisor has, behind narrow traits (youki's `Syscall`, aya's
//! `sys/fake.rs`): the fence ([`SandboxFence`]), the nftables table ([`LinkSet`]) and the
//! host's links ([`HostLinks`]). Each trait holds only the calls creation, destruction,
//! adoption and the live changes make; the production impls forward to `dataplane`, and the
//! tests' fakes (`fake`) record the calls and fail on a chosen one.

use std::{net::IpAddr, sync::Mutex};

use ipnet::IpNet;
use svc_ebpf_common::DropEvent;

use crate::{
    dataplane::{self, Carry, Counters, DataplaneError, Fence, Links, Nft, SandboxLink},
    runtime::BoxFuture,
};

/// The fence as the supervisor uses it (shared with the DNS guard: each call locks it).
pub(crate) trait SandboxFence: Send + Sync {
    /// Put `record` on `link` and attach the fence's programs to it, in one hold of the
    /// fence. A record already in force (after a restart) is kept with the entries the guard
    /// wrote, which the guest may still use.
    fn put(&self, record: &SandboxLink, link: &str) -> Result<(), DataplaneError>;
    /// Remove link `ifindex`'s record and entries (its link then drops everything).
    fn remove_sandbox(&self, ifindex: u32) -> Result<(), DataplaneError>;
    /// Take the fence's programs off `link`.
    fn detach(&self, link: &str) -> Result<(), DataplaneError>;
    /// The addresses the guard opened for sandbox `id`.
    fn allow_entries(&self, id: u32) -> Vec<IpAddr>;
    /// Move link `ifindex` to a new generation, each address carried as `carry` says.
    fn regenerate(
        &self,
        ifindex: u32,
        carry: &dyn Fn(IpAddr) -> Carry,
    ) -> Result<u32, DataplaneError>;
    /// The drop counters.
    fn counters(&self) -> Result<Counters, DataplaneError>;
    /// The drop events waiting.
    fn drain_events(&self) -> Vec<DropEvent>;
    /// Remove expired entries.
    fn collect_expired(&self) -> Result<usize, DataplaneError>;
}

/// The nftables table's set of sandbox links.
pub(crate) trait LinkSet: Send + Sync {
    /// Write the whole table with `links`.
    fn apply(&self, links: &[String]) -> Result<(), DataplaneError>;
    /// Write the link set alone.
    fn set_links(&self, links: &[String]) -> Result<(), DataplaneError>;
    /// Add (`add`) or remove one link of the set.
    fn change_link(&self, link: &str, add: bool) -> Result<(), DataplaneError>;
}

/// The host's links, as a sandbox's link is made, plugged in and removed.
pub(crate) trait HostLinks: Send + Sync {
    /// The index of link `name`, if it exists.
    fn ifindex<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<u32>, DataplaneError>>;
    /// Delete link `ifindex`.
    fn delete(&self, ifindex: u32) -> BoxFuture<'_, Result<(), DataplaneError>>;
    /// Make tap `name`; its index.
    fn create_tap<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u32, DataplaneError>>;
    /// Make veth pair `host`–`peer`; the host end's index.
    fn create_veth<'a>(
        &'a self,
        host: &'a str,
        peer: &'a str,
    ) -> BoxFuture<'a, Result<u32, DataplaneError>>;
    /// Give link `ifindex` address `addr`.
    fn add_address(&self, ifindex: u32, addr: IpNet) -> BoxFuture<'_, Result<(), DataplaneError>>;
    /// Bring link `ifindex` up.
    fn up(&self, ifindex: u32) -> BoxFuture<'_, Result<(), DataplaneError>>;
    /// Move link `ifindex` into the network namespace open as `netns`.
    fn move_to_netns<'a>(
        &'a self,
        ifindex: u32,
        netns: &'a std::fs::File,
    ) -> BoxFuture<'a, Result<(), DataplaneError>>;
    /// Turn IPv6 off on link `name`.
    fn disable_ipv6(&self, name: &str) -> Result<(), DataplaneError>;
    /// Configure the guest end `peer` inside `netns` as `name` (blocks).
    fn configure_guest(
        &self,
        netns: &std::path::Path,
        peer: &str,
        name: &str,
        addr: IpNet,
        gateway: IpAddr,
    ) -> Result<(), DataplaneError>;
}

fn lock(fence: &Mutex<Fence>) -> std::sync::MutexGuard<'_, Fence> {
    fence
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SandboxFence for Mutex<Fence> {
    fn put(&self, record: &SandboxLink, link: &str) -> Result<(), DataplaneError> {
        let mut fence = lock(self);
        if !fence.record_in_force(record) {
            fence.install_sandbox(record, &[], &[])?;
        }
        fence.attach(link)
    }
    fn remove_sandbox(&self, ifindex: u32) -> Result<(), DataplaneError> {
        lock(self).remove_sandbox(ifindex)
    }
    fn detach(&self, link: &str) -> Result<(), DataplaneError> {
        lock(self).detach(link)
    }
    fn allow_entries(&self, id: u32) -> Vec<IpAddr> {
        lock(self)
            .allow_entries(id)
            .into_iter()
            .map(|(a, _)| a)
            .collect()
    }
    fn regenerate(
        &self,
        ifindex: u32,
        carry: &dyn Fn(IpAddr) -> Carry,
    ) -> Result<u32, DataplaneError> {
        lock(self).regenerate(ifindex, carry)
    }
    fn counters(&self) -> Result<Counters, DataplaneError> {
        lock(self).counters()
    }
    fn drain_events(&self) -> Vec<DropEvent> {
        lock(self).drain_events()
    }
    fn collect_expired(&self) -> Result<usize, DataplaneError> {
        lock(self).collect_expired()
    }
}

impl LinkSet for Nft {
    fn apply(&self, links: &[String]) -> Result<(), DataplaneError> {
        Nft::apply(self, links)
    }
    fn set_links(&self, links: &[String]) -> Result<(), DataplaneError> {
        Nft::set_links(self, links)
    }
    fn change_link(&self, link: &str, add: bool) -> Result<(), DataplaneError> {
        Nft::change_link(self, link, add)
    }
}

impl HostLinks for Links {
    fn ifindex<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<u32>, DataplaneError>> {
        Box::pin(Links::ifindex(self, name))
    }
    fn delete(&self, ifindex: u32) -> BoxFuture<'_, Result<(), DataplaneError>> {
        Box::pin(Links::delete(self, ifindex))
    }
    fn create_tap<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u32, DataplaneError>> {
        Box::pin(Links::create_tap(self, name))
    }
    fn create_veth<'a>(
        &'a self,
        host: &'a str,
        peer: &'a str,
    ) -> BoxFuture<'a, Result<u32, DataplaneError>> {
        Box::pin(Links::create_veth(self, host, peer))
    }
    fn add_address(&self, ifindex: u32, addr: IpNet) -> BoxFuture<'_, Result<(), DataplaneError>> {
        Box::pin(Links::add_address(self, ifindex, addr))
    }
    fn up(&self, ifindex: u32) -> BoxFuture<'_, Result<(), DataplaneError>> {
        Box::pin(Links::up(self, ifindex))
    }
    fn move_to_netns<'a>(
        &'a self,
        ifindex: u32,
        netns: &'a std::fs::File,
    ) -> BoxFuture<'a, Result<(), DataplaneError>> {
        Box::pin(Links::move_to_netns(self, ifindex, netns))
    }
    fn disable_ipv6(&self, name: &str) -> Result<(), DataplaneError> {
        dataplane::disable_ipv6(name)
    }
    fn configure_guest(
        &self,
        netns: &std::path::Path,
        peer: &str,
        name: &str,
        addr: IpNet,
        gateway: IpAddr,
    ) -> Result<(), DataplaneError> {
        dataplane::configure_guest(netns, peer, name, addr, gateway)
    }
}
