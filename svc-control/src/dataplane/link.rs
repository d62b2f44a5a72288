//! Links, addresses and routes over rtnetlink: the host end of each guest link, moving the peer
//! into the guest's network namespace, addressing both ends.
//!
//! A [`Links`] handle talks to the network namespace of the thread that created it, so svcd
//! (and tests) create one per namespace they manage.

use std::{net::IpAddr, os::fd::AsRawFd as _};

use futures::TryStreamExt as _;
use ipnet::IpNet;
use rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};

use super::error::DataplaneError;

/// A netlink handle bound to one network namespace.
#[derive(Debug, Clone)]
pub struct Links {
    handle: rtnetlink::Handle,
}

impl Links {
    /// Open a netlink connection in the current thread's network namespace. Needs a tokio
    /// runtime (the connection runs as a task on it).
    pub fn connect() -> Result<Self, DataplaneError> {
        let (conn, handle, _) = rtnetlink::new_connection()
            .map_err(|e| netlink("opening a netlink socket", e.to_string()))?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Create a veth pair `host` ↔ `peer`; returns the ifindex of `host`.
    pub async fn create_veth(&self, host: &str, peer: &str) -> Result<u32, DataplaneError> {
        self.handle
            .link()
            .add(LinkVeth::new(host, peer).build())
            .execute()
            .await
            .map_err(|e| netlink(&format!("creating veth {host} ↔ {peer}"), e.to_string()))?;
        self.ifindex(host).await?.ok_or_else(|| {
            netlink(
                &format!("finding {host} after creating it"),
                "not found".into(),
            )
        })
    }

    /// Move link `ifindex` into the network namespace open as `netns` (a `/run/netns/NAME` file
    /// or `/proc/PID/ns/net`).
    pub async fn move_to_netns(
        &self,
        ifindex: u32,
        netns: &std::fs::File,
    ) -> Result<(), DataplaneError> {
        self.handle
            .link()
            .set(
                LinkUnspec::new_with_index(ifindex)
                    .setns_by_fd(netns.as_raw_fd())
                    .build(),
            )
            .execute()
            .await
            .map_err(|e| {
                netlink(
                    &format!("moving link {ifindex} to another namespace"),
                    e.to_string(),
                )
            })
    }

    /// Rename link `ifindex`.
    pub async fn rename(&self, ifindex: u32, name: &str) -> Result<(), DataplaneError> {
        self.handle
            .link()
            .set(
                LinkUnspec::new_with_index(ifindex)
                    .name(name.to_owned())
                    .build(),
            )
            .execute()
            .await
            .map_err(|e| netlink(&format!("renaming link {ifindex} to {name}"), e.to_string()))
    }

    /// Bring link `ifindex` up.
    pub async fn up(&self, ifindex: u32) -> Result<(), DataplaneError> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(ifindex).up().build())
            .execute()
            .await
            .map_err(|e| netlink(&format!("bringing link {ifindex} up"), e.to_string()))
    }

    /// Add an address (with its prefix) to link `ifindex`.
    pub async fn add_address(&self, ifindex: u32, addr: IpNet) -> Result<(), DataplaneError> {
        self.handle
            .address()
            .add(ifindex, addr.addr(), addr.prefix_len())
            .execute()
            .await
            .map_err(|e| netlink(&format!("adding {addr} to link {ifindex}"), e.to_string()))
    }

    /// Add a route to `dest` via `gateway` (or on-link) out of `ifindex`.
    pub async fn add_route(
        &self,
        dest: IpNet,
        gateway: Option<IpAddr>,
        ifindex: u32,
    ) -> Result<(), DataplaneError> {
        let what = format!("adding a route to {dest}");
        let msg = match (dest, gateway) {
            (IpNet::V4(d), Some(IpAddr::V4(g))) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .gateway(g)
                .output_interface(ifindex)
                .build(),
            (IpNet::V4(d), None) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .output_interface(ifindex)
                .build(),
            (IpNet::V6(d), Some(IpAddr::V6(g))) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .gateway(g)
                .output_interface(ifindex)
                .build(),
            (IpNet::V6(d), None) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .output_interface(ifindex)
                .build(),
            _ => {
                return Err(netlink(
                    &what,
                    "the gateway's family differs from the destination's".into(),
                ));
            }
        };
        self.handle
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(|e| netlink(&what, e.to_string()))
    }

    /// Add a policy-routing rule: packets with firewall mark `fw_mark` (IPv4 when `v6` is
    /// false) look up routing table `table`, at `priority`.
    pub async fn add_mark_rule(
        &self,
        fw_mark: u32,
        table: u32,
        priority: u32,
        v6: bool,
    ) -> Result<(), DataplaneError> {
        let what = format!("adding a rule fwmark {fw_mark:#x} → table {table}");
        let req = self
            .handle
            .rule()
            .add()
            .fw_mark(fw_mark)
            .table_id(table)
            .priority(priority)
            .action(rtnetlink::packet_route::rule::RuleAction::ToTable);
        let result = if v6 {
            req.v6().execute().await
        } else {
            req.v4().execute().await
        };
        result.map_err(|e| netlink(&what, e.to_string()))
    }

    /// The firewall marks that have a rule in this namespace (IPv4 or IPv6).
    pub async fn mark_rules(&self, v6: bool) -> Result<Vec<(u32, u32)>, DataplaneError> {
        use rtnetlink::packet_route::rule::RuleAttribute;
        let version = if v6 {
            rtnetlink::IpVersion::V6
        } else {
            rtnetlink::IpVersion::V4
        };
        let rules: Vec<_> = self
            .handle
            .rule()
            .get(version)
            .execute()
            .try_collect()
            .await
            .map_err(|e| netlink("listing rules", e.to_string()))?;
        Ok(rules
            .iter()
            .filter_map(|r| {
                let mark = r.attributes.iter().find_map(|a| match a {
                    RuleAttribute::FwMark(m) => Some(*m),
                    _ => None,
                })?;
                let table = r.attributes.iter().find_map(|a| match a {
                    RuleAttribute::Table(t) => Some(*t),
                    _ => None,
                })?;
                Some((mark, table))
            })
            .collect())
    }

    /// ifindex of a link by name in this namespace.
    pub async fn ifindex(&self, name: &str) -> Result<Option<u32>, DataplaneError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(Some(msg.header.index)),
            Ok(None) => Ok(None),
            // ENODEV: no such link.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(netlink(&format!("looking up link {name}"), e.to_string())),
        }
    }

    /// Create a persistent tap `name` (for a VM monitor to open); its ifindex. Netlink cannot
    /// make a tap, and the ioctl would be the only unsafe code here: `ip tuntap` does it.
    pub async fn create_tap(&self, name: &str) -> Result<u32, DataplaneError> {
        let out = tokio::process::Command::new("ip")
            .args(["tuntap", "add", "dev", name, "mode", "tap"])
            .output()
            .await
            .map_err(|e| netlink(&format!("creating tap {name}"), format!("running ip: {e}")))?;
        if !out.status.success() {
            return Err(netlink(
                &format!("creating tap {name}"),
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        self.ifindex(name).await?.ok_or_else(|| {
            netlink(
                &format!("finding {name} after creating it"),
                "not found".into(),
            )
        })
    }

    /// Delete link `ifindex` (a veth takes its peer with it).
    pub async fn delete(&self, ifindex: u32) -> Result<(), DataplaneError> {
        self.handle
            .link()
            .del(ifindex)
            .execute()
            .await
            .map_err(|e| netlink(&format!("deleting link {ifindex}"), e.to_string()))
    }
}

/// Configure the guest end of a link inside another network namespace (`netns`: a
/// `/proc/PID/ns/net` or `/run/netns/NAME` file): rename `peer` to `name`, turn IPv6 off on it,
/// give it `addr`, bring
/// it and `lo` up, and route everything via `gateway`. Blocks; runs on a thread of its own that
/// enters the namespace, so the caller's namespace is untouched.
pub fn configure_guest(
    netns: &std::path::Path,
    peer: &str,
    name: &str,
    addr: IpNet,
    gateway: IpAddr,
) -> Result<(), DataplaneError> {
    let ns = std::fs::File::open(netns)
        .map_err(|e| netlink(&format!("opening {}", netns.display()), e.to_string()))?;
    let (peer, name) = (peer.to_owned(), name.to_owned());
    std::thread::spawn(move || -> Result<(), DataplaneError> {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| netlink("entering the guest's network namespace", e.to_string()))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| netlink("starting a runtime", e.to_string()))?;
        rt.block_on(async move {
            let links = Links::connect()?;
            let index = links.ifindex(&peer).await?.ok_or_else(|| {
                netlink(&format!("finding {peer} in the guest"), "not found".into())
            })?;
            links.rename(index, &name).await?;
            // The guest cannot turn it back on (no CAP_NET_ADMIN, /proc/sys read-only).
            disable_ipv6(&name)?;
            links.add_address(index, addr).await?;
            links.up(index).await?;
            if let Some(lo) = links.ifindex("lo").await? {
                links.up(lo).await?;
            }
            let default: IpNet = match gateway {
                IpAddr::V4(_) => IpNet::V4(ipnet::Ipv4Net::default()),
                IpAddr::V6(_) => IpNet::V6(ipnet::Ipv6Net::default()),
            };
            links.add_route(default, Some(gateway), index).await
        })
    })
    .join()
    .map_err(|_| netlink("configuring the guest link", "the thread panicked".into()))?
}

/// Turn IPv6 off on link `name` of this thread's network namespace. Sandbox links are IPv4
/// only: without IPv6 neither end sends router solicitations or MLD reports, which the fence
/// would otherwise drop and audit as spoofed or optioned packets.
pub fn disable_ipv6(name: &str) -> Result<(), DataplaneError> {
    let knob = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    match std::fs::write(&knob, "1") {
        Ok(()) => Ok(()),
        // A kernel without IPv6 has no such file: nothing to turn off.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(netlink(&format!("writing {knob}"), e.to_string())),
    }
}

fn netlink(operation: &str, message: String) -> DataplaneError {
    DataplaneError::Netlink {
        operation: operation.to_owned(),
        message,
    }
}
