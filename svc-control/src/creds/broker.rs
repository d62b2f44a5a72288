//! The broker: the real bearer behind each of a sandbox's placeholders, on the host only.
//! The proxy asks it per request with the placeholder its policy decision carries
//! (`CredentialAction::Swap`); nothing else reads a value. Values are zeroised when dropped
//! and have no `Debug`/`Display` that shows them.

use std::collections::HashMap;

use zeroize::Zeroizing;

use crate::policy::credentials::{CredentialKind, Placeholder, PlaceholderTable};

/// A real credential value.
#[derive(Clone, PartialEq, Eq)]
pub struct Bearer(Zeroizing<String>);

impl Bearer {
    pub fn new(value: impl Into<String>) -> Self {
        Self(Zeroizing::new(value.into()))
    }

    /// The value, for the one place that sends it (the proxy's upstream header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(..)")
    }
}

/// Where the proxy gets real credentials.
pub trait Broker: Send + Sync {
    /// The real bearer for `placeholder` of `sandbox` (of `kind`, sent to `host`), if one is
    /// brokered.
    fn bearer(
        &self,
        sandbox: u32,
        placeholder: &Placeholder,
        kind: CredentialKind,
        host: &str,
    ) -> Option<Bearer>;
}

/// A sandbox's bearers by placeholder: each placeholder's variable (`CODE_HOST_TOKEN`,
/// `SVC_CRED_<HOST>_TOKEN`, …) looked up in the values the sandbox was given. Placeholders
/// without a value are not brokered (the proxy strips them).
pub fn bearers_by_placeholder(
    table: &PlaceholderTable,
    values: &HashMap<String, String>,
) -> HashMap<String, Bearer> {
    table
        .entries()
        .iter()
        .filter_map(|e| {
            let value = values.get(&e.env_name()?)?;
            Some((
                e.placeholder.expose().to_owned(),
                Bearer::new(value.clone()),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{credentials::PlaceholderEntry, host::HostPattern};

    #[test]
    fn bearers_are_keyed_by_placeholder_and_never_shown() {
        let p = |s: &str| Placeholder::parse(&s.repeat(64)).expect("placeholder");
        let table = PlaceholderTable::new(vec![
            PlaceholderEntry {
                placeholder: p("a"),
                kind: CredentialKind::CodeHost,
                hosts: vec![HostPattern::parse("github.com").expect("host")],
            },
            PlaceholderEntry {
                placeholder: p("b"),
                kind: CredentialKind::Host,
                hosts: vec![HostPattern::parse("api.example.com").expect("host")],
            },
        ]);
        let values: HashMap<String, String> =
            [("CODE_HOST_TOKEN".to_owned(), "real-1".to_owned())].into();
        let b = bearers_by_placeholder(&table, &values);
        assert_eq!(b.len(), 1, "a placeholder without a value is not brokered");
        let got = b.get(&"a".repeat(64)).expect("brokered");
        assert_eq!(got.expose(), "real-1");
        assert_eq!(format!("{got:?}"), "Bearer(..)");
    }
}
