"""The seccomp profile seen from inside real containers, with ctypes only.

Every denied call must fail with EPERM (clone3: ENOSYS, see seccomp/__init__)
on runc and on runsc, while ordinary Python and git keep working.
"""

from __future__ import annotations

import json

import pytest

from bounded_query.sandbox import DockerRunner
from tests.sandbox.helpers import (
    RUNTIMES,
    leftover_containers,
    leftover_volumes,
    new_invocation,
    settings,
)

pytestmark = pytest.mark.engine

PROBE = r"""
import ctypes, errno, json, os, socket, subprocess, threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {}

def sys_call(name, nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if ret == 0 and name.startswith("clone"):
        os._exit(0)  # a child that should never have been created
    err = ctypes.get_errno()
    results[name] = "ok" if ret >= 0 else errno.errorcode.get(err, str(err))

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
SIGCHLD = 17
sys_call("ptrace", 101, 3, os.getpid(), 0, 0)            # PTRACE_PEEKUSER: else ESRCH
sys_call("mount", 165, 0, 0, 0, 0, 0)
sys_call("umount2", 166, 0, 0)
sys_call("unshare", 272, CLONE_NEWUSER)
sys_call("setns", 308, 0, 0)
sys_call("keyctl", 250, 0, 0, 0, 0, 0)
sys_call("add_key", 248, 0, 0, 0, 0, 0)
sys_call("bpf", 321, 0, 0, 0)
sys_call("perf_event_open", 298, 0, 0, -1, -1, 0)
sys_call("io_uring_setup", 425, 1, 0)
sys_call("kexec_load", 246, 0, 0, 0, 0)
sys_call("init_module", 175, 0, 0, 0)
sys_call("pivot_root", 155, 0, 0)
sys_call("chroot", 161, 0)
sys_call("setuid", 105, 0)
sys_call("clone_newuser", 56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
sys_call("clone_newnet", 56, CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0)
sys_call("clone_newns", 56, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0)
args = (ctypes.c_uint64 * 11)(CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0)
sys_call("clone3_newuser", 435, ctypes.addressof(args), ctypes.sizeof(args))
for fam_name, fam in (("AF_INET", 2), ("AF_INET6", 10), ("AF_PACKET", 17), ("AF_NETLINK", 16)):
    sys_call("socket_" + fam_name, 41, fam, 2, 0)         # SOCK_DGRAM

# issue 9: calls that read or modulate state shared across invocations
buf = ctypes.create_string_buffer(4096)
fd = os.open("/usr/bin/python3", os.O_RDONLY)
sys_call("fadvise64", 221, fd, 0, 0, 4)                   # POSIX_FADV_DONTNEED
os.close(fd)
libc.valloc.restype = ctypes.c_void_p
sys_call("mincore", 27, libc.valloc(4096), 4096, ctypes.addressof(buf))
sys_call("sysinfo", 99, ctypes.addressof(buf))

# what must keep working
a, b = socket.socketpair()
a.sendall(b"x"); results["socketpair_unix"] = "ok" if b.recv(1) == b"x" else "bad"
box = []
t = threading.Thread(target=box.append, args=(1,)); t.start(); t.join()
results["thread"] = "ok" if box == [1] else "bad"
pid = os.fork()
if pid == 0:
    os._exit(7)
results["fork"] = "ok" if os.waitpid(pid, 0)[1] >> 8 == 7 else "bad"
run = lambda *a: subprocess.run(a, cwd="/query/repo", capture_output=True, text=True).stdout
results["git_log"] = run("git", "log", "--format=%s").strip()
results["git_grep"] = run("git", "grep", "-l", "needle").strip()
open("/query/out", "w").write(json.dumps(results, sort_keys=True))
"""

DENIED = [
    "ptrace", "mount", "umount2", "unshare", "setns", "keyctl", "add_key", "bpf",
    "perf_event_open", "io_uring_setup", "kexec_load", "init_module", "pivot_root", "chroot",
    "setuid", "clone_newuser", "clone_newnet", "clone_newns", "socket_AF_INET",
    "socket_AF_INET6", "socket_AF_PACKET", "socket_AF_NETLINK",
    "fadvise64", "mincore", "sysinfo",
]  # fmt: skip


@pytest.fixture(scope="module", params=RUNTIMES)
def observed(request, engine, seed, tmp_path_factory):
    import trio

    cfg = settings(request.param)
    work_root = tmp_path_factory.mktemp("seccomp-work")
    invocation = new_invocation(cfg, work_root, seed, PROBE)
    runner = DockerRunner(cfg)
    try:
        report = trio.run(runner.run, invocation)
        trio.run(runner.reconcile)
    finally:
        runner.close()
    assert leftover_containers(engine, cfg.run_id) == []
    assert leftover_volumes(engine, cfg.run_id) == []
    assert report.failure is None, report
    return json.loads(report.result or b"{}")


@pytest.mark.parametrize("name", DENIED)
def test_denied_with_eperm(observed, name):
    assert observed[name] == "EPERM"


def test_clone3_is_unavailable(observed):
    # ENOSYS, not EPERM: glibc must fall back to the filtered clone
    assert observed["clone3_newuser"] == "ENOSYS"


@pytest.mark.parametrize("name", ["socketpair_unix", "thread", "fork"])
def test_ordinary_calls_work(observed, name):
    assert observed[name] == "ok"


def test_git_works(observed):
    assert observed["git_log"] == "fixture"
    assert observed["git_grep"] == "README.md"


def test_probe_is_sensitive_without_the_profile(engine, seed, tmp_path):
    """Control: with seccomp unconfined (runc), these calls are *not* EPERM.

    So the EPERMs above come from our profile, not from dropped capabilities.
    """
    import trio

    cfg = settings("docker")
    invocation = new_invocation(cfg, tmp_path / "work", seed, PROBE)
    runner = DockerRunner(cfg)
    runner._seccomp = "unconfined"
    try:
        report = trio.run(runner.run, invocation)
        trio.run(runner.reconcile)
    finally:
        runner.close()
    assert leftover_containers(engine, cfg.run_id) == []
    assert leftover_volumes(engine, cfg.run_id) == []
    assert report.failure is None
    loose = json.loads(report.result or b"{}")
    for name in ("ptrace", "unshare", "socket_AF_INET", "socket_AF_INET6", "io_uring_setup"):
        assert loose[name] != "EPERM", name
    for name in ("fadvise64", "mincore", "sysinfo"):
        assert loose[name] == "ok", name
