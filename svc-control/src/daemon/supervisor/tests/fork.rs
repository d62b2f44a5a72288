//! A fork asks the backend's description first: one that cannot fork is refused before
//! anything is paused or snapshotted.

use super::World;
use crate::{
    api::{ForkRequest, SandboxName},
    policy::ownership::Principal,
};

#[tokio::test]
async fn a_fork_on_a_backend_that_cannot_is_refused_before_anything_is_paused() {
    let w = World::new();
    w.create("source").await.expect("created");
    w.calls.clear();
    let clones = vec![SandboxName::new("copy").expect("a valid name")];
    let f = w
        .sup
        .fork(&Principal::ROOT, "source", ForkRequest { clones })
        .await
        .expect_err("refused");
    assert_eq!(f.status, 409);
    assert_eq!(
        f.message, "the fake backend cannot fork a sandbox (it cannot snapshot a guest's memory)",
        "names the backend; the registry holds none that can fork"
    );
    assert!(w.calls.steps().is_empty(), "{:?}", w.calls.steps());
    assert!(
        !w.dir.path().join("state/snapshots").exists(),
        "no snapshot directory"
    );
    assert_eq!(w.rows(), ["source"], "no clone");
    assert_eq!(w.sup.show("source").expect("shown").state, "running");
}
