"""The API proxy from the enclave's side: two real ends (a real client, a fake provider).

Every attack is sent as real bytes over TCP to a running proxy in front of a
recording fake upstream (``fake_upstream.py``); each must be refused with a
4xx while the upstream has seen **no** request, and the refusal must be
explained in the usage log (never with the credential or a body).
"""

from __future__ import annotations

import json
import socket

import pytest
import trio

from bounded_query.broker.apiproxy import decode_record
from tests.apiproxy.fake_upstream import FakeUpstream
from tests.apiproxy.helpers import (
    CREDENTIAL,
    MODEL,
    anthropic_body,
    control,
    raw_exchange,
    request_bytes,
    running_proxy,
    status_of,
)


def _last_category(run) -> str:
    return decode_record(run.usage_lines()[-1]).category


async def test_a_valid_request_streams_back_with_the_real_credential_upstream_only(tmp_path):
    async with running_proxy(tmp_path) as run:
        invocation, placeholder = await run.arm()
        response = await raw_exchange(
            run.port, request_bytes(run.port, placeholder, anthropic_body())
        )
        assert status_of(response) == 200
        assert b"transfer-encoding: chunked" in response
        assert b'"text": "hello"' in response
        assert CREDENTIAL not in response
        (seen,) = run.upstream.requests
        assert seen.target == b"/v1/messages?beta=true"
        assert seen.header(b"x-api-key") == [CREDENTIAL]
        assert seen.header(b"host") == [f"127.0.0.1:{run.upstream.port}".encode()]
        assert placeholder.encode() not in b"".join(v for _, v in seen.headers) + seen.body
        assert seen.json()["max_tokens"] == 512
        record = decode_record(run.usage_lines()[-1])
        assert (record.invocation, record.status, record.category) == (invocation, 200, "forwarded")
        assert (record.input_tokens, record.output_tokens) == (12, 7)
        assert record.response_bytes > 0
        assert record.request_bytes == len(seen.body)
        assert CREDENTIAL not in run.config.usage_path.read_bytes()
        assert placeholder.encode() not in run.config.usage_path.read_bytes()


async def test_only_allow_listed_headers_are_forwarded(tmp_path):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        extra = [
            (b"x-stainless-os", b"Linux"),
            (b"authorization", b"Bearer stolen"),
            (b"cookie", b"session=1"),
            (b"connection", b"keep-alive, x-api-key"),
            (b"anthropic-beta", b"tools-2024"),
            (b"user-agent", b"claude-cli/2.1.328"),
        ]
        request = request_bytes(run.port, placeholder, anthropic_body(), extra=extra)
        assert status_of(await raw_exchange(run.port, request)) == 200
        (seen,) = run.upstream.requests
        names = {n.lower() for n, _ in seen.headers}
        assert names <= {
            b"host",
            b"accept",
            b"connection",
            b"user-agent",
            b"anthropic-version",
            b"anthropic-beta",
            b"content-type",
            b"content-length",
            b"accept-encoding",
            b"x-api-key",
        }
        assert seen.header(b"authorization") == []
        assert seen.header(b"cookie") == []
        assert seen.header(b"anthropic-beta") == [b"tools-2024"]
        assert seen.header(b"user-agent") == [b"claude-cli/2.1.328"]
        assert seen.header(b"accept-encoding") == [b"identity"]


