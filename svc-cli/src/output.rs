//! `-o json|yaml|wide|name` on the read commands, as kubectl has it: the same records for
//! people (the default table, or `wide` with more columns) and for scripts (`json`, `yaml`,
//! or one name a line for `xargs`). `--json` stays, meaning `-o json`.

use std::process::ExitCode;

use serde::Serialize;

/// How a read command prints what it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The table (or the record) for people.
    Table,
    /// The table with more columns.
    Wide,
    /// Pretty-printed JSON, as the API answers it.
    Json,
    /// YAML, the same fields as JSON.
    Yaml,
    /// One name a line, for `xargs` and shell loops.
    Name,
}

/// `-o FORMAT` and `--json`, flattened into a read command's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Output format: table (the default), wide (more columns), json, yaml, or name (one
    /// name a line).
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
    /// Print JSON (the same as -o json).
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
}

impl OutputArgs {
    /// The format asked for: `--json` is `-o json`; neither is the table.
    pub fn format(&self) -> Format {
        Format::chosen(self.json, self.output)
    }
}

impl Format {
    /// The format of a command's `--json` and `-o` flags (for commands whose flags say more
    /// than [`OutputArgs`]' help): `--json` is `-o json`; neither is the table.
    pub fn chosen(json: bool, output: Option<Format>) -> Format {
        match (json, output) {
            (true, _) => Format::Json,
            (false, Some(f)) => f,
            (false, None) => Format::Table,
        }
    }
}

/// How one kind of record is printed for people and named for scripts.
pub trait Listed: Serialize {
    /// The name `-o name` prints.
    fn name(&self) -> &str;
}

/// Print `items` in `format`: the machine formats here, the tables by `table(items, wide)`.
pub fn list<T: Listed>(
    format: Format,
    items: &[T],
    table: impl FnOnce(&[T], bool),
) -> anyhow::Result<ExitCode> {
    match format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(items)?),
        Format::Yaml => yaml(&items)?,
        Format::Name => {
            for i in items {
                outln!("{}", i.name());
            }
        }
        Format::Table => table(items, false),
        Format::Wide => table(items, true),
    }
    Ok(ExitCode::SUCCESS)
}

/// Print one record in `format`; `human` prints it for people (`table` and `wide` alike).
pub fn one<T: Listed>(
    format: Format,
    item: &T,
    human: impl FnOnce(&T),
) -> anyhow::Result<ExitCode> {
    match format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(item)?),
        Format::Yaml => yaml(item)?,
        Format::Name => outln!("{}", item.name()),
        Format::Table | Format::Wide => human(item),
    }
    Ok(ExitCode::SUCCESS)
}

/// One value as a YAML document (without a trailing blank line).
fn yaml<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let text = serde_norway::to_string(value)?;
    outln!("{}", text.trim_end());
    Ok(())
}

impl Listed for svc_control::api::SandboxView {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Listed for svc_control::api::SecretInfo {
    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Probe {
        #[command(flatten)]
        out: OutputArgs,
    }

    fn format_of(args: &[&str]) -> Result<Format, clap::Error> {
        Probe::try_parse_from(std::iter::once("probe").chain(args.iter().copied()))
            .map(|p| p.out.format())
    }

    #[test]
    fn json_flag_is_output_json_and_the_table_is_the_default() {
        assert_eq!(format_of(&[]).ok(), Some(Format::Table));
        assert_eq!(format_of(&["--json"]).ok(), Some(Format::Json));
        assert_eq!(format_of(&["-o", "yaml"]).ok(), Some(Format::Yaml));
        assert_eq!(format_of(&["--output=name"]).ok(), Some(Format::Name));
        assert_eq!(format_of(&["-o", "wide"]).ok(), Some(Format::Wide));
    }

    #[test]
    fn an_unknown_format_or_two_formats_are_refused_by_name() {
        let e = format_of(&["-o", "xml"]).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("xml") && e.contains("yaml")),
            "{e:?}"
        );
        assert!(format_of(&["--json", "-o", "yaml"]).is_err());
    }
}
