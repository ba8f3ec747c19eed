#!/bin/sh
"""exec" python3 -I "$0" "$@"
``bounded-query``: the agent's client for the bounded-query broker (spec 14.8, protocol v2).

Usage (the only accepted shape; the two options may come in either order)::

    bounded-query --repo OWNER/REPO --schema 'SCHEMA_JSON' < query.py

Contract (spec 14.8): the wrapper always prints exactly one canonical JSON line
on stdout -- ``{"status":"ok","result":...}`` or ``{"status":"error"}`` --
writes nothing on stderr and exits 0, for both outcomes and for every failure
(bad arguments, a missing socket, a broker that hangs past the deadline or dies
mid-response, an internal bug).

Theory of operation:

1. ``parse_argv`` enforces the fixed CLI shape locally: exactly ``--repo X``
   once and ``--schema JSON`` once as separate argv items. Any other option,
   the ``--flag=value`` form, positionals, repetitions, a schema that is empty,
   not UTF-8 or over ``MAX_SCHEMA_BYTES``, and a repository that is not a
   plausible slug are rejected without contacting the broker. The wrapper does
   not validate the schema's structure or charge: that is the trusted broker's
   job (14.8), and ``bounded-query-cost`` shows it to the agent beforehand.
2. The script is read from stdin (a terminal on stdin is an error) as raw bytes,
   capped at ``MAX_SCRIPT_BYTES``, and sent unmodified.
3. ``build_request`` frames ``POST /query`` (HTTP/1.1) with the v2 headers; the
   schema travels as canonical base64url (no padding) of its raw UTF-8 bytes.
4. ``exchange`` talks to ``$AWF_BOUNDED_QUERY_SOCKET`` under one total deadline
   (``DEADLINE_SECONDS``: the 600 s timing bucket plus a margin).
5. ``parse_response`` reads the HTTP response minimally but strictly (status
   200, no transfer coding, a Content-Length-framed or close-delimited body of
   bounded size) and ``canonical_body`` passes through only the two canonical
   shapes, byte for byte. Anything else becomes ``{"status":"error"}``.

This file is deliberately one stdlib-only module that runs on Python >= 3.8:
the harness copies it verbatim into the agent's wrapper directory as the
executable ``bounded-query``. Keep it free of 3.9+ syntax and APIs.

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
import json
import os
import socket
import sys
import time
from typing import Any

__all__ = [
    "CANONICAL_ERROR",
    "DEADLINE_SECONDS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCRIPT_BYTES",
    "SOCKET_ENV",
    "TEST_DEADLINE_ENV",
    "UsageError",
    "build_request",
    "canonical_body",
    "main",
    "parse_argv",
    "parse_response",
    "run",
]

#: The one line printed for every failure (spec 14.4), without the newline.
CANONICAL_ERROR = b'{"status":"error"}'

#: Where the broker's Unix socket is (spec 14.8).
SOCKET_ENV = "AWF_BOUNDED_QUERY_SOCKET"

#: TEST-ONLY: a shorter total deadline in seconds, so tests of a hanging broker
#: finish quickly. It can only shorten ``DEADLINE_SECONDS``, never extend it;
#: the harness never sets it and agents have no reason to.
TEST_DEADLINE_ENV = "BOUNDED_QUERY_WRAPPER_TEST_DEADLINE"

#: The broker answers at the latest at the 600 s timing bucket (14.3.1); the
#: extra minute covers connection set-up, queueing behind the serialized lane's
#: in-flight invocation tail and scheduling slack. Past it, the broker is
#: considered dead and the answer is the canonical error.
DEADLINE_SECONDS = 660.0

#: Spec 14.3: the schema travels in a header; its raw UTF-8 bytes are capped.
MAX_SCHEMA_BYTES = 4096

#: Spec 14.3: the script's raw bytes are capped at 64 KiB.
MAX_SCRIPT_BYTES = 64 * 1024

#: A slug is owner (<= 39) + "/" + repo (<= 100); the whole is capped at 140.
MAX_REPO_CHARS = 140

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


# --------------------------------------------------------------------------
# 1. The fixed CLI shape


def _is_plausible_repo(repo: str) -> bool:
    """A cheap local plausibility check; the broker applies the exact slug rule.

    Printable ASCII without spaces (so no header injection), one slash with
    non-empty sides, at most ``MAX_REPO_CHARS`` characters.
    """
    if not 0 < len(repo) <= MAX_REPO_CHARS:
        return False
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in repo):
        return False
    owner, slash, name = repo.partition("/")
    return slash == "/" and owner != "" and name != "" and "/" not in name


def parse_argv(argv: list[str]) -> tuple[str, bytes]:
    """Check the fixed CLI shape (spec 14.8) and return ``(repo, schema_bytes)``.

    ``argv`` excludes the program name. The schema is returned as the raw bytes
    the caller passed (argv is decoded by Python with surrogateescape, so
    ``os.fsencode`` recovers them exactly).

    Raises:
        UsageError: any other shape, a repeated or unknown flag, the
            ``--flag=value`` form, positionals, an empty, non-UTF-8 or
            oversize schema, or an implausible repository slug.
    """
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
    if not _is_plausible_repo(repo):
        raise UsageError("repository is not an owner/repo slug")
    schema = os.fsencode(values["--schema"])
    if not 0 < len(schema) <= MAX_SCHEMA_BYTES:
        raise UsageError("schema is empty or over the size limit")
    try:
        schema.decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise UsageError("schema is not UTF-8") from None
    return repo, schema


def read_script(stream: object) -> bytes:
    """Read the script from stdin: raw bytes, non-empty, at most 64 KiB.

    Raises:
        UsageError: no stdin, a terminal on stdin, an empty or oversize script.
    """
    if stream is None:
        raise UsageError("no stdin")
    isatty = getattr(stream, "isatty", None)
    if isatty is None or isatty():
        raise UsageError("the script must come on stdin, not from a terminal")
    buffer: Any = getattr(stream, "buffer", stream)
    chunks = []
    total = 0
    while total <= MAX_SCRIPT_BYTES:
        chunk = buffer.read(MAX_SCRIPT_BYTES + 1 - total)
        if not chunk:
            break
        chunks.append(bytes(chunk))
        total += len(chunk)
    script = b"".join(chunks)
    if not 0 < len(script) <= MAX_SCRIPT_BYTES:
        raise UsageError("script is empty or over the size limit")
    return script


# --------------------------------------------------------------------------
# 2. The request


def encode_schema(schema: bytes) -> bytes:
    """Canonical base64url of the schema's raw bytes, without padding."""
    return base64.urlsafe_b64encode(schema).rstrip(b"=")


