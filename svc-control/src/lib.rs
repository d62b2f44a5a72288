//! svc's control plane: configuration, policy, the dataplane, and the svcd supervisor.

/// The svcd API types, shared with the CLI.
pub mod api;
/// Audit records of every layer, as JSON lines.
pub mod audit;
/// Parsing and validation of every configuration file svc reads.
pub mod config;
pub mod creds;
/// The wiring of the parts (svcd).
pub mod daemon;
/// The only code that talks to the kernel: eBPF, nftables, rtnetlink.
pub mod dataplane;
/// The DNS guard: policy-gated resolution that commits addresses to the fence first.
pub mod dns;
/// `svc doctor`'s workspace checks and their report.
pub mod doctor;
pub mod git_relay;
/// Host names and patterns in one normal form.
pub mod hosts;
/// The sandboxes' images, built on the host from Debian packages (`svcd images build`).
pub mod images;
/// The kinds of sandbox backend: the one list the registry, the CLI and the schema read.
pub mod kinds;
/// Per-guest budgets: how many of each channel one sandbox holds open in svcd.
pub mod limits;
/// Man pages from a command tree, with the sections beyond `--help`.
pub mod manual;
/// svcd's Prometheus metrics.
pub mod metrics;
/// Sandbox names.
pub mod names;
pub mod per_core;
/// Pure decisions: every security rule of the perimeter, once.
pub mod policy;
/// The TLS-intercepting HTTPS proxy.
pub mod proxy;
/// Sandbox backends (container, microvm).
pub mod runtime;
/// svcd's durable state (SQLite).
pub mod store;
/// Workspaces' lifecycle decisions: hook and check timeouts in the guest, readiness.
pub mod workspace;
