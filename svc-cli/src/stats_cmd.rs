//! `svc sandbox stats NAME [--json]`: what a sandbox uses now, from its cgroups, as a table
//! like `docker stats --no-stream` (CPU time rather than a percentage: one reading).

use std::process::ExitCode;

use http::Method;
use svc_control::api::SandboxStats;

use crate::client::Client;

pub async fn run(client: &Client, name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let s: SandboxStats = client
        .call::<(), _>(Method::GET, &format!("/v1/sandboxes/{name}/stats"), None)
        .await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        for line in table(&s) {
            outln!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The header and the sandbox's line.
fn table(s: &SandboxStats) -> [String; 2] {
    let mem = format!(
        "{} / {}",
        bytes(s.memory_bytes),
        s.memory_limit_bytes
            .map_or_else(|| "no limit".into(), bytes)
    );
    let mem_pct = s.memory_limit_bytes.filter(|l| *l > 0).map_or_else(
        || "-".to_owned(),
        |l| format!("{:.2}%", s.memory_bytes as f64 * 100.0 / l as f64),
    );
    let pids = match (s.pids_current, s.pids_limit) {
        (Some(n), Some(l)) => format!("{n} / {l}"),
        (Some(n), None) => n.to_string(),
        (None, _) => s.pids.len().to_string(),
    };
    let cpu = format!("{:.3}s", s.cpu_ns as f64 / 1e9);
    [
        format!(
            "{:<20} {:<8} {:<12} {:<24} {:<8} {}",
            "NAME", "STATE", "CPU TIME", "MEM USAGE / LIMIT", "MEM %", "PIDS"
        ),
        format!(
            "{:<20} {:<8} {:<12} {:<24} {:<8} {}",
            s.name, s.state, cpu, mem, mem_pct, pids
        ),
    ]
}

/// Bytes as docker prints them (binary units).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{v:.2}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_like_docker_stats() {
        let s = SandboxStats {
            name: "dev".into(),
            backend: "container".into(),
            state: "running".into(),
            scope: "the sandbox's cgroup".into(),
            cgroup: "/svc/dev".into(),
            cpu_ns: 1_500_000_000,
            cpu_user_ns: None,
            cpu_system_ns: None,
            memory_bytes: 12 << 20,
            memory_limit_bytes: Some(1 << 30),
            pids_current: Some(3),
            pids_limit: Some(512),
            pids: vec![1, 2, 3],
        };
        let [head, line] = table(&s);
        assert!(head.starts_with("NAME"), "{head}");
        assert!(line.starts_with("dev "), "{line}");
        for want in [
            "running",
            "1.500s",
            "12.00MiB / 1.00GiB",
            "1.17%",
            "3 / 512",
        ] {
            assert!(line.contains(want), "{want} in {line}");
        }
        assert_eq!(bytes(512), "512B");
    }
}
