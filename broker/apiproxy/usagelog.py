"""The usage log file: append-only JSON lines with a hard size cap (blocking I/O).

Theory of operation: ``usage.jsonl`` lives in a 0700 directory the harness
places under the bounded-agent private root (spec 15.6: the proxy's token
logs and quota state never leave it). The file is opened once
(``O_APPEND | O_NOFOLLOW``, 0600) and each record is one ``write`` of one
line. A flooding enclave cannot fill the disk: the line that would cross
:data:`MAX_USAGE_FILE_BYTES` (counting what an earlier process wrote) is
replaced by one ``usage-truncated`` marker, and nothing more is written by
this process. Records come from ``_usage.encode_record``, which holds no
bodies and no credentials.
"""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

from bounded_query.broker.apiproxy._limits import MAX_USAGE_FILE_BYTES, MAX_USAGE_LINE_BYTES
from bounded_query.broker.apiproxy._usage import UsageRecord, encode_record, truncated_marker

__all__ = ["UsageLog", "utc_timestamp"]


def utc_timestamp() -> str:
    """Now, ISO-8601 UTC with milliseconds (``2026-12-01T20:00:00.000Z``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class UsageLog:
    """Append usage records to ``path`` (see the module docstring)."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_USAGE_FILE_BYTES) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        info = os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(self._fd)
            raise OSError(f"usage log {path}: not a regular file")
        self._size = info.st_size
        self._max = max_bytes
        self._full = False
        #: Records not written because the cap was reached.
        self.dropped = 0

    def write(self, record: UsageRecord) -> None:
        """Append one record (or the truncation marker once, then nothing)."""
        line = encode_record(record)
        assert len(line) <= MAX_USAGE_LINE_BYTES
        if self._full:
            self.dropped += 1
            return
        if self._size + len(line) + MAX_USAGE_LINE_BYTES > self._max:
            self._full = True
            self.dropped += 1
            line = truncated_marker(record.timestamp)
        os.write(self._fd, line)
        self._size += len(line)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
