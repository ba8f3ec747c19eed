"""The staging token leaves this process's environment at once (spec 14.6).

Theory of operation: ``/proc/<pid>/environ`` shows the environment block the
process was *started* with -- the bytes between ``env_start`` and
``env_end`` (fields 50 and 51 of ``/proc/<pid>/stat``) -- not the current
``environ``: ``unsetenv`` (``os.environ.pop``) only drops a pointer, so a
token passed to the harness stays readable there for the whole run, to any
process with the same uid or with ``CAP_SYS_PTRACE``. The harness therefore
copies its environment once at start, then removes the token variables from
``os.environ`` *and* overwrites their entries in that block with NUL bytes.
From then on the token lives only in the run's Python mapping, which hands it
to the clone children (through GIT_ASKPASS, ``staging.py``) and drops it
after staging.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["TOKEN_VARIABLES", "environ_block_bounds", "scrub_process_environment"]

#: Environment variables that may hold the staging credential, in order.
TOKEN_VARIABLES = ("GH_TOKEN", "GITHUB_TOKEN")

#: Fields of ``/proc/<pid>/stat`` (1-based) holding the environment block bounds.
_ENV_START_FIELD = 50
_ENV_END_FIELD = 51
#: A block larger than this is not an environment block (refuse to touch it).
MAX_ENV_BLOCK = 16 * 1024 * 1024


def environ_block_bounds(stat_text: str) -> tuple[int, int] | None:
    """``(env_start, env_end)`` from the text of ``/proc/<pid>/stat``, or None.

    The command name (field 2) is parenthesized and may contain anything, so
    fields are counted after the last ``)`` (which ends field 2).
    """
    fields = stat_text.rsplit(")", 1)[-1].split()
    index_end = _ENV_END_FIELD - 3
    if len(fields) <= index_end:
        return None
    try:
        start, end = int(fields[_ENV_START_FIELD - 3]), int(fields[index_end])
    except ValueError:
        return None
    if not 0 < start < end or end - start > MAX_ENV_BLOCK:
        return None
    return start, end


def _wipe_block(names: tuple[str, ...]) -> int:
    try:
        bounds = environ_block_bounds(Path("/proc/self/stat").read_text("ascii", "replace"))
    except OSError:
        return 0
    if bounds is None:
        return 0
    start, end = bounds
    block = (ctypes.c_char * (end - start)).from_address(start)
    raw = bytes(block)
    prefixes = tuple(f"{name}=".encode() for name in names)
    wiped = 0
    offset = 0
    for entry in raw.split(b"\0"):
        if entry.startswith(prefixes):
            ctypes.memset(start + offset, 0, len(entry))
            wiped += 1
        offset += len(entry) + 1
    return wiped


def scrub_process_environment(names: Iterable[str]) -> int:
    """Remove ``names`` from ``os.environ`` and wipe them from the start-up block.

    Returns how many entries of the block were overwritten. Call it after
    copying ``os.environ`` (the copy keeps the values). Never raises: a
    kernel without the stat fields leaves the block as it is (the
    confinement, not this, is what keeps the agent out).
    """
    names = tuple(names)
    for name in names:
        os.environ.pop(name, None)
    try:
        return _wipe_block(names)
    except (ValueError, OSError):
        return 0
