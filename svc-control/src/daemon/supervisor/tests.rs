//! Creation, rollback, destruction and adoption with the kernel effects faked (`fake`), on a
//! test-only backend added through the registry; the state store is a real one in a
//! temporary directory behind a fake that can fail any of its calls (`fake_store`).

use std::{path::Path, sync::Arc, time::SystemTime};

use super::{
    Effects, Supervisor, SupervisorConfig,
    fake::{Calls, FAKE, FakeBackend, FakeFence, FakeLinks, FakeNft},
    fake_store::FakeStore,
    state::SandboxRows as _,
};
use crate::{
    api::CreateSandbox,
    audit::{AuditError, AuditRecord, AuditSink},
    config::{host::HostConfig, limits::LimitsConfig},
    daemon::wiring::Registry,
    limits::{Channel, GuestLimits, Report},
    policy::{destination::HostNetwork, ownership::Principal},
    runtime::{Backend, Backends},
};

/// Forking on the fake backend.
mod fork;
mod pod_secrets;
mod store_failures;

struct NoAudit;
impl AuditSink for NoAudit {
    fn record(&self, _r: &AuditRecord) -> Result<(), AuditError> {
        Ok(())
    }
}

struct NoReport;
impl Report for NoReport {
    fn limit_hit(&self, _sandbox: &crate::limits::Guest, _limit: Channel, _max: u32, _log: bool) {}
}

/// A supervisor over fakes, and the fakes to look at.
struct World {
    dir: tempfile::TempDir,
    calls: Arc<Calls>,
    fence: Arc<FakeFence>,
    nft: Arc<FakeNft>,
    links: Arc<FakeLinks>,
    backend: Arc<FakeBackend>,
    registry: Arc<Registry>,
    store: Arc<FakeStore>,
    sup: Arc<Supervisor>,
}

/// A supervisor over the fakes and `store`, the fake backend its registry's only one.
fn supervisor(
    dir: &Path,
    store: Arc<FakeStore>,
    (fence, nft, links): (Arc<FakeFence>, Arc<FakeNft>, Arc<FakeLinks>),
    backend: Arc<FakeBackend>,
    registry: Arc<Registry>,
) -> Arc<Supervisor> {
    let backend: Arc<dyn Backend> = backend;
    Arc::new(Supervisor::with_effects(
        config(dir),
        store,
        Effects { fence, nft, links },
        Backends::new(backend),
        registry,
        SystemTime::now(),
    ))
}

fn config(dir: &Path) -> SupervisorConfig {
    let host = HostConfig {
        state_dir: dir.join("state"),
        audit_dir: dir.join("audit"),
        agent_home: None,
        ..HostConfig::default()
    };
    SupervisorConfig {
        host,
        metrics: Arc::new(crate::metrics::Metrics::new()),
        audit: Arc::new(NoAudit),
        host_client: None,
        key: Arc::new(crate::creds::HostKey::load_or_create(&dir.join("key")).expect("key")),
        guardian: None,
        resolver: Arc::new(crate::proxy::SystemResolver),
        network: HostNetwork::default(),
        limits: Arc::new(GuestLimits::new(
            LimitsConfig::default(),
            Arc::new(NoReport),
        )),
    }
}

