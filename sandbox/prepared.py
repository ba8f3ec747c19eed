"""The prepared-container slot of one repository, as a state table.

Theory of operation: to keep container start off an answer's critical path,
the runner keeps, per repository, at most one *prepared* query container:
created and started while the lane is idle, its launcher
(``sandbox/launcher.py``) blocked on stdin until a request delivers the
script. The slot moves through a small life cycle, and every move the
trio layer (``sandbox/prepared_pool.py``) makes goes through
:func:`step`, so an impossible move (taking a slot twice, finishing one that
never ran) is a bug that raises instead of reusing a container:

* ``EMPTY`` --begin--> ``PREPARING`` (storage, overlay, create, start);
* ``PREPARING`` --succeed--> ``READY`` or --fail--> ``FAILED``;
* ``READY`` --take--> ``TAKEN`` (a request has it: it serves exactly this
  one invocation, spec 14.7);
* ``TAKEN`` --finish--> ``EMPTY`` (container, volume and storage are gone);
* ``READY`` / ``FAILED`` / ``EMPTY`` --discard--> ``EMPTY`` (evicted by the
  memory bound, reconciled, closed);
* ``FAILED`` --begin--> ``PREPARING`` (the next idle moment tries again).

Nothing else is allowed: in particular a ``TAKEN`` slot can never be taken,
prepared or discarded again, and a ``PREPARING`` one is never taken before
it is ``READY`` (a request waits for the preparation to end).

The memory bound (:data:`MAX_PREPARED_SLOTS`, :func:`evictions`) keeps the
prepared containers of the repositories most recently prepared for and
names the least recent ready ones beyond it, which are destroyed.
Pure: no trio, os or docker.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

__all__ = [
    "MAX_PREPARED_SLOTS",
    "TRANSITIONS",
    "SlotError",
    "SlotEvent",
    "SlotState",
    "evictions",
    "step",
]

#: Prepared containers kept at once (one per repository, the most recently
#: prepared for). Each holds a blocked launcher process, its runtime's shim
#: (and under gVisor the sentry and gofer) and its empty mounts: measured on
#: the project's machine at 5 MiB of cgroup memory plus a 13 MiB shim for
#: runc, and 19 MiB of cgroup memory with 65 MiB of resident shim, sentry
#: and gofer for runsc (README, "Prepared containers"). Eight keep every
#: repository of a typical run (one to a few) prepared for at most about
#: 150 MiB on runc and 520 MiB on gVisor.
MAX_PREPARED_SLOTS = 8


class SlotState(enum.Enum):
    """Where one repository's prepared container is in its life cycle."""

    EMPTY = "empty"
    PREPARING = "preparing"
    READY = "ready"
    TAKEN = "taken"
    FAILED = "failed"


class SlotEvent(enum.Enum):
    """What happens to a slot (module docstring)."""

    BEGIN = "begin"
    SUCCEED = "succeed"
    FAIL = "fail"
    TAKE = "take"
    FINISH = "finish"
    DISCARD = "discard"


class SlotError(Exception):
    """A slot move the table does not allow: a bug in the runner (local fault)."""


_S = SlotState
_E = SlotEvent

#: The complete table; every pair not listed is refused by :func:`step`.
TRANSITIONS: Mapping[tuple[SlotState, SlotEvent], SlotState] = {
    (_S.EMPTY, _E.BEGIN): _S.PREPARING,
    (_S.FAILED, _E.BEGIN): _S.PREPARING,
    (_S.PREPARING, _E.SUCCEED): _S.READY,
    (_S.PREPARING, _E.FAIL): _S.FAILED,
    (_S.READY, _E.TAKE): _S.TAKEN,
    (_S.TAKEN, _E.FINISH): _S.EMPTY,
    (_S.READY, _E.DISCARD): _S.EMPTY,
    (_S.FAILED, _E.DISCARD): _S.EMPTY,
    (_S.EMPTY, _E.DISCARD): _S.EMPTY,
}


def step(state: SlotState, event: SlotEvent) -> SlotState:
    """The state after ``event``.

    Raises:
        SlotError: the table has no such move (a runner bug).
    """
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise SlotError(f"prepared slot cannot {event.value} when {state.value}") from None


def evictions(
    recency: Sequence[str], states: Mapping[str, SlotState], limit: int = MAX_PREPARED_SLOTS
) -> tuple[str, ...]:
    """The keys whose ready slots to discard so at most ``limit`` hold a container.

    ``recency`` lists slot keys from least to most recently prepared for;
    ``states`` holds each key's state. Preparing and taken slots count (they
    hold or are about to hold a container) but are never chosen (they are in
    use); empty and failed ones hold nothing. The least recent ready slots
    are chosen first.

    Raises:
        ValueError: ``limit`` is negative, or a key of ``recency`` has no state.
    """
    if limit < 0:
        raise ValueError(f"negative prepared-slot limit {limit}")
    holding = (SlotState.PREPARING, SlotState.READY, SlotState.TAKEN)
    live = [key for key in recency if states[key] in holding]
    excess = len(live) - limit
    chosen: list[str] = []
    for key in live:
        if excess <= 0:
            break
        if states[key] is SlotState.READY:
            chosen.append(key)
            excess -= 1
    return tuple(chosen)
