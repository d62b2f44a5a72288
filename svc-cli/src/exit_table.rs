//! What svc's exit statuses mean: one table, printed in svc(1)'s EXIT STATUS section.

/// `(status, meaning)`: every status svc itself exits with. `svc sandbox exec` exits with the
/// command's own status otherwise.
pub const EXIT_STATUS: &[(u8, &str)] = &[
    (0, "Success."),
    (
        1,
        "Failure: svcd refused or a check failed (the message says which and why).",
    ),
    (
        2,
        "Usage: the command line is wrong (an unknown option, a missing argument).",
    ),
    (
        78,
        "Configuration invalid: a workspace's or the host's configuration has errors.",
    ),
    (
        125,
        "svc sandbox exec: svc or svcd failed to run the command (the sandbox is gone, svcd \
         is not reachable).",
    ),
    (
        126,
        "svc sandbox exec: the command was found in the sandbox but cannot run.",
    ),
    (
        127,
        "svc sandbox exec: the command was not found in the sandbox.",
    ),
];
