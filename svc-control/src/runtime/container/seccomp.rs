//! The sandbox's seccomp filter: an allow list, modelled on the container engines' default
//! profile. Every call not listed fails with EPERM. The list is what ordinary programs, build
//! tools and language runtimes use; left out are the kernel's extension points (`bpf`,
//! `perf_event_open`, module loading, `kexec_*`, `io_uring_*`, `userfaultfd`, keyrings), new
//! mounts and namespaces (`mount`, the new mount API, `pivot_root`, `unshare`, `setns`,
//! `clone` with any namespace flag; `clone3`, which a filter cannot inspect, answers ENOSYS so
//! libc falls back to `clone`), other processes' memory (`ptrace`, `process_vm_*`, `kcmp`,
//! `pidfd_getfd`), file handles (`open_by_handle_at`, `name_to_handle_at`), the host's clock,
//! swap, reboot, accounting, NUMA policy and I/O ports, and vsock sockets. The user namespace and
//! the dropped capabilities already make most of those fail; the filter keeps a kernel bug
//! behind any unlisted call out of the guest's reach.

use serde::Serialize;

use crate::runtime::share_calls;

/// Calls allowed without conditions.
pub const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "alarm",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chown",
    "chown32",
    "chroot",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_time64",
    "futex_waitv",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
    // x86 only.
    "arch_prctl",
    "modify_ldt",
];

/// Calls a sandbox never gets, named so the tests can check none of them slipped into
/// [`ALLOWED`] (everything unlisted is refused anyway).
pub const DENIED: &[&str] = &[
    "bpf",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "add_key",
    "request_key",
    "keyctl",
    "mount",
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
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "swapon",
    "swapoff",
    "acct",
    "reboot",
    "syslog",
    "mbind",
    "set_mempolicy",
    "iopl",
    "ioperm",
    "sethostname",
    "setdomainname",
    "clone3",
];

/// The namespace flags of `clone(2)`: `clone` is allowed only without any of them.
pub const CLONE_NAMESPACE_FLAGS: [(u64, &str); 7] = [
    (0x0002_0000, "CLONE_NEWNS"),
    (0x0200_0000, "CLONE_NEWCGROUP"),
    (0x0400_0000, "CLONE_NEWUTS"),
    (0x0800_0000, "CLONE_NEWIPC"),
    (0x1000_0000, "CLONE_NEWUSER"),
    (0x2000_0000, "CLONE_NEWPID"),
    (0x4000_0000, "CLONE_NEWNET"),
];

