//! Compose fallback: with no `.svc/workspace.json`, the workspace's compose file
//! gives the ports Spotlight forwards on `workspace.ready`.
//!
//! Only what that needs is read: `services.*.ports` (short and long syntax), `services.*.profiles`
//! and the interpolation those values use. `expose` is never published. Everything else in the
//! file is left to Compose.
//!
//! This file walks the services; [`ports`] reads the port syntaxes, [`interpolate`] the
//! variables, [`dotenv`] the `.env` file.

mod dotenv;
mod interpolate;
mod ports;

use std::path::Path;

use serde::Serialize;
use serde_norway::Value;

pub use dotenv::parse_dotenv;
pub use interpolate::{Environment, interpolate};
pub use ports::{ComposeForward, Protocol};

use super::{ConfigError, ConfigErrors, Location};

/// Compose file names in the order they are looked for; the first one present wins and the
/// others are reported as ignored (the order Docker Compose itself uses: the Compose
/// specification's names first, then the `docker-compose` ones).
pub const FILE_NAMES: [&str; 4] = [
    "compose.yaml",
    "compose.yml",
    "docker-compose.yml",
    "docker-compose.yaml",
];

/// What the compose file yields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComposePorts {
    pub forwards: Vec<ComposeForward>,
    /// Services left out because none of their profiles is active (`COMPOSE_PROFILES`).
    pub inactive_services: Vec<String>,
}

/// Parse a compose file's text and extract its published ports.
pub fn parse(file: &Path, text: &str, env: &Environment) -> Result<ComposePorts, ConfigErrors> {
    let mut doc: Value = super::parse_yaml(file, text)?;
    doc.apply_merge().map_err(|e| {
        ConfigError::new(file, Location::default(), format!("YAML merge keys: {e}"))
    })?;
    let mut errors = Vec::new();
    let mut err = |path: String, message: String| {
        errors.push(ConfigError::new(file, Location::at(path), message));
    };
    let mut out = ComposePorts::default();
    let services = match doc.get("services") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Mapping(m)) => m,
        Some(_) => {
            err(
                "services".into(),
                "expected a mapping of service names to services".into(),
            );
            return Err(ConfigErrors(errors));
        }
    };
    let active = active_profiles(env);
    for (name, service) in services {
        service_ports(name, service, env, &active, &mut out, &mut err);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The profiles `COMPOSE_PROFILES` turns on.
fn active_profiles(env: &Environment) -> Vec<String> {
    env.get("COMPOSE_PROFILES")
        .map(|p| {
            p.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// One service's published ports into `out` (or its name into `out.inactive_services` when
/// none of its profiles is active).
fn service_ports(
    name: &Value,
    service: &Value,
    env: &Environment,
    active: &[String],
    out: &mut ComposePorts,
    err: &mut impl FnMut(String, String),
) {
    let Some(name) = name.as_str() else {
        err(
            "services".into(),
            format!("service names must be strings, got {name:?}"),
        );
        return;
    };
    let base = format!("services.{name}");
    let service = match service {
        Value::Mapping(m) => m,
        Value::Null => return,
        _ => {
            err(base, "expected a mapping".into());
            return;
        }
    };
    if let Some(profiles) = service.get("profiles") {
        let Some(names) = profile_names(profiles, &base, env, err) else {
            return;
        };
        if !names.is_empty() && !names.iter().any(|n| active.contains(n)) {
            out.inactive_services.push(name.to_owned());
            return;
        }
    }
    let Some(ports) = service.get("ports") else {
        return;
    };
    let Some(ports) = ports.as_sequence() else {
        err(format!("{base}.ports"), "expected a list of ports".into());
        return;
    };
    for (i, entry) in ports.iter().enumerate() {
        match ports::port_entry(name, entry, env) {
            Ok(fs) => out.forwards.extend(fs),
            Err(e) => err(format!("{base}.ports[{i}]"), e),
        }
    }
}

/// A service's `profiles`, interpolated; `None` (and an error) when it is not a list.
fn profile_names(
    profiles: &Value,
    base: &str,
    env: &Environment,
    err: &mut impl FnMut(String, String),
) -> Option<Vec<String>> {
    let Some(list) = profiles.as_sequence() else {
        err(
            format!("{base}.profiles"),
            "expected a list of profile names".into(),
        );
        return None;
    };
    let mut names = Vec::new();
    for (i, p) in list.iter().enumerate() {
        match p.as_str().map(|s| interpolate(s, env)) {
            Some(Ok(s)) => names.push(s),
            Some(Err(e)) => err(format!("{base}.profiles[{i}]"), e),
            None => err(format!("{base}.profiles[{i}]"), "expected a string".into()),
        }
    }
    Some(names)
}
