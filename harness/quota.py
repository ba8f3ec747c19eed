"""A hard size quota for the broker's invocation workspaces (DESIGN.md decision 3).

Theory of operation: each query's writable ``/query/repo`` is an overlay whose
upper layer lives in its workspace ``<privateRoot>/work/<invocationId>/upper``
(``sandbox/overlay.py``). On the host disk that layer is bounded only per file
(RLIMIT_FSIZE), by the PID limit and by the timeout: many gigabytes. So before
the broker starts, the harness mounts a size-limited tmpfs at
``<privateRoot>/work`` and removes it at teardown, after the broker is gone:

* size :func:`work_quota_bytes` -- half the query memory limit, at least
  :data:`WORK_QUOTA_MIN_BYTES`. Measured (runc and runsc): tmpfs pages a
  query writes are charged to its memory cgroup and cannot be reclaimed
  (there is no swap), so a quota at or above the memory limit is never
  reached -- the query is OOM-killed first and cannot even catch the error.
  Half the limit leaves the other half to the query's processes, so a
  runaway writer gets ENOSPC, which a script can handle, and the quota does
  not depend on how the kernel or the runtime accounts the pages.
  Invocations are serialized and each workspace is deleted after its query,
  so one workspace uses the quota at a time. The answer file ``/query/out``
  is in the same workspace: a script that filled the quota must free space
  before it can answer;
* inodes :data:`WORK_QUOTA_BYTES_PER_INODE` bytes of quota per inode, so
  millions of empty files cannot pin unbounded kernel memory either;
* ``mode=0700,nosuid,nodev``: as private as the directory it replaces.

In ``run --compose`` the broker container bind-mounts the private root
recursively, so the same host mount is what the broker and dockerd see. The
detached ``compose`` command mounts it too and ``compose-down`` unmounts
it. A harness killed with SIGKILL runs no teardown and leaves
the (by then normally empty) mount and the private root behind; the next
``run`` or ``compose`` on the same base unmounts and removes them
(``sweep.py``).

Unmounting never blocks teardown: a plain unmount, then a lazy (detached)
one when something still holds the file system (for example the overlay of
a container the engine has not finished removing).

The sizing and option string are pure; :func:`mount_tmpfs` and
:func:`unmount` are thin ``mount(2)``/``umount2(2)`` calls through ctypes
(no ``mount`` binary, no PATH lookup).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass
from pathlib import Path

import trio

from .events import EventSink

__all__ = [
    "WORK_QUOTA_BYTES_PER_INODE",
    "WORK_QUOTA_MIN_BYTES",
    "WorkQuota",
    "mount_tmpfs",
    "mount_work_quota",
    "unmount",
    "unmount_work_quota",
    "work_quota",
    "work_quota_bytes",
]

#: Smallest workspace quota: room for the script, the answer file and a
#: modest amount of repository writes even under a tiny memory limit.
WORK_QUOTA_MIN_BYTES = 16 * 1024**2
#: One inode per this many bytes of quota (131072 inodes at 128 MiB): far
#: more files than a query can fill with data, far fewer than would matter
#: as kernel memory.
WORK_QUOTA_BYTES_PER_INODE = 1024
#: Mode of the tmpfs root, the same as the ``work/`` directory it replaces.
WORK_QUOTA_MODE = 0o700

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2
#: umount2 errors meaning "nothing mounted there".
_NOT_MOUNTED = frozenset({errno.EINVAL, errno.ENOENT})
#: Upper bound on the unmount at teardown (it is a syscall on a tmpfs: this
#: only guards against a wedged kernel path, so teardown cannot hang).
UNMOUNT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class WorkQuota:
    """Size and inode count of one workspace tmpfs."""

    size_bytes: int
    inodes: int

    def __post_init__(self) -> None:
        if self.size_bytes < WORK_QUOTA_MIN_BYTES or self.inodes < 1:
            raise ValueError(f"workspace quota too small: {self.size_bytes} bytes")

    @property
    def options(self) -> str:
        """The tmpfs mount data string."""
        return f"size={self.size_bytes},nr_inodes={self.inodes},mode={WORK_QUOTA_MODE:o}"


def work_quota_bytes(memory_bytes: int) -> int:
    """The workspace quota for a query memory limit of ``memory_bytes`` (see module doc)."""
    return max(WORK_QUOTA_MIN_BYTES, memory_bytes // 2)


def work_quota(memory_bytes: int) -> WorkQuota:
    """Size and inodes of the workspace tmpfs for ``memory_bytes``."""
    size = work_quota_bytes(memory_bytes)
    return WorkQuota(size, size // WORK_QUOTA_BYTES_PER_INODE)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(target: Path, quota: WorkQuota) -> None:
    """Mount a fresh tmpfs with ``quota`` at the existing directory ``target``.

    Raises:
        OSError: the mount failed (no privilege, no tmpfs support): the
            caller continues without a quota, visibly degraded.
    """
    libc = _libc()
    result = libc.mount(
        b"tmpfs",
        os.fsencode(target),
        b"tmpfs",
        ctypes.c_ulong(_MS_NOSUID | _MS_NODEV),
        quota.options.encode("ascii"),
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


def unmount(target: Path) -> str:
    """Unmount ``target``; return ``"unmounted"``, ``"detached"`` or ``"absent"``.

    A busy file system is detached (lazy unmount): it disappears from the
    tree at once and is freed when its last user goes.

    Raises:
        OSError: neither unmount worked (the caller reports it; the mount
            stays and the private root cannot be removed).
    """
    libc = _libc()
    path = os.fsencode(target)
    if libc.umount2(path, 0) == 0:
        return "unmounted"
    if ctypes.get_errno() in _NOT_MOUNTED:
        return "absent"
    if libc.umount2(path, _MNT_DETACH) == 0:
        return "detached"
    code = ctypes.get_errno()
    if code in _NOT_MOUNTED:
        return "absent"
    raise OSError(code, os.strerror(code), str(target))


async def mount_work_quota(work_dir: Path, memory_bytes: int, sink: EventSink) -> bool:
    """Create ``work_dir`` and mount its quota; True when mounted.

    Without root, or when the mount fails, the run continues visibly
    degraded (a ``degraded`` event and the step summary's notice): the
    workspaces then live on the private root's disk.
    """
    quota = work_quota(memory_bytes)
    reason = "the harness is not running as root"
    if os.geteuid() == 0:
        try:
            await trio.to_thread.run_sync(_make_and_mount, work_dir, quota)
        except OSError as exc:
            reason = f"mounting it failed ({exc.strerror or exc.__class__.__name__})"
        else:
            sink.emit("work_quota_mounted", sizeBytes=quota.size_bytes, inodes=quota.inodes)
            return True
    sink.degrade(
        "workspace quota",
        f"no {quota.size_bytes // 1024**2} MiB tmpfs for query workspaces: {reason}; a query's"
        " repository writes are bounded only per file, by its PID limit and by its timeout",
    )
    return False


def _make_and_mount(work_dir: Path, quota: WorkQuota) -> None:
    os.mkdir(work_dir, WORK_QUOTA_MODE)
    mount_tmpfs(work_dir, quota)


async def unmount_work_quota(work_dir: Path, sink: EventSink) -> None:
    """Unmount the quota (lazily if busy), bounded by :data:`UNMOUNT_TIMEOUT_S`; never raises.

    A failure is a degraded condition: the private root then cannot be
    removed completely.
    """
    outcome = "timed out"
    with trio.move_on_after(UNMOUNT_TIMEOUT_S):
        try:
            outcome = await trio.to_thread.run_sync(unmount, work_dir, abandon_on_cancel=True)
        except OSError as exc:
            outcome = f"failed ({exc.strerror or exc.__class__.__name__})"
    if outcome in ("unmounted", "detached", "absent"):
        sink.emit("work_quota_unmounted", how=outcome)
    else:
        sink.degrade("workspace quota", f"unmounting the workspace tmpfs {outcome}")
