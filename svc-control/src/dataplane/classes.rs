//! The global destination classes: the tries of CIDRs never reachable and the operator's
//! exceptions, and the same decision made here before an allow entry is written.

use std::net::IpAddr;

use aya::maps::lpm_trie::Key;
use ipnet::IpNet;
use svc_ebpf_common::{class, map};

use super::{
    error::{DataplaneError, write_err},
    fence::Fence,
};

impl Fence {
    /// Replace the destination classes: `deny` CIDRs are never reachable, `operator_allow`
    /// CIDRs (longer prefixes win in the trie) reopen part of them. Written over the old
    /// classes, which leave afterwards, so no moment has neither.
    pub fn set_destination_classes(
        &mut self,
        deny: &[IpNet],
        operator_allow: &[IpNet],
    ) -> Result<(), DataplaneError> {
        // The new entries first, then the stale ones out: the tries are never without the
        // classes both old and new refuse (AllowAll sandboxes outlive a restarting svcd).
        let old4: Vec<Key<[u8; 4]>> = self.maps.deny4.keys().flatten().collect();
        let old6: Vec<Key<[u8; 16]>> = self.maps.deny6.keys().flatten().collect();
        self.classes.clear();
        for (nets, verdict) in [(deny, class::DENY), (operator_allow, class::OPERATOR_ALLOW)] {
            self.classes.extend(nets.iter().map(|n| (*n, verdict)));
            for net in nets {
                match net {
                    IpNet::V4(n) => self
                        .maps
                        .deny4
                        .insert(
                            &Key::new(u32::from(n.prefix_len()), n.network().octets()),
                            verdict,
                            0,
                        )
                        .map_err(|e| write_err(map::DENY4, e))?,
                    IpNet::V6(n) => self
                        .maps
                        .deny6
                        .insert(
                            &Key::new(u32::from(n.prefix_len()), n.network().octets()),
                            verdict,
                            0,
                        )
                        .map_err(|e| write_err(map::DENY6, e))?,
                }
            }
        }
        let listed = |prefix: u32, addr: IpAddr| {
            self.classes
                .iter()
                .any(|(n, _)| u32::from(n.prefix_len()) == prefix && n.network() == addr)
        };
        for k in old4 {
            if !listed(k.prefix_len(), IpAddr::from(k.data())) {
                let _ = self.maps.deny4.remove(&k);
            }
        }
        for k in old6 {
            if !listed(k.prefix_len(), IpAddr::from(k.data())) {
                let _ = self.maps.deny6.remove(&k);
            }
        }
        Ok(())
    }

    /// Whether the destination classes refuse `addr` (the longest matching prefix decides, as
    /// in the kernel's trie).
    pub fn class_denies(&self, addr: IpAddr) -> bool {
        self.classes
            .iter()
            .filter(|(n, _)| n.contains(&addr))
            .max_by_key(|(n, _)| n.prefix_len())
            .is_some_and(|(_, v)| *v == class::DENY)
    }
}
