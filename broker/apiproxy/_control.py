"""The control protocol: how the broker arms and disarms the API proxy (pure codec).

Theory of operation: the control endpoint is a Unix socket in a directory
only the broker's user can enter (the enclave has no path to it; the TCP
side never answers these routes), one HTTP/1.1 request per connection:

* ``POST /arm`` with ``{"invocation": ID, "placeholder": P}``
* ``POST /disarm`` with ``{"invocation": ID}``
* ``GET /status``

Every answer is ``application/json``: ``200`` with ``{"ok": true,
"outcome": ..., "armed": bool, "invocation": ID|null, "requestsUsed": n}``
when the event took effect, ``409`` with the same fields and ``"ok": false``
when the arming table refused it (``already-armed``, ``invocation-spent``,
``not-armed``, ``wrong-invocation``: a broker bug, reported as such), and
``400`` with ``{"ok": false, "outcome": "bad-request"}`` for a malformed
request. The status never includes the placeholder.

The broker's side (``sandbox/proxy_control.py``) builds its requests with
:func:`encode_control_request` (the inverse of :func:`parse_control`) and
reads the answers with :func:`parse_control_answer` (the inverse of
:func:`encode_control_response`), so the field names live here only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bounded_query.broker.apiproxy._arming import Arm, Armed, ArmingState, Disarm, Step
from bounded_query.broker.protocol import JSONError, strict_parse_json

__all__ = [
    "MAX_CONTROL_ANSWER_BYTES",
    "ArmCommand",
    "ControlAnswer",
    "ControlCommand",
    "ControlError",
    "DisarmCommand",
    "StatusCommand",
    "arm_event",
    "bad_request_response",
    "disarm_event",
    "encode_control_request",
    "encode_control_response",
    "parse_control",
    "parse_control_answer",
    "status_fields",
]

#: An answer is one small JSON object (five fields); anything larger is not
#: the proxy's.
MAX_CONTROL_ANSWER_BYTES = 4096


class ControlError(ValueError):
    """A malformed control request (a broker fault)."""


@dataclass(frozen=True, slots=True)
class ArmCommand:
    """Arm for one invocation (fields checked by :class:`Arm` when applied)."""

    invocation: str
    placeholder: str


@dataclass(frozen=True, slots=True)
class DisarmCommand:
    """Disarm at the end of an invocation."""

    invocation: str


@dataclass(frozen=True, slots=True)
class StatusCommand:
    """Report the arming state."""


ControlCommand = ArmCommand | DisarmCommand | StatusCommand


def parse_control(method: bytes, target: bytes, body: bytes) -> ControlCommand:
    """Parse one control request.

    Raises:
        ControlError: an unknown route, a wrong method or a malformed body.
    """
    if target == b"/status":
        if method != b"GET" or body:
            raise ControlError("status: GET without a body")
        return StatusCommand()
    if target not in (b"/arm", b"/disarm") or method != b"POST":
        raise ControlError("control: unknown route")
    try:
        doc = strict_parse_json(body, max_bytes=4096, max_depth=2)
    except JSONError as exc:
        raise ControlError(f"control: {exc}") from None
    keys = {"invocation", "placeholder"} if target == b"/arm" else {"invocation"}
    if not isinstance(doc, dict) or set(doc) != keys:
        raise ControlError(f"control: expected exactly {sorted(keys)}")
    if not all(isinstance(doc[key], str) for key in keys):
        raise ControlError("control: fields must be strings")
    if target == b"/arm":
        return ArmCommand(str(doc["invocation"]), str(doc["placeholder"]))
    return DisarmCommand(str(doc["invocation"]))


def arm_event(command: ArmCommand, max_requests: int) -> Arm:
    """The arming event for ``command``.

    Raises:
        ControlError: a malformed invocation id or placeholder.
    """
    try:
        return Arm(command.invocation, command.placeholder, max_requests)
    except ValueError as exc:
        raise ControlError(str(exc)) from None


def disarm_event(command: DisarmCommand) -> Disarm:
    """The disarming event for ``command``."""
    return Disarm(command.invocation)


def status_fields(state: ArmingState) -> dict[str, object]:
    """The state as the broker may see it (never the placeholder)."""
    if isinstance(state, Armed):
        return {"armed": True, "invocation": state.invocation, "requestsUsed": state.used}
    return {"armed": False, "invocation": None, "requestsUsed": 0}


def encode_control_response(result: Step | None, state: ArmingState) -> tuple[int, bytes]:
    """(status, body) for an applied step, a status query (``None``) or a bad request."""
    if result is None:
        doc: dict[str, object] = {"ok": True, "outcome": "status", **status_fields(state)}
        status = 200
    else:
        doc = {"ok": result.accepted, "outcome": result.outcome, **status_fields(result.state)}
        status = 200 if result.accepted else 409
    return status, json.dumps(doc, sort_keys=True).encode("ascii")


def bad_request_response() -> tuple[int, bytes]:
    """(status, body) for a malformed control request."""
    return 400, b'{"ok":false,"outcome":"bad-request"}'


def encode_control_request(command: ControlCommand) -> tuple[bytes, bytes, bytes]:
    """(method, target, body) of ``command``: what :func:`parse_control` parses back."""
    if isinstance(command, StatusCommand):
        return b"GET", b"/status", b""
    if isinstance(command, ArmCommand):
        doc = {"invocation": command.invocation, "placeholder": command.placeholder}
        return b"POST", b"/arm", json.dumps(doc, sort_keys=True).encode("ascii")
    return b"POST", b"/disarm", json.dumps({"invocation": command.invocation}).encode("ascii")


@dataclass(frozen=True, slots=True)
class ControlAnswer:
    """One answer of the control endpoint, as :func:`encode_control_response` wrote it.

    ``accepted`` is whether the event took effect (HTTP 200); ``armed``,
    ``invocation`` and ``requests_used`` describe the proxy's state after it.
    """

    accepted: bool
    outcome: str
    armed: bool
    invocation: str | None
    requests_used: int


def parse_control_answer(status: int, body: bytes) -> ControlAnswer:
    """Decode one control answer (the broker's side).

    Raises:
        ControlError: the proxy answered ``400`` (it found our request
            malformed: a broker bug), or the answer is not one of the shapes
            :func:`encode_control_response` produces (not the proxy's).
    """
    if status == 400:
        raise ControlError("control: the proxy refused the request as malformed")
    if status not in (200, 409):
        raise ControlError(f"control: unexpected status {status}")
    try:
        doc = strict_parse_json(body, max_bytes=MAX_CONTROL_ANSWER_BYTES, max_depth=2)
    except JSONError as exc:
        raise ControlError(f"control answer: {exc}") from None
    keys = {"ok", "outcome", "armed", "invocation", "requestsUsed"}
    if not isinstance(doc, dict) or set(doc) != keys:
        raise ControlError(f"control answer: expected exactly {sorted(keys)}")
    ok, outcome, armed = doc["ok"], doc["outcome"], doc["armed"]
    invocation, used = doc["invocation"], doc["requestsUsed"]
    if not (isinstance(ok, bool) and isinstance(armed, bool) and isinstance(outcome, str)):
        raise ControlError("control answer: ok and armed are booleans, outcome a string")
    if ok != (status == 200):
        raise ControlError("control answer: ok contradicts the status")
    if isinstance(used, bool) or not isinstance(used, int) or used < 0:
        raise ControlError("control answer: requestsUsed is a count")
    if armed and not isinstance(invocation, str):
        raise ControlError("control answer: an armed proxy names its invocation")
    if not armed and invocation is not None:
        raise ControlError("control answer: a disarmed proxy names no invocation")
    return ControlAnswer(ok, outcome, armed, invocation, used)
