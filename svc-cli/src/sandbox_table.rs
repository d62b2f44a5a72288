//! `svc sandbox list`'s table for people: the default columns, and `-o wide`'s extra ones.

use svc_control::api::SandboxView;

/// Print `all` as a table (`wide`: the backend, the allowlist's generation and the creation
/// time too, before the owner), or say how to make one when there are none.
pub fn print(all: &[SandboxView], wide: bool) {
    if all.is_empty() {
        outln!("no sandboxes (create one: svc sandbox create NAME)");
        return;
    }
    let extra = |backend: &str, generation: &str, created: &str| {
        if wide {
            format!("{backend:<9} {generation:>4} {created:<26} ")
        } else {
            String::new()
        }
    };
    outln!(
        "{:<20} {:>4} {:<8} {:<10} {:<16} {:<8} {:<5} {}OWNER",
        "NAME",
        "ID",
        "STATE",
        "MODE",
        "GUEST",
        "LINK",
        "HOSTS",
        extra("BACKEND", "GEN", "CREATED")
    );
    for s in all {
        outln!(
            "{:<20} {:>4} {:<8} {:<10} {:<16} {:<8} {:<5} {}{}",
            s.name,
            s.id,
            s.state,
            s.mode,
            s.guest_v4,
            s.link,
            s.allowed_hosts.len(),
            extra(&s.backend, &s.policy_generation.to_string(), &s.created_at),
            crate::out::owner_text(s.owner_uid, s.owner.as_deref())
        );
    }
}
