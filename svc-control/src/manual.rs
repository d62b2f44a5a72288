//! Man pages from a clap command tree: one page per visible command (`svc.1`,
//! `svc-sandbox-exec.1`, …) from the same definitions as `--help`, and on the top page the
//! sections a man page has beyond them (EXIT STATUS, ENVIRONMENT, FILES, SEE ALSO). The
//! `help` subcommands clap adds get no page, so none is named.

use std::io::Write as _;

/// What the top page says beyond the command's own definitions.
#[derive(Debug, Clone, Copy)]
pub struct Extra<'a> {
    /// `(status, meaning)`, every status the program exits with.
    pub exit_status: &'a [(u8, &'a str)],
    /// `(variable, what it does)`.
    pub environment: &'a [(&'a str, &'a str)],
    /// `(path, what it is)`.
    pub files: &'a [(&'a str, &'a str)],
    /// Pages outside this tree the top page points to, e.g. `svcd(8)`.
    pub see_also: &'a [&'a str],
}

/// Every page of `root`'s tree in man `section` (`1`, `8`): `(file name, roff)`, the top
/// page first. A subcommand's page points back to the top page and to its parent's.
pub fn tree(
    root: clap::Command,
    section: &str,
    extra: &Extra<'_>,
) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let top = root.get_name().to_owned();
    let root = without_help_subcommands(root);
    let mut pages = Vec::new();
    let mut stack = vec![(top.clone(), top.clone(), None, root)];
    while let Some((file, words, parent, cmd)) = stack.pop() {
        for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
            stack.push((
                format!("{file}-{}", sub.get_name()),
                format!("{words} {}", sub.get_name()),
                Some(file.clone()),
                sub.clone(),
            ));
        }
        let cmd = cmd.name(file.clone()).bin_name(words);
        let mut page = Vec::new();
        command_sections(&cmd, section, &mut page)?;
        match parent {
            None => {
                let status: Vec<(String, &str)> = extra
                    .exit_status
                    .iter()
                    .map(|(c, m)| (c.to_string(), *m))
                    .collect();
                tagged(
                    &mut page,
                    "EXIT STATUS",
                    status.iter().map(|(c, m)| (c.as_str(), *m)),
                )?;
                tagged(&mut page, "ENVIRONMENT", extra.environment.iter().copied())?;
                tagged(&mut page, "FILES", extra.files.iter().copied())?;
                see_also(&mut page, extra.see_also.iter().copied())?;
            }
            Some(parent) => {
                let up = [format!("{top}({section})"), format!("{parent}({section})")];
                let refs = if parent == top { &up[..1] } else { &up[..] };
                see_also(&mut page, refs.iter().map(String::as_str))?;
            }
        }
        if cmd.get_version().is_some() {
            clap_mangen::Man::new(cmd).render_version_section(&mut page)?;
        }
        pages.push((format!("{file}.{section}"), page));
    }
    let first = format!("{top}.{section}");
    pages.sort_by_key(|(f, _)| *f != first);
    Ok(pages)
}

/// clap's sections of `cmd`'s page: title, NAME, SYNOPSIS, DESCRIPTION, OPTIONS,
/// SUBCOMMANDS and the text after the help.
fn command_sections(cmd: &clap::Command, section: &str, out: &mut Vec<u8>) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone()).section(section);
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(out)?;
    }
    if cmd.get_subcommands().any(|c| !c.is_hide_set()) {
        man.render_subcommands_section(out)?;
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(out)?;
    }
    Ok(())
}

/// A section of tagged paragraphs: each tag in bold, its text below.
pub fn tagged<'a>(
    out: &mut Vec<u8>,
    title: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
) -> std::io::Result<()> {
    writeln!(out, ".SH {}", heading(title))?;
    for (tag, text) in entries {
        writeln!(out, ".TP\n\\fB{}\\fR\n{}", escape(tag), escape(text))?;
    }
    Ok(())
}

/// A section heading as roff wants it: quoted when it has a space.
fn heading(title: &str) -> String {
    if title.contains(' ') {
        format!("\"{title}\"")
    } else {
        title.to_owned()
    }
}

