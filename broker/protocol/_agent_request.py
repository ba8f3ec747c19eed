"""The bounded-agent request frame (spec 15.3).

See docs/architecture.md "Fixed interfaces" and the bounded-agent section.

Theory of operation: a bounded-agent request selects exactly three things
-- a configured repository, a finite schema (the algebra of 14.3, charged
the same way) and a byte-bounded task -- and nothing else. Everything that
decides *how* an enclave runs is trusted configuration, so a request has no
place for it. Two entry points build the same immutable
:class:`AgentRequest`:

* :func:`parse_agent_frame`, the wire form, accepts exactly one each of
  ``X-AWF-Agent-Version: 1``, ``X-AWF-Repo`` and ``X-AWF-Schema-B64`` (the
  query frame's encoding, :func:`schema_from_header`) and refuses every
  other header of the ``X-AWF-`` family, a duplicate and a missing one;
* :func:`parse_agent_request`, the object form of 15.3's table
  (``{"privateRepo", "schema", "task"}``, as a tool call carries it),
  accepts exactly those keys.

The named controls of 15.3 (``AGENT_FORBIDDEN_CONTROLS``: image, command,
..., tool definition; as headers ``X-AWF-Image`` ... ``X-AWF-Tool-Definition``,
:data:`FORBIDDEN_CONTROL_HEADERS`) are refused by name before the
unknown-key rule, with their own message: redundant by construction, kept
so that a later widening of the accepted set fails a test rather than
granting a capability. The query frame's ``X-AWF-Query-Version`` is an
unknown header here, so a query sent to an agent broker (or the reverse)
is refused, never reinterpreted.

The body is the task: UTF-8, non-empty, at most ``max_task_bytes`` bytes
(``maxTaskBytes``, a per-run setting: the caller of this function passes
the bound from the trusted configuration). The task is text, never
configuration: it is forwarded verbatim and nothing in it is interpreted
here. Every failure is a :class:`RequestError` (the caller's fault).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._errors import RequestError
from ._request import (
    is_valid_slug,
    repo_from_header,
    schema_from_header,
    schema_from_object,
    text_body,
)
from ._schema import Schema
from .policy import AGENT_FORBIDDEN_CONTROLS, AGENT_PROTOCOL_VERSION, ENCLAVE_MAX_TASK_BYTES

__all__ = [
    "FORBIDDEN_CONTROL_HEADERS",
    "AgentRequest",
    "parse_agent_frame",
    "parse_agent_request",
]

_H_VERSION = b"x-awf-agent-version"
_H_REPO = b"x-awf-repo"
_H_SCHEMA = b"x-awf-schema-b64"
_ACCEPTED = (_H_VERSION, _H_REPO, _H_SCHEMA)
_AWF_PREFIX = b"x-awf-"
_REQUEST_KEYS = frozenset({"privateRepo", "schema", "task"})


def _header_name(control: str) -> str:
    """``resourceLimit`` -> ``x-awf-resource-limit`` (the header spelling of a control)."""
    return "x-awf-" + "".join("-" + ch.lower() if ch.isupper() else ch for ch in control)


#: The named controls as ``X-AWF-*`` header names (lowercase), in the policy's order.
FORBIDDEN_CONTROL_HEADERS = tuple(_header_name(control) for control in AGENT_FORBIDDEN_CONTROLS)
_FORBIDDEN = frozenset(name.encode("ascii") for name in FORBIDDEN_CONTROL_HEADERS)
_FORBIDDEN_KEYS = frozenset(control.lower() for control in AGENT_FORBIDDEN_CONTROLS)
_VERSION_VALUE = str(AGENT_PROTOCOL_VERSION).encode("ascii")


@dataclass(frozen=True)
class AgentRequest:
    """A valid bounded-agent request (spec 15.3).

    ``schema_text`` is the schema's JSON text exactly as the caller sent it
    (the enclave's ``schema.json``); ``schema`` is its parsed, charged form.
    """

    private_repo: str
    schema: Schema
    task: str
    schema_text: str


def _forbidden(lname: bytes) -> bool:
    """A named control of 15.3, or a variant of one (``x-awf-timeout-s``)."""
    return lname in _FORBIDDEN or any(lname.startswith(name + b"-") for name in _FORBIDDEN)


def parse_agent_frame(
    headers: Sequence[tuple[bytes, bytes]], body: bytes, *, max_task_bytes: int
) -> AgentRequest:
    """Validate the wire form of a bounded-agent request (module docstring).

    ``headers`` are the ``(name, value)`` byte pairs as received (any case);
    ``body`` is the raw task; ``max_task_bytes`` is the run's trusted
    ``maxTaskBytes``. The request line is checked separately
    (:func:`check_request_line`).

    Raises:
        RequestError: a named control, an unknown, duplicate or missing
            ``X-AWF-*`` header, a version other than ``1``, an invalid slug,
            a non-canonical or oversize schema header, an invalid schema, or
            an empty, oversize or non-UTF-8 task.
        ValueError: ``max_task_bytes`` outside 1..ENCLAVE_MAX_TASK_BYTES
            (a configuration bug of the caller, not a request fault).
    """
    _check_bound(max_task_bytes)
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if not isinstance(name, bytes) or not isinstance(value, bytes):
            raise RequestError("headers: names and values must be bytes")
        lname = name.lower()
        if not lname.startswith(_AWF_PREFIX):
            continue
        if _forbidden(lname):
            raise RequestError("headers: a trusted control is never part of a request (15.3)")
        if lname not in _ACCEPTED:
            raise RequestError("headers: unknown X-AWF-* header")
        if lname in found:
            raise RequestError(f"headers: duplicate {lname.decode('ascii')}")
        found[lname] = value
    for required in _ACCEPTED:
        if required not in found:
            raise RequestError(f"headers: missing {required.decode('ascii')}")
    if found[_H_VERSION] != _VERSION_VALUE:
        raise RequestError(f"x-awf-agent-version: must be {AGENT_PROTOCOL_VERSION}")
    repo = repo_from_header(found[_H_REPO])
    task = text_body(body, "task", max_task_bytes)
    raw_schema, schema = schema_from_header(found[_H_SCHEMA])
    # The strict parser accepted the bytes, so they are UTF-8.
    return AgentRequest(repo, schema, task, raw_schema.decode("utf-8"))


def _check_bound(max_task_bytes: int) -> None:
    if not 1 <= max_task_bytes <= ENCLAVE_MAX_TASK_BYTES:
        raise ValueError(f"max_task_bytes must be 1-{ENCLAVE_MAX_TASK_BYTES}")


def parse_agent_request(obj: object, *, max_task_bytes: int) -> AgentRequest:
    """Validate the object form of a bounded-agent request (spec 15.3's table).

    ``obj`` must be a dict with exactly ``privateRepo`` (a valid slug),
    ``schema`` (a finite-DSL schema object) and ``task`` (non-empty text of
    at most ``max_task_bytes`` UTF-8 bytes). ``schema_text`` of the result
    is the schema's compact canonical serialization.

    Raises:
        RequestError: a named control (any case), any other key, a missing
            key, an invalid slug, an invalid schema, or an empty, oversize
            or non-text task.
        ValueError: ``max_task_bytes`` outside 1..ENCLAVE_MAX_TASK_BYTES.
    """
    _check_bound(max_task_bytes)
    if not isinstance(obj, dict):
        raise RequestError("request: must be an object")
    for key in obj:
        if isinstance(key, str) and key.lower() in _FORBIDDEN_KEYS:
            raise RequestError("request: a trusted control is never part of a request (15.3)")
    if set(obj) != _REQUEST_KEYS:
        raise RequestError("request: must have exactly privateRepo, schema and task")
    repo = obj["privateRepo"]
    if not is_valid_slug(repo):
        raise RequestError("request.privateRepo: not an owner/repo slug")
    assert isinstance(repo, str)  # is_valid_slug checked it
    task = obj["task"]
    if not isinstance(task, str):
        raise RequestError("request.task: must be a string")
    if not task:
        raise RequestError("request.task: must not be empty")
    # Every character is at least one UTF-8 byte: refuse long text before encoding.
    if len(task) > max_task_bytes:
        raise RequestError(f"request.task: larger than {max_task_bytes} bytes")
    try:
        size = len(task.encode("utf-8"))
    except UnicodeEncodeError:
        raise RequestError("request.task: not valid Unicode (lone surrogate)") from None
    if size > max_task_bytes:
        raise RequestError(f"request.task: larger than {max_task_bytes} bytes")
    schema = schema_from_object(obj["schema"])
    return AgentRequest(repo, schema, task, schema.canonical)
