"""Phase timing of a run: how long each step took, for benchmarks and the audit log."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["PhaseClock"]


class PhaseClock:
    """Context managers that add elapsed seconds to ``phases[name]``.

    Wall-clock ``perf_counter`` on purpose: these figures describe the
    engine's real work and never decide anything (the lane's timing uses
    trio's clock).
    """

    def __init__(self, phases: dict[str, float]) -> None:
        self._phases = phases

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - started
