"""A hard size quota for the broker's invocation workspaces (docs/architecture.md decision 3).

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

Per-invocation storage: inside this run-wide tmpfs the broker's
runner mounts a fresh tmpfs of the same size over each invocation's
workspace (``sandbox/storage.py``), so no inode counter or free-space figure
is shared between invocations; the run-wide one remains the outer bound (and
the whole bound when the broker cannot mount). It is made a shared mount so
the compose broker's ``rshared`` bind of it carries those mounts to the host.
The sizing lives in ``sandbox/storage.py``, the mount calls in ``broker/mounts.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from bounded_query.broker.mounts import make_shared, mount_tmpfs, unmount
from bounded_query.harness.records.events import EventSink
from bounded_query.sandbox.storage import (
    BYTES_PER_INODE,
    MIN_BYTES,
    TmpfsQuota,
    quota_bytes,
    tmpfs_quota,
)

__all__ = [
    "WORK_QUOTA_BYTES_PER_INODE",
    "WORK_QUOTA_MIN_BYTES",
    "WorkQuota",
    "mount_work_quota",
    "unmount_work_quota",
    "work_quota",
    "work_quota_bytes",
]

#: The sizing is the per-invocation storage's (sandbox/storage.py, one source).
WORK_QUOTA_MIN_BYTES = MIN_BYTES
WORK_QUOTA_BYTES_PER_INODE = BYTES_PER_INODE
WORK_QUOTA_MODE = 0o700
WorkQuota = TmpfsQuota
work_quota_bytes = quota_bytes
work_quota = tmpfs_quota
#: Upper bound on the unmount at teardown (it is a syscall on a tmpfs: this
#: only guards against a wedged kernel path, so teardown cannot hang).
UNMOUNT_TIMEOUT_S = 10.0


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


def _make_and_mount(work_dir: Path, quota: TmpfsQuota) -> None:
    os.mkdir(work_dir, WORK_QUOTA_MODE)
    mount_tmpfs(work_dir, quota.options)
    # shared, so the compose broker's rshared bind of it propagates the
    # per-invocation mounts it makes below it to the engine's host
    make_shared(work_dir)


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
