//! A test world in network namespaces: a guest behind a veth whose host end carries the fence,
//! a host namespace that routes, and an outside namespace with the servers. Nothing leaves
//! these namespaces: the outside world is the documentation ranges inside `outside`.
//!
//! ```text
//!  guest (ns)                host (ns)                              outside (ns)
//!  g0 10.213.N.2/30  <->  h0 10.213.N.1/30   ho 192.0.2.1/24  <->  oh 192.0.2.10/24 …
//!     fd53:N::2/64            fd53:N::1/64      2001:db8::1/64         2001:db8::10/64 …
//! ```

use std::net::{Ipv4Addr, Ipv6Addr};

use svc_control::{
    dataplane::{AllowEntry, Fence, SandboxLink},
    policy::{destination, mode::EgressMode},
};

use crate::{NetNs, PinDir, unique, veth};

/// Addresses the outside namespace answers on.
pub const ALLOWED_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
pub const OTHER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
pub const CIDR_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
pub const ALLOWED_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);
pub const OTHER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x20);

#[derive(Debug)]
pub struct Topology {
    pub guest: NetNs,
    pub host: NetNs,
    pub outside: NetNs,
    /// The host end of the guest link (in `host`).
    pub host_link: String,
    pub guest_v4: Ipv4Addr,
    pub gateway_v4: Ipv4Addr,
    pub guest_v6: Ipv6Addr,
    pub gateway_v6: Ipv6Addr,
    /// The guest's link-local address (read after the link comes up).
    pub guest_v6_ll: Ipv6Addr,
}

impl Topology {
    /// Build the world; `n` (1–250) picks the guest subnet.
    pub fn new(n: u8) -> Self {
        let (guest, host, outside) = (NetNs::new(), NetNs::new(), NetNs::new());
        for ns in [&guest, &host, &outside] {
            ns.sysctl(&[
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            ]);
        }
        let host_link = unique("svh");
        veth(&guest, GUEST_LINK, &host, &host_link);
        veth(&outside, "oh", &host, "ho");
        let guest_v4 = Ipv4Addr::new(10, 213, n, 2);
        let gateway_v4 = Ipv4Addr::new(10, 213, n, 1);
        let guest_v6: Ipv6Addr = format!("fd53:{n:x}::2").parse().expect("v6");
        let gateway_v6: Ipv6Addr = format!("fd53:{n:x}::1").parse().expect("v6");
        address_guest(&guest, (guest_v4, gateway_v4), (guest_v6, gateway_v6));
        address_host(&host, &host_link, gateway_v4, gateway_v6);
        address_outside(&outside);
        host.sysctl(&["net.ipv4.ip_forward=1"]);
        host.sysctl(&["net.ipv6.conf.all.forwarding=1"]);
        wait_v6(&guest, &outside, gateway_v6);
        let guest_v6_ll = link_local(&guest, GUEST_LINK);
        Self {
            guest,
            host,
            outside,
            host_link,
            guest_v4,
            gateway_v4,
            guest_v6,
            gateway_v6,
            guest_v6_ll,
        }
    }

    /// The host as policy sees it: the host end's and the host's outside addresses are the
    /// host's own, the test pools (10.213/16, fd53::/16) are sandbox pools.
    pub fn host_network(&self) -> svc_control::policy::destination::HostNetwork {
        svc_control::policy::destination::HostNetwork {
            host_addresses: vec![
                self.gateway_v4.into(),
                self.gateway_v6.into(),
                Ipv4Addr::new(192, 0, 2, 1).into(),
            ],
            sandbox_pools: vec![
                "10.213.0.0/16".parse().expect("net"),
                "fd53::/16".parse().expect("net"),
            ],
            allow_cidrs: vec![],
            svcd_ports: vec![],
        }
    }

    /// The fence's record of sandbox `sandbox` on the host end of this topology's guest link
    /// (both address families), in `mode`, with (`proxy`) or without the proxy's redirect.
    pub fn sandbox_link(&self, sandbox: u32, mode: EgressMode, proxy: bool) -> SandboxLink {
        SandboxLink {
            ifindex: self.host_ifindex(),
            sandbox,
            mode,
            proxy,
            guest_v4: self.guest_v4,
            gateway_v4: self.gateway_v4,
            guest_v6: Some(self.guest_v6),
            guest_v6_link_local: Some(self.guest_v6_ll),
            gateway_v6: Some(self.gateway_v6),
        }
    }