#: (name, request builder(port, placeholder) -> bytes, expected status, usage category)
def _attacks():
    body = anthropic_body()

    def plain(**kw):
        return lambda port, ph: request_bytes(port, ph, body, **kw)

    def with_body(b):
        return lambda port, ph: request_bytes(port, ph, b)

    return [
        ("no-placeholder", lambda port, ph: request_bytes(port, None, body), 401, "no-credential"),
        (
            "wrong-placeholder",
            lambda port, ph: request_bytes(
                port, ph[:-1] + ("B" if ph.endswith("A") else "A"), body
            ),
            401,
            "wrong-credential",
        ),
        (
            "placeholder-prefix",
            lambda port, ph: request_bytes(port, ph[:-1], body),
            401,
            "wrong-credential",
        ),
        (
            "the-real-credential",
            lambda port, ph: request_bytes(port, CREDENTIAL.decode(), body),
            401,
            "wrong-credential",
        ),
        ("two-placeholders", plain(extra=[(b"x-api-key", b"other")]), 400, "duplicate-credential"),
        ("other-model", with_body(anthropic_body(model="claude-opus-expensive")), 403, "model"),
        (
            "no-model",
            with_body(json.dumps({"max_tokens": 5, "messages": []}).encode()),
            403,
            "model",
        ),
        ("unlisted-path", plain(target=b"/v1/complete"), 404, "path"),
        ("count-tokens", plain(target=b"/v1/messages/count_tokens?beta=true"), 404, "path"),
        ("control-route-on-tcp", plain(target=b"/arm"), 404, "path"),
        ("dot-segment", plain(target=b"/v1/./messages"), 404, "path"),
        ("dotdot-segment", plain(target=b"/v1/x/../messages"), 404, "path"),
        ("encoded-m", plain(target=b"/v1/%6Dessages"), 404, "path"),
        ("encoded-slash", plain(target=b"/v1%2Fmessages"), 404, "path"),
        ("double-slash", plain(target=b"//v1/messages"), 404, "path"),
        ("trailing-slash", plain(target=b"/v1/messages/"), 404, "path"),
        ("matrix-param", plain(target=b"/v1/messages;x=1"), 404, "path"),
        ("upper-case", plain(target=b"/V1/messages"), 404, "path"),
        ("extra-query", plain(target=b"/v1/messages?beta=true&x=1"), 404, "query"),
        ("other-query", plain(target=b"/v1/messages?beta=false"), 404, "query"),
        ("get", plain(method=b"GET"), 405, "method"),
        ("put", plain(method=b"PUT"), 405, "method"),
        (
            "absolute-form",
            plain(target=b"http://api.anthropic.com/v1/messages"),
            400,
            "target-form",
        ),
        (
            "absolute-form-self",
            lambda port, ph: request_bytes(
                port, ph, body, target=f"http://127.0.0.1:{port}/v1/messages".encode()
            ),
            400,
            "target-form",
        ),
        ("asterisk-form", plain(target=b"*", method=b"OPTIONS"), 400, "target-form"),
        ("connect", plain(method=b"CONNECT", target=b"api.anthropic.com:443"), 400, "target-form"),
        ("host-elsewhere", plain(host=b"api.anthropic.com"), 421, "host"),
        ("host-other-port", plain(host=b"127.0.0.1:1"), 421, "host"),
        ("two-hosts", plain(extra=[(b"host", b"api.anthropic.com")]), 400, "http-malformed"),
        (
            "proxy-authorization",
            plain(extra=[(b"proxy-authorization", b"Basic eDp5")]),
            400,
            "forbidden-header",
        ),
        (
            "x-forwarded-for",
            plain(extra=[(b"x-forwarded-for", b"10.0.0.1")]),
            400,
            "forbidden-header",
        ),
        (
            "x-forwarded-host",
            plain(extra=[(b"X-Forwarded-Host", b"evil")]),
            400,
            "forbidden-header",
        ),
        ("forwarded", plain(extra=[(b"forwarded", b"for=1.2.3.4")]), 400, "forbidden-header"),
        ("via", plain(extra=[(b"via", b"1.1 evil")]), 400, "forbidden-header"),
        (
            "method-override",
            plain(extra=[(b"x-http-method-override", b"DELETE")]),
            400,
            "forbidden-header",
        ),
        ("max-tokens-negative", with_body(anthropic_body(max_tokens=-1)), 400, "max-tokens"),
        ("max-tokens-zero", with_body(anthropic_body(max_tokens=0)), 400, "max-tokens"),
        ("max-tokens-float", with_body(anthropic_body(max_tokens=1.5)), 400, "max-tokens"),
        (
            "max-tokens-float-integral",
            with_body(body.replace(b'"max_tokens": 512', b'"max_tokens": 512.0')),
            400,
            "max-tokens",
        ),
        (
            "max-tokens-exponent",
            with_body(body.replace(b'"max_tokens": 512', b'"max_tokens": 1e3')),
            400,
            "max-tokens",
        ),
        (
            "max-tokens-huge-token",
            with_body(body.replace(b'"max_tokens": 512', b'"max_tokens": 99999999999999999999')),
            400,
            "max-tokens",
        ),
        ("max-tokens-string", with_body(anthropic_body(max_tokens="100")), 400, "max-tokens"),
        ("max-tokens-bool", with_body(anthropic_body(max_tokens=True)), 400, "max-tokens"),
        ("max-tokens-null", with_body(anthropic_body(max_tokens=None)), 400, "max-tokens"),
        (
            "duplicate-keys",
            with_body(body[:-1] + b', "model": "claude-opus-expensive"}'),
            400,
            "json",
        ),
        ("duplicate-max-tokens", with_body(body[:-1] + b', "max_tokens": 999999}'), 400, "json"),
        ("nan", with_body(body.replace(b'"max_tokens": 512', b'"temperature": NaN')), 400, "json"),
        ("invalid-utf8", with_body(body.replace(b'"hi"', b'"\xff"')), 400, "json"),
        ("lone-surrogate", with_body(body.replace(b'"hi"', b'"\\ud800"')), 400, "json"),
        ("trailing-garbage", with_body(body + b"{}"), 400, "json"),
        ("array-body", with_body(b"[]"), 400, "json"),
        (
            "forced-hosted-tool",
            with_body(anthropic_body(tool_choice={"type": "web_search_20250305"})),
            400,
            "tool-choice",
        ),
        ("tools-not-a-list", with_body(anthropic_body(tools={"a": 1})), 400, "tools"),
    ]


