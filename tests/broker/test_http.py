"""HTTP transport unit tests (broker/http.py) over in-memory streams, MockClock."""

from __future__ import annotations

import contextlib

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from bounded_query.broker.http import (
    CONTINUE_BYTES,
    MAX_HEADER_BYTES,
    HttpReject,
    HttpRequest,
    check_raw_head,
    read_request,
    response_bytes,
)
from tests.broker.helpers import request_bytes

MAX_BODY = 65536


async def _serve_bytes(chunks: list[bytes], *, gap: float = 0.0, close: bool = True):
    """Feed ``chunks`` (with ``gap`` seconds between them) to read_request."""
    client, server = trio.testing.memory_stream_pair()
    sent_back = bytearray()
    result: dict[str, object] = {}

    async def feed() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await _feed()

    async def _feed() -> None:
        for chunk in chunks:
            await client.send_all(chunk)
            if gap:
                await trio.sleep(gap)
        if close:
            await client.send_eof()

    async def drain() -> None:
        while True:
            data = await client.receive_some(1024)
            if not data:
                return
            sent_back.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        nursery.start_soon(drain)
        try:
            result["request"] = await read_request(server, max_body=MAX_BODY)
        except HttpReject as exc:
            result["reject"] = exc.reason
        await server.aclose()
        nursery.cancel_scope.cancel()
    return result, bytes(sent_back)


