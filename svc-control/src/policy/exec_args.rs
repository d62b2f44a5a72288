//! Which commands an exec can be given at all: every string of it goes to `execve` (or
//! `chdir`) as a C string, so one holding a NUL byte would be cut there, running something
//! other than what was asked. Such a request is refused, naming the string; so is an
//! environment variable's name no process can read back (empty, or holding `=`).

use crate::api::ExecRequest;

/// Why `req` cannot be run as asked; `None`: it can.
pub fn unrunnable(req: &ExecRequest) -> Option<String> {
    if req.argv.is_empty() {
        return Some("exec needs a command: svc sandbox exec NAME -- CMD…".into());
    }
    if let Some(i) = req.argv.iter().position(|a| a.contains('\0')) {
        return Some(format!(
            "argument {i} of the command ({:?}) holds a NUL byte: no program can be given it",
            req.argv[i]
        ));
    }
    for (k, v) in &req.env {
        if !crate::names::is_env_name(k) {
            return Some(format!("bad environment variable name {k:?}"));
        }
        if v.contains('\0') {
            return Some(format!(
                "environment variable {k}'s value holds a NUL byte: no program can be given it"
            ));
        }
    }
    if let Some(cwd) = req.cwd.as_deref().filter(|c| c.contains('\0')) {
        return Some(format!(
            "working directory {cwd:?} holds a NUL byte: no process can enter it"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(argv: &[&str], env: &[(&str, &str)], cwd: Option<&str>) -> ExecRequest {
        ExecRequest {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            cwd: cwd.map(str::to_owned),
            ..ExecRequest::default()
        }
    }

    #[test]
    fn strings_no_process_takes_are_refused_by_name() {
        let cases: &[(&str, ExecRequest, Option<&str>)] = &[
            (
                "plain",
                req(&["sleep", "10"], &[("A", "b")], Some("/w")),
                None,
            ),
            ("empty value", req(&["true"], &[("A", "")], None), None),
            (
                "no command",
                req(&[], &[], None),
                Some("exec needs a command"),
            ),
            (
                "NUL in the program",
                req(&["sl\0eep"], &[], None),
                Some("argument 0 of the command (\"sl\\0eep\") holds a NUL byte"),
            ),
            (
                "NUL in an argument",
                req(&["sleep", "10\u{0}00"], &[], None),
                Some("argument 1 of the command (\"10\\000\") holds a NUL byte"),
            ),
            (
                "empty name",
                req(&["true"], &[("", "x")], None),
                Some("bad environment variable name \"\""),
            ),
            (
                "= in a name",
                req(&["true"], &[("A=B", "x")], None),
                Some("bad environment variable name \"A=B\""),
            ),
            (
                "NUL in a name",
                req(&["true"], &[("A\0B", "x")], None),
                Some("bad environment variable name \"A\\0B\""),
            ),
            (
                "NUL in a value",
                req(&["true"], &[("A", "x\0y")], None),
                Some("environment variable A's value holds a NUL byte"),
            ),
            (
                "NUL in the working directory",
                req(&["true"], &[], Some("/w\0/x")),
                Some("working directory \"/w\\0/x\" holds a NUL byte"),
            ),
        ];
        for (name, r, want) in cases {
            match (unrunnable(r), want) {
                (None, None) => {}
                (Some(got), Some(w)) => assert!(got.contains(w), "{name}: {got}"),
                (got, _) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