@pytest.mark.parametrize(
    ("name", "build", "status", "category"),
    _attacks(),
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_attack_is_refused_and_nothing_reaches_the_upstream(
    tmp_path, name, build, status, category
):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        response = await raw_exchange(run.port, build(run.port, placeholder))
        assert status_of(response) == status, response[:200]
        assert b"refused by the API proxy" in response
        assert CREDENTIAL not in response
        assert run.upstream.requests == []
        assert _last_category(run) == category


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"POST /v1/messages HTTP/1.1\r\nhost: h\r\nx-a: b\rc\r\n\r\n", id="bare-cr"),
        pytest.param(b"POST /v1/messages HTTP/1.1\r\nhost: h\r\nx-a: b\r\n c\r\n\r\n", id="fold"),
        pytest.param(b"POST /v1/messages HTTP/1.1\r\nhost: h\r\nx a: b\r\n\r\n", id="space-name"),
        pytest.param(b"POST /v1/messages HTTP/1.1\r\nhost: h\r\nx-a: \x00\r\n\r\n", id="nul"),
        pytest.param(
            b"POST /v1/messages HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n",
            id="chunked",
        ),
        pytest.param(
            b"POST /v1/messages HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n"
            b"content-length: 2\r\n\r\n{}",
            id="two-lengths",
        ),
        pytest.param(
            b"POST /v1/messages HTTP/1.1\r\nhost: h\r\ncontent-length: 9437184\r\n\r\n",
            id="huge-declared",
        ),
        pytest.param(b"POST /v1/messages HTTP/1.0\r\nhost: h\r\n\r\n", id="http-1.0"),
        pytest.param(b"GARBAGE\r\n\r\n", id="garbage"),
        pytest.param(
            b"POST /v1/messages HTTP/1.1\r\nhost: h\r\nupgrade: h2c\r\n\r\n", id="upgrade"
        ),
    ],
)
async def test_malformed_http_is_refused_before_any_upstream(tmp_path, raw):
    async with running_proxy(tmp_path) as run:
        await run.arm()
        response = await raw_exchange(run.port, raw)
        assert 400 <= status_of(response) <= 499
        assert run.upstream.requests == []


async def test_header_injection_through_a_value_does_not_reach_the_upstream(tmp_path):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        # The anthropic-beta value is forwarded; a CR/LF inside it must never
        # become a second header line upstream (h11 refuses it on the way in).
        request = request_bytes(
            run.port,
            placeholder,
            anthropic_body(),
            extra=[(b"anthropic-beta", b"a\r\nx-api-key: attacker")],
        )
        response = await raw_exchange(run.port, request)
        # The CR LF ends the value: the "injected" line is a second credential header.
        assert status_of(response) == 400
        assert run.upstream.requests == []
        assert _last_category(run) == "duplicate-credential"


async def test_a_placeholder_stops_working_at_disarm_and_never_works_again(tmp_path):
    async with running_proxy(tmp_path) as run:
        first, old = await run.arm()
        assert status_of(await run.post(old)) == 200
        assert (await run.disarm(first))["outcome"] == "disarmed"
        response = await run.post(old)
        assert status_of(response) == 403
        assert _last_category(run) == "disarmed"
        _, new = await run.arm()
        response = await run.post(old)
        assert status_of(response) == 401
        assert _last_category(run) == "wrong-credential"
        assert len(run.upstream.requests) == 1
        assert status_of(await run.post(new)) == 200