    /// A fence pinned in `pins`: loaded, its destination classes set from
    /// [`Topology::host_network`], `link` installed with `entries`, and attached to the host
    /// end in the host namespace.
    pub fn fence_up(&self, pins: &PinDir, link: &SandboxLink, entries: &[AllowEntry]) -> Fence {
        let mut fence = Fence::load(&pins.path).expect("load");
        let (deny, ok) = destination::fence_cidrs(&self.host_network());
        fence.set_destination_classes(&deny, &ok).expect("classes");
        fence.install_sandbox(link, entries, &[]).expect("install");
        let name = self.host_link.clone();
        self.host.run(|| fence.attach(&name)).expect("attach");
        fence
    }

    /// ifindex of the host end, in the host namespace.
    pub fn host_ifindex(&self) -> u32 {
        let name = self.host_link.clone();
        self.host
            .run(move || nix::net::if_::if_nametoindex(name.as_str()).expect("ifindex"))
    }
}

/// The guest's end of its link, in `guest`.
const GUEST_LINK: &str = "g0";

/// The guest's addresses (`(own, gateway)` for each family) on its link, up, routed through
/// the host end.
fn address_guest(guest: &NetNs, v4: (Ipv4Addr, Ipv4Addr), v6: (Ipv6Addr, Ipv6Addr)) {
    let g = GUEST_LINK;
    guest.ip(&["addr", "add", &format!("{}/30", v4.0), "dev", g]);
    guest.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{}/64", v6.0),
        "dev",
        g,
        "nodad",
    ]);
    guest.ip(&["link", "set", g, "up"]);
    guest.ip(&["route", "add", "default", "via", &v4.1.to_string()]);
    guest.ip(&["-6", "route", "add", "default", "via", &v6.1.to_string()]);
}

/// The host's gateway addresses on the guest link `hl`, and its outside addresses on `ho`.
fn address_host(host: &NetNs, hl: &str, gateway_v4: Ipv4Addr, gateway_v6: Ipv6Addr) {
    host.ip(&["addr", "add", &format!("{gateway_v4}/30"), "dev", hl]);
    host.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{gateway_v6}/64"),
        "dev",
        hl,
        "nodad",
    ]);
    host.ip(&["link", "set", hl, "up"]);
    host.ip(&["addr", "add", "192.0.2.1/24", "dev", "ho"]);
    host.ip(&["addr", "add", "198.51.100.1/24", "dev", "ho"]);
    host.ip(&["-6", "addr", "add", "2001:db8::1/64", "dev", "ho", "nodad"]);
    host.ip(&["link", "set", "ho", "up"]);
}

/// The outside world's addresses on `oh`, and its routes back to the guest pools.
fn address_outside(outside: &NetNs) {
    for a in ["192.0.2.10/24", "192.0.2.20/24", "198.51.100.7/24"] {
        outside.ip(&["addr", "add", a, "dev", "oh"]);
    }
    for a in ["2001:db8::10/64", "2001:db8::20/64"] {
        outside.ip(&["-6", "addr", "add", a, "dev", "oh", "nodad"]);
    }
    outside.ip(&["link", "set", "oh", "up"]);
    outside.ip(&["route", "add", "10.213.0.0/16", "via", "192.0.2.1"]);
    outside.ip(&["-6", "route", "add", "fd53::/16", "via", "2001:db8::1"]);
}

/// IPv6 needs a moment after link-up before neighbour discovery works on a new veth: wait
/// (up to eight seconds) until the guest reaches its gateway and the outside the host.
fn wait_v6(guest: &NetNs, outside: &NetNs, gateway_v6: Ipv6Addr) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    let v6_ready = |ns: &NetNs, to: &str| {
        ns.exec("ping", &["-6", "-c", "1", "-W", "1", to])
            .status
            .success()
    };
    while !(v6_ready(guest, &gateway_v6.to_string()) && v6_ready(outside, "2001:db8::1")) {
        assert!(
            std::time::Instant::now() < deadline,
            "IPv6 did not come up in the test topology"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The link-local address of `dev` in `ns` (unspecified when it has none).
fn link_local(ns: &NetNs, dev: &str) -> Ipv6Addr {
    let out = ns.ip(&["-6", "-o", "addr", "show", "dev", dev, "scope", "link"]);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or(Ipv6Addr::UNSPECIFIED)
}
