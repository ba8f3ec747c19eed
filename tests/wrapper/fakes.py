"""A recorded-bytes Unix-socket server and a runner for the wrapper CLI.

``RecordedServer`` accepts connections on a real Unix socket, captures each
request's exact bytes (head up to the blank line plus Content-Length bytes of
body) and answers with canned bytes, optionally hanging or trickling, so the
tests can check the wrapper's framing byte for byte and feed it hostile
responses. It is deliberately not an HTTP implementation: it replies whatever
it is told to.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
WRAPPER_FILE = REPO_ROOT / "wrapper" / "bounded_query_cli.py"
COST_FILE = REPO_ROOT / "wrapper" / "bounded_query_cost.py"
SOCKET_ENV = "AWF_BOUNDED_QUERY_SOCKET"
DEADLINE_ENV = "BOUNDED_QUERY_WRAPPER_TEST_DEADLINE"
ERROR_LINE = b'{"status":"error"}\n'

#: How long the fake waits for a request before giving up (a safety net so a
#: broken test cannot hang the suite; never reached by a passing test).
REQUEST_READ_TIMEOUT = 10.0


def console_script(name: str) -> str:
    """The installed console script ``name`` next to this interpreter."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"console script {name} is not installed (run make install)")
    return found


def wrapper_commands() -> dict[str, list[str]]:
    """Both ways the agent can run the wrapper: the file and the console script."""
    return {
        "file": [sys.executable, str(WRAPPER_FILE)],
        "console-script": [console_script("bounded-query")],
    }


@dataclass(frozen=True)
class Reply:
    """What the fake does after reading a request.

    ``chunks`` are sent in order (``pause`` seconds apart, for trickling);
    then the connection is closed, or held open until the server stops when
    ``hang`` is set. ``read_request=False`` answers without reading anything.
    """

    chunks: Sequence[bytes] = ()
    pause: float = 0.0
    hang: bool = False
    read_request: bool = True


def http_reply(body: bytes, *, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    """A well-formed Content-Length-framed response carrying ``body``."""
    return (
        b"HTTP/1.1 " + status + b"\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body
    )


def split_request(raw: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """Split captured request bytes into (request line, headers, body)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no end of head in {raw[:200]!r}"
    lines = head.split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        assert colon, line
        headers.append((name, value.strip()))
    return lines[0], headers, body


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(REQUEST_READ_TIMEOUT)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    _line, headers, body = split_request(data)
    lengths = [int(v) for n, v in headers if n.lower() == b"content-length"]
    want = lengths[0] if lengths else 0
    while len(body) < want:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return data.partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + body


@dataclass
class RecordedServer:
    """A Unix-socket server that records requests and plays back ``reply``."""

    path: str
    reply: Reply
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _sock: socket.socket | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        sock.listen(16)
        sock.settimeout(0.05)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        try:
            if self.reply.read_request:
                self.requests.append(_read_request(conn))
            for i, chunk in enumerate(self.reply.chunks):
                if i and self.reply.pause and self._stop.wait(self.reply.pause):
                    return
                conn.sendall(chunk)
            if self.reply.hang:
                self._stop.wait()
        except OSError:
            pass  # the wrapper gave up first: that is what some tests provoke

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()


@contextlib.contextmanager
def socket_dir() -> Iterator[str]:
    """A short private directory (Unix socket paths are limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix="bqw-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def recorded_server(reply: Reply) -> Iterator[RecordedServer]:
    with socket_dir() as directory:
        server = RecordedServer(os.path.join(directory, "broker.sock"), reply)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def silent_listener() -> Iterator[tuple[str, socket.socket]]:
    """A listening socket nobody accepts on: connection attempts stay queued.

    After the wrapper exits, a non-blocking ``accept`` tells whether it ever
    connected (a connection closed by the client stays in the backlog).
    """
    with socket_dir() as directory:
        path = os.path.join(directory, "broker.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(16)
        try:
            yield path, sock
        finally:
            sock.close()


def was_contacted(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@dataclass(frozen=True)
class Outcome:
    stdout: bytes
    stderr: bytes
    returncode: int
    elapsed: float


def run_wrapper(
    command: list[str],
    args: Sequence[str | bytes],
    *,
    script: bytes | None = b"print(1)\n",
    socket_path: str | None = None,
    env: dict[str, str] | None = None,
    stdin: int | None = None,
    timeout: float = 30.0,
) -> Outcome:
    """Run the wrapper as a real subprocess and capture everything."""
    full_env = {k: v for k, v in os.environ.items() if k not in (SOCKET_ENV, DEADLINE_ENV)}
    if socket_path is not None:
        full_env[SOCKET_ENV] = socket_path
    full_env.update(env or {})
    if stdin is None and script is None:
        stdin = subprocess.DEVNULL
    started = time.monotonic()
    proc = subprocess.run(
        [*command, *args],
        input=script if stdin is None else None,
        stdin=stdin,
        capture_output=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )
    return Outcome(proc.stdout, proc.stderr, proc.returncode, time.monotonic() - started)