async def test_requests_past_max_model_requests_are_refused(tmp_path):
    async with running_proxy(tmp_path) as run:  # maxModelRequests 3
        _, placeholder = await run.arm()
        statuses = []
        for _ in range(5):
            response = await raw_exchange(
                run.port, request_bytes(run.port, placeholder, anthropic_body())
            )
            statuses.append(status_of(response))
        assert statuses == [200, 200, 200, 403, 403]
        assert len(run.upstream.requests) == 3
        assert _last_category(run) == "request-cap"
        status, doc = await control(run.config.control_socket, b"GET", b"/status")
        assert (status, doc["requestsUsed"], doc["armed"]) == (200, 3, True)


async def test_concurrent_requests_are_counted_exactly(tmp_path):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        statuses = []

        async def one():
            response = await raw_exchange(
                run.port, request_bytes(run.port, placeholder, anthropic_body())
            )
            statuses.append(status_of(response))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)
        assert sorted(statuses) == [200] * 3 + [403] * 7
        assert len(run.upstream.requests) == 3


@pytest.mark.parametrize(
    ("sent", "arrives", "clamped"),
    [
        (10**9, 1024, True),
        (1025, 1024, True),
        (1024, 1024, False),
        (1, 1, False),
        (None, 1024, False),
    ],
)
async def test_max_tokens_arrive_clamped(tmp_path, sent, arrives, clamped):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        doc = json.loads(anthropic_body(max_tokens=sent))
        if sent is None:
            del doc["max_tokens"]
        request = request_bytes(run.port, placeholder, json.dumps(doc).encode())
        assert status_of(await raw_exchange(run.port, request)) == 200
        (seen,) = run.upstream.requests
        assert seen.json()["max_tokens"] == arrives
        assert decode_record(run.usage_lines()[-1]).clamped is clamped