def _one_byte_at_a_time(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


@pytest.mark.parametrize("split", ["whole", "bytewise"])
async def test_reads_a_request_whole_or_bytewise(split):
    raw = request_bytes("write true")
    chunks = [raw] if split == "whole" else _one_byte_at_a_time(raw)
    result, _ = await _serve_bytes(chunks)
    request = result["request"]
    assert request.method == b"POST"
    assert request.target == b"/query"
    assert request.http_version == b"1.1"
    assert request.body == b"write true"
    names = [name for name, _ in request.headers]
    assert b"X-AWF-Repo" in names  # names as received, matched case-insensitively later


async def test_header_block_cap():
    pad = b"X-Pad: " + b"a" * (MAX_HEADER_BYTES + 10) + b"\r\n"
    raw = request_bytes("write true").replace(b"Accept:", pad + b"Accept:", 1)
    whole, _ = await _serve_bytes([raw])
    assert whole == {"reject": "http-header-too-large"}
    bytewise, _ = await _serve_bytes([raw[i : i + 1000] for i in range(0, len(raw), 1000)])
    # Depending on how the bytes coalesce, h11's incomplete-head cap or our
    # complete-head measurement fires first; both are a rejection.
    assert bytewise["reject"] in {"http-malformed", "http-header-too-large"}


async def test_header_block_just_under_cap_is_fine():
    base = request_bytes("x")
    head_len = base.index(b"\r\n\r\n") + 4
    pad_len = MAX_HEADER_BYTES - head_len - len(b"X-Pad: \r\n") - 1
    raw = base.replace(b"Accept:", b"X-Pad: " + b"a" * pad_len + b"\r\nAccept:", 1)
    result, _ = await _serve_bytes([raw])
    assert "request" in result


async def test_oversize_content_length_rejected_before_body():
    raw = request_bytes("x").replace(b"Content-Length: 1", b"Content-Length: 65537")
    result, _ = await _serve_bytes([raw], close=False)
    assert result == {"reject": "http-body-too-large"}


async def test_body_at_cap_is_read():
    result, _ = await _serve_bytes([request_bytes("x" * MAX_BODY)])
    assert len(result["request"].body) == MAX_BODY


async def test_expect_continue_is_answered():
    raw = request_bytes("write true", extra=[("Expect", "100-continue")])
    head, body = raw.split(b"\r\n\r\n", 1)
    result, sent = await _serve_bytes([head + b"\r\n\r\n", body])
    assert sent == CONTINUE_BYTES
    assert result["request"].body == b"write true"


async def test_chunked_is_refused():
    raw = (
        b"POST /query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    )
    result, _ = await _serve_bytes([raw])
    assert result == {"reject": "http-chunked-body"}


async def test_truncated_body():
    raw = request_bytes("write true").replace(b"Content-Length: 10", b"Content-Length: 20")
    result, _ = await _serve_bytes([raw])
    assert result == {"reject": "http-truncated-body"}


async def test_eof_before_anything():
    result, _ = await _serve_bytes([])
    assert result == {"reject": "http-no-request"}


async def test_slowloris_head_hits_the_header_deadline(autojump_clock):
    raw = request_bytes("write true")
    start = trio.current_time()
    result, _ = await _serve_bytes(_one_byte_at_a_time(raw), gap=1.0, close=False)
    assert result == {"reject": "http-header-timeout"}
    assert trio.current_time() - start == pytest.approx(5.0, abs=1.01)


async def test_slow_body_hits_the_body_deadline(autojump_clock):
    raw = request_bytes("x" * 100)
    head, body = raw.split(b"\r\n\r\n", 1)
    result, _ = await _serve_bytes(
        [head + b"\r\n\r\n", *_one_byte_at_a_time(body)], gap=0.1, close=False
    )
    assert result == {"reject": "http-body-timeout"}


async def test_silent_client_times_out(autojump_clock):
    result, _ = await _serve_bytes([], close=False)
    assert result == {"reject": "http-header-timeout"}


async def test_fast_enough_trickle_is_accepted(autojump_clock):
    raw = request_bytes("write true")
    chunks = [raw[i : i + 40] for i in range(0, len(raw), 40)]
    result, _ = await _serve_bytes(chunks, gap=0.5)
    assert result["request"].body == b"write true"


def test_response_layout_is_fixed():
    assert response_bytes(b'{"status":"error"}') == (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 18\r\n"
        b"connection: close\r\n\r\n"
        b'{"status":"error"}'
    )


# -- raw-head checks (review): measured as received, smuggling shapes refused --


async def test_whitespace_padding_counts_toward_the_header_cap():
    # h11 trims optional whitespace around values and measures only
    # incomplete heads: a padded head arriving in one read must still count.
    pad = b"X-Pad: a" + b" " * MAX_HEADER_BYTES + b"b\r\n"
    raw = request_bytes("write true").replace(b"Accept:", pad + b"Accept:", 1)
    assert len(raw) < 16 * 1024  # one receive call
    whole, _ = await _serve_bytes([raw])
    assert whole == {"reject": "http-header-too-large"}
    padded_value_only = b"X-Pad: " + b"\t" * MAX_HEADER_BYTES + b"c\r\n"
    raw = request_bytes("write true").replace(b"Accept:", padded_value_only + b"Accept:", 1)
    whole, _ = await _serve_bytes([raw])
    assert whole == {"reject": "http-header-too-large"}


def _request_with_head_of(size: int) -> bytes:
    """A valid one-byte-body request whose head is exactly ``size`` bytes."""
    base = request_bytes("x")
    head_len = base.index(b"\r\n\r\n") + 4
    pad_len = size - head_len - len(b"X-Pad: \r\n")
    raw = base.replace(b"Accept:", b"X-Pad: " + b"a" * pad_len + b"\r\nAccept:", 1)
    assert raw.index(b"\r\n\r\n") + 4 == size
    return raw


async def test_head_one_byte_over_the_cap_is_refused_exactly():
    result, _ = await _serve_bytes([_request_with_head_of(MAX_HEADER_BYTES)])
    assert "request" in result
    result, _ = await _serve_bytes([_request_with_head_of(MAX_HEADER_BYTES + 1)])
    assert result == {"reject": "http-header-too-large"}


@pytest.mark.parametrize("fold", [b"\r\n ", b"\r\n\t"])
async def test_obsolete_line_folding_is_refused(fold):
    raw = request_bytes("write true").replace(b"X-AWF-Repo: octo/", b"X-AWF-Repo: octo/" + fold)
    for chunks in ([raw], _one_byte_at_a_time(raw)):
        result, _ = await _serve_bytes(chunks)
        assert result == {"reject": "http-obs-fold"}


@pytest.mark.parametrize("second", [b"Content-Length: 1", b"content-length:1"])
async def test_repeated_content_length_is_refused_even_when_equal(second):
    first = b"Content-Length: 1\r\n"
    raw = request_bytes("x").replace(first, first + second + b"\r\n")
    result, _ = await _serve_bytes([raw])
    assert result == {"reject": "http-duplicate-content-length"}


async def test_pipelined_bytes_are_not_counted_in_the_head():
    at_cap = _request_with_head_of(MAX_HEADER_BYTES)
    result, _ = await _serve_bytes([at_cap + request_bytes("x")])
    request = result["request"]
    assert request.body == b"x"


# -- nothing but our own error (STYLE.md 10) -----------------------------------

_HEAD_PIECES = st.sampled_from(
    [
        b"POST /query HTTP/1.1\r\n",
        b"Host: x\r\n",
        b"Content-Length: 1\r\n",
        b"Content-Length: 99999999\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Expect: 100-continue\r\n",
        b"X-AWF-Repo: octo/public\r\n",
        b" folded\r\n",
        b"\r\n",
        b"\n",
        b"x",
        b"\x00",
        b":",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_HEAD_PIECES | st.binary(max_size=40), max_size=30), st.booleans())
def test_any_bytes_give_a_request_or_our_reject(pieces, bytewise):
    raw = b"".join(pieces)
    chunks = _one_byte_at_a_time(raw) if bytewise else [raw]

    async def main() -> dict[str, object]:
        result, _ = await _serve_bytes(chunks)
        return result

    result = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert set(result) <= {"request", "reject"}
    if "reject" in result:
        assert isinstance(result["reject"], str)
    else:
        assert isinstance(result["request"], HttpRequest)
        assert len(result["request"].body) <= MAX_BODY


@given(st.binary(max_size=MAX_HEADER_BYTES + 100))
def test_check_raw_head_never_raises(head):
    assert check_raw_head(head) in {
        None,
        "http-header-too-large",
        "http-obs-fold",
        "http-duplicate-content-length",
    }


class _LateStream:
    """Returns its first chunk only after the whole head budget, where no checkpoint sees it."""

    def __init__(self, first: bytes, late_s: float) -> None:
        self.first, self.late_s = first, late_s

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.first:
            with trio.CancelScope(shield=True):
                await trio.sleep(self.late_s)
            first, self.first = self.first, b""
            return first
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()


async def test_deadline_overshoot_is_a_timeout_not_a_bug(autojump_clock):
    """A receive that returns past the head budget spends it: the next wait is a timeout."""
    stream = _LateStream(b"POST /query HTTP/1.1\r\n", late_s=1.5)
    with pytest.raises(HttpReject) as caught:
        await read_request(stream, max_body=MAX_BODY, header_timeout_s=1.0)  # type: ignore[arg-type]
    assert caught.value.reason == "http-header-timeout"
