//! The backends an svcd has, as a registry: a map from backend kind to `Arc<dyn Backend>`,
//! each saying whether it can make sandboxes now ([`Backend::availability`]) and what it is
//! ([`Backend::describe`]). Adding a backend is one module under `runtime/`, its kind in
//! [`crate::kinds`], and its adapter below; nothing else compares a backend's name.

use std::{collections::BTreeMap, sync::Arc};

use super::{
    Backend, BoxFuture, ExecHandle, GuestCommand, GuestHandle, GuestLinks, GuestService, GuestSpec,
    RuntimeError, SharedDir, Snapshot, Started,
};

pub use crate::kinds::{CONTAINER, KINDS, Kind, MICROVM, choices};

/// What a backend is, for `svc`, doctor and creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Description {
    pub kind: Kind,
    /// One line for people.
    pub summary: &'static str,
    /// What separates the guest from the host.
    pub isolates_with: &'static str,
    /// Whether it can fork a running sandbox (snapshot its memory for clones).
    pub can_fork: bool,
    /// Whether it can keep paths under a shared directory read-only in the guest (a
    /// workspace's `.git/config` and `.git/hooks`).
    pub read_only_subpaths: bool,
    /// Whether it can share a directory into a running guest (a warm pool's, claimed by a
    /// request with shared directories: [`Backend::share_into`]).
    pub share_into_running: bool,
}

impl Description {
    /// A backend that says nothing of itself: its name, no capabilities.
    pub const fn bare(name: &'static str) -> Self {
        Self {
            kind: Kind {
                name,
                aliases: &[],
                about: "",
            },
            summary: "",
            isolates_with: "",
            can_fork: false,
            read_only_subpaths: false,
            share_into_running: false,
        }
    }
}

/// The container backend's description.
pub const CONTAINER_ABOUT: Description = Description {
    kind: CONTAINER,
    summary: "an unprivileged OCI container: the embedded default; shares the host's kernel",
    isolates_with: "a user namespace, its own root file system, seccomp and cgroup limits",
    can_fork: false,
    read_only_subpaths: true,
    share_into_running: true,
};

/// The microvm backend's description.
pub const MICROVM_ABOUT: Description = Description {
    kind: MICROVM,
    summary: "a microVM guest (QEMU -M microvm): the isolation boundary for hostile code",
    isolates_with: "a guest kernel of its own under KVM (or TCG)",
    can_fork: true,
    read_only_subpaths: false,
    share_into_running: false,
};

/// The backends an svcd has, by kind; `default` makes a sandbox nobody chose a backend for.
#[derive(Clone)]
pub struct Backends {
    by_name: BTreeMap<&'static str, Arc<dyn Backend>>,
    default: Arc<dyn Backend>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("kinds", &self.by_name.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Backends {
    /// A registry holding `default` (the embedded backend, always offered).
    pub fn new(default: Arc<dyn Backend>) -> Self {
        let mut by_name = BTreeMap::new();
        by_name.insert(default.describe().kind.name, default.clone());
        Self { by_name, default }
    }

    /// The registry with `backend` added (replacing one of its kind).
    #[must_use]
    pub fn with(mut self, backend: Arc<dyn Backend>) -> Self {
        self.by_name.insert(backend.describe().kind.name, backend);
        self
    }

    /// The backend `name` stands for (as stored in a sandbox's envelope; old names included);
    /// the default for a name no registered backend answers to, as before kinds were recorded.
    pub fn get(&self, name: &str) -> Arc<dyn Backend> {
        self.registered(name)
            .unwrap_or_else(|| self.default.clone())
    }

    /// The registered backend `name` stands for.
    fn registered(&self, name: &str) -> Option<Arc<dyn Backend>> {
        self.by_name
            .values()
            .find(|b| b.describe().kind.answers_to(name))
            .cloned()
    }

    /// The kind `name` stands for, registered here or not: its canonical name.
    pub fn canonical(&self, name: &str) -> Option<&'static str> {
        self.registered(name)
            .map(|b| b.describe().kind)
            .or_else(|| KINDS.iter().copied().find(|k| k.answers_to(name)))
            .map(|k| k.name)
    }

    /// The default backend's kind name.
    pub fn default_name(&self) -> &'static str {
        self.default.describe().kind.name
    }

