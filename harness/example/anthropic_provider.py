"""A scripted stand-in for the Anthropic Messages API (standard library only).

It is the model of the built-in demo's bounded-agent question when no real
credential is set (``harness/scripted_provider.py`` runs it in a container)
and of the enclave tests. Never a production upstream.

Theory of operation: the engine (the real Claude Code) believes this is its
model. The fake plays a two-turn script that proves the engine
really read the seed through its own tool (ENGINES.md: a fake that ignores
the request lets a test pass without the engine reading anything):

* a request whose messages carry no ``tool_result`` yet is answered with one
  ``tool_use`` block for the ``Bash`` tool running the script's ``command``
  (streamed as ``input_json_delta`` chunks);
* a request whose latest ``tool_result`` contains the script's ``marker`` is
  answered with the final text ``answer``;
* any other request (the marker did not come back, no tools offered, a
  second tool round) gets ``wrong_answer``.

Every request is appended to the record file as one JSON line: method,
path, every header as received, the model, ``max_tokens``, whether it
streamed, the offered tool names, the tool results sent back, and the raw
body (the tests search it for a steering seed's text). Responses stream
Server-Sent Events (message_start, content_block_start/delta/stop,
message_delta, message_stop) when the request asks for ``stream``; other
requests get one JSON message. ``/v1/messages/count_tokens`` answers a fixed
count. Anything else is a 404 (recorded too).

Runs inside a container of the query image on the test's internal network
(``python3 anthropic_provider.py SCRIPT.json RECORD.jsonl [PORT]``); prints
``ready`` on stdout once it listens. SCRIPT.json is read again for every
request (a test changes it between runs).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DEFAULT_PORT", "Script", "make_server", "reply_for"]

DEFAULT_PORT = 8080
#: Bodies larger than this are refused (the engine's are a few hundred KiB).
MAX_BODY_BYTES = 16 * 1024 * 1024
NOT_FOUND = b'{"type":"error","error":{"type":"not_found_error","message":"no such route"}}'
UNAUTHORIZED = (
    b'{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}'
)
#: Size of each input_json_delta chunk of a streamed tool call.
JSON_CHUNK = 16


class Script:
    """The fake's script: what to run, what proves it ran, what to answer."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.command = str(value["command"])
        self.marker = str(value["marker"])
        self.answer = str(value["answer"])
        self.wrong_answer = str(value.get("wrong_answer", '"wrong"'))
        self.tool = str(value.get("tool", "Bash"))
        credential = value.get("credential")
        #: The one ``x-api-key`` accepted (None: any); others get a 401.
        self.credential = None if credential is None else str(credential)


def _tool_results(body: dict[str, Any]) -> list[str]:
    """The text of every tool_result block in the request's messages, in order."""
    texts: list[str] = []
    for message in body.get("messages", []):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            inner = block.get("content")
            if isinstance(inner, str):
                texts.append(inner)
            elif isinstance(inner, list):
                texts.append(
                    "".join(
                        str(b.get("text", ""))
                        for b in inner
                        if isinstance(b, dict) and b.get("type") == "text"
                    )
                )
    return texts


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [
        str(t.get("name"))
        for t in body.get("tools", []) or []
        if isinstance(t, dict) and "name" in t
    ]


def reply_for(script: Script, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The stop reason and content blocks the script answers ``body`` with."""
    results = _tool_results(body)
    if not results and script.tool in _tool_names(body):
        call = {
            "type": "tool_use",
            "id": "toolu_fake_0001",
            "name": script.tool,
            "input": {"command": script.command, "description": "read the marker"},
        }
        return "tool_use", [call]
    if results and script.marker in results[-1]:
        return "end_turn", [{"type": "text", "text": script.answer}]
    return "end_turn", [{"type": "text", "text": script.wrong_answer}]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _stream(model: str, stop_reason: str, blocks: list[dict[str, Any]]) -> bytes:
    out = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 100, "output_tokens": 1},
                },
            },
        )
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            start = {**block, "input": {}}
            text = json.dumps(block["input"])
            deltas = [
                {"type": "input_json_delta", "partial_json": text[i : i + JSON_CHUNK]}
                for i in range(0, len(text), JSON_CHUNK)
            ]
        else:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        out.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        out.extend(
            _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        )
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    out.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 20},
            },
        )
    )
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def make_server(
    load_script: Callable[[], Script], record_path: str, port: int
) -> ThreadingHTTPServer:
    """A server on ``port`` (all addresses) playing the script ``load_script`` returns.

    The script is loaded for every request, so a test can change it between
    enclave runs; each request is appended to ``record_path``.
    """
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _record(self, entry: dict[str, Any]) -> None:
            with lock, open(record_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(min(length, MAX_BODY_BYTES)) if length else b""
            text = raw.decode("utf-8", "replace")
            try:
                body = json.loads(text) if text else {}
            except ValueError:
                body = {}
            if not isinstance(body, dict):
                body = {}
            path = self.path.split("?", 1)[0]
            entry = {
                "method": self.command,
                "path": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "model": body.get("model"),
                "max_tokens": body.get("max_tokens"),
                "stream": bool(body.get("stream")),
                "tools": _tool_names(body),
                "tool_results": _tool_results(body),
                "body": text,
            }
            if self.command == "POST" and path == "/v1/messages/count_tokens":
                self._record(entry)
                self._send(200, "application/json", b'{"input_tokens": 100}')
                return
            if self.command != "POST" or path != "/v1/messages":
                self._record(entry)
                self._send(404, "application/json", NOT_FOUND)
                return
            script = load_script()
            if script.credential is not None and self.headers.get("x-api-key") != script.credential:
                entry["reply"] = "unauthorized"
                self._record(entry)
                self._send(401, "application/json", UNAUTHORIZED)
                return
            stop_reason, blocks = reply_for(script, body)
            entry["reply"] = stop_reason
            self._record(entry)
            model = str(body.get("model") or "fake")
            if body.get("stream"):
                self._send(200, "text/event-stream", _stream(model, stop_reason, blocks))
                return
            message = {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {"input_tokens": 100, "output_tokens": 20},
            }
            self._send(200, "application/json", json.dumps(message).encode())

        do_POST = _handle
        do_GET = _handle
        do_HEAD = _handle

    return ThreadingHTTPServer(("0.0.0.0", port), Handler)


def main(argv: list[str]) -> int:
    def load_script() -> Script:
        with open(argv[0], encoding="utf-8") as handle:
            return Script(json.load(handle))

    load_script()
    port = int(argv[2]) if len(argv) > 2 else DEFAULT_PORT
    server = make_server(load_script, argv[1], port)
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
