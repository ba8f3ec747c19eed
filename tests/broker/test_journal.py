"""Journal codec and file (broker/journal.py): framing, torn tails, corruption."""

from __future__ import annotations

import contextlib
import struct
import zlib
from pathlib import Path

import cbor2
import pytest

from bounded_query.broker.journal import (
    MAX_RECORD_BYTES,
    Admitted,
    Debit,
    Header,
    JournalCorrupt,
    JournalFile,
    Launched,
    Outcome,
    Record,
    decode_journal,
    decode_payload,
    encode_record,
)

RUN = "ab" * 8
INV = "0123456789abcdef" * 2

SAMPLE: list[Record] = [
    Header(RUN),
    Admitted(INV, repo="octo/alpha", charge=5),
    Debit(INV, "octo/alpha", 5),
    Launched(INV),
    Outcome(INV, "ok"),
    Admitted("ff", rejection="invalid-request"),
    Outcome("ee", "error", "query-timeout"),
]


def _frame(payload: bytes) -> bytes:
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def test_roundtrip_every_kind():
    data = b"".join(encode_record(r) for r in SAMPLE)
    scan = decode_journal(data)
    assert scan.records == tuple(SAMPLE)
    assert scan.good_length == len(data)
    assert scan.torn_bytes == 0


def test_every_truncation_is_a_tolerated_torn_tail():
    data = b"".join(encode_record(r) for r in SAMPLE)
    boundaries = {0}
    total = 0
    for r in SAMPLE:
        total += len(encode_record(r))
        boundaries.add(total)
    for cut in range(len(data)):
        scan = decode_journal(data[:cut])
        assert scan.good_length <= cut
        assert scan.good_length in boundaries
        assert scan.torn_bytes == cut - scan.good_length
        assert (scan.torn_bytes == 0) == (cut in boundaries)


def test_checksum_error_in_last_record_is_torn_but_in_middle_is_corrupt():
    records = [encode_record(r) for r in SAMPLE]
    last = bytearray(records[-1])
    last[-1] ^= 0x01
    scan = decode_journal(b"".join(records[:-1]) + bytes(last))
    assert len(scan.records) == len(SAMPLE) - 1
    assert scan.torn_bytes == len(last)
    middle = bytearray(records[2])
    middle[-1] ^= 0x01
    with pytest.raises(JournalCorrupt, match="checksum"):
        decode_journal(b"".join(records[:2]) + bytes(middle) + b"".join(records[3:]))


def test_every_single_bit_flip_is_detected():
    data = bytearray(b"".join(encode_record(r) for r in SAMPLE))
    for index in range(len(data)):
        for bit in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[index] ^= bit
            try:
                scan = decode_journal(bytes(flipped))
            except JournalCorrupt:
                continue
            # Only a damaged last record may be tolerated, and then it is dropped.
            assert scan.records != tuple(SAMPLE)
            assert list(scan.records) == SAMPLE[: len(scan.records)]


@pytest.mark.parametrize("length", [0, MAX_RECORD_BYTES + 1, 2**32 - 1])
def test_impossible_length_is_corruption(length):
    with pytest.raises(JournalCorrupt, match="length"):
        decode_journal(encode_record(SAMPLE[0]) + struct.pack(">II", length, 0) + b"x" * 10)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xff",
        cbor2.dumps([1, 2]),
        cbor2.dumps({"kind": "nope"}),
        cbor2.dumps({"kind": 3}),
        cbor2.dumps({"kind": "launched"}),
        cbor2.dumps({"kind": "launched", "invocation_id": "ab", "extra": 1}),
        cbor2.dumps({"kind": "launched", "invocation_id": "AB"}),
        cbor2.dumps({"kind": "launched", "invocation_id": 7}),
        cbor2.dumps({"kind": "debit", "invocation_id": "ab", "repo": "o/r", "bits": -1}),
        cbor2.dumps({"kind": "debit", "invocation_id": "ab", "repo": "o/r", "bits": True}),
        cbor2.dumps(
            {"kind": "outcome", "invocation_id": "ab", "result": "maybe", "category": None}
        ),
        cbor2.dumps(
            {
                "kind": "admitted",
                "invocation_id": "ab",
                "repo": "o/r",
                "charge": 4,
                "rejection": "x",
            }
        ),
        cbor2.dumps(
            {
                "kind": "admitted",
                "invocation_id": "ab",
                "repo": None,
                "charge": None,
                "rejection": None,
            }
        ),
        cbor2.dumps({"kind": "header", "run_id": RUN, "version": 2}),
        b"\x9f" * 2000,  # deeply nested indefinite arrays
    ],
)
def test_bad_payloads_raise_only_journal_corrupt(payload):
    with pytest.raises(JournalCorrupt):
        decode_payload(payload)
    if payload:
        with pytest.raises(JournalCorrupt):
            decode_journal(_frame(payload) + encode_record(SAMPLE[0]))