    /// The kinds that can make a sandbox now, the default first.
    pub fn offered(&self) -> Vec<&'static str> {
        let mut v = vec![self.default_name()];
        v.extend(
            self.by_name
                .iter()
                .filter(|(n, b)| **n != self.default_name() && b.availability().is_ok())
                .map(|(n, _)| *n),
        );
        v
    }

    /// Every kind, strongest isolation first ([`KINDS`]), then any other registered here.
    pub fn preference(&self) -> Vec<&'static str> {
        let known: Vec<&'static str> = KINDS.iter().map(|k| k.name).collect();
        let others = self.by_name.keys().filter(|n| !known.contains(n));
        let others: Vec<&'static str> = others.copied().collect();
        [known, others].concat()
    }

    /// Why kind `name` cannot make a sandbox here; `None` when it can.
    pub fn why_not(&self, name: &str) -> Option<String> {
        match self.registered(name) {
            None => Some(format!("this svcd runs without the {name} backend")),
            Some(b) => b.availability().err(),
        }
    }

    /// Why a sandbox of kind `name` cannot be forked here (its backend cannot snapshot a
    /// guest's memory), naming the registered kinds that can; `None` when it can.
    pub fn why_no_fork(&self, name: &str) -> Option<String> {
        let about = self.get(name).describe();
        if about.can_fork {
            return None;
        }
        let can: Vec<&str> = (self.by_name.values())
            .map(|b| b.describe())
            .filter(|d| d.can_fork)
            .map(|d| d.kind.name)
            .collect();
        let hint = if can.is_empty() {
            String::new()
        } else {
            format!(": use --backend {}", can.join(" or "))
        };
        Some(format!(
            "the {} backend cannot fork a sandbox (it cannot snapshot a guest's memory{hint})",
            about.kind.name
        ))
    }

    /// Every registered backend, by kind name.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Backend>> {
        self.by_name.values()
    }

    /// What each registered backend is, with why it cannot make sandboxes if it cannot.
    pub fn describe_all(&self) -> Vec<(Description, Result<(), String>)> {
        self.by_name
            .values()
            .map(|b| (b.describe(), b.availability()))
            .collect()
    }
}

/// A backend with what the registry asks of it beside its own trait methods: its
/// description, and how to read its availability and accelerator from its public methods.
/// (The backend's module keeps its internals; this forwards everything else to it.)
pub struct Described<B> {
    inner: Arc<B>,
    about: Description,
    availability: fn(&B) -> Result<(), String>,
    accel: fn(&B) -> Option<String>,
    details: fn(&B) -> Vec<(&'static str, String)>,
}

impl<B: Backend> Described<B> {
    /// `inner` described as `about`, always available, with no accelerator.
    pub fn new(inner: Arc<B>, about: Description) -> Self {
        Self {
            inner,
            about,
            availability: |_| Ok(()),
            accel: |_| None,
            details: |_| Vec::new(),
        }
    }

    /// Availability read with `f`.
    #[must_use]
    pub fn availability(mut self, f: fn(&B) -> Result<(), String>) -> Self {
        self.availability = f;
        self
    }

    /// The accelerator read with `f`.
    #[must_use]
    pub fn accel(mut self, f: fn(&B) -> Option<String>) -> Self {
        self.accel = f;
        self
    }

