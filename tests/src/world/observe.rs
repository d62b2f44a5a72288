//! What a test reads of svcd's host state: its metrics, its open descriptors, a sandbox's init,
//! the sandbox links on its host and the nftables link set svcd keeps of them.

use std::time::Duration;

use super::{METRICS_PORT, World};

impl World {
    /// Wait (at most `within`) until svcd's warm pool of `backend` holds `n` sandboxes, as its
    /// metrics say.
    pub fn wait_pool(&self, backend: &str, n: u64, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        let series = format!("svc_pool_size{{backend=\"{backend}\"}}");
        while self.metric(&series) != n {
            assert!(
                std::time::Instant::now() < deadline,
                "the {backend} pool did not reach {n} within {} s:\n{}\n{}",
                within.as_secs(),
                self.metrics(),
                self.svcd_log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Sandbox `name`'s init on the host (its pid as `svc sandbox show` says it).
    pub fn init_pid(&self, name: &str) -> u32 {
        let pid = self.show(name)["pid"].as_u64().expect("pid");
        u32::try_from(pid).expect("pid")
    }

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

    /// Each step of the creates of sandboxes named `prefix…` as svcd's log times them (its
    /// `sandbox created … phases=step=1.2ms …` lines), in the order first seen.
    pub fn create_phases(&self, prefix: &str) -> Vec<(String, Vec<Duration>)> {
        let log = self.svcd_log();
        let mut steps: Vec<(String, Vec<Duration>)> = Vec::new();
        let mine = format!("sandbox={prefix}");
        for line in log
            .lines()
            .filter(|l| l.contains("sandbox created") && l.contains(&mine))
        {
            let Some((_, phases)) = line.split_once("phases=") else {
                continue;
            };
            for part in phases.split_whitespace() {
                let Some((step, v)) = part.split_once('=') else {
                    continue;
                };
                let Some(ms) = v.strip_suffix("ms").and_then(|m| m.parse::<f64>().ok()) else {
                    continue;
                };
                let d = Duration::from_secs_f64(ms / 1000.0);
                match steps.iter_mut().find(|(s, _)| s == step) {
                    Some((_, v)) => v.push(d),
                    None => steps.push((step.to_owned(), vec![d])),
                }
            }
        }
        steps
    }

    /// The last of svcd's audit records that `pred` takes, waiting up to 10 s for one to be
    /// written (a relay session's record follows its end on the host, after the guest's
    /// command has returned).
    pub fn audit_record(
        &self,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(r) = self.audit().into_iter().rfind(|r| pred(r)) {
                return Some(r);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