def test_garbage_never_raises_anything_but_journal_corrupt():
    import random

    rng = random.Random(1234)
    good = b"".join(encode_record(r) for r in SAMPLE)
    for _ in range(3000):
        blob = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        with contextlib.suppress(JournalCorrupt):
            decode_journal(bytes(blob[: rng.randrange(len(blob) + 1)]))


def test_file_creates_header_appends_and_replays(tmp_path: Path):
    path = tmp_path / "state" / "journal"
    journal = JournalFile.open(path, RUN)
    assert journal.replayed == ()
    journal.append(SAMPLE[1:3])
    journal.close()
    again = JournalFile.open(path, RUN)
    assert again.replayed == (Header(RUN), *SAMPLE[1:3])
    assert again.torn_bytes == 0
    again.close()
    assert (path.stat().st_mode & 0o777) == 0o600


def test_file_truncates_torn_tail_then_appends_cleanly(tmp_path: Path):
    path = tmp_path / "journal"
    journal = JournalFile.open(path, RUN)
    journal.append([SAMPLE[1]])
    journal.close()
    with path.open("ab") as handle:
        handle.write(encode_record(SAMPLE[2])[:-3])
    reopened = JournalFile.open(path, RUN)
    assert reopened.torn_bytes == len(encode_record(SAMPLE[2])) - 3
    assert reopened.replayed == (Header(RUN), SAMPLE[1])
    reopened.append([SAMPLE[2]])
    reopened.close()
    final = JournalFile.open(path, RUN)
    assert final.replayed == (Header(RUN), SAMPLE[1], SAMPLE[2])
    assert final.torn_bytes == 0
    final.close()


def test_file_refuses_other_run_and_missing_header(tmp_path: Path):
    path = tmp_path / "journal"
    JournalFile.open(path, RUN).close()
    with pytest.raises(JournalCorrupt, match="another run"):
        JournalFile.open(path, "cd" * 8)
    other = tmp_path / "j2"
    other.write_bytes(encode_record(SAMPLE[1]))
    with pytest.raises(JournalCorrupt, match="header"):
        JournalFile.open(other, RUN)
    third = tmp_path / "j3"
    third.write_bytes(encode_record(SAMPLE[0]) + encode_record(SAMPLE[0]))
    with pytest.raises(JournalCorrupt, match="second header"):
        JournalFile.open(third, RUN)


def test_file_refuses_symlink(tmp_path: Path):
    target = tmp_path / "target"
    target.write_bytes(b"")
    link = tmp_path / "journal"
    link.symlink_to(target)
    with pytest.raises(OSError, match=r"Too many levels|symbolic"):
        JournalFile.open(link, RUN)


def test_unsynced_append_is_replayed(tmp_path: Path):
    path = tmp_path / "journal"
    journal = JournalFile.open(path, RUN)
    journal.append([SAMPLE[1], SAMPLE[2], SAMPLE[3]])
    journal.append([SAMPLE[4]], sync=False)
    journal.close()
    again = JournalFile.open(path, RUN)
    assert again.replayed == (Header(RUN), *SAMPLE[1:5])
    again.close()


@contextlib.contextmanager
def _small_tmpfs(path: Path, size: str):
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    if subprocess.run(mount, check=False).returncode:
        pytest.skip("this machine does not allow tmpfs mounts")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_disk_full_mid_record_leaves_no_torn_record_behind(tmp_path: Path):
    """ENOSPC in the middle of a record: rolled back, so later appends stay replayable."""
    import os

    with _small_tmpfs(tmp_path / "fs", "64k") as fs:
        path = fs / "journal"
        journal = JournalFile.open(path, RUN)
        try:
            # Fill the file system up to the last byte.
            filler = fs / "filler"
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for size in (4096, 1):
                    with contextlib.suppress(OSError):
                        while os.write(fd, b"\0" * size):
                            pass
            finally:
                os.close(fd)
            # Journal appends use up what the journal file's last page still
            # holds, until one fails part-way through its records.
            batch: list[Record] = [
                Admitted(INV, repo="octo/internal", charge=5),
                Debit(INV, "octo/internal", 5),
            ]
            sizes = []
            with pytest.raises(OSError, match="No space left"):  # noqa: PT012 - loop until full
                for _ in range(4096):
                    sizes.append(path.stat().st_size)
                    journal.append(batch, sync=False)
            assert path.stat().st_size == sizes[-1]  # the partial batch was rolled back
            os.unlink(filler)  # space comes back
            journal.append([Admitted("ff" * 16, rejection="later")])
        finally:
            journal.close()
        replay = JournalFile.open(path, RUN)
        try:
            assert replay.torn_bytes == 0
            assert replay.replayed[-1] == Admitted("ff" * 16, rejection="later")
        finally:
            replay.close()
