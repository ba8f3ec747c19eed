"""One human line per answered invocation, for an operator at a terminal.

Theory of operation: the broker writes one protected audit record per
counted response (``broker/audit.py``); while the agent runs, the harness
(which may read the private root; the agent may not) follows that file and,
when its stderr is a terminal, prints one line per new record -- repository,
kind of schema, charge, bucket and outcome -- next to the JSONL events.
:func:`human_line` is pure; :func:`follow_audit` only reads new bytes off
the event loop and waits. It never changes an outcome: an unreadable file
or a malformed line prints nothing.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from bounded_query.broker.audit import AuditLine, RefusalSummary, Truncation, parse_line
from bounded_query.broker.timing import bucket_label

__all__ = [
    "FOLLOW_POLL_S",
    "AuditFollower",
    "drain",
    "follow_audit",
    "human_line",
    "read_inline",
]

#: How often the follower looks for new audit lines.
FOLLOW_POLL_S = 0.25
#: At most this much of the file is read per poll.
_READ_CHUNK = 1024 * 1024


def _bucket(ms: object) -> str:
    if not isinstance(ms, int) or isinstance(ms, bool):
        return "no bucket"
    return bucket_label(ms)


def human_line(record: AuditLine) -> str | None:
    """The terminal line for one decoded audit line (pure)."""
    if isinstance(record, RefusalSummary):
        parts = ", ".join(f"{k}: {v}" for k, v in record.counts)
        return f"bounded-query: {record.total} uncounted refusals ({parts})"
    if isinstance(record, Truncation):
        return "bounded-query: the audit log reached its size cap; later answers are not listed"
    repo = record.repo if record.repo is not None else "(no configured repo)"
    kind = record.kind if record.kind is not None else "?"
    bits = f"{record.charge} bits" if record.charge is not None else "—"
    return f"bounded-query: {repo}  {kind}  {bits}  {_bucket(record.bucket_ms)}  {record.category}"


class AuditFollower:
    """Turns appended audit bytes into complete records (pure; keeps the partial tail)."""

    def __init__(self) -> None:
        self.offset = 0
        self._partial = b""

    def feed(self, data: bytes) -> list[AuditLine]:
        """Records completed by ``data`` (the bytes after :attr:`offset`), decoded."""
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        decoded = (parse_line(line) for line in lines)
        return [record for record in decoded if record is not None]


def _read_after(path: Path, offset: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, _READ_CHUNK, offset)
    except OSError:
        return b""
    finally:
        os.close(fd)


async def _read_in_thread(path: Path, offset: int) -> bytes:
    return await trio.to_thread.run_sync(_read_after, path, offset)


async def read_inline(path: Path, offset: int) -> bytes:
    """The same read on the event loop (tests with a mock clock: no threads)."""
    return _read_after(path, offset)


def _emit(follower: AuditFollower, data: bytes, write: Callable[[str], None]) -> None:
    for record in follower.feed(data):
        line = human_line(record)
        if line is not None:
            write(line)


def drain(path: Path, follower: AuditFollower, write: Callable[[str], None]) -> None:
    """Print what was appended since ``follower`` last read (teardown, broker stopped)."""
    while True:
        data = _read_after(path, follower.offset)
        _emit(follower, data, write)
        if len(data) < _READ_CHUNK:
            return


async def follow_audit(
    path: Path,
    write: Callable[[str], None],
    *,
    follower: AuditFollower | None = None,
    poll_s: float = FOLLOW_POLL_S,
    read: Callable[[Path, int], Awaitable[bytes]] = _read_in_thread,
) -> None:
    """Print :func:`human_line` of every record appended to ``path``, until cancelled.

    Pass a ``follower`` to :func:`drain` the last records after cancelling.
    """
    follower = follower if follower is not None else AuditFollower()
    while True:
        data = await read(path, follower.offset)
        _emit(follower, data, write)
        if len(data) < _READ_CHUNK:
            await trio.sleep(poll_s)
