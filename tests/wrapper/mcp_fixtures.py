"""Shared pieces of the ``bounded-query-mcp`` tests: the installed wrapper directory,
a raw stdio driver, and the JSON-RPC messages of both protocol eras.

The server under test is always a real process: either the source file
``wrapper/bounded_query_mcp.py`` or the verbatim copy ``bounded-query-mcp``
that :func:`install_wrapper_dir` puts in a wrapper directory exactly as the
harness does (with ``bounded-query``, ``bounded-query-cost`` and
``bq_protocol/`` beside it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bounded_query.harness.staging.outputs import install_wrapper_dir
from tests.wrapper.fakes import DEADLINE_ENV, REPO_ROOT, SOCKET_ENV

MCP_FILE = REPO_ROOT / "wrapper" / "bounded_query_mcp.py"
SKILL_ENV = "AWF_BOUNDED_QUERY_SKILL"
SKILL_TEXT = "---\nname: bounded-queries\n---\n\n# Bounded queries \u2014 test skill\n"
MODERN = "2026-07-28"
HANDSHAKE = ("2025-06-18", "2025-11-25")
BOOLEAN = '{"type":"boolean"}'

#: A safety net for reads from the server (never reached by a passing test).
READ_TIMEOUT_S = 30.0


def wrapper_dir(base: Path) -> Path:
    """A wrapper directory laid out by the harness's own ``install_wrapper_dir``."""
    target = base / "bin"
    target.mkdir(mode=0o755)
    install_wrapper_dir(target)
    return target


def skill_file(base: Path) -> Path:
    path = base / "SKILL.md"
    path.write_text(SKILL_TEXT, encoding="utf-8")
    return path


def server_env(socket_path: str | None, skill: Path | None) -> dict[str, str]:
    """The agent-side environment the harness would give (plus PATH)."""
    env = {k: v for k, v in os.environ.items() if k not in (SOCKET_ENV, DEADLINE_ENV, SKILL_ENV)}
    if socket_path is not None:
        env[SOCKET_ENV] = socket_path
    if skill is not None:
        env[SKILL_ENV] = str(skill)
    return env


def envelope(**extra: Any) -> dict[str, Any]:
    """The 2026-07-28 per-request ``_meta`` envelope."""
    meta: dict[str, Any] = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"},
    }
    meta.update(extra)
    return meta


def request(request_id: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


def initialize(request_id: Any = 0, version: str = "2025-11-25") -> bytes:
    return request(
        request_id,
        "initialize",
        {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "0"},
        },
    )


INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'


def call(request_id: Any, name: str, arguments: Any, meta: dict[str, Any] | None = None) -> bytes:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return request(request_id, "tools/call", params)


class RawServer:
    """The server as a subprocess, driven line by line; stderr is captured."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self._lines: list[bytes] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def lines(self, count: int) -> list[bytes]:
        """Wait for ``count`` output lines in total; return them all."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: len(self._lines) >= count or self._eof, timeout=READ_TIMEOUT_S
            )
            assert ok, ("timed out", self._lines)
            assert len(self._lines) >= count, ("server closed stdout", self._lines)
            return list(self._lines)

    def ask(self, data: bytes) -> dict[str, Any]:
        """Send one request line and return the next response, parsed."""
        before = len(self.lines(0))
        self.send(data)
        return json.loads(self.lines(before + 1)[before])

    def close(self) -> tuple[list[bytes], bytes, int]:
        """EOF on stdin; return (all stdout lines, stderr, exit status)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        status = self.proc.wait(timeout=READ_TIMEOUT_S)
        self._reader.join(timeout=READ_TIMEOUT_S)
        assert self.proc.stderr is not None
        return list(self._lines), self.proc.stderr.read(), status


@contextlib.contextmanager
def raw_server(
    command: list[str] | None = None, env: dict[str, str] | None = None
) -> Iterator[RawServer]:
    server = RawServer(command or [sys.executable, str(MCP_FILE)], env or server_env(None, None))
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        server._reader.join(timeout=READ_TIMEOUT_S)
        for stream in (server.proc.stdin, server.proc.stdout, server.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
