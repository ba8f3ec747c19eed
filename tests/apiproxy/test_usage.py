"""Usage records (codec, bounds) and the token meter over every provider's stream shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.apiproxy import (
    USAGE_SCHEMA,
    UsageError,
    UsageMeter,
    UsageRecord,
    decode_record,
    encode_record,
)
from bounded_query.broker.apiproxy._limits import MAX_USAGE_LINE_BYTES
from bounded_query.broker.apiproxy._usage import MAX_METERED_EVENT_BYTES
from bounded_query.broker.apiproxy.usagelog import UsageLog
from tests.apiproxy.fake_upstream import anthropic_events


def _record(**overrides) -> UsageRecord:
    fields: dict[str, Any] = {
        "timestamp": "2026-12-01T20:00:00.000Z",
        "invocation": "a" * 32,
        "engine": "claude",
        "route": "anthropic-messages",
        "status": 200,
        "category": "forwarded",
        "request_bytes": 10,
        "response_bytes": 20,
        "input_tokens": 3,
        "output_tokens": 4,
        "clamped": True,
        "tools_stripped": 1,
    }
    fields.update(overrides)
    return UsageRecord(**fields)


_counts = st.integers(0, 2**40)


@given(
    invocation=st.none() | st.text("0123456789abcdef", min_size=16, max_size=64),
    status=st.integers(100, 599),
    request_bytes=_counts,
    response_bytes=_counts,
    tokens=st.tuples(st.none() | _counts, st.none() | _counts),
    clamped=st.booleans(),
)
def test_records_round_trip(invocation, status, request_bytes, response_bytes, tokens, clamped):
    record = _record(
        invocation=invocation,
        status=status,
        request_bytes=request_bytes,
        response_bytes=response_bytes,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        clamped=clamped,
    )
    line = encode_record(record)
    assert line.endswith(b"\n")
    assert len(line) <= MAX_USAGE_LINE_BYTES
    assert json.loads(line)["_schema"] == USAGE_SCHEMA
    assert decode_record(line) == record


@pytest.mark.parametrize(
    "overrides",
    [
        {"status": 99},
        {"status": True},
        {"request_bytes": -1},
        {"input_tokens": 1.5},
        {"clamped": 1},
        {"category": ""},
        {"category": "x" * 41},
        {"invocation": "é" * 32},
        {"engine": ""},
    ],
)
def test_records_refuse_values_out_of_their_domain(overrides):
    with pytest.raises(UsageError):
        _record(**overrides)


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[]",
        b'{"_schema":"other/v1"}',
        encode_record(_record()).replace(b'"clamped":true', b'"clamped":true,"body":"x"'),
        encode_record(_record()).replace(USAGE_SCHEMA.encode(), b"bounded-query-audit/v1"),
    ],
)
def test_decode_refuses_anything_but_a_record(line):
    with pytest.raises(UsageError):
        decode_record(line)


def _meter(content_type: bytes, pieces: list[bytes]) -> tuple:
    meter = UsageMeter(content_type)
    for piece in pieces:
        meter.feed(piece)
    meter.finish()
    return meter.input_tokens, meter.output_tokens


def test_the_meter_reads_an_anthropic_stream_split_anywhere():
    stream = b"".join(anthropic_events(input_tokens=1234, output_tokens=56))
    assert _meter(b"text/event-stream", [stream]) == (1234, 56)
    for cut in range(0, len(stream), 7):
        assert _meter(b"text/event-stream", [stream[:cut], stream[cut:]]) == (1234, 56)
    one_byte_at_a_time = [stream[i : i + 1] for i in range(len(stream))]
    assert _meter(b"text/event-stream; charset=utf-8", one_byte_at_a_time) == (1234, 56)


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        (
            b"application/json",
            b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}',
            (9, 2),
        ),
        (
            b"text/event-stream",
            b'event: response.completed\ndata: {"type":"response.completed","response":'
            b'{"usage":{"input_tokens":5,"output_tokens":6}}}\n\n',
            (5, 6),
        ),
        (
            b"text/event-stream",
            b'data: {"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":2}}\r\n\r\n'
            b'data: {"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":8}}\r\n\r\n',
            (1, 8),
        ),
        (b"text/event-stream", b'data: {"usage":{"output_tokens":-3}}\n\n', (None, None)),
        (b"text/event-stream", b"data: [DONE]\n\ndata: {not json\n\n", (None, None)),
        (b"application/json", b'{"usage":{"input_tokens":true}}', (None, None)),
        (b"text/event-stream", b'data: {"usage":{"input_tokens":4}}', (4, None)),
    ],
)
def test_the_meter_reads_each_provider_shape(content_type, body, expected):
    assert _meter(content_type, [body]) == expected


def test_the_meter_skips_an_event_larger_than_its_bound():
    huge = b'data: {"pad":"' + b"x" * (MAX_METERED_EVENT_BYTES + 10) + b'"}\n'
    after = b'data: {"usage":{"input_tokens":1,"output_tokens":2}}\n'
    pieces = [huge[i : i + 4096] for i in range(0, len(huge), 4096)] + [after]
    assert _meter(b"text/event-stream", pieces) == (1, 2)
    big_json = b'{"usage":{"input_tokens":1},"pad":"' + b"x" * MAX_METERED_EVENT_BYTES + b'"}'
    assert _meter(b"application/json", [big_json]) == (None, None)


def test_the_usage_file_is_capped_with_one_marker(tmp_path):
    path = tmp_path / "usage" / "usage.jsonl"
    log = UsageLog(path, max_bytes=4 * MAX_USAGE_LINE_BYTES)
    for _ in range(50):
        log.write(_record())
    log.close()
    lines = path.read_bytes().splitlines()
    assert json.loads(lines[-1])["category"] == "usage-truncated"
    assert [decode_record(line) for line in lines[:-1]] == [_record()] * (len(lines) - 1)
    assert path.stat().st_size <= 4 * MAX_USAGE_LINE_BYTES
    assert log.dropped == 50 - (len(lines) - 1)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert (path.parent.stat().st_mode & 0o777) == 0o700


def test_the_usage_file_is_never_followed_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / "usage.jsonl").symlink_to(target)
    with pytest.raises(OSError, match="symbolic"):
        UsageLog(tmp_path / "usage" / "usage.jsonl")
