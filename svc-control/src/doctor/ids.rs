//! `host:container-ids`: the container backend's host id range, as svcd will read it — with
//! `container.id_ranges = "per-sandbox"` its size and how many sandboxes' slices it holds
//! beside how many sandboxes `[network] ipv4_pool` allows; with `"shared"` the one range.

use std::{path::Path, time::Instant};

use super::report::{CheckResult, HostOutcome, host_result};
use crate::config::host::{HostConfig, IdRanges};
use crate::runtime::ids::{self, ID_COUNT};

/// The fix for a range svcd cannot use, or one holding fewer slices than the pool allows.
const SETUP_HOST: &str = "run `svcd setup-host` as root: it gives the container user a range \
                          sized for every sandbox [network] ipv4_pool allows, keeping the old one";

/// The probe of `host`'s container id range, read from `/etc/subuid` and `/etc/subgid`:
/// failed and required when svcd would refuse to start, failed and not required (a warning)
/// when the range holds fewer sandboxes' slices than the pool allows.
pub fn container_ids_probe(host: &HostConfig) -> CheckResult {
    container_ids_in(host, Path::new("/etc/subuid"), Path::new("/etc/subgid"))
}

/// [`container_ids_probe`] reading the given files.
fn container_ids_in(host: &HostConfig, subuid: &Path, subgid: &Path) -> CheckResult {
    let t0 = Instant::now();
    let user = host.container.user.as_str();
    let (required, outcome) = match host.container.id_ranges {
        IdRanges::Shared => (
            true,
            ids::id_range(user, subuid, subgid, "container.user")
                .map(|r| {
                    format!(
                        "container.id_ranges = \"shared\": every sandbox's guest root is host \
                         uid {}, gid {} ({user}'s first range of {ID_COUNT} ids)",
                        r.uid, r.gid
                    )
                })
                .map_err(|e| (e.to_string(), SETUP_HOST)),
        ),
        IdRanges::PerSandbox => match ids::slice_range(user, subuid, subgid, "container.user") {
            Err(e) => (true, Err((e.to_string(), SETUP_HOST))),
            Ok(r) => (false, covers(&r, host.max_sandbox_id())),
        },
    };
    host_result("container-ids", required, t0, outcome)
}

/// What per-sandbox range `r` holds, failed when it holds slices for fewer than `max_id`
/// sandboxes (the sandbox ids the pool allows: 1 to `max_id`).
fn covers(r: &ids::SliceRange, max_id: u32) -> HostOutcome {
    let ids = u64::from(r.slices) * u64::from(ID_COUNT);
    let held = r.slices.saturating_sub(1);
    let shown = format!(
        "container.id_ranges = \"per-sandbox\": {user}'s range of {ids} ids (uids from {uid}, \
         gids from {gid}) holds {slices} slices of {ID_COUNT}: sandbox ids 1 to {held} each \
         have their own host ids (slice 0 is no sandbox's); [network] ipv4_pool allows \
         {max_id} sandboxes",
        user = r.user,
        uid = r.start.uid,
        gid = r.start.gid,
        slices = r.slices,
    );
    if held >= max_id {
        Ok(shown)
    } else {
        Err((
            format!("{shown}: a sandbox given an id past {held} is refused"),
            SETUP_HOST,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    /// The probe over `subuid` and `subgid` texts, with `svcd.toml`'s `[container]` lines.
    fn probe(container: &str, subuid: &str, subgid: &str) -> CheckResult {
        let dir = std::env::temp_dir().join(format!(
            "svc-doctor-ids-{}-{}",
            std::process::id(),
            subuid.len() * 31 + container.len()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("subuid"), subuid).expect("subuid");
        std::fs::write(dir.join("subgid"), subgid).expect("subgid");
        let host = crate::config::host::parse(
            Path::new("svcd.toml"),
            &format!("[network]\nipv4_pool = \"10.203.0.0/28\"\n[container]\n{container}\n"),
        )
        .expect("svcd.toml");
        let r = container_ids_in(&host, &dir.join("subuid"), &dir.join("subgid"));
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn the_range_is_reported_with_how_many_sandboxes_it_holds() {
        // A /28 pool allows 4 sandboxes (a /30 each): 5 slices cover them.
        let five = "svc-sandbox:200000:65536\nsvc-sandbox:1000000:327680\n";
        let ok = probe("", five, five);
        assert_eq!(ok.status, Status::Passed, "{ok:?}");
        assert_eq!(ok.name, "host:container-ids");
        assert!(
            ok.output.contains("range of 327680 ids (uids from 1000000")
                && ok
                    .output
                    .contains("holds 5 slices of 65536: sandbox ids 1 to 4")
                && ok.output.contains("allows 4 sandboxes"),
            "{ok:?}"
        );

        let three = "svc-sandbox:1000000:196608\n";
        let short = probe("", three, three);
        assert_eq!(
            (short.status, short.required),
            (Status::Failed, false),
            "a warning: {short:?}"
        );
        let why = short.reason.as_deref().unwrap_or_default();
        assert!(
            why.contains("sandbox ids 1 to 2") && why.contains("past 2 is refused"),
            "{why}"
        );
        assert!(why.contains("fix: run `svcd setup-host` as root"), "{why}");

        let old = "svc-sandbox:200000:65536\n";
        let refused = probe("", old, old);
        assert_eq!((refused.status, refused.required), (Status::Failed, true));
        assert!(
            refused
                .reason
                .as_deref()
                .is_some_and(|w| w.contains("its largest is 65536 ids (200000-265535)")),
            "{refused:?}"
        );

        let shared = probe("id_ranges = \"shared\"", old, old);
        assert_eq!(shared.status, Status::Passed, "{shared:?}");
        assert!(
            shared.output.contains("host uid 200000, gid 200000"),
            "{shared:?}"
        );
    }
}
