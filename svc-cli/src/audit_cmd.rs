//! `svc audit`: read svcd's audit log through its API (the same callers svcd allows for
//! everything else), filtered, one readable line per record — or the records as written with
//! `--json` — and, with `--follow`, new records as they come, in the spirit of
//! `hubble observe`.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use crate::{
    client::Client,
    client::{SocketArg, runtime},
};

/// `svc audit` arguments.
#[derive(Debug, Args)]
#[command(after_help = "\
Verdicts across layers: a dropped packet, a DNS question refused (or failed) and an HTTP request
refused are `deny`; a DNS question answered and an HTTP request allowed are `allow`.

Examples:
  svc audit --sandbox dev --since 10m
  svc audit --verdict deny --follow
  svc audit --layer http --json | jq .path")]
pub struct AuditArgs {
    /// Keep printing new records as they are written.
    #[arg(long, short)]
    pub follow: bool,
    /// Only this sandbox (its name or id).
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Only this layer.
    #[arg(long, value_parser = ["packet", "dns", "http", "ssh", "policy", "credential", "suppressed"])]
    pub layer: Option<String>,
    /// Only allowed or only refused.
    #[arg(long, value_parser = ["allow", "deny"])]
    pub verdict: Option<String>,
    /// Only records this recent (10s, 10m, 2h, 3d) or from this time (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// The records as svcd wrote them, one JSON object per line (schema/audit.v1.json).
    #[arg(long)]
    pub json: bool,
}

pub fn run(socket: &SocketArg, a: AuditArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket.socket);
    let mut query: Vec<String> = Vec::new();
    for (k, v) in [
        ("sandbox", &a.sandbox),
        ("layer", &a.layer),
        ("verdict", &a.verdict),
        ("since", &a.since),
    ] {
        if let Some(v) = v {
            query.push(format!(
                "{k}={}",
                percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC)
            ));
        }
    }
    if a.follow {
        query.push("follow=1".into());
    }
    let path = format!("/v1/audit?{}", query.join("&"));
    runtime()?.block_on(async move {
        client
            .get_lines(&path, |line| {
                if a.json {
                    outln!("{}", String::from_utf8_lossy(line));
                } else if let Ok(record) = serde_json::from_slice::<Value>(line) {
                    outln!("{}", human(&record));
                }
                Ok(())
            })
            .await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// One record for people: time, sandbox, layer, verdict, then what the layer says.
pub fn human(r: &Value) -> String {
    let s = |k: &str| r[k].as_str().unwrap_or("").to_owned();
    let sandbox = r["sandbox_name"]
        .as_str()
        .map_or_else(|| format!("#{}", r["sandbox"]), str::to_owned);
    let verdict = match svc_control::audit::query::verdict(r) {
        Some(svc_control::audit::query::Verdict::Allow) => "ALLOW",
        Some(svc_control::audit::query::Verdict::Deny) => "DENY",
        None => "?",
    };
    let what = match r["layer"].as_str().unwrap_or("") {
        "packet" => {
            let end = |a: &str, p: &str| {
                if r[p].is_null() {
                    s(a)
                } else {
                    format!("{}:{}", s(a), r[p])
                }
            };
            format!(
                "{} {} -> {} {}{}",
                s("protocol"),
                end("src", "src_port"),
                end("dst", "dst_port"),
                s("reason"),
                r["suppressed"]
                    .as_u64()
                    .map_or(String::new(), |n| format!(" (+{n} suppressed)"))
            )
        }
        "dns" => {
            let answers: Vec<String> = r["answers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "{} {} {}{}{}",
                s("name"),
                s("qtype"),
                s("decision"),
                if answers.is_empty() {
                    String::new()
                } else {
                    format!(" {}", answers.join(","))
                },
                r["reason"]
                    .as_str()
                    .map_or(String::new(), |why| format!(": {why}"))
            )
        }
        "http" => format!(
            "{} {}{} {} {} credential={} up={}B down={}B {}ms",
            s("method"),
            s("host"),
            s("path"),
            r["status"],
            s("rule"),
            s("credential"),
            r["bytes_up"],
            r["bytes_down"],
            r["duration_ms"]
        ),
        "ssh" => {
            let refs: Vec<String> = r["refs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x["name"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "{} {} {}{} exit={} up={}B down={}B {}ms{}",
                s("command"),
                s("host"),
                s("repo"),
                if refs.is_empty() {
                    String::new()
                } else {
                    format!(" refs={}", refs.join(","))
                },
                r["exit"],
                r["bytes_up"],
                r["bytes_down"],
                r["duration_ms"],
                r["reason"]
                    .as_str()
                    .map_or(String::new(), |why| format!(": {why}"))
            )
        }
        "policy" => {
            let list = |k: &str| -> String {
                r[k].as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default()
            };
            format!(
                "{} +[{}] -[{}] generation={} by {}",
                s("change"),
                list("added"),
                list("removed"),
                r["generation"],
                s("by")
            )
        }
        "credential" => format!(
            "{} {} until {}{}",
            s("credential"),
            s("outcome"),
            s("expires_at"),
            r["reason"]
                .as_str()
                .map_or(String::new(), |why| format!(": {why}"))
        ),
        "suppressed" => {
            let counts = r["records"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(layer, n)| format!("{layer}={n}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            format!(
                "{counts} records not written (past {}/s, bursts of {}: limits.audit_records_per_sec)",
                r["per_sec"], r["burst"]
            )
        }
        other => format!("{other} {r}"),
    };
    format!(
        "{} {:<16} {:<6} {:<5} {what}",
        s("time"),
        sandbox,
        s("layer"),
        verdict
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ssh_record_reads_as_the_session_it_was() {
        let r = serde_json::json!({
            "time": "2026-11-23T08:00:00.000Z", "sandbox": 1, "sandbox_name": "dev",
            "layer": "ssh", "host": "github.com", "repo": "acme/widget",
            "command": "git-receive-pack",
            "refs": [{"name": "refs/heads/main", "old": "0", "new": "1"}],
            "decision": "deny",
            "reason": "svc: refused: ref refs/heads/main not in allowed branches",
            "bytes_up": 0, "bytes_down": 0, "duration_ms": 12, "exit": 1
        });
        let line = human(&r);
        assert!(
            line.contains(
                " ssh    DENY  git-receive-pack github.com acme/widget refs=refs/heads/main exit=1"
            ),
            "{line}"
        );
        assert!(
            line.ends_with(": svc: refused: ref refs/heads/main not in allowed branches"),
            "{line}"
        );
    }

    #[test]
    fn a_suppressed_record_reads_as_its_counts_and_the_limit() {
        let r = serde_json::json!({
            "time": "2026-11-26T03:00:00.000Z", "sandbox": 1, "sandbox_name": "dev",
            "layer": "suppressed", "records": {"dns": 812, "http": 3},
            "per_sec": 50, "burst": 2000
        });
        let line = human(&r);
        assert!(
            line.ends_with(
                " suppressed ?     dns=812 http=3 records not written (past 50/s, bursts of \
                 2000: limits.audit_records_per_sec)"
            ),
            "{line}"
        );
    }
}
