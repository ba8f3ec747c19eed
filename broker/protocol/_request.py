"""Request rules and HTTP framing of protocol v2 (spec 14.2, 14.3).

See docs/architecture.md "Fixed interfaces".

Theory of operation: two entry points build the same immutable
:class:`Request`. :func:`parse_request` takes the JSON-object form
(``{"privateRepo":..,"schema":..,"script":..}``); :func:`parse_frame` takes
the wire form as the HTTP layer received it (header pairs and body bytes)
after :func:`check_request_line` accepted ``POST /query``. Both translate
every failure, including the schema's, into :class:`RequestError` in one
place, so the broker answers every bad request with the canonical error.

Framing rules: header names match case-insensitively; exactly one
``X-AWF-Query-Version: 2``, one ``X-AWF-Repo`` and one ``X-AWF-Schema-B64``;
any other ``X-AWF-*`` header or a duplicate is refused; all other headers are
ignored here (the HTTP layer enforces sizes). The schema header is canonical
unpadded base64url (docs/architecture.md decision 6) of at most MAX_SCHEMA_BYTES raw
bytes of UTF-8 JSON, parsed by the strict parser, then by
:func:`parse_schema`. The body is the script: non-empty UTF-8 of at most
MAX_SCRIPT_BYTES bytes.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from ._constants import (
    MAX_OUTPUT_DEPTH,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_HEADER_CHARS,
    MAX_SCRIPT_BYTES,
    MAX_SLUG_CHARS,
    PROTOCOL_VERSION,
)
from ._errors import JSONError, RequestError, SchemaError
from ._schema import Schema, parse_schema
from ._strict_json import strict_parse_json
from .policy import SLUG_RE

__all__ = [
    "Request",
    "check_request_line",
    "decode_schema_header",
    "encode_schema_header",
    "is_valid_slug",
    "parse_frame",
    "parse_request",
    "schema_from_header",
    "schema_from_object",
]

_B64URL = re.compile(r"[A-Za-z0-9_-]*")

_H_VERSION = b"x-awf-query-version"
_H_REPO = b"x-awf-repo"
_H_SCHEMA = b"x-awf-schema-b64"
_AWF_PREFIX = b"x-awf-"
_VERSION_VALUE = str(PROTOCOL_VERSION).encode("ascii")
_REQUEST_KEYS = frozenset({"privateRepo", "schema", "script"})


@dataclass(frozen=True)
class Request:
    """A valid bounded-query request (spec 14.3): slug, parsed schema, script text."""

    private_repo: str
    schema: Schema
    script: str


def is_valid_slug(s: object) -> bool:
    """True iff ``s`` is a whole-string ``owner/repo`` slug (spec 14.2).

    Owner ``[A-Za-z0-9][A-Za-z0-9-]{0,38}``, repo ``[A-Za-z0-9._-]{1,100}``,
    no ``..`` anywhere, at most 140 characters; the repo names ``.`` and
    ``..`` are invalid. A trailing newline is not part of a slug.
    """
    # The length check first bounds the regex's work (policy.SLUG_RE).
    return isinstance(s, str) and len(s) <= MAX_SLUG_CHARS and SLUG_RE.fullmatch(s) is not None


def check_request_line(method: bytes, target: bytes) -> None:
    """Accept exactly ``POST /query`` (docs/architecture.md "Fixed interfaces").

    Raises:
        RequestError: any other method or target (no query string, no
            trailing slash, case-sensitive).
    """
    if method != b"POST" or target != b"/query":
        raise RequestError("request: only POST /query is served")


def encode_schema_header(schema_json_bytes: bytes) -> bytes:
    """Canonical ``X-AWF-Schema-B64`` value: base64url without padding."""
    return base64.urlsafe_b64encode(schema_json_bytes).rstrip(b"=")


def decode_schema_header(value: bytes) -> bytes:
    """Decode a canonical unpadded base64url header value (docs/architecture.md decision 6).

    Raises:
        RequestError: a character outside ``A-Z a-z 0-9 - _`` (padding and
            whitespace included), a length of 1 mod 4, non-zero dangling
            bits, or more than MAX_SCHEMA_BYTES decoded bytes.
    """
    if len(value) > MAX_SCHEMA_HEADER_CHARS:
        raise RequestError(f"x-awf-schema-b64: schema larger than {MAX_SCHEMA_BYTES} bytes")
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        raise RequestError("x-awf-schema-b64: not base64url") from None
    if _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        raise RequestError("x-awf-schema-b64: not canonical unpadded base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):  # pragma: no cover - excluded by the checks above
        raise RequestError("x-awf-schema-b64: not base64url") from None
    if encode_schema_header(raw) != value:
        raise RequestError("x-awf-schema-b64: non-canonical base64url (dangling bits)")
    if len(raw) > MAX_SCHEMA_BYTES:  # pragma: no cover - implied by the length bound above
        raise RequestError(f"x-awf-schema-b64: schema larger than {MAX_SCHEMA_BYTES} bytes")
    return raw


def schema_from_object(obj: object) -> Schema:
    """The parsed schema of a request's ``schema`` object.

    Raises:
        RequestError: :func:`parse_schema` refused it (its message kept).
    """
    try:
        return parse_schema(obj)
    except SchemaError as exc:
        raise RequestError(str(exc)) from exc


def _script_from_str(script: object) -> str:
    if not isinstance(script, str):
        raise RequestError("request.script: must be a string")
    if not script:
        raise RequestError("request.script: must not be empty")
    # Every character is at least one UTF-8 byte: refuse long text before encoding.
    if len(script) > MAX_SCRIPT_BYTES:
        raise RequestError(f"request.script: larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        size = len(script.encode("utf-8"))
    except UnicodeEncodeError:
        raise RequestError("request.script: not valid Unicode (lone surrogate)") from None
    if size > MAX_SCRIPT_BYTES:
        raise RequestError(f"request.script: larger than {MAX_SCRIPT_BYTES} bytes")
    return script


def parse_request(obj: object) -> Request:
    """Validate the object form of a request (spec 14.3).

    ``obj`` must be a dict with exactly ``privateRepo`` (a valid slug),
    ``schema`` (a finite-DSL schema) and ``script`` (non-empty, at most
    MAX_SCRIPT_BYTES UTF-8 bytes).

    Raises:
        RequestError: for any violation, schema errors included.
    """
    if not isinstance(obj, dict):
        raise RequestError("request: must be an object")
    if len(obj) != len(_REQUEST_KEYS) or not all(k in obj for k in _REQUEST_KEYS):
        raise RequestError("request: must have exactly privateRepo, schema and script")
    repo = obj["privateRepo"]
    if not is_valid_slug(repo):
        raise RequestError("request.privateRepo: not an owner/repo slug")
    script = _script_from_str(obj["script"])
    schema = schema_from_object(obj["schema"])
    assert isinstance(repo, str)  # is_valid_slug checked it
    return Request(repo, schema, script)


def parse_frame(headers: list[tuple[bytes, bytes]], body: bytes) -> Request:
    """Validate the wire form of a request (docs/architecture.md "Fixed interfaces").

    ``headers`` are the ``(name, value)`` byte pairs as received (any case);
    ``body`` is the raw script. The request line is checked separately by
    :func:`check_request_line`.

    Raises:
        RequestError: a missing, duplicate or unknown ``X-AWF-*`` header, a
            version other than ``2``, an invalid slug, a non-canonical or
            oversize schema header, an invalid schema, or an empty, oversize
            or non-UTF-8 body.
    """
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if not isinstance(name, bytes) or not isinstance(value, bytes):
            raise RequestError("headers: names and values must be bytes")
        lname = name.lower()
        if not lname.startswith(_AWF_PREFIX):
            continue
        if lname not in (_H_VERSION, _H_REPO, _H_SCHEMA):
            raise RequestError("headers: unknown X-AWF-* header")
        if lname in found:
            raise RequestError(f"headers: duplicate {lname.decode('ascii')}")
        found[lname] = value
    for required in (_H_VERSION, _H_REPO, _H_SCHEMA):
        if required not in found:
            raise RequestError(f"headers: missing {required.decode('ascii')}")
    if found[_H_VERSION] != _VERSION_VALUE:
        raise RequestError("x-awf-query-version: must be 2")
    repo = repo_from_header(found[_H_REPO])
    script = text_body(body, "script", MAX_SCRIPT_BYTES)
    _raw, schema = schema_from_header(found[_H_SCHEMA])
    return Request(repo, schema, script)


def repo_from_header(value: bytes) -> str:
    """The ``X-AWF-Repo`` value as a slug (both frames).

    Raises:
        RequestError: not an ASCII owner/repo slug.
    """
    try:
        repo = value.decode("ascii")
    except UnicodeDecodeError:
        raise RequestError("x-awf-repo: not an owner/repo slug") from None
    if not is_valid_slug(repo):
        raise RequestError("x-awf-repo: not an owner/repo slug")
    return repo


def text_body(body: object, noun: str, limit: int) -> str:
    """A frame's body as text: bytes, non-empty, at most ``limit``, strict UTF-8
    (both frames; ``noun`` names it in the error: ``script``, ``task``).

    Raises:
        RequestError: anything else.
    """
    if not isinstance(body, bytes):
        raise RequestError("body: must be bytes")
    if not body:
        raise RequestError(f"body: {noun} must not be empty")
    if len(body) > limit:
        raise RequestError(f"body: {noun} larger than {limit} bytes")
    try:
        return body.decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise RequestError(f"body: {noun} is not valid UTF-8") from None


def schema_from_header(value: bytes) -> tuple[bytes, Schema]:
    """The raw JSON bytes and the parsed schema of an ``X-AWF-Schema-B64`` value.

    Shared by both subsystems' frames (the agent frame keeps the raw bytes:
    the enclave gets the schema's text as admitted).

    Raises:
        RequestError: a non-canonical or oversize header, JSON the strict
            parser refuses, or a schema :func:`parse_schema` refuses.
    """
    raw_schema = decode_schema_header(value)
    try:
        obj = strict_parse_json(raw_schema, max_bytes=MAX_SCHEMA_BYTES, max_depth=MAX_OUTPUT_DEPTH)
    except JSONError as exc:
        raise RequestError(f"x-awf-schema-b64: {exc}") from None
    return raw_schema, schema_from_object(obj)
