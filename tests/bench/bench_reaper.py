"""How fast a SIGKILLed harness's run disappears (issue 21): prints a table, asserts nothing.

For each phase, N times: start a real ``bounded-query-harness run`` (the real
broker on runc, the agent in its container), SIGKILL the harness process
when a query container runs (``query``) or while only the agent runs
(``agent``), and poll (every 20 ms) until no container, volume, root, mount
or broker process of the run is left (``tests/harness/reaper_engine.py``).
Columns: the time from the SIGKILL to the last resource gone as seen from
outside, and the reaper's own figure (its ``lastRemovalSeconds``, from the
moment it saw the harness die). Needs the engine, the query and agent
images and root:

    flock /tmp/bq-engine.lock python3 tests/bench/bench_reaper.py [N]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.reaper_engine import harness_run, kill_and_measure


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(trials: int) -> int:
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=120)
    rows = []
    try:
        for mode in ("query", "agent"):
            outside: list[float] = []
            inside: list[float] = []
            failures = 0
            for _ in range(trials):
                with harness_run(client, mode) as run:
                    measured = kill_and_measure(client, run)
                if measured.seconds is None:
                    failures += 1
                    print(f"{mode}: left behind {measured.left}", file=sys.stderr)
                    continue
                outside.append(measured.seconds)
                if measured.reaped is not None:
                    inside.append(float(measured.reaped["lastRemovalSeconds"]))
            rows.append((mode, outside, inside, failures))
    finally:
        client.close()
    header = ("phase", "n", "median s", "max s", "reaper median", "reaper max", "left")
    widths = (8, 3, 9, 7, 14, 11, 5)
    print(
        " ".join(
            f"{h:<{w}}" if i == 0 else f"{h:>{w}}"
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    for mode, outside, inside, failures in rows:
        cells = [
            f"{len(outside)}",
            _fmt(statistics.median(outside) if outside else None),
            _fmt(max(outside) if outside else None),
            _fmt(statistics.median(inside) if inside else None),
            _fmt(max(inside) if inside else None),
            f"{failures}",
        ]
        print(f"{mode:<8} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths[1:], strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
