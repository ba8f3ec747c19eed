"""Generate seccomp/query.json from the traced syscalls (seccomp/recipe/README.md).

    python3 seccomp/recipe/generate.py [TRACED] [OUT]

TRACED (default: traced.txt next to this file) holds the syscall names
trace.sh observed; OUT defaults to seccomp/query.json. The profile allows
the traced names plus ``EXTRA`` (calls the workload did not happen to make but
ordinary Python and git code paths, the runtime's last steps before execve
and glibc fallbacks need), never anything in ``NEVER`` or ``CHANNEL_DENY``, and
adds argument filters for ``clone``, ``socket`` and ``socketpair``. The output is
deterministic (sorted, fixed layout), so re-running the recipe on an
unchanged trace leaves the file byte-identical.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Calls on ordinary Python/git paths beyond the trace, grouped by purpose.
EXTRA = {
    # files and directories (glibc's modern *at calls plus the legacy names
    # that other binaries may use for the same thing)
    "dup",
    "dup3",
    "faccessat",
    "faccessat2",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchown",
    "fchownat",
    "flock",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "linkat",
    "lstat",
    "mkdirat",
    "open",
    "pipe",
    "preadv",
    "pwritev",
    "readlinkat",
    "readv",
    "renameat",
    "renameat2",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "umask",
    "writev",
    "copy_file_range",
    "fallocate",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "mremap",
    "msync",
    # processes, threads, signals (inside the container's own PID namespace)
    "fork",
    "waitid",
    "kill",
    "tgkill",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "sigaltstack",
    "getpgrp",
    "setpgid",
    "setsid",
    "getresuid",
    "getresgid",
    "getgroups",
    "getrlimit",
    "getrusage",
    "sched_yield",
    "sched_getaffinity",
    "restart_syscall",
    "alarm",
    "getitimer",
    "prctl",
    # time
    "clock_gettime",
    "clock_getres",
    "gettimeofday",
    "nanosleep",
    # event loops and local IPC (AF_UNIX only, see the socket filter)
    "epoll_ctl",
    "epoll_pwait",
    "epoll_wait",
    "eventfd2",
    "ppoll",
    "select",
    "bind",
    "listen",
    "accept4",
    "connect",
    "getpeername",
    "getsockopt",
    "setsockopt",
    "recvmsg",
    "sendmsg",
    "shutdown",
    # misc
    "uname",
}
#: Never allowed, whatever a trace says (the issue's denial list and friends).
NEVER = {
    "ptrace",
    "mount",
    "umount",
    "umount2",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "pivot_root",
    "chroot",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    "process_vm_readv",
    "process_vm_writev",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "clone3",
    "clone",
    "socket",
    "socketpair",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "personality",
    "vhangup",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "kcmp",
}
#: Never allowed either, although python3 or git may call them: each reads or
#: modulates kernel state shared across invocations (README "Residual
#: channels"), and every caller treats EPERM as "no information".
#: fadvise64 (POSIX_FADV_DONTNEED evicts the shared image's pages from the
#: page cache; coreutils and git only give hints) and mincore (reads page-cache
#: residency) carry bits from one query to the next; sysinfo reports host-wide
#: free memory, load and process count (glibc's qsort and git's total_ram()
#: fall back on failure). statfs/fstatfs stay: runc itself calls fstatfs after
#: loading the profile (to check /proc/self/fd), and every file system a query
#: can write is its own (README "Residual channels").
CHANNEL_DENY = {"fadvise64", "mincore", "sysinfo"}
#: Namespace-creating clone flags (NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET).
CLONE_NS_MASK = 0x7E020000
AF_UNIX = 1
ENOSYS = 38
EPERM = 1


def build(traced: set[str]) -> dict[str, object]:
    """Return the profile for the traced names (see module docstring)."""
    allowed = sorted((traced | EXTRA) - NEVER - CHANNEL_DENY)
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [
            {"names": allowed, "action": "SCMP_ACT_ALLOW"},
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ALLOW",
                "args": [
                    {"index": 0, "value": CLONE_NS_MASK, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
                ],
            },
            {
                "names": ["socket", "socketpair"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": AF_UNIX, "valueTwo": 0, "op": "SCMP_CMP_EQ"}],
            },
            # glibc tries clone3 first and falls back to clone only on ENOSYS;
            # seccomp cannot read clone3's flag struct, so it must not run.
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
        ],
    }


def main(argv: list[str]) -> int:
    traced_path = Path(argv[0]) if argv else HERE / "traced.txt"
    out_path = Path(argv[1]) if len(argv) > 1 else HERE.parent / "query.json"
    traced = {line.strip() for line in traced_path.read_text().splitlines() if line.strip()}
    profile = build(traced)
    out_path.write_text(json.dumps(profile, indent=1) + "\n")
    allowed = profile["syscalls"][0]["names"]  # type: ignore[index]
    print(f"{out_path}: {len(allowed)} names allowed outright, 3 filtered", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
