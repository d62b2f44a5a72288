//! svc's control plane: configuration, policy, the dataplane, and the svcd supervisor.

/// The only code that talks to the kernel (eBPF, later nftables and rtnetlink).
pub mod dataplane;
