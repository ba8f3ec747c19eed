"""The adversarial query scripts of issue 4 item 5, with their acceptable outcomes.

Every script answers the boolean schema. A blocked attempt that the script can
observe answers ``false`` (so ``true`` would mean the attack worked); attacks
on the result file, the limits and the exit status must end in the canonical
error; harmless behaviour (sleeping into a bucket, flooding stdout) answers
``true``. ``expect`` lists the acceptable outcomes: ``"error"`` (canonical
error), ``"false"`` or ``"true"`` (a schema-valid answer).
"""

from __future__ import annotations

from dataclasses import dataclass

PRELUDE = """\
import os, sys
def answer(value):
    with open("/query/out", "w") as fh:
        fh.write("true" if value else "false")
"""


@dataclass(frozen=True)
class Attack:
    name: str
    script: str
    expect: frozenset[str]

    @property
    def source(self) -> str:
        return PRELUDE + self.script


def _a(name: str, expect: str, script: str) -> Attack:
    return Attack(name, script, frozenset(expect.split("|")))


ATTACKS = [
    _a(
        "net-dns",
        "false",
        """
import socket
try:
    socket.getaddrinfo("github.com", 443)
    answer(True)
except OSError:
    answer(False)
""",
    ),
    _a(
        "net-tcp-gateway",
        "false",
        """
import socket, struct
gateways = {"172.17.0.1", "10.0.2.2", "192.168.0.1"}
try:
    for line in open("/proc/net/route").read().splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            gateways.add(socket.inet_ntoa(struct.pack("<L", int(f[2], 16))))
except OSError:
    pass
reached = False
for gw in sorted(gateways):
    for port in (2375, 2376, 80, 443, 22):
        try:
            socket.create_connection((gw, port), timeout=0.5).close()
            reached = True
        except OSError:
            pass
answer(reached)
""",
    ),
    _a(
        "docker-socket",
        "false",
        """
import socket
reached = False
for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
    if os.path.exists(path):
        reached = True
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        reached = True
    except OSError:
        pass
answer(reached)
""",
    ),
    _a(
        "proc1-environ",
        "false",
        """
allowed = {b"PATH", b"LANG", b"HOME", b"PYTHONDONTWRITEBYTECODE", b"GIT_CONFIG_NOSYSTEM",
           b"HOSTNAME"}
extra = False
for pid in ("1", "self"):
    try:
        data = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        continue
    names = {item.partition(b"=")[0] for item in data.split(b"\\0") if item}
    extra = extra or bool(names - allowed)
answer(extra)
""",
    ),
    _a(
        "host-files",
        "false",
        """
found = False
for path in ("/work/main", "/var/lib/docker", "/etc/docker/daemon.json", "/root/.ssh",
             "/var/run/docker.sock", "/home", "/awf/seeds", "/var/tmp/awf-bounded-query"):
    try:
        os.stat(path)
        found = found or path != "/home" or bool(os.listdir(path))
    except OSError:
        pass
for path in ("/etc/shadow", "/proc/kcore", "/sys/kernel/security", "/proc/sys/kernel/core_pattern"):
    try:
        open(path, "rb").read(1)
        found = found or path in ("/etc/shadow", "/proc/kcore")
    except OSError:
        pass
# /awf: a prepared container's own script tmpfs (issue 20) instead of the two binds
expected = {"/", "/awf", "/awf/seed", "/awf/query-script.py", "/query", "/query/repo", "/query/out",
            "/tmp", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
try:
    for line in open("/proc/self/mountinfo"):
        target = line.split()[4]
        if target not in expected and not target.startswith(("/proc", "/dev", "/sys")):
            found = True
except OSError:
    pass
# cold: the image's entrypoint and the two binds; prepared: the script alone
awf = sorted(os.listdir("/awf"))
answer(found or awf not in (["entrypoint.py", "query-script.py", "seed"], ["query-script.py"]))
""",
    ),
    _a(
        "write-outside-query",
        "false",
        """
wrote = False
# A prepared container's /awf is its own small tmpfs (issue 20): writable
# there, like /tmp, but size-capped; anywhere else on the root, never.
prepared = any(line.split()[4] == "/awf" for line in open("/proc/self/mountinfo"))
outside = ["/etc/x", "/usr/x", "/x", "/awf/seed/x", "/var/tmp/x", "/root/x",
           "/awf/seed/README.md", "/etc/passwd"]
if not prepared:
    outside += ["/awf/x", "/awf/query-script.py", "/awf/entrypoint.py"]
for path in outside:
    try:
        with open(path, "a") as fh:
            fh.write("x")
        wrote = True
    except OSError:
        pass
if prepared:
    try:
        with open("/awf/fill", "wb") as fh:  # past its 64 KiB cap: ENOSPC
            fh.write(b"x" * (1 << 20))
        wrote = True
    except OSError:
        pass
for path in ("/awf/seed/.git", "/awf/seed"):
    try:
        os.chmod(path, 0o777)
        wrote = True
    except OSError:
        pass
open("/tmp/scratch", "w").write("fine")  # the writable places still work
open("/query/repo/scratch", "w").write("fine")
answer(wrote)
""",
    ),
    _a(
        "out-symlink",
        "error",
        """
open("/query/t", "w").write("true")
for step in (lambda: os.unlink("/query/out"),
             lambda: os.symlink("/query/t", "/query/out"),
             lambda: os.symlink("/query/t", "/query/l"),
             lambda: os.rename("/query/l", "/query/out"),
             lambda: os.symlink("/etc/passwd", "/query/p"),
             lambda: os.replace("/query/p", "/query/out")):
    try:
        step()
    except OSError:
        pass
""",
    ),
    _a(
        "out-fifo",
        "error",
        """
for step in (lambda: os.unlink("/query/out"), lambda: os.mkfifo("/query/out"),
             lambda: os.mkfifo("/query/f"), lambda: os.rename("/query/f", "/query/out")):
    try:
        step()
    except OSError:
        pass
""",
    ),
    _a(
        "out-device",
        "error",
        """
import stat
for step in (lambda: os.mknod("/query/d", stat.S_IFCHR | 0o666, os.makedev(1, 3)),
             lambda: os.rename("/query/d", "/query/out"),
             lambda: os.unlink("/query/out"),
             lambda: os.mknod("/query/out", stat.S_IFCHR | 0o666, os.makedev(1, 3))):
    try:
        step()
    except OSError:
        pass
""",
    ),
    _a(
        "out-directory",
        "error",
        """
for step in (lambda: os.unlink("/query/out"), lambda: os.mkdir("/query/out"),
             lambda: os.mkdir("/query/dir"), lambda: os.rename("/query/dir", "/query/out")):
    try:
        step()
    except OSError:
        pass
""",
    ),
    _a(
        "out-chmod-then-answer",
        "true",
        """
answer(True)
os.chmod("/query/out", 0)
""",
    ),
    _a(
        "huge-result",
        "error",
        """
chunk = b"1" * (1 << 20)
with open("/query/out", "wb") as fh:
    for _ in range(100):
        fh.write(chunk)
""",
    ),
    _a(
        "oversize-result",
        "error",
        """
open("/query/out", "w").write("true" + " " * 9000)
""",
    ),
    _a(
        "invalid-utf8-result",
        "error",
        """
open("/query/out", "wb").write(b'"\\xff\\xfe"')
""",
    ),
    _a(
        "fork-bomb",
        "false|error",
        """
import time
n = 0
try:
    while n < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError:
    pass
answer(n > 200)
""",
    ),
    _a(
        "memory-past-limit",
        "error|false",
        """
try:
    blob = bytearray(1 << 30)
    for i in range(0, len(blob), 4096):
        blob[i] = 1
    answer(True)
except MemoryError:
    answer(False)
""",
    ),
    _a(
        "fill-tmpfs",
        "false|error",
        """
# many files below the per-file size limit, until the tmpfs (or memory) is full
full = set()
for target in ("/tmp", "/query"):
    try:
        for i in range(10_000):
            with open(f"{target}/fill{i}", "wb") as fh:
                for _ in range(16):
                    fh.write(b"\\0" * (1 << 20))
    except OSError:
        full.add(target)
answer(full != {"/tmp", "/query"})
""",
    ),
    _a(
        "millions-of-files",
        "error|false",
        """
os.mkdir("/query/many")
try:
    for i in range(2_000_000):
        open(f"/query/many/{i}", "w").close()
    answer(True)
except OSError:
    answer(False)
""",
    ),
    _a(
        "many-files-in-repo",
        "error|false",
        """
# the repository view's upper layer is on the host disk (sandbox/overlay.py):
# its files must be removed with the workspace
os.mkdir("/query/repo/many")
try:
    for i in range(2_000_000):
        open(f"/query/repo/many/{i}", "w").close()
    answer(True)
except OSError:
    answer(False)
""",
    ),
    _a(
        "big-files-in-repo",
        "true",
        """
chunk = b"\\0" * (1 << 20)
for i in range(3):  # 96 MiB: within the invocation's quota (half of 256 MiB)
    with open(f"/query/repo/big{i}", "wb") as fh:
        for _ in range(32):
            fh.write(chunk)
try:  # one file past the per-file limit (or the quota) fails, the query goes on
    with open("/query/repo/huge", "wb") as fh:
        for _ in range(100):
            fh.write(chunk)
    answer(False)
except OSError:
    os.unlink("/query/repo/huge")  # the answer shares the quota: free it first
    answer(True)
""",
    ),
    # issue 9: the workspace is the invocation's own tmpfs with a hard quota
    # below the memory limit, so a writer gets ENOSPC (and can still answer
    # after freeing space) instead of being OOM-killed
    _a(
        "fill-workspace-quota",
        "true",
        """
import errno, os
chunk = b"\\0" * (1 << 20)
err = None
try:
    for i in range(1024):
        with open(f"/query/repo/fill{i}", "wb") as fh:
            fh.write(chunk * 16)
except OSError as exc:
    err = exc.errno
for name in os.listdir("/query/repo"):
    if name.startswith("fill"):
        os.unlink("/query/repo/" + name)
answer(err == errno.ENOSPC)
""",
    ),
    _a(
        "spin-past-timeout",
        "error",
        """
answer(True)
while True:
    pass
""",
    ),
    _a(
        "sleep-into-bucket",
        "true",
        """
import time
time.sleep(0.2)
answer(True)
""",
    ),
    _a(
        "flood-stdout-stderr",
        "true",
        """
chunk = b"x" * (1 << 20)
for _ in range(40):
    sys.stdout.buffer.write(chunk)
    sys.stderr.buffer.write(chunk)
answer(True)
""",
    ),
    _a(
        "exit-nonzero",
        "error",
        """
answer(True)
sys.exit(3)
""",
    ),
    _a(
        "setuid",
        "false",
        """
changed = False
for call in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setresuid(0, 0, 0),
             lambda: os.setgroups([0])):
    try:
        call()
        changed = True
    except OSError:
        pass
answer(changed or os.getuid() == 0)
""",
    ),
    _a(
        "kill-entrypoint",
        "true|error",
        """
import signal
answer(True)
try:
    os.kill(1, signal.SIGKILL)
except OSError:
    pass
""",
    ),
]