/// `personality(2)` values programs use (the default, `PER_LINUX32`, `UNAME26` and the query).
const PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// `AF_VSOCK`: no vsock sockets in a container sandbox.
const AF_VSOCK: u64 = 40;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// The filter, in the runtime spec's form.
pub fn profile() -> Seccomp {
    let allow = |names: Vec<String>, args: Vec<Arg>| Syscall {
        names,
        action: "SCMP_ACT_ALLOW",
        errno_ret: None,
        args,
    };
    let mut syscalls = vec![allow(
        ALLOWED.iter().map(|s| (*s).to_owned()).collect(),
        Vec::new(),
    )];
    let mask: u64 = CLONE_NAMESPACE_FLAGS.iter().map(|(f, _)| f).sum();
    syscalls.push(allow(
        vec!["clone".into()],
        vec![Arg {
            index: 0,
            value: mask,
            value_two: 0,
            op: "SCMP_CMP_MASKED_EQ",
        }],
    ));
    syscalls.push(allow(
        vec!["socket".into()],
        vec![Arg {
            index: 0,
            value: AF_VSOCK,
            value_two: 0,
            op: "SCMP_CMP_NE",
        }],
    ));
    for p in PERSONALITIES {
        syscalls.push(allow(
            vec!["personality".into()],
            vec![Arg {
                index: 0,
                value: p,
                value_two: 0,
                op: "SCMP_CMP_EQ",
            }],
        ));
    }
    syscalls.push(Syscall {
        names: vec!["clone3".into()],
        action: "SCMP_ACT_ERRNO",
        errno_ret: Some(ENOSYS),
        args: Vec::new(),
    });
    syscalls.extend(share_rules());
    Seccomp {
        default_action: "SCMP_ACT_ERRNO",
        default_errno_ret: EPERM,
        architectures: vec!["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        syscalls,
    }
}

/// The calls that give a file its mode, allowed only with a mode `policy::shares` lets
/// reach the host (no setid bit, no device): the shares are the host's directories, and a
/// filter cannot tell a share's path from the guest's own files, so the rule holds for the
/// whole sandbox (`no_new_privileges` makes setid bits void inside it anyway). `openat2`,
/// whose mode a filter cannot read, answers ENOSYS.
fn share_rules() -> Vec<Syscall> {
    let mut out = Vec::new();
    for c in &share_calls::MODE_CALLS {
        for tests in share_calls::allowed_when(c) {
            out.push(Syscall {
                names: vec![c.name.into()],
                action: "SCMP_ACT_ALLOW",
                errno_ret: None,
                args: tests
                    .into_iter()
                    .map(|m| Arg {
                        index: u32::from(m.index),
                        value: m.mask,
                        value_two: m.value,
                        op: "SCMP_CMP_MASKED_EQ",
                    })
                    .collect(),
            });
        }
    }
    out.push(Syscall {
        names: share_calls::UNREADABLE
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        action: "SCMP_ACT_ERRNO",
        errno_ret: Some(ENOSYS),
        args: Vec::new(),
    });
    out
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Seccomp {
    pub default_action: &'static str,
    pub default_errno_ret: u32,
    pub architectures: Vec<&'static str>,
    pub syscalls: Vec<Syscall>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Syscall {
    pub names: Vec<String>,
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno_ret: Option<u32>,
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
    fn nothing_that_reaches_around_the_sandbox_is_allowed() {
        for call in DENIED {
            assert!(!ALLOWED.contains(call), "{call} is allowed");
        }
        let p = profile();
        assert_eq!(
            p.default_action, "SCMP_ACT_ERRNO",
            "an allow list: the rest is refused"
        );
        assert_eq!(p.default_errno_ret, EPERM);
        let listed: Vec<&str> = p
            .syscalls
            .iter()
            .filter(|s| s.action == "SCMP_ACT_ALLOW")
            .flat_map(|s| s.names.iter().map(String::as_str))
            .collect();
        for call in [
            "bpf",
            "mount",
            "setns",
            "unshare",
            "ptrace",
            "keyctl",
            "io_uring_setup",
        ] {
            assert!(!listed.contains(&call), "{call} is allowed");
        }
    }

    #[test]
    fn modes_reach_files_only_as_the_share_policy_allows() {
        let p = profile();
        for c in &share_calls::MODE_CALLS {
            assert!(
                !ALLOWED.contains(&c.name),
                "{} allowed unconditionally",
                c.name
            );
            let rules: Vec<&Syscall> = p.syscalls.iter().filter(|s| s.names == [c.name]).collect();
            assert!(!rules.is_empty(), "{} is never allowed", c.name);
            for r in rules {
                assert_eq!(r.action, "SCMP_ACT_ALLOW");
                assert!(r.args.iter().all(|a| a.op == "SCMP_CMP_MASKED_EQ"), "{r:?}");
                assert!(!r.args.is_empty(), "{} allowed without a test", c.name);
            }
        }
        // chmod: the mode argument with its setid bits clear.
        let chmod = p
            .syscalls
            .iter()
            .find(|s| s.names == ["chmod"])
            .expect("chmod rule");
        assert_eq!(
            (
                chmod.args[0].index,
                chmod.args[0].value,
                chmod.args[0].value_two
            ),
            (1, 0o6000, 0)
        );
        let openat2 = p
            .syscalls
            .iter()
            .find(|s| s.names == ["openat2"])
            .expect("openat2 rule");
        assert_eq!(openat2.errno_ret, Some(ENOSYS));
    }

    #[test]
    fn clone_only_without_namespace_flags_and_clone3_is_unimplemented() {
        let p = profile();
        let clone = p
            .syscalls
            .iter()
            .find(|s| s.names == ["clone"])
            .expect("clone rule");
        let mask: u64 = CLONE_NAMESPACE_FLAGS.iter().map(|(f, _)| f).sum();
        assert_eq!(clone.args[0].value, mask);
        assert_eq!(
            clone.args[0].value_two, 0,
            "allowed only when no flag is set"
        );
        assert_eq!(clone.args[0].op, "SCMP_CMP_MASKED_EQ");
        let c3 = p
            .syscalls
            .iter()
            .find(|s| s.names == ["clone3"])
            .expect("clone3 rule");
        assert_eq!(c3.errno_ret, Some(ENOSYS));
        let socket = p
            .syscalls
            .iter()
            .find(|s| s.names == ["socket"])
            .expect("socket rule");
        assert_eq!(
            (socket.args[0].value, socket.args[0].op),
            (AF_VSOCK, "SCMP_CMP_NE")
        );
    }
}
