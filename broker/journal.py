"""The durable accounting journal (docs/architecture.md decision 1; spec 14.1, 14.3).

Theory of operation: every fact that authorizes an action is appended to the
journal and fsync'd *before* the action happens: ``admitted`` before the
invocation counts, ``debit`` and ``launched`` before the runner is handed the
invocation (the pipeline writes the three in one fsync'd append), and
``outcome`` when it is over (unsynced: it authorizes nothing; a lost outcome
replays as ``interrupted``, which changes no total). The in-memory ledger is derived
from these records only (``ledger.py``), so a broker killed at any point and
restarted within the same run keeps every debit and every counted invocation.

Framing: ``length (4 bytes, big endian) | crc32 of payload (4 bytes, big
endian) | payload``, where payload is a cbor2-encoded map. The codec
(:func:`encode_record`, :func:`decode_journal`) is pure; :class:`JournalFile`
is the thin file shell (O_APPEND writes, fsync, replay at open).

Replay policy (fail closed):

* a record cut short at the end of the file (a torn write: the process died
  before its fsync returned, so nothing acted on it) is tolerated, reported
  and truncated away;
* a length beyond :data:`MAX_RECORD_BYTES`, a checksum mismatch that is not
  the very last record, or a payload that does not decode to a known record
  is corruption: :class:`JournalCorrupt`, and the broker refuses to start.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cbor2

from bounded_query.broker.fdio import write_all

__all__ = [
    "FORMAT_VERSION",
    "MAX_RECORD_BYTES",
    "OUTCOME_RESULTS",
    "Admitted",
    "Debit",
    "Header",
    "JournalCorrupt",
    "JournalFile",
    "JournalScan",
    "Launched",
    "Outcome",
    "Record",
    "decode_journal",
    "decode_payload",
    "encode_record",
]

FORMAT_VERSION = 1
#: Largest payload we ever write is well under 1 KiB (ids, a slug of at most
#: 140 bytes, small integers); a bigger length field is corruption, not a
#: record, and bounding it keeps a torn tail provably small.
MAX_RECORD_BYTES = 4096
_FRAME = struct.Struct(">II")
#: Ids are broker-generated lowercase hex (invocation ids: 32 digits).
_MAX_ID_LEN = 64
_MAX_TEXT = 200
#: Results an ``outcome`` may carry; ``interrupted`` is written at replay for
#: invocations found in flight (never re-run, never refunded).
OUTCOME_RESULTS = frozenset({"ok", "error", "interrupted"})


class JournalCorrupt(Exception):
    """The journal cannot be trusted (local fault): refuse to start."""


def _check_id(value: object, what: str) -> None:
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= _MAX_ID_LEN
        or value.strip("0123456789abcdef")
    ):
        raise ValueError(f"{what}: expected lowercase hex id")


def _check_text(value: object, what: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= _MAX_TEXT or not value.isprintable():
        raise ValueError(f"{what}: expected a short printable string")


def _check_count(value: object, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise ValueError(f"{what}: expected a non-negative integer")


@dataclass(frozen=True, slots=True)
class Header:
    """First record of every journal: binds the file to one run."""

    run_id: str
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_id(self.run_id, "header.run_id")
        if self.version != FORMAT_VERSION:
            raise ValueError("header.version: unsupported journal format")


@dataclass(frozen=True, slots=True)
class Admitted:
    """An invocation was counted against maxInvocations (spec 14.10).

    Either accepted for ``repo`` with ``charge`` bits (a ``debit`` follows),
    or rejected before launch with a protected ``rejection`` category.
    """

    invocation_id: str
    repo: str | None = None
    charge: int | None = None
    rejection: str | None = None

    def __post_init__(self) -> None:
        _check_id(self.invocation_id, "admitted.invocation_id")
        if self.rejection is None:
            _check_text(self.repo, "admitted.repo")
            _check_count(self.charge, "admitted.charge")
        else:
            _check_text(self.rejection, "admitted.rejection")
            if self.repo is not None or self.charge is not None:
                raise ValueError("admitted: a rejection carries no repo or charge")


@dataclass(frozen=True, slots=True)
class Debit:
    """``bits`` are taken from ``repo``'s run budget; never refunded."""

    invocation_id: str
    repo: str
    bits: int

    def __post_init__(self) -> None:
        _check_id(self.invocation_id, "debit.invocation_id")
        _check_text(self.repo, "debit.repo")
        _check_count(self.bits, "debit.bits")


@dataclass(frozen=True, slots=True)
class Launched:
    """The invocation is being handed to the runner."""

    invocation_id: str

    def __post_init__(self) -> None:
        _check_id(self.invocation_id, "launched.invocation_id")


@dataclass(frozen=True, slots=True)
class Outcome:
    """The invocation is over: ``ok``, ``error`` (with category) or ``interrupted``."""

    invocation_id: str
    result: str
    category: str | None = None

    def __post_init__(self) -> None:
        _check_id(self.invocation_id, "outcome.invocation_id")
        if self.result not in OUTCOME_RESULTS:
            raise ValueError("outcome.result: expected ok, error or interrupted")
        if self.category is not None:
            _check_text(self.category, "outcome.category")


Record = Header | Admitted | Debit | Launched | Outcome

_KIND_OF: dict[type, str] = {
    Header: "header",
    Admitted: "admitted",
    Debit: "debit",
    Launched: "launched",
    Outcome: "outcome",
}
# Field names per kind, in the order of the dataclass constructor.
_FIELDS: dict[str, tuple[type, tuple[str, ...]]] = {
    "header": (Header, ("run_id", "version")),
    "admitted": (Admitted, ("invocation_id", "repo", "charge", "rejection")),
    "debit": (Debit, ("invocation_id", "repo", "bits")),
    "launched": (Launched, ("invocation_id",)),
    "outcome": (Outcome, ("invocation_id", "result", "category")),
}


