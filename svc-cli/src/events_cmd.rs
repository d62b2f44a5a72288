//! `svc events [--follow] [-o FORMAT]`: svcd's events, one a line (or one JSON object or YAML
//! document each).

use std::process::ExitCode;

use svc_control::api::Event;

use crate::{
    client::{Client, SocketArg, runtime},
    output::Format,
};

/// `svc events`' arguments.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Keep printing new events as they happen.
    #[arg(long, short)]
    pub follow: bool,
    #[command(flatten)]
    pub output: crate::output::OutputArgs,
    /// Only events after this sequence number.
    #[arg(long, default_value_t = 0)]
    pub after: i64,
}

/// Print the events after `a.after` (and, with `--follow`, the new ones as they come).
pub fn run(socket: &SocketArg, a: EventsArgs) -> anyhow::Result<ExitCode> {
    let format = a.output.format();
    anyhow::ensure!(
        format != Format::Name,
        "events have no names: use -o json, -o yaml, or the table"
    );
    let client = Client::new(&socket.socket);
    runtime()?.block_on(async move {
        let path = format!(
            "/v1/events?after={}{}",
            a.after,
            if a.follow { "&follow=1" } else { "" }
        );
        client.get_lines(&path, |line| print(format, line)).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// One event as `format` asks: JSON as svcd sent it (one object a line), a YAML document, or
/// a line for people.
fn print(format: Format, line: &[u8]) -> anyhow::Result<()> {
    if format == Format::Json {
        outln!("{}", String::from_utf8_lossy(line));
        return Ok(());
    }
    let e: Event = serde_json::from_slice(line)?;
    if format == Format::Yaml {
        outln!("---\n{}", serde_norway::to_string(&e)?.trim_end());
        return Ok(());
    }
    let detail = if e.detail.as_object().is_some_and(|o| !o.is_empty()) {
        format!(" {}", e.detail)
    } else {
        String::new()
    };
    outln!(
        "{:>6} {} {:<20} {}{detail}",
        e.seq,
        e.time,
        e.kind,
        e.sandbox.as_deref().unwrap_or("-")
    );
    Ok(())
}
