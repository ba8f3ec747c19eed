"""Response-timing buckets (spec 14.3.1).

Theory of operation: a response leaves at the first fixed boundary (10 ms,
100 ms, 1 s, 10 s, 60 s, 600 s after the invocation started) at or after the
moment processing finished, measured on trio's monotonic clock. Choosing the
boundary is a pure function (:func:`choose_boundary`); waiting for it is
:func:`wait_for_boundary`.

Why the wait is staged: Linux may fire an epoll timeout late by up to about
0.1% of its length (capped near 100 ms), so a single 50 s sleep can wake 25+
ms late, past the 5 ms tolerance, and would have to be re-padded to the next
boundary (a 60 s answer becoming a 600 s one). Instead we sleep in stages
(:func:`next_wake`): each stage aims short of the boundary by a guard that is
much larger than the lateness that stage can suffer, so the remaining time
shrinks by about two orders of magnitude per stage (600 s -> ~6 s -> ~60 ms
-> ~2 ms -> 0) and the final short sleep is late by microseconds.

If a wake is nevertheless later than the tolerance, or processing ran past a
boundary, the answer is re-padded to the next boundary; past the last
boundary (plus tolerance) the result is discarded and the canonical error is
returned (:class:`TimingOverflow`; fail closed). The pipeline does not wait
for such a late processing end to answer: a watchdog sends the canonical
error at the last boundary plus the tolerance (``service.py``), so even an
overflow answer leaves at a fixed time.

After an overflow the run halts: the overrunning container
is still being stopped and removed, for a time the query itself can stretch
(a tree of files to delete, processes to kill), so *any* answer that waits
for that end -- releasing the lane at the end of the overrun, or holding it
for a fixed worst case that a slow enough removal still exceeds -- tells the
agent how long the overrun lasted. A halted run waits for nothing: every
request queued behind the overflow, and every later one, gets the canonical
error at :func:`halted_answer_at`, the first boundary after the later of its
arrival and the overflow answer, which are both moments the agent already
knows. No answer after the halt depends on the overrun, so it carries zero
bits; the price is that one overflow ends the run's service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import trio

from bounded_query.broker.protocol import TIMING_BUCKETS_MS

__all__ = [
    "BOUNDARIES_S",
    "FINAL_STAGE_S",
    "TOLERANCE_S",
    "Landing",
    "TimingOverflow",
    "bucket_label",
    "choose_boundary",
    "halted_answer_at",
    "next_wake",
    "sleep_until_staged",
    "wait_for_boundary",
]

#: The boundaries of spec 14.3.1 in seconds, derived from the protocol's
#: normative TIMING_BUCKETS_MS (the pipeline may pass other ones to tests).
BOUNDARIES_S: tuple[float, ...] = tuple(ms / 1000 for ms in TIMING_BUCKETS_MS)
#: Public host-scheduler tolerance (spec 14.3.1).
TOLERANCE_S = 0.005
#: Below this remaining time we sleep straight to the boundary: the lateness
#: of a 2 ms timer is a few microseconds.
FINAL_STAGE_S = 0.002
#: Each stage stops short of the boundary by this fraction of the remaining
#: time: 1% is ten times the worst observed epoll slack (0.1%).
STAGE_FRACTION = 0.01


def bucket_label(ms: int) -> str:
    """A bucket (milliseconds) as operators read it: ``10 ms``, ``1 s``, ``600 s``.

    The one label the terminal progress lines and the step summary share.
    """
    return f"{ms // 1000} s" if ms >= 1000 and ms % 1000 == 0 else f"{ms} ms"


class TimingOverflow(Exception):
    """Processing or a wake ran past the last boundary: answer the canonical error."""


@dataclass(frozen=True, slots=True)
class Landing:
    """Where a response landed: the boundary index and offset from it (seconds)."""

    index: int
    boundary_s: float
    offset_s: float


def choose_boundary(elapsed_s: float, boundaries_s: Sequence[float] = BOUNDARIES_S) -> int:
    """Index of the first boundary >= ``elapsed_s`` (pure).

    Raises:
        TimingOverflow: ``elapsed_s`` is past the last boundary.
    """
    for index, boundary in enumerate(boundaries_s):
        if elapsed_s <= boundary:
            return index
    raise TimingOverflow(f"processing took {elapsed_s:.3f}s, past the last boundary")


def halted_answer_at(arrived: float, halted_at: float, first_boundary_s: float) -> float:
    """When a request gets its answer once the run is halted (pure).

    ``arrived`` is the request's arrival, ``halted_at`` the moment of the
    overflow answer that halted the run (both trio clock values the agent
    can observe): the answer leaves ``first_boundary_s`` after the later of
    the two, whatever the overrun does afterwards.
    """
    return max(arrived, halted_at) + first_boundary_s


def next_wake(now: float, target: float) -> float | None:
    """The absolute time of the next stage's sleep, or None when ``now >= target`` (pure).

    Far from the target we stop short by :data:`STAGE_FRACTION` of the remaining
    time (at least :data:`FINAL_STAGE_S`); within two final stages we aim at
    the target itself.
    """
    remaining = target - now
    if remaining <= 0:
        return None
    if remaining <= 2 * FINAL_STAGE_S:
        return target
    guard = max(remaining * STAGE_FRACTION, FINAL_STAGE_S)
    return target - guard


async def sleep_until_staged(target: float) -> None:
    """Sleep until ``target`` (trio clock), approaching it in stages (:func:`next_wake`)."""
    # Staged approach, not a poll: each stage is one precomputed sleep.
    while (wake := next_wake(trio.current_time(), target)) is not None:  # noqa: ASYNC110
        await trio.sleep_until(wake)


async def wait_for_boundary(
    start: float,
    boundaries_s: Sequence[float] = BOUNDARIES_S,
    tolerance_s: float = TOLERANCE_S,
) -> Landing:
    """Sleep until the first boundary at or after now, measured from ``start``.

    ``start`` is a ``trio.current_time()`` value. Returns when the current
    time is within ``[boundary, boundary + tolerance]``.

    Raises:
        TimingOverflow: now (or a late wake) is past the last boundary plus
            the tolerance; the caller must discard any result.
    """
    index = choose_boundary(trio.current_time() - start, boundaries_s)
    while True:
        target = start + boundaries_s[index]
        await sleep_until_staged(target)
        offset = trio.current_time() - target
        if offset <= tolerance_s:
            return Landing(index, boundaries_s[index], offset)
        # Late beyond the tolerance: re-resolve to the next boundary.
        index = choose_boundary(trio.current_time() - start, boundaries_s)
