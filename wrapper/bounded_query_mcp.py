#!/bin/sh
"""exec" python3 -I "$0" "$@"
``bounded-query-mcp``: the bounded-query tools as a stdio MCP server (spec 14.8).

The agent's MCP client starts this file as a local stdio server. It speaks
newline-delimited JSON-RPC 2.0 on stdin/stdout and offers two fixed tools and
one resource:

* ``bounded_query({repo, schema, script})`` forwards one question to the broker
  exactly as the ``bounded-query`` CLI does (it *is* that CLI's code: the
  sibling wrapper module's ``run``), and answers with structured content that
  is exactly the canonical body, ``{"status":"ok","result":...}`` or
  ``{"status":"error"}``, with the same bytes as the text content. It never
  sets ``isError``: every failure is the canonical error, like the CLI's.
* ``bounded_query_cost({schema})`` reports validity, cardinality and the exact
  charge with its parts, computed locally by the shipped protocol package via
  the sibling ``bounded-query-cost`` module (no broker call, nothing spent).
* the resource ``bounded-query://SKILL.md`` is the file named by
  ``$AWF_BOUNDED_QUERY_SKILL``.

and, only while ``$AWF_BOUNDED_AGENT_SOCKET`` is set (the bounded-agent
subsystem is enabled, spec 15.8), a third tool and a second resource:

* ``bounded_agent({repo, schema, task})`` forwards one task to the agent
  broker exactly as the ``bounded-agent`` CLI does (the same sibling module's
  ``run`` as that program), with the same canonical results;
* the resource ``bounded-agent://SKILL.md`` is the file named by
  ``$AWF_BOUNDED_AGENT_SKILL``.

The ``schema`` argument (:data:`SCHEMA_ARGUMENT`) is a JSON object, the
declared and preferred form (models write nested JSON more reliably than
JSON escaped in a string), or JSON text of one, as ``--schema`` takes it.
Both are judged by the same rules on the same bytes: text as its own UTF-8
bytes, an object as its compact UTF-8 JSON written as sent (keys in order,
repeated keys repeated, number tokens verbatim: :func:`compact_json`). The
4096-byte limit applies to those bytes (the fewest any spelling of the
object has), then the broker's strict parser and charge decide, or the cost
tool's copy of them.

The server adds no capability: the brokers stay the only trust boundary. The
tool list is one of two constants (with or without ``bounded_agent``), so it
names no repository, budget or sensitivity.

Protocol revisions (theory of operation):

* ``2025-06-18`` and ``2025-11-25``: the ``initialize`` handshake (the server
  echoes a supported requested version, otherwise offers ``2025-11-25``),
  then ``notifications/initialized`` and plain requests.
* ``2026-07-28`` (stateless): no handshake; every request carries
  ``params._meta["io.modelcontextprotocol/protocolVersion"]`` and
  ``".../clientCapabilities"``; ``server/discover`` advertises the revision;
  every result carries ``resultType`` and list/read results cache hints.

The first request that is served decides the connection's era (the table in
``Session._route``): ``initialize`` opens the handshake era, a request with
the stateless envelope opens the stateless era. A later request of the other
era is refused (``-32600`` on a handshake connection, ``-32022`` for
``initialize`` on a stateless one); ``ping`` is answered in every state.

Lines are parsed by :func:`decode_line`: plain JSON, except that a number
token other than a short integer is kept as text (:class:`NumberText`,
never converted) and an object that repeats a key keeps its pairs
(:class:`RepeatedKeys`; tool arguments that repeat a name are ``-32602``).

Failures are JSON-RPC errors and never stop the server: a line that is not
JSON or not UTF-8 is ``-32700``; a line over ``MAX_LINE_BYTES``, a
non-object, a bad ``jsonrpc``/``id``/``method`` or a request out of order is
``-32600``; an unknown method ``-32601``; parameters (tool arguments
included) that break the declared schema ``-32602``; a bug ``-32603``.
Notifications and responses are never answered. The answer to an oversize
line is sent once, and the rest of the line is discarded without buffering.

I/O: the main thread reads stdin in chunks and answers everything but
``bounded_query`` inline; each ``bounded_query`` runs in its own thread (at
most ``MAX_IN_FLIGHT`` at once; past that the answer is the canonical error
without contacting the broker, as the broker's own connection cap would
answer), so ``ping`` and the cost tool stay responsive during a 600 s query.
Writes go through one lock, one line each. Nothing else ever reaches stdout
(the protocol keeps a private duplicate of fd 1; fd 1 and fd 2 point to
``/dev/null``), and nothing reaches stderr: diagnostics never reach the agent.
End of input is a clean shutdown: the calls in flight are answered (each is
bounded by the wrapper's deadline), then the exit status is 0.

Like the wrapper, this file is one stdlib-only module for Python >= 3.8 that
the harness copies verbatim into the agent's wrapper directory; it imports
its siblings by file, never relatively. Executed directly it is, like the
wrapper, a ``/bin/sh`` script whose line 2 re-executes it as ``python3 -I``
(Python reads that line as the start of this docstring), so no ``PYTHON*``
variable of the agent's environment (``PYTHONINSPECT`` would open a prompt
on stdout) and no user site directory can touch the protocol stream.

The cost tool needs the protocol package, which needs Python >= 3.10; on
older interpreters that one tool answers ``-32603`` and everything else
works.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the file must import on Python 3.8
    from collections.abc import Callable

    QueryFn = Callable[[str, bytes, bytes], str]
    AgentFn = Callable[[str, bytes, bytes], str]
    CostFn = Callable[[bytes], str]

__all__ = [
    "AGENT_SKILL_URI",
    "AGENT_TOOL",
    "HANDSHAKE_VERSIONS",
    "MAX_INT_TOKEN_CHARS",
    "MAX_IN_FLIGHT",
    "MAX_LINE_BYTES",
    "MODERN_VERSIONS",
    "RESOURCES",
    "SCHEMA_ARGUMENT",
    "SKILL_URI",
    "TOOLS",
    "AgentBinding",
    "LineReader",
    "NumberText",
    "RepeatedKeys",
    "Session",
    "compact_json",
    "decode_line",
    "main",
    "schema_argument",
]

SERVER_NAME = "bounded-query"
SERVER_VERSION = "0.1.0"

#: Revisions served through the ``initialize`` handshake, oldest first; the
#: last is offered when the client asks for one we do not serve.
HANDSHAKE_VERSIONS = ("2025-06-18", "2025-11-25")

#: Revisions served through the per-request envelope (stateless era).
MODERN_VERSIONS = ("2026-07-28",)

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"

#: JSON-RPC 2.0 error codes, and the 2026-07-28 one for an unserved revision.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_PROTOCOL_VERSION = -32022

#: The largest legitimate line is a ``tools/call`` with a 64 KiB script and a
#: 4 KiB schema in which every byte is escaped as ``\\u00XX`` (6x), about
#: 410 KiB; a line longer than this is refused and discarded unread.
MAX_LINE_BYTES = 1024 * 1024

#: Concurrent ``bounded_query`` calls. The broker serializes queries anyway
#: and caps its connections; this bounds the threads one client can start.
MAX_IN_FLIGHT = 16

#: The skill file is a few KiB of Markdown; refuse to serve anything huge.
MAX_SKILL_BYTES = 1024 * 1024

#: Spec 14.3 limits, restated for the declared input schemas (characters
#: bound bytes from below; the exact byte limits are the wrapper's).
MAX_SCHEMA_BYTES = 4096
MAX_SCRIPT_BYTES = 64 * 1024
MAX_REPO_CHARS = 140

SKILL_ENV = "AWF_BOUNDED_QUERY_SKILL"
SKILL_URI = "bounded-query://SKILL.md"
#: The bounded-agent subsystem's variables (spec 15.8); the tool is listed
#: only while the socket variable is set. Tests tie the names to policy.
AGENT_SOCKET_ENV = "AWF_BOUNDED_AGENT_SOCKET"
AGENT_SKILL_ENV = "AWF_BOUNDED_AGENT_SKILL"
AGENT_SKILL_URI = "bounded-agent://SKILL.md"
#: Spec 15.2's upper bound of ``maxTaskBytes``, for the declared input schema
#: (characters bound bytes from below; the run's exact byte limit is the
#: ``bounded-agent`` wrapper's, from the ingress).
MAX_TASK_BYTES = 65536

#: ``ttlMs`` for the constant tool list (stateless era cache hint).
STATIC_TTL_MS = 3600 * 1000

_READ_CHUNK = 64 * 1024
_CANONICAL_ERROR = '{"status":"error"}'

# --------------------------------------------------------------------------
# 1. The fixed tool list and resource (identical for every run)

INSTRUCTIONS = (
    "Ask bounded, bit-charged questions about private repositories you cannot read."
    " Every answer costs bits from the repository's run budget (never refunded, and"
    " nothing tells you what is left): check a schema with bounded_query_cost first,"
    " ask for the smallest answer that decides your next step, and read the resource"
    " " + SKILL_URI + " for the repositories, their budgets and worked examples."
)

QUERY_DESCRIPTION = (
    "Run a short Python 3 script against a private copy of one repository and get back"
    " only a value of the finite response schema you declare. The script sees the"
    " repository at /query/repo (cwd /query, no network, standard library and git only)"
    " and must write its answer as JSON to /query/out. The answer is exactly"
    ' {"status":"ok","result":<value>} or {"status":"error"}; an error never says why'
    " (bad schema, budget exhausted, crash, timeout and a non-matching value look the"
    " same). Cost: 1 status bit + ceil(log2(cardinality of the schema)) + 3 timing bits,"
    " debited from the repository's run budget before the script runs and never"
    " refunded, whatever the outcome; a refusal over budget costs no bits. Size"
    " questions to the budget: prefer a boolean or a small enum to a count, bucket"
    " counts into a few ranges, cap integers (min(n, 1000)) with a tight range, batch"
    " related facts into one object or tuple (status and timing bits are paid once),"
    " and catch exceptions in the script so it always writes a value of the schema."
    " Schema kinds: const, boolean, enum, integer (minimum..maximum), object, tuple,"
    " array (fixed length), union; see the resource " + SKILL_URI + "."
)

AGENT_INSTRUCTIONS = (
    " bounded_agent asks a coding agent that reads the repository in a sandbox"
    " (it sends repository content to its model provider: prefer bounded_query"
    " when a script can answer); its budget is separate; read " + AGENT_SKILL_URI + "."
)

AGENT_DESCRIPTION = (
    "Give a task in plain language to a coding agent that reads a read-only copy of one"
    " private repository in a fresh sandbox (shell and read tools only) and must answer"
    " with one value of the finite response schema you declare; you get back only that"
    ' value: exactly {"status":"ok","result":<value>} or {"status":"error"}, and an error'
    " never says why. The agent sends repository content to its model provider; prefer"
    " bounded_query when a deterministic script can answer. Cost: 1 status bit +"
    " ceil(log2(cardinality of the schema)) + 3 timing bits, debited from the"
    " repository's bounded-agent run budget (separate from bounded_query's) before the"
    " agent starts and never refunded; a refusal over budget costs no bits. Say in the"
    " task exactly which value means what, and which value to give when the agent cannot"
    " tell. Same schema language as bounded_query; see the resource " + AGENT_SKILL_URI + "."
)

COST_DESCRIPTION = (
    "Check a response schema before spending anything: whether it is valid, its exact"
    " cardinality and its charge in bits (1 status + ceil(log2(cardinality)) + 3"
    " timing) with the parts, and how many questions of that charge each metered run"
    " budget funds (internal 64 bits, confidential 8, sealed 0; public is unmetered)."
    " Computed locally with the broker's own protocol code: no query runs and no"
    " budget is spent."
)

#: The ``schema`` argument of every tool that takes one (``bounded_query``,
#: ``bounded_query_cost``, and ``bounded_agent`` when it lands): a JSON
#: object (the declared, preferred form) or JSON text of one. Two ``anyOf``
#: branches of one type each, object first: the portable spelling of a
#: union (a ``type`` array is flagged by the Inspector's ``--strict`` lint,
#: and single-type dialects keep one branch). The length bounds bind the
#: text only; an object is judged by the bytes it is sent as
#: (:func:`schema_argument`).
SCHEMA_ARGUMENT: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "description": 'The schema itself, for example {"type":"boolean"}.',
        },
        {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_SCHEMA_BYTES,
            "description": "The same schema as JSON text (at most 4096 UTF-8 bytes).",
        },
    ],
    "description": 'The response schema as a JSON object, for example {"type":"boolean"}'
    " (JSON text of the same object is accepted too). An object is sent as compact UTF-8"
    " JSON, keys in the order given, and those bytes are what is judged: at most 4096 of"
    " them, nested at most seven levels, integers as plain integer tokens.",
}

TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "bounded_query",
        "title": "Ask a bounded question about a private repository",
        "description": QUERY_DESCRIPTION,
        "inputSchema": {
            "type": "object",
            "properties": {
                "repo": {
                    "type": "string",
                    "minLength": 3,
                    "maxLength": MAX_REPO_CHARS,
                    "description": "The repository as owner/repo.",
                },
                "schema": SCHEMA_ARGUMENT,
                "script": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_SCRIPT_BYTES,
                    "description": "The Python 3 script (at most 64 KiB of UTF-8); it writes"
                    " its answer as JSON to /query/out.",
                },
            },
            "required": ["repo", "schema", "script"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": ["ok", "error"]},
                "result": {
                    "anyOf": [
                        {"type": "boolean"},
                        {"type": "integer"},
                        {"type": "string"},
                        {"type": "null"},
                        {"type": "array"},
                        {"type": "object"},
                    ],
                    "description": "The validated answer, a value of the declared schema"
                    " (present only when status is ok).",
                },
            },
            "required": ["status"],
            "additionalProperties": False,
        },
        "annotations": {
            "title": "Ask a bounded question",
            "readOnlyHint": False,
            "destructiveHint": False,
            "idempotentHint": False,
            "openWorldHint": False,
        },
    },
    {
        "name": "bounded_query_cost",
        "title": "What a response schema would cost",
        "description": COST_DESCRIPTION,
        "inputSchema": {
            "type": "object",
            "properties": {"schema": SCHEMA_ARGUMENT},
            "required": ["schema"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "valid": {"type": "boolean"},
                "schemaBytes": {"type": "integer"},
                "error": {"type": "string", "description": "Why the schema is invalid."},
                "cardinality": {
                    "type": "string",
                    "description": "Exact number of possible answers, in decimal.",
                },
                "saturated": {"type": "boolean"},
                "chargeBits": {"type": "integer"},
                "statusBits": {"type": "integer"},
                "schemaBits": {"type": "integer"},
                "timingBits": {"type": "integer"},
                "questionsPerRun": {
                    "type": "object",
                    "properties": {
                        "public": {"type": "null"},
                        "internal": {"type": "integer"},
                        "confidential": {"type": "integer"},
                        "sealed": {"type": "integer"},
                    },
                    "additionalProperties": False,
                },
            },
            "required": ["valid", "schemaBytes"],
            "additionalProperties": False,
        },
        "annotations": {
            "title": "Check a schema's cost",
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        },
    },
)

RESOURCES: tuple[dict[str, Any], ...] = (
    {
        "uri": SKILL_URI,
        "name": "SKILL.md",
        "title": "Bounded queries: repositories, budgets, schema language, examples",
        "mimeType": "text/markdown",
    },
)

#: Listed after :data:`TOOLS` while the bounded-agent subsystem is enabled.
AGENT_TOOL: dict[str, Any] = {
    "name": "bounded_agent",
    "title": "Ask a coding agent a bounded question about a private repository",
    "description": AGENT_DESCRIPTION,
    "inputSchema": {
        "type": "object",
        "properties": {
            "repo": TOOLS[0]["inputSchema"]["properties"]["repo"],
            "schema": SCHEMA_ARGUMENT,
            "task": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_TASK_BYTES,
                "description": "The task for the agent, plain UTF-8 text (at most the run's"
                " maxTaskBytes, see the skill); say which schema value means what.",
            },
        },
        "required": ["repo", "schema", "task"],
        "additionalProperties": False,
    },
    "outputSchema": TOOLS[0]["outputSchema"],
    "annotations": {
        "title": "Ask a bounded agent",
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": False,
        "openWorldHint": False,
    },
}

#: Listed after :data:`RESOURCES` while the bounded-agent subsystem is enabled.
AGENT_RESOURCE: dict[str, Any] = {
    "uri": AGENT_SKILL_URI,
    "name": "SKILL.md",
    "title": "Bounded agents: repositories, budgets, the provider caveat, examples",
    "mimeType": "text/markdown",
}


# --------------------------------------------------------------------------
# 2. Framing: newline-delimited lines with a size cap


class LineReader:
    """Split a byte stream into lines without ever holding more than the cap.

    ``feed`` returns the complete lines (without the newline) and, for each
    line over ``limit`` bytes, ``None`` once; the rest of that line is
    discarded as it arrives.
    """

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            if not self._discarding:
                self._buffer += data[start:end]
                if len(self._buffer) > self._limit:
                    out.append(None)
                    self._buffer = bytearray()
                    self._discarding = True
            if newline < 0:
                break
            if not self._discarding:
                out.append(bytes(self._buffer))
            self._buffer = bytearray()
            self._discarding = False
            start = newline + 1
        return out

    def finish(self) -> list[bytes | None]:
        """End of input: a last line without its newline still counts."""
        rest = bytes(self._buffer)
        self._buffer = bytearray()
        if self._discarding or not rest:
            return []
        return [rest]


# --------------------------------------------------------------------------
# 3. Messages


class RpcError(Exception):
    """A JSON-RPC error to answer with (the caller's fault unless INTERNAL_ERROR)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def _reject_constant(name: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


class NumberText:
    """A JSON number token that is not a short plain integer, kept as its text.

    The protocol's own parser does the same (``NumberToken``): such a token
    is never an integer of the schema language, so it is never turned into a
    Python number here either. A ``schema`` object is then sent with the
    token exactly as the client wrote it (``1e400`` stays ``1e400``, not
    ``Infinity``; ``1.0`` stays ``1.0``), and no line can make ``int()``
    convert thousands of digits.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


#: Longest integer token (sign included) that becomes a Python ``int``:
#: ids and schema bounds are far shorter (a schema integer has at most 16
#: digits); a longer one is kept as :class:`NumberText`.
MAX_INT_TOKEN_CHARS = 64


def _parse_int(text: str) -> Any:
    return int(text) if len(text) <= MAX_INT_TOKEN_CHARS else NumberText(text)


class RepeatedKeys(dict):  # type: ignore[type-arg]
    """A JSON object that named a key twice: the dict (the last value wins, as
    in ``json``) plus every pair in the order sent.

    The broker refuses a schema with a repeated key; keeping the pairs lets a
    ``schema`` object be sent as written, so it is refused the same way.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    return obj if len(obj) == len(pairs) else RepeatedKeys(pairs)


def decode_line(text: str) -> Any:
    """Parse one protocol line: plain JSON, plus :class:`NumberText` and
    :class:`RepeatedKeys` where the value must be kept as sent.

    Raises:
        ValueError: not JSON (NaN and Infinity included); RecursionError:
            nested too deep to parse.
    """
    return json.loads(
        text,
        parse_constant=_reject_constant,
        parse_int=_parse_int,
        parse_float=NumberText,
        object_pairs_hook=_object,
    )


def compact_json(value: Any) -> str:
    """The compact JSON text of a parsed value, written as it was sent.

    No whitespace; keys in the order given, a repeated key repeated; strings
    as UTF-8 text (only ``"``, ``\\`` and C0 controls escaped), so a lone
    surrogate stays a lone surrogate and fails the later UTF-8 encoding;
    integers with all their digits and other number tokens as sent. The walk
    uses an explicit stack: any depth the line parser accepted is written
    (the size and depth limits are the judge's, afterwards).
    """
    out: list[str] = []
    # (True, text to write) or (False, value to serialize), popped from the end.
    stack: list[tuple[bool, Any]] = [(False, value)]
    while stack:
        literal, item = stack.pop()
        if literal:
            out.append(item)
        elif item is None:
            out.append("null")
        elif item is True:
            out.append("true")
        elif item is False:
            out.append("false")
        elif isinstance(item, str):
            out.append(json.dumps(item, ensure_ascii=False))
        elif isinstance(item, int):
            out.append(str(item))
        elif isinstance(item, NumberText):
            out.append(item.text)
        elif isinstance(item, dict):
            pairs = item.pairs if isinstance(item, RepeatedKeys) else list(item.items())
            stack.append((True, "}"))
            for index in range(len(pairs) - 1, -1, -1):
                key, sub = pairs[index]
                stack.append((False, sub))
                stack.append(
                    (True, ("," if index else "") + json.dumps(key, ensure_ascii=False) + ":")
                )
            stack.append((True, "{"))
        elif isinstance(item, list):
            stack.append((True, "]"))
            for index in range(len(item) - 1, -1, -1):
                stack.append((False, item[index]))
                if index:
                    stack.append((True, ","))
            stack.append((True, "["))
        else:  # pragma: no cover - decode_line builds nothing else
            raise TypeError("not a parsed JSON value: " + type(item).__name__)
    return "".join(out)


def encode(message: dict[str, Any]) -> bytes:
    """One protocol line: compact ASCII JSON (no raw newline can appear) plus ``\\n``."""
    return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def error_response(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return encode({"jsonrpc": "2.0", "id": request_id, "error": error})


def result_response(request_id: Any, result: dict[str, Any]) -> bytes:
    return encode({"jsonrpc": "2.0", "id": request_id, "result": result})


def _valid_id(value: Any) -> bool:
    """MCP ids are strings or integers (never null, never a float or a bool)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


# --------------------------------------------------------------------------
# 4. Tools (the work is injected: the real one calls the sibling modules)


def _tool_result(text: str, modern: bool) -> dict[str, Any]:
    """A ``tools/call`` result whose structured content is the JSON ``text``."""
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": text}],
        "structuredContent": json.loads(text),
        "isError": False,
    }
    if modern:
        result["resultType"] = "complete"
    return result


def _arguments(arguments: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Check ``arguments`` against a closed input schema's property names.

    Raises:
        RpcError: INVALID_PARAMS for a non-object, a name given twice, or a
            missing or extra argument.
    """
    if not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "arguments must be an object")
    if isinstance(arguments, RepeatedKeys):
        raise RpcError(INVALID_PARAMS, "arguments must not name an argument twice")
    if set(arguments) != set(names):
        raise RpcError(INVALID_PARAMS, "arguments must be exactly: " + ", ".join(names))
    return arguments


def _string_arg(arguments: dict[str, Any], name: str, low: int, high: int) -> str:
    """A string argument of ``low..high`` characters.

    Raises:
        RpcError: INVALID_PARAMS for a non-string or a length out of bounds.
    """
    value = arguments[name]
    if not isinstance(value, str):
        raise RpcError(INVALID_PARAMS, "argument " + name + " must be a string")
    if not low <= len(value) <= high:
        raise RpcError(INVALID_PARAMS, "argument " + name + " has a length out of bounds")
    return value


def schema_argument(value: Any) -> bytes | None:
    """The bytes a ``schema`` argument is sent and judged as (:data:`SCHEMA_ARGUMENT`).

    JSON text is sent as its own UTF-8 bytes, exactly as ``--schema`` and
    the header form take it. An object is sent as :func:`compact_json` of
    it in UTF-8: the bytes a careful client would put in the header, and
    the fewest any serialization has, so the object form is never refused
    for size where its text would fit. From there both forms take the same
    path: the wrapper's size check (4096 bytes, else the canonical error
    without the broker) and the broker's strict parser (depth, repeated
    keys, integer tokens, lone surrogate escapes) and charge; the cost tool
    judges the same bytes with the same code. None: the value has a lone
    surrogate, so it has no UTF-8 bytes (never sent).

    Raises:
        RpcError: INVALID_PARAMS for another JSON type, or text of a length
            outside the declared bounds.
    """
    if isinstance(value, dict):
        return _utf8(compact_json(value))
    if not isinstance(value, str):
        raise RpcError(INVALID_PARAMS, "argument schema must be a JSON object or JSON text")
    if not 1 <= len(value) <= MAX_SCHEMA_BYTES:
        raise RpcError(INVALID_PARAMS, "argument schema has a length out of bounds")
    return _utf8(value)


def _utf8(value: str) -> bytes | None:
    try:
        return value.encode("utf-8", "strict")
    except UnicodeEncodeError:  # a lone surrogate from a \\ud800 escape
        return None


# --------------------------------------------------------------------------
# 5. The session: era state machine and dispatch

NEW = "new"
LEGACY = "legacy"
MODERN = "modern"


class Deferred:
    """A response computed later, off the reading thread."""

    __slots__ = ("finish", "work")

    def __init__(self, work: Callable[[], str], finish: Callable[[str], bytes]) -> None:
        self.work = work
        self.finish = finish


#: What the session answers a line with: ``bytes`` (a line to write), a
#: ``Deferred`` or ``None`` (no answer).
Outcome = object


class AgentBinding:
    """The bounded-agent subsystem as a session sees it: ``call(repo,
    schema_bytes, task_bytes)`` returns the canonical body text,
    ``read_skill()`` the agent skill's text."""

    __slots__ = ("call", "read_skill")

    def __init__(self, call: AgentFn, read_skill: Callable[[], str]) -> None:
        self.call = call
        self.read_skill = read_skill


class Session:
    """One connection's protocol state (sans-I/O: lines in, lines or work out).

    ``query(repo, schema_bytes, script_bytes)`` returns the canonical body
    text; ``cost(schema_bytes)`` the cost report JSON text; ``read_skill()``
    the skill text; ``agent`` the bounded-agent subsystem, or None when it is
    not enabled (then ``bounded_agent`` is neither listed nor callable).
    Each is injected so the protocol core is tested with fakes and the I/O
    layer binds the real sibling modules.
    """

    def __init__(
        self,
        query: QueryFn,
        cost: CostFn,
        read_skill: Callable[[], str],
        agent: AgentBinding | None = None,
    ) -> None:
        self.era = NEW
        self.version: str | None = None
        self._query = query
        self._cost = cost
        self._read_skill = read_skill
        self._agent = agent

    def _instructions(self) -> str:
        return INSTRUCTIONS + (AGENT_INSTRUCTIONS if self._agent is not None else "")

    # -- entry point ------------------------------------------------------

    def handle_line(self, line: bytes | None) -> Outcome:
        """Answer one input line (``None``: a line over the size cap)."""
        if line is None:
            return error_response(None, INVALID_REQUEST, "Invalid Request: message too large")
        if not line.strip():
            return None
        try:
            message = decode_line(line.decode("utf-8", "strict"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return error_response(None, PARSE_ERROR, "Parse error")
        try:
            return self.handle_message(message)
        except RpcError as exc:  # pragma: no cover - handle_message answers its own
            return error_response(None, exc.code, exc.message, exc.data)

    def handle_message(self, message: Any) -> Outcome:
        if not isinstance(message, dict):
            return error_response(None, INVALID_REQUEST, "Invalid Request")
        has_id = "id" in message
        request_id = message.get("id")
        if "method" not in message:
            if has_id and ("result" in message or "error" in message):
                return None  # a response: we never send requests, so nothing to match
            reply_id = request_id if _valid_id(request_id) else None
            return error_response(reply_id, INVALID_REQUEST, "Invalid Request")
        method = message["method"]
        if not has_id:
            return None  # a notification (initialized, cancelled, ...): never answered
        if not _valid_id(request_id):
            return error_response(None, INVALID_REQUEST, "Invalid Request: bad id")
        if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return error_response(request_id, INVALID_REQUEST, "Invalid Request")
        params = message.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return error_response(request_id, INVALID_PARAMS, "params must be an object")
        try:
            return self._route(request_id, method, params)
        except RpcError as exc:
            return error_response(request_id, exc.code, exc.message, exc.data)
        except Exception:  # a bug: the generic error, and the server goes on
            return error_response(request_id, INTERNAL_ERROR, "Internal error")

    # -- era table ----------------------------------------------------------

    def _route(self, request_id: Any, method: str, params: dict[str, Any]) -> Outcome:
        """The era table.

        ===========  =============  ==============  ===================
        state        initialize     enveloped (*)   plain request
        ===========  =============  ==============  ===================
        new          -> legacy      -> modern       -32600 (ping ok)
        legacy       -32600         -32600          served
        modern       -32022         served          -32602 (ping ok)
        ===========  =============  ==============  ===================

        (*) ``params._meta`` has the protocol-version key, or the method is
        ``server/discover`` (which requires the envelope). An enveloped
        request whose envelope is refused does not change the state.
        """
        meta = params.get("_meta")
        enveloped = method == "server/discover" or (
            isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta
        )
        if method == "initialize":
            if self.era == LEGACY:
                raise RpcError(INVALID_REQUEST, "Invalid Request: already initialized")
            if self.era == MODERN:
                requested = params.get("protocolVersion")
                data: dict[str, Any] = {"supported": list(MODERN_VERSIONS)}
                if isinstance(requested, str):
                    data["requested"] = requested
                raise RpcError(
                    UNSUPPORTED_PROTOCOL_VERSION,
                    "this connection serves the stateless protocol; initialize is not accepted",
                    data,
                )
            result = self._initialize(params)
            self.era = LEGACY
            return result_response(request_id, result)
        if enveloped:
            if self.era == LEGACY:
                raise RpcError(
                    INVALID_REQUEST,
                    "Invalid Request: this connection serves the handshake protocol",
                )
            self.version = self._check_envelope(meta)
            self.era = MODERN
            return self._serve(request_id, method, params, modern=True)
        if method == "ping":
            return result_response(request_id, self._complete({}, self.era == MODERN))
        if self.era == NEW:
            raise RpcError(INVALID_REQUEST, "Invalid Request: initialize first")
        if self.era == MODERN:
            self._check_envelope(meta)  # raises: the envelope is missing
        return self._serve(request_id, method, params, modern=False)

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            raise RpcError(INVALID_PARAMS, "initialize needs a protocolVersion string")
        if not isinstance(params.get("capabilities", {}), dict):
            raise RpcError(INVALID_PARAMS, "capabilities must be an object")
        version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
        self.version = version
        return {
            "protocolVersion": version,
            "capabilities": self._capabilities(),
            "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
            "instructions": self._instructions(),
        }

    @staticmethod
    def _capabilities() -> dict[str, Any]:
        return {"tools": {"listChanged": False}, "resources": {"listChanged": False}}

    @staticmethod
    def _check_envelope(meta: Any) -> str:
        """The 2026-07-28 per-request envelope; returns its protocol version.

        Raises:
            RpcError: INVALID_PARAMS for a missing or malformed envelope,
                UNSUPPORTED_PROTOCOL_VERSION naming what we serve.
        """
        if not isinstance(meta, dict):
            raise RpcError(INVALID_PARAMS, "params._meta must carry the request envelope")
        missing = [k for k in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if k not in meta]
        if missing:
            raise RpcError(INVALID_PARAMS, "params._meta is missing: " + ", ".join(missing))
        version = meta[PROTOCOL_VERSION_KEY]
        if not isinstance(version, str) or not isinstance(meta[CLIENT_CAPABILITIES_KEY], dict):
            raise RpcError(INVALID_PARAMS, "malformed request envelope")
        if version not in MODERN_VERSIONS:
            raise RpcError(
                UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version",
                {"supported": list(MODERN_VERSIONS), "requested": version},
            )
        return version

    @staticmethod
    def _complete(
        result: dict[str, Any], modern: bool, cache: tuple[str, int] | None = None
    ) -> dict[str, Any]:
        """Add the stateless era's ``resultType`` (and cache hints) to a result."""
        if modern:
            result["resultType"] = "complete"
            if cache is not None:
                result["cacheScope"], result["ttlMs"] = cache
        return result

    # -- methods ----------------------------------------------------------

    def _serve(self, request_id: Any, method: str, params: dict[str, Any], modern: bool) -> Outcome:
        if method == "server/discover":
            result: dict[str, Any] = {
                "supportedVersions": list(MODERN_VERSIONS),
                "capabilities": self._capabilities(),
                "instructions": self._instructions(),
                "_meta": {SERVER_INFO_KEY: {"name": SERVER_NAME, "version": SERVER_VERSION}},
            }
            return result_response(
                request_id, self._complete(result, True, ("public", STATIC_TTL_MS))
            )
        if method == "ping":
            return result_response(request_id, self._complete({}, modern))
        if method == "tools/list":
            listed = TOOLS if self._agent is None else (*TOOLS, AGENT_TOOL)
            tools = {"tools": [dict(tool) for tool in listed]}
            return result_response(
                request_id, self._complete(tools, modern, ("public", STATIC_TTL_MS))
            )
        if method == "resources/list":
            shown = RESOURCES if self._agent is None else (*RESOURCES, AGENT_RESOURCE)
            listing = {"resources": [dict(r) for r in shown]}
            return result_response(
                request_id, self._complete(listing, modern, ("public", STATIC_TTL_MS))
            )
        if method == "resources/templates/list":
            templates: dict[str, Any] = {"resourceTemplates": []}
            return result_response(
                request_id, self._complete(templates, modern, ("public", STATIC_TTL_MS))
            )
        if method == "resources/read":
            return result_response(request_id, self._read_resource(params, modern))
        if method == "tools/call":
            return self._call_tool(request_id, params, modern)
        raise RpcError(METHOD_NOT_FOUND, "Method not found")

    def _read_resource(self, params: dict[str, Any], modern: bool) -> dict[str, Any]:
        uri = params.get("uri")
        if uri == SKILL_URI:
            read = self._read_skill
        elif uri == AGENT_SKILL_URI and self._agent is not None:
            read = self._agent.read_skill
        else:
            raise RpcError(INVALID_PARAMS, "Resource not found")
        try:
            text = read()
        except Exception:
            raise RpcError(INTERNAL_ERROR, "the skill file is not available") from None
        contents = {"contents": [{"uri": uri, "mimeType": "text/markdown", "text": text}]}
        return self._complete(contents, modern, ("private", 0))

    def _call_tool(self, request_id: Any, params: dict[str, Any], modern: bool) -> Outcome:
        name = params.get("name")
        arguments = params.get("arguments", {})
        if name == "bounded_query_cost":
            args = _arguments(arguments, ("schema",))
            schema = schema_argument(args["schema"])
            if schema is None:
                raise RpcError(INVALID_PARAMS, "argument schema is not valid Unicode")
            try:
                report = self._cost(schema)
            except Exception:
                raise RpcError(INTERNAL_ERROR, "the protocol module is not available") from None
            return result_response(request_id, _tool_result(report, modern))
        if name == "bounded_query":
            return self._forward(request_id, arguments, modern, "script", self._query)
        if name == "bounded_agent" and self._agent is not None:
            return self._forward(request_id, arguments, modern, "task", self._agent.call)
        raise RpcError(INVALID_PARAMS, "Unknown tool")

    def _forward(
        self, request_id: Any, arguments: Any, modern: bool, body: str, send: QueryFn
    ) -> Outcome:
        """``bounded_query`` (body ``script``) or ``bounded_agent`` (body ``task``):
        the closed arguments checked here, the call deferred to ``send`` (the
        wrapper's ``run`` for that program, which makes the byte checks)."""
        args = _arguments(arguments, ("repo", "schema", body))
        repo = _string_arg(args, "repo", 3, MAX_REPO_CHARS)
        schema_bytes = schema_argument(args["schema"])
        limit = MAX_SCRIPT_BYTES if body == "script" else MAX_TASK_BYTES
        body_bytes = _utf8(_string_arg(args, body, 1, limit))

        def work() -> str:
            if schema_bytes is None or body_bytes is None:
                return _CANONICAL_ERROR  # not representable as UTF-8: never sent
            return send(repo, schema_bytes, body_bytes)

        def finish(text: str) -> bytes:
            return result_response(request_id, _tool_result(text, modern))

        return Deferred(work, finish)


# --------------------------------------------------------------------------
# 6. The sibling modules (the wrapper's transport, the cost tool)


def _load_sibling(module_name: str, filenames: tuple[str, ...]) -> ModuleType | None:
    """Import a sibling by file (the harness's copies have no ``.py``); None if absent."""
    directory = os.path.dirname(os.path.abspath(__file__))
    for filename in filenames:
        path = os.path.join(directory, filename)
        if not os.path.isfile(path):
            continue
        loaded = sys.modules.get(module_name)
        if loaded is not None and getattr(loaded, "__file__", None) == path:
            return loaded
        loader = importlib.machinery.SourceFileLoader(module_name, path)
        spec = importlib.util.spec_from_loader(module_name, loader)
        if spec is None:  # pragma: no cover - a loader was given
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        return module
    return None


def load_wrapper() -> ModuleType:
    """The wrapper module next to this file (installed as ``bounded-query`` in the
    query ingress, as ``bounded-agent`` in the agent ingress: one file), else the
    installed one."""
    sibling = _load_sibling(
        "_bq_mcp_wrapper", ("bounded-query", "bounded-agent", "bounded_query_cli.py")
    )
    if sibling is not None:
        return sibling
    # Only the installed console script gets here (the copies have siblings).
    from bounded_query.wrapper import bounded_query_cli

    return bounded_query_cli


def load_cost_tool() -> ModuleType:
    """The ``bounded-query-cost`` module next to this file (loads the protocol package)."""
    sibling = _load_sibling("_bq_mcp_cost", ("bounded-query-cost", "bounded_query_cost.py"))
    if sibling is not None:
        return sibling
    from bounded_query.wrapper import bounded_query_cost

    return bounded_query_cost


def real_query(env: dict[str, str], program: str = "bounded-query") -> QueryFn:
    """``bounded_query`` (or, with ``program`` ``bounded-agent``, ``bounded_agent``)
    through the wrapper's own ``run``: the same checks, the same bytes, the
    same limits (the wrapper's directory's ``bq_protocol`` and, for the agent,
    ``bounded-agent.json``)."""
    try:
        wrapper: Any = load_wrapper()
    except Exception:
        wrapper = None

    def query(repo: str, schema: bytes, body: bytes) -> str:
        if wrapper is None:
            return _CANONICAL_ERROR
        # The wrapper takes argv as decoded by Python; surrogateescape gives
        # back exactly these bytes in its os.fsencode.
        argv = ["--repo", repo, "--schema", schema.decode("utf-8", "surrogateescape")]
        line = wrapper.run(argv, io.BytesIO(body), dict(env), program)
        text: str = line.decode("utf-8", "strict")
        return text

    return query


def real_agent(env: dict[str, str]) -> AgentBinding | None:
    """The bounded-agent subsystem, or None when its socket variable is not set."""
    if not env.get(AGENT_SOCKET_ENV):
        return None
    return AgentBinding(real_query(env, "bounded-agent"), real_skill(env, AGENT_SKILL_ENV))


def real_cost(schema: bytes) -> str:
    """The cost tool's ``--json`` report for ``schema``, without its newline."""
    tool: Any = load_cost_tool()
    protocol = tool.load_protocol()
    report: str = tool.render(tool.assess(schema, protocol), protocol, True)
    return report.rstrip("\n")


def real_skill(env: dict[str, str], variable: str = SKILL_ENV) -> Callable[[], str]:
    """Read the skill file named by ``variable`` (on each read, capped)."""

    def read_skill() -> str:
        path = env.get(variable, "")
        if not path:
            raise FileNotFoundError(variable + " is not set")
        with open(path, "rb") as handle:
            data = handle.read(MAX_SKILL_BYTES + 1)
        if len(data) > MAX_SKILL_BYTES:
            raise ValueError("skill file too large")
        return data.decode("utf-8", "strict")

    return read_skill


# --------------------------------------------------------------------------
# 7. I/O


class Writer:
    """Serialized whole-line writes to the private protocol fd."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self.closed = False

    def write(self, line: bytes) -> None:
        with self._lock:
            if self.closed:
                return
            view = memoryview(line)
            try:
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
            except OSError:  # the client went away
                self.closed = True


def _run_deferred(job: Deferred, writer: Writer, slots: threading.BoundedSemaphore) -> None:
    """Do one deferred call; any failure (a bug included) is the canonical error."""
    try:
        try:
            line = job.finish(job.work())
        except Exception:
            line = job.finish(_CANONICAL_ERROR)
        writer.write(line)
    finally:
        slots.release()


def serve(in_fd: int, writer: Writer, session: Session) -> None:
    """Read lines from ``in_fd`` until EOF and answer each one."""
    reader = LineReader()
    slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
    threads: list[threading.Thread] = []
    while not writer.closed:
        try:
            chunk = os.read(in_fd, _READ_CHUNK)
        except InterruptedError:  # pragma: no cover - retried by Python since 3.5
            continue
        lines = reader.feed(chunk) if chunk else reader.finish()
        for line in lines:
            outcome = session.handle_line(line)
            if isinstance(outcome, bytes):
                writer.write(outcome)
            elif isinstance(outcome, Deferred):
                if slots.acquire(blocking=False):
                    thread = threading.Thread(
                        target=_run_deferred, args=(outcome, writer, slots), daemon=True
                    )
                    thread.start()
                    threads = [t for t in threads if t.is_alive()]
                    threads.append(thread)
                else:  # too many in flight: what the broker's own cap would answer
                    writer.write(outcome.finish(_CANONICAL_ERROR))
        if not chunk:
            break
    for thread in threads:  # EOF: answer what is in flight, then exit
        thread.join()


def _silence_std_streams() -> int:
    """Keep a private duplicate of stdout for the protocol; point fd 1 and 2 at /dev/null."""
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - process lifetime
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - process lifetime
    return out_fd


def main() -> int:
    """Console-script entry point: serve stdio until EOF; exit 0."""
    try:
        out_fd = _silence_std_streams()
    except OSError:
        return 0
    env = dict(os.environ)
    session = Session(real_query(env), real_cost, real_skill(env), real_agent(env))
    try:
        serve(0, Writer(out_fd), session)
    except BaseException:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
