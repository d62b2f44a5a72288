//! `[pool]`: warm pools of sandboxes made ahead of their requests (docs/pool.md).

use serde::{Deserialize, Serialize};

/// The most sandboxes one backend's pool may hold.
pub const MAX_POOL: u32 = 64;
/// The most VMs the microvm pool may hold: each keeps its guest's memory (`microvm.memory_mib`)
/// while it waits.
pub const MAX_MICROVM_POOL: u32 = 16;
/// The most sandboxes a pool makes per second when it refills.
pub const MAX_REFILL_PER_SECOND: u32 = 100;
/// Sandboxes a pool makes per second when it refills, unless `refill_per_second` says.
pub const DEFAULT_REFILL_PER_SECOND: u32 = 4;

/// `[pool]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// Container sandboxes kept made ahead (default 0: no pool).
    pub container: Option<u32>,
    /// Microvm sandboxes kept booted ahead (default 0: no pool).
    pub microvm: Option<u32>,
    /// Pooled sandboxes made per second at most while a pool refills (default 4).
    pub refill_per_second: Option<u32>,
}

/// `[pool]`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolConfig {
    /// Container sandboxes kept made ahead (0: no pool).
    pub container: u32,
    /// Microvm sandboxes kept booted ahead (0: no pool).
    pub microvm: u32,
    /// Pooled sandboxes made per second at most.
    pub refill_per_second: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            container: 0,
            microvm: 0,
            refill_per_second: DEFAULT_REFILL_PER_SECOND,
        }
    }
}

impl PoolFile {
    /// The validated table; each wrong key reported through `err`.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> PoolConfig {
        let mut size = |key: &str, v: Option<u32>| match v {
            Some(n) if n > MAX_POOL => {
                err(
                    key,
                    format!("a pool holds at most {MAX_POOL} sandboxes, got {n}"),
                );
                0
            }
            v => v.unwrap_or(0),
        };
        let container = size("pool.container", self.container);
        let microvm = match self.microvm {
            // Each pooled VM holds its guest's memory for as long as it waits.
            Some(n) if n > MAX_MICROVM_POOL => {
                err(
                    "pool.microvm",
                    format!(
                        "a microvm pool holds at most {MAX_MICROVM_POOL} booted VMs (each keeps \
                         its guest's memory while it waits), got {n}"
                    ),
                );
                0
            }
            v => v.unwrap_or(0),
        };
        let refill_per_second = match self.refill_per_second {
            Some(n) if n == 0 || n > MAX_REFILL_PER_SECOND => {
                err(
                    "pool.refill_per_second",
                    format!("expected 1 to {MAX_REFILL_PER_SECOND} sandboxes per second, got {n}"),
                );
                DEFAULT_REFILL_PER_SECOND
            }
            n => n.unwrap_or(DEFAULT_REFILL_PER_SECOND),
        };
        PoolConfig {
            container,
            microvm,
            refill_per_second,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::host::parse;

    fn pool(text: &str) -> Result<PoolConfig, String> {
        parse(std::path::Path::new("svcd.toml"), text)
            .map(|c| c.pool)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn no_pool_unless_asked() {
        assert_eq!(pool("").unwrap(), PoolConfig::default());
        assert_eq!(PoolConfig::default().container, 0);
        let c = pool("[pool]\ncontainer = 2\nrefill_per_second = 10\n").unwrap();
        assert_eq!((c.container, c.microvm, c.refill_per_second), (2, 0, 10));
    }

    #[test]
    fn bad_pools_are_refused_naming_the_key() {
        for (text, key, says) in [
            ("[pool]\ncontainer = 65\n", "pool.container", "at most 64"),
            ("[pool]\nmicrovm = 17\n", "pool.microvm", "at most 16"),
            (
                "[pool]\nrefill_per_second = 0\n",
                "pool.refill_per_second",
                "1 to 100",
            ),
            (
                "[pool]\nrefill_per_second = 101\n",
                "pool.refill_per_second",
                "got 101",
            ),
            ("[pool]\ncontainers = 1\n", "", "unknown field `containers`"),
            ("[pool]\ncontainer = -1\n", "", "invalid value"),
        ] {
            let e = pool(text).unwrap_err();
            assert!(e.contains(key) && e.contains(says), "{text:?}: {e}");
        }
        assert!(pool("[pool]\nmicrovm = 0\n").is_ok());
        assert_eq!(pool("[pool]\nmicrovm = 2\n").unwrap().microvm, 2);
    }
}
