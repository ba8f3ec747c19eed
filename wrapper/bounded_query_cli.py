#!/bin/sh
"""exec" python3 -I "$0" "$@"
``bounded-query`` and ``bounded-agent``: the agent's clients for the two brokers
(spec 14.8 protocol v2; spec 15.3 and 15.8, agent frame v1).

One file, two programs: the harness installs it as ``bounded-query`` (in the
query ingress) and as ``bounded-agent`` (in the agent ingress), and the name
it is run under picks the program (:func:`program_for`; any other name is
``bounded-query``). Usage (the only accepted shape; the two options may come
in either order)::

    bounded-query --repo OWNER/REPO --schema 'SCHEMA_JSON' < query.py
    bounded-agent --repo OWNER/REPO --schema 'SCHEMA_JSON' < task.txt

Contract (spec 14.8, 15.8): each prints exactly one canonical JSON line on
stdout -- ``{"status":"ok","result":...}`` or ``{"status":"error"}`` -- writes
nothing on stderr and exits 0, for both outcomes and for every failure (bad
arguments, a missing socket, a broker that hangs past the deadline or dies
mid-response, a broken installation, an internal bug).

Theory of operation (the two programs differ only in their :class:`Program`:
the socket variable, the version header, the body's limit and whether it must
be UTF-8; everything else is one code path):

1. ``parse_argv`` enforces the fixed CLI shape locally: exactly ``--repo X``
   once and ``--schema JSON`` once as separate argv items. Any other option,
   the ``--flag=value`` form, positionals, repetitions, a schema that is empty,
   not UTF-8 or over ``MAX_SCHEMA_BYTES``, and a repository that is not a
   plausible slug are rejected without contacting the broker. The wrapper does
   not validate the schema's structure or charge: that is the trusted broker's
   job, and ``bounded-query-cost`` shows it to the agent beforehand.
2. The body is read from stdin (a terminal on stdin is an error) as raw bytes,
   non-empty and capped: a query script at ``MAX_SCRIPT_BYTES``, sent
   unmodified; a task at the run's ``maxTaskBytes`` (:func:`agent_task_limit`)
   and strict UTF-8 too, sent verbatim. A local refusal spends nothing and,
   unlike a broker refusal, does not count toward ``maxInvocations``.
3. ``build_request`` / ``build_agent_request`` frame ``POST /query``
   (HTTP/1.1); the schema travels as canonical base64url (no padding) of its
   raw UTF-8 bytes in ``X-AWF-Schema-B64``.
4. ``exchange`` talks to the program's socket variable
   (``$AWF_BOUNDED_QUERY_SOCKET`` or ``$AWF_BOUNDED_AGENT_SOCKET``) under one
   total deadline (``DEADLINE_SECONDS``: the 600 s timing bucket plus a margin).
5. ``parse_response`` reads the HTTP response minimally but strictly (status
   200, no transfer coding, a Content-Length-framed or close-delimited body of
   bounded size) and ``canonical_body`` passes through only the two canonical
   shapes, byte for byte. Anything else becomes ``{"status":"error"}``.

The protocol's facts (the canonical error body, the schema, script and slug
limits, both frames' versions, the socket variables, the task bound) are not restated
here: :func:`load_facts` reads them from the ``bq_protocol/`` copy of the
broker's protocol package that the harness installs next to this file (only
its two dependency-free modules, ``_constants.py`` and ``policy.py``, so the
start-up cost stays a few milliseconds), or from ``../broker/protocol/`` (the
source tree and the installed package). Without either the answer is the
canonical error: :data:`CANONICAL_ERROR` is the one fact this file must know
by itself, to say that much. The run's ``maxTaskBytes`` comes from
``bounded-agent.json`` next to this file (:func:`encode_agent_limits`, written
by the harness); where there is none (the console script, a copy in another
ingress) the spec's upper bound applies. Either way the broker stays the
authority: these checks only save the agent a wasted request.

This file is deliberately one stdlib-only module that runs on Python >= 3.8:
the harness copies it verbatim into the agent's wrapper directories. Keep it
free of 3.9+ syntax and APIs.

Isolated interpreter: executed directly, the file is a ``/bin/sh`` script
whose first command is line 2, ``exec python3 -I "$0" "$@"`` (to the shell,
the quotes before ``exec`` are empty strings); Python reads the same line as
the start of this docstring. ``-I`` ignores every ``PYTHON*`` variable, the
user site directory and the script's own directory, so nothing the agent's
environment holds (``PYTHONWARNINGS``, ``PYTHONPATH``, ``PYTHONSTARTUP``,
``PYTHONINSPECT``, ...) can write to stderr or run code before ``main()``.
A ``#!/usr/bin/env -S python3 -I`` line would need GNU env 8.30+ (busybox has
no ``-S``); this needs only ``/bin/sh`` and a ``python3`` on PATH.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import socket
import stat
import sys
import time
from types import ModuleType
from typing import Any

__all__ = [
    "AGENT_LIMITS_FILE",
    "AGENT_PROGRAM",
    "CANONICAL_ERROR",
    "DEADLINE_SECONDS",
    "QUERY_PROGRAM",
    "TEST_DEADLINE_ENV",
    "Facts",
    "InstallationError",
    "Program",
    "UsageError",
    "agent_main",
    "agent_task_limit",
    "build_agent_request",
    "build_request",
    "canonical_body",
    "decode_agent_limits",
    "encode_agent_limits",
    "load_facts",
    "main",
    "parse_argv",
    "parse_response",
    "program_for",
    "read_body",
    "run",
]

#: The line printed for every failure (spec 14.4), without the newline: the
#: last resort when the protocol's own ``CANONICAL_ERROR_BODY`` cannot be
#: loaded (a broken installation). Tests tie the two together.
CANONICAL_ERROR = b'{"status":"error"}'

#: The names the harness installs this file under (one per subsystem).
QUERY_PROGRAM = "bounded-query"
AGENT_PROGRAM = "bounded-agent"

#: The harness's ``maxTaskBytes`` for the agent (:func:`encode_agent_limits`),
#: next to the installed ``bounded-agent``.
AGENT_LIMITS_FILE = "bounded-agent.json"
AGENT_LIMITS_VERSION = 1
#: The limits document is a few dozen bytes; anything larger is not ours.
MAX_AGENT_LIMITS_BYTES = 4096

#: The directory name the harness gives its verbatim copy of broker/protocol/.
SIBLING_PACKAGE = "bq_protocol"

#: TEST-ONLY: a shorter total deadline in seconds, so tests of a hanging broker
#: finish quickly. It can only shorten ``DEADLINE_SECONDS``, never extend it;
#: the harness never sets it and agents have no reason to.
TEST_DEADLINE_ENV = "BOUNDED_QUERY_WRAPPER_TEST_DEADLINE"

#: The broker answers at the latest at the 600 s timing bucket (14.3.1); the
#: extra minute covers connection set-up, queueing behind the serialized lane's
#: in-flight invocation tail and scheduling slack. Past it, the broker is
#: considered dead and the answer is the canonical error.
DEADLINE_SECONDS = 660.0

#: The broker's response head is a handful of short fixed headers.
MAX_RESPONSE_HEAD_BYTES = 16 * 1024

#: The ok envelope wraps a result that came from a result file capped at
#: 8 KiB (re-serialization never grows it); anything far larger is not ours.
MAX_RESPONSE_BODY_BYTES = 64 * 1024

#: A result nests at most six containers (a schema's root is depth 0 and only
#: the six levels above its leaves can be containers; a union's tag/value
#: object is its one level), inside the envelope; deeper JSON is hostile and
#: must not reach recursion.
MAX_RESULT_DEPTH = 64

_RECV_CHUNK = 16 * 1024
_OK_PREFIX = b'{"status":"ok","result":'


class UsageError(ValueError):
    """The caller's arguments or input break the fixed CLI shape (caller's fault)."""


class ResponseError(ValueError):
    """The broker's response is not one we may pass through (broker's fault)."""


class InstallationError(RuntimeError):
    """The protocol facts or the agent limits are missing or malformed (the installer's fault)."""


# --------------------------------------------------------------------------
# 0. The protocol's facts, from the shipped copy of the broker's protocol package


class Facts:
    """What the wrapper needs of the broker's protocol package, read from it.

    ``constants`` is ``_constants.py`` and ``policy`` is ``policy.py`` of that
    package (both standard-library only and Python 3.8 clean), loaded as
    standalone modules from ``directory``.
    """

    def __init__(self, directory: str, constants: ModuleType, policy: ModuleType) -> None:
        self.directory = directory
        c: Any = constants
        p: Any = policy
        self.canonical_error = bytes(c.CANONICAL_ERROR_BODY)
        self.max_schema_bytes = int(c.MAX_SCHEMA_BYTES)
        self.max_script_bytes = int(c.MAX_SCRIPT_BYTES)
        self.max_slug_chars = int(c.MAX_SLUG_CHARS)
        self.query_version = int(c.PROTOCOL_VERSION)
        self.query_socket_env = str(p.ENV_SOCKET)
        self.agent_socket_env = str(p.ENV_AGENT_SOCKET)
        self.max_task_bytes = int(p.ENCLAVE_MAX_TASK_BYTES)
        self.agent_version = int(p.AGENT_PROTOCOL_VERSION)


def _load_file(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InstallationError("cannot load " + path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def protocol_dirs(here: str) -> list[str]:
    """Where the protocol package may be, in order: the harness's ``bq_protocol/``
    sibling, then ``../broker/protocol`` (the source tree, the installed package)."""
    return [
        os.path.join(here, SIBLING_PACKAGE),
        os.path.join(os.path.dirname(here), "broker", "protocol"),
    ]


_FACTS: dict[str, Facts] = {}


def load_facts(here: str | None = None) -> Facts:
    """The protocol facts for the wrapper installed in ``here`` (default: this
    file's directory, symlinks not resolved); loaded once per directory.

    Raises:
        InstallationError: no protocol package, or one missing a fact
            (then the only possible answer is the canonical error).
    """
    directory = os.path.abspath(here if here is not None else os.path.dirname(__file__))
    cached = _FACTS.get(directory)
    if cached is not None:
        return cached
    for candidate in protocol_dirs(directory):
        constants = os.path.join(candidate, "_constants.py")
        policy = os.path.join(candidate, "policy.py")
        if os.path.isfile(constants) and os.path.isfile(policy):
            try:
                facts = Facts(
                    candidate,
                    _load_file("_bq_wrapper_constants", constants),
                    _load_file("_bq_wrapper_policy", policy),
                )
            except (AttributeError, TypeError, ValueError) as exc:
                raise InstallationError("protocol package lacks a fact: " + str(exc)) from None
            _FACTS[directory] = facts
            return facts
    raise InstallationError("no protocol package next to " + directory)


def encode_agent_limits(max_task_bytes: int) -> bytes:
    """The ``bounded-agent.json`` document: ``{"version":1,"maxTaskBytes":N}``.

    Written by the harness (the run's ``boundedAgents.maxTaskBytes``) next to
    the installed ``bounded-agent``; read back by :func:`decode_agent_limits`.

    Raises:
        ValueError: ``max_task_bytes`` is not a positive integer.
    """
    if isinstance(max_task_bytes, bool) or not isinstance(max_task_bytes, int):
        raise ValueError("maxTaskBytes must be an integer")
    if max_task_bytes < 1:
        raise ValueError("maxTaskBytes must be at least 1")
    doc = {"version": AGENT_LIMITS_VERSION, "maxTaskBytes": max_task_bytes}
    return json.dumps(doc, separators=(",", ":")).encode("ascii") + b"\n"


def decode_agent_limits(data: bytes, upper: int) -> int:
    """The ``maxTaskBytes`` of a ``bounded-agent.json`` document, at most ``upper``.

    Raises:
        InstallationError: anything but exactly the document
            :func:`encode_agent_limits` writes, with a value in ``1..upper``.
    """
    if len(data) > MAX_AGENT_LIMITS_BYTES:
        raise InstallationError(AGENT_LIMITS_FILE + ": too large")
    try:
        doc = json.loads(data.decode("utf-8", "strict"))
    except (UnicodeDecodeError, ValueError):
        raise InstallationError(AGENT_LIMITS_FILE + ": not JSON") from None
    if not isinstance(doc, dict) or sorted(doc) != ["maxTaskBytes", "version"]:
        raise InstallationError(AGENT_LIMITS_FILE + ": expected exactly version, maxTaskBytes")
    value = doc["maxTaskBytes"]
    if doc["version"] != AGENT_LIMITS_VERSION or type(value) is not int or not 1 <= value <= upper:
        raise InstallationError(AGENT_LIMITS_FILE + ": bad version or maxTaskBytes")
    return value


def agent_task_limit(here: str, upper: int) -> int:
    """The task limit: the harness's ``bounded-agent.json`` in ``here`` if there
    is one (it must be valid then), else ``upper`` (spec 15.2's bound).

    Raises:
        InstallationError: the file exists but is unreadable or malformed.
    """
    path = os.path.join(here, AGENT_LIMITS_FILE)
    # No symlink, and no blocking on a FIFO: only a regular file is read.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return upper
    except OSError:
        raise InstallationError(AGENT_LIMITS_FILE + ": cannot be opened") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InstallationError(AGENT_LIMITS_FILE + ": not a regular file")
        data = os.read(fd, MAX_AGENT_LIMITS_BYTES + 1)
    finally:
        os.close(fd)
    return decode_agent_limits(data, upper)


class Program:
    """What distinguishes the two clients; everything else is shared.

    ``version_header`` is the complete header line (without CRLF),
    ``body_limit`` the body's byte cap, ``utf8_body`` whether the body must be
    strict UTF-8 (a task is text; a script goes as raw bytes).
    """

    def __init__(
        self,
        name: str,
        socket_env: str,
        version_header: bytes,
        content_type: bytes,
        body_limit: int,
        utf8_body: bool,
    ) -> None:
        self.name = name
        self.socket_env = socket_env
        self.version_header = version_header
        self.content_type = content_type
        self.body_limit = body_limit
        self.utf8_body = utf8_body


def program_for(argv0: str) -> str:
    """The program a file run as ``argv0`` is: ``bounded-agent`` by that name,
    ``bounded-query`` by any other (its historical and source-file names)."""
    return AGENT_PROGRAM if os.path.basename(argv0) == AGENT_PROGRAM else QUERY_PROGRAM


def query_program(facts: Facts) -> Program:
    """``bounded-query``: protocol v2, the script as raw bytes (spec 14.3)."""
    return Program(
        QUERY_PROGRAM,
        facts.query_socket_env,
        b"X-AWF-Query-Version: " + str(facts.query_version).encode("ascii"),
        b"application/octet-stream",
        facts.max_script_bytes,
        False,
    )


def agent_program(facts: Facts, body_limit: int) -> Program:
    """``bounded-agent``: the agent frame, the task as UTF-8 text of at most
    ``body_limit`` bytes (spec 15.3)."""
    return Program(
        AGENT_PROGRAM,
        facts.agent_socket_env,
        b"X-AWF-Agent-Version: " + str(facts.agent_version).encode("ascii"),
        b"text/plain; charset=utf-8",
        body_limit,
        True,
    )


# --------------------------------------------------------------------------
# 1. The fixed CLI shape


def _is_plausible_repo(repo: str, max_chars: int) -> bool:
    """A cheap local plausibility check; the broker applies the exact slug rule.

    Printable ASCII without spaces (so no header injection), one slash with
    non-empty sides, at most ``max_chars`` characters.
    """
    if not 0 < len(repo) <= max_chars:
        return False
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in repo):
        return False
    owner, slash, name = repo.partition("/")
    return slash == "/" and owner != "" and name != "" and "/" not in name


def parse_argv(argv: list[str], facts: Facts | None = None) -> tuple[str, bytes]:
    """Check the fixed CLI shape (spec 14.8, 15.8) and return ``(repo, schema_bytes)``.

    ``argv`` excludes the program name. The schema is returned as the raw bytes
    the caller passed (argv is decoded by Python with surrogateescape, so
    ``os.fsencode`` recovers them exactly). ``facts`` default: :func:`load_facts`.

    Raises:
        UsageError: any other shape, a repeated or unknown flag, the
            ``--flag=value`` form, positionals, an empty, non-UTF-8 or
            oversize schema, or an implausible repository slug.
    """
    limits = facts if facts is not None else load_facts()
    if len(argv) != 4:
        raise UsageError("expected exactly --repo REPO --schema JSON")
    values: dict[str, str] = {}
    for flag, value in ((argv[0], argv[1]), (argv[2], argv[3])):
        if flag not in ("--repo", "--schema"):
            raise UsageError("unknown option or positional argument")
        if flag in values:
            raise UsageError("option given twice")
        values[flag] = value
    repo = values["--repo"]
    if not _is_plausible_repo(repo, limits.max_slug_chars):
        raise UsageError("repository is not an owner/repo slug")
    schema = os.fsencode(values["--schema"])
    if not 0 < len(schema) <= limits.max_schema_bytes:
        raise UsageError("schema is empty or over the size limit")
    try:
        schema.decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise UsageError("schema is not UTF-8") from None
    return repo, schema


def read_body(stream: object, limit: int, utf8: bool = False) -> bytes:
    """Read the script or task from stdin: raw bytes, non-empty, at most ``limit``
    (and strict UTF-8 when ``utf8``). At most ``limit + 1`` bytes are read.

    Raises:
        UsageError: no stdin, a terminal on stdin, an empty or oversize body,
            a body that is not UTF-8 where it must be.
    """
    if stream is None:
        raise UsageError("no stdin")
    isatty = getattr(stream, "isatty", None)
    if isatty is None or isatty():
        raise UsageError("the input must come on stdin, not from a terminal")
    buffer: Any = getattr(stream, "buffer", stream)
    chunks = []
    total = 0
    while total <= limit:
        chunk = buffer.read(limit + 1 - total)
        if not chunk:
            break
        chunks.append(bytes(chunk))
        total += len(chunk)
    body = b"".join(chunks)
    if not 0 < len(body) <= limit:
        raise UsageError("input is empty or over the size limit")
    if utf8:
        try:
            body.decode("utf-8", "strict")
        except UnicodeDecodeError:
            raise UsageError("input is not UTF-8") from None
    return body


# --------------------------------------------------------------------------
# 2. The request


def encode_schema(schema: bytes) -> bytes:
    """Canonical base64url of the schema's raw bytes, without padding."""
    return base64.urlsafe_b64encode(schema).rstrip(b"=")


def _frame(program: Program, repo: str, schema: bytes, body: bytes) -> bytes:
    head = (
        b"POST /query HTTP/1.1\r\n"
        b"Host: localhost\r\n" + program.version_header + b"\r\n"
        b"X-AWF-Repo: " + repo.encode("ascii") + b"\r\n"
        b"X-AWF-Schema-B64: " + encode_schema(schema) + b"\r\n"
        b"Content-Type: " + program.content_type + b"\r\n"
        b"Content-Length: " + str(len(body)).encode("ascii") + b"\r\n"
        b"Connection: close\r\n"
        b"\r\n"
    )
    return head + body


def build_request(repo: str, schema: bytes, script: bytes) -> bytes:
    """Frame the v2 query request (docs/architecture.md "Fixed interfaces") as exact bytes."""
    return _frame(query_program(load_facts()), repo, schema, script)


def build_agent_request(repo: str, schema: bytes, task: bytes) -> bytes:
    """Frame the v1 agent request (spec 15.3: ``X-AWF-Agent-Version: 1``, the
    repository, the schema header, the task as the body) as exact bytes."""
    facts = load_facts()
    return _frame(agent_program(facts, facts.max_task_bytes), repo, schema, task)


# --------------------------------------------------------------------------
# 3. The response


def _parse_head(head: bytes) -> int | None:
    """Check a response head; return its Content-Length, or None (close-delimited).

    Raises:
        ResponseError: not ``HTTP/1.x 200``, a transfer coding, folded or
            malformed header lines, a bad or conflicting Content-Length.
    """
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ", 2)
    if len(status) < 2 or status[0] not in (b"HTTP/1.1", b"HTTP/1.0") or status[1] != b"200":
        raise ResponseError("status is not 200")
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon != b":" or name == b"" or name != name.strip() or b"\n" in line:
            raise ResponseError("malformed header line")
        key = name.lower()
        value = value.strip(b" \t")
        if key == b"transfer-encoding":
            raise ResponseError("transfer codings are not accepted")
        if key == b"content-length":
            if not value.isdigit() or len(value) > 9:
                raise ResponseError("bad content-length")
            if length is not None and length != int(value):
                raise ResponseError("conflicting content-length")
            length = int(value)
    if length is not None and length > MAX_RESPONSE_BODY_BYTES:
        raise ResponseError("response body too large")
    return length


def parse_response(data: bytes, complete: bool) -> bytes | None:
    """Extract the body from the bytes received so far.

    ``complete`` says the peer closed the connection. Returns the body once it
    is fully framed, or None when more bytes are needed.

    Raises:
        ResponseError: a malformed, non-200, oversize or truncated response.
    """
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_RESPONSE_HEAD_BYTES or complete:
            raise ResponseError("incomplete or oversize response head")
        return None
    if end > MAX_RESPONSE_HEAD_BYTES:
        raise ResponseError("oversize response head")
    length = _parse_head(data[:end])
    body = data[end + 4 :]
    if length is None:
        if len(body) > MAX_RESPONSE_BODY_BYTES:
            raise ResponseError("response body too large")
        return body if complete else None
    if len(body) > length:
        raise ResponseError("bytes after the framed body")
    if len(body) == length:
        return body
    if complete:
        raise ResponseError("truncated body")
    return None


def _reject_constant(name: str) -> object:
    raise ResponseError("non-finite number")


def _reject_float(text: str) -> object:
    raise ResponseError("results never hold non-integers")


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ResponseError("duplicate key")
        result[key] = value
    return result


def _check_depth(body: bytes) -> None:
    """Bound nesting before the recursive parser sees the bytes."""
    depth = 0
    in_string = False
    escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_RESULT_DEPTH:
                raise ResponseError("result nested too deeply")
        elif byte in (0x5D, 0x7D):
            depth -= 1


def canonical_body(body: bytes, error: bytes | None = None) -> bytes:
    """Return ``body`` unchanged if it is one of the two canonical shapes.

    ``error`` is the canonical error body (default: the protocol's, from
    :func:`load_facts`).

    Accepted: exactly ``{"status":"error"}``, or ``{"status":"ok","result":V}``
    in the compact canonical encoding the broker produces (status first, no
    other keys, no whitespace, JSON.stringify escaping, integers only, no
    duplicate keys, no lone surrogates). Checking canonical form guarantees
    the printed text is one line and exactly what the broker sent.

    Raises:
        ResponseError: any other body.
    """
    if body == (error if error is not None else load_facts().canonical_error):
        return body
    if not body.startswith(_OK_PREFIX) or not body.endswith(b"}"):
        raise ResponseError("not a canonical envelope")
    _check_depth(body)
    try:
        text = body.decode("utf-8", "strict")
        value = json.loads(
            text,
            object_pairs_hook=_unique_pairs,
            parse_float=_reject_float,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ResponseError("not JSON") from None
    if not isinstance(value, dict) or list(value) != ["status", "result"]:
        raise ResponseError("not a canonical envelope")
    try:
        again = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        encoded = again.encode("utf-8", "strict")
    except (UnicodeEncodeError, ValueError, RecursionError):
        raise ResponseError("lone surrogate or bad value") from None
    if encoded != body:
        raise ResponseError("not in canonical encoding")
    return body


# --------------------------------------------------------------------------
# 4. Transport


def _deadline_seconds(env: dict[str, str]) -> float:
    """The total deadline; the test-only variable may only shorten it."""
    raw = env.get(TEST_DEADLINE_ENV)
    if raw is None:
        return DEADLINE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        return DEADLINE_SECONDS
    if not 0.0 < value < DEADLINE_SECONDS:  # also rejects nan
        return DEADLINE_SECONDS
    return value


def exchange(path: str, request: bytes, deadline: float) -> bytes:
    """Send ``request`` over the Unix socket at ``path``; return the framed body.

    ``deadline`` is an absolute ``time.monotonic()`` value bounding the whole
    exchange (connect, send, every receive).

    Raises:
        OSError: transport failures, including the deadline (TimeoutError).
        ResponseError: a response that is not a well-framed 200.
    """

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(remaining())
        sock.connect(path)
        sock.settimeout(remaining())
        sock.sendall(request)
        data = b""
        while True:
            sock.settimeout(remaining())
            chunk = sock.recv(_RECV_CHUNK)
            data += chunk
            body = parse_response(data, complete=not chunk)
            if body is not None:
                return body
    finally:
        sock.close()


# --------------------------------------------------------------------------
# 5. Entry points


def run(
    argv: list[str],
    stdin: object,
    env: dict[str, str],
    program: str = QUERY_PROGRAM,
    here: str | None = None,
) -> bytes:
    """Do one request of ``program``; return the line to print (without its newline).

    ``here`` is the directory the wrapper is installed in (default: this
    file's): its protocol copy and, for ``bounded-agent``, its
    ``bounded-agent.json``. Never raises an ``Exception``: every failure is
    the canonical error.
    """
    started = time.monotonic()
    error = CANONICAL_ERROR
    try:
        directory = os.path.abspath(here if here is not None else os.path.dirname(__file__))
        facts = load_facts(directory)
        error = facts.canonical_error
        if program == AGENT_PROGRAM:
            chosen = agent_program(facts, agent_task_limit(directory, facts.max_task_bytes))
        elif program == QUERY_PROGRAM:
            chosen = query_program(facts)
        else:
            return error
        repo, schema = parse_argv(argv, facts)
        body = read_body(stdin, chosen.body_limit, chosen.utf8_body)
        path = env.get(chosen.socket_env, "")
        if path == "":
            return error
        request = _frame(chosen, repo, schema, body)
        answer = exchange(path, request, started + _deadline_seconds(env))
        return canonical_body(answer, error)
    except Exception:
        return error


def _emit(line: bytes) -> None:
    """Write the one line; a closed stdout must not produce a traceback."""
    try:
        out = sys.stdout.buffer
        out.write(line + b"\n")
        out.flush()
    except Exception:
        # Keep interpreter shutdown from reporting the failed flush on stderr.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)
        except Exception:
            pass


def main(program: str | None = None) -> int:
    """Entry point: print one canonical line, always exit 0.

    ``program`` default: :func:`program_for` the name this process runs as.
    """
    try:
        # Nothing may ever reach stderr (spec 14.8, 15.8), not even a warning
        # or a traceback from a bug: silence it for the life of this process.
        with contextlib.suppress(Exception):
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - process lifetime
        line = CANONICAL_ERROR
        try:
            chosen = program if program is not None else program_for(sys.argv[0])
            line = run(sys.argv[1:], sys.stdin, dict(os.environ), chosen)
        except BaseException:  # KeyboardInterrupt included: still one line, exit 0
            line = CANONICAL_ERROR
        _emit(line)
    except BaseException:
        pass
    return 0


def agent_main() -> int:
    """The ``bounded-agent`` console script (whatever name it was started by)."""
    return main(AGENT_PROGRAM)


if __name__ == "__main__":
    sys.exit(main())
