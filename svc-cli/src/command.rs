//! The command tree `svc` parses, completes and documents: the derived definitions, plus what
//! a derive attribute cannot say on its own: `--socket` hidden on the commands that never
//! reach svcd, and which values complete to sandbox names, secret names or a fixed set.

use crate::complete::Names;

/// Top-level commands that work without svcd: `--socket` is accepted there (it is global)
/// but not shown.
const OFFLINE: &[&str] = &["config", "egress", "completions", "man"];

/// The whole `svc` command, as parsed, completed and written into the man pages.
pub fn command() -> clap::Command {
    let cmd = <crate::Cli as clap::CommandFactory>::command();
    let hidden_socket = cmd
        .get_arguments()
        .find(|a| a.get_id() == "socket")
        .map(|a| a.clone().hide(true));
    let cmd = with_completers(cmd, &mut Vec::new());
    match hidden_socket {
        // A subcommand that has the argument already does not get the root's copy.
        Some(socket) => cmd.mut_subcommands(|sc| {
            if OFFLINE.contains(&sc.get_name()) {
                sc.arg(socket.clone())
            } else {
                sc
            }
        }),
        None => cmd,
    }
}

/// `cmd` (at `path` below `svc`) and its subcommands, with each name-valued argument given
/// its completer.
fn with_completers(cmd: clap::Command, path: &mut Vec<String>) -> clap::Command {
    let here: Vec<&str> = path.iter().map(String::as_str).collect();
    let cmd = cmd.mut_args(|a| match names_of(&here, a.get_id().as_str()) {
        Some(names) => a.add(names.candidates()),
        None => a,
    });
    cmd.mut_subcommands(|sc| {
        path.push(sc.get_name().to_owned());
        let sc = with_completers(sc, path);
        path.pop();
        sc
    })
}

/// What argument `arg` of the command at `path` names.
fn names_of(path: &[&str], arg: &str) -> Option<Names> {
    match (path, arg) {
        (["sandbox", "create"], "egress") => {
            Some(Names::Fixed(&svc_control::api::EgressChoice::VALUES))
        }
        (["sandbox", "create"], _) => None,
        (["sandbox", _], "name")
        | (["workspace", "down" | "logs"], "name")
        | (["audit"] | ["egress", "explain"], "sandbox") => Some(Names::Sandboxes),
        (["secret", "set"], _) => None,
        (["secret", _], "name") => Some(Names::Secrets),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use clap_complete::engine::ArgValueCandidates;

    use super::*;

    /// Every command below `cmd`, with its words (`svc sandbox exec`).
    fn every_command(cmd: &clap::Command, words: &str, out: &mut Vec<(String, clap::Command)>) {
        for sc in cmd.get_subcommands() {
            every_command(sc, &format!("{words} {}", sc.get_name()), out);
        }
        out.push((words.to_owned(), cmd.clone()));
    }

    fn built() -> Vec<(String, clap::Command)> {
        let mut cmd = command();
        cmd.build();
        let mut all = Vec::new();
        every_command(&cmd, "svc", &mut all);
        all
    }

    fn find(words: &str) -> clap::Command {
        built()
            .into_iter()
            .find(|(w, _)| w == words)
            .map(|(_, c)| c)
            .expect(words)
    }

    #[test]
    fn every_argument_and_flag_has_help() {
        let mut bare = Vec::new();
        for (words, cmd) in built() {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if a.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    bare.push(format!("{words}: {id}"));
                }
            }
        }
        assert!(bare.is_empty(), "arguments without help: {bare:#?}");
    }

    #[test]
    fn socket_shows_only_where_svc_talks_to_svcd() {
        for words in [
            "svc config check",
            "svc config schema",
            "svc egress explain",
            "svc completions",
            "svc man",
        ] {
            let help = find(words).render_long_help().to_string();
            assert!(
                !help.contains("--socket"),
                "{words} shows --socket:\n{help}"
            );
        }
        for words in [
            "svc sandbox list",
            "svc secret rm",
            "svc events",
            "svc doctor",
        ] {
            let help = find(words).render_long_help().to_string();
            assert!(help.contains("--socket"), "{words} lacks --socket:\n{help}");
        }
    }

    #[test]
    fn a_hidden_socket_still_parses() {
        let m = command()
            .try_get_matches_from(["svc", "config", "check", "--socket", "/tmp/x.sock", "."])
            .expect("parses");
        let (_, sub) = m.subcommand().expect("config");
        let (_, check) = sub.subcommand().expect("check");
        assert_eq!(
            check
                .get_one::<std::path::PathBuf>("socket")
                .map(|p| p.display().to_string()),
            Some("/tmp/x.sock".to_owned())
        );
    }

    #[test]
    fn names_complete_to_sandboxes_and_secrets_and_egress_to_its_modes() {
        let has = |words: &str, id: &str| {
            find(words)
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get::<ArgValueCandidates>().cloned())
        };
        for (words, id) in [
            ("svc sandbox show", "name"),
            ("svc sandbox destroy", "name"),
            ("svc sandbox exec", "name"),
            ("svc sandbox fork", "name"),
            ("svc workspace logs", "name"),
            ("svc audit", "sandbox"),
            ("svc secret rm", "name"),
            ("svc secret share", "name"),
        ] {
            assert!(has(words, id).is_some(), "{words} {id} completes nothing");
        }
        assert!(has("svc sandbox create", "name").is_none(), "a new name");
        assert!(has("svc secret set", "name").is_none(), "a new name");
        let modes: Vec<String> = has("svc sandbox create", "egress")
            .expect("--egress completes")
            .candidates()
            .iter()
            .map(|c| c.get_value().to_string_lossy().into_owned())
            .collect();
        assert_eq!(modes, ["curated", "allow-all"]);
    }
}
