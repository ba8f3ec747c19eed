"""The protected audit log (spec 14.7; DESIGN.md decision 7).

Theory of operation: the agent only ever sees the canonical bodies; the
*reason* for an outcome goes here, below the broker-private root, one JSON
object per line. A record holds exactly: invocation id, sensitivity class,
charge in bits, timing bucket in ms, and the outcome/failure category --
never scripts, outputs, host paths, repository names or tokens.
:func:`format_record` is pure; :class:`AuditLog` appends and flushes.

An ``invalid-request`` line also carries ``detail``: the protocol's own
error message naming the offending location (``schema.fields.count: ...``),
so the operator sees *why* without the agent ever seeing it (issue 2). Those
messages never quote script or output bytes; at most they quote a short
piece of the agent-authored schema (a field name, a type), which is not
secret. :func:`sanitize_detail` still bounds it to
:data:`MAX_DETAIL_CHARS` printable ASCII characters (anything else becomes
``?``), and the key is present only when there is a detail.

Categories are short fixed strings, for example ``ok``, ``invalid-request``,
``repo-not-allowed``, ``bit-budget-exhausted``, ``max-invocations``,
``query-launch-failed``, ``query-timeout``, ``invalid-output``,
``cleanup-failed``, ``timing-bucket-overflow``, ``broker-internal``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_DETAIL_CHARS", "AuditLog", "AuditRecord", "format_record", "sanitize_detail"]

#: Bound of an audit ``detail`` (a protocol error message is well below it).
MAX_DETAIL_CHARS = 200


def sanitize_detail(text: str) -> str:
    """Printable ASCII only (others become ``?``), at most MAX_DETAIL_CHARS (pure)."""
    clipped = text[: MAX_DETAIL_CHARS + 1]
    safe = "".join(ch if " " <= ch <= "~" else "?" for ch in clipped)
    if len(safe) > MAX_DETAIL_CHARS:
        safe = safe[: MAX_DETAIL_CHARS - 3] + "..."
    return safe


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One protected audit line; ``sensitivity``/``charge``/``bucket_ms`` may be unknown."""

    invocation_id: str
    category: str
    sensitivity: str | None = None
    charge: int | None = None
    bucket_ms: int | None = None
    wall_time: float | None = None
    detail: str | None = None


def format_record(record: AuditRecord) -> bytes:
    """Serialize one record as a JSON line (pure)."""
    obj: dict[str, object] = {
        "invocationId": record.invocation_id,
        "sensitivity": record.sensitivity,
        "charge": record.charge,
        "bucketMs": record.bucket_ms,
        "category": record.category,
        "time": record.wall_time,
    }
    if record.detail is not None:
        obj["detail"] = sanitize_detail(record.detail)
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n"


class AuditLog:
    """Append-only JSONL file, mode 0600 (blocking; call from a thread)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(path, flags, 0o600)

    def write(self, record: AuditRecord) -> None:
        """Append one line (a single write, so lines never interleave)."""
        os.write(self._fd, format_record(record))

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