async def test_hosted_tools_and_connectors_are_stripped(tmp_path):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        body = anthropic_body(
            tools=[
                {"name": "Bash", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search"},
                {"type": "web_fetch_20250910", "name": "web_fetch"},
                {"type": "custom", "name": "Read", "input_schema": {"type": "object"}},
            ],
            mcp_servers=[{"type": "url", "url": "https://evil.example/mcp", "name": "x"}],
            tool_choice={"type": "auto"},
        )
        assert status_of(await run.post(placeholder, body)) == 200
        (seen,) = run.upstream.requests
        sent = seen.json()
        assert [t["name"] for t in sent["tools"]] == ["Bash", "Read"]
        assert "mcp_servers" not in sent
        assert b"evil.example" not in seen.body
        assert decode_record(run.usage_lines()[-1]).tools_stripped == 3


async def test_an_upstream_redirect_is_not_followed(tmp_path):
    elsewhere = FakeUpstream()
    async with trio.open_nursery() as nursery:
        await nursery.start(elsewhere.serve)
        upstream = FakeUpstream(mode="redirect", redirect_to=f"{elsewhere.url}/v1/messages")
        async with running_proxy(tmp_path, upstream) as run:
            _, placeholder = await run.arm()
            response = await raw_exchange(
                run.port, request_bytes(run.port, placeholder, anthropic_body())
            )
            assert status_of(response) == 502
            assert b"location" not in response.lower()
            assert len(run.upstream.requests) == 1
            assert elsewhere.requests == []
            assert elsewhere.connections == 0
            assert _last_category(run) == "upstream-redirect"
        nursery.cancel_scope.cancel()


async def test_an_upstream_error_never_echoes_the_credential(tmp_path):
    upstream = FakeUpstream(mode="status", status=429)
    async with running_proxy(tmp_path, upstream) as run:
        _, placeholder = await run.arm()
        response = await raw_exchange(
            run.port, request_bytes(run.port, placeholder, anthropic_body())
        )
        assert status_of(response) == 429
        assert b"retry-after: 7" in response
        assert CREDENTIAL not in response
        assert b"x-echo" not in response
        assert b"upstream error" in response
        assert _last_category(run) == "upstream-status"
        assert CREDENTIAL not in run.config.usage_path.read_bytes()


async def test_disarm_cuts_a_stream_in_flight_before_it_answers(tmp_path):
    upstream = FakeUpstream(mode="hold")
    async with running_proxy(tmp_path, upstream) as run:
        invocation, placeholder = await run.arm()
        received = []

        async def client():
            received.append(await run.post(placeholder))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            with trio.fail_after(10):
                await upstream.streaming.wait()
            result = await run.disarm(invocation)
            assert result["outcome"] == "disarmed"
            # When disarm has answered, the exchange is over: the client's
            # stream was cut (no last chunk) and the usage record is written.
        (response,) = received
        assert status_of(response) == 200
        assert not response.endswith(b"0\r\n\r\n")
        assert _last_category(run) == "disarmed-midstream"


async def test_a_runaway_response_is_cut_at_the_bound(tmp_path):
    upstream = FakeUpstream(mode="huge", huge_bytes=5 * 1024 * 1024)
    async with running_proxy(tmp_path, upstream) as run:
        _, placeholder = await run.arm()
        response = await raw_exchange(
            run.port, request_bytes(run.port, placeholder, anthropic_body())
        )
        assert status_of(response) == 200
        assert len(response) < 4 * 1024 * 1024 + 64 * 1024
        assert not response.endswith(b"0\r\n\r\n")
        record = decode_record(run.usage_lines()[-1])
        assert record.category == "response-too-large"
        assert record.response_bytes <= 4 * 1024 * 1024


async def test_nothing_is_forwarded_before_the_first_arm(tmp_path):
    async with running_proxy(tmp_path) as run:
        fake = "A" * 43
        response = await run.post(fake)
        assert status_of(response) == 403
        assert run.upstream.requests == []
        record = decode_record(run.usage_lines()[-1])
        assert (record.invocation, record.category) == (None, "disarmed")


async def test_control_socket_refuses_a_second_arm_and_a_spent_invocation(tmp_path):
    async with running_proxy(tmp_path) as run:
        invocation, placeholder = await run.arm()
        path = run.config.control_socket
        status, doc = await control(
            path, b"POST", b"/arm", {"invocation": "ab" * 16, "placeholder": "B" * 43}
        )
        assert (status, doc["outcome"], doc["invocation"]) == (409, "already-armed", invocation)
        assert placeholder not in json.dumps(doc)
        await run.disarm(invocation)
        status, doc = await control(
            path, b"POST", b"/arm", {"invocation": invocation, "placeholder": "C" * 43}
        )
        assert (status, doc["outcome"], doc["armed"]) == (409, "invocation-spent", False)
        for bad in (
            {"invocation": "xyz", "placeholder": "C" * 43},
            {"invocation": "ab" * 16, "placeholder": "short"},
            {"invocation": "ab" * 16, "placeholder": "C" * 43, "extra": 1},
        ):
            status, doc = await control(path, b"POST", b"/arm", bad)
            assert (status, doc["outcome"]) == (400, "bad-request")
        status, doc = await control(path, b"GET", b"/arm")
        assert status == 400
        status, doc = await control(path, b"GET", b"/status")
        assert (status, doc["armed"]) == (200, False)
        assert (path.stat().st_mode & 0o777) == 0o600
        assert (path.parent.stat().st_mode & 0o777) == 0o700


async def test_openai_chat_route_for_copilot(tmp_path):
    upstream = FakeUpstream(mode="json")
    async with running_proxy(tmp_path, upstream, engine="copilot", model="gpt-test") as run:
        _, placeholder = await run.arm()
        body = json.dumps(
            {
                "model": "gpt-test",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 99999,
                "tools": [
                    {"type": "function", "function": {"name": "bash"}},
                    {"type": "web_search"},
                ],
            }
        ).encode()
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (run.port, placeholder.encode(), len(body))
        )
        response = await raw_exchange(run.port, head + body)
        assert status_of(response) == 200
        assert b'"content": "hi"' in response
        (seen,) = run.upstream.requests
        assert seen.header(b"authorization") == [b"Bearer " + CREDENTIAL]
        sent = seen.json()
        assert sent["max_tokens"] == 1024
        assert sent["max_completion_tokens"] == 1024 if "max_completion_tokens" in sent else True
        assert sent["store"] is False
        assert [t["type"] for t in sent["tools"]] == ["function"]
        record = decode_record(run.usage_lines()[-1])
        assert (record.input_tokens, record.output_tokens, record.clamped) == (21, 3, True)
        # n > 1 would multiply the token bound: refused.
        doc = json.loads(body)
        doc["n"] = 2
        body2 = json.dumps(doc).encode()
        head2 = head.replace(b"content-length: %d" % len(body), b"content-length: %d" % len(body2))
        assert status_of(await raw_exchange(run.port, head2 + body2)) == 400
        assert len(run.upstream.requests) == 1


def test_model_constant_is_what_the_helpers_send():
    assert json.loads(anthropic_body())["model"] == MODEL


