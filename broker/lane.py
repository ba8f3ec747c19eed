"""The serialized lane's states as a table (pure).

Theory of operation: every complete request enters one lane (spec 14.3.1,
"Invocations are serialized"). The lane is

* ``IDLE``: nobody holds it; the refusal gate is open;
* ``DECIDING``: a request holds it and has not answered (admission, the
  journal, the run, the result check, cleanup, the wait for the bucket);
  the gate is closed;
* ``ANSWERED``: the holder's answer left; it still writes its audit line;
  the gate is open;
* ``DECIDING_HALTED``: a request decides while the run has halted under it
  (the runner lost a protection mid-query): it keeps its own answer, the
  gate stays closed until then, nothing after it runs;
* ``HALTED``: the run serves nothing any more (every later request gets
  the canonical error at ``timing.halted_answer_at``): an invocation overran
  the last bucket and the watchdog answered for it, or the runner lost a
  protection it set up at start. Terminal for this broker process.

``TRANSITIONS`` lists every allowed (state, event) pair; any other pair is
a bug of ours (:class:`LaneError`), never a client's doing, since the lane
lock admits one holder at a time. ``tests/broker/test_lane.py`` checks
every pair.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["TRANSITIONS", "LaneError", "LaneEvent", "LaneState", "gate_open", "next_state"]


class LaneState(enum.Enum):
    """Where the lane is (module docstring)."""

    IDLE = "idle"
    DECIDING = "deciding"
    ANSWERED = "answered"
    DECIDING_HALTED = "deciding-halted"
    HALTED = "halted"


class LaneEvent(enum.Enum):
    """What happens to the lane."""

    #: A request acquired the lane.
    ENTER = "enter"
    #: The holder's bucketed answer was sent.
    ANSWER = "answer"
    #: The holder released the lane (after its audit line).
    LEAVE = "leave"
    #: The watchdog answered an overrun: the run halts.
    OVERFLOW = "overflow"
    #: The runner lost a protection (the page-cache pin died): the run halts.
    PROTECTION_LOST = "protection-lost"


_S, _E = LaneState, LaneEvent
#: Every allowed (state, event) -> next state. In HALTED every event keeps
#: the lane halted: the overrunning holder still finishes and leaves, and a
#: request handed the lane at the moment of the halt gives it back. A
#: protection can be lost in any state; an overflow only while deciding
#: (the watchdog runs only then).
TRANSITIONS: Mapping[tuple[LaneState, LaneEvent], LaneState] = MappingProxyType(
    {
        (_S.IDLE, _E.ENTER): _S.DECIDING,
        (_S.IDLE, _E.PROTECTION_LOST): _S.HALTED,
        (_S.DECIDING, _E.ANSWER): _S.ANSWERED,
        (_S.DECIDING, _E.OVERFLOW): _S.HALTED,
        (_S.DECIDING, _E.PROTECTION_LOST): _S.DECIDING_HALTED,
        (_S.ANSWERED, _E.LEAVE): _S.IDLE,
        (_S.ANSWERED, _E.PROTECTION_LOST): _S.HALTED,
        (_S.DECIDING_HALTED, _E.ANSWER): _S.HALTED,
        (_S.DECIDING_HALTED, _E.OVERFLOW): _S.HALTED,
        (_S.DECIDING_HALTED, _E.PROTECTION_LOST): _S.DECIDING_HALTED,
        (_S.HALTED, _E.ENTER): _S.HALTED,
        (_S.HALTED, _E.ANSWER): _S.HALTED,
        (_S.HALTED, _E.LEAVE): _S.HALTED,
        (_S.HALTED, _E.OVERFLOW): _S.HALTED,
        (_S.HALTED, _E.PROTECTION_LOST): _S.HALTED,
    }
)


class LaneError(RuntimeError):
    """An event the lane's state does not allow (a bug of ours)."""


def next_state(state: LaneState, event: LaneEvent) -> LaneState:
    """The state after ``event``.

    Raises:
        LaneError: (our bug) the pair is not in :data:`TRANSITIONS`.
    """
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise LaneError(f"lane: {event.value} is not allowed while {state.value}") from None


def gate_open(state: LaneState) -> bool:
    """Whether the refusal gate is open in ``state`` (closed only while a request decides)."""
    return state not in (LaneState.DECIDING, LaneState.DECIDING_HALTED)
