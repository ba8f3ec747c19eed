"""The arming state machine: when the API proxy may forward, and for whom (spec 15.6).

Theory of operation: the proxy forwards nothing unless the broker has armed
it, over the control socket, for exactly one invocation with a fresh random
placeholder credential; the enclave of that invocation holds the placeholder
and nothing else. Disarming (at the end of every invocation) forgets the
placeholder and *spends* the invocation id, so neither can ever arm the proxy
again. Each forwarded request uses one of the invocation's
``maxModelRequests``.

The machine is a table (:func:`step`) over two states and three events:

================  ===================================  =====================================
state             event                                next state, outcome
================  ===================================  =====================================
Disarmed          Arm(fresh id)                        Armed(id, placeholder, 0), ``armed``
Disarmed          Arm(spent id)                        Disarmed, ``invocation-spent``
Disarmed          Disarm(any)                          Disarmed, ``not-armed`` (idempotent)
Disarmed          Forwarded                            Disarmed, ``not-armed`` (refused)
Armed(id)         Arm(any)                             Armed(id) unchanged, ``already-armed``
Armed(id)         Disarm(id)                           Disarmed (id spent), ``disarmed``
Armed(id)         Disarm(other)                        Disarmed (both spent), ``wrong-invocation``
Armed(used<max)   Forwarded                            Armed(used+1), ``forwarded``
Armed(used=max)   Forwarded                            Armed unchanged, ``request-cap``
================  ===================================  =====================================

A disarm that names the wrong invocation still disarms: whoever asks to
disarm believes no invocation should be running, and disarming is always the
safe direction. A second arm never replaces the first: the running
invocation's placeholder stays the only one that works, and the broker hears
of its own bug. Every outcome other than ``armed``, ``disarmed`` and
``forwarded`` is a refusal; the state it names is the one to keep.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "INVOCATION_ID_PATTERN",
    "PLACEHOLDER_PATTERN",
    "Arm",
    "Armed",
    "ArmingState",
    "Disarm",
    "Disarmed",
    "Event",
    "Forwarded",
    "Step",
    "step",
]

#: Invocation ids as the broker makes them (``secrets.token_hex(16)``), with room.
INVOCATION_ID_PATTERN = r"[0-9a-f]{16,64}"
#: A placeholder: header-safe token characters, at least 32 of them (the
#: broker sends 43 from ``secrets.token_urlsafe(32)``, 256 bits).
PLACEHOLDER_PATTERN = r"[A-Za-z0-9._~-]{32,256}"
_INVOCATION_RE = re.compile(INVOCATION_ID_PATTERN)
_PLACEHOLDER_RE = re.compile(PLACEHOLDER_PATTERN)


@dataclass(frozen=True, slots=True)
class Disarmed:
    """Nothing is forwarded. ``spent``: every invocation id ever armed."""

    spent: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Armed:
    """Forwarding for ``invocation`` with ``placeholder``; ``used`` requests so far."""

    invocation: str
    placeholder: str = field(repr=False)
    used: int
    max_requests: int
    spent: frozenset[str]

    def __post_init__(self) -> None:
        if not 0 <= self.used <= self.max_requests or self.max_requests < 1:
            raise ValueError("armed state: request count out of range")
        if self.invocation in self.spent:
            raise ValueError("armed state: a spent invocation id")


ArmingState = Disarmed | Armed


@dataclass(frozen=True, slots=True)
class Arm:
    """The broker arms the proxy for one invocation (validated on construction).

    Raises:
        ValueError: (broker fault) a malformed invocation id or placeholder,
            or a request bound below 1.
    """

    invocation: str
    placeholder: str = field(repr=False)
    max_requests: int

    def __post_init__(self) -> None:
        if not isinstance(self.invocation, str) or not _INVOCATION_RE.fullmatch(self.invocation):
            raise ValueError("arm: malformed invocation id")
        if not isinstance(self.placeholder, str) or not _PLACEHOLDER_RE.fullmatch(self.placeholder):
            raise ValueError("arm: malformed placeholder")
        if isinstance(self.max_requests, bool) or self.max_requests < 1:
            raise ValueError("arm: the request bound must be at least 1")


@dataclass(frozen=True, slots=True)
class Disarm:
    """The broker ends an invocation."""

    invocation: str


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A request of the armed invocation passed every check and goes upstream."""


Event = Arm | Disarm | Forwarded


@dataclass(frozen=True, slots=True)
class Step:
    """The next state and the outcome name (see the table in the module docstring)."""

    state: ArmingState
    outcome: str

    @property
    def accepted(self) -> bool:
        """Whether the event took effect as asked."""
        return self.outcome in ("armed", "disarmed", "forwarded")


def step(state: ArmingState, event: Event) -> Step:
    """Apply ``event`` to ``state`` (pure; the table in the module docstring)."""
    if isinstance(state, Disarmed):
        if isinstance(event, Arm):
            if event.invocation in state.spent:
                return Step(state, "invocation-spent")
            return Step(
                Armed(event.invocation, event.placeholder, 0, event.max_requests, state.spent),
                "armed",
            )
        return Step(state, "not-armed")
    if isinstance(event, Arm):
        return Step(state, "already-armed")
    if isinstance(event, Disarm):
        spent = state.spent | {state.invocation}
        if event.invocation == state.invocation:
            return Step(Disarmed(spent), "disarmed")
        if isinstance(event.invocation, str) and _INVOCATION_RE.fullmatch(event.invocation):
            spent |= {event.invocation}
        return Step(Disarmed(spent), "wrong-invocation")
    if state.used >= state.max_requests:
        return Step(state, "request-cap")
    return Step(
        Armed(state.invocation, state.placeholder, state.used + 1, state.max_requests, state.spent),
        "forwarded",
    )
