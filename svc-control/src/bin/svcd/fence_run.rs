//! `svcd fence run`: own the fence of one link from a spec file, and stream its drop events to
//! an audit log until stopped. Everything stays pinned when it exits or is killed: the fence
//! stays closed, and the next run re-adopts it without a gap.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use ipnet::IpNet;
use serde::Deserialize;
use svc_control::{
    audit::{AuditRecord, AuditSink as _, JsonlFile},
    config::MAX_FILE_BYTES,
    dataplane::{AllowEntry, CidrEntry, Fence, Nft, NftConfig, PortRule, SandboxLink, clock},
    policy::{destination::HostNetwork, destination::fence_cidrs, mode::EgressMode},
};

/// The spec file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub link: String,
    pub sandbox: u32,
    pub mode: Mode,
    #[serde(default)]
    pub proxy: bool,
    pub guest_v4: Ipv4Addr,
    pub gateway_v4: Ipv4Addr,
    pub guest_v6: Option<Ipv6Addr>,
    pub guest_v6_link_local: Option<Ipv6Addr>,
    pub gateway_v6: Option<Ipv6Addr>,
    #[serde(default)]
    pub allow: Vec<SpecAllow>,
    #[serde(default)]
    pub cidrs: Vec<SpecCidr>,
    #[serde(default)]
    pub host_addresses: Vec<IpAddr>,
    #[serde(default)]
    pub sandbox_pools: Vec<IpNet>,
    #[serde(default)]
    pub allow_cidrs: Vec<IpNet>,
    /// Apply the nftables table too.
    pub nft: Option<SpecNft>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Curated,
    AllowAll,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecAllow {
    pub addr: IpAddr,
    #[serde(default)]
    pub tcp: Vec<u16>,
    #[serde(default)]
    pub udp: Vec<u16>,
    #[serde(default)]
    pub icmp: bool,
    /// Seconds; absent: never expires.
    pub ttl: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecCidr {
    pub net: IpNet,
    #[serde(default)]
    pub tcp: Vec<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecNft {
    pub table: String,
    pub guard_port: u16,
    pub proxy_port: u16,
}

pub fn run(spec_path: &Path, pin_dir: &Path, audit: &Path) -> anyhow::Result<()> {
    let text = svc_control::config::loader::read_optional(spec_path)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_context(|| format!("{} not found", spec_path.display()))?;
    anyhow::ensure!(text.len() as u64 <= MAX_FILE_BYTES, "spec too large");
    let spec: Spec =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", spec_path.display()))?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let sink = JsonlFile::open(audit, 64 * 1024 * 1024)?;

    let mut fence = Fence::load(pin_dir)?;
    let net = HostNetwork {
        host_addresses: spec.host_addresses.clone(),
        sandbox_pools: spec.sandbox_pools.clone(),
        allow_cidrs: spec.allow_cidrs.clone(),
        svcd_ports: Vec::new(),
    };
    let (deny, operator_allow) = fence_cidrs(&net);
    fence.set_destination_classes(&deny, &operator_allow)?;
    if let Some(n) = &spec.nft {
        let mut never = spec.sandbox_pools.clone();
        never.extend(spec.host_addresses.iter().map(|a| IpNet::from(*a)));
        Nft::new(NftConfig {
            table: n.table.clone(),
            guard_port: n.guard_port,
            proxy_port: n.proxy_port,
            never,
            deny: deny.clone(),
            operator_allow: operator_allow.clone(),
        })
        .apply(std::slice::from_ref(&spec.link))?;
    }
    let ifindex = nix::net::if_::if_nametoindex(spec.link.as_str())
        .with_context(|| format!("no link {} in this network namespace", spec.link))?;
    let link = SandboxLink {
        ifindex,
        sandbox: spec.sandbox,
        mode: match spec.mode {
            Mode::Curated => EgressMode::Curated,
            Mode::AllowAll => EgressMode::AllowAll,
        },
        proxy: spec.proxy,
        guest_v4: spec.guest_v4,
        gateway_v4: spec.gateway_v4,
        guest_v6: spec.guest_v6,
        guest_v6_link_local: spec.guest_v6_link_local,
        gateway_v6: spec.gateway_v6,
    };
    let entries: Vec<AllowEntry> = spec
        .allow
        .iter()
        .map(|a| AllowEntry {
            addr: a.addr,
            rules: a
                .tcp
                .iter()
                .map(|p| PortRule::Tcp(*p))
                .chain(a.udp.iter().map(|p| PortRule::Udp(*p)))
                .chain(a.icmp.then_some(PortRule::Icmp))
                .collect(),
            host_id: 0,
            ttl: a.ttl.map(Duration::from_secs),
            idle: Duration::from_secs(30),
        })
        .collect();
    let cidrs: Vec<CidrEntry> = spec
        .cidrs
        .iter()
        .map(|c| CidrEntry {
            net: c.net,
            rules: c.tcp.iter().map(|p| PortRule::Tcp(*p)).collect(),
            host_id: 0,
        })
        .collect();
    let generation = fence.install_sandbox(&link, &entries, &cidrs)?;
    fence.attach(&spec.link)?;
    eprintln!(
        "svcd: fence on {} (ifindex {ifindex}, sandbox {}, generation {generation}); drop events to {}",
        spec.link,
        spec.sandbox,
        audit.display()
    );

    while !stop.load(Ordering::Relaxed) {
        let events = fence.drain_events();
        if !events.is_empty() {
            let (mono, wall) = (clock::monotonic_ns(), SystemTime::now());
            for e in &events {
                sink.record(&AuditRecord::from_drop(e, mono, wall))?;
            }
        }
        let _ = fence.collect_expired();
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("svcd: stopping; the fence stays pinned and closed");
    Ok(())
}
