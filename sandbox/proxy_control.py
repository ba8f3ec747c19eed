"""The broker's client of the API proxy's control socket (spec 15.6): arm, disarm, status.

Theory of operation: the control endpoint (``broker/apiproxy/_control.py``)
takes one HTTP/1.1 request per connection on a Unix socket only the
broker's user can reach. This module moves the bytes and nothing else: the
request comes from :func:`~bounded_query.broker.apiproxy._control.encode_control_request`,
the answer goes through
:func:`~bounded_query.broker.apiproxy._control.parse_control_answer` (one
codec, so no field name is spelled twice), h11 frames both. Every exchange
has a deadline: a proxy that does not answer is a proxy the broker cannot
rely on.

Errors: :class:`ProxyControlError` (the proxy is unreachable, answered
something that is not a control answer, or refused our request as
malformed) -- an operator or broker fault, never the enclave's. A refusal
of the arming table (HTTP 409: ``already-armed``, ``invocation-spent``, ...)
is an *answer*, returned with ``accepted`` False.
"""

from __future__ import annotations

from pathlib import Path

import h11
import trio

from bounded_query.broker.apiproxy._control import (
    MAX_CONTROL_ANSWER_BYTES,
    ArmCommand,
    ControlAnswer,
    ControlCommand,
    ControlError,
    DisarmCommand,
    StatusCommand,
    encode_control_request,
    parse_control_answer,
)

__all__ = [
    "CONTROL_TIMEOUT_S",
    "ControlAnswer",
    "ProxyControlError",
    "arm",
    "disarm",
    "exchange",
    "status",
]

#: One control exchange: the proxy answers from memory in milliseconds; a
#: loaded machine gets generous room, a hung proxy no more than this.
CONTROL_TIMEOUT_S = 10.0
#: Bytes read per receive (an answer is a few hundred).
_RECEIVE_BYTES = 4096


class ProxyControlError(Exception):
    """The control exchange failed: no answer we can trust (an operator or broker fault)."""


async def _exchange(path: Path, command: ControlCommand) -> ControlAnswer:
    method, target, body = encode_control_request(command)
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_CONTROL_ANSWER_BYTES)
    headers = [("host", "control"), ("content-length", str(len(body)))]
    data = conn.send(h11.Request(method=method, target=target, headers=headers)) or b""
    if body:
        data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        await stream.send_all(data)
        status: int | None = None
        answer = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(_RECEIVE_BYTES))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                answer += event.data
                if len(answer) > MAX_CONTROL_ANSWER_BYTES:
                    raise ProxyControlError("control answer larger than any the proxy sends")
            elif isinstance(event, h11.EndOfMessage) and status is not None:
                break
            else:
                raise ProxyControlError(f"control answer cut short ({type(event).__name__})")
    try:
        return parse_control_answer(status, bytes(answer))
    except ControlError as exc:
        raise ProxyControlError(str(exc)) from None


async def exchange(
    path: Path, command: ControlCommand, timeout_s: float = CONTROL_TIMEOUT_S
) -> ControlAnswer:
    """Send ``command`` to the control socket at ``path``; the proxy's answer.

    Raises:
        ProxyControlError: no trustworthy answer within ``timeout_s`` (the
            socket is missing or refuses, the connection broke, the answer
            is malformed, or the proxy called our request malformed).
    """
    try:
        with trio.fail_after(timeout_s):
            return await _exchange(path, command)
    except trio.TooSlowError:
        raise ProxyControlError(f"the API proxy did not answer within {timeout_s:g} s") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise ProxyControlError(f"the API proxy's control socket failed: {exc}") from None
    except h11.ProtocolError as exc:
        raise ProxyControlError(f"control answer is not HTTP/1.1: {exc}") from None


async def arm(path: Path, invocation: str, placeholder: str) -> ControlAnswer:
    """Arm the proxy for ``invocation`` with ``placeholder`` (see :func:`exchange`)."""
    return await exchange(path, ArmCommand(invocation, placeholder))


async def disarm(path: Path, invocation: str) -> ControlAnswer:
    """Disarm the proxy at the end of ``invocation`` (see :func:`exchange`)."""
    return await exchange(path, DisarmCommand(invocation))


async def status(path: Path) -> ControlAnswer:
    """The proxy's arming state (see :func:`exchange`)."""
    return await exchange(path, StatusCommand())
