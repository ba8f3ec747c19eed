"""Timing buckets (broker/timing.py) with trio's MockClock: no real sleeps."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from bounded_query.broker.timing import (
    BOUNDARIES_S,
    FINAL_STAGE_S,
    TOLERANCE_S,
    TimingOverflow,
    choose_boundary,
    halted_answer_at,
    next_wake,
    wait_for_boundary,
)

B = BOUNDARIES_S
MS = 0.001


def test_choose_boundary_edges():
    assert choose_boundary(0.0) == 0
    for index, boundary in enumerate(B):
        assert choose_boundary(boundary - MS) == index
        assert choose_boundary(boundary) == index
        if index + 1 < len(B):
            assert choose_boundary(boundary + MS) == index + 1
    with pytest.raises(TimingOverflow):
        choose_boundary(600.0 + MS)


def test_next_wake_stages_shrink_geometrically():
    now, target = 0.0, 600.0
    stages = []
    while (wake := next_wake(now, target)) is not None:
        assert now < wake <= target
        stages.append(target - wake)
        now = wake
    assert stages[-1] == 0.0
    assert len(stages) <= 8
    # Each non-final stage leaves at least 1% of the remaining time as a guard.
    assert stages[0] == pytest.approx(6.0)
    assert next_wake(target, target) is None
    assert next_wake(target + 1, target) is None
    assert next_wake(target - FINAL_STAGE_S, target) == target


async def _land(duration: float, boundaries=B) -> tuple[float, float]:
    start = trio.current_time()
    await trio.sleep(duration)
    landing = await wait_for_boundary(start, boundaries)
    return trio.current_time() - start, landing.offset_s


@pytest.mark.parametrize("index", range(len(B)))
@pytest.mark.parametrize("delta_ms", [-1.0, -0.001, 0.0])
async def test_lands_exactly_on_boundary_when_done_before_it(autojump_clock, index, delta_ms):
    elapsed, offset = await _land(max(B[index] + delta_ms * MS, 0.0))
    assert elapsed == pytest.approx(B[index], abs=1e-9)
    assert offset == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("index", range(len(B) - 1))
@pytest.mark.parametrize("delta_ms", [0.001, 1.0])
async def test_done_just_after_boundary_pads_to_next(autojump_clock, index, delta_ms):
    elapsed, _ = await _land(B[index] + delta_ms * MS)
    assert elapsed == pytest.approx(B[index + 1], abs=1e-9)


@pytest.mark.parametrize("delta_ms", [0.001, 1.0, 60_000.0])
async def test_done_after_last_boundary_fails_closed(autojump_clock, delta_ms):
    with pytest.raises(TimingOverflow):
        await _land(600.0 + delta_ms * MS)


class LateClock(trio.abc.Clock):
    """A MockClock-like clock whose sleeps wake ``late(duration)`` seconds late.

    Models Linux timer slack: every wait of length d ends at d + late(d).
    """

    def __init__(self, late) -> None:
        self._now = 0.0
        self._late = late
        self.wakes: list[float] = []

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return self._now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        if deadline <= self._now:
            return 0.0
        # Jump: "sleep" is instant, and time advances with lateness added.
        self._now = deadline + self._late(deadline - self._now)
        self.wakes.append(self._now)
        return 0.0


def _run_with(clock: trio.abc.Clock, duration: float) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        start = trio.current_time()
        clock_now = start + duration
        # Advance "processing" directly without a sleep.
        clock._now = clock_now  # type: ignore[attr-defined]
        landing = await wait_for_boundary(start)
        return trio.current_time() - start, landing.boundary_s

    return trio.run(main, clock=clock)


@pytest.mark.parametrize("duration", [0.005, 0.05, 0.5, 5.0, 59.0, 100.0, 599.0])
def test_staged_wait_beats_epoll_slack(duration):
    # Worst observed behaviour: 0.1% of the wait late, capped at 100 ms.
    clock = LateClock(lambda d: min(d * 0.001, 0.1))
    elapsed, boundary = _run_with(clock, duration)
    assert boundary == B[choose_boundary(duration)]
    assert 0 <= elapsed - boundary <= TOLERANCE_S


def test_naive_single_sleep_would_miss_the_60s_bucket():
    # The reason for staging: one 59 s sleep with 0.1% slack wakes 59 ms late.
    late = min(59.0 * 0.001, 0.1)
    assert late > TOLERANCE_S


@pytest.mark.parametrize("index", range(len(B) - 1))
def test_late_wake_repads_to_next_boundary(index):
    # One scheduling hiccup: the first wake is 20 ms late (more than the
    # tolerance), later wakes are punctual. The answer moves to the next boundary.
    hiccups = [0.02]
    clock = LateClock(lambda d: hiccups.pop() if hiccups else 0.0)
    elapsed, boundary = _run_with(clock, B[index] - 0.003)
    assert boundary == B[index + 1]
    assert elapsed == pytest.approx(B[index + 1], abs=1e-9)


def test_late_wake_within_tolerance_is_accepted():
    hiccups = [0.004]
    clock = LateClock(lambda d: hiccups.pop() if hiccups else 0.0)
    elapsed, boundary = _run_with(clock, 0.0095)
    assert boundary == 0.01
    assert elapsed == pytest.approx(0.014, abs=1e-9)


def test_wake_always_late_everywhere_overflows():
    clock = LateClock(lambda d: 0.5)
    with pytest.raises(TimingOverflow):
        _run_with(clock, 599.0)


async def test_wait_never_returns_early_under_autojump(autojump_clock):
    start = trio.current_time()
    for boundary in B:
        landing = await wait_for_boundary(start)
        assert landing.boundary_s == boundary
        assert trio.current_time() - start == pytest.approx(boundary, abs=1e-9)
        await trio.sleep(0.0005)


@pytest.mark.parametrize(
    ("arrived", "halted_at", "expected"),
    [
        (0.001, 600.005, 600.015),  # queued before the halt: after the overflow answer
        (600.005, 600.005, 600.015),
        (601.0, 600.005, 601.01),  # after it: from its own arrival
        (10_000.0, 600.005, 10_000.01),
    ],
)
def test_halted_answer_depends_only_on_arrival_and_halt(arrived, halted_at, expected):
    assert halted_answer_at(arrived, halted_at, 0.01) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("ms", "label"),
    [
        (10, "10 ms"),
        (100, "100 ms"),
        (1000, "1 s"),
        (10_000, "10 s"),
        (600_000, "600 s"),
        (1500, "1500 ms"),
    ],
)
def test_one_bucket_label_for_progress_and_summary(ms, label):
    from bounded_query.broker.timing import bucket_label

    assert bucket_label(ms) == label
