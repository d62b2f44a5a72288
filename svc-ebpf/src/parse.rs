//! Bounds-checked header parsing, shared by every classifier. Every load goes through
//! [`Frame`], and every failure is a verdict: the entry points fail closed.

use svc_ebpf_common::{ethertype, reason};

/// Length of an Ethernet II header.
pub const ETH_HLEN: usize = 14;
/// Offset of the ethertype in an Ethernet II header.
const ETH_TYPE_OFFSET: usize = 12;

/// A load past the end of the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds;

/// A packet the classifier can read. Implemented for `TcContext` in the program, and for byte
/// slices in host tests.
pub trait Frame {
    /// Total length of the frame in bytes.
    fn len(&self) -> usize;
    /// Whether the frame is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Two bytes at `offset`, in wire (big-endian) order. `Err` when out of bounds.
    fn load_be16(&self, offset: usize) -> Result<u16, OutOfBounds>;
}

/// Decide the verdict reason for one frame entering the host from a guest.
///
/// `Ok` and `Err` both carry a reason code from [`reason`]; `Err` means the frame could not be
/// parsed and is dropped as malformed.
pub fn classify_ingress<F: Frame>(frame: &F) -> Result<u32, u32> {
    if frame.len() < ETH_HLEN {
        return Err(reason::DROP_MALFORMED);
    }
    let ethertype = frame
        .load_be16(ETH_TYPE_OFFSET)
        .map_err(|OutOfBounds| reason::DROP_MALFORMED)?;
    Ok(match ethertype {
        ethertype::ARP => reason::PASS_ARP,
        ethertype::IPV4 => reason::DROP_IPV4_DEFAULT,
        ethertype::IPV6 => reason::DROP_IPV6_DEFAULT,
        _ => reason::DROP_ETHERTYPE,
    })
}
