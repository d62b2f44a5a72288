//! The broker: the real bearer behind each of a sandbox's placeholders, on the host only.
//! The proxy asks it per request with the placeholder its policy decision carries
//! (`CredentialAction::Swap`); nothing else reads a value. Values are zeroised when dropped
//! and have no `Debug`/`Display` that shows them.

use std::{collections::HashMap, sync::Arc};

use zeroize::Zeroizing;

use super::grant::Grant;

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
    /// The real bearer for `placeholder` of `sandbox` (of `kind`, sent to `host`): `None` if
    /// none is brokered, `Some(Err(why))` if one is but cannot be used now (an OAuth grant
    /// whose token expired unrefreshed; `why` names the credential, never a value).
    fn bearer(
        &self,
        sandbox: u32,
        placeholder: &Placeholder,
        kind: CredentialKind,
        host: &str,
    ) -> Option<Result<Bearer, String>>;
}

/// Where one placeholder's real value comes from.
#[derive(Debug, Clone)]
pub enum BearerSource {
    /// The value the sandbox was issued.
    Fixed(Bearer),
    /// Whatever access token the grant holds now.
    Grant(Arc<Grant>),
}

impl BearerSource {
    pub fn current(&self) -> Result<Bearer, String> {
        match self {
            Self::Fixed(b) => Ok(b.clone()),
            Self::Grant(g) => g.bearer(super::grant::ms(std::time::SystemTime::now())),
        }
    }
}

/// A sandbox's bearers by placeholder: each placeholder's variable (`CODE_HOST_TOKEN`,
/// `SVC_CRED_<HOST>_TOKEN`, …) looked up in the values the sandbox was given; a value that is
/// a grant reference is resolved by `grant`. Placeholders without a value are not brokered
/// (the proxy strips them).
pub fn bearers_by_placeholder(
    table: &PlaceholderTable,
    values: &HashMap<String, String>,
    grant: &dyn Fn(&str, u32) -> Arc<Grant>,
) -> HashMap<String, BearerSource> {
    table
        .entries()
        .iter()
        .filter_map(|e| {
            let value = values.get(&e.env_name()?)?;
            let source = match Grant::parse_reference(value) {
                Some((name, version)) => BearerSource::Grant(grant(&name, version)),
                None => BearerSource::Fixed(Bearer::new(value.clone())),
            };
            Some((e.placeholder.expose().to_owned(), source))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{hosts::HostPattern, policy::credentials::PlaceholderEntry};

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
        let b = bearers_by_placeholder(&table, &values, &|n, v| Grant::new(n, v, None));
        assert_eq!(b.len(), 1, "a placeholder without a value is not brokered");
        let got = b.get(&"a".repeat(64)).expect("brokered");
        assert_eq!(got.current().expect("fixed").expose(), "real-1");
        assert_eq!(format!("{got:?}"), "Fixed(Bearer(..))");
    }
}
