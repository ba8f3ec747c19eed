"""The arming table, exhaustively: every (state, event) pair (house style 6)."""

from __future__ import annotations

import itertools

import pytest

from bounded_query.broker.apiproxy import (
    Arm,
    Armed,
    ArmingState,
    Disarm,
    Disarmed,
    Forwarded,
    step,
)
from bounded_query.broker.apiproxy._arming import Event

ID_A = "a" * 32
ID_B = "b" * 32
ID_C = "c" * 32
PH_A = "A" * 43
PH_B = "B" * 43

STATES: dict[str, ArmingState] = {
    "disarmed-fresh": Disarmed(),
    "disarmed-after-a": Disarmed(frozenset({ID_A})),
    "armed-a-unused": Armed(ID_A, PH_A, 0, 2, frozenset()),
    "armed-a-used-1": Armed(ID_A, PH_A, 1, 2, frozenset({ID_C})),
    "armed-a-exhausted": Armed(ID_A, PH_A, 2, 2, frozenset()),
}
EVENTS: dict[str, Event] = {
    "arm-a": Arm(ID_A, PH_A, 2),
    "arm-b": Arm(ID_B, PH_B, 2),
    "disarm-a": Disarm(ID_A),
    "disarm-b": Disarm(ID_B),
    "disarm-garbage": Disarm("not-an-id"),
    "forwarded": Forwarded(),
}

#: (state, event) -> (outcome, next state)
EXPECTED = {
    ("disarmed-fresh", "arm-a"): ("armed", Armed(ID_A, PH_A, 0, 2, frozenset())),
    ("disarmed-fresh", "arm-b"): ("armed", Armed(ID_B, PH_B, 0, 2, frozenset())),
    ("disarmed-fresh", "disarm-a"): ("not-armed", Disarmed()),
    ("disarmed-fresh", "disarm-b"): ("not-armed", Disarmed()),
    ("disarmed-fresh", "disarm-garbage"): ("not-armed", Disarmed()),
    ("disarmed-fresh", "forwarded"): ("not-armed", Disarmed()),
    ("disarmed-after-a", "arm-a"): ("invocation-spent", Disarmed(frozenset({ID_A}))),
    ("disarmed-after-a", "arm-b"): ("armed", Armed(ID_B, PH_B, 0, 2, frozenset({ID_A}))),
    ("disarmed-after-a", "disarm-a"): ("not-armed", Disarmed(frozenset({ID_A}))),
    ("disarmed-after-a", "disarm-b"): ("not-armed", Disarmed(frozenset({ID_A}))),
    ("disarmed-after-a", "disarm-garbage"): ("not-armed", Disarmed(frozenset({ID_A}))),
    ("disarmed-after-a", "forwarded"): ("not-armed", Disarmed(frozenset({ID_A}))),
    ("armed-a-unused", "arm-a"): ("already-armed", STATES["armed-a-unused"]),
    ("armed-a-unused", "arm-b"): ("already-armed", STATES["armed-a-unused"]),
    ("armed-a-unused", "disarm-a"): ("disarmed", Disarmed(frozenset({ID_A}))),
    ("armed-a-unused", "disarm-b"): ("wrong-invocation", Disarmed(frozenset({ID_A, ID_B}))),
    ("armed-a-unused", "disarm-garbage"): ("wrong-invocation", Disarmed(frozenset({ID_A}))),
    ("armed-a-unused", "forwarded"): ("forwarded", Armed(ID_A, PH_A, 1, 2, frozenset())),
    ("armed-a-used-1", "arm-a"): ("already-armed", STATES["armed-a-used-1"]),
    ("armed-a-used-1", "arm-b"): ("already-armed", STATES["armed-a-used-1"]),
    ("armed-a-used-1", "disarm-a"): ("disarmed", Disarmed(frozenset({ID_A, ID_C}))),
    ("armed-a-used-1", "disarm-b"): (
        "wrong-invocation",
        Disarmed(frozenset({ID_A, ID_B, ID_C})),
    ),
    ("armed-a-used-1", "disarm-garbage"): ("wrong-invocation", Disarmed(frozenset({ID_A, ID_C}))),
    ("armed-a-used-1", "forwarded"): ("forwarded", Armed(ID_A, PH_A, 2, 2, frozenset({ID_C}))),
    ("armed-a-exhausted", "arm-a"): ("already-armed", STATES["armed-a-exhausted"]),
    ("armed-a-exhausted", "arm-b"): ("already-armed", STATES["armed-a-exhausted"]),
    ("armed-a-exhausted", "disarm-a"): ("disarmed", Disarmed(frozenset({ID_A}))),
    ("armed-a-exhausted", "disarm-b"): ("wrong-invocation", Disarmed(frozenset({ID_A, ID_B}))),
    ("armed-a-exhausted", "disarm-garbage"): ("wrong-invocation", Disarmed(frozenset({ID_A}))),
    ("armed-a-exhausted", "forwarded"): ("request-cap", STATES["armed-a-exhausted"]),
}


def test_the_table_covers_every_pair():
    assert set(EXPECTED) == set(itertools.product(STATES, EVENTS))


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED))
def test_every_state_event_pair(state, event):
    outcome, after = EXPECTED[(state, event)]
    result = step(STATES[state], EVENTS[event])
    assert (result.outcome, result.state) == (outcome, after)
    assert result.accepted is (outcome in ("armed", "disarmed", "forwarded"))


def test_an_invocation_once_spent_can_never_arm_again():
    state: ArmingState = Disarmed()
    for _ in range(3):
        state = step(state, Arm(ID_A, PH_A, 1)).state
        state = step(state, Disarm(ID_A)).state
    assert state == Disarmed(frozenset({ID_A}))
    assert step(state, Arm(ID_A, PH_B, 1)).outcome == "invocation-spent"


@pytest.mark.parametrize(
    ("invocation", "placeholder", "max_requests"),
    [
        ("A" * 32, PH_A, 1),  # upper-case hex
        ("a" * 15, PH_A, 1),  # too short
        ("a" * 65, PH_A, 1),  # too long
        ("a" * 32 + "\n", PH_A, 1),
        (ID_A, "short", 1),
        (ID_A, "A" * 42 + " ", 1),
        (ID_A, "A" * 42 + "\n", 1),
        (ID_A, "é" * 43, 1),
        (ID_A, "A" * 257, 1),
        (ID_A, PH_A, 0),
        (ID_A, PH_A, True),
    ],
)
def test_a_malformed_arm_cannot_be_built(invocation, placeholder, max_requests):
    with pytest.raises(ValueError, match="arm:"):
        Arm(invocation, placeholder, max_requests)


def test_states_cannot_exist_in_an_invalid_shape():
    with pytest.raises(ValueError, match="out of range"):
        Armed(ID_A, PH_A, 3, 2, frozenset())
    with pytest.raises(ValueError, match="spent"):
        Armed(ID_A, PH_A, 0, 2, frozenset({ID_A}))


def test_the_placeholder_is_not_in_the_repr():
    assert PH_A not in repr(STATES["armed-a-unused"])
    assert PH_A not in repr(EVENTS["arm-a"])
