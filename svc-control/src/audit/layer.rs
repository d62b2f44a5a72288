//! The audit layers: one enum, from which the record's `layer` tag, the filter's choices and
//! the CLI's `--layer` values all come (a new layer is a new line here and a new
//! `AuditEvent` variant; the compiler points at the rest).

use serde::{Deserialize, Serialize};

/// Declares [`AuditLayer`], its names as written and the list of all of them, from one table.
macro_rules! layers {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// Which part of svc wrote a record: the `layer` of every audit line.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum AuditLayer {
            $($(#[$doc])* $variant,)*
        }

        impl AuditLayer {
            /// Every layer, in the order the schema and `svc audit --help` name them.
            pub const ALL: [AuditLayer; [$($name),*].len()] = [$(Self::$variant),*];

            /// Every layer's name as written, in the order of [`AuditLayer::ALL`].
            pub const NAMES: [&'static str; [$($name),*].len()] = [$($name),*];

            /// Its name as written in the record's `layer`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The layer named `name`, if there is one.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|l| l.as_str() == name)
            }
        }
    };
}

layers! {
    /// A packet the fence dropped.
    Packet => "packet",
    /// A DNS question the guard answered.
    Dns => "dns",
    /// A request through the proxy.
    Http => "http",
    /// A git-over-SSH session through the relay.
    Ssh => "ssh",
    /// A change of a running sandbox's policy.
    Policy => "policy",
    /// A refresh of a brokered credential.
    Credential => "credential",
    /// A sandbox's records past its share of the log.
    Suppressed => "suppressed",
}

impl std::fmt::Display for AuditLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layer_is_written_as_its_name_and_read_back() {
        for (layer, name) in AuditLayer::ALL.into_iter().zip(AuditLayer::NAMES) {
            assert_eq!(layer.as_str(), name);
            assert_eq!(
                serde_json::to_value(layer).expect("serialises"),
                serde_json::Value::from(name)
            );
            assert_eq!(AuditLayer::from_name(name), Some(layer));
        }
        assert_eq!(AuditLayer::from_name("smtp"), None);
    }
}
