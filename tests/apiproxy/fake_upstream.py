"""A scripted fake model provider on loopback: records every request, answers by script.

One trio task per connection, h11 with keep-alive (the proxy pools one
invocation's connections). Every complete request is appended to
``requests`` (method, target, headers, body) *before* the answer, so a test
can assert exactly what reached the "provider". The answer is chosen by
``mode``:

* ``"sse"``: an Anthropic Messages stream (``message_start`` with input
  tokens, a text delta, ``message_delta`` with output tokens, ``message_stop``)
  sent as separate chunks;
* ``"json"``: an OpenAI chat-completions JSON body with usage;
* ``"redirect"``: 307 to ``redirect_to`` (which a proxy must not follow);
* ``"status"``: ``status`` with a body that quotes the credential it got
  (a provider echoing a key in an error message);
* ``"hold"``: a stream head and one event, then wait for ``release`` (a
  long generation, for disarm-while-streaming);
* ``"huge"``: ``huge_bytes`` of SSE comments (a runaway response);
* ``"silent"``: nothing at all until ``release`` (a provider that hangs);
* ``"scripted"``: the SSE events ``script(recorded)`` returns (a provider
  that answers by what the conversation contains).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import h11
import trio


@dataclass
class Recorded:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> list[bytes]:
        return [v for n, v in self.headers if n.lower() == name]

    def json(self) -> dict:
        return json.loads(self.body)


def anthropic_events(text: str = "hello", input_tokens: int = 12, output_tokens: int = 7) -> list:
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


def anthropic_tool_use_events(name: str, tool_input: dict, tool_id: str = "toolu_1") -> list:
    """An Anthropic stream whose answer is one tool call (stop_reason tool_use)."""
    message = {
        "id": "msg_tool",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "usage": {"input_tokens": 30, "output_tokens": 1},
    }
    block = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps(tool_input)}
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 9},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


@dataclass
class FakeUpstream:
    mode: str = "sse"
    status: int = 401
    redirect_to: str = ""
    huge_bytes: int = 0
    requests: list[Recorded] = field(default_factory=list)
    connections: int = 0
    release: trio.Event = field(default_factory=trio.Event)
    streaming: trio.Event = field(default_factory=trio.Event)
    port: int = 0
    script: Callable[[Recorded], list[bytes]] | None = None
    #: ``"json"`` mode: the assistant message to answer with (default: "hi").
    json_script: Callable[[Recorded], dict] | None = None
    #: ``"json"`` mode: compress the body although the proxy asked for identity.
    gzip: bool = False

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = None
                body = bytearray()
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                recorded = Recorded(
                    bytes(request.method),
                    bytes(request.target),
                    [(bytes(n), bytes(v)) for n, v in request.headers.raw_items()],
                    bytes(body),
                )
                self.requests.append(recorded)
                await self._answer(conn, stream, recorded)
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _send(self, conn: h11.Connection, stream: trio.SocketStream, event) -> None:
        data = conn.send(event)
        if data:
            await stream.send_all(data)

    async def _answer(self, conn, stream, recorded: Recorded) -> None:
        send = self._send
        if self.mode == "silent":
            self.streaming.set()
            await self.release.wait()
            return
        if self.mode == "redirect":
            headers = [("location", self.redirect_to), ("content-length", "0")]
            await send(conn, stream, h11.Response(status_code=307, headers=headers))
            await send(conn, stream, h11.EndOfMessage())
            return
        if self.mode == "status":
            quoted = b",".join(recorded.header(b"x-api-key") + recorded.header(b"authorization"))
            body = b'{"error":{"message":"invalid key ' + quoted + b'"}}'
            headers = [
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
                ("retry-after", "7"),
                ("x-echo", quoted.decode()),
            ]
            await send(conn, stream, h11.Response(status_code=self.status, headers=headers))
            await send(conn, stream, h11.Data(data=body))
            await send(conn, stream, h11.EndOfMessage())
            return
        if self.mode == "json":
            message: dict = {"role": "assistant", "content": "hi"}
            if self.json_script is not None:
                message = self.json_script(recorded)
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            body = json.dumps(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 21, "completion_tokens": 3},
                }
            ).encode()
            headers = [("content-type", "application/json")]
            if self.gzip:
                body = gzip.compress(body)
                headers.append(("content-encoding", "gzip"))
            headers.append(("content-length", str(len(body))))
            await send(conn, stream, h11.Response(status_code=200, headers=headers))
            await send(conn, stream, h11.Data(data=body))
            await send(conn, stream, h11.EndOfMessage())
            return
        headers = [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
        await send(conn, stream, h11.Response(status_code=200, headers=headers))
        if self.mode == "hold":
            await send(conn, stream, h11.Data(data=anthropic_events()[0]))
            self.streaming.set()
            await self.release.wait()
        elif self.mode == "huge":
            piece = b": " + b"x" * 65533 + b"\n"
            sent = 0
            while sent < self.huge_bytes:
                await send(conn, stream, h11.Data(data=piece))
                sent += len(piece)
        elif self.mode == "scripted":
            assert self.script is not None
            for event in self.script(recorded):
                await send(conn, stream, h11.Data(data=event))
        else:
            for event in anthropic_events():
                await send(conn, stream, h11.Data(data=event))
        await send(conn, stream, h11.EndOfMessage())
