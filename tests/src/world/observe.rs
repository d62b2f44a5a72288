//! What a test reads of svcd's host state: its metrics, its open descriptors, the sandbox links
//! on its host and the nftables link set svcd keeps of them.

use super::{METRICS_PORT, World};

impl World {
    /// svcd's /metrics, scraped from inside its namespace.
    pub fn metrics(&self) -> String {
        let out = self.host.exec(
            "curl",
            &["-sS", &format!("http://127.0.0.1:{METRICS_PORT}/metrics")],
        );
        assert!(out.status.success(), "scraping /metrics: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The value of svcd's metric line starting `series ` (0 when absent), whole.
    pub fn metric(&self, series: &str) -> u64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    /// How many descriptors svcd holds open now.
    pub fn svcd_fds(&self) -> usize {
        let pid = self.svcd_pid().expect("svcd runs");
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("svcd's descriptors")
            .count()
    }

    /// The sandbox links (`svc<id>`) on svcd's host, sorted.
    pub fn sandbox_links(&self) -> Vec<String> {
        let out = self.host.exec("ip", &["-o", "link", "show"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut links: Vec<String> = text
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n))
            .filter(|n| {
                n.strip_prefix("svc").is_some_and(|rest| {
                    !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())
                })
            })
            .map(str::to_owned)
            .collect();
        links.sort();
        links
    }

    /// The elements of svcd's nftables link set (`inet svc links`), sorted.
    pub fn nft_link_set(&self) -> Vec<String> {
        let out = self
            .host
            .exec("nft", &["-j", "list", "set", "inet", "svc", "links"]);
        assert!(out.status.success(), "nft list set: {out:?}");
        svc_control::dataplane::nft_set_elements(&out.stdout).expect("nft's JSON")
    }
}
