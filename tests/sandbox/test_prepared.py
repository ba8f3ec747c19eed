"""The prepared-slot state table and memory bound (sandbox/prepared.py), exhaustively."""

from __future__ import annotations

import itertools

import pytest

from bounded_query.sandbox.prepared import (
    MAX_PREPARED_SLOTS,
    TRANSITIONS,
    SlotError,
    SlotEvent,
    SlotState,
    evictions,
    step,
)

S, E = SlotState, SlotEvent

#: The intended table, restated independently of the module.
EXPECTED = {
    (S.EMPTY, E.BEGIN): S.PREPARING,
    (S.FAILED, E.BEGIN): S.PREPARING,
    (S.PREPARING, E.SUCCEED): S.READY,
    (S.PREPARING, E.FAIL): S.FAILED,
    (S.READY, E.TAKE): S.TAKEN,
    (S.TAKEN, E.FINISH): S.EMPTY,
    (S.READY, E.DISCARD): S.EMPTY,
    (S.FAILED, E.DISCARD): S.EMPTY,
    (S.EMPTY, E.DISCARD): S.EMPTY,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_every_state_event_pair(state, event):
    if (state, event) in EXPECTED:
        assert step(state, event) is EXPECTED[(state, event)]
    else:
        with pytest.raises(SlotError, match=f"cannot {event.value} when {state.value}"):
            step(state, event)


def test_table_is_exactly_the_expected_one():
    assert dict(TRANSITIONS) == EXPECTED


def test_a_container_serves_one_invocation():
    """Once taken, nothing but finishing is possible: no second take, no reuse."""
    for event in E:
        if event is not E.FINISH:
            with pytest.raises(SlotError):
                step(S.TAKEN, event)
    # and finishing leaves nothing to take: a new preparation is needed
    with pytest.raises(SlotError):
        step(step(S.TAKEN, E.FINISH), E.TAKE)


def test_only_a_ready_slot_can_be_taken():
    assert [s for s in S if (s, E.TAKE) in TRANSITIONS] == [S.READY]


def test_every_state_is_reachable_from_empty():
    seen, frontier = {S.EMPTY}, [S.EMPTY]
    while frontier:
        state = frontier.pop()
        for (src, _event), dst in TRANSITIONS.items():
            if src is state and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(S)


def test_evictions_within_the_bound_choose_nothing():
    states = {f"s{i}": S.READY for i in range(MAX_PREPARED_SLOTS)}
    assert evictions(list(states), states) == ()


def test_evictions_choose_least_recent_ready_slots():
    order = ["a", "b", "c", "d"]
    states = {"a": S.READY, "b": S.READY, "c": S.READY, "d": S.PREPARING}
    assert evictions(order, states, limit=2) == ("a", "b")
    assert evictions(order, states, limit=3) == ("a",)


def test_evictions_never_choose_slots_in_use():
    order = ["a", "b", "c"]
    states = {"a": S.TAKEN, "b": S.PREPARING, "c": S.READY}
    assert evictions(order, states, limit=1) == ("c",)
    assert evictions(order, {"a": S.TAKEN, "b": S.PREPARING, "c": S.PREPARING}, limit=0) == ()


def test_empty_and_failed_slots_hold_nothing():
    order = ["a", "b", "c"]
    states = {"a": S.FAILED, "b": S.EMPTY, "c": S.READY}
    assert evictions(order, states, limit=1) == ()
    assert evictions(order, states, limit=0) == ("c",)


def test_evictions_refuse_bad_input():
    with pytest.raises(ValueError, match="negative"):
        evictions([], {}, limit=-1)
    with pytest.raises(KeyError):
        evictions(["x"], {})
