"""Per-invocation storage: a fresh tmpfs for every query's workspace.

Theory of operation: a file system hands out inode numbers from a counter of
its own and reports its own free blocks and inodes. When every invocation's
writable layer lived on one run-wide tmpfs, a query that created N files
moved the inode number the next query's ``/query/out`` got by N: bits carried
from a metered query into a later (possibly unmetered ``public``) one. So the
runner mounts a fresh tmpfs over the invocation's workspace directory before
it writes anything there, and unmounts it after the container and the
overlay volume are gone. The workspace then holds, on that tmpfs alone, the
script, the result file and the overlay's upper and work directories: every
file system a query can write or stat is its own (``/tmp``, ``/dev/shm``
and ``/query`` are per-container tmpfs mounts of the engine), and the broker
creates the same few entries in the same order every time, so the inode
numbers, free-block and free-inode figures a query starts with are the same
for every invocation.

Size (docs/architecture.md decision 3): half the query memory limit, at least
:data:`MIN_BYTES`. Tmpfs pages a query writes are charged to its memory
cgroup and cannot be reclaimed (no swap), so a quota at or above the memory
limit is never reached -- the query would be OOM-killed instead of seeing
ENOSPC. Half leaves the other half to its processes. One inode per
:data:`BYTES_PER_INODE` bytes bounds the kernel memory empty files can pin.

Who mounts: the broker, with ``mount(2)`` (it runs as root on the host, or
as root with CAP_SYS_ADMIN in the compose service, whose view of the
workspaces directory is an ``rshared`` bind so the mount propagates to the
engine's host). Without the privilege (EPERM) the workspace stays a plain
directory on the run-wide quota: the inode counter channel is then open and
``harness/configuration/channel_policy.py`` treats storage as shared.

The runner reads the result file (with the broker's checked reader) before
the unmount and returns its bytes in the run report; the tmpfs and
everything on it then go at once.

The sizing is here and pure; the mount calls themselves (``mount(2)`` and
``umount2(2)`` through ctypes) are ``broker/mounts.py``, shared with the
broker's workspace sweep and the harness's work quota.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BYTES_PER_INODE",
    "MIN_BYTES",
    "TmpfsQuota",
    "quota_bytes",
    "tmpfs_quota",
]

#: Smallest quota: room for the script, the answer file and a modest amount
#: of repository writes even under a tiny memory limit.
MIN_BYTES = 16 * 1024**2
#: One inode per this many bytes of quota (131072 inodes at 128 MiB): far
#: more files than a query can fill with data, far fewer than would matter
#: as kernel memory.
BYTES_PER_INODE = 1024
#: Mode of the tmpfs root, the same as the 0700 directory it covers.
MODE = 0o700


@dataclass(frozen=True, slots=True)
class TmpfsQuota:
    """Size and inode count of one tmpfs."""

    size_bytes: int
    inodes: int

    def __post_init__(self) -> None:
        if self.size_bytes < MIN_BYTES or self.inodes < 1:
            raise ValueError(f"workspace quota too small: {self.size_bytes} bytes")

    @property
    def options(self) -> str:
        """The tmpfs mount data string."""
        return f"size={self.size_bytes},nr_inodes={self.inodes},mode={MODE:o}"


def quota_bytes(memory_bytes: int) -> int:
    """The quota for a query memory limit of ``memory_bytes`` (see module doc)."""
    return max(MIN_BYTES, memory_bytes // 2)


def tmpfs_quota(memory_bytes: int) -> TmpfsQuota:
    """Size and inodes of a workspace tmpfs for ``memory_bytes``."""
    size = quota_bytes(memory_bytes)
    return TmpfsQuota(size, size // BYTES_PER_INODE)
