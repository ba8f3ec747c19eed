"""The protected audit log (spec 14.7; docs/architecture.md decision 7).

Theory of operation: the agent only ever sees the canonical bodies; the
*reason* for an outcome goes here, below the broker-private root, one JSON
object per line. Every line leads with ``_schema`` (:data:`AUDIT_SCHEMA`,
``bounded-query-audit/v1``; consumers prefix-match ``bounded-query-audit/``)
and ``timestamp`` (ISO-8601 UTC); the JSON Schema ships as
``harness/schemas/bounded-query-audit.v1.schema.json``. A record holds
exactly: invocation id, the repository when it is a *configured* slug (so
every response is explained to the operator; a slug the agent sent that
is not configured is never written), the schema's root type (``kind``, once
the frame parsed), sensitivity class, charge in bits,
timing bucket in ms, and the outcome/failure category -- never scripts,
outputs, host paths or tokens. :func:`format_record` is pure;
:class:`AuditLog` appends and flushes.

An ``invalid-request`` line also carries ``detail``: the protocol's own
error message naming the offending location (``schema.fields.count: ...``),
so the operator sees *why* without the agent ever seeing it. Those
messages never quote script or output bytes; at most they quote a short
piece of the agent-authored schema (a field name, a type), which is not
secret. :func:`sanitize_detail` still bounds it to
:data:`MAX_DETAIL_CHARS` printable ASCII characters (anything else becomes
``?``), and the key is present only when there is a detail.

Categories are short fixed strings, for example ``ok``, ``invalid-request``,
``repo-not-allowed``, ``bit-budget-exhausted``, ``max-invocations``,
``query-launch-failed``, ``query-timeout``, ``invalid-output``,
``cleanup-failed``, ``timing-bucket-overflow``, ``broker-internal``.

Bounded growth. A hostile client can send refusals without
limit once ``maxInvocations`` is reached, so the log must cost O(1) disk
however long the flood lasts, and it must never be what breaks the journal:

* **Counted answers are written one line each.** An answer that was
  journaled (counted against maxInvocations) gets its own line; there are at
  most ``maxInvocations`` of them in a run.
* **Uncounted answers are tallied** (:class:`RefusalTally`): a refusal past
  the cap, after a journal failure or after an overflow halt adds one to a
  per-category counter; the counters leave as one ``refusal-summary`` record
  per :data:`SUMMARY_INTERVAL_S` in which anything was tallied (written when
  the next refusal arrives after the interval) and one at shutdown. Its
  ``counts`` maps category to number; ``since`` is the wall time of the
  window's first refusal. A SIGKILL loses at most one window's counts (the
  journal, not the audit, is the record that matters).
* **The file has a hard size cap** (:data:`MAX_AUDIT_BYTES`, counting what
  an earlier broker process of the run wrote). The line that would cross it
  is replaced by one ``audit-truncated`` marker record (its space is
  reserved), and nothing more is written by this process.
* **The audit yields to the journal.** A line is written only while the
  filesystem keeps :data:`FREE_FLOOR_BYTES` free (``fstatvfs`` before each
  write), far more than a full run's journal needs (at most 10,000
  invocations of a few hundred bytes), so audit growth can never be why a
  journal append fails. Lines skipped for space are counted and reported in
  the next line that fits as ``skipped``.
* Every write failure is swallowed by the caller (``Service.audit``): it
  never crashes the broker or changes an answer.

The decisions are pure (:func:`decide_write`, :class:`RefusalTally`,
:func:`format_summary`); :class:`AuditLog` only does the I/O.

A bounded-agent broker writes the same log under its own record type,
``bounded-agent-audit/v1`` (:data:`AGENT_AUDIT_SCHEMA`; the JSON Schema is
``harness/schemas/bounded-agent-audit.v1.schema.json``), restricted to what
spec 15.5 allows: an answer's line holds exactly the invocation id, the
trusted sensitivity class, the charge, the timing bucket and the category
-- no repository (not even a configured one), no schema kind, no detail, no
times; a refusal summary holds its counts, the truncation marker its
``skipped`` count. The restriction is applied here, when a line is
formatted (:func:`format_record` with ``schema``), so no caller can add a
field to an agent line. :func:`parse_line` reads both record types.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

from bounded_query.broker.fdio import write_all
from bounded_query.broker.protocol import policy

__all__ = [
    "AGENT_AUDIT_SCHEMA",
    "AUDIT_SCHEMA",
    "FREE_FLOOR_BYTES",
    "MARKER_RESERVE_BYTES",
    "MAX_AUDIT_BYTES",
    "MAX_DETAIL_CHARS",
    "SUMMARY_INTERVAL_S",
    "AuditLine",
    "AuditLog",
    "AuditRecord",
    "RefusalSummary",
    "RefusalTally",
    "Truncation",
    "WriteDecision",
    "decide_write",
    "format_record",
    "format_summary",
    "iso_utc",
    "parse_line",
    "sanitize_detail",
    "truncation_marker",
]

#: Record type and version of every audit line (bump on incompatible change).
AUDIT_SCHEMA = "bounded-query-audit/v1"
#: Record type of a bounded-agent broker's lines: only spec 15.5's fields.
AGENT_AUDIT_SCHEMA = "bounded-agent-audit/v1"
#: Both record types (what :func:`parse_line` reads).
AUDIT_SCHEMAS: tuple[str, ...] = (AUDIT_SCHEMA, AGENT_AUDIT_SCHEMA)
#: Bound of an audit ``detail`` (a protocol error message is well below it).
MAX_DETAIL_CHARS = 200
#: Hard cap of the audit file. A counted line is at most ~600 bytes and a run
#: has at most 10,000 counted answers (maxInvocations, spec 14.2), so 8 MiB
#: holds a whole run's lines with room for restarts and summaries.
MAX_AUDIT_BYTES = 8 * 1024 * 1024
#: Space kept for the truncation marker (its line is about 90 bytes).
MARKER_RESERVE_BYTES = 256
#: Free space the audit leaves to the journal on the shared filesystem: a whole
#: run's journal is at most 10,000 invocations of a few hundred bytes (~4 MiB).
FREE_FLOOR_BYTES = 32 * 1024 * 1024
#: One refusal summary per interval (at most) while a flood lasts.
SUMMARY_INTERVAL_S = 60.0
#: Bound of the categories one summary holds (they are fixed strings; this
#: only guards against a bug turning the tally into an unbounded map).
MAX_SUMMARY_CATEGORIES = 64


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
    #: The configured slug of the request's repository, when it is one.
    repo: str | None = None
    #: The root type of the request's schema (``boolean``, ``object``, ...), once parsed.
    kind: str | None = None


def _wall() -> float:
    return round(time.time(), 3)


def iso_utc(ts: float) -> str:
    """``ts`` (seconds since the epoch) as ISO-8601 UTC with milliseconds (pure)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: The keys an agent line may carry besides ``_schema`` (spec 15.5, and the
#: log's own bookkeeping: summary counts, skipped lines).
_AGENT_KEYS = frozenset(
    {"invocationId", "sensitivity", "charge", "bucketMs", "category", "counts", "total", "skipped"}
)


def _line(obj: dict[str, object], wall: float | None, schema: str = AUDIT_SCHEMA) -> bytes:
    """One audit line: the type and timestamp first, then ``obj`` (pure but the clock).

    An agent line (``schema`` is :data:`AGENT_AUDIT_SCHEMA`) keeps only the
    keys spec 15.5 allows, and no timestamp.
    """
    if schema == AGENT_AUDIT_SCHEMA:
        kept = {key: value for key, value in obj.items() if key in _AGENT_KEYS}
        return json.dumps({"_schema": schema, **kept}, separators=(",", ":")).encode() + b"\n"
    if schema != AUDIT_SCHEMA:
        raise ValueError(f"unknown audit record type {schema!r}")
    head: dict[str, object] = {
        "_schema": AUDIT_SCHEMA,
        "timestamp": iso_utc(_wall() if wall is None else wall),
    }
    return json.dumps({**head, **obj}, separators=(",", ":")).encode() + b"\n"


def _with_skipped(line: bytes, skipped: int) -> bytes:
    """``line`` (one JSON object) with a ``skipped`` count added (pure)."""
    obj = json.loads(line)
    obj["skipped"] = skipped
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def format_record(record: AuditRecord, schema: str = AUDIT_SCHEMA) -> bytes:
    """Serialize one record as a JSON line of record type ``schema`` (pure)."""
    obj: dict[str, object] = {
        "invocationId": record.invocation_id,
        "repo": record.repo,
        "kind": record.kind,
        "sensitivity": record.sensitivity,
        "charge": record.charge,
        "bucketMs": record.bucket_ms,
        "category": record.category,
        "time": record.wall_time,
    }
    if record.detail is not None:
        obj["detail"] = sanitize_detail(record.detail)
    return _line(obj, record.wall_time, schema)


@dataclass(frozen=True, slots=True)
class RefusalSummary:
    """Uncounted answers of one window: ``counts`` as sorted (category, n) pairs."""

    counts: tuple[tuple[str, int], ...]
    #: Wall times of the window (None when read from an agent line: it has none).
    since: float | None
    wall_time: float | None

    def __post_init__(self) -> None:
        if not self.counts or any(n <= 0 for _, n in self.counts):
            raise ValueError("a refusal summary holds at least one positive count")

    @property
    def total(self) -> int:
        """How many answers the summary stands for."""
        return sum(n for _, n in self.counts)


def _log_line(
    category: str, wall_time: float | None, schema: str = AUDIT_SCHEMA, **extra: object
) -> bytes:
    """A record about the log itself: the keys of a record, no invocation, plus ``extra``."""
    obj: dict[str, object] = {
        "invocationId": "-",
        "repo": None,
        "sensitivity": None,
        "charge": None,
        "bucketMs": None,
        "category": category,
        "time": wall_time,
        **extra,
    }
    return _line(obj, wall_time, schema)


def format_summary(summary: RefusalSummary, schema: str = AUDIT_SCHEMA) -> bytes:
    """Serialize a refusal summary as a JSON line (pure); same keys as a record, plus counts."""
    return _log_line(
        policy.CATEGORY_REFUSAL_SUMMARY,
        summary.wall_time,
        schema,
        since=summary.since,
        counts=dict(summary.counts),
        total=summary.total,
    )


def truncation_marker(wall_time: float, skipped: int, schema: str = AUDIT_SCHEMA) -> bytes:
    """The record that ends a log at its cap (pure); ``skipped``: lines lost before it."""
    return _log_line(policy.CATEGORY_AUDIT_TRUNCATED, wall_time, schema, skipped=skipped)


@dataclass(frozen=True, slots=True)
class Truncation:
    """The marker that ends a log at its size cap: ``skipped`` lines were not written."""

    skipped: int
    #: None when read from an agent line (it has no times).
    wall_time: float | None


#: One decoded audit line: an answer, a refusal summary, or the truncation marker.
AuditLine = AuditRecord | RefusalSummary | Truncation


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def parse_line(line: bytes) -> AuditLine | None:
    """Decode one line as :func:`format_record`, :func:`format_summary` or
    :func:`truncation_marker` wrote it (pure).

    The readers (the harness's step summary, report and terminal progress)
    decode through here, so the keys exist in this module only. Tolerant by
    design: the log may end in a torn line or be edited by hand, so anything
    that is not one of our three shapes -- not JSON, another ``_schema``, a
    field of the wrong type -- is None (skipped), never an exception; a
    field that is merely absent or of the wrong type in an answer record
    reads as unknown (None).
    """
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or obj.get("_schema") not in AUDIT_SCHEMAS:
        return None
    # An agent line has no times; a query line without them is not ours.
    timed = obj.get("_schema") == AUDIT_SCHEMA
    category = obj.get("category")
    if not isinstance(category, str):
        return None
    if category == policy.CATEGORY_REFUSAL_SUMMARY:
        counts = obj.get("counts")
        since, wall = _opt_float(obj.get("since")), _opt_float(obj.get("time"))
        if not isinstance(counts, dict) or (timed and (since is None or wall is None)):
            return None
        pairs = tuple(sorted((k, n) for k, n in counts.items() if _opt_int(n) is not None))
        try:
            return RefusalSummary(pairs, since, wall)
        except ValueError:
            return None
    if category == policy.CATEGORY_AUDIT_TRUNCATED:
        skipped, wall = _opt_int(obj.get("skipped")), _opt_float(obj.get("time"))
        if skipped is None or (timed and wall is None):
            return None
        return Truncation(skipped, wall)
    invocation_id = obj.get("invocationId")
    if not isinstance(invocation_id, str):
        return None
    return AuditRecord(
        invocation_id=invocation_id,
        category=category,
        sensitivity=_opt_str(obj.get("sensitivity")),
        charge=_opt_int(obj.get("charge")),
        bucket_ms=_opt_int(obj.get("bucketMs")),
        wall_time=_opt_float(obj.get("time")),
        detail=_opt_str(obj.get("detail")),
        repo=_opt_str(obj.get("repo")),
        kind=_opt_str(obj.get("kind")),
    )


@dataclass
class RefusalTally:
    """Per-category counts of uncounted answers, flushed once per interval (pure).

    ``now`` is a monotonic time (trio's clock), ``wall`` the wall time for
    the record. :meth:`add` returns a summary of the *previous* window when
    that window is at least ``interval_s`` old (so a flood yields at most one
    record per interval); :meth:`flush` returns whatever is pending (shutdown).
    """

    interval_s: float = SUMMARY_INTERVAL_S
    _counts: dict[str, int] = field(default_factory=dict)
    _opened: float = 0.0
    _since: float = 0.0

    def add(self, category: str, now: float, wall: float) -> RefusalSummary | None:
        """Count one answer; a due summary of the earlier window, or None."""
        due = None
        if self._counts and now - self._opened >= self.interval_s:
            due = self.flush(wall)
        if not self._counts:
            self._opened, self._since = now, wall
        if category not in self._counts and len(self._counts) >= MAX_SUMMARY_CATEGORIES:
            category = policy.CATEGORY_OTHER
        self._counts[category] = self._counts.get(category, 0) + 1
        return due

    def flush(self, wall: float) -> RefusalSummary | None:
        """The pending counts as one summary (None if nothing is pending); resets."""
        if not self._counts:
            return None
        summary = RefusalSummary(tuple(sorted(self._counts.items())), self._since, wall)
        self._counts = {}
        return summary

    @property
    def pending(self) -> Mapping[str, int]:
        """Counts not yet flushed (read-only view)."""
        return dict(self._counts)


class WriteDecision(Enum):
    """What the size policy lets the log do with one line."""

    WRITE = "write"
    MARKER = "marker"
    DROP = "drop"


def decide_write(
    written: int,
    length: int,
    *,
    truncated: bool,
    free_bytes: int | None,
    cap: int = MAX_AUDIT_BYTES,
    reserve: int = MARKER_RESERVE_BYTES,
    floor: int = FREE_FLOOR_BYTES,
) -> WriteDecision:
    """Whether a ``length``-byte line may follow ``written`` bytes (pure).

    WRITE while the line fits below ``cap - reserve`` and the filesystem keeps
    ``floor`` free after it (``free_bytes`` None: unknown, not a reason to
    drop); MARKER for the first line that would cross the cap (the caller
    writes the truncation marker in its place); DROP afterwards, and while
    space is short.
    """
    if truncated:
        return WriteDecision.DROP
    if free_bytes is not None and free_bytes - length < floor:
        return WriteDecision.DROP
    if written + length <= cap - reserve:
        return WriteDecision.WRITE
    return WriteDecision.MARKER


class AuditLog:
    """Append-only JSONL file, mode 0600, capped (blocking; call from a thread).

    Thread-safe: one lock orders the size accounting and the write.
    """

    def __init__(
        self,
        path: Path,
        *,
        cap: int = MAX_AUDIT_BYTES,
        floor: int = FREE_FLOOR_BYTES,
        schema: str = AUDIT_SCHEMA,
    ) -> None:
        if schema not in AUDIT_SCHEMAS:
            raise ValueError(f"unknown audit record type {schema!r}")
        #: The record type of every line (a bounded-agent broker's is restricted).
        self.schema = schema
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(path, flags, 0o600)
        self._cap = cap
        self._floor = floor
        self._lock = threading.Lock()
        #: Bytes in the file, an earlier process's included (the cap is per file).
        self.written = os.fstat(self._fd).st_size
        self.truncated = False
        #: Lines not written for lack of space (reported in the next line written).
        self.skipped = 0

    def write(self, record: AuditRecord) -> None:
        """Append one record if the size policy admits it (one write per line).

        Raises:
            OSError: the write failed (the caller swallows it).
        """
        self.write_line(format_record(record, self.schema))

    def write_summary(self, summary: RefusalSummary) -> None:
        """Append one refusal summary (same policy as :meth:`write`)."""
        self.write_line(format_summary(summary, self.schema))

    def write_line(self, line: bytes) -> None:
        """Append one pre-formatted line under the size policy (:func:`decide_write`)."""
        with self._lock:
            if self._fd < 0:
                return
            if self.skipped:
                line = _with_skipped(line, self.skipped)
            decision = decide_write(
                self.written,
                len(line),
                truncated=self.truncated,
                free_bytes=self._free_bytes(),
                cap=self._cap,
                floor=self._floor,
            )
            if decision is WriteDecision.DROP:
                self.skipped += 1
                return
            if decision is WriteDecision.MARKER:
                self.truncated = True
                line = truncation_marker(_wall(), self.skipped + 1, self.schema)
                if self.written + len(line) > self._cap:
                    return
            write_all(self._fd, line)
            self.written += len(line)
            self.skipped = 0

    def _free_bytes(self) -> int | None:
        try:
            stats = os.fstatvfs(self._fd)
        except OSError:
            return None
        return stats.f_bavail * stats.f_frsize

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
