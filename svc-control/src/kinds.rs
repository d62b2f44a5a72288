//! The kinds of sandbox backend, in one list ([`KINDS`]): the registry holds backends of these
//! kinds (`runtime::Backends`), `svc --backend` offers their names ([`choices`]), and a
//! workspace's `runtime.required` takes them (`config::workspace::Backend`, whose schema enum
//! is built from this list). A new backend adds its kind here.

/// A kind of backend: its name as a sandbox's envelope stores it and `--backend` takes it,
/// the older names it still answers to, and what the workspace schema says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kind {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// One sentence for the workspace schema's enum entry of its name.
    pub about: &'static str,
}

impl Kind {
    /// Whether `name` stands for this kind (its name or an old one).
    pub fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.aliases.contains(&name)
    }

    /// The names it answers to: its own, then its old ones.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + use<> {
        std::iter::once(self.name).chain(self.aliases.iter().copied())
    }

    /// What the workspace schema says of each of its old names.
    pub fn alias_about(&self) -> String {
        format!("The former name of `{}`, still accepted.", self.name)
    }
}

/// A microVM guest (QEMU `-M microvm`).
pub const MICROVM: Kind = Kind {
    name: "microvm",
    aliases: &[],
    about: "A microVM guest (QEMU `-M microvm`): the isolation boundary for hostile code.",
};

/// An unprivileged OCI container; `netns` is its old name.
pub const CONTAINER: Kind = Kind {
    name: "container",
    aliases: &["netns"],
    about: "An unprivileged OCI container (user namespace, own root file system, seccomp, \
            cgroup\nlimits): the embedded default; shares the host's kernel.",
};

/// The kind a sandbox nobody chose a backend for gets: the embedded container backend.
pub const DEFAULT: Kind = CONTAINER;

/// Every kind, strongest isolation first: the order a workspace with no `runtime.required`
/// gets (`policy::creation::select_runtime`) and the order of the workspace schema's enum.
pub const KINDS: &[Kind] = &[MICROVM, CONTAINER];

/// The kind `name` stands for (its name or an old one).
pub fn named(name: &str) -> Option<Kind> {
    KINDS.iter().copied().find(|k| k.answers_to(name))
}

/// The names `--backend` takes, as the CLI lists them: the default kind and its old names
/// first, then the other kinds of [`KINDS`] with theirs.
pub fn choices() -> Vec<&'static str> {
    let others = KINDS.iter().filter(|k| **k != DEFAULT);
    std::iter::once(&DEFAULT)
        .chain(others)
        .flat_map(Kind::names)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_stands_for_one_kind_and_the_default_comes_first() {
        assert_eq!(choices(), ["container", "netns", "microvm"]);
        for k in KINDS {
            for n in k.names() {
                assert_eq!(named(n), Some(*k), "{n}");
                let others = KINDS.iter().filter(|o| *o != k);
                assert!(
                    !others.clone().any(|o| o.answers_to(n)),
                    "{n} is two kinds'"
                );
            }
        }
        assert_eq!(named("docker"), None);
        assert_eq!(named("Container"), None, "names are exact");
    }
}
