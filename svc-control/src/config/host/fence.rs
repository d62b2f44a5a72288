//! `fence_log_level`: the level the fence's programs write their diagnostics (aya-log) at.

use serde::Serialize;

/// The least severe of the programs' diagnostics that are written (aya-log's levels; the
/// programs skip the others without writing anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum LogLevel {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}
