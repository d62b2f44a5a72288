//! The walls between guests and the limits on one: another guest's files and processes are
//! unseen, a fork bomb stops at its pids limit and a memory hog is killed inside its cgroup
//! while svcd and another guest keep answering.

use super::{Guest, guest_checks};
use crate::{
    unique,
    world::{World, cgroup_roots},
};

/// `left` (another sandbox than `right`'s) finds none of the files and processes `right`
/// makes, in its own tree nor in its sandbox's root as its init sees it (`/proc/1/root`: a pod
/// container's tree is chrooted in its pod's sandbox); `right` still sees its own file.
pub fn a_guest_cannot_reach_another_sandboxs_files_or_processes(
    left: &dyn Guest,
    right: &dyn Guest,
) {
    let secret = unique("s3cret");
    guest_checks(
        right,
        &format!(
            "echo {secret} > /root/secret && echo {secret} > /tmp/secret && \
             (exec -a holder-{secret} sleep 300 </dev/null >/dev/null 2>&1 &)"
        ),
    );
    let out = guest_checks(
        left,
        &format!(
            r#"if grep -rqs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {secret} / /proc/1/root/; then
  echo "ESCAPED: found the other sandbox's file"; exit 1; fi
if ps -eo args | grep -v grep | grep -q holder-{secret}; then
  echo "ESCAPED: the other sandbox's process is visible"; exit 1; fi
echo isolated"#
        ),
    );
    assert!(
        out.contains("isolated"),
        "{} from {}: {out}",
        left.describe(),
        right.describe()
    );
    // The secret is still there for its owner.
    assert_eq!(right.sh("cat /root/secret").1.trim(), secret);
}

/// In `bomb` (running in svc sandbox `sandbox`, made with `memory_mib = 128` and
/// `pids_max = 64`) a memory hog is killed by the OOM killer inside its cgroup and a fork bomb
/// fills the pids limit and no more; svcd and `bystander` keep answering meanwhile.
pub fn a_fork_bomb_and_a_memory_hog_are_contained_by_the_cgroup(
    w: &World,
    bomb: &dyn Guest,
    sandbox: &str,
    bystander: &dyn Guest,
) {
    // A memory hog is killed inside its cgroup; the sandbox itself lives on.
    let (code, _, err) = bomb.sh("python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'");
    assert_eq!(
        code, 137,
        "the memory hog was not killed by the OOM killer: {err}"
    );
    assert_eq!(bomb.sh("echo alive").1.trim(), "alive");

    // A fork bomb fills its pids limit and no more.
    let (code, _, err) = bomb
        .sh("(bomb() { bomb | bomb & }; bomb) </dev/null >/dev/null 2>&1 & sleep 3; echo started");
    assert!(
        code == 0 || code == 2 || code == 126,
        "starting the bomb: {code} {err}"
    );
    let cgroup = cgroup_roots()
        .into_iter()
        .map(|r| r.join(&w.cgroup_parent).join(sandbox))
        .find(|p| p.join("pids.max").exists())
        .expect("the sandbox's pids cgroup");
    let max = std::fs::read_to_string(cgroup.join("pids.max")).expect("pids.max");
    assert_eq!(max.trim(), "64", "pids limit not applied");
    let current: u64 = std::fs::read_to_string(cgroup.join("pids.current"))
        .expect("pids.current")
        .trim()
        .parse()
        .expect("number");
    assert!(current <= 64, "{current} tasks exceed the limit");
    // svcd and the other guest keep answering while the bomb runs.
    w.svc_ok(&["sandbox", "list"]);
    assert_eq!(bystander.sh("echo fine").1.trim(), "fine");
}
