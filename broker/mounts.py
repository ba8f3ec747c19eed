"""Mounting and unmounting: the only ``mount(2)`` and ``umount2(2)`` calls of the project.

Theory of operation: per-invocation storage (``sandbox/storage.py`` sizes
it, the runner mounts it over a workspace), the broker's sweep of workspaces
a killed broker left mounted (``broker/workspace.py``) and the harness's
run-wide work quota (``harness/lifecycle/quota.py``) all mount and unmount
tmpfs file systems. The calls live here once, as thin ctypes calls (no
``mount`` binary, no PATH lookup), so they cannot drift apart.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

__all__ = ["make_shared", "mount_tmpfs", "unmount"]

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_SHARED = 1 << 20
_MNT_DETACH = 0x2
#: umount2 errors meaning "nothing mounted there".
_NOT_MOUNTED = frozenset({errno.EINVAL, errno.ENOENT})


def unmount(target: Path) -> str:
    """Unmount ``target``; return ``"unmounted"``, ``"detached"`` or ``"absent"``.

    A busy file system is detached (lazy unmount): it disappears from the
    tree at once and is freed when its last user goes. A thin ``umount2(2)``
    call through ctypes (no ``umount`` binary, no PATH lookup).

    Raises:
        OSError: neither unmount worked (for example EPERM without privilege).
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


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _raise(target: Path) -> None:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code), str(target))


def mount_tmpfs(target: Path, options: str) -> None:
    """Mount a fresh tmpfs at the existing directory ``target``, nosuid and
    nodev, with the mount data ``options`` (size, inodes, mode).

    Raises:
        OSError: the mount failed (EPERM: no privilege).
    """
    libc = _libc()
    flags = ctypes.c_ulong(_MS_NOSUID | _MS_NODEV)
    if libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode()) != 0:
        _raise(target)


def make_shared(target: Path) -> None:
    """Make the mount at ``target`` a shared mount (its own peer group).

    Lets a container that binds it with ``rshared`` propagation (the compose
    broker) make mounts below it that the host, and so the engine, sees.

    Raises:
        OSError: the call failed.
    """
    if _libc().mount(None, os.fsencode(target), None, ctypes.c_ulong(_MS_SHARED), None) != 0:
        _raise(target)