impl World {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = Arc::new(Calls::default());
        let registry = Arc::new(Registry::default());
        let fence = Arc::new(FakeFence::new(calls.clone()));
        let nft = Arc::new(FakeNft::new(calls.clone()));
        let links = Arc::new(FakeLinks::new(calls.clone()));
        let backend = Arc::new(FakeBackend::new(calls.clone()));
        let store = Arc::new(FakeStore::open(&dir.path().join("store"), calls.clone()));
        let sup = supervisor(
            dir.path(),
            store.clone(),
            (fence.clone(), nft.clone(), links.clone()),
            backend.clone(),
            registry.clone(),
        );
        Self {
            dir,
            calls,
            fence,
            nft,
            links,
            backend,
            registry,
            store,
            sup,
        }
    }

    /// A world whose store holds a row `name` left `creating` by a crash, restarted.
    fn with_half_built(name: &str) -> Self {
        let mut w = Self::new();
        w.store
            .inner
            .reserve_for(name, "{}", "2026-01-01T00:00:00Z", "00", 16, 0)
            .expect("reserved");
        w.restart();
        w
    }

    /// A new supervisor over the same store (opened again) and the same kernel state, with a
    /// new registry: an svcd restart.
    fn restart(&mut self) {
        self.registry = Arc::new(Registry::default());
        let store = FakeStore::open(&self.dir.path().join("store"), self.calls.clone());
        self.store = Arc::new(store);
        self.sup = supervisor(
            self.dir.path(),
            self.store.clone(),
            (self.fence.clone(), self.nft.clone(), self.links.clone()),
            self.backend.clone(),
            self.registry.clone(),
        );
    }

    async fn create(&self, name: &str) -> Result<crate::api::SandboxView, super::Failure> {
        self.sup.create(request(name), &Principal::ROOT).await
    }

    /// `req` made, as root.
    async fn created(&self, req: CreateSandbox) -> crate::api::SandboxView {
        self.sup
            .create(req, &Principal::ROOT)
            .await
            .expect("created")
    }

    /// `req` refused, as root: the failure.
    async fn refused(&self, req: CreateSandbox) -> super::Failure {
        self.sup
            .create(req, &Principal::ROOT)
            .await
            .expect_err("refused")
    }

    /// The state rows, as (name, state), read past the fake.
    fn row_states(&self) -> Vec<(String, String)> {
        self.store
            .inner
            .list()
            .expect("rows")
            .into_iter()
            .map(|r| (r.name, r.state))
            .collect()
    }

    /// The names of the state rows.
    fn rows(&self) -> Vec<String> {
        self.row_states().into_iter().map(|(n, _)| n).collect()
    }

    /// Nothing of any sandbox is left anywhere.
    fn assert_empty(&self) {
        self.assert_nothing_built();
        assert!(self.rows().is_empty(), "state rows left");
    }

    /// Nothing of any sandbox is left but its state row, if any.
    fn assert_nothing_built(&self) {
        assert!(lock(&self.fence.records).is_empty(), "fence records left");
        assert!(
            lock(&self.fence.attached).is_empty(),
            "fence attachments left"
        );
        assert!(lock(&self.links.by_name).is_empty(), "links left");
        assert!(lock(&self.nft.links).is_empty(), "nftables links left");
        assert!(lock(&self.backend.running).is_empty(), "guests left");
        assert!(self.registry.by_id(1).is_none(), "registry entry left");
        assert_eq!(self.sup.count(), 0, "live sandboxes left");
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn request(name: &str) -> CreateSandbox {
    request_on(name, Some(FAKE.name))
}

/// A request for sandbox `name` on `backend` (`None`: without `--backend`).
fn request_on(name: &str, backend: Option<&str>) -> CreateSandbox {
    let mut req: CreateSandbox =
        serde_json::from_value(serde_json::json!({ "name": name })).expect("request");
    req.backend = backend.map(str::to_owned);
    req
}

/// The steps of a creation that succeeds, in order.
const CREATION: &[&str] = &[
    "store.reserve_for",
    "links.create_veth",
    "links.disable_ipv6",
    "links.add_address",
    "links.up",
    "fence.put",
    "guest.start",
    "links.ifindex",
    "links.move_to_netns",
    "links.configure_guest",
    "guest.serve",
    "nft.apply",
    "store.set_running",
    // sandbox.created, workspace.ready
    "store.add_event",
    "store.add_event",
];

#[tokio::test]
async fn creation_calls_each_step_in_order() {
    let w = World::new();
    let view = w.create("one").await.expect("created");
    assert_eq!(w.calls.steps(), CREATION);
    assert_eq!(view.backend, "fake");
    assert_eq!(view.backend_reason, "--backend fake");
    assert_eq!(view.state, "running");
    assert_eq!(view.link, "svc1");
    assert_eq!(w.rows(), ["one"]);
    assert_eq!(lock(&w.fence.attached).len(), 1);
    assert!(lock(&w.nft.links).contains("svc1"));
    assert!(w.registry.by_id(view.id).is_some());
}

#[tokio::test]
async fn a_backend_added_through_the_registry_is_the_default_and_answers_to_its_alias() {
    let w = World::new();
    let view = w.created(request_on("aliased", Some("pretend"))).await;
    assert_eq!(view.backend, FAKE.name);
    let view = w.created(request_on("unasked", None)).await;
    assert_eq!(view.backend, FAKE.name);
    assert_eq!(view.backend_reason, "the default (svcd's embedded backend)");
}

#[tokio::test]
async fn an_unknown_or_absent_backend_is_refused_before_anything_is_built() {
    let w = World::new();
    let f = w.refused(request_on("nope", Some("firecracker"))).await;
    assert_eq!(f.status, 400);
    assert!(
        f.message.contains("--backend \"firecracker\""),
        "{}",
        f.message
    );
    let f = w.refused(request_on("nope", Some("microvm"))).await;
    assert_eq!(f.status, 409);
    assert_eq!(
        f.message,
        "--backend microvm: this svcd does not offer that backend (it offers: fake): this svcd \
         runs without the microvm backend"
    );
    assert!(w.calls.steps().is_empty());
    w.assert_empty();
}

#[tokio::test]
async fn allowed_branches_come_from_the_request_and_a_bad_pattern_builds_nothing() {
    let w = World::new();
    let view = w.created(request("plain")).await;
    assert_eq!(view.allowed_branches, ["refs/heads/svc/**"], "the default");
    let mut req = request("pod");
    req.allowed_branches = vec!["refs/heads/agent/*".into(), "refs/heads/agent/*".into()];
    let view = w.created(req).await;
    assert_eq!(view.allowed_branches, ["refs/heads/agent/*"]);
    let mut req = request("bad");
    req.allowed_branches = vec!["main".into()];
    let f = w.refused(req).await;
    assert_eq!(f.status, 400);
    assert!(
        f.message.starts_with("allowed branch \"main\": "),
        "{}",
        f.message
    );
    assert_eq!(w.rows(), ["plain", "pod"]);
}

#[tokio::test]
async fn a_workspace_runtime_falls_back_along_the_preference_list() {
    let w = World::new();
    let mut req = request_on("auto", None);
    req.runtime_required = Some(Vec::new());
    let view = w.created(req).await;
    // The registry holds the fake alone: each kind of `runtime::KINDS` says why it is not
    // offered, and the fake (registered, after them) is taken.
    assert_eq!(view.backend, FAKE.name);
    assert_eq!(
        view.backend_reason,
        "runtime.required is empty: automatic, fake (this svcd runs without the microvm \
         backend; this svcd runs without the container backend)"
    );
    let mut req = request_on("required", None);
    req.runtime_required = Some(vec![crate::config::workspace::Backend::MICROVM]);
    let f = w.refused(req).await;
    assert_eq!(f.status, 409);
    assert_eq!(
        f.message,
        "the workspace's runtime.required cannot be met here: microvm is not offered: this \
         svcd runs without the microvm backend"
    );
}

/// Creation failing at `step`: refused, and nothing it built is left.
async fn fails_and_rolls_back(step: &'static str) {
    let w = World::new();
    w.calls.fail_on(step);
    let f = w.create("doomed").await.expect_err("creation fails");
    assert_eq!(f.status, 500, "{step}: {}", f.message);
    let steps = w.calls.steps();
    let at = steps.iter().position(|s| s == step).expect("step reached");
    assert_eq!(&steps[..=at], &CREATION[..=at], "{step}");
    assert!(
        steps[at + 1..].contains(&"guest.stop".to_owned()),
        "{step}: {steps:?}"
    );
    w.assert_empty();
    // The name is free again, and a second attempt succeeds.
    w.calls.clear();
    w.create("doomed").await.expect("created");
}

#[tokio::test]
async fn a_failed_link_rolls_back() {
    fails_and_rolls_back("links.create_veth").await;
}

#[tokio::test]
async fn a_failed_fence_rolls_back() {
    fails_and_rolls_back("fence.put").await;
}

#[tokio::test]
async fn a_failed_guest_rolls_back() {
    fails_and_rolls_back("guest.start").await;
}

#[tokio::test]
async fn a_failed_guest_link_rolls_back() {
    fails_and_rolls_back("links.configure_guest").await;
}

#[tokio::test]
async fn a_failed_relay_rolls_back() {
    fails_and_rolls_back("guest.serve").await;
}

#[tokio::test]
async fn a_failed_nftables_write_rolls_back() {
    fails_and_rolls_back("nft.apply").await;
}

#[tokio::test]
async fn destroy_removes_everything() {
    let w = World::new();
    w.create("gone").await.expect("created");
    w.calls.clear();
    let d = w.sup.destroy("gone").await.expect("destroyed");
    assert_eq!(
        d.removed,
        [
            "fence map entries",
            "fence on svc1",
            "guest gone",
            "link svc1",
            "nftables link set entry",
            &format!("files {}", w.sup.sandbox_dir("gone").display()),
            "state row",
        ]
    );
    w.assert_empty();
    let f = w.sup.destroy("gone").await.expect_err("no such sandbox");
    assert_eq!(f.status, 404);
}

#[tokio::test]
async fn a_restart_readopts_a_live_guest() {
    let mut w = World::new();
    w.create("kept").await.expect("created");
    w.calls.clear();
    w.restart();
    w.sup.reconcile().await.expect("reconciled");
    let view = w.sup.show("kept").expect("adopted");
    assert_eq!(view.state, "running");
    assert!(w.registry.by_id(view.id).is_some());
    assert_eq!(lock(&w.fence.records).len(), 1);
    let steps = w.calls.steps();
    assert!(steps.contains(&"fence.put".to_owned()), "{steps:?}");
    assert!(steps.contains(&"guest.serve".to_owned()), "{steps:?}");
    assert!(!steps.contains(&"guest.stop".to_owned()), "{steps:?}");
}

#[tokio::test]
async fn a_restart_readopts_a_paused_guest_paused_and_its_destroy_thaws_it_first() {
    let mut w = World::new();
    w.create("held").await.expect("created");
    w.sup.lifecycle("held", "pause").await.expect("paused");
    w.restart();
    w.sup.reconcile().await.expect("reconciled");
    assert_eq!(w.sup.show("held").expect("adopted").state, "paused");
    w.calls.clear();
    w.sup.destroy("held").await.expect("destroyed");
    let steps = w.calls.steps();
    let at = |step: &str| steps.iter().position(|s| s == step);
    assert!(
        at("guest.resume").is_some() && at("guest.resume") < at("guest.stop"),
        "thawed, then stopped: {steps:?}"
    );
    w.assert_empty();
}

#[tokio::test]
async fn a_restart_finds_a_dead_guest_and_closes_its_fence() {
    let mut w = World::new();
    w.create("dead").await.expect("created");
    lock(&w.backend.running).clear();
    w.restart();
    w.sup.reconcile().await.expect("reconciled");
    let view = w.sup.show("dead").expect("still listed");
    assert_eq!(view.state, "dead");
    assert!(lock(&w.fence.records).is_empty(), "its fence record goes");
    assert!(w.registry.by_id(view.id).is_none());
    // Destroying it cleans up the rest.
    w.sup.destroy("dead").await.expect("destroyed");
    w.assert_empty();
}

#[tokio::test]
async fn a_restart_removes_a_half_built_sandbox() {
    let w = World::with_half_built("half");
    w.sup.reconcile().await.expect("reconciled");
    assert!(w.sup.show("half").is_err());
    assert!(w.calls.steps().contains(&"guest.stop".to_owned()));
    w.assert_empty();
}
