"""Invocation workspaces on the host: the result file and teardown (spec 14.7).

Theory of operation: a workspace is the directory the runner mounts at
``/query``. Everything in it was written by an untrusted script (the overlay
upper directory holds the query's repository mutations), so both helpers
treat it as hostile, and both run only after the runner has removed every
container, so nothing changes the tree while they work.

* :func:`read_result_file` opens ``out`` with O_NOFOLLOW and O_NONBLOCK,
  accepts only a regular file within the size cap, and reads at most one
  byte more than the cap (a symlink, FIFO, device, socket, directory or a
  growing file cannot make the broker read anything else).
* :func:`remove_tree` deletes the tree without following a symlink and
  without crossing into another file system (a mount point inside a
  workspace is refused, never emptied). It is iterative and holds one
  directory descriptor at a time, so neither a tree nested thousands of
  levels deep (``shutil.rmtree`` recurses and dies with RecursionError on
  Python < 3.13) nor the descriptor limit can stop it. Each directory is
  entered by name relative to its parent's descriptor and left through
  ``..``, checking device and inode both ways. Directories are made
  writable before their entries are removed, so a script that chmod'ed its
  tree read-only cannot make cleanup fail. Names are opaque bytes-safe
  strings: newlines and other odd names need no special case. A workspace
  that is itself a mount point (the runner's per-invocation tmpfs,
  ``sandbox/storage.py``, left behind when the broker was killed during an
  invocation) is unmounted first (``broker/mounts.py``, lazily if busy).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bounded_query.broker.mounts import unmount
from bounded_query.broker.protocol import MAX_RESULT_BYTES

__all__ = ["WorkspaceOps", "make_workspace", "read_result_file", "remove_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_workspace(path: Path) -> None:
    """Create one invocation's empty workspace, mode 0700 (and its parents, 0700).

    Raises:
        OSError: it cannot be created, or it already exists.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700)


def read_result_file(path: Path, limit: int = MAX_RESULT_BYTES) -> bytes | None:
    """Read the query's answer safely; None if it is not a small regular file (spec 14.7)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_dir(parent_fd: int, name: str, expect: os.stat_result) -> int:
    """Open directory ``name`` below ``parent_fd``; it must be the one lstat'ed.

    A directory without read or search permission is made accessible first
    (needed only when the broker does not run with CAP_DAC_OVERRIDE).
    """
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (expect.st_dev, expect.st_ino):
            raise OSError(errno.ESTALE, "directory changed during cleanup", name)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_dir(top_parent_fd: int, top_name: str, top: os.stat_result) -> None:
    """Empty and remove directory ``top_name`` (below ``top_parent_fd``).

    Raises:
        OSError: an entry could not be removed, or the tree contains another
            file system's mount point (never crossed).
    """
    fd = _open_dir(top_parent_fd, top_name, top)
    # (name in its parent, inode, names still to remove) per open level.
    stack: list[tuple[str, int, list[str]]] = [(top_name, top.st_ino, os.listdir(fd))]
    try:
        while True:
            name, _, remaining = stack[-1]
            if remaining:
                child = remaining.pop()
                try:
                    info = os.stat(child, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(info.st_mode):
                    os.unlink(child, dir_fd=fd)
                    continue
                if info.st_dev != top.st_dev:
                    raise OSError(errno.EXDEV, "mount point inside a workspace", child)
                child_fd = _open_dir(fd, child, info)
                os.close(fd)
                fd = child_fd
                stack.append((child, info.st_ino, os.listdir(fd)))
                continue
            stack.pop()
            if not stack:
                return
            parent_fd = os.open("..", _DIR_FLAGS, dir_fd=fd)
            parent = os.fstat(parent_fd)
            os.close(fd)
            fd = parent_fd
            if (parent.st_dev, parent.st_ino) != (top.st_dev, stack[-1][1]):
                raise OSError(errno.ESTALE, "parent changed during cleanup", name)
            os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> bool:
    """Remove a workspace (or any tree) without following symlinks; True when it is gone.

    Never raises on a hostile tree: a failure leaves what could not be
    removed and returns False (the caller reports ``cleanup-failed``).
    """
    try:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode) and info.st_dev != os.lstat(path.parent).st_dev:
            unmount(path)  # a workspace tmpfs left mounted (module docstring)
            info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(path)
        else:
            parent_fd = os.open(path.parent, _DIR_FLAGS & ~os.O_NOFOLLOW)
            try:
                _remove_dir(parent_fd, path.name, info)
                os.rmdir(path.name, dir_fd=parent_fd)
            finally:
                os.close(parent_fd)
    except OSError:
        pass
    return not os.path.lexists(path)


@dataclass(frozen=True, slots=True)
class WorkspaceOps:
    """The blocking workspace operations of the pipeline (injected; run in a worker thread).

    The defaults are this module's functions; a test passes its own to
    reach a failure path (a workspace that cannot be made or removed).
    """

    make: Callable[[Path], None] = make_workspace
    remove: Callable[[Path], bool] = remove_tree
