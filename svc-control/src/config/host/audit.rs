//! `[audit]`: how much of the audit log svcd keeps on disk (the file's size cap and how many
//! rotated files it keeps beside it).

use serde::{Deserialize, Serialize};

use super::defaults;

/// The largest `max_mib`: 1 TiB.
const MAX_MIB: u64 = 1 << 20;
/// The most rotated files `keep` may ask for.
const MAX_KEEP: u32 = 1000;

/// `[audit]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuditFile {
    /// The audit file's size in MiB at which it is rotated (1 to 1048576; default 256).
    pub max_mib: Option<u64>,
    /// Rotated files kept beside it, `audit.jsonl.1` (newest) to `audit.jsonl.N` (0 to 1000;
    /// default 1; 0: the full file is removed, not kept).
    pub keep: Option<u32>,
}

/// The audit log's retention, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AuditConfig {
    /// The size in bytes past which the file is rotated.
    pub max_bytes: u64,
    /// How many rotated files are kept.
    pub keep: u32,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            max_bytes: defaults::AUDIT_MAX_MIB << 20,
            keep: defaults::AUDIT_KEEP,
        }
    }
}

impl AuditFile {
    /// Check each key, reporting every error through `err`.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> AuditConfig {
        let max_mib = self.max_mib.unwrap_or(defaults::AUDIT_MAX_MIB);
        if !(1..=MAX_MIB).contains(&max_mib) {
            err(
                "audit.max_mib",
                format!("expected 1 to {MAX_MIB} (MiB the audit file may grow to), got {max_mib}"),
            );
        }
        let keep = self.keep.unwrap_or(defaults::AUDIT_KEEP);
        if keep > MAX_KEEP {
            err(
                "audit.keep",
                format!("expected 0 to {MAX_KEEP} (rotated audit files kept), got {keep}"),
            );
        }
        AuditConfig {
            max_bytes: max_mib.clamp(1, MAX_MIB) << 20,
            keep: keep.min(MAX_KEEP),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_keys_are_checked_with_their_range() {
        type Case = (&'static str, AuditFile, Option<&'static str>, AuditConfig);
        let cases: [Case; 5] = [
            (
                "defaults",
                AuditFile::default(),
                None,
                AuditConfig::default(),
            ),
            (
                "set",
                AuditFile {
                    max_mib: Some(64),
                    keep: Some(5),
                },
                None,
                AuditConfig {
                    max_bytes: 64 << 20,
                    keep: 5,
                },
            ),
            (
                "keep none",
                AuditFile {
                    max_mib: None,
                    keep: Some(0),
                },
                None,
                AuditConfig {
                    keep: 0,
                    ..AuditConfig::default()
                },
            ),
            (
                "zero size",
                AuditFile {
                    max_mib: Some(0),
                    keep: None,
                },
                Some(
                    "audit.max_mib: expected 1 to 1048576 (MiB the audit file may grow to), got 0",
                ),
                AuditConfig {
                    max_bytes: 1 << 20,
                    keep: 1,
                },
            ),
            (
                "too many kept",
                AuditFile {
                    max_mib: None,
                    keep: Some(5000),
                },
                Some("audit.keep: expected 0 to 1000 (rotated audit files kept), got 5000"),
                AuditConfig {
                    keep: 1000,
                    ..AuditConfig::default()
                },
            ),
        ];
        for (name, file, want_err, want) in cases {
            let mut errors = Vec::new();
            let got = file.validate(&mut |k: &str, m: String| errors.push(format!("{k}: {m}")));
            assert_eq!(errors, want_err.into_iter().collect::<Vec<_>>(), "{name}");
            assert_eq!(got, want, "{name}");
        }
    }
}
