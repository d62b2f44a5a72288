//! What the agent changes in the guest itself: the network of its one link, the host name and
//! the entropy pool ([`svc_guest::agent::System`]).

use std::net::Ipv4Addr;

use futures::TryStreamExt as _;
use rtnetlink::{LinkUnspec, RouteMessageBuilder, packet_route::address::AddressAttribute};
use svc_guest::proto::Setup;

/// The guest's network interface (the virtio-net device on the sandbox's tap).
const LINK: &str = "eth0";

pub struct Guest;

impl Guest {
    /// At the agent's start, before any host: `lo` up (every guest needs it, and the first
    /// netlink round trip costs most under an emulator: the setup that follows is quicker).
    pub fn prepare() -> Result<(), String> {
        with_netlink(|handle| async move {
            let lo = link_index(&handle, "lo").await?;
            set_up(&handle, lo, "lo").await
        })
    }
}

/// Run `work` with a netlink handle, on a runtime of its own (the agent calls this from a
/// blocking thread).
fn with_netlink<F, Fut>(work: F) -> Result<(), String>
where
    F: FnOnce(rtnetlink::Handle) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| format!("netlink: {e}"))?;
        tokio::spawn(conn);
        work(handle).await
    })
}

/// Bring link `index` (called `name` in messages) up.
async fn set_up(handle: &rtnetlink::Handle, index: u32, name: &str) -> Result<(), String> {
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(|e| format!("bringing {name} up: {e}"))
}

async fn link_index(handle: &rtnetlink::Handle, name: &str) -> Result<u32, String> {
    handle
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await
        .map_err(|e| format!("finding {name}: {e}"))?
        .map(|l| l.header.index)
        .ok_or_else(|| format!("the guest has no {name}"))
}

impl svc_guest::agent::System for Guest {
    fn bind_tree(
        &self,
        tree: &str,
        path: &str,
        binds: &[svc_guest::proto::GuestBind],
    ) -> Result<Vec<String>, String> {
        svc_guest::agent::trees::bind(
            std::path::Path::new(svc_guest::proto::TREES_DIR),
            tree,
            path,
            binds,
        )
    }

    fn unbind_tree(&self, tree: &str, path: &str) -> Result<(), String> {
        svc_guest::agent::trees::unbind(
            std::path::Path::new(svc_guest::proto::TREES_DIR),
            tree,
            path,
        )
    }

    fn mount(&self, tag: &str, path: &str) -> Result<(), String> {
        std::fs::create_dir_all(path).map_err(|e| format!("{path}: {e}"))?;
        rustix::mount::mount(
            tag,
            path,
            "virtiofs",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            None,
        )
        .map_err(|e| format!("mounting virtiofs {tag} at {path}: {e}"))
    }

    fn setup(&self, setup: &Setup) -> Result<(), String> {
        let (address, prefix) = parse_address(&setup.address)?;
        let gateway: Ipv4Addr = setup
            .gateway
            .parse()
            .map_err(|e| format!("gateway {:?}: {e}", setup.gateway))?;
        entropy(&setup.entropy)?;
        if setup.clock_ms > 0 {
            let ts = rustix::time::Timespec {
                tv_sec: i64::try_from(setup.clock_ms / 1000).unwrap_or(i64::MAX),
                tv_nsec: i64::try_from((setup.clock_ms % 1000) * 1_000_000).unwrap_or(0),
            };
            rustix::time::clock_settime(rustix::time::ClockId::Realtime, ts)
                .map_err(|e| format!("setting the clock: {e}"))?;
        }
        rustix::system::sethostname(setup.hostname.as_bytes())
            .map_err(|e| format!("setting the host name: {e}"))?;
        with_netlink(|handle| network(handle, address, prefix, gateway))
    }
}

fn parse_address(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| format!("address {s:?} has no prefix"))?;
    let a = a.parse().map_err(|e| format!("address {s:?}: {e}"))?;
    let p: u8 = p.parse().map_err(|e| format!("prefix of {s:?}: {e}"))?;
    if p > 32 {
        return Err(format!("prefix of {s:?} is over 32"));
    }
    Ok((a, p))
}

/// Mix the host's random bytes into the pool (a write to /dev/urandom), so clones of one
/// snapshot draw different numbers.
fn entropy(hex: &str) -> Result<(), String> {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    std::fs::write("/dev/urandom", bytes).map_err(|e| format!("/dev/urandom: {e}"))
}

/// `lo` up; `eth0` up with exactly `address/prefix`; the default route via `gateway`.
async fn network(
    handle: rtnetlink::Handle,
    address: Ipv4Addr,
    prefix: u8,
    gateway: Ipv4Addr,
) -> Result<(), String> {
    let lo = link_index(&handle, "lo").await?;
    set_up(&handle, lo, "lo").await?;
    let eth = link_index(&handle, LINK).await?;
    // A clone keeps its source's address: remove every other one first.
    let old: Vec<_> = handle
        .address()
        .get()
        .set_link_index_filter(eth)
        .execute()
        .try_collect()
        .await
        .map_err(|e| format!("listing {LINK}'s addresses: {e}"))?;
    for msg in old {
        let same = msg.header.prefix_len == prefix
            && msg
                .attributes
                .iter()
                .any(|a| matches!(a, AddressAttribute::Address(std::net::IpAddr::V4(v)) if *v == address));
        if !same {
            handle
                .address()
                .del(msg)
                .execute()
                .await
                .map_err(|e| format!("removing an old address of {LINK}: {e}"))?;
        }
    }
    handle
        .address()
        .add(eth, address.into(), prefix)
        .replace()
        .execute()
        .await
        .map_err(|e| format!("adding {address}/{prefix} to {LINK}: {e}"))?;
    set_up(&handle, eth, LINK).await?;
    handle
        .route()
        .add(
            RouteMessageBuilder::<Ipv4Addr>::new()
                .gateway(gateway)
                .output_interface(eth)
                .build(),
        )
        .replace()
        .execute()
        .await
        .map_err(|e| format!("the default route via {gateway}: {e}"))
}
