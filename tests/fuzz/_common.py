"""Shared plumbing of the atheris fuzz targets (issue #2, item 4).

Each target script defines ``one_input(data)``, which may raise only the
protocol's own error types (those are caught here and count as a normal
outcome); every other exception, including a failed invariant assertion,
propagates to atheris and is reported as a crash. The wrapper times every
input and keeps the slowest; statistics are written as JSON to the file named
by ``BQ_FUZZ_STATS`` at least every half second and when the run count given
with ``-runs=`` is reached, because libFuzzer ends the process with a C
``exit()`` that skips Python's ``atexit`` handlers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import atheris

with atheris.instrument_imports(include=["bounded_query.broker.protocol"]):
    import bounded_query.broker.protocol as protocol

__all__ = ["protocol", "run"]


def run(
    name: str, one_input: Callable[[bytes], None], allowed: tuple[type[BaseException], ...]
) -> None:
    """Fuzz ``one_input`` under atheris with timing and statistics."""
    stats_path = os.environ.get("BQ_FUZZ_STATS")
    runs_limit = 0
    for arg in sys.argv[1:]:
        if arg.startswith("-runs="):
            runs_limit = int(arg.split("=", 1)[1])
    state = {
        "target": name,
        "inputs": 0,
        "slowest_s": 0.0,
        "slowest_len": 0,
        "slowest_hex": "",
        "over_5ms": 0,
        "outcomes": {},
    }
    outcomes: dict[str, int] = state["outcomes"]  # type: ignore[assignment]
    last_flush = time.monotonic()

    def flush() -> None:
        if stats_path:
            tmp = stats_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, stats_path)

    def test_one_input(data: bytes) -> None:
        nonlocal last_flush
        start = time.perf_counter()
        try:
            one_input(data)
            outcome = "returned"
        except allowed as exc:
            outcome = type(exc).__name__
        elapsed = time.perf_counter() - start
        state["inputs"] += 1  # type: ignore[operator]
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if elapsed > 0.005:
            state["over_5ms"] += 1  # type: ignore[operator]
        if elapsed > state["slowest_s"]:  # type: ignore[operator]
            state["slowest_s"] = elapsed
            state["slowest_len"] = len(data)
            state["slowest_hex"] = data.hex()
        now = time.monotonic()
        if now - last_flush > 0.5 or state["inputs"] == runs_limit:
            last_flush = now
            flush()

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
