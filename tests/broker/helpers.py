"""Shared builders for broker tests: private roots, configs, raw HTTP clients."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from bounded_query.broker.admission import RawRequest
from bounded_query.broker.config import BrokerConfig, SeedMap, parse_config, parse_seed_map
from bounded_query.broker.protocol import encode_schema_header

RUN_ID = "0123456789abcdef0123"
ERROR = b'{"status":"error"}'
BOOL_SCHEMA = b'{"type":"boolean"}'
REPOS = {
    "octo/public": "public",
    "octo/internal": "internal",
    "octo/confidential": "confidential",
    "octo/sealed": "sealed",
}


def make_root(base: Path, *, max_invocations: int = 100, timeout: int = 30) -> dict[str, object]:
    """Create a private root with seeds and a seed map; return the config document."""
    private = base / "private"
    (private / "seeds").mkdir(parents=True)
    repos = []
    for index, (repo, sensitivity) in enumerate(REPOS.items()):
        seed_id = f"{index + 1:04x}"
        seed = private / "seeds" / seed_id
        seed.mkdir()
        (seed / "README").write_text(repo)
        repos.append(
            {"repo": repo, "seedId": seed_id, "sensitivity": sensitivity, "commit": "a" * 40}
        )
    seed_map = private / "seed-map.json"
    seed_map.write_text(json.dumps({"version": 1, "repos": repos}))
    doc: dict[str, object] = {
        "version": 1,
        "runId": RUN_ID,
        "socketPath": str(base / "run" / "broker.sock"),
        "socketUid": None,
        "socketGid": None,
        "privateRoot": str(private),
        "seedMap": str(seed_map),
        "runtime": "docker",
        "timeout": timeout,
        "memoryLimit": "512m",
        "maxInvocations": max_invocations,
        "image": "bounded-query-python:latest",
        "dockerHost": "unix:///var/run/docker.sock",
        "hostPathMap": {},
    }
    (base / "broker.json").write_text(json.dumps(doc))
    return doc


def load(doc: dict[str, object]) -> tuple[BrokerConfig, SeedMap]:
    config = parse_config(doc)
    seed_map = parse_seed_map(json.loads(config.seed_map_path.read_text()))
    return config, seed_map


_T = TypeVar("_T")


async def run_inline(fn: Callable[..., _T], *args: Any) -> _T:
    """A thread runner without a thread (injected as ``run_sync``; blocks the loop briefly).

    Under MockClock's autojump a worker thread looks like idleness, and the
    clock would jump to the next timer (the overflow watchdog) while the
    journal is being written.
    """
    await trio.lowlevel.checkpoint()
    return fn(*args)


def raw_request(data: bytes) -> RawRequest:
    """Split a request as :func:`request_bytes` frames it into the pipeline's plain values."""
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    method, target, version = lines[0].split(b" ")
    headers = []
    for line in lines[1:]:
        name, value = line.split(b": ", 1)
        headers.append((name.lower(), value))
    return RawRequest(method, target, version.split(b"/")[1], tuple(headers), body)


def request_bytes(
    script: bytes | str,
    *,
    repo: str = "octo/public",
    schema: bytes = BOOL_SCHEMA,
    extra: list[tuple[str, str]] | None = None,
    method: str = "POST",
    target: str = "/query",
    version: str = "HTTP/1.1",
) -> bytes:
    """A request exactly as the reference wrapper (curl) frames it."""
    body = script.encode() if isinstance(script, str) else script
    headers = [
        ("Host", "localhost"),
        ("User-Agent", "curl/7.88.1"),
        ("Accept", "*/*"),
        ("X-AWF-Query-Version", "2"),
        ("X-AWF-Repo", repo),
        ("X-AWF-Schema-B64", encode_schema_header(schema).decode()),
        ("Content-Type", "application/octet-stream"),
        ("Content-Length", str(len(body))),
        *(extra or []),
    ]
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode() + b"\r\n" + body


async def read_until_eof(stream: trio.abc.ReceiveStream) -> bytes:
    """Everything the peer sends until EOF; what arrived before a reset, if reset."""
    chunks = []
    while True:
        try:
            chunk = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def exchange(path: Path | str, data: bytes, *, limit_s: float = 30.0) -> bytes:
    """Send ``data`` on a fresh connection and read until EOF; b"" if reset."""
    with trio.fail_after(limit_s):
        stream = await trio.open_unix_socket(os.fspath(path))
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(data)
                await stream.send_eof()
            return await read_until_eof(stream)


def body_of(response: bytes) -> bytes:
    """Check the fixed response layout and return the body."""
    head, sep, body = response.partition(b"\r\n\r\n")
    assert sep, response
    assert head == (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close"
    ), head
    return body