    /// The details read with `f`.
    #[must_use]
    pub fn details(mut self, f: fn(&B) -> Vec<(&'static str, String)>) -> Self {
        self.details = f;
        self
    }
}

/// The container backend, described.
pub fn container(c: Arc<super::Container>) -> Arc<dyn Backend> {
    Arc::new(Described::new(c, CONTAINER_ABOUT))
}

/// The microvm backend, described: available when its images are configured, its
/// accelerator and why it was chosen, and the images it boots.
pub fn microvm(m: Arc<super::Microvm>) -> Arc<dyn Backend> {
    Arc::new(
        Described::new(m, MICROVM_ABOUT)
            .availability(|m| m.unavailable().map_or(Ok(()), |why| Err(why.to_owned())))
            .accel(|m| {
                let (accel, why) = m.accel();
                Some(format!("{accel} ({why})"))
            })
            .details(|m| {
                let Some(images) = m.images() else {
                    return Vec::new();
                };
                let shown = |p: &std::path::Path| p.display().to_string();
                let mut v = vec![
                    ("kernel", shown(&images.kernel)),
                    ("rootfs", shown(&images.rootfs)),
                ];
                v.extend(images.initrd.as_deref().map(|p| ("initrd", shown(p))));
                v
            }),
    )
}

impl<B: Backend> Backend for Described<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn availability(&self) -> Result<(), String> {
        (self.availability)(&self.inner)
    }
    fn describe(&self) -> Description {
        self.about
    }
    fn accel(&self) -> Option<String> {
        (self.accel)(&self.inner)
    }
    fn details(&self) -> Vec<(&'static str, String)> {
        (self.details)(&self.inner)
    }
    fn start<'a>(
        &'a self,
        spec: &'a GuestSpec,
        links: &'a dyn GuestLinks,
    ) -> BoxFuture<'a, Result<Started, RuntimeError>> {
        self.inner.start(spec, links)
    }
    fn alive(&self, guest: &GuestHandle) -> bool {
        self.inner.alive(guest)
    }
    fn stop<'a>(
        &'a self,
        name: &'a str,
        dir: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>> {
        self.inner.stop(name, dir)
    }
    fn serve_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        dir: &'a std::path::Path,
        service: GuestService,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.inner.serve_guest(guest, dir, service)
    }
    fn exec<'a>(
        &'a self,
        guest: &'a GuestHandle,
        cmd: &'a GuestCommand,
    ) -> BoxFuture<'a, Result<ExecHandle, RuntimeError>> {
        self.inner.exec(guest, cmd)
    }
    fn pause<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.inner.pause(guest)
    }
    fn resume<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.inner.resume(guest)
    }
    fn paused<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        self.inner.paused(guest)
    }
    fn snapshot<'a>(
        &'a self,
        guest: &'a GuestHandle,
        into: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<Snapshot, RuntimeError>> {
        self.inner.snapshot(guest, into)
    }
    fn claim_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        claim: &'a super::Claim,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.inner.claim_guest(guest, claim)
    }
    fn share_into<'a>(
        &'a self,
        guest: &'a GuestHandle,
        id: u32,
        dir: &'a std::path::Path,
        dirs: &'a [SharedDir],
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.inner.share_into(guest, id, dir, dirs)
    }
    fn attach_root<'a>(
        &'a self,
        guest: &'a GuestHandle,
        id: u32,
        dir: &'a std::path::Path,
        ctr: &'a str,
        layers: &'a [std::path::PathBuf],
    ) -> BoxFuture<'a, Result<crate::runtime::pod_root::RootIn, RuntimeError>> {
        self.inner.attach_root(guest, id, dir, ctr, layers)
    }
    fn detach_root<'a>(
        &'a self,
        guest: &'a GuestHandle,
        dir: &'a std::path::Path,
        ctr: &'a str,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        self.inner.detach_root(guest, dir, ctr)
    }
    fn root_attached(&self, dir: &std::path::Path, ctr: &str) -> Option<String> {
        self.inner.root_attached(dir, ctr)
    }
}

#[cfg(test)]
mod kind_tests {
    use super::*;
    use crate::config::workspace::{Backend, Runtime, json_schema};

    /// The CLI's `--backend` choices, the workspace schema's `runtime.required` enum and the
    /// names the registry answers to are one list: every kind's name and old names.
    #[test]
    fn the_cli_the_schema_and_the_registry_name_the_same_kinds() {
        let schema = json_schema::<Runtime>();
        let mut in_schema: Vec<&str> = schema["$defs"]["Backend"]["oneOf"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v["const"].as_str()).collect())
            .unwrap_or_default();
        let mut cli = choices();
        assert_eq!(cli[..2], ["container", "netns"], "the default first");
        let mut answered: Vec<&str> = KINDS.iter().flat_map(Kind::names).collect();
        for n in &answered {
            assert!(Backend::named(n).is_some(), "a workspace may name {n}");
        }
        in_schema.sort_unstable();
        cli.sort_unstable();
        answered.sort_unstable();
        assert_eq!(in_schema, cli);
        assert_eq!(cli, answered);
    }
}
