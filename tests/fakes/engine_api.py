"""A fake Docker Engine API on a unix socket, for tests that must need no engine.

It speaks real HTTP/1.1 (keep-alive, Content-Length) to the real docker SDK,
and just enough of the Engine API for what the harness does around a run
with the fake broker: its preflight checks that ``DOCKER_HOST`` is a
socket, the sweep lists agent containers by role label, teardown lists and
force-removes the run's labelled containers, then its labelled volumes and
networks. The state is three in-memory tables (``containers``: id -> labels,
``volumes``: name -> labels, ``networks``: id -> labels) that tests may fill;
every request is recorded as ``(method, path, query)`` and anything outside
the subset is answered 501 and recorded in ``unexpected``, so a test can
assert the harness asked for nothing else.

Routes (any ``/vX.Y`` prefix): ``GET /_ping``, ``GET /version``,
``GET /containers/json`` (``all``, ``filters`` with ``label``),
``DELETE /containers/{id}``, ``GET /volumes`` (``filters`` with ``label``),
``DELETE /volumes/{name}``, ``GET /networks`` (``filters`` with ``label``),
``DELETE /networks/{id}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FakeEngineAPI", "fake_engine_api"]

_VERSIONED = re.compile(r"/v[0-9]+\.[0-9]+(/.*)")


def _labels_match(labels: Mapping[str, str], filters: str | None) -> bool:
    """The engine's ``label`` filter: every ``key`` or ``key=value`` must hold."""
    if not filters:
        return True
    wanted = json.loads(filters).get("label", [])
    if isinstance(wanted, dict):  # the older map form {"k=v": true}
        wanted = list(wanted)
    for item in wanted:
        key, eq, value = item.partition("=")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


class FakeEngineAPI:
    """The tables, the request log and the server thread (see the module docstring)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.docker_host = "unix://" + socket_path
        self.containers: dict[str, dict[str, str]] = {}
        self.volumes: dict[str, dict[str, str]] = {}
        self.networks: dict[str, dict[str, str]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.unexpected: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = _Server(socket_path, _Handler)
        self._server.engine = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def removed(self, kind: str) -> list[str]:
        """Ids (``containers``) or names (``volumes``) a DELETE was asked for."""
        prefix = f"/{kind}/"
        return [
            path[len(prefix) :]
            for method, path, _ in self.requests
            if method == "DELETE" and path.startswith(prefix)
        ]

    def listed_labels(self, kind: str) -> list[list[str]]:
        """The label filters of every listing of ``kind`` (``containers``/``volumes``)."""
        route = "/containers/json" if kind == "containers" else f"/{kind}"
        found = []
        for method, path, query in self.requests:
            if method == "GET" and path == route:
                filters = json.loads(query.get("filters", ["{}"])[0])
                found.append(list(filters.get("label", [])))
        return found

    # -- the routes ------------------------------------------------------

    def answer(self, method: str, target: str) -> tuple[int, Any]:
        split = urlsplit(target)
        path = unquote(split.path)
        versioned = _VERSIONED.fullmatch(path)
        if versioned:
            path = versioned.group(1)
        query = parse_qs(split.query)
        with self._lock:
            self.requests.append((method, path, query))
            filters = query.get("filters", [None])[0]
            if method == "GET" and path == "/_ping":
                return 200, "OK"
            if method == "GET" and path == "/version":
                return 200, {"ApiVersion": "1.41", "Version": "fake", "MinAPIVersion": "1.12"}
            if method == "GET" and path == "/containers/json":
                return 200, [
                    {"Id": ident, "Names": ["/" + ident], "Labels": dict(labels)}
                    for ident, labels in self.containers.items()
                    if _labels_match(labels, filters)
                ]
            if method == "GET" and path == "/volumes":
                return 200, {
                    "Volumes": [
                        {"Name": name, "Labels": dict(labels), "Driver": "local"}
                        for name, labels in self.volumes.items()
                        if _labels_match(labels, filters)
                    ],
                    "Warnings": None,
                }
            if method == "GET" and path == "/networks":
                return 200, [
                    {"Id": ident, "Name": ident, "Labels": dict(labels)}
                    for ident, labels in self.networks.items()
                    if _labels_match(labels, filters)
                ]
            tables = (
                ("/containers/", self.containers),
                ("/volumes/", self.volumes),
                ("/networks/", self.networks),
            )
            for prefix, table in tables:
                if (
                    method == "DELETE"
                    and path.startswith(prefix)
                    and "/" not in path[len(prefix) :]
                ):
                    name = path[len(prefix) :]
                    if table.pop(name, None) is None:
                        return 404, {"message": f"No such {prefix.strip('/')[:-1]}: {name}"}
                    return 204, None
            self.unexpected.append((method, path))
            return 501, {"message": f"the fake engine does not serve {method} {path}"}


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    engine: FakeEngineAPI


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # quiet

    def address_string(self) -> str:
        return "fake-engine"  # a unix socket has no peer address

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, body = self.server.engine.answer(self.command, self.path)
        payload = b"" if body is None else (body if isinstance(body, str) else json.dumps(body))
        data = payload.encode() if isinstance(payload, str) else payload
        self.send_response(status)
        content_type = "text/plain" if isinstance(body, str) else "application/json"
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Api-Version", "1.41")
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = _serve


@contextlib.contextmanager
def fake_engine_api() -> Iterator[FakeEngineAPI]:
    """A started :class:`FakeEngineAPI` on a fresh short socket path (unix paths
    are limited to 107 bytes, so not under pytest's long ``tmp_path``)."""
    directory = tempfile.mkdtemp(prefix="bq-fake-engine-", dir="/tmp")
    os.chmod(directory, 0o755)
    engine = FakeEngineAPI(os.path.join(directory, "docker.sock"))
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()
        shutil.rmtree(directory, ignore_errors=True)
