//! `svc audit`: read svcd's audit log through its API (the same callers svcd allows for
//! everything else), filtered, one readable line per record — or the records as written with
//! `--json` — and, with `--follow`, new records as they come, in the spirit of
//! `hubble observe`.

use std::process::ExitCode;

use clap::Args;
use svc_control::audit::AuditLayer;

/// One record for people.
mod human;

use crate::{
    client::Client,
    client::{SocketArg, runtime},
    output::Format,
};

/// `svc audit` arguments.
#[derive(Debug, Args)]
#[command(after_help = "\
Verdicts across layers: a dropped packet, a DNS question refused (or failed) and an HTTP request
refused are `deny`; a DNS question answered and an HTTP request allowed are `allow`.

Examples:
  svc audit --sandbox dev --since 10m
  svc audit --pod team-a/agent-7
  svc audit -n 20 --verdict deny
  svc audit --since 2026-11-26T09:00:00Z --until 2026-11-26T10:00:00Z
  svc audit --verdict deny --follow
  svc audit --layer http --json | jq .path")]
pub struct AuditArgs {
    /// Keep printing new records as they are written.
    #[arg(long, short)]
    pub follow: bool,
    /// Only this sandbox (its name or id).
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Only the records of this Kubernetes pod (NAMESPACE/NAME; the containerd shim's
    /// sandboxes carry it).
    #[arg(long, value_name = "NS/NAME", value_parser = parse_pod)]
    pub pod: Option<String>,
    /// Only this layer.
    #[arg(long, value_parser = AuditLayer::NAMES)]
    pub layer: Option<String>,
    /// Only allowed or only refused.
    #[arg(long, value_parser = ["allow", "deny"])]
    pub verdict: Option<String>,
    /// Only records this recent (10s, 10m, 2h, 3d) or from this time (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// Only records at least this old (10s, 10m, 2h, 3d) or up to this time (RFC 3339).
    #[arg(long)]
    pub until: Option<String>,
    /// Only the last N matching records written so far (with --follow, new ones follow).
    #[arg(long = "tail", short = 'n', value_name = "N")]
    pub tail: Option<usize>,
    /// Output format: table (the default, one line a record for people; wide is the same),
    /// json (each record as svcd wrote it, one JSON object a line: schema/audit.v1.json), yaml
    /// (one document a record) or name (the sandbox each record is of, one a line: its name,
    /// or its id where the record has no name).
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
    /// The records as svcd wrote them, one JSON object per line (the same as -o json).
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
}

/// Print one record as written (`line`) in `format`.
fn print(format: Format, line: &[u8]) -> anyhow::Result<()> {
    match format {
        Format::Json => outln!("{}", String::from_utf8_lossy(line)),
        Format::Table | Format::Wide => {
            if let Some(text) = human::line(line) {
                outln!("{text}");
            }
        }
        Format::Yaml | Format::Name => {
            let record: serde_json::Value = serde_json::from_slice(line)
                .map_err(|e| anyhow::anyhow!("svcd sent an audit line that is not JSON: {e}"))?;
            if format == Format::Yaml {
                outln!("---\n{}", serde_norway::to_string(&record)?.trim_end());
            } else if let Some(name) = record.get("sandbox_name").and_then(|v| v.as_str()) {
                outln!("{name}");
            } else if let Some(id) = record.get("sandbox").and_then(serde_json::Value::as_u64) {
                outln!("{id}");
            }
        }
    }
    Ok(())
}

/// `NAMESPACE/NAME`, checked as svcd checks it.
fn parse_pod(s: &str) -> Result<String, String> {
    svc_control::api::PodRef::parse(s).map(|p| p.to_string())
}

pub fn run(socket: &SocketArg, a: AuditArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket.socket);
    let mut query: Vec<String> = Vec::new();
    for (k, v) in [
        ("sandbox", &a.sandbox),
        ("pod", &a.pod),
        ("layer", &a.layer),
        ("verdict", &a.verdict),
        ("since", &a.since),
        ("until", &a.until),
        ("tail", &a.tail.map(|n| n.to_string())),
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
    let format = Format::chosen(a.json, a.output);
    runtime()?.block_on(async move {
        client.get_lines(&path, |line| print(format, line)).await?;
        Ok(ExitCode::SUCCESS)
    })
}