async def _drip(port: int, data: bytes) -> bytes:
    """Send ``data`` one byte per write (each a separate TCP segment), read to close."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one byte per segment
    received = bytearray()
    with trio.fail_after(30):
        try:
            for i in range(len(data)):
                await stream.send_all(data[i : i + 1])
        except trio.BrokenResourceError:
            pass
        while part := await stream.receive_some(65536):
            received += part
    await stream.aclose()
    return bytes(received)


async def test_a_request_dripped_one_byte_at_a_time_is_framed_the_same(tmp_path):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        response = await _drip(run.port, request_bytes(run.port, placeholder, anthropic_body()))
        assert status_of(response) == 200
        (seen,) = run.upstream.requests
        assert seen.json()["model"] == MODEL


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 64 + b"\r\n\r\n",
        b"POST /v1/messages HTTP/1.1\r\n" + b"x-a: " + b"b" * 9000 + b"\r\n\r\n",
        b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: h\r\ncontent-length: -1\r\n\r\n",
        b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: h\r\ncontent-length: 1x\r\n\r\n",
        b"\xff\xfe POST / HTTP/1.1\r\n\r\n",
    ],
)
async def test_garbage_whole_or_dripped_gets_a_4xx_and_the_proxy_keeps_serving(tmp_path, garbage):
    async with running_proxy(tmp_path) as run:
        _, placeholder = await run.arm()
        for send in (raw_exchange, _drip):
            response = await send(run.port, garbage)
            assert 400 <= status_of(response) <= 499
        assert run.upstream.requests == []
        assert status_of(await run.post(placeholder)) == 200


async def test_an_unreachable_upstream_is_a_502_and_still_counts(tmp_path):
    from tests.apiproxy.helpers import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    async with running_proxy(tmp_path, upstream=dead) as run:
        _, placeholder = await run.arm()
        response = await run.post(placeholder)
        assert status_of(response) == 502
        assert b"upstream error" in response
        assert _last_category(run) == "upstream-error"
        _, doc = await control(run.config.control_socket, b"GET", b"/status")
        assert doc["requestsUsed"] == 1


async def test_a_silent_upstream_is_a_504_at_the_response_timeout(tmp_path):
    upstream = FakeUpstream(mode="silent")
    async with running_proxy(tmp_path, upstream, responseTimeout=0.5) as run:
        _, placeholder = await run.arm()
        response = await run.post(placeholder)
        assert status_of(response) == 504
        assert _last_category(run) == "upstream-timeout"


async def test_a_stream_past_the_response_timeout_is_cut(tmp_path):
    upstream = FakeUpstream(mode="hold")
    async with running_proxy(tmp_path, upstream, responseTimeout=0.5) as run:
        _, placeholder = await run.arm()
        response = await run.post(placeholder)
        assert status_of(response) == 200
        assert not response.endswith(b"0\r\n\r\n")
        record = decode_record(run.usage_lines()[-1])
        assert (record.status, record.category) == (200, "upstream-timeout")


async def test_connections_past_the_cap_get_a_503_at_once(tmp_path):
    from bounded_query.broker.apiproxy._limits import CONNECTION_CAP

    async with running_proxy(tmp_path) as run:
        idle = [await trio.open_tcp_stream("127.0.0.1", run.port) for _ in range(CONNECTION_CAP)]
        with trio.fail_after(5):
            # Real sockets: poll until the proxy has accepted them all.
            while run.proxy.active < CONNECTION_CAP:  # noqa: ASYNC110
                await trio.sleep(0.01)
        try:
            with trio.fail_after(3):
                response = await raw_exchange(run.port, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert status_of(response) == 503
            assert _last_category(run) == "connection-cap"
        finally:
            for stream in idle:
                await stream.aclose()


async def test_a_control_directory_others_can_enter_stops_the_start(tmp_path):
    import os

    (tmp_path / "control").mkdir(mode=0o755)
    os.chmod(tmp_path / "control", 0o755)
    with pytest.raises(BaseExceptionGroup) as raised:
        async with running_proxy(tmp_path):
            pass
    assert raised.group_contains(OSError, match="0700")


async def test_a_compressed_answer_reaches_the_client_decoded(tmp_path):
    upstream = FakeUpstream(mode="json", gzip=True)
    async with running_proxy(tmp_path, upstream) as run:
        _, placeholder = await run.arm()
        response = await run.post(placeholder)
        assert status_of(response) == 200
        assert b'"content": "hi"' in response
        assert b"content-encoding" not in response.lower()
        record = decode_record(run.usage_lines()[-1])
        assert (record.input_tokens, record.output_tokens) == (21, 3)
