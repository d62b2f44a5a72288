//! `runtime`: which sandbox backends the workspace needs, in order of preference.

use std::sync::LazyLock;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::{self, KINDS, Kind};

/// `runtime`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Backends, in order of preference; empty: the daemon selects automatically.
    #[serde(default)]
    pub required: Vec<Backend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,
}

/// A backend as a workspace file names it: a kind of [`crate::kinds::KINDS`], by its name or
/// one of its old names (kept as written, so the file reads back as it was).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backend {
    kind: Kind,
    written: &'static str,
}

impl Backend {
    /// The microvm backend, by its name.
    pub const MICROVM: Self = Self::of(kinds::MICROVM);
    /// The container backend, by its name.
    pub const CONTAINER: Self = Self::of(kinds::CONTAINER);

    const fn of(kind: Kind) -> Self {
        Self {
            kind,
            written: kind.name,
        }
    }

    /// Every name a workspace may give, in the schema's order: each kind of
    /// [`crate::kinds::KINDS`], then its old names.
    pub fn all() -> impl Iterator<Item = Self> {
        KINDS
            .iter()
            .flat_map(|k| k.names().map(|written| Self { kind: *k, written }))
    }

    /// The backend `name` stands for, as written.
    pub fn named(name: &str) -> Option<Self> {
        Self::all().find(|b| b.written == name)
    }

    /// The backend a name stands for, by its own name (`netns` is `container`).
    #[must_use]
    pub const fn canonical(self) -> Self {
        Self::of(self.kind)
    }

    /// Its kind's name (`container` for `netns` too).
    pub const fn name(self) -> &'static str {
        self.kind.name
    }

    /// The name as the file gives it.
    pub const fn written(self) -> &'static str {
        self.written
    }

    /// What the schema says of the name as written.
    fn about(self) -> std::borrow::Cow<'static, str> {
        if self.written == self.kind.name {
            self.kind.about.into()
        } else {
            self.kind.alias_about().into()
        }
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Backend").field(&self.written).finish()
    }
}

impl Serialize for Backend {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.written)
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// Every name, for the error naming them (serde wants a `'static` list).
        static NAMES: LazyLock<Vec<&'static str>> =
            LazyLock::new(|| Backend::all().map(Backend::written).collect());
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Backend;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("enum Backend")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Backend, E> {
                Backend::named(v).ok_or_else(|| E::unknown_variant(v, NAMES.as_slice()))
            }
        }
        d.deserialize_str(Name)
    }
}

/// The schema's enum of every name ([`Backend::all`]), each with what it stands for.
impl JsonSchema for Backend {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Backend".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<serde_json::Value> = Self::all()
            .map(|b| serde_json::json!({"description": b.about(), "type": "string", "const": b.written}))
            .collect();
        schemars::json_schema!({"description": "Registered sandbox backends.", "oneOf": names})
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Selection {
    /// The first available backend listed in `required`.
    PreferFirst,
}

impl Runtime {
    /// No backend listed twice (`netns` and `container` are one).
    pub(super) fn validate(&self, err: &mut impl FnMut(String, String)) {
        for (i, b) in self.required.iter().enumerate() {
            if self.required[..i]
                .iter()
                .any(|o| o.canonical() == b.canonical())
            {
                err(
                    format!("/runtime/required/{i}"),
                    format!("backend {:?} is listed twice", b.name()),
                );
            }
        }
    }
}
