"""Page-cache normalization: the query image's pages stay resident for the whole run.

Theory of operation: every query container reads the same image files, and
the host page cache is shared. A query that loads (by reading) or evicts
(``posix_fadvise(DONTNEED)``, ``madvise``) chosen image files leaves a
pattern the next query reads back by timing its own reads: measured on
runc, about 1.5 ms for a resident 2 MiB file against 4-8 ms for one read
from disk, enough to decode bit by bit. ``fadvise64`` and ``mincore`` are
denied by the seccomp profile, but loading needs nothing but ``read``, and
the host's own memory pressure evicts.

So the state is normalized rather than hidden: at broker start (the
runner's ``warm``) one trusted *pin* container of the query image maps every
regular file of its root file system that the query user can read and locks
them in memory (``mlockall(MCL_CURRENT)``): 4,539 files, 173 MiB for our
image. overlayfs maps the lower layer's own pages, which every query
container shares, so every image page any query can read is resident, for
every invocation, and no query can evict it (DONTNEED and memory pressure
skip locked pages). Reading a file then costs the same whatever an earlier
query did. It also pins the files' dentries and inodes (each mapping holds
its file open).

The pin container runs our fixed program with no network, a read-only root
and one capability, CAP_IPC_LOCK, as container root (the engine cannot raise
``RLIMIT_MEMLOCK`` once capabilities are dropped, and a non-root user would
lose the capability at exec). It maps only files with the "other" read bit,
which is what lets uid 65534, the query user, read root-owned image files.
Its memory limit covers the pages it may be the first to read. It carries
the run label, so the run's reconcile and the harness's teardown remove it
with the query containers. It prints one readiness line, ``awf-pinned N
BYTES``, to a capped local log. A pin that does not start leaves queries
unpinned (the channel open): the runner reports it
(``DockerRunner.degradations``), the broker names it in its readiness file
and the harness turns it into a ``degraded`` event and a step-summary line.

This module only derives the create body; the runner starts it.
"""

from __future__ import annotations

from typing import Any

from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import LABEL_ROLE, LABEL_RUN
from bounded_query.broker.runner import RunnerSettings

from .spec import CONTAINER_ENV

__all__ = ["PIN_MEMORY_BYTES", "PIN_PROGRAM", "PIN_READY", "ROLE_PIN", "pin_container_body"]

#: Role label of the pin container.
ROLE_PIN = "page-cache-pin"
#: Readiness line prefix the program prints after locking.
PIN_READY = "awf-pinned"
#: Memory limit: the image (173 MiB) plus Python, with room to grow.
PIN_MEMORY_BYTES = 768 * 1024**2
#: The fixed program (no request input): map every readable regular file of
#: the root file system (not /proc, /sys, /dev or bind mounts), lock, wait.
PIN_PROGRAM = f"""
import ctypes, mmap, os, signal, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
maps = []
root = os.stat("/").st_dev
for top, dirs, files in os.walk("/"):
    keep = []
    for name in dirs:
        try:
            if os.lstat(os.path.join(top, name)).st_dev == root:
                keep.append(name)
        except OSError:
            pass
    dirs[:] = keep
    for name in files:
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode) or info.st_size == 0 or info.st_dev != root:
                continue
            if not info.st_mode & stat.S_IROTH:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            maps.append(mmap.mmap(fd, 0, prot=mmap.PROT_READ))
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)
if libc.mlockall(1) != 0:
    print("awf-pin-failed", ctypes.get_errno(), flush=True)
    sys.exit(1)
print("{PIN_READY}", len(maps), sum(len(m) for m in maps), flush=True)
while True:
    signal.pause()
"""


def pin_container_body(settings: RunnerSettings) -> dict[str, Any]:
    """Create body of the run's pin container (module docstring). Pure."""
    return {
        "Image": settings.image,
        "Entrypoint": ["/usr/bin/python3", "-I", "-S", "-c", PIN_PROGRAM],
        "Cmd": [],
        "User": "0:0",
        "WorkingDir": "/",
        "Env": list(CONTAINER_ENV),
        "Hostname": "pin",
        "NetworkDisabled": True,
        "Tty": False,
        "StopSignal": "SIGKILL",
        "Labels": {LABEL_RUN: settings.run_id, LABEL_ROLE: ROLE_PIN},
        "HostConfig": {
            "Runtime": policy.OCI_RUNC,
            "NetworkMode": "none",
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "CapAdd": ["CAP_IPC_LOCK"],
            "Privileged": False,
            "SecurityOpt": ["no-new-privileges:true"],
            "Memory": PIN_MEMORY_BYTES,
            "MemorySwap": PIN_MEMORY_BYTES,
            "PidsLimit": 8,
            "Ulimits": [
                {"Name": "core", "Soft": 0, "Hard": 0},
            ],
            "IpcMode": "private",
            "AutoRemove": False,
            "LogConfig": {
                "Type": "local",
                "Config": {"max-size": "64k", "max-file": "1", "compress": "false"},
            },
            "RestartPolicy": {"Name": "no"},
        },
    }
