//! The sandbox's seccomp filter. The user namespace and the dropped capabilities already make
//! most of these calls fail; the filter refuses them before the kernel looks further, so a
//! kernel bug behind one of them is out of the guest's reach (defence in depth). Modelled on the
//! container engines' default profile: the kernel's extension points (`bpf`, modules,
//! `perf_event_open`, `io_uring`, `userfaultfd`, keyrings), new mounts and namespaces (`mount`,
//! the new mount API, `unshare`, `setns`, `clone` with namespace flags, `clone3`, which a
//! filter cannot inspect and so answers "not implemented" so that libc falls back to `clone`),
//! other processes' memory (`ptrace`, `process_vm_*`), and the host's clock, swap and reboot.
//!
//! It is a deny list over an allowed default, unlike the engines' allow list: svc's guests run
//! arbitrary build tools, and the namespaces and capabilities are the boundary this filter
//! backs up.

use serde::Serialize;

/// Calls refused with EPERM.
pub const DENIED: &[&str] = &[
    // The kernel's extension points.
    "bpf",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "kexec_load",
    "kexec_file_load",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "add_key",
    "request_key",
    "keyctl",
    "lookup_dcookie",
    "uselib",
    // Mounts and namespaces.
    "mount",
    "umount",
    "umount2",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "pivot_root",
    "unshare",
    "setns",
    "open_by_handle_at",
    "name_to_handle_at",
    // Other processes.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    // The host's clock, memory policy, swap, accounting and power.
    "settimeofday",
    "clock_settime",
    "clock_settime64",
    "clock_adjtime",
    "clock_adjtime64",
    "adjtimex",
    "stime",
    "swapon",
    "swapoff",
    "acct",
    "reboot",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "mbind",
    "set_mempolicy",
    "move_pages",
    "migrate_pages",
    "vm86",
    "vm86old",
    "iopl",
    "ioperm",
    "_sysctl",
    "sysfs",
    "ustat",
];

/// The namespace flags of `clone(2)`: a `clone` carrying any of them is refused.
pub const CLONE_NAMESPACE_FLAGS: [(u64, &str); 7] = [
    (0x0002_0000, "CLONE_NEWNS"),
    (0x0200_0000, "CLONE_NEWCGROUP"),
    (0x0400_0000, "CLONE_NEWUTS"),
    (0x0800_0000, "CLONE_NEWIPC"),
    (0x1000_0000, "CLONE_NEWUSER"),
    (0x2000_0000, "CLONE_NEWPID"),
    (0x4000_0000, "CLONE_NEWNET"),
];

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// The filter, in the runtime spec's form.
pub fn profile() -> Seccomp {
    let mut syscalls = vec![Syscall {
        names: DENIED.iter().map(|s| (*s).to_owned()).collect(),
        action: "SCMP_ACT_ERRNO",
        errno_ret: EPERM,
        args: Vec::new(),
    }];
    for (flag, _) in CLONE_NAMESPACE_FLAGS {
        syscalls.push(Syscall {
            names: vec!["clone".into()],
            action: "SCMP_ACT_ERRNO",
            errno_ret: EPERM,
            args: vec![Arg {
                index: 0,
                value: flag,
                value_two: flag,
                op: "SCMP_CMP_MASKED_EQ",
            }],
        });
    }
    syscalls.push(Syscall {
        names: vec!["clone3".into()],
        action: "SCMP_ACT_ERRNO",
        errno_ret: ENOSYS,
        args: Vec::new(),
    });
    Seccomp {
        default_action: "SCMP_ACT_ALLOW",
        architectures: vec!["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        syscalls,
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Seccomp {
    pub default_action: &'static str,
    pub architectures: Vec<&'static str>,
    pub syscalls: Vec<Syscall>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Syscall {
    pub names: Vec<String>,
    pub action: &'static str,
    pub errno_ret: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<Arg>,
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Arg {
    pub index: u32,
    pub value: u64,
    pub value_two: u64,
    pub op: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calls_that_reach_around_the_sandbox_are_refused() {
        for call in [
            "bpf",
            "mount",
            "setns",
            "unshare",
            "keyctl",
            "kexec_load",
            "init_module",
            "finit_module",
            "perf_event_open",
            "userfaultfd",
            "ptrace",
            "open_by_handle_at",
            "io_uring_setup",
        ] {
            assert!(DENIED.contains(&call), "{call} is not refused");
        }
    }

    #[test]
    fn clone_with_any_namespace_flag_is_refused_and_clone3_is_unimplemented() {
        let p = profile();
        let clones: Vec<&Syscall> = p.syscalls.iter().filter(|s| s.names == ["clone"]).collect();
        assert_eq!(clones.len(), CLONE_NAMESPACE_FLAGS.len());
        for (flag, name) in CLONE_NAMESPACE_FLAGS {
            assert!(
                clones
                    .iter()
                    .any(|s| s.args[0].value == flag && s.args[0].value_two == flag),
                "{name} not refused"
            );
        }
        let c3 = p
            .syscalls
            .iter()
            .find(|s| s.names == ["clone3"])
            .expect("clone3 rule");
        assert_eq!(c3.errno_ret, ENOSYS);
    }
}