/// SEE ALSO: the pages (`svc(1)`), comma-separated, their names in bold.
pub fn see_also<'a>(
    out: &mut Vec<u8>,
    pages: impl Iterator<Item = &'a str>,
) -> std::io::Result<()> {
    let refs: Vec<String> = pages
        .map(|p| match p.split_once('(') {
            Some((name, sec)) => format!("\\fB{}\\fR({sec}", escape(name)),
            None => escape(p),
        })
        .collect();
    writeln!(out, ".SH \"SEE ALSO\"\n{}", refs.join(", "))
}

/// The page names (`svc-sandbox(1)`) a rendered page refers to, as a reader sees them.
pub fn references(page: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(page)
        .replace("\\fB", "")
        .replace("\\fR", "")
        .replace("\\-", "-");
    text.split([' ', ',', '\n'])
        .filter(|w| {
            w.split_once('(').is_some_and(|(name, rest)| {
                !name.is_empty()
                    && rest.len() == 2
                    && rest.ends_with(')')
                    && rest.starts_with(|c: char| c.is_ascii_digit())
            })
        })
        .map(str::to_owned)
        .collect()
}

/// `text` safe in a roff text line: backslashes doubled, hyphens literal, no leading dot.
pub fn escape(text: &str) -> String {
    let t = text.replace('\\', "\\\\").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// `cmd` without the `help` subcommands clap adds, at every level.
fn without_help_subcommands(cmd: clap::Command) -> clap::Command {
    cmd.disable_help_subcommand(true)
        .mut_subcommands(without_help_subcommands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> clap::Command {
        clap::Command::new("toy")
            .about("A toy.")
            .arg(clap::Arg::new("verbose").long("verbose").help("Say more."))
            .subcommand(
                clap::Command::new("box")
                    .about("Boxes.")
                    .subcommand(clap::Command::new("open").about("Open one.")),
            )
    }

    const EXTRA: Extra<'static> = Extra {
        exit_status: &[(0, "Success."), (78, "Configuration invalid.")],
        environment: &[("TOY_HOME", "Where toys live.")],
        files: &[("/etc/toy.toml", "The configuration.")],
        see_also: &[("toy.toml(5)")],
    };

    fn pages() -> Vec<(String, String)> {
        tree(toy(), "8", &EXTRA)
            .expect("renders")
            .into_iter()
            .map(|(f, p)| (f, String::from_utf8_lossy(&p).into_owned()))
            .collect()
    }

    #[test]
    fn the_top_page_has_every_standard_section() {
        let all = pages();
        let (file, top) = &all[0];
        assert_eq!(file, "toy.8");
        for s in [
            ".TH toy 8",
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH DESCRIPTION",
            ".SH OPTIONS",
            ".SH SUBCOMMANDS",
            ".SH \"EXIT STATUS\"",
            ".SH ENVIRONMENT",
            ".SH FILES",
            ".SH \"SEE ALSO\"",
        ] {
            assert!(top.contains(s), "no {s} in:\n{top}");
        }
        assert!(top.contains("\\fB78\\fR\nConfiguration invalid."));
        assert!(top.contains("\\fB/etc/toy.toml\\fR"));
    }

    #[test]
    fn every_page_named_is_written_and_help_has_none() {
        let all = pages();
        let files: Vec<&str> = all.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(files, ["toy.8", "toy-box.8", "toy-box-open.8"]);
        for (file, page) in &all {
            for r in references(page.as_bytes()) {
                let (name, sec) = r
                    .trim_end_matches(')')
                    .split_once('(')
                    .expect("a reference");
                assert!(
                    files.contains(&format!("{name}.{sec}").as_str()) || r == "toy.toml(5)",
                    "{file} names {r}"
                );
            }
        }
        let open = &all[2].1;
        assert!(
            open.contains("\\fBtoy\\fR(8), \\fBtoy\\-box\\fR(8)"),
            "{open}"
        );
    }

    #[test]
    fn text_cannot_start_a_roff_request() {
        assert_eq!(escape(".svc/config.yaml"), "\\&.svc/config.yaml");
        assert_eq!(escape("a-b\\c"), "a\\-b\\\\c");
    }
}