def encode_record(record: Record) -> bytes:
    """Frame one record: length | crc32 | cbor2 payload."""
    kind = _KIND_OF[type(record)]
    _, names = _FIELDS[kind]
    payload_map: dict[str, object] = {"kind": kind}
    for name in names:
        payload_map[name] = getattr(record, name)
    payload = cbor2.dumps(payload_map)
    if len(payload) > MAX_RECORD_BYTES:  # pragma: no cover - fields are bounded
        raise ValueError("journal record too large")
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def decode_payload(payload: bytes) -> Record:
    """Decode one checksummed payload into a record.

    Raises:
        JournalCorrupt: not a cbor2 map of a known kind with valid fields.
    """
    try:
        obj = cbor2.loads(payload)
    except Exception as exc:  # cbor2 raises several unrelated types
        raise JournalCorrupt(f"undecodable journal payload ({exc.__class__.__name__})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        raise JournalCorrupt("journal payload is not a record")
    kind = obj["kind"]
    if kind not in _FIELDS:
        raise JournalCorrupt(f"unknown journal record kind {kind!r}")
    cls, names = _FIELDS[kind]
    if set(obj) != {"kind", *names}:
        raise JournalCorrupt(f"journal record {kind!r} has unexpected fields")
    try:
        record: Record = cls(*(obj[name] for name in names))
    except (TypeError, ValueError) as exc:
        raise JournalCorrupt(f"invalid journal record: {exc}") from None
    return record


@dataclass(frozen=True, slots=True)
class JournalScan:
    """Result of scanning journal bytes: the records and the usable length.

    ``torn_bytes`` > 0 means the file ends in an incomplete or unchecked
    record of that many bytes (a torn write), which replay discards.
    """

    records: tuple[Record, ...]
    good_length: int
    torn_bytes: int


def decode_journal(data: bytes) -> JournalScan:
    """Scan a whole journal image (pure).

    Raises:
        JournalCorrupt: corruption anywhere but in the last, torn record.
    """
    records: list[Record] = []
    offset = 0
    end = len(data)
    while offset < end:
        if end - offset < _FRAME.size:
            return JournalScan(tuple(records), offset, end - offset)
        length, crc = _FRAME.unpack_from(data, offset)
        if length == 0 or length > MAX_RECORD_BYTES:
            raise JournalCorrupt(f"journal record at byte {offset}: impossible length {length}")
        stop = offset + _FRAME.size + length
        if stop > end:
            return JournalScan(tuple(records), offset, end - offset)
        payload = data[offset + _FRAME.size : stop]
        if zlib.crc32(payload) != crc:
            if stop == end:
                # The last record was not completely written before a crash.
                return JournalScan(tuple(records), offset, end - offset)
            raise JournalCorrupt(f"journal record at byte {offset}: checksum mismatch")
        records.append(decode_payload(payload))
        offset = stop
    return JournalScan(tuple(records), offset, 0)


#: A journal larger than this is not ours (10,000 invocations need < 4 MiB).
MAX_JOURNAL_BYTES = 64 << 20


class JournalFile:
    """Append-only journal file with fsync; blocking (call from a thread)."""

    def __init__(self, path: Path, fd: int, scan: JournalScan) -> None:
        self.path = path
        self._fd = fd
        self.replayed: tuple[Record, ...] = scan.records
        self.torn_bytes = scan.torn_bytes
        self._wedged = False

    @classmethod
    def open(cls, path: Path, run_id: str) -> JournalFile:
        """Open (creating if needed) and replay the journal of ``run_id``.

        A torn tail is truncated away (and reported in ``torn_bytes``). A new
        journal starts with a :class:`Header`.

        Raises:
            JournalCorrupt: corruption, a foreign run id, or a missing header.
            OSError: the file cannot be opened (local fault).
        """
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size > MAX_JOURNAL_BYTES:
                raise JournalCorrupt(f"journal {path} is implausibly large ({size} bytes)")
            data = os.pread(fd, size, 0) if size else b""
            scan = decode_journal(data)
            if scan.torn_bytes:
                os.ftruncate(fd, scan.good_length)
                os.fsync(fd)
            journal = cls(path, fd, scan)
            if not scan.records:
                journal.append([Header(run_id)])
                _fsync_dir(path.parent)
            else:
                first = scan.records[0]
                if not isinstance(first, Header):
                    raise JournalCorrupt("journal does not start with a header")
                if first.run_id != run_id:
                    raise JournalCorrupt("journal belongs to another run")
                if any(isinstance(r, Header) for r in scan.records[1:]):
                    raise JournalCorrupt("journal has a second header")
            return journal
        except BaseException:
            os.close(fd)
            raise

    def append(self, records: Sequence[Record], sync: bool = True) -> None:
        """Append records in one write and (by default) fsync before returning.

        ``sync=False`` is for records that authorize nothing (outcomes): they
        reach the disk with the next fsync or the page cache writeback.

        A failed append is rolled back: the file is truncated to its length
        before the call, so a disk that fills up mid-record leaves no torn
        record that a later append would bury in the middle of the file
        (which replay must treat as corruption). If even the rollback fails,
        the journal refuses every later append.

        Raises:
            OSError: the write or fsync failed (nothing may act on these
                records), or an earlier rollback failed.
        """
        if self._wedged:
            raise OSError(errno.EIO, "journal: an earlier failed append could not be rolled back")
        data = b"".join(encode_record(r) for r in records)
        start = os.fstat(self._fd).st_size
        try:
            write_all(self._fd, data)
            if sync:
                os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                self._wedged = True
            raise

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
