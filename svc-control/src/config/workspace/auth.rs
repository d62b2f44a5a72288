//! `auth`: how the sandbox reaches the user's git credentials.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<AuthDefaults>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_profiles: Option<Vec<AuthProfile>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_agent_forward: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_credential_mode: Option<GitCredentialMode>,
    /// Let the sandbox write the project's `.git/config` and `.git/hooks` (default: false,
    /// they are read-only there). Whatever it writes there runs as you on the host at your
    /// next git command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_config_writable: Option<bool>,
}

/// Auth profiles: `gitconfig`, the only one this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AuthProfile {
    Gitconfig,
}

/// Git credential modes: `host-helper`, the only one this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GitCredentialMode {
    HostHelper,
}
