//! A real upstream for the DNS guard tests: dnsmasq on a loopback port, authoritative for the
//! test names, logging every query it receives.

use std::{
    net::{SocketAddr, UdpSocket},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// dnsmasq in the foreground on 127.0.0.1 with no configuration, resolv.conf or hosts file
/// of the machine's, as root, without a pid file: what each test resolver adds its port and
/// records to.
pub const DNSMASQ_ON_LOOPBACK: &[&str] = &[
    "--no-daemon",
    "--conf-file=/dev/null",
    "--no-resolv",
    "--no-hosts",
    "--bind-interfaces",
    "--listen-address=127.0.0.1",
    "--user=root",
    "--pid-file",
];

pub struct Dnsmasq {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
    dir: PathBuf,
}

impl Dnsmasq {
    /// Start dnsmasq on 127.0.0.1 with `records` (name, address) and `cnames` (alias, target),
    /// all with TTL `ttl` seconds.
    pub fn start(records: &[(&str, &str)], cnames: &[(&str, &str)], ttl: u32) -> Self {
        Self::start_in(None, records, cnames, ttl)
    }

    /// The same, inside network namespace `ns` (listening on that namespace's 127.0.0.1).
    pub fn start_in(
        ns: Option<&crate::NetNs>,
        records: &[(&str, &str)],
        cnames: &[(&str, &str)],
        ttl: u32,
    ) -> Self {
        let port = match ns {
            Some(ns) => ns.run(free_udp_port),
            None => free_udp_port(),
        };
        let dir = crate::fresh_dir("svcdns");
        let log = dir.join("queries.log");
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name, "dnsmasq"]);
                c
            }
            None => Command::new("dnsmasq"),
        };
        cmd.args(DNSMASQ_ON_LOOPBACK)
            .arg("--log-queries")
            .arg(format!("--port={port}"))
            .arg(format!("--local-ttl={ttl}"))
            .arg(format!("--log-facility={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (name, addr) in records {
            cmd.arg(format!("--host-record={name},{addr}"));
        }
        for (alias, target) in cnames {
            cmd.arg(format!("--cname={alias},{target}"));
        }
        let child = cmd
            .spawn()
            .expect("dnsmasq (Debian package dnsmasq-base; `cargo xtask setup` installs it)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !log.exists()
            || std::fs::read_to_string(&log).map_or(true, |l| !l.contains("started"))
        {
            assert!(Instant::now() < deadline, "dnsmasq did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            addr,
            log,
            dir,
        }
    }

    /// Every name dnsmasq was asked about.
    pub fn queried_names(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split("query[").nth(1))
            .filter_map(|rest| rest.split_whitespace().nth(1).map(str::to_owned))
            .collect()
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_udp_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr").port()
}
