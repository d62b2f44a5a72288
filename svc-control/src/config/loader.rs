//! The only part of `config` that touches the filesystem: finds a workspace's files, reads them
//! with a size cap, and hands their text to the parsers.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::{
    ConfigError, ConfigErrors, Location, MAX_FILE_BYTES, compose,
    effective::{self, ApiParams, EffectiveWorkspace},
    egress::{self, EgressConfig},
    host::{self, HostConfig},
    workspace::{self, Workspace},
};

/// Relative paths of a workspace's configuration files.
pub const WORKSPACE_JSON: &str = ".svc/workspace.json";
pub const CONFIG_YAML: &str = ".svc/config.yaml";
pub const DOTENV: &str = ".env";

/// The compose file that was used, and the others that were present but ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComposeLoaded {
    pub file: PathBuf,
    pub ignored: Vec<PathBuf>,
    pub ports: compose::ComposePorts,
}

/// Everything a workspace directory configures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadedWorkspace {
    pub root: PathBuf,
    /// `.svc/workspace.json`, if present.
    pub workspace_file: Option<PathBuf>,
    /// `.svc/config.yaml`'s egress section, if present.
    pub egress: Option<EgressConfig>,
    /// The compose fallback, used only without a workspace.json.
    pub compose: Option<ComposeLoaded>,
    pub effective: EffectiveWorkspace,
    pub warnings: Vec<String>,
}

/// Load and validate every configuration file of the workspace at `root`. Every file is checked
/// and every error returned together.
pub fn load_workspace(
    root: &Path,
    api: &ApiParams,
    process_env: impl IntoIterator<Item = (String, String)>,
) -> Result<LoadedWorkspace, ConfigErrors> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();

    let ws_path = root.join(WORKSPACE_JSON);
    let workspace: Option<Workspace> = parse_optional(&ws_path, workspace::parse, &mut errors);
    let ws_present = ws_path.exists();
    let egress = parse_optional(&root.join(CONFIG_YAML), egress::parse, &mut errors);

    let mut compose_loaded = None;
    if !ws_present {
        let present: Vec<PathBuf> = compose::FILE_NAMES
            .iter()
            .map(|n| root.join(n))
            .filter(|p| p.is_file())
            .collect();
        if let Some((first, rest)) = present.split_first() {
            for ignored in rest {
                warnings.push(format!(
                    "{} is ignored: {} is used (first of {})",
                    ignored.display(),
                    first.display(),
                    compose::FILE_NAMES.join(", ")
                ));
            }
            let dotenv = parse_optional(&root.join(DOTENV), compose::parse_dotenv, &mut errors)
                .unwrap_or_default();
            let env = compose::Environment::new(dotenv, process_env);
            match read_optional(first) {
                Ok(Some(text)) => match compose::parse(first, &text, &env) {
                    Ok(ports) => {
                        compose_loaded = Some(ComposeLoaded {
                            file: first.clone(),
                            ignored: rest.to_vec(),
                            ports,
                        });
                    }
                    Err(e) => errors.extend(e.0),
                },
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
    }

    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let effective = effective::resolve(
        api,
        workspace.as_ref(),
        compose_loaded.as_ref().map(|c| &c.ports),
    );
    Ok(LoadedWorkspace {
        root: root.to_owned(),
        workspace_file: ws_present.then_some(ws_path),
        egress,
        compose: compose_loaded,
        effective,
        warnings,
    })
}

/// Read and parse `path` if it exists, adding any error to `errors`.
fn parse_optional<T>(
    path: &Path,
    parse: impl FnOnce(&Path, &str) -> Result<T, ConfigErrors>,
    errors: &mut Vec<ConfigError>,
) -> Option<T> {
    match read_optional(path) {
        Ok(Some(text)) => parse(path, &text).map_err(|e| errors.extend(e.0)).ok(),
        Ok(None) => None,
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

/// Load svcd's host configuration: `path` if given (it must exist), else
/// [`host::DEFAULT_PATH`] if it exists, else every default.
pub fn load_host_config(path: Option<&Path>) -> Result<HostConfig, ConfigErrors> {
    check_host_config(path).map(|c| c.config)
}

/// A host configuration as [`check_host_config`] found it.
#[derive(Debug, Clone)]
pub struct HostChecked {
    /// The file read, or the one that would have been (the default path, absent).
    pub file: PathBuf,
    /// Whether the file exists (when it does not, every default applies).
    pub present: bool,
    pub config: HostConfig,
    /// What is valid but likely not meant, each at its key's line.
    pub warnings: Vec<ConfigError>,
}

/// Load and validate svcd's configuration exactly as [`load_host_config`] does, with the
/// warnings beside it (`svcd check-config`).
pub fn check_host_config(path: Option<&Path>) -> Result<HostChecked, ConfigErrors> {
    let (path, required) = match path {
        Some(p) => (p.to_owned(), true),
        None => (PathBuf::from(host::DEFAULT_PATH), false),
    };
    match read_optional(&path)? {
        Some(text) => host::check(&path, &text).map(|(config, warnings)| HostChecked {
            file: path,
            present: true,
            config,
            warnings,
        }),
        None if required => {
            Err(ConfigError::new(&path, Location::default(), "file not found").into())
        }
        None => Ok(HostChecked {
            file: path,
            present: false,
            config: HostConfig::default(),
            warnings: Vec::new(),
        }),
    }
}

/// Read a UTF-8 text file of at most [`MAX_FILE_BYTES`]; `None` if it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>, ConfigError> {
    let fail = |message: String| ConfigError::new(path, Location::default(), message);
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(format!("cannot open: {e}"))),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(fail(format!(
            "file is larger than {MAX_FILE_BYTES} bytes; refusing to parse it"
        )));
    }
    String::from_utf8(bytes).map(Some).map_err(|e| {
        fail(format!(
            "not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })
}
