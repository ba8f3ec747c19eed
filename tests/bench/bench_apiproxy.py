"""API-proxy overhead per request (bounded agents, spec 15.6). Prints a table; asserts nothing.

    python tests/bench/bench_apiproxy.py [--quick]

Rows: one model request sent directly to the scripted fake provider on
loopback, and the same request through the armed proxy (strict parse,
checks, clamp, re-serialization, a fresh upstream connection per
invocation, chunked relay, the usage record). Two responses: a small JSON
body (OpenAI shape, ~200 B) and an Anthropic SSE stream of 200 text
deltas (~28 KiB in 206 chunks). Each client request is one new TCP
connection, as an engine behind the proxy makes them. Then ``decide`` alone on
request bodies of a real claude turn's size (15 KiB) and of a long
conversation (1 MiB), and ``hmac.compare_digest`` on a wrong placeholder
differing in the first or the last byte (it must not tell them apart).
"""

from __future__ import annotations

import hmac
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bounded_query.broker.apiproxy import Armed, RequestHead, decide, parse_config
from tests.apiproxy.fake_upstream import FakeUpstream, anthropic_events
from tests.apiproxy.helpers import (
    CREDENTIAL,
    MODEL,
    anthropic_body,
    config_doc,
    raw_exchange,
    request_bytes,
    running_proxy,
)


def _stream_script(_recorded: object) -> list[bytes]:
    events = anthropic_events(text="x")
    delta = events[2]
    return events[:2] + [delta.replace(b'"x"', b'"' + b"token " * 16 + b'"')] * 200 + events[3:]


def _direct(port: int, body: bytes) -> bytes:
    request = request_bytes(port, None, body, extra=[(b"connection", b"close")])
    return request.replace(f"host: 127.0.0.1:{port}".encode(), b"host: upstream", 1)


async def _median_p90(n: int, fn) -> tuple[float, float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        response = await fn()
        times.append(time.perf_counter() - start)
        assert response.startswith(b"HTTP/1.1 200"), response[:100]
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1]


async def _overhead(n: int) -> list[tuple[str, float, float]]:
    rows = []
    body = anthropic_body()
    for label, upstream in (
        ("small JSON", FakeUpstream(mode="json")),
        ("SSE, 200 deltas", FakeUpstream(mode="scripted", script=_stream_script)),
    ):
        with tempfile.TemporaryDirectory(prefix="bq-bench-apiproxy-") as tmp:
            async with running_proxy(Path(tmp), upstream, maxModelRequests=64) as run:
                port = upstream.port
                direct = await _median_p90(
                    n, lambda port=port: raw_exchange(port, _direct(port, body))
                )
                state = {"used": 64, "placeholder": "", "invocation": ""}

                async def proxied(state=state, run=run) -> bytes:
                    if state["used"] == 64:
                        if state["invocation"]:
                            await run.disarm(state["invocation"])
                        state["invocation"], state["placeholder"] = await run.arm()
                        state["used"] = 0
                    state["used"] += 1
                    return await raw_exchange(
                        run.port, request_bytes(run.port, state["placeholder"], body)
                    )

                through = await _median_p90(n, proxied)
        rows.append((f"{label}: direct", *direct))
        rows.append((f"{label}: through the proxy", *through))
        rows.append((f"{label}: overhead", through[0] - direct[0], through[1] - direct[1]))
    return rows


def _decide_cost(size: int, repeat: int) -> float:
    config = parse_config(config_doc(Path("/tmp/none"), "https://api.example.com", 8080))
    placeholder = "P" * 43
    text = "y" * 1000
    messages = [{"role": "user", "content": text}] * max(1, size // 1040)
    body = json.dumps({"model": MODEL, "max_tokens": 32000, "messages": messages}).encode()
    head = RequestHead(
        b"POST",
        b"/v1/messages?beta=true",
        b"1.1",
        ((b"host", b"127.0.0.1:8080"), (b"x-api-key", placeholder.encode())),
    )
    state = Armed("a" * 32, placeholder, 0, 8, frozenset())
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        decide(head, body, state, config, CREDENTIAL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _compare_costs(repeat: int) -> tuple[float, float]:
    """Median ns per compare for (first byte differs, last byte differs), batches interleaved."""
    right = b"P" * 43
    wrongs = (b"Q" + right[1:], right[:-1] + b"Q")
    batches: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for which, wrong in enumerate(wrongs):
            start = time.perf_counter_ns()
            for _ in range(2000):
                hmac.compare_digest(wrong, right)
            batches[which].append((time.perf_counter_ns() - start) / 2000)
    return statistics.median(batches[0]), statistics.median(batches[1])


def main() -> None:
    quick = "--quick" in sys.argv
    n = 40 if quick else 300
    rows = trio.run(_overhead, n)
    print(f"API proxy, one request per connection, n={n} each (ms)")
    print(f"{'case':<38} {'median':>8} {'p90':>8}")
    for label, median, p90 in rows:
        print(f"{label:<38} {median * 1e3:8.2f} {p90 * 1e3:8.2f}")
    print()
    repeat = 10 if quick else 50
    print(f"{'decide(), pure':<38} {'median ms':>9}")
    for label, size in (("15 KiB body (one claude turn)", 15 * 1024), ("1 MiB body", 1 << 20)):
        print(f"{label:<38} {_decide_cost(size, repeat) * 1e3:9.3f}")
    print()
    print(f"{'compare_digest, wrong placeholder':<38} {'median ns':>9}")
    first, last = _compare_costs(repeat * 4)
    print(f"{'differs in the first byte':<38} {first:9.1f}")
    print(f"{'differs in the last byte':<38} {last:9.1f}")


if __name__ == "__main__":
    main()