def build_request(repo: str, schema: bytes, script: bytes) -> bytes:
    """Frame the v2 request (docs/architecture.md "Fixed interfaces") as exact bytes."""
    head = (
        b"POST /query HTTP/1.1\r\n"
        b"Host: localhost\r\n"
        b"X-AWF-Query-Version: 2\r\n"
        b"X-AWF-Repo: " + repo.encode("ascii") + b"\r\n"
        b"X-AWF-Schema-B64: " + encode_schema(schema) + b"\r\n"
        b"Content-Type: application/octet-stream\r\n"
        b"Content-Length: " + str(len(script)).encode("ascii") + b"\r\n"
        b"Connection: close\r\n"
        b"\r\n"
    )
    return head + script


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


def canonical_body(body: bytes) -> bytes:
    """Return ``body`` unchanged if it is one of the two canonical shapes.

    Accepted: exactly ``{"status":"error"}``, or ``{"status":"ok","result":V}``
    in the compact canonical encoding the broker produces (status first, no
    other keys, no whitespace, JSON.stringify escaping, integers only, no
    duplicate keys, no lone surrogates). Checking canonical form guarantees
    the printed text is one line and exactly what the broker sent.

    Raises:
        ResponseError: any other body.
    """
    if body == CANONICAL_ERROR:
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


def run(argv: list[str], stdin: object, env: dict[str, str]) -> bytes:
    """Do one query; return the line to print (without its newline).

    Never raises an ``Exception``: every failure is the canonical error.
    """
    started = time.monotonic()
    try:
        repo, schema = parse_argv(argv)
        script = read_script(stdin)
        path = env.get(SOCKET_ENV, "")
        if path == "":
            return CANONICAL_ERROR
        request = build_request(repo, schema, script)
        body = exchange(path, request, started + _deadline_seconds(env))
        return canonical_body(body)
    except Exception:
        return CANONICAL_ERROR


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


def main() -> int:
    """Console-script entry point: print one canonical line, always exit 0."""
    try:
        # Nothing may ever reach stderr (spec 14.8), not even a warning or a
        # traceback from a bug: silence it for the life of this process.
        with contextlib.suppress(Exception):
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - process lifetime
        line = CANONICAL_ERROR
        try:
            line = run(sys.argv[1:], sys.stdin, dict(os.environ))
        except BaseException:  # KeyboardInterrupt included: still one line, exit 0
            line = CANONICAL_ERROR
        _emit(line)
    except BaseException:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
