"""Shared pieces of the API-proxy tests: configs, a control client, raw HTTP, a running proxy."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import h11
import trio

from bounded_query.broker.apiproxy import ProxyConfig, parse_config
from bounded_query.broker.apiproxy.server import ApiProxy
from bounded_query.broker.apiproxy.usagelog import UsageLog
from bounded_query.broker.protocol.policy import ENCLAVE_API_PROXY_ALIAS
from tests.apiproxy.fake_upstream import FakeUpstream

MODEL = "claude-test-model"
CREDENTIAL = b"sk-REAL-provider-credential-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def config_doc(tmp: Path, upstream_url: str, port: int, **overrides: object) -> dict:
    doc: dict = {
        "version": 1,
        "engine": "claude",
        "model": MODEL,
        "maxModelRequests": 3,
        "maxModelTokens": 1024,
        "listen": {"host": "127.0.0.1", "port": port},
        "clientHosts": [f"127.0.0.1:{port}", f"{ENCLAVE_API_PROXY_ALIAS}:{port}"],
        "controlSocket": str(tmp / "control" / "control.sock"),
        "upstream": {"url": upstream_url, "allowInsecure": True},
        "usageDir": str(tmp / "usage"),
        "responseTimeout": 30,
    }
    doc.update(overrides)
    return doc


def new_invocation() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_urlsafe(32)


def anthropic_body(**fields: object) -> bytes:
    doc: dict = {
        "model": MODEL,
        "max_tokens": 512,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
        ],
    }
    doc.update(fields)
    return json.dumps(doc).encode()


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes, read until the server closes; the whole response."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    with trio.fail_after(10):
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(data)
        while True:
            try:
                part = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not part:
                break
            received += part
    await stream.aclose()
    return bytes(received)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def request_bytes(
    port: int,
    placeholder: str | None,
    body: bytes,
    *,
    target: bytes = b"/v1/messages?beta=true",
    method: bytes = b"POST",
    extra: list[tuple[bytes, bytes]] | None = None,
    host: bytes | None = None,
) -> bytes:
    headers = [(b"host", host if host is not None else f"127.0.0.1:{port}".encode())]
    if placeholder is not None:
        headers.append((b"x-api-key", placeholder.encode()))
    headers += [
        (b"anthropic-version", b"2023-06-01"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += extra or []
    head = method + b" " + target + b" HTTP/1.1\r\n"
    head += b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    return head + b"\r\n" + body


async def control(path: Path, method: bytes, target: bytes, doc: dict | None = None) -> tuple:
    """One control request over the Unix socket: (status, decoded JSON)."""
    body = b"" if doc is None else json.dumps(doc).encode()
    stream = await trio.open_unix_socket(str(path))
    conn = h11.Connection(h11.CLIENT)
    headers = [("host", "control"), ("content-length", str(len(body)))]
    data = conn.send(h11.Request(method=method, target=target, headers=headers))
    data += conn.send(h11.Data(data=body)) if body else b""
    data += conn.send(h11.EndOfMessage())
    await stream.send_all(data)
    status = 0
    received = bytearray()
    with trio.fail_after(10):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                received += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
    await stream.aclose()
    return status, json.loads(received)


@dataclass
class Running:
    proxy: ApiProxy
    config: ProxyConfig
    upstream: FakeUpstream
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def arm(self) -> tuple[str, str]:
        invocation, placeholder = new_invocation()
        status, doc = await control(
            self.config.control_socket,
            b"POST",
            b"/arm",
            {"invocation": invocation, "placeholder": placeholder},
        )
        assert (status, doc["outcome"]) == (200, "armed")
        return invocation, placeholder

    async def disarm(self, invocation: str) -> dict:
        status, doc = await control(
            self.config.control_socket, b"POST", b"/disarm", {"invocation": invocation}
        )
        return {"status": status, **doc}

    async def post(self, placeholder: str | None, body: bytes | None = None) -> bytes:
        """One Anthropic Messages request as claude sends it; the raw response."""
        body = anthropic_body() if body is None else body
        return await raw_exchange(self.port, request_bytes(self.port, placeholder, body))

    def usage_lines(self) -> list[bytes]:
        return self.config.usage_path.read_bytes().splitlines()


@contextlib.asynccontextmanager
async def running_proxy(
    tmp: Path, upstream: FakeUpstream | str | None = None, **overrides: object
) -> AsyncIterator[Running]:
    """A proxy in front of ``upstream`` (a fake, started here, or a URL: nothing there)."""
    url = upstream if isinstance(upstream, str) else None
    fake = FakeUpstream() if upstream is None or url is not None else upstream
    assert isinstance(fake, FakeUpstream)
    async with trio.open_nursery() as nursery:
        if url is None:
            await nursery.start(fake.serve)
            url = fake.url
        upstream = fake
        port = free_port()
        config = parse_config(config_doc(tmp, url, port, **overrides))
        usage = UsageLog(config.usage_path)
        proxy = ApiProxy(config, CREDENTIAL, usage)
        bound = await nursery.start(proxy.serve)
        try:
            yield Running(proxy, config, upstream, bound)
        finally:
            proxy.stop()
            upstream.release.set()
            nursery.cancel_scope.cancel()
            usage.close()
