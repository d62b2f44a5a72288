//! Creation, destruction and adoption when the state store fails at each of its steps:
//! what was built is rolled back, the error is reported, and what is left is what a retry or
//! the next start finishes.

use super::super::state::EventLog as _;
use super::{World, fails_and_rolls_back, lock, request};
use crate::api::CreateSandbox;

#[tokio::test]
async fn a_failed_state_row_rolls_back() {
    fails_and_rolls_back("store.set_running").await;
}

/// The store failing before anything is built: `step` refuses `req` with the database's
/// error, and nothing is built. The world, the failure spent.
async fn store_refuses_before_building(step: &'static str, req: CreateSandbox) -> World {
    let w = World::new();
    w.calls.fail_on(step);
    let f = w.refused(req).await;
    assert_eq!(f.status, 500, "{step}: {}", f.message);
    assert!(
        f.message.contains("svcd.db") && f.message.contains(step),
        "{step}: {}",
        f.message
    );
    assert_eq!(w.calls.steps(), [step]);
    w.assert_empty();
    w.calls.clear();
    w
}

#[tokio::test]
async fn a_failed_reservation_builds_nothing() {
    let w = store_refuses_before_building("store.reserve_for", request("early")).await;
    w.created(request("early")).await;
}

#[tokio::test]
async fn a_failed_read_of_a_stored_secret_builds_nothing() {
    let mut req = request("sealed");
    req.secrets = vec![crate::api::SecretValue {
        name: "TOKEN".into(),
        source: "store:gh".into(),
        value: String::new(),
    }];
    let w = store_refuses_before_building("store.secret_get", req.clone()).await;
    // With the store answering, the secret is missing: refused as before, naming it.
    let f = w.refused(req).await;
    assert_eq!(f.status, 400, "{}", f.message);
    assert!(
        f.message.contains("no secret gh in the store"),
        "{}",
        f.message
    );
}

#[tokio::test]
async fn a_rollback_whose_row_cannot_be_deleted_leaves_it_to_the_next_start() {
    let mut w = World::new();
    w.calls.fail_on("store.set_running");
    w.calls.fail_on("store.delete");
    let f = w.create("stuck").await.expect_err("creation fails");
    assert_eq!(f.status, 500, "{}", f.message);
    assert!(f.message.contains("store.set_running"), "{}", f.message);
    w.assert_nothing_built();
    // The row stays `creating`, which start-up tears down.
    assert_eq!(w.row_states(), [("stuck".into(), "creating".into())]);
    w.restart();
    w.sup.reconcile().await.expect("reconciled");
    w.assert_empty();
}

#[tokio::test]
async fn an_event_the_store_cannot_record_does_not_undo_a_creation() {
    let w = World::new();
    w.calls.fail_on("store.add_event");
    let view = w.create("quiet").await.expect("created");
    assert_eq!(view.state, "running");
    assert_eq!(w.row_states(), [("quiet".into(), "running".into())]);
    let events = w.store.inner.events_after(0, 10).expect("events");
    let kinds: Vec<String> = events.into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["workspace.ready"], "sandbox.created was lost");
}

/// Destroying sandbox `name` fails at store `step`: refused, naming the step.
async fn destroy_fails_at(w: &World, name: &str, step: &'static str) {
    w.calls.clear();
    w.calls.fail_on(step);
    let f = w.sup.destroy(name).await.expect_err("destroy fails");
    assert_eq!(f.status, 500, "{step}: {}", f.message);
    assert!(f.message.contains(step), "{step}: {}", f.message);
}

#[tokio::test]
async fn destroy_that_cannot_read_or_mark_the_row_removes_nothing_and_can_be_retried() {
    for step in ["store.list", "store.set_destroying"] {
        let w = World::new();
        w.create("kept").await.expect("created");
        destroy_fails_at(&w, "kept", step).await;
        let view = w.sup.show("kept").expect("still there");
        assert_eq!(view.state, "running", "{step}");
        assert!(w.registry.by_id(view.id).is_some(), "{step}");
        assert_eq!(lock(&w.fence.records).len(), 1, "{step}");
        assert_eq!(w.row_states(), [("kept".into(), "running".into())]);
        w.sup.destroy("kept").await.expect("destroyed");
        w.assert_empty();
    }
}

#[tokio::test]
async fn destroy_that_cannot_delete_the_row_leaves_it_destroying_and_can_be_retried() {
    let mut w = World::new();
    w.create("half").await.expect("created");
    destroy_fails_at(&w, "half", "store.delete").await;
    w.assert_nothing_built();
    assert_eq!(w.row_states(), [("half".into(), "destroying".into())]);
    let d = w.sup.destroy("half").await.expect("destroyed");
    assert!(
        d.removed.contains(&"state row".to_owned()),
        "{:?}",
        d.removed
    );
    w.assert_empty();
    // The same row, left by a destroy svcd did not finish, goes at the next start.
    w.create("half").await.expect("created");
    destroy_fails_at(&w, "half", "store.delete").await;
    w.restart();
    w.sup.reconcile().await.expect("reconciled");
    w.assert_empty();
}

#[tokio::test]
async fn a_restart_that_cannot_list_the_rows_adopts_nothing_and_says_so() {
    let mut w = World::new();
    w.create("kept").await.expect("created");
    w.restart();
    w.calls.fail_on("store.list");
    let f = w.sup.reconcile().await.expect_err("reconcile fails");
    assert_eq!(f.status, 500, "{}", f.message);
    assert!(f.message.contains("store.list"), "{}", f.message);
    assert!(w.sup.show("kept").is_err());
    // The next start adopts it.
    w.restart();
    w.sup.reconcile().await.expect("reconciled");
    assert_eq!(w.sup.show("kept").expect("adopted").state, "running");
}

#[tokio::test]
async fn a_restart_that_cannot_read_a_sandboxs_secrets_keeps_its_fence_closed() {
    let mut w = World::new();
    let view = w.create("sealed").await.expect("created");
    w.restart();
    w.calls.fail_on("store.secrets");
    w.sup.reconcile().await.expect("reconciled");
    assert!(w.registry.by_id(view.id).is_none(), "not registered");
    assert!(lock(&w.fence.records).is_empty(), "its fence record goes");
    assert_eq!(w.rows(), ["sealed"]);
    w.sup.destroy("sealed").await.expect("destroyed");
    w.assert_empty();
}

#[tokio::test]
async fn a_restart_that_cannot_delete_a_half_built_row_tries_again_at_the_next() {
    let mut w = World::with_half_built("half");
    w.calls.fail_on("store.delete");
    w.sup.reconcile().await.expect("reconciled");
    assert_eq!(w.row_states(), [("half".into(), "creating".into())]);
    w.restart();
    w.sup.reconcile().await.expect("reconciled");
    w.assert_empty();
}
