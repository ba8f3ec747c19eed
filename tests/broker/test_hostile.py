"""Hostile clients against a real in-process broker on a Unix socket (issue #3).

Every input gets the canonical error or a closed connection; the broker then
serves a valid request; memory stays bounded under 1,000 simultaneous
connections.
"""

from __future__ import annotations

import base64
import resource
from collections.abc import AsyncIterator

import pytest
import trio

from bounded_query.broker.http import response_bytes
from bounded_query.broker.server import BrokerServer
from tests.broker.helpers import (
    ERROR,
    exchange,
    load,
    make_root,
    read_until_eof,
    request_bytes,
)
from tests.fakes.runner import ScriptedRunner

ERROR_RESPONSE = response_bytes(ERROR)
OK_RESPONSE = response_bytes(b'{"status":"ok","result":true}')
GOOD = request_bytes("write true")
B64 = base64.urlsafe_b64encode(b'{"type":"boolean"}').rstrip(b"=").decode()


def _swap(old: bytes, new: bytes) -> bytes:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


BOOL = b'{"type":"boolean"}'


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _head_and_body(head_lines: list[str], body: bytes = b"write true") -> bytes:
    return ("\r\n".join(head_lines) + "\r\n\r\n").encode() + body


def corpus() -> list[tuple[str, bytes]]:
    cases: list[tuple[str, bytes]] = []
    add = cases.append
    # Request line: methods, targets, versions.
    for method in [
        "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "post", "P0ST",
        "POSTX", "PRI", "BREW", "QUERY", "CONNECT",
    ]:  # fmt: skip
        add((f"method {method}", request_bytes("write true", method=method)))
    for target in [
        "/", "/query/", "/Query", "/QUERY", "/query?x=1", "/query#f", "//query",
        "http://localhost/query", "*", "/%71uery", "/query%00", "/../query", "/query/..",
        "/health", "/ready", "/query;a", "/query ", "query", "/queryx", "/q",
    ]:  # fmt: skip
        add((f"target {target!r}", request_bytes("write true", target=target)))
    for version in [
        "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.2", "HTTP/3", "HTTPS/1.1", "http/1.1",
        "HTTP/1.1x", "HTTP/11", "",
    ]:  # fmt: skip
        add((f"version {version!r}", request_bytes("write true", version=version)))
    # X-AWF-* headers: duplicates, unknowns, bad values.
    for name, value in [
        ("X-AWF-Query-Version", "2"),
        ("X-AWF-Repo", "octo/public"),
        ("X-AWF-Schema-B64", B64),
        ("x-awf-repo", "octo/internal"),
        ("X-AWF-Extra", "1"),
        ("X-AWF-", "1"),
        ("X-AWF-Query-Versions", "2"),
        ("X-AWF-Capability", "abc"),
        ("X-Awf-Debug", "true"),
        ("X-AWF-Sensitivity", "public"),
    ]:
        add((f"extra header {name}", request_bytes("write true", extra=[(name, value)])))
    for value in ["1", "3", "02", "2.0", " 2x", "", "two", "-2", "+2", "2,2", "20"]:
        add(
            (
                f"version header {value!r}",
                _swap(b"X-AWF-Query-Version: 2", f"X-AWF-Query-Version: {value}".encode()),
            )
        )
    for drop in [b"X-AWF-Query-Version: 2\r\n", b"X-AWF-Repo: octo/public\r\n"]:
        add((f"missing {drop[:12]!r}", _swap(drop, b"")))
    add(("missing schema", _swap(f"X-AWF-Schema-B64: {B64}\r\n".encode(), b"")))
    # Schema header encodings.
    padded = base64.urlsafe_b64encode(b'{"type": "boolean"}').decode()
    assert padded.endswith("=")
    std = base64.b64encode(b'{"type":"enum","values":["??>",">>?"]}').decode()
    for label, value in [
        ("padded", padded),
        ("standard alphabet", std),
        ("space inside", B64[:5] + " " + B64[5:]),
        ("tab inside", B64[:5] + "\t" + B64[5:]),
        ("dangling bits", B64[:-1] + "B"),
        ("len%4==1", B64 + "A"),
        ("non-base64", "!!!!"),
        ("empty", ""),
        ("percent", "%7B%7D"),
        ("unicode", "é"),
        ("invalid utf8 in schema", _b64(b'{"type":"const","value":"\xff"}')),
        ("bom", _b64(b'\xef\xbb\xbf{"type":"boolean"}')),
        ("not json", _b64(b"{type:boolean}")),
        ("dup key", _b64(b'{"type":"boolean","type":"boolean"}')),
        ("string schema", _b64(b'{"type":"string"}')),
        ("float bounds", _b64(b'{"type":"integer","minimum":0.0,"maximum":1}')),
        ("oversize", _b64(b'{"type":"const","value":"' + b"a" * 4100 + b'"}')),
        ("nul", _b64(b'{"type":"boolean"}\x00')),
        ("trailing", _b64(b'{"type":"boolean"} x')),
        ("deep", _b64(b'{"type":"array","length":1,"items":' * 8 + BOOL + b"}" * 8)),
    ]:  # fmt: skip
        add(
            (
                f"schema {label}",
                _swap(
                    f"X-AWF-Schema-B64: {B64}".encode(),
                    f"X-AWF-Schema-B64: {value}".encode(),
                ),
            )
        )
    # Repository slugs.
    for repo in [
        "", "octo", "octo/", "/public", "octo/public/x", "octo/../x", "../octo/public",
        "octo/public\n", "octo/ public", "https://github.com/octo/public", "octo/public?x",
        "octo/public#x", "octo/*", "-octo/public", "octo/.", "octo/..", "a" * 40 + "/x",
        "octo/" + "r" * 101, "octo\\public", "octo/public%2e", "OCTO/PUBLIC/", "octo//public",
    ]:  # fmt: skip
        add((f"repo {repo!r}", request_bytes("write true", repo=repo)))
    add(
        (
            "repo latin1",
            _swap(b"X-AWF-Repo: octo/public", "X-AWF-Repo: octo/públic".encode("latin-1")),
        )
    )
    add(("repo utf8", _swap(b"X-AWF-Repo: octo/public", "X-AWF-Repo: octo/públic".encode())))
    # Bodies.
    for label, body in [
        ("empty", b""),
        ("invalid utf8", b"\xff\xfe write"),
        ("lone surrogate", b"\xed\xa0\x80"),
        ("overlong", b"\xc0\xaf"),
        ("truncated utf8", b"write \xe2\x82"),
    ]:
        add((f"body {label}", request_bytes(body)))
    add(("body oversize", request_bytes(b"x" * 65537)))
    add(("body oversize length only", _swap(b"Content-Length: 10", b"Content-Length: 999999999")))
    add(("body truncated", _swap(b"Content-Length: 10", b"Content-Length: 11")))
    add(("content-length negative", _swap(b"Content-Length: 10", b"Content-Length: -1")))
    add(("content-length hex", _swap(b"Content-Length: 10", b"Content-Length: 0xa")))
    add(("content-length plus", _swap(b"Content-Length: 10", b"Content-Length: +10")))
    add(
        (
            "content-length twice differing",
            _swap(b"Content-Length: 10", b"Content-Length: 10\r\nContent-Length: 11"),
        )
    )
    add(
        (
            "content-length huge digits",
            _swap(b"Content-Length: 10", b"Content-Length: " + b"9" * 5000),
        )
    )
    add(("content-length list", _swap(b"Content-Length: 10", b"Content-Length: 10, 11")))
    add(("chunked", _swap(b"Content-Length: 10", b"Transfer-Encoding: chunked") + b"\r\n0\r\n\r\n"))
    add(
        (
            "chunked and length",
            _swap(b"Content-Length: 10", b"Content-Length: 10\r\nTransfer-Encoding: chunked"),
        )
    )
    add(("transfer-encoding gzip", _swap(b"Content-Length: 10", b"Transfer-Encoding: gzip")))
    # Header syntax.
    add(("oversize header", _swap(b"Accept: */*", b"Accept: " + b"a" * 9000)))
    add(
        (
            "many headers",
            _swap(
                b"Accept: */*", b"".join(b"X-H%d: v\r\n" % i for i in range(900)) + b"Accept: */*"
            ),
        )
    )
    add(("nul in header", _swap(b"Accept: */*", b"Accept: a\x00b")))
    add(("obs-fold in repo", _swap(b"X-AWF-Repo: octo/public", b"X-AWF-Repo: octo/\r\n public")))
    add(("space before colon", _swap(b"Accept: */*", b"Accept : */*")))
    add(("no colon", _swap(b"Accept: */*", b"Accept")))
    add(("header name with space", _swap(b"Accept: */*", b"Acc ept: x")))
    add(("cr in value", _swap(b"Accept: */*", b"Accept: a\rb")))
    add(("missing host", _swap(b"Host: localhost\r\n", b"")))
    add(("two hosts", _swap(b"Host: localhost", b"Host: a\r\nHost: b")))
    add(("upgrade h2c", _swap(b"Accept: */*", b"Connection: Upgrade\r\nUpgrade: h2c")))
    add(("expect unknown + bad target", request_bytes("x", target="/q", extra=[("Expect", "1")])))
    add(("leading crlf garbage", b"\r\n\r\n\r\n" + GOOD.replace(b"POST", b"PO ST", 1)))
    add(("bare lf + bad method", GOOD.replace(b"\r\n", b"\n").replace(b"POST", b"GET", 1)))
    add(("request line only", b"POST /query HTTP/1.1\r\n"))
    add(("no line end", b"POST /query HTTP/1.1"))
    add(("only crlf", b"\r\n\r\n"))
    # Raw garbage.
    add(("tls client hello", bytes.fromhex("16030100a5010000a10303") + b"\x00" * 64))
    add(("h2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
    add(("binary noise", bytes(range(256))))
    add(("nul bytes", b"\x00" * 4096))
    add(
        (
            "json body only",
            b'{"privateRepo":"octo/public","schema":{"type":"boolean"},"script":"x"}',
        )
    )
    add(("huge garbage", b"A" * 200_000))
    add(("empty connection", b""))
    # Pipelining: one request per connection; an invalid first request still fails.
    add(("pipelined invalid+valid", request_bytes("x", method="GET") + GOOD))
    add(("pipelined garbage after body", request_bytes("", repo="octo/sealed") + b"GARBAGE" * 100))
    for n in range(2, 12):
        add((f"pipelined x{n} invalid", request_bytes("x", target="/nope") * n))
    # Every truncation of a valid request (the client hangs up early).
    for cut in range(0, len(GOOD) - 1, 6):
        add((f"truncated at {cut}", GOOD[:cut]))
    # Seed-map and budget rejections.
    add(("unknown repo", request_bytes("write true", repo="octo/unknown")))
    add(("sealed repo", request_bytes("write true", repo="octo/sealed")))
    add(
        (
            "sealed const",
            request_bytes("write 1", repo="octo/sealed", schema=b'{"type":"const","value":1}'),
        )
    )
    add(
        (
            "confidential too expensive",
            request_bytes(
                "write 1",
                repo="octo/confidential",
                schema=b'{"type":"integer","minimum":0,"maximum":1000}',
            ),
        )
    )
    return cases


CORPUS = corpus()


def test_corpus_has_at_least_200_cases():
    assert len(CORPUS) >= 200
    assert len({label for label, _ in CORPUS}) == len(CORPUS)


@pytest.fixture
async def hostile_broker(tmp_path) -> AsyncIterator[tuple[BrokerServer, ScriptedRunner]]:
    config, seed_map = load(make_root(tmp_path, max_invocations=10000))
    runner = ScriptedRunner()
    # A shorter head deadline keeps the partial-head clients below quick; the
    # 5 s default is tested with MockClock in test_http.py.
    server = BrokerServer(config, seed_map, runner, connection_cap=64, header_timeout_s=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server, runner
        server.stop()


async def test_every_hostile_request_gets_error_or_close(hostile_broker):
    server, runner = hostile_broker
    sock = server.config.socket_path
    outcomes: dict[str, int] = {"error": 0, "closed": 0}
    wrong = []
    for label, raw in CORPUS:
        response = await exchange(sock, raw)
        if response == b"":
            outcomes["closed"] += 1
        elif response == ERROR_RESPONSE:
            outcomes["error"] += 1
        else:
            wrong.append(label)
        assert server.service is not None
        assert not server.service.broken
    assert wrong == []
    assert runner.calls == []  # nothing hostile ever reached the runner
    assert server.service.accounts.ledger.spent_by_repo() == {}
    assert outcomes["error"] >= len(CORPUS) - 2
    # The broker still serves a valid request.
    assert await exchange(sock, GOOD) == OK_RESPONSE
    assert len(runner.calls) == 1


async def test_hostile_requests_byte_at_a_time(hostile_broker):
    server, _ = hostile_broker
    sock = server.config.socket_path
    for _label, raw in CORPUS[::10]:
        stream = await trio.open_unix_socket(str(sock))
        async with stream:
            try:
                for index in range(min(len(raw), 400)):
                    await stream.send_all(raw[index : index + 1])
                await stream.send_all(raw[400:])
                await stream.send_eof()
            except trio.BrokenResourceError:
                pass
            with trio.fail_after(10):
                data = await read_until_eof(stream)
        assert data in (b"", ERROR_RESPONSE)
    assert await exchange(sock, GOOD) == OK_RESPONSE


def _raise_nofile(minimum: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < minimum:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(minimum, soft)), hard))


async def test_thousand_simultaneous_connections(hostile_broker):
    server, _ = hostile_broker
    sock = str(server.config.socket_path)
    _raise_nofile(4096)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results: list[bytes] = []
    # Half send a valid request, half hold the connection with a partial head.
    streams = []
    for _ in range(1000):
        streams.append(await trio.open_unix_socket(sock))

    async def client(index: int, stream: trio.SocketStream) -> None:
        async with stream:
            with trio.fail_after(30):
                try:
                    if index % 2:
                        await stream.send_all(GOOD)
                    else:
                        await stream.send_all(b"POST /query HTTP/1.1\r\nHost: x\r\n")
                except trio.BrokenResourceError:
                    pass
                results.append(await read_until_eof(stream))

    active_seen: list[int] = []

    async def watch(scope: trio.CancelScope) -> None:
        with scope:
            while True:
                active_seen.append(server.active)
                await trio.sleep(0.001)

    watcher = trio.CancelScope()
    async with trio.open_nursery() as outer:
        outer.start_soon(watch, watcher)
        async with trio.open_nursery() as nursery:
            for index, stream in enumerate(streams):
                nursery.start_soon(client, index, stream)
        watcher.cancel()
    assert len(results) == 1000
    assert set(results) <= {b"", ERROR_RESPONSE, OK_RESPONSE}
    assert max(active_seen) <= 64  # the cap held
    assert server.refused >= 500  # the partial heads kept the slots busy
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\npeak RSS {rss_after / 1024:.1f} MiB (grew {(rss_after - rss_before) / 1024:.1f} MiB)")
    assert rss_after - rss_before < 200 * 1024
    assert await exchange(sock, GOOD) == OK_RESPONSE
    with trio.fail_after(5):
        while server.active:  # noqa: ASYNC110 - the last task finishes after its response
            await trio.sleep(0.01)
