//! `svc secret set|list|show|rm|rotate|share|unshare|allow|disallow`: the named secret store on
//! the host. Values come from standard input or a file, never from the command line (where `ps`
//! and shell history would keep them); they are sealed with the host key in svcd's state and
//! never shown again. Sandboxes use them with `--secret VAR@store:NAME`. A secret is its
//! owner's (the uid that stored it): only the owner and root may use it, unless the owner
//! shares it with a group. Kubernetes pods name them in `svc.dev/secrets`, each secret only
//! from the pod namespaces it is allowed for (`allow`; none by default).

use std::{io::Read as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::Subcommand;
use http::Method;
use svc_control::api::{
    OAuthSpec, PodNamespacesChange, RotateSecret, SecretInfo, SecretValue, SetSecret, ShareSecret,
};

use crate::{
    client::{Client, SocketArg},
    out::owner_text,
};

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store a new secret. The value is read from standard input (or --from-file); one
    /// trailing newline is dropped.
    #[command(
        after_help = "Examples:\n  gh auth token | svc secret set gh\n  svc secret set registry --from-file /root/registry-token\n  svc sandbox create --repo acme/widget --secret CODE_HOST_TOKEN@store:gh dev\n  svc secret set mcp --oauth-token-endpoint https://id.example.com/oauth/token < refresh-token\n\nWith --oauth-token-endpoint the value is an OAuth refresh token: svcd exchanges it at once \n(a refusal stores nothing), then keeps the access token fresh on the host; sandboxes given \nthe secret swap their placeholder for whatever access token is current."
    )]
    Set {
        /// The new secret's name (sandboxes use it as store:NAME).
        name: String,
        /// Read the value from this file instead of standard input.
        #[arg(long, value_name = "PATH")]
        from_file: Option<PathBuf>,
        /// The value is a refresh token for this OAuth token endpoint (https://…).
        #[arg(long, value_name = "URL")]
        oauth_token_endpoint: Option<String>,
        /// The client_id sent with the refresh grant.
        #[arg(long, value_name = "ID", requires = "oauth_token_endpoint")]
        oauth_client_id: Option<String>,
        /// Let pods of this Kubernetes namespace name the secret in `svc.dev/secrets`
        /// (repeatable; `*`: every namespace). Default: no pod may.
        #[arg(long = "pod-namespace", value_name = "NAMESPACE")]
        pod_namespaces: Vec<String>,
        /// Print the secret's record (never its value) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the stored secrets you may use: names, versions, times and owners, never values.
    #[command(visible_alias = "ls")]
    List {
        #[command(flatten)]
        output: crate::output::OutputArgs,
    },
    /// Show one stored secret you may use: its version, times, owner, sharing and the pod
    /// namespaces allowed to name it, never its value.
    Show {
        /// The secret's name.
        name: String,
        #[command(flatten)]
        output: crate::output::OutputArgs,
    },
    /// Let pods of Kubernetes namespaces name a secret of yours in their `svc.dev/secrets`
    /// annotation (on this node). A pod may name only the secrets allowed for its namespace;
    /// a new secret is allowed for none. `--pod-namespace '*'` allows every namespace: every
    /// author of an svc pod on this node may then use it.
    #[command(
        after_help = "Examples:\n  svc secret allow acme-bot --pod-namespace team-a\n  svc secret allow ci-token --pod-namespace team-a --pod-namespace team-b\n  svc secret disallow acme-bot --pod-namespace team-a"
    )]
    Allow {
        /// The secret's name.
        name: String,
        /// A Kubernetes namespace (repeatable), or `*` for every namespace.
        #[arg(long = "pod-namespace", value_name = "NAMESPACE", required = true)]
        pod_namespaces: Vec<String>,
        /// Print the secret's record (never its value) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop letting pods of Kubernetes namespaces name a secret (`*` removes only the `*`
    /// entry). Sandboxes that were issued its value keep it until destroyed.
    Disallow {
        /// The secret's name.
        name: String,
        /// A Kubernetes namespace (repeatable), or `*`.
        #[arg(long = "pod-namespace", value_name = "NAMESPACE", required = true)]
        pod_namespaces: Vec<String>,
        /// Print the secret's record (never its value) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a secret. Sandboxes that were issued its value keep it until destroyed.
    #[command(visible_alias = "remove")]
    Rm {
        /// The secret's name.
        name: String,
        /// Print the secret's record (never its value) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give a secret a new value (from standard input or --from-file). Sandboxes created from
    /// now on get the new value; running ones keep the value they were issued until they are
    /// destroyed (an svcd restart does not change it).
    Rotate {
        /// The secret's name.
        name: String,
        /// Read the new value from this file instead of standard input.
        #[arg(long, value_name = "PATH")]
        from_file: Option<PathBuf>,
        /// Print the secret's record (never its value) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Let the members of a unix group use a secret of yours in their sandboxes
    /// (`--secret VAR@store:NAME`), as a file's group bit does. They cannot rotate, remove or
    /// share it. One group at a time: sharing again replaces it.
    #[command(after_help = "Example:\n  svc secret share gh --group devs")]
    Share {
        /// The secret's name.
        name: String,
        /// The group (name or gid), as the host knows it.
        #[arg(long, value_name = "GROUP")]
        group: String,
        /// Print the secret's record (never its value) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop sharing a secret: only its owner (and root) may use it again. Sandboxes that were
    /// issued its value keep it until destroyed.
    Unshare {
        /// The secret's name.
        name: String,
        /// Print the secret's record (never its value) as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The value from `file`, or standard input (refused when it is a terminal: a value typed
/// there would echo).
fn read_value(file: Option<&PathBuf>) -> anyhow::Result<String> {
    let mut v = match file {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => {
            anyhow::ensure!(
                !std::io::IsTerminal::is_terminal(&std::io::stdin()),
                "pipe the value in (e.g. `gh auth token | svc secret set NAME`) or give --from-file: it is never taken from the command line or typed with echo"
            );
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the value from standard input")?;
            s
        }
    };
    if v.ends_with('\n') {
        v.pop();
        if v.ends_with('\r') {
            v.pop();
        }
    }
    Ok(v)
}

/// Read a `VAR@SOURCE` secret.
pub fn read_secret(spec: &str) -> anyhow::Result<SecretValue> {
    let (name, source) = spec.split_once('@').with_context(|| {
        format!("--secret {spec:?}: expected VAR@SOURCE, e.g. CODE_HOST_TOKEN@env:GH_TOKEN")
    })?;
    anyhow::ensure!(
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
        "--secret {spec:?}: {name:?} is not a credential variable name (A-Z, 0-9, _)"
    );
    let value = match source.split_once(':') {
        Some(("env", var)) => std::env::var(var).with_context(|| {
            format!("--secret {name}@{source}: environment variable {var} is not set")
        })?,
        Some(("file", path)) => {
            let mut v = std::fs::read_to_string(path)
                .with_context(|| format!("--secret {name}@{source}: reading {path}"))?;
            if v.ends_with('\n') {
                v.pop();
                if v.ends_with('\r') {
                    v.pop();
                }
            }
            v
        }
        // svcd reads it from its store at creation (svc secret set NAME).
        Some(("store", _)) => String::new(),
        _ => anyhow::bail!(
            "--secret {name}@{source}: unknown source; use env:VAR, file:PATH or store:NAME"
        ),
    };
    Ok(SecretValue {
        name: name.to_owned(),
        source: source.to_owned(),
        value,
    })
}

fn show(json: bool, what: &str, s: &SecretInfo) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(s)?);
    } else {
        outln!("{what} secret {} (version {})", s.name, s.version);
        match (&s.shared_group, s.shared_gid) {
            (Some(g), _) => outln!("  shared with group {g}"),
            (None, Some(gid)) => outln!("  shared with gid {gid}"),
            (None, None) => {}
        }
        if !s.pod_namespaces.is_empty() {
            outln!("  pods may name it from: {}", pods_text(s));
        }
    }
    Ok(())
}

/// The pod namespaces allowed to name a secret, for people: `-` for none.
fn pods_text(s: &SecretInfo) -> String {
    if s.pod_namespaces.is_empty() {
        "-".to_owned()
    } else {
        s.pod_namespaces.join(",")
    }
}

/// `svc secret show NAME`: the one the caller may see by that name, as `svc secret list` has it.
async fn show_one(
    client: &Client,
    name: &str,
    format: crate::output::Format,
) -> anyhow::Result<()> {
    let all: Vec<SecretInfo> = client
        .call::<(), _>(Method::GET, "/v1/secrets", None)
        .await?;
    let s = all
        .iter()
        .find(|s| s.name == name)
        .with_context(|| format!("no secret named {name:?} (svc secret list shows them)"))?;
    crate::output::one(format, s, |s| {
        outln!("secret {} (version {}, {})", s.name, s.version, s.kind);
        outln!("  created  {}", s.created_at);
        outln!("  updated  {}", s.updated_at);
        if let Some(e) = &s.expires_at {
            outln!("  expires  {e}");
        }
        outln!("  owner    {}", owner_text(s.owner_uid, s.owner.as_deref()));
        let shared = match (&s.shared_group, s.shared_gid) {
            (Some(g), _) => g.clone(),
            (None, Some(gid)) => format!("gid {gid}"),
            (None, None) => "-".to_owned(),
        };
        outln!("  shared   {shared}");
        outln!(
            "  pods     {} (Kubernetes namespaces whose pods may name it)",
            pods_text(s)
        );
    })?;
    Ok(())
}

/// Allow (`allow`) or disallow pods of `namespaces` to name the secret `name`.
async fn pod_namespaces(
    client: &Client,
    name: &str,
    change: PodNamespacesChange,
    json: bool,
    what: &str,
) -> anyhow::Result<()> {
    let s: SecretInfo = client
        .call(
            Method::POST,
            &format!("/v1/secrets/{name}/pod-namespaces"),
            Some(&change),
        )
        .await?;
    if json {
        return show(true, what, &s);
    }
    outln!("{what} secret {} (version {})", s.name, s.version);
    outln!("  pods may name it from: {}", pods_text(&s));
    Ok(())
}

pub fn run(cmd: SecretCommand, socket: &SocketArg) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket.socket);
    let rt = crate::client::runtime()?;
    rt.block_on(async move {
        match cmd {
            SecretCommand::Set {
                name,
                from_file,
                oauth_token_endpoint,
                oauth_client_id,
                pod_namespaces,
                json,
            } => {
                let value = read_value(from_file.as_ref())?;
                let oauth = oauth_token_endpoint.map(|token_endpoint| OAuthSpec {
                    token_endpoint,
                    client_id: oauth_client_id,
                });
                let set = SetSecret {
                    name,
                    value,
                    oauth,
                    pod_namespaces,
                };
                let s: SecretInfo = client.call(Method::POST, "/v1/secrets", Some(&set)).await?;
                show(json, "stored", &s)?;
            }
            SecretCommand::Rotate {
                name,
                from_file,
                json,
            } => {
                let value = read_value(from_file.as_ref())?;
                let s: SecretInfo = client
                    .call(
                        Method::POST,
                        &format!("/v1/secrets/{name}/rotate"),
                        Some(&RotateSecret { value }),
                    )
                    .await?;
                show(json, "rotated", &s)?;
            }
            SecretCommand::List { output } => list(&client, output.format()).await?,
            SecretCommand::Show { name, output } => {
                show_one(&client, &name, output.format()).await?;
            }
            SecretCommand::Allow {
                name,
                pod_namespaces: allow,
                json,
            } => {
                let change = PodNamespacesChange {
                    allow,
                    disallow: Vec::new(),
                };
                pod_namespaces(&client, &name, change, json, "allowed").await?;
            }
            SecretCommand::Disallow {
                name,
                pod_namespaces: disallow,
                json,
            } => {
                let change = PodNamespacesChange {
                    allow: Vec::new(),
                    disallow,
                };
                pod_namespaces(&client, &name, change, json, "disallowed").await?;
            }
            SecretCommand::Share { name, group, json } => {
                share(&client, &name, Some(group), json, "shared").await?;
            }
            SecretCommand::Unshare { name, json } => {
                share(&client, &name, None, json, "unshared").await?;
            }
            SecretCommand::Rm { name, json } => {
                let s: SecretInfo = client
                    .call::<(), _>(Method::DELETE, &format!("/v1/secrets/{name}"), None)
                    .await?;
                show(json, "removed", &s)?;
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `svc secret list`: one line per secret, or all of them as `-o` asks.
async fn list(client: &Client, format: crate::output::Format) -> anyhow::Result<()> {
    let all: Vec<SecretInfo> = client
        .call::<(), _>(Method::GET, "/v1/secrets", None)
        .await?;
    crate::output::list(format, &all, |all, _wide| print_secrets(all))?;
    Ok(())
}

/// The secrets as a table for people (every column fits `-o wide` already).
fn print_secrets(all: &[SecretInfo]) {
    if all.is_empty() {
        outln!("no secrets (store one: svc secret set NAME < value)");
    } else {
        outln!(
            "{:<32} {:>7}  {:<5}  {:<24}  {:<24}  {:<24}  {:<12}  {:<16}  OWNER",
            "NAME",
            "VERSION",
            "KIND",
            "CREATED",
            "UPDATED",
            "EXPIRES",
            "SHARED",
            "POD-NAMESPACES"
        );
        for s in all {
            outln!(
                "{:<32} {:>7}  {:<5}  {:<24}  {:<24}  {:<24}  {:<12}  {:<16}  {}",
                s.name,
                s.version,
                s.kind,
                s.created_at,
                s.updated_at,
                s.expires_at.as_deref().unwrap_or("-"),
                s.shared_group.as_deref().unwrap_or("-"),
                pods_text(s),
                owner_text(s.owner_uid, s.owner.as_deref())
            );
        }
    }
}

/// Share the secret `name` with `group`, or with no group any more.
async fn share(
    client: &Client,
    name: &str,
    group: Option<String>,
    json: bool,
    what: &str,
) -> anyhow::Result<()> {
    let s: SecretInfo = client
        .call(
            Method::POST,
            &format!("/v1/secrets/{name}/share"),
            Some(&ShareSecret { group }),
        )
        .await?;
    show(json, what, &s)
}
