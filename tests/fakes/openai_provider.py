"""A scripted fake of the OpenAI chat-completions API for enclave tests (standard library only).

Theory of operation: the engine under test (the real GitHub Copilot CLI in
BYOK mode, ``COPILOT_PROVIDER_TYPE=openai``) believes this is its model. The
fake plays a two-turn script that proves the engine really read the seed
through its own shell tool (ENGINES.md: a fake that ignores the request lets
a test pass without the engine reading anything):

* a request whose messages carry no ``tool`` message yet, and which offers
  the script's tool (``bash``), is answered with one ``tool_calls`` entry
  running the script's ``command``;
* a request whose latest ``tool`` message contains the script's ``marker``
  is answered with the final text ``answer``;
* any other request (the marker did not come back, the tool was not
  offered, a second tool round) gets ``wrong_answer``.

Every request is appended to the record file as one JSON line: method,
path, every header as received, the model, the token fields, whether it
streamed, the offered tool names, the tool calls the engine sent back in
its assistant messages, the tool results, the reply kind and the raw body
(the tests search it for a steering seed's text). Responses are one
``chat.completion`` object, or ``chat.completion.chunk`` Server-Sent Events
ending in ``data: [DONE]`` when the request asks for ``stream``. ``GET
/v1/models`` lists the requested model. Anything else is a 404 (recorded
too).

Runs inside a container of the query image on the test's internal network
(``python3 openai_provider.py SCRIPT.json RECORD.jsonl [PORT]``); prints
``ready`` on stdout once it listens. SCRIPT.json is read again for every
request (a test changes it between runs); its keys are those of
``anthropic_provider.py``'s script (``command``, ``marker``, ``answer``,
``wrong_answer``, ``tool``), so one test rig serves both fakes.
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
NOT_FOUND = b'{"error":{"type":"invalid_request_error","message":"no such route"}}'
#: Size of each arguments chunk of a streamed tool call.
ARGUMENT_CHUNK = 16
#: The one tool call id the fake ever issues.
CALL_ID = "call_fake_0001"


class Script:
    """The fake's script: what to run, what proves it ran, what to answer."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.command = str(value["command"])
        self.marker = str(value["marker"])
        self.answer = str(value["answer"])
        self.wrong_answer = str(value.get("wrong_answer", '"wrong"'))
        self.tool = str(value.get("tool", "bash"))


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body.get("messages", []) or [] if isinstance(m, dict)]


def _tool_results(body: dict[str, Any]) -> list[str]:
    """The text of every ``tool`` message in the request, in order."""
    return [_text(m.get("content")) for m in _messages(body) if m.get("role") == "tool"]


def _tool_calls(body: dict[str, Any]) -> list[dict[str, str]]:
    """Every tool call of the request's assistant messages (name and raw arguments)."""
    calls: list[dict[str, str]] = []
    for message in _messages(body):
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                calls.append(
                    {
                        "name": str(function.get("name")),
                        "arguments": str(function.get("arguments")),
                    }
                )
    return calls


def _tool_names(body: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in body.get("tools", []) or []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and "name" in function:
            names.append(str(function["name"]))
        elif "name" in tool:
            names.append(str(tool["name"]))
    return names


def reply_for(script: Script, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The reply kind (``tool_calls`` or ``stop``) and assistant message for ``body``."""
    results = _tool_results(body)
    if not results and script.tool in _tool_names(body):
        arguments = json.dumps({"command": script.command, "description": "read the marker"})
        call = {
            "id": CALL_ID,
            "type": "function",
            "function": {"name": script.tool, "arguments": arguments},
        }
        return "tool_calls", {"role": "assistant", "content": None, "tool_calls": [call]}
    text = script.answer if results and script.marker in results[-1] else script.wrong_answer
    return "stop", {"role": "assistant", "content": text}


_USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def _completion(model: str, finish: str, message: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": _USAGE,
        }
    ).encode()


def _chunk(model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    data = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(data)}\n\n".encode()


def _stream(model: str, finish: str, message: dict[str, Any]) -> bytes:
    out = [_chunk(model, {"role": "assistant", "content": ""}, None)]
    for call in message.get("tool_calls") or []:
        arguments = call["function"]["arguments"]
        head = {"index": 0, "id": call["id"], "type": "function"}
        out.append(
            _chunk(
                model,
                {"tool_calls": [{**head, "function": {"name": call["function"]["name"]}}]},
                None,
            )
        )
        out.extend(
            _chunk(
                model,
                {
                    "tool_calls": [
                        {"index": 0, "function": {"arguments": arguments[i : i + ARGUMENT_CHUNK]}}
                    ]
                },
                None,
            )
            for i in range(0, len(arguments), ARGUMENT_CHUNK)
        )
    if message.get("content"):
        out.append(_chunk(model, {"content": message["content"]}, None))
    out.append(_chunk(model, {}, finish))
    usage = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": []}
    out.append(f"data: {json.dumps({**usage, 'usage': _USAGE})}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
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
                "max_completion_tokens": body.get("max_completion_tokens"),
                "stream": bool(body.get("stream")),
                "tools": _tool_names(body),
                "tool_calls": _tool_calls(body),
                "tool_results": _tool_results(body),
                "body": text,
            }
            if self.command == "GET" and path == "/v1/models":
                self._record(entry)
                listing = {"object": "list", "data": [{"id": "fake", "object": "model"}]}
                self._send(200, "application/json", json.dumps(listing).encode())
                return
            if self.command != "POST" or path != "/v1/chat/completions":
                self._record(entry)
                self._send(404, "application/json", NOT_FOUND)
                return
            finish, message = reply_for(load_script(), body)
            entry["reply"] = finish
            self._record(entry)
            model = str(body.get("model") or "fake")
            if body.get("stream"):
                self._send(200, "text/event-stream", _stream(model, finish, message))
                return
            self._send(200, "application/json", _completion(model, finish, message))

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
